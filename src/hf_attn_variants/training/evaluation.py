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

from ..models.layers import widest_dtype
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


def _positions(blocks: Any) -> torch.Tensor | None:
    """The ``position_ids`` of packed documents (``--packing documents``: a dataset column), else ``None``."""
    if hasattr(blocks, "column_names") and "position_ids" in blocks.column_names:
        return torch.tensor([list(b) for b in blocks["position_ids"]], dtype=torch.long)
    return None


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
    mask_repeats: int = 1,
    train_length: int | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` on ``blocks`` (tensor ``(n, L)``, list of lists or a dataset with ``input_ids``).

    Returns ``{"loss", "perplexity", "accuracy", "tokens", "blocks"}``. ``tokenizer`` is required for MLM
    (mask id, special ids). ``accelerator``: shard across processes and use its autocast — an ``Accelerator``
    or a ``runtime.TrainingRuntime`` (``process_index``/``num_processes`` are then the data-parallel rank and
    size, and ``reduce`` sums over the data-parallel ranks).

    ``mask_repeats`` (MLM): pool the targets of that many maskings, seeds ``seed``, ``seed + 1``, … (the same
    for every model, so differences between models are paired). ``train_length`` (the length study): the
    result also has ``tokens_beyond_train``, ``loss_beyond_train`` and ``perplexity_beyond_train``, pooled
    over the CLM targets predicted from query positions ≥ ``train_length`` (position ids the model never
    trained at); they are ``None`` for MLM and where no such target exists.
    """
    if objective not in ("mlm", "clm"):
        raise ValueError(f"objective must be one of ('mlm', 'clm'), got {objective!r}.")
    if objective == "mlm" and tokenizer is None:
        raise ValueError("evaluate_lm(objective='mlm') needs the tokenizer (mask and special token ids).")
    for name, value, low in (("batch_size", batch_size, 1), ("mask_repeats", mask_repeats, 1),
                             ("max_blocks", 1 if max_blocks is None else max_blocks, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    data, positions = _as_tensor(blocks), _positions(blocks)
    if max_blocks is not None:
        data = data[:max_blocks]
    if data.dim() != 2 or len(data) == 0:
        raise ValueError("blocks must be a non-empty (num_blocks, length) set of token ids, got shape "
                         f"{tuple(data.shape)}.")
    if objective == "clm" and data.shape[1] < 2:
        raise ValueError(f"blocks of {data.shape[1]} token give no next-token target (objective='clm'): "
                         "they need at least 2.")
    rank, world = ((accelerator.process_index, accelerator.num_processes) if accelerator is not None
                   else (0, 1))
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    indices = list(range(rank, len(data), world))
    was_training = model.training
    model.eval()
    # Σ CE and Σ CE beyond train_length in the widest float; #correct, #targets, #targets beyond in int64
    sums = torch.zeros(2, dtype=widest_dtype(torch.device(device)), device=device)
    counts = torch.zeros(3, dtype=torch.int64, device=device)
    beyond = train_length if objective == "clm" else None
    # Every rank runs the same number of forward passes (sharded models gather parameters collectively);
    # a rank whose share is exhausted runs a dummy batch whose results are discarded.
    per_rank = math.ceil(len(data) / world)
    for start in range(0, per_rank, batch_size):
        chunk = indices[start : start + batch_size]
        input_ids = data[chunk or [0]].to(device)
        position_ids = positions[chunk or [0]].to(device) if positions is not None else None
        for repeat in range(mask_repeats if objective == "mlm" else 1):
            logits, targets = _logits_and_targets(
                model, input_ids, chunk or [0], objective, tokenizer, mlm_probability, seed + repeat,
                accelerator, position_ids,
            )
            if chunk:
                batch_sums, batch_counts = _target_sums(logits, targets, beyond)
                sums += batch_sums
                counts += batch_counts
    if accelerator is not None and world > 1:
        sums, counts = accelerator.reduce(sums, reduction="sum"), accelerator.reduce(counts, reduction="sum")
    model.train(was_training)
    return _metrics(sums, counts, len(data), train_length, clm=objective == "clm")


def _logits_and_targets(
    model: Any, input_ids: torch.Tensor, block_indices: list[int], objective: str, tokenizer: Any,
    mlm_probability: float, seed: int, accelerator: Any, position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits and their target ids: ``(targets, vocab)`` / ``(targets,)`` at the masked positions
    (MLM, masks seeded per block by ``mix_seed(seed, "eval", i)``), ``(batch, L - 1, vocab)`` /
    ``(batch, L - 1)`` for every next token (CLM; packed documents' first tokens are no target: -100)."""
    context = accelerator.autocast() if accelerator is not None else torch.autocast("cpu", enabled=False)
    if objective == "clm":
        with context:
            logits = model(input_ids=input_ids, position_ids=position_ids).logits[:, :-1].float()
        targets = input_ids[:, 1:]
        return logits, (targets if position_ids is None
                        else targets.masked_fill(position_ids[:, 1:] == 0, -100))
    vocab_size = (model.config.vocab_size if hasattr(model, "config") else None) or len(tokenizer)
    inputs, labels = mask_tokens(
        input_ids,
        [mix_seed(seed, "eval", i) for i in block_indices],
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=vocab_size,
        special_ids=special_token_ids(tokenizer),
        probability=mlm_probability,
    )
    keep = labels != -100
    with context:  # the MLM head only at the targets (same values, less compute)
        logits = masked_lm_target_logits(model, inputs, keep, position_ids).float()
    return logits, labels[keep]


def _target_sums(logits: torch.Tensor, targets: torch.Tensor,
                 beyond: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[Σ CE, Σ CE beyond] of one batch in float64 (``widest_dtype``: float32 on MPS), and [#correct,
    #targets, #targets beyond] in int64 (exact on every device), both on the logits' device: nothing is read
    back (targets -100 are none). "Beyond": CLM targets predicted from query positions ≥ ``beyond``
    (dimension 1 of ``targets``)."""
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                             reduction="none").to(widest_dtype(logits.device))
    losses = losses.view_as(targets)
    keep = targets != -100
    correct = ((logits.argmax(-1) == targets) & keep).sum()
    beyond_losses = losses[:, beyond:] if beyond is not None else losses[:0]
    beyond_count = keep[:, beyond:].sum() if beyond is not None else torch.zeros_like(correct)
    return (torch.stack([losses.sum(), beyond_losses.sum()]),
            torch.stack([correct, keep.sum(), beyond_count]).to(torch.int64))


def _metrics(sums: torch.Tensor, counts: torch.Tensor, num_blocks: int, train_length: int | None,
             clm: bool) -> dict[str, Any]:
    """loss = Σ CE / #targets, perplexity = exp(loss), accuracy = #correct / #targets (and the same beyond
    ``train_length`` where asked: CLM only). With no target at all they are NaN, not a perfect score."""
    loss_sum, beyond_sum = (float(value) for value in sums)
    correct, count, beyond_count = (int(value) for value in counts)
    loss = loss_sum / count if count else math.nan
    result: dict[str, Any] = {
        "loss": loss, "perplexity": _perplexity(loss), "accuracy": correct / count if count else math.nan,
        "tokens": int(count), "blocks": num_blocks,
    }
    if train_length is not None:
        beyond_loss = beyond_sum / beyond_count if beyond_count else None
        result.update(tokens_beyond_train=int(beyond_count) if clm else None, loss_beyond_train=beyond_loss,
                      perplexity_beyond_train=None if beyond_loss is None else _perplexity(beyond_loss))
    return result


def _perplexity(loss: float) -> float:
    """exp(loss), ``inf`` where that overflows a float."""
    return math.exp(loss) if loss < 700 or math.isnan(loss) else float("inf")


__all__ = ["evaluate_lm", "special_token_ids"]
