"""Language-model evaluation on fixed-length blocks: loss, perplexity and top-1 accuracy.

loss = Σ CE(target) / #targets over the whole set (token-weighted, not a mean of batch means), with
targets = the masked positions (MLM, masks seeded per block by ``mix_seed(seed, "eval", i)`` so every
evaluation of the same blocks uses the same masks) or every next token (CLM, the last position has no
target). perplexity = exp(loss). accuracy = fraction of targets whose arg-max prediction is right.
Under several processes each rank evaluates blocks rank, rank + world, … and the sums are all-reduced,
so the result equals a one-process evaluation (every rank runs the same number of forward passes).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .data import mask_tokens, mix_seed
from .modeling import masked_lm_target_logits


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids never chosen as MLM targets ([PAD], [CLS], [SEP], [MASK], … ; [UNK] stays maskable)."""
    return sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id})


def _as_tensor(blocks: Any) -> torch.Tensor:
    if isinstance(blocks, torch.Tensor):
        return blocks.long()
    if hasattr(blocks, "column_names"):  # datasets.Dataset
        blocks = blocks["input_ids"]
    return torch.tensor([list(b) for b in blocks], dtype=torch.long)


@torch.no_grad()
def evaluate_lm(
    model: PreTrainedModel | torch.nn.Module,
    blocks: Any,
    *,
    objective: str,
    tokenizer: PreTrainedTokenizerBase | None = None,
    batch_size: int = 8,
    mlm_probability: float = 0.15,
    seed: int = 0,
    accelerator: Any = None,
    max_blocks: int | None = None,
) -> dict[str, float]:
    """Evaluate ``model`` on ``blocks`` (tensor ``(n, L)``, list of lists or a dataset with ``input_ids``).

    Returns ``{"loss", "perplexity", "accuracy", "tokens", "blocks"}``. ``tokenizer`` is required for MLM
    (mask id, special ids). ``accelerator``: shard across processes and use its autocast — an ``Accelerator``
    or a ``runtime.TrainingRuntime`` (``process_index``/``num_processes`` are then the data-parallel rank and
    size, and ``reduce`` sums over the data-parallel ranks).
    """
    if objective not in ("mlm", "clm"):
        raise ValueError(f"objective must be one of ('mlm', 'clm'), got {objective!r}.")
    if objective == "mlm" and tokenizer is None:
        raise ValueError("evaluate_lm(objective='mlm') needs the tokenizer (mask and special token ids).")
    data = _as_tensor(blocks)
    if max_blocks is not None:
        data = data[:max_blocks]
    if data.dim() != 2 or len(data) == 0:
        raise ValueError(f"blocks must be a non-empty (num_blocks, length) set of token ids, got shape {tuple(data.shape)}.")
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    indices = list(range(rank, len(data), world))
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    vocab_size = model.config.vocab_size if hasattr(model, "config") else None
    # Every rank runs the same number of forward passes (sharded models gather parameters collectively);
    # a rank whose share is exhausted runs a dummy batch whose results are discarded.
    per_rank = math.ceil(len(data) / world)
    for start in range(0, per_rank, batch_size):
        chunk = indices[start : start + batch_size]
        dummy = not chunk
        chunk = chunk or [0]
        input_ids = data[chunk].to(device)
        if objective == "mlm":
            inputs, labels = mask_tokens(
                input_ids,
                [mix_seed(seed, "eval", i) for i in chunk],
                mask_token_id=tokenizer.mask_token_id,
                vocab_size=vocab_size or len(tokenizer),
                special_ids=special_token_ids(tokenizer),
                probability=mlm_probability,
            )
        else:
            inputs, labels = input_ids, input_ids
        context = accelerator.autocast() if accelerator is not None else torch.autocast("cpu", enabled=False)
        with context:
            if objective == "mlm":  # the MLM head only at the targets (same values, less compute)
                keep = labels != -100
                logits, targets = masked_lm_target_logits(model, inputs, keep).float(), labels[keep]
            else:
                logits, targets = model(input_ids=inputs).logits[:, :-1].float(), labels[:, 1:]
                logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        if dummy:
            continue
        loss_sum += F.cross_entropy(logits, targets, reduction="sum").double()
        correct += (logits.argmax(-1) == targets).sum().double()
        count += targets.numel()
    if accelerator is not None and world > 1:
        loss_sum, correct, count = (accelerator.reduce(t, reduction="sum") for t in (loss_sum, correct, count))
    model.train(was_training)
    total = max(float(count), 1.0)
    loss = float(loss_sum) / total
    return {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else float("inf"),
        "accuracy": float(correct) / total,
        "tokens": float(count),
        "blocks": float(len(data)),
    }


__all__ = ["evaluate_lm", "special_token_ids"]
