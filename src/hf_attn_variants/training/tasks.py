"""The tasks ``finetune`` trains: reading the splits, tokenizing and labelling them, the model class and
metrics.

- ``sequence_classification``: a text column (``sentence``/``text``/``sentence1``, or ``--text_column_name``),
  optionally a second one (``sentence2``/``--text_pair_column_name``), and a ``label`` column of strings or
  ints (floats → regression, as run_glue). Metrics: accuracy and macro-F1 (regression: mse).
- ``token_classification``: a ``tokens`` column (lists of words, or a whitespace-separated string in csv) and
  a ``ner_tags`` column (lists of tag strings or ints; or a whitespace-separated string). Only the first
  sub-word of each word is labelled (``--label_all_tokens`` labels all, ``B-`` → ``I-`` after the first).
  Metrics: entity-level precision/recall/F1 (conlleval rules, ``metrics.entity_scores``) and token accuracy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..cli_utils import FlagError
from .data import file_builder, read_data_file, split_data_file
from .metrics import accuracy, entity_scores, macro_f1

if TYPE_CHECKING:
    from .arguments import FinetuneArguments


def load_splits(args: FinetuneArguments) -> Any:
    """``train`` and ``validation`` splits: ``--validation_file`` (same format and columns), else
    ``--validation_split_percentage`` of ``--train_file``."""
    from datasets import DatasetDict

    if args.validation_file:
        if (file_builder(args.train_file, "train_file")
                != file_builder(args.validation_file, "validation_file")):
            raise FlagError("validation_file", "train_file and validation_file must have the same format.")
        raw = DatasetDict(train=read_data_file(args.train_file, "train_file"),
                          validation=read_data_file(args.validation_file, "validation_file"))
        if raw["validation"].column_names != raw["train"].column_names:
            raise FlagError("validation_file",
                            f"validation_file has the columns {raw['validation'].column_names}, "
                            f"train_file {raw['train'].column_names}.")
        return raw
    return split_data_file(args.train_file, args.validation_split_percentage)


def pick_column(columns: list[str], explicit: str | None, candidates: tuple[str, ...],
                what: str) -> str | None:
    """The column named by the flag ``what`` (``FlagError`` unless it exists), else the first of
    ``candidates`` present, else ``None``."""
    if explicit is not None:
        if explicit not in columns:
            raise FlagError(what, f"{what} {explicit!r} is not a column of the data; columns: {columns}.")
        return explicit
    return next((c for c in candidates if c in columns), None)


def as_list(value: Any) -> list:
    """A list of words or tags: a whitespace-separated string split, any other sequence as a list."""
    return value.split() if isinstance(value, str) else list(value)


def label_names(dataset: Any, column: str, token_level: bool) -> list[Any]:
    """The labels of ``column``: a ``ClassLabel``'s names, else the sorted distinct values (of every tag with
    ``token_level``)."""
    feature = dataset["train"].features[column]
    inner = getattr(feature, "feature", feature)
    if hasattr(inner, "names"):  # ClassLabel
        return list(inner.names)
    values = set()
    for split in dataset.values():
        for value in split[column]:
            values.update(as_list(value) if token_level else [value])
    return sorted(values, key=lambda v: (str(type(v)), v))


def check_rows(raw: Any, text_columns: list[str], label_col: str, validation_file: str | None) -> None:
    """``FlagError`` naming the data file of a text column that is not strings, or of the first row whose text
    or label is missing (an empty cell) or NaN: a class named "None", a tokenizer error or a NaN loss
    otherwise. Read from the Arrow columns, without a Python pass over the rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for split_name, split in raw.items():
        flag = "validation_file" if split_name == "validation" and validation_file else "train_file"
        table = split.with_format("arrow")
        for column in (*text_columns, label_col):
            values = table[column]
            if column != label_col and not (pa.types.is_string(values.type)
                                            or pa.types.is_large_string(values.type)):
                raise FlagError(flag, f"{flag}: column {column!r} holds {values.type}, not text.")
            missing = pc.is_null(values, nan_is_null=True)
            if pc.any(missing).as_py():
                row = pc.index(missing, True).as_py()
                what = "label" if column == label_col else "text"
                raise FlagError(flag, f"{flag}: row {row} of the {split_name} split has no {what} in column "
                                      f"{column!r} (an empty cell, or NaN).")


def sequence_features(args: FinetuneArguments, raw: Any, tokenizer: Any) -> tuple[Any, list | None, bool]:
    """Tokenized sequence-classification data, the label list (``None`` for regression) and whether the labels
    are floats (regression, as run_glue)."""
    columns = raw["train"].column_names
    label_col = pick_column(columns, args.label_column_name, ("label", "labels"), "label_column_name")
    if label_col is None:
        raise FlagError("label_column_name",
                        f"No label column (label/labels) in {columns}; pass --label_column_name.")
    text_col = pick_column(columns, args.text_column_name, ("sentence", "text", "sentence1", "question"),
                           "text_column_name")
    text_col = text_col or next(c for c in columns if c != label_col)
    pair_col = pick_column(columns, args.text_pair_column_name, ("sentence2",), "text_pair_column_name")
    regression = raw["train"].features[label_col].dtype in ("float32", "float64")
    check_rows(raw, [text_col] + [pair_col] * (pair_col is not None), label_col, args.validation_file)
    label_list = None if regression else label_names(raw, label_col, token_level=False)
    label_to_id = None if regression else {label: i for i, label in enumerate(label_list)}

    def encode(batch: dict[str, list]) -> dict[str, list]:
        texts = (batch[text_col],) if pair_col is None else (batch[text_col], batch[pair_col])
        enc = tokenizer(*texts, truncation=True, max_length=args.max_seq_length,
                        padding="max_length" if args.pad_to_max_length else False)
        enc["labels"] = [float(v) if regression else label_to_id[v] for v in batch[label_col]]
        return enc

    return raw.map(encode, batched=True, remove_columns=columns), label_list, regression


def check_per_word(raw: Any, columns: dict[str, str]) -> None:
    """``FlagError`` naming ``--task`` when a column of ``columns`` (its flag → its name) holds no sequence
    per row (a list, or a whitespace-separated string): one int label per row is sequence classification's
    data."""
    import pyarrow as pa

    for flag, column in columns.items():
        kind = raw["train"].with_format("arrow")[column].type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_string(kind)
                or pa.types.is_large_string(kind)):
            raise FlagError("task", f"--task token_classification needs one entry per word in column "
                                    f"{column!r} (a list, or a whitespace-separated string), which holds "
                                    f"{kind}; pass --{flag}, or --task sequence_classification.")


def token_features(args: FinetuneArguments, raw: Any, tokenizer: Any) -> tuple[Any, list]:
    """Tokenized token-classification data (the first sub-word of each word labelled, or every one with
    ``--label_all_tokens``) and the tag list."""
    columns = raw["train"].column_names
    tokens_col = (pick_column(columns, args.text_column_name, ("tokens", "words"), "text_column_name")
                  or columns[0])
    label_col = pick_column(columns, args.label_column_name, ("ner_tags", "tags", "labels", "label"),
                            "label_column_name")
    if label_col is None:
        raise FlagError("label_column_name",
                        f"No tag column (ner_tags/tags/labels) in {columns}; pass --label_column_name.")
    check_per_word(raw, {"text_column_name": tokens_col, "label_column_name": label_col})
    names = label_names(raw, label_col, token_level=True)
    feature = raw["train"].features[label_col]
    has_class_names = hasattr(getattr(feature, "feature", feature), "names")
    label_list = [str(n) for n in names]
    label_to_id = {label: i for i, label in enumerate(label_list)}
    inside = {i: label_to_id.get("I-" + label[2:], i) if label.startswith("B-") else i
              for i, label in enumerate(label_list)}

    def encode(batch: dict[str, list]) -> dict[str, list]:
        words = [as_list(w) for w in batch[tokens_col]]
        enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=args.max_seq_length,
                        padding="max_length" if args.pad_to_max_length else False)
        all_labels = []
        for row, tags in enumerate(batch[label_col]):
            tags = as_list(tags)
            ids = [t if has_class_names else label_to_id[str(t)] for t in tags]
            if len(ids) != len(words[row]):
                raise FlagError("train_file", f"A row of the data has {len(words[row])} tokens (column "
                                              f"{tokens_col!r}) but {len(ids)} tags (column {label_col!r}).")
            labels, previous = [], None
            for word in enc.word_ids(row):
                if word is None:
                    labels.append(-100)
                elif word != previous:
                    labels.append(ids[word])
                else:
                    labels.append(inside[ids[word]] if args.label_all_tokens else -100)
                previous = word
            all_labels.append(labels)
        enc["labels"] = all_labels
        return enc

    return raw.map(encode, batched=True, remove_columns=columns), label_list


def task_auto_class(task: str) -> Any:
    """The ``AutoModelFor…`` class of ``--task``."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    return (AutoModelForSequenceClassification if task == "sequence_classification"
            else AutoModelForTokenClassification)


def label_kwargs(label_list: list | None, regression: bool) -> dict[str, Any]:
    """The config fields of the labels: ``num_labels`` and ``id2label``/``label2id`` (regression: one
    output)."""
    if regression:
        return {"num_labels": 1, "problem_type": "regression"}
    names = [str(label) for label in label_list]
    return {"num_labels": len(names), "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)}}


def compute_metrics(task: str, label_list: list | None, regression: bool, per_type: bool) -> Any:
    """``Trainer``'s ``compute_metrics``: accuracy and macro-F1 (regression: mse), or entity-level scores."""

    def compute(prediction: Any) -> dict[str, float]:
        logits, labels = prediction.predictions, prediction.label_ids
        logits = logits[0] if isinstance(logits, tuple) else logits
        if regression:
            return {"mse": float(np.mean((np.squeeze(logits, -1) - labels) ** 2))}
        predicted = np.argmax(logits, axis=-1)
        if task == "sequence_classification":
            return {"accuracy": accuracy(predicted.tolist(), labels.tolist()),
                    "f1": macro_f1(predicted.tolist(), labels.tolist())}
        pred_tags, gold_tags = [], []
        for pred_row, gold_row in zip(predicted, labels):
            keep = gold_row != -100
            pred_tags.append([label_list[i] for i in pred_row[keep]])
            gold_tags.append([label_list[i] for i in gold_row[keep]])
        return entity_scores(pred_tags, gold_tags, per_type=per_type)

    return compute


__all__ = [
    "as_list",
    "compute_metrics",
    "label_kwargs",
    "label_names",
    "load_splits",
    "pick_column",
    "sequence_features",
    "task_auto_class",
    "token_features",
]
