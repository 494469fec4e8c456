"""Where ``pretrain``'s text comes from, read whole or streamed.

- Local files: ``--train_file`` / ``--validation_file`` take one file, a glob or several
  (``data.expand_data_files``); txt/json/jsonl/csv/parquet through ``datasets``' builders, nothing downloaded.
- ``--dataset_name`` (and ``--dataset_config_name``): ``datasets.load_dataset(name, config)``: a Hub dataset,
  or a local dataset folder (data files in it, e.g. ``train-*.parquet``), which works offline. Its
  ``validation`` split is the validation data when it has one.
- Read whole (``load_named_dataset`` / ``data.load_text_datasets``): a ``DatasetDict`` with one ``text``
  column, validation held out as the last ``--validation_split_percentage`` % when there is no validation
  data.
- ``--streaming`` (``stream_data``): an ``IterableDataset`` read as training goes
  (``streaming.PackedStream``); validation is ``--validation_file`` (or the dataset's ``validation`` split),
  at most ``--max_eval_samples`` of its examples, or else the first ``--max_eval_samples`` examples of the
  training stream, held out: the training stream then skips every example whose text is one of them (a
  duplicate of a held-out text too, so no validation text is ever trained on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..cli_utils import FlagError, check_percentage
from .data import expand_data_files, file_builder, quiet_datasets, tokenize_texts

if TYPE_CHECKING:
    from .arguments import PretrainArguments


def text_column(columns: list[str], text_column_name: str | None, split: str, source_flag: str) -> str:
    """``text_column_name``, else ``text`` when present, else the first column; ``FlagError`` when it is
    missing."""
    column = text_column_name or ("text" if "text" in columns else columns[0])
    if column not in columns:
        raise FlagError("text_column_name" if text_column_name else source_flag,
                        f"text_column_name {column!r} is not a column of the {split} data; columns: "
                        f"{columns}.")
    return column


def _load(source_flag: str, *args: Any, **kwargs: Any) -> Any:
    """``datasets.load_dataset`` with its failures as one ``FlagError`` naming ``source_flag``."""
    from datasets import load_dataset

    try:
        with quiet_datasets():
            return load_dataset(*args, **kwargs)
    except Exception as error:
        # OSError, ValueError, datasets' own (DatasetNotFoundError, DatasetGenerationError, …)
        if (not isinstance(error, (OSError, ValueError))
                and type(error).__module__.split(".")[0] != "datasets"):
            raise
        lines = str(error).strip().splitlines()
        raise FlagError(source_flag, f"{source_flag} {args[0]!r} cannot be loaded "
                                     f"({lines[0] if lines else type(error).__name__}).") from error


def _text_only(split: Any, column: str) -> Any:
    """``split`` with its ``column`` renamed ``text`` and nothing else."""
    split = split.select_columns([column])
    return split.rename_column(column, "text") if column != "text" else split


def _keep_texts(split: Any) -> Any:
    return split.filter(lambda row: isinstance(row["text"], str) and bool(row["text"].strip()))


def load_named_dataset(name: str, config_name: str | None, *, text_column_name: str | None = None,
                       validation_split_percentage: int = 5) -> Any:
    """``DatasetDict(train=…, validation=…)`` with one ``text`` column of non-empty strings from
    ``load_dataset(name, config_name)``: its ``validation`` split, else the last
    ``validation_split_percentage`` % of ``train``. ``FlagError`` naming ``dataset_name`` (or
    ``text_column_name``) for a dataset that cannot be loaded or has no such column."""
    from datasets import DatasetDict

    check_percentage("validation_split_percentage", validation_split_percentage)
    splits = _load("dataset_name", name, config_name)
    if "train" not in splits:
        raise FlagError("dataset_name", f"dataset_name {name!r} has no train split; splits: {list(splits)}.")
    if "validation" in splits:
        raw = DatasetDict(train=splits["train"], validation=splits["validation"])
    else:
        cut = 100 - validation_split_percentage
        train = splits["train"]
        rows = len(train)
        held = rows - rows * cut // 100
        if held < 1 or held >= rows:
            raise FlagError("dataset_name",
                            f"dataset_name {name!r} has {rows} train row(s), too few to hold out "
                            f"validation_split_percentage={validation_split_percentage}% of them.")
        raw = DatasetDict(train=train.select(range(rows - held)),
                          validation=train.select(range(rows - held, rows)))
    column = text_column(raw["train"].column_names, text_column_name, "train", "dataset_name")
    for split_name, split in raw.items():
        text_column(split.column_names, column, split_name, "dataset_name")
    return _keep_texts(DatasetDict({split_name: _text_only(split, column)
                                    for split_name, split in raw.items()}))


# ---------------------------------------------------------------- streaming
def open_stream(args: PretrainArguments, split: str = "train") -> Any:
    """The ``text`` stream of ``split`` (``train`` or ``validation``) from ``--train_file`` /
    ``--validation_file`` or ``--dataset_name``; ``None`` for a validation split the source does not have."""
    if args.dataset_name is not None:
        names = _load("dataset_name", args.dataset_name, args.dataset_config_name, streaming=True)
        if split not in names:
            if split == "train":
                raise FlagError("dataset_name", f"dataset_name {args.dataset_name!r} has no train split; "
                                                f"splits: {list(names)}.")
            return None
        stream, flag = names[split], "dataset_name"
    else:
        flag = "validation_file" if split == "validation" else "train_file"
        path = args.validation_file if split == "validation" else (args.train_file or "")
        if split == "validation" and path is None:
            return None
        stream = _load(flag, file_builder(path, flag), data_files={"train": expand_data_files(path, flag)},
                       split="train", streaming=True)
    columns = stream.column_names or list(next(iter(stream)))
    return _keep_texts(_text_only(stream, text_column(columns, args.text_column_name, split, flag)))


def stream_validation_texts(args: PretrainArguments, train: Any) -> tuple[list[str], frozenset[str]]:
    """The validation texts of a streamed run and the texts the training stream must skip (see the module
    docstring): ``(texts, held_out)``."""
    validation = open_stream(args, "validation")
    limit = args.max_eval_samples
    if validation is not None:
        return [row["text"] for row in (validation.take(limit) if limit else validation)], frozenset()
    if not limit:
        return [], frozenset()
    texts = [row["text"] for row in train.take(limit)]
    return texts, frozenset(texts)


def training_stream(train: Any, held_out: frozenset[str]) -> Any:
    """The ``train`` stream without the held-out texts (``stream_validation_texts``)."""
    return train.filter(lambda row: row["text"] not in held_out) if held_out else train


def rank_share(train: Any, held_out: frozenset[str], rank: int, world: int) -> Any:
    """The ``text`` stream data-parallel rank ``rank`` of ``world`` reads (``split_dataset_by_node``),
    held-out texts skipped; a new object on every call."""
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(training_stream(train, held_out), rank=rank, world_size=world)


def rank_token_stream(train: Any, held_out: frozenset[str], tokenizer: Any, append_eos_id: int | None,
                      rank: int, world: int) -> Callable[[], Any]:
    """``make_source`` of ``streaming.PackedStream``: ``rank_share`` tokenized (a column ``input_ids``)."""

    def make_source() -> Any:  # a new object each time: a loaded starting position must not outlive its pass
        return rank_share(train, held_out, rank, world).map(
            lambda batch: {"input_ids": tokenize_texts(tokenizer, batch["text"], append_eos_id)},
            batched=True, remove_columns=["text"])

    return make_source


__all__ = ["load_named_dataset", "open_stream", "rank_share", "rank_token_stream", "stream_validation_texts",
           "text_column", "training_stream"]
