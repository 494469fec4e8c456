"""Data and metrics for the ``prune`` command: local files → fixed batches → importance batches and a metric.

Tasks, chosen from the model's class (``config.architectures``) unless given:
- ``classification`` (``*ForSequenceClassification``): text (+ optional pair) and label columns;
  metric = accuracy (higher is better).
- ``causal-lm`` (``*ForCausalLM``): text column; labels = input ids (padding ignored); metric = perplexity.
- ``masked-lm`` (``*ForMaskedLM``): text column; 15% of non-special tokens masked BERT-style with a fixed
  seed, so every evaluation sees the same masks; metric = perplexity on the masked tokens.
Batches are built once (padded per batch) and reused, so every pruning step is evaluated on the same data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..cli_utils import FlagError, error_reason
from ..training.data import quiet_datasets

TASKS = ("classification", "causal-lm", "masked-lm")
TASK_SUFFIXES = {"ForSequenceClassification": "classification", "ForCausalLM": "causal-lm",
                 "ForMaskedLM": "masked-lm"}
BUILDERS = {".txt": "text", ".text": "text", ".csv": "csv", ".json": "json", ".jsonl": "json"}


def infer_task(model: PreTrainedModel) -> str:
    """The task implied by the model's class name (``…ForSequenceClassification`` → ``classification`` …)."""
    name = type(model).__name__
    for suffix, task in TASK_SUFFIXES.items():
        if name.endswith(suffix):
            return task
    raise FlagError("task", f"Cannot infer the task from {name}; pass --task, one of {TASKS}.")


def load_rows(path: str, flag: str = "train_file") -> Any:
    """A ``datasets.Dataset`` from a local text/csv/json(l) file (``datasets`` builders, no download).

    ``FlagError`` naming ``flag`` for another extension, a missing file or content the builder cannot read.
    """
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    suffix = Path(path).suffix.lower()
    if suffix not in BUILDERS:
        raise FlagError(flag, f"data files must end in one of {tuple(BUILDERS)}, got {path!r}.")
    if not Path(path).is_file():
        raise FlagError(flag, f"no such data file: {path!r}.")
    try:
        with quiet_datasets():
            return load_dataset(BUILDERS[suffix], data_files={"data": path})["data"]
    except (DatasetGenerationError, ValueError, OSError, StopIteration) as error:  # StopIteration: empty json
        cause = error.__cause__ or error
        reason = "it holds no rows" if isinstance(cause, StopIteration) else error_reason(cause)
        raise FlagError(flag, f"{path!r} cannot be read as {BUILDERS[suffix]} data ({reason}).") from error


def _text_column(rows: Any, name: str | None) -> str:
    if name is not None:
        if name not in rows.column_names:
            raise FlagError("text_column",
                            f"--text_column {name!r} is not a column; columns: {rows.column_names}.")
        return name
    if "text" in rows.column_names:
        return "text"
    for column in rows.column_names:
        if isinstance(rows[0][column], str):
            return column
    raise FlagError("text_column", f"no text column found in {rows.column_names}; pass --text_column.")


def _integers(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def label_mapping(values: Sequence[Any], model: PreTrainedModel) -> dict[str, int] | None:
    """How ``label_ids`` turns label names into ids: ``config.label2id`` if it names every value, else the
    sorted names; None for integer labels. Build it once from every split's labels (training and validation
    rows), so that a split sorted by label or missing a class maps each name to the same id."""
    if _integers(values):
        return None
    label2id = dict(getattr(model.config, "label2id", {}) or {})
    names = sorted({str(v) for v in values})
    return label2id if all(n in label2id for n in names) else {n: i for i, n in enumerate(names)}


def label_ids(values: Sequence[Any], model: PreTrainedModel,
              mapping: Mapping[str, int] | None = None) -> list[int]:
    """Integer labels: ints as they are; strings through ``mapping`` (``label_mapping`` of ``values`` when
    None). ``FlagError`` naming ``--label_column`` for a name ``mapping`` lacks or an id out of range."""
    if _integers(values):
        ids = list(values)
    else:
        mapping = label_mapping(values, model) if mapping is None else mapping
        missing = sorted({str(v) for v in values} - set(mapping))
        if missing:
            raise FlagError("label_column", f"labels {missing} are not among the labels {sorted(mapping)}.")
        ids = [int(mapping[str(v)]) for v in values]
    num_labels = int(getattr(model.config, "num_labels", 2))
    bad = sorted({i for i in ids if not 0 <= i < num_labels})
    if bad:
        raise FlagError("label_column",
                        f"labels {bad} are out of range for a model with num_labels={num_labels}.")
    return ids


def build_batches(
    rows: Any,
    tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    task: str,
    *,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str = "label",
    max_seq_length: int = 128,
    batch_size: int = 16,
    mlm_probability: float = 0.15,
    seed: int = 0,
    labels: Mapping[str, int] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Tokenize ``rows`` and return dict batches with labels for ``task``, padded on the right whatever the
    tokenizer's ``padding_side`` (left padding would shift a decoder's positions, so a row's scores and
    metric would depend on the rows batched with it). ``labels``: the name → id mapping of string labels
    (``label_mapping`` over every split), else one from these rows alone."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
    column = _text_column(rows, text_column)
    texts = [str(t) for t in rows[column]]
    keep = [i for i, t in enumerate(texts) if t.strip()]
    texts = [texts[i] for i in keep]
    if not texts:
        raise FlagError("text_column", f"no non-empty texts in column {column!r}.")
    if text_pair_column is not None and text_pair_column not in rows.column_names:
        raise FlagError("text_pair_column",
                        f"--text_pair_column {text_pair_column!r} is not a column; columns: "
                        f"{rows.column_names}.")
    pairs = [str(rows[text_pair_column][i]) for i in keep] if text_pair_column else None
    encoded = tokenizer(texts, pairs, truncation=True, max_length=max_seq_length)
    examples = [{k: encoded[k][i] for k in encoded} for i in range(len(texts))]
    if task == "classification":
        if label_column not in rows.column_names:
            raise FlagError("label_column",
                            f"--label_column {label_column!r} is not a column; columns: {rows.column_names}.")
        ids = label_ids([rows[label_column][i] for i in keep], model, labels)
        for example, label in zip(examples, ids):
            example["labels"] = label
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = tokenizer.pad(chunk, return_tensors="pt", padding_side="right")
        batch = {k: v for k, v in batch.items()}
        if task == "causal-lm":
            targets = batch["input_ids"].clone()
            targets[batch["attention_mask"] == 0] = -100
            batch["labels"] = targets
        elif task == "masked-lm":
            batch["input_ids"], batch["labels"] = mask_for_mlm(batch, tokenizer, mlm_probability, generator)
        batches.append(batch)
    return batches


def mask_for_mlm(
    batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase, probability: float,
    generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking (80% [MASK], 10% random, 10% kept) of non-special tokens; labels −100 elsewhere.

    Every row with a non-special token gets at least one target (the token of its smallest draw), as
    ``pretrain``'s masking does: a row without one has a loss of 0/0 (NaN).
    """
    if tokenizer.mask_token_id is None:
        raise FlagError("tokenizer_name", "masked-lm needs a tokenizer with a mask token.")
    ids = batch["input_ids"].clone()
    special = torch.tensor(
        [tokenizer.get_special_tokens_mask(row, already_has_special_tokens=True) for row in ids.tolist()],
        dtype=torch.bool
    ) | (batch["attention_mask"] == 0)
    draws = torch.rand(ids.shape, generator=generator)
    chosen = (draws < probability) & ~special
    untargeted = ~chosen.any(dim=1) & (~special).any(dim=1)
    smallest = draws.masked_fill(special, 2.0).argmin(dim=1)
    chosen[untargeted, smallest[untargeted]] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    ids[chosen & (roll < 0.8)] = tokenizer.mask_token_id
    random_ids = torch.randint(len(tokenizer), ids.shape, generator=generator)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    ids[swap] = random_ids[swap]
    return ids, labels


def count_targets(batches: list[dict[str, torch.Tensor]], causal: bool) -> int:
    """The tokens a perplexity on ``batches`` averages over: labels other than -100, after the first of each
    row when the model shifts them (``causal``)."""
    return sum(int((batch["labels"][:, int(causal):] != -100).sum()) for batch in batches)


def accuracy_metric(batches: list[dict[str, torch.Tensor]]) -> Callable[[PreTrainedModel], float]:
    """``metric(model)`` = classification accuracy on ``batches``."""

    @torch.no_grad()
    def metric(model: PreTrainedModel) -> float:
        device = next(model.parameters()).device
        correct = total = 0
        for batch in batches:
            inputs = {k: v.to(device) for k, v in batch.items()}
            logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
            correct += int((logits.argmax(-1) == inputs["labels"]).sum())
            total += inputs["labels"].numel()
        return correct / max(total, 1)

    return metric


def perplexity_metric(batches: list[dict[str, torch.Tensor]],
                      causal: bool) -> Callable[[PreTrainedModel], float]:
    """``metric(model)`` = exp(mean token cross-entropy) on ``batches`` (causal: next-token; else masked)."""

    @torch.no_grad()
    def metric(model: PreTrainedModel) -> float:
        device = next(model.parameters()).device
        loss_sum, count = 0.0, 0
        for batch in batches:
            inputs = {k: v.to(device) for k, v in batch.items()}
            logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits.float()
            labels = inputs["labels"]
            if causal:
                logits, labels = logits[:, :-1], labels[:, 1:]
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
            )
            loss_sum += float(losses)
            count += int((labels != -100).sum())
        if count == 0:  # exp(0 / 0) would read as a perfect perplexity of 1 at every step
            raise ValueError("the evaluation batches hold no token to predict.")
        return math.exp(min(loss_sum / count, 700.0))

    return metric


__all__ = [
    "TASKS",
    "accuracy_metric",
    "build_batches",
    "count_targets",
    "infer_task",
    "label_ids",
    "label_mapping",
    "load_rows",
    "mask_for_mlm",
    "perplexity_metric",
]
