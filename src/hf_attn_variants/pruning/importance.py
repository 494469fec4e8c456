"""Head importance scores (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?", §4.1).

Iₕ = Σₓ |∂L(x)/∂ξₕ| at ξ = 1, where ξₕ gates head h's output (``head_mask``) and L(x) is the model's own
loss on example x. It is the first-order Taylor estimate of |L(ξₕ=0) − L(ξₕ=1)|, the loss change of
removing head h, obtained for every head from one forward/backward pass per example.

The absolute value is taken per example, not of a batch's summed gradient (the old transformers
"bertology" example did the latter, which lets opposite-signed examples cancel): each batch is split
into single examples. Dropout is off (``model.eval()``) while gradients are on; parameter gradients are
not accumulated (only ∂L/∂ξ is computed), and the model's train/eval mode is restored afterwards.

Normalisations: ``normalize_per_layer`` divides each layer's scores by their ℓ2 norm (the authors' code;
makes layers comparable when heads are ranked globally); ``normalize_global`` then min–max scales all
scores to [0, 1] (as the bertology example). Heads already pruned are NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from transformers import PreTrainedModel

from .adapters import get_adapter
from .masking import head_mask

LABEL_KEYS = ("labels", "start_positions")


def split_examples(batch: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield each example of a dict batch as a batch of one (tensors sliced on their first dimension).

    The batch size is the first dimension of ``labels`` (or ``start_positions``, or the first tensor);
    values that are not tensors with that leading size are passed to every example unchanged.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"each batch must be a dict of tensors (with labels), got {type(batch).__name__}.")
    for key in LABEL_KEYS:
        if key in batch and not isinstance(batch[key], torch.Tensor):
            raise TypeError(f"batch[{key!r}] must be a tensor, got {type(batch[key]).__name__}.")
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if not tensors:
        raise ValueError(f"batch has no tensors with a batch dimension (keys: {sorted(batch)}).")
    key = next((k for k in LABEL_KEYS if k in tensors), next(iter(tensors)))
    size = tensors[key].shape[0]
    for i in range(size):
        yield {k: (v[i : i + 1] if k in tensors and v.shape[0] == size else v) for k, v in batch.items()}


def normalize_importance(
    importance: torch.Tensor, *, normalize_per_layer: bool = True, normalize_global: bool = False
) -> torch.Tensor:
    """Per-layer ℓ2 normalisation and/or global min–max scaling, ignoring NaN (pruned) entries.

    A layer whose scores are all zero stays zero (no division by zero); if all scores are equal the
    global scaling gives zeros.
    """
    if not isinstance(importance, torch.Tensor) or importance.dim() != 2:
        raise TypeError("importance must be a tensor (num_layers, num_heads), got "
                        f"{getattr(importance, 'shape', type(importance).__name__)}.")
    result = importance.clone()
    alive = ~torch.isnan(result)
    if normalize_per_layer:
        norms = torch.where(alive, result, torch.zeros_like(result)).pow(2).sum(-1).sqrt()
        result = result / torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(-1)
    if normalize_global and alive.any():
        values = result[alive]
        low, high = values.min(), values.max()
        span = high - low
        result = (result - low) / (span if span > 0 else torch.ones_like(span))
    return result


def no_targets(labels: Any, shifted: bool) -> bool:
    """Whether token labels ``[1, T]`` hold nothing to predict: no label other than -100 (an MLM row with no
    masked token), or, when the model ``shifted`` them (a causal LM), none after the first (a row of one
    token)."""
    if not isinstance(labels, torch.Tensor) or labels.dim() < 2:
        return False
    return not bool((labels[..., int(shifted):] != -100).any())


def compute_head_importance(
    model: PreTrainedModel,
    dataloader: Iterable[Mapping[str, Any]],
    *,
    normalize_per_layer: bool = True,
    normalize_global: bool = False,
) -> torch.Tensor:
    """Iₕ = Σₓ |∂L(x)/∂ξₕ| for every head (Michel et al. 2019), shape ``(num_layers, num_heads)``.

    Args:
        model: a model supported by ``hf_attn_variants.pruning`` (this package's multi-head families,
            BERT-style encoders, Llama-style decoders) that returns ``.loss`` when given labels.
        dataloader: any iterable of dict batches of tensors with labels (a ``DataLoader``, a list …);
            each batch is split into single examples. An example with nothing to predict (``no_targets``)
            has no loss and is skipped.
        normalize_per_layer: divide each layer's scores by their ℓ2 norm.
        normalize_global: then min–max scale all scores to [0, 1].

    Returns:
        float32 CPU tensor indexed by (layer, original head number); NaN for heads already pruned.
    """
    if isinstance(dataloader, Mapping):
        raise TypeError("dataloader must be an iterable of dict batches, got one dict batch: wrap it in a "
                        "list.")
    if not isinstance(dataloader, Iterable):
        raise TypeError("dataloader must be an iterable of dict batches (a DataLoader, a list of dicts …), "
                        f"got {type(dataloader).__name__}.")
    for name, value in (("normalize_per_layer", normalize_per_layer), ("normalize_global", normalize_global)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}.")
    adapter = get_adapter(model)
    device = next(model.parameters()).device
    gate = torch.ones(adapter.num_layers, adapter.num_heads, device=device, requires_grad=True)
    total = torch.zeros(adapter.num_layers, adapter.num_heads, dtype=torch.float64)
    was_training = model.training
    model.eval()
    shifted = type(model).__name__.endswith("ForCausalLM")  # the model shifts the labels by one
    count = 0
    try:
        with torch.enable_grad(), head_mask(model, gate):
            examples = (example for batch in dataloader for example in split_examples(batch))
            for index, example in enumerate(examples):
                inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in example.items()}
                loss = model(**inputs).loss
                if loss is None:
                    raise ValueError(
                        "the model returned no loss: every batch must contain labels "
                        "(e.g. 'labels', or 'start_positions'/'end_positions' for question answering)."
                    )
                if not torch.isfinite(loss):
                    if no_targets(inputs.get("labels"), shifted):
                        continue  # nothing to predict: no loss, no gradient
                    raise ValueError(f"the model's loss is not finite ({loss.item()}) on example {index}.")
                (grad,) = torch.autograd.grad(loss, gate, allow_unused=True)
                if grad is not None:
                    total += grad.detach().abs().cpu().double()  # to the host first: MPS has no float64
                count += 1
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("dataloader yielded no example with a token to predict.")
    importance = total.float()
    importance[~adapter.alive()] = float("nan")
    return normalize_importance(
        importance, normalize_per_layer=normalize_per_layer, normalize_global=normalize_global
    )


__all__ = ["compute_head_importance", "normalize_importance", "split_examples"]
