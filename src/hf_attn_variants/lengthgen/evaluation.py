"""Evaluating one trained model at many lengths on the same validation text.

The validation text (``validation_datasets``: the corpus's held-out split, ``validation_file``, or the
part of ``train_file`` that pretraining holds out) is tokenized once (``[CLS] paragraph [SEP]`` per
paragraph, as in pretraining) into one token stream; for each evaluation length ℓ the stream is cut into
⌊tokens / ℓ⌋ blocks of ℓ tokens (remainder dropped), so every length sees (almost) the same tokens, only
the context window changes. How many blocks and target tokens each point used is recorded with it.

Both objectives go through the one evaluator, ``training.evaluate_lm``:

- MLM: BERT masking, repeated with ``mask_repeats`` mask seeds (``seed``, ``seed + 1``, …; the same for every
  variant, so differences between variants at a length are paired) and pooled token-weighted:
  loss = Σ CE / #targets, accuracy = correct / #targets.
- CLM: every next token is a target; besides loss, perplexity = exp(loss) and next-token accuracy over
  the whole block, ``loss_beyond_train`` / ``perplexity_beyond_train`` (``train_length=L``) pool only the
  targets predicted from query positions ≥ ``train_length`` (token positions ≥ L + 1) — the predictions made
  at position ids, and with more visible keys, than the model ever saw in training (with RoPE these are
  rotation angles it never trained on; that is the point of the study).

Points beyond a model's maximum length (the Synthesizer's ``max_position_embeddings``) are not run;
they get ``status = "n/a (> max_position_embeddings = l)"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..training.data import group_token_lists
from ..training.evaluation import evaluate_lm


def na_status(max_length: int) -> str:
    """The status text of a point longer than the model's ``max_position_embeddings``."""
    return f"n/a (> max_position_embeddings = {max_length})"


def token_stream(texts: Sequence[str], tokenizer: Any) -> list[int]:
    """All texts tokenized (with their special tokens) and concatenated (none: ``[]``)."""
    if not texts:
        return []
    ids = tokenizer(list(texts), return_attention_mask=False)["input_ids"]
    return [token for row in ids for token in row]


def validation_datasets(train_file: str | None, validation_file: str | None) -> Any:
    """The ``DatasetDict(train=…, validation=…)`` a study's runs train and evaluate on, split as ``pretrain``
    splits them: the embedded corpus's held-out paragraphs without ``train_file``; with it,
    ``validation_file``, or else the last ``validation_split_percentage`` % of ``train_file`` that
    ``pretrain`` holds out (``PretrainArguments``' default, 5 %). So the evaluation text is always the user's
    data when a ``train_file`` is given, and never text the runs trained on. ``FlagError`` for a bad file."""
    from ..cli_utils import quiet_progress
    from ..training import PretrainArguments, load_text_datasets

    with quiet_progress():
        return load_text_datasets(train_file, validation_file,
                                  validation_split_percentage=PretrainArguments.validation_split_percentage)


def blocks_at(stream: Sequence[int], length: int, max_tokens: int | None = None) -> torch.Tensor:
    """``(⌊min(tokens, max_tokens) / length⌋, length)`` blocks of the stream; ``ValueError`` if none fits."""
    if length < 2:
        raise ValueError(f"eval_lengths must be >= 2, got {length}.")
    usable = stream if max_tokens is None else stream[: max(max_tokens, length)]
    blocks = group_token_lists([list(usable)], length)
    if not blocks:
        raise ValueError(f"The validation text holds {len(stream)} tokens, fewer than one block of {length}.")
    return torch.tensor(blocks, dtype=torch.long)


def evaluate_at_lengths(
    model: Any,
    stream: Sequence[int],
    lengths: Sequence[int],
    *,
    train_length: int,
    max_length: int | None = None,
    max_tokens: int | None = None,
    progress: Any = None,
    **evaluation: Any,
) -> list[dict[str, Any]]:
    """One row per length: ``{"length", "ratio", "status", metrics…, "tokens", "blocks"}``.

    ``evaluation``: the settings of ``training.evaluate_lm`` (``objective``, ``tokenizer``, ``batch_size``,
    ``seed``, ``mask_repeats``); the CLM rows add the loss beyond ``train_length``.
    ``max_length``: lengths above it get an ``n/a`` status instead of being run (``None`` = no limit).
    ``max_tokens``: the most validation tokens cut into blocks. ``progress``: an optional tqdm bar advanced
    once per length.
    """
    rows = []
    for length in lengths:
        row: dict[str, Any] = {"length": int(length), "ratio": length / train_length}
        if max_length is not None and length > max_length:
            row.update(status=na_status(max_length), tokens=0, blocks=0)
        else:
            blocks = blocks_at(stream, int(length), max_tokens)
            row.update(status="ok", **evaluate_lm(model, blocks, train_length=train_length, **evaluation))
        rows.append(row)
        if progress is not None:
            progress.update(1)
    return rows


__all__ = ["blocks_at", "evaluate_at_lengths", "na_status", "token_stream", "validation_datasets"]
