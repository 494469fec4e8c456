"""Evaluating one trained model at many lengths on the same validation text.

The validation split of the corpus is tokenized once (``[CLS] paragraph [SEP]`` per paragraph, as in
pretraining) into one token stream; for each evaluation length ℓ the stream is cut into ⌊tokens / ℓ⌋
blocks of ℓ tokens (remainder dropped), so every length sees (almost) the same tokens, only the context
window changes. How many blocks and target tokens each point used is recorded with it.

- MLM: ``training.evaluate_lm`` with BERT masking, repeated with ``mask_repeats`` mask seeds
  (``seed``, ``seed + 1``, …; the same for every variant, so differences between variants at a length are
  paired) and pooled token-weighted: loss = Σ CE / #targets, accuracy = correct / #targets.
- CLM: every next token is a target; besides loss, perplexity = exp(loss) and next-token accuracy over
  the whole block, ``loss_beyond_train`` / ``perplexity_beyond_train`` pool only the targets predicted
  from query positions ≥ ``train_length`` (token positions ≥ L + 1) — the predictions made at position
  ids, and with more visible keys, than the model ever saw in training (with RoPE these are rotation
  angles it never trained on; that is the point of the study).

Points beyond a model's maximum length (the Synthesizer's ``max_position_embeddings``) are not run;
they get ``status = "n/a (> max_position_embeddings = l)"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..training.data import group_token_lists
from ..training.evaluation import evaluate_lm


def na_status(max_length: int) -> str:
    """The status text of a point longer than the model's ``max_position_embeddings``."""
    return f"n/a (> max_position_embeddings = {max_length})"


def token_stream(texts: Sequence[str], tokenizer: Any) -> list[int]:
    """All texts tokenized (with their special tokens) and concatenated."""
    ids = tokenizer(list(texts), return_attention_mask=False)["input_ids"]
    return [token for row in ids for token in row]


def blocks_at(stream: Sequence[int], length: int, max_tokens: int | None = None) -> torch.Tensor:
    """``(⌊min(tokens, max_tokens) / length⌋, length)`` blocks of the stream; ``ValueError`` if none fits."""
    if length < 2:
        raise ValueError(f"eval_lengths must be >= 2, got {length}.")
    usable = stream if max_tokens is None else stream[: max(max_tokens, length)]
    blocks = group_token_lists([list(usable)], length)
    if not blocks:
        raise ValueError(f"The validation text holds {len(stream)} tokens, fewer than one block of {length}.")
    return torch.tensor(blocks, dtype=torch.long)


@torch.no_grad()
def evaluate_causal(model: Any, blocks: torch.Tensor, *, train_length: int, batch_size: int = 8) -> dict[str, Any]:
    """Next-token loss/perplexity/accuracy over whole blocks and over predictions from positions ≥ ``train_length``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum = correct = count = beyond_sum = beyond_count = 0.0
    for start in range(0, len(blocks), batch_size):
        input_ids = blocks[start : start + batch_size].to(device)
        logits = model(input_ids=input_ids).logits[:, :-1].float()
        targets = input_ids[:, 1:]
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        losses = losses.view_as(targets).double()
        loss_sum += float(losses.sum())
        correct += float((logits.argmax(-1) == targets).sum())
        count += targets.numel()
        beyond = losses[:, train_length:]  # predicted from query positions >= train_length
        beyond_sum += float(beyond.sum())
        beyond_count += beyond.numel()
    model.train(was_training)
    loss = loss_sum / max(count, 1.0)
    result: dict[str, Any] = {"loss": loss, "perplexity": _exp(loss), "accuracy": correct / max(count, 1.0),
                              "tokens": int(count), "blocks": len(blocks), "tokens_beyond_train": int(beyond_count),
                              "loss_beyond_train": None, "perplexity_beyond_train": None}
    if beyond_count:
        result["loss_beyond_train"] = beyond_sum / beyond_count
        result["perplexity_beyond_train"] = _exp(result["loss_beyond_train"])
    return result


def evaluate_masked(model: Any, blocks: torch.Tensor, *, tokenizer: Any, mask_repeats: int = 1, seed: int = 0,
                    batch_size: int = 8) -> dict[str, Any]:
    """MLM loss/accuracy pooled over ``mask_repeats`` BERT maskings (seeds ``seed + r``)."""
    if mask_repeats < 1:
        raise ValueError(f"eval_mask_repeats must be >= 1, got {mask_repeats}.")
    loss_sum = correct = count = 0.0
    for repeat in range(mask_repeats):
        result = evaluate_lm(model, blocks, objective="mlm", tokenizer=tokenizer, batch_size=batch_size,
                             seed=seed + repeat)
        loss_sum += result["loss"] * result["tokens"]
        correct += result["accuracy"] * result["tokens"]
        count += result["tokens"]
    loss = loss_sum / max(count, 1.0)
    return {"loss": loss, "perplexity": _exp(loss), "accuracy": correct / max(count, 1.0), "tokens": int(count),
            "blocks": len(blocks), "tokens_beyond_train": None, "loss_beyond_train": None,
            "perplexity_beyond_train": None}


def evaluate_at_lengths(
    model: Any,
    stream: Sequence[int],
    lengths: Sequence[int],
    *,
    objective: str,
    tokenizer: Any,
    train_length: int,
    max_length: int | None = None,
    mask_repeats: int = 1,
    seed: int = 0,
    batch_size: int = 8,
    max_tokens: int | None = None,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """One row per length: ``{"length", "ratio", "status", metrics…, "tokens", "blocks"}``.

    ``max_length``: lengths above it get an ``n/a`` status instead of being run (``None`` = no limit).
    ``progress``: an optional tqdm bar advanced once per length.
    """
    if objective not in ("mlm", "clm"):
        raise ValueError(f"objective must be one of ('mlm', 'clm'), got {objective!r}.")
    rows = []
    for length in lengths:
        row: dict[str, Any] = {"length": int(length), "ratio": length / train_length}
        if max_length is not None and length > max_length:
            row.update(status=na_status(max_length), tokens=0, blocks=0)
        else:
            blocks = blocks_at(stream, int(length), max_tokens)
            if objective == "mlm":
                metrics = evaluate_masked(model, blocks, tokenizer=tokenizer, mask_repeats=mask_repeats, seed=seed,
                                          batch_size=batch_size)
            else:
                metrics = evaluate_causal(model, blocks, train_length=train_length, batch_size=batch_size)
            row.update(status="ok", **metrics)
        rows.append(row)
        if progress is not None:
            progress.update(1)
    return rows


def _exp(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


__all__ = ["blocks_at", "evaluate_at_lengths", "evaluate_causal", "evaluate_masked", "na_status", "token_stream"]
