"""The entropy of attention rows against the number of keys each row sees.

For row i of an attention map, H = −Σⱼ pᵢⱼ log pᵢⱼ (nats). A row that spreads evenly over its nᵢ visible
keys has H = log nᵢ; Su's entropy-invariance argument (2021, "从熵不变性看Attention的Scale操作")
asks for logits scaled by log nᵢ so that H stays put as nᵢ grows.

``entropy_by_length`` measures H per layer and head at each input length n: every row of a bidirectional
model, the rows of the second half of a causal one. nᵢ is what each layer's row actually attends to, read from
the mask the model hands that layer (``visible_keys``: a sliding window of W keys makes nᵢ = min(i + 1, W)
there, not i + 1); a layer given no mask sees i + 1 keys (causal) or all n. ``attends_causally`` tells a
causal model from its maps (the keys after the query get no weight), not from module flags. It reduces each
layer's map as the layer returns it (``layer_entropy_sums``), so one layer's map is alive at a time, not the
model's: 8 layers × 8 heads at 16k tokens are 64 GiB of fp32 maps together, 8 GiB one at a time.
``fit_slope`` gives dH/d log n by least squares over the lengths: near 0 where the entropy holds still, near 1
where a head stays as diffuse as the uniform row.

Rows that are not probabilities (GAU's relu², Laplace) are normalised to sum to 1 first when ``normalize``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..models import layers
from ..models.layers import widest_dtype


@dataclass(frozen=True)
class LengthPoint:
    """The entropies of one input length: ``entropy[layer][head]`` (mean over the measured rows, nats),
    ``layer_log_keys[layer]`` the mean log nᵢ of those rows in that layer (a sliding-window layer's rows see
    fewer keys than a full one's), ``log_keys`` their mean over the layers, ``rows`` how many rows per head
    were averaged."""

    length: int
    log_keys: float
    entropy: list[list[float]]
    rows: int
    layer_log_keys: list[float] = field(default_factory=list)

    def keys_of(self, layer: int) -> float:
        """Mean log nᵢ of ``layer``'s measured rows (``log_keys`` where no per-layer value was kept)."""
        return self.layer_log_keys[layer] if self.layer_log_keys else self.log_keys

    @property
    def mean_entropy(self) -> float:
        values = [h for layer in self.entropy for h in layer]
        return sum(values) / len(values)


def measured_rows(length: int, causal: bool) -> slice:
    """The rows measured at ``length``: all of a bidirectional map, the second half of a causal one."""
    return slice(length // 2, length) if causal else slice(0, length)


def row_entropy(attention: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """H of every row of ``attention`` ``(..., q, k)`` → ``(..., q)``; 0 · log 0 = 0. ``normalize``: each row
    divided by its sum first (rows without mass stay 0). In float64 (``widest_dtype``: float32 on MPS)."""
    probs = attention.to(widest_dtype(attention.device))
    if normalize:
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return torch.special.entr(probs).sum(-1)


def layer_memory_bytes(length: int, heads: int) -> float:
    """Bytes ``layer_entropy_sums`` needs per sequence of ``length`` tokens for a layer of ``heads`` heads:
    the layer's fp32 scores and probabilities (2 · 4 · heads · n²) and one head's float64 copy and entropy
    terms (2 · 8 · n²). 20 GiB at 16k tokens and 8 heads."""
    return (8.0 * heads + 16.0) * length * length


def summed_row_entropy(attention: torch.Tensor, rows: slice, normalize: bool = False) -> torch.Tensor:
    """Σ over batch and ``rows`` of ``row_entropy`` for a map ``(batch, heads, q, k)`` → ``(heads,)`` float64,
    one head at a time, so the float64 copy is one head's."""
    return torch.stack([row_entropy(attention[:, head, rows], normalize).sum()
                        for head in range(attention.shape[1])])


def is_attention_map(value: Any, length: int) -> bool:
    """Whether ``value`` is an attention map ``(batch, heads, length, length)``."""
    return (isinstance(value, torch.Tensor) and value.dim() == 4
            and tuple(value.shape[-2:]) == (length, length))


def visible_keys(mask: Any, length: int, causal: bool) -> torch.Tensor:
    """nᵢ of every row, ``(batch or 1, length)`` float64: the keys a layer's ``mask`` leaves to row i, or,
    where the layer got no ``(…, length, length)`` mask, i + 1 (``causal``) or ``length``.

    An additive mask hides the keys it pushes to its dtype's lowest values (Transformers' eager masks); a
    boolean one keeps True or False, whichever its diagonal holds (every row sees its own token: Llama's
    masks are True where visible, MPT's where hidden). So a sliding window of W keys gives min(i + 1, W)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and tuple(mask.shape[-2:]) == (length, length):
        visible = layers.visible_keys(mask[:, 0] if mask.is_floating_point() else mask[:, 0].bool())
        if not bool(visible.diagonal(dim1=-2, dim2=-1).all()):  # every row sees itself: MPT's boolean
            visible = ~visible  # masks are True where hidden
        return visible.sum(-1).to(torch.float64)
    if causal:
        return torch.arange(1, length + 1, dtype=torch.float64).unsqueeze(0)
    return torch.full((1, length), float(length), dtype=torch.float64)


def layer_mask(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``attention_mask`` ``module`` was called with, by keyword or by position (``None`` where none)."""
    if "attention_mask" in kwargs:
        return kwargs["attention_mask"]
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    return bound.arguments.get("attention_mask")


MapHandler = Callable[[torch.Tensor, Any], None]
"""Called with a layer's attention map ``(batch, heads, n, n)`` and the mask that layer was given."""


@torch.no_grad()
def run_with_maps(model: torch.nn.Module, input_ids: torch.Tensor, handle: MapHandler) -> int:
    """Run ``model`` with ``output_attentions`` and hand each layer's map and mask to ``handle`` as the layer
    returns it; returns how many maps there were, ``ValueError`` when none (e.g. SDPA).

    A forward hook, put before every other hook (``prepend``), takes the map from each module that returns
    ``(output, map, ...)`` and passes ``(output, None, ...)`` on, so neither the layers nor Transformers'
    output recording keep it: one layer's map is alive at a time."""
    length = input_ids.shape[-1]
    seen = 0

    def reduce(module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
        nonlocal seen
        if not (isinstance(output, tuple) and len(output) > 1 and is_attention_map(output[1], length)):
            return None
        handle(output[1], layer_mask(module, args, kwargs))
        seen += 1
        return (output[0], None, *output[2:])

    handles = [module.register_forward_hook(reduce, prepend=True, with_kwargs=True)
               for module in model.modules()]
    try:
        model(input_ids=input_ids, output_attentions=True)
    finally:
        for hook in handles:
            hook.remove()
    if not seen:
        raise ValueError("the model returned no attention weights: load it with attn_implementation='eager' "
                         "(stock log-n: 'entropy_invariant_eager').")
    return seen


def layer_entropy_sums(model: torch.nn.Module, input_ids: torch.Tensor, rows: slice, normalize: bool = False,
                       *, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ over batch and ``rows`` of every layer's row entropies, ``(layers, heads)`` float64, and of log nᵢ,
    ``(layers,)`` float64 (``visible_keys`` of the layer's mask; ``causal`` where it has none), layer by layer
    (``run_with_maps``)."""
    sums: list[torch.Tensor] = []
    log_keys: list[torch.Tensor] = []
    length, batch = input_ids.shape[-1], input_ids.shape[0]

    def reduce(attention: torch.Tensor, mask: Any) -> None:
        sums.append(summed_row_entropy(attention, rows, normalize))
        keys = visible_keys(mask, length, causal)[:, rows].clamp_min(1).log()
        log_keys.append(keys.sum() * (batch / keys.shape[0]))

    run_with_maps(model, input_ids, reduce)
    return torch.stack(sums), torch.stack(log_keys)


def attends_causally(model: torch.nn.Module, input_ids: torch.Tensor) -> bool:
    """Whether no attention map of ``model`` on ``input_ids`` gives weight to a key after its query (the
    strict upper triangle is 0 in every layer and head): a causal model, whatever its modules call
    themselves (XGLM's, MPT's and Bloom's attention has no ``is_causal``). ``ValueError`` for a sequence
    shorter than 2 tokens, which cannot tell, or when no map comes back (``run_with_maps``)."""
    if input_ids.shape[-1] < 2:
        raise ValueError(f"causality needs a sequence of 2 tokens or more, got {input_ids.shape[-1]}.")
    above: list[bool] = []
    run_with_maps(model, input_ids, lambda attention, _mask: above.append(
        bool(attention.triu(diagonal=1).ne(0).any())))
    return not any(above)


def entropy_by_length(
    model: torch.nn.Module,
    batches: Callable[[int], Sequence[torch.Tensor]],
    lengths: Sequence[int],
    *,
    causal: bool,
    normalize: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[LengthPoint]:
    """One ``LengthPoint`` per length of ``lengths``: the mean entropy per layer and head, and the mean log nᵢ
    per layer, over the ``measured_rows`` of every sequence of ``batches(length)`` (a list of
    ``(batch, length)`` id tensors), one layer's map at a time (``layer_entropy_sums``)."""
    points = []
    for length in lengths:
        totals: torch.Tensor | None = None
        key_totals: torch.Tensor | None = None
        count = 0
        rows = measured_rows(length, causal)
        for input_ids in batches(length):
            summed, keys = layer_entropy_sums(model, input_ids, rows, normalize, causal=causal)
            totals = summed if totals is None else totals + summed
            key_totals = keys if key_totals is None else key_totals + keys
            count += input_ids.shape[0] * len(range(length)[rows])
        if totals is None or key_totals is None:
            raise ValueError(f"no input sequences at length {length}.")
        layer_keys = (key_totals / count).tolist()
        points.append(LengthPoint(length, sum(layer_keys) / len(layer_keys), (totals / count).tolist(), count,
                                  layer_keys))
        if progress is not None:
            progress(length)
    return points


def fit_slope(log_keys: Sequence[float], entropy: Sequence[float]) -> float:
    """Least-squares slope of ``entropy`` against ``log_keys`` (dH/d log n); NaN with fewer than 2 distinct
    points (one length, or the same length twice); ``ValueError`` when the two sequences differ in length."""
    if len(log_keys) != len(entropy):
        raise ValueError(f"log_keys and entropy must have one value per point, got {len(log_keys)} and "
                         f"{len(entropy)}.")
    if len(log_keys) < 2:
        return math.nan
    mean_x, mean_y = sum(log_keys) / len(log_keys), sum(entropy) / len(entropy)
    spread = sum((x - mean_x) ** 2 for x in log_keys)
    if spread == 0:
        return math.nan
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(log_keys, entropy)) / spread


def head_slopes(points: Sequence[LengthPoint]) -> list[list[float]]:
    """``fit_slope`` of every layer and head over ``points`` against that layer's log nᵢ: ``[layer][head]``
    (``[]`` without points; NaN for a layer whose nᵢ did not change, a sliding window shorter than every
    length)."""
    if not points:
        return []
    layers, heads = len(points[0].entropy), len(points[0].entropy[0])
    return [[fit_slope([point.keys_of(layer) for point in points],
                       [point.entropy[layer][head] for point in points]) for head in range(heads)]
            for layer in range(layers)]


def diffuse_heads(points: Sequence[LengthPoint], reference: int,
                  threshold: float = 0.5) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs whose entropy at the length ``reference`` is at least ``threshold`` of the
    uniform row's (H ≥ threshold · log nᵢ, nᵢ as that layer sees them): heads that spread their attention
    rather than point (none without points)."""
    if not points:
        return []
    point = min(points, key=lambda p: abs(p.length - reference))
    return [(layer, head) for layer, values in enumerate(point.entropy) for head, value in enumerate(values)
            if value >= threshold * point.keys_of(layer)]


__all__ = [
    "LengthPoint",
    "attends_causally",
    "diffuse_heads",
    "entropy_by_length",
    "fit_slope",
    "head_slopes",
    "is_attention_map",
    "layer_memory_bytes",
    "layer_entropy_sums",
    "layer_mask",
    "measured_rows",
    "row_entropy",
    "run_with_maps",
    "summed_row_entropy",
    "visible_keys",
]
