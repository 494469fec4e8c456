"""Language-modelling data: local files or the embedded corpus → fixed-length token blocks → batches.

- ``load_text_datasets``: a ``datasets.DatasetDict`` with ``train``/``validation`` and one ``text`` column,
  from local text/json/jsonl/csv/parquet files (``datasets`` builders, no download) or the embedded corpus.
- ``group_into_blocks``: as run_mlm's ``group_texts``: tokenize every text (``[CLS] … [SEP]``), concatenate,
  cut into blocks of exactly ``block_size`` tokens, drop the remainder. No padding anywhere.
- ``EpochShuffleSampler``: the permutation of epoch e is ``randperm(n)`` from a generator seeded with
  ``seed + e`` — a pure function of (seed, epoch), so the data order is identical after a resume and for
  any number of processes (accelerate shards the *batches* of this order across ranks; a sharded run's
  ``DataParallelBatchSampler`` gives each data-parallel rank its slice of each global batch).
- ``mask_tokens``: BERT masking (Devlin et al. 2019): each non-special token is selected with probability
  p; a selected token becomes ``[MASK]`` (80%), a random token (10%) or stays (10%); labels are −100
  elsewhere. The randomness of example i comes from its own generator seeded with
  ``mix_seed(seed, epoch, i)``, so masks do not depend on batch composition, process count, data-loader
  prefetching or a resume. Every example with a maskable token gets at least one selected token (no empty loss
  → no NaN).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Sampler
from transformers import PreTrainedTokenizerBase

from ..cli_utils import FlagError, check_percentage, error_reason
from .corpus import corpus_splits

FILE_BUILDERS = {"txt": "text", "text": "text", "json": "json", "jsonl": "json", "csv": "csv",
                 "parquet": "parquet"}


def mix_seed(*parts: int | str) -> int:
    """A 63-bit seed that is a deterministic hash of ``parts`` (blake2b, independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def file_builder(path: str, argument: str) -> str:
    """The ``datasets`` builder of a local data file (``--train_file``), by extension, or the one builder of
    several (``expand_data_files``); ``FlagError`` naming ``argument`` for another extension, a pattern
    matching no file, files of different formats, or a path that is not an existing file."""
    builders = {_one_file_builder(name, argument) for name in expand_data_files(path, argument)}
    if len(builders) > 1:
        raise FlagError(argument, f"{argument}: {path!r} mixes formats ({', '.join(sorted(builders))}); "
                                  "pass files of one format.")
    return builders.pop()


def _one_file_builder(path: str, argument: str) -> str:
    extension = Path(path).suffix.lstrip(".").lower()
    if extension not in FILE_BUILDERS:
        raise FlagError(argument,
                        f"{argument} must be a file ending in one of {tuple(FILE_BUILDERS)}, got {path!r}.")
    if not Path(path).exists():
        raise FlagError(argument, f"{argument}: no such file {path!r}.")
    if not Path(path).is_file():
        raise FlagError(argument, f"{argument}: {path!r} is not a file.")
    return FILE_BUILDERS[extension]


def expand_data_files(value: str, argument: str) -> list[str]:
    """The files of a ``--train_file`` value: one path, a glob (``'corpus/part-*.jsonl'``, sorted matches), or
    several of either joined by commas (from Python a list, which ``PretrainArguments`` joins). ``FlagError``
    naming ``argument`` for a pattern that matches no file."""
    files: list[str] = []
    for item in (part.strip() for part in str(value).split(",")):
        if not item:
            raise FlagError(argument, f"{argument}: empty file name in {value!r}.")
        if glob.has_magic(item):
            matches = sorted(name for name in glob.glob(item, recursive=True) if Path(name).is_file())
            if not matches:
                raise FlagError(argument, f"{argument}: the pattern {item!r} matches no file.")
            files.extend(matches)
        else:
            files.append(item)
    return list(dict.fromkeys(files))


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """Silence ``datasets``' logging and progress bars while a local file is read: a file that does not
    parse is then reported by the caller's one error line only, not also by datasets' ERROR log."""
    import datasets

    verbosity = datasets.utils.logging.get_verbosity()
    bars_were_disabled = datasets.are_progress_bars_disabled()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(verbosity)
        if not bars_were_disabled:
            datasets.enable_progress_bars()


def read_data_file(path: str, argument: str, split: str = "train") -> Any:
    """``load_dataset(<builder>, data_files=<the files of path>, split=split)`` of local files
    (``expand_data_files``); ``FlagError`` naming ``argument`` when the file cannot be read with the builder
    of its extension (malformed content)."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    builder = file_builder(path, argument)
    try:
        with quiet_datasets():
            return load_dataset(builder, data_files={"train": expand_data_files(path, argument)}, split=split)
    except (DatasetGenerationError, ValueError, OSError, StopIteration) as error:  # StopIteration: empty json
        cause = error.__cause__ or error
        reason = "it holds no rows" if isinstance(cause, StopIteration) else error_reason(cause)
        raise FlagError(argument,
                        f"{argument}: {path!r} cannot be read as {builder} data ({reason}).") from error


def split_data_file(path: str, validation_split_percentage: int) -> Any:
    """``DatasetDict(train=…, validation=…)``: the first ``100 - validation_split_percentage`` % of the rows
    of the local file ``path`` (``--train_file``) and the rest; ``FlagError`` when it is too short to
    split."""
    from datasets import DatasetDict

    check_percentage("validation_split_percentage", validation_split_percentage)
    rows = read_data_file(path, "train_file")
    cut = 100 - validation_split_percentage
    try:
        return DatasetDict(train=read_data_file(path, "train_file", f"train[:{cut}%]"),
                           validation=read_data_file(path, "train_file", f"train[{cut}%:]"))
    except FlagError as error:  # one of the slices is empty
        raise FlagError("train_file", f"train_file {path!r} has {rows.num_rows} row(s), too few to hold out "
                                      f"validation_split_percentage={validation_split_percentage}% of them; "
                                      "pass --validation_file or a longer file.") from error


def load_text_datasets(
    train_file: str | None = None,
    validation_file: str | None = None,
    *,
    text_column_name: str | None = None,
    validation_split_percentage: int = 5,
    validation_fraction: float = 0.1,
) -> Any:
    """``DatasetDict(train=…, validation=…)`` with a single ``text`` column of non-empty strings.

    Without ``train_file``: the embedded corpus (``validation_fraction`` of its paragraphs held out).
    With ``train_file`` but no ``validation_file``: the last ``validation_split_percentage`` % of it.
    ``text_column_name`` defaults to ``text`` when present, else the first column. A bad file, column or
    percentage raises ``FlagError`` naming the argument.
    """
    from datasets import Dataset, DatasetDict

    if train_file is None:
        if validation_file is not None:
            raise FlagError("validation_file",
                            "validation_file needs a train_file (without either, the embedded corpus is "
                            "used).")
        splits = corpus_splits(validation_fraction)
        return DatasetDict({name: Dataset.from_dict({"text": texts}) for name, texts in splits.items()})
    builder = file_builder(train_file, "train_file")
    if validation_file is not None:
        if file_builder(validation_file, "validation_file") != builder:
            raise FlagError("validation_file", "train_file and validation_file must have the same format.")
        raw = DatasetDict(train=read_data_file(train_file, "train_file"),
                          validation=read_data_file(validation_file, "validation_file"))
    else:
        raw = split_data_file(train_file, validation_split_percentage)
    columns = raw["train"].column_names
    column = text_column_name or ("text" if "text" in columns else columns[0])
    for name, split in raw.items():
        if column not in split.column_names:
            file_flag = "validation_file" if name == "validation" else "train_file"
            raise FlagError("text_column_name" if text_column_name else file_flag,
                            f"text_column_name {column!r} is not a column of the {name} data; "
                            f"columns: {split.column_names}.")
    raw = DatasetDict(
        {
            name: split.select_columns([column]).rename_columns({column: "text"} if column != "text" else {})
            for name, split in raw.items()
        }
    )
    return raw.filter(lambda row: isinstance(row["text"], str) and bool(row["text"].strip()))


def group_token_lists(token_lists: Sequence[Sequence[int]], block_size: int) -> list[list[int]]:
    """Concatenate token lists and cut into full blocks of ``block_size`` (remainder dropped)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}.")
    flat = list(chain.from_iterable(token_lists))
    usable = len(flat) // block_size * block_size
    return [flat[i : i + block_size] for i in range(0, usable, block_size)]


@dataclass
class Packer:
    """Blocks of exactly ``block_size`` tokens from token lists (documents) added one by one; the tokens that
    do not fill a block wait in the buffer for the next document.

    ``concat`` (``documents=False``) is run_mlm's ``group_texts``: one token stream cut into blocks. With
    ``documents`` each block also has ``position_ids``, each token's position in its document, restarting at 0
    at every document: a block holding documents of 3 and 5 tokens has ``[0, 1, 2, 0, 1, 2, 3, 4]``. The
    models read that as packed documents (Transformers' convention: positions restarting inside a row, no
    mask) and keep them apart. A document cut by a block's end goes on in the next block as a document of its
    own (from 0 again). ``starts``: where documents begin in the buffer, from which the positions are derived.
    """

    block_size: int
    documents: bool = False
    tokens: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)

    def add(self, ids: list[int]) -> None:
        """Append one document's tokens to the buffer."""
        if self.documents:
            self.starts.append(len(self.tokens))
        self.tokens.extend(ids)

    def blocks(self) -> Iterator[dict[str, list[int]]]:
        """Every full block the buffer holds (removed from it before it is yielded)."""
        size = self.block_size
        while len(self.tokens) >= size:
            block = {"input_ids": self.tokens[:size]}
            del self.tokens[:size]
            if self.documents:
                block["position_ids"] = self._positions(size)
                self.starts = [start - size for start in self.starts if start >= size]
            yield block

    def _positions(self, size: int) -> list[int]:
        """Positions of the buffer's first ``size`` tokens: 0 at the block's start and at every document
        start."""
        restarts = {0, *(start for start in self.starts if start < size)}
        positions, position = [], 0
        for column in range(size):
            position = 0 if column in restarts else position + 1
            positions.append(position)
        return positions

    def state_dict(self) -> dict[str, list[int]]:
        """The buffer: tokens not yet in a block, and where documents start among them."""
        return {"tokens": list(self.tokens), "starts": list(self.starts)}

    def load_state_dict(self, state: dict[str, list[int]]) -> None:
        """Restore the buffer of ``state_dict``."""
        self.tokens, self.starts = list(state["tokens"]), list(state["starts"])


def pack_token_lists(token_lists: list[list[int]], block_size: int,
                     documents: bool) -> dict[str, list[list[int]]]:
    """The full blocks of ``token_lists`` packed in order by a ``Packer`` (the remainder dropped), as columns:
    ``input_ids`` and, with ``documents``, ``position_ids``. ``datasets.map`` of a corpus read whole calls it
    per batch; a streamed one keeps its ``Packer`` (``streaming.PackedStream``)."""
    packer = Packer(block_size, documents)
    columns: dict[str, list[list[int]]] = {"input_ids": []} | ({"position_ids": []} if documents else {})
    for ids in token_lists:
        packer.add(ids)
        for block in packer.blocks():
            for name, values in block.items():
                columns[name].append(values)
    return columns


def tokenize_texts(tokenizer: PreTrainedTokenizerBase, texts: list[str],
                   append_eos_id: int | None) -> list[list[int]]:
    """The token ids of each text (the tokenizer's special tokens; ``append_eos_id`` ends each with it
    once)."""
    ids = tokenizer(texts, return_attention_mask=False)["input_ids"]
    if append_eos_id is None:
        return ids
    return [row if row and row[-1] == append_eos_id else [*row, append_eos_id] for row in ids]


def group_into_blocks(
    dataset: Any,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    num_proc: int | None = None,
    append_eos_id: int | None = None,
    documents: bool = False,
) -> Any:
    """Tokenize a ``text`` dataset and regroup it into ``input_ids`` blocks of ``block_size`` tokens (with
    ``documents``: also ``position_ids`` restarting at every text; ``pack_token_lists``).

    ``append_eos_id``: end every text with this id (CLM, whose prompt tokenizer adds BOS only). Grouping runs
    over map batches of 1000 texts, as run_mlm does, so huge files never sit in one list.
    """

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        return {"input_ids": tokenize_texts(tokenizer, batch["text"], append_eos_id)}

    def group(batch: dict[str, list]) -> dict[str, list]:
        return pack_token_lists(batch["input_ids"], block_size, documents)

    tokenized = dataset.map(tokenize, batched=True, remove_columns=dataset.column_names, num_proc=num_proc)
    return tokenized.map(group, batched=True, batch_size=1000, num_proc=num_proc)


def holds_tokens(rows: Iterable[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, count: int,
                 append_eos_id: int | None = None, batch_size: int = 256) -> bool:
    """Whether the ``text`` of ``rows`` (a ``Dataset`` or a streamed ``IterableDataset``) holds at least
    ``count`` tokens (as ``group_into_blocks`` counts them), tokenizing only as many texts as needed: a cheap
    check before the full tokenization, or before a stream is read."""
    rows = iter(rows)
    total = 0
    while texts := [row["text"] for row in islice(rows, batch_size)]:
        total += sum(len(ids) for ids in tokenize_texts(tokenizer, texts, append_eos_id))
        if total >= count:
            return True
    return False


def text_blocks(
    texts: Sequence[str], tokenizer: PreTrainedTokenizerBase, block_size: int,
    append_eos_id: int | None = None
) -> torch.Tensor:
    """``(num_blocks, block_size)`` LongTensor of the texts' tokens (for in-process evaluation at any
    length)."""
    blocks = group_token_lists(tokenize_texts(tokenizer, list(texts), append_eos_id), block_size)
    if not blocks:
        raise ValueError(f"The texts hold fewer than block_size={block_size} tokens.")
    return torch.tensor(blocks, dtype=torch.long)


class EpochShuffleSampler(Sampler[int]):
    """Indices ``0..n-1`` in the order ``randperm(n, generator=Generator().manual_seed(seed + epoch))``."""

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch`` (accelerate's data loaders call this every epoch)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_samples, generator=generator).tolist()

    def __len__(self) -> int:
        return self.num_samples


class DataParallelBatchSampler(Sampler[list[int]]):
    """Rank ``rank`` of ``world`` data-parallel ranks: of each global batch of ``batch_size * world``
    consecutive indices of ``sampler``, the slice ``[rank * batch_size, (rank + 1) * batch_size)``.

    So ``world`` ranks with ``batch_size`` B see, step for step, exactly the batches of one process with batch
    ``world * B``. The last global batch of an epoch is completed with the epoch's first indices (as
    accelerate's ``even_batches``), so every rank runs the same number of equal-sized batches. ``skip``: leave
    out the first ``skip`` batches (after a resume) without loading them.
    """

    def __init__(self, sampler: Sampler[int], batch_size: int, rank: int, world: int, skip: int = 0) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, {world}), got {rank}.")
        self.sampler = sampler
        self.batch_size = batch_size
        self.rank = rank
        self.world = world
        self.skip = skip

    def global_batches(self) -> int:
        """Batches per epoch (per rank), skipped ones included."""
        return -(-len(self.sampler) // (self.batch_size * self.world))

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.sampler)
        size = self.batch_size * self.world
        for step in range(self.skip, self.global_batches()):
            batch = order[step * size : (step + 1) * size]
            while len(batch) < size:  # the last global batch: wrap around
                batch += order[: size - len(batch)]
            yield batch[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def __len__(self) -> int:
        return max(self.global_batches() - self.skip, 0)


class IndexedBlocks(torch.utils.data.Dataset):
    """A dataset of token blocks that also returns each block's index (used to seed its MLM masks)."""

    def __init__(self, blocks: Any) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, Any]:
        block = self.blocks[index]
        if not isinstance(block, dict):
            return {"input_ids": block, "index": index}
        return {**{name: block[name] for name in ("input_ids", "position_ids") if name in block},
                "index": index}


def collate_blocks(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack equal-length blocks into ``input_ids`` (and ``position_ids``) ``(batch, block)`` and ``index``
    ``(batch,)``."""
    return {name: torch.tensor([item[name] if name == "index" else list(item[name]) for item in items],
                               dtype=torch.long) for name in items[0]}


def mask_tokens(
    input_ids: torch.Tensor,
    seeds: Sequence[int],
    *,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    probability: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of ``input_ids`` ``(batch, seq)`` with one seed per row; returns ``(inputs, labels)``."""
    if not 0.0 < probability < 1.0:
        raise ValueError(f"mlm_probability must be in (0, 1), got {probability}.")
    if input_ids.dim() != 2 or 0 in input_ids.shape:
        raise ValueError("input_ids must be a non-empty (batch, seq) tensor, got shape "
                         f"{tuple(input_ids.shape)}.")
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise ValueError(f"mask_token_id must be a token id, got {mask_token_id!r} (masked-LM needs a "
                         "tokenizer with a mask token).")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}.")
    if len(seeds) != input_ids.shape[0]:
        raise ValueError(f"Need one seed per row: {len(seeds)} seeds for {input_ids.shape[0]} rows.")
    length = input_ids.shape[1]
    select_u, kind_u, random_ids = [], [], []
    for seed in seeds:
        generator = torch.Generator().manual_seed(int(seed))
        select_u.append(torch.rand(length, generator=generator))
        kind_u.append(torch.rand(length, generator=generator))
        random_ids.append(torch.randint(vocab_size, (length,), generator=generator))
    device = input_ids.device
    select_u, kind_u = torch.stack(select_u).to(device), torch.stack(kind_u).to(device)
    random_ids = torch.stack(random_ids).to(device)
    maskable = ~torch.isin(input_ids, torch.tensor(list(special_ids), dtype=input_ids.dtype, device=device))
    selected = (select_u < probability) & maskable
    # At least one target per row that has a maskable token: the maskable position with the smallest draw.
    forced = torch.zeros_like(selected)
    forced.scatter_(1, select_u.masked_fill(~maskable, 2.0).argmin(dim=1, keepdim=True), True)
    need = ~selected.any(dim=1, keepdim=True) & maskable.any(dim=1, keepdim=True)
    selected |= forced & need & maskable
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    inputs = torch.where(selected & (kind_u < 0.8), torch.full_like(input_ids, mask_token_id), input_ids)
    inputs = torch.where(selected & (kind_u >= 0.8) & (kind_u < 0.9), random_ids, inputs)
    return inputs, labels


__all__ = [
    "FILE_BUILDERS",
    "DataParallelBatchSampler",
    "EpochShuffleSampler",
    "IndexedBlocks",
    "Packer",
    "collate_blocks",
    "expand_data_files",
    "file_builder",
    "group_into_blocks",
    "group_token_lists",
    "holds_tokens",
    "load_text_datasets",
    "mask_tokens",
    "mix_seed",
    "pack_token_lists",
    "quiet_datasets",
    "read_data_file",
    "split_data_file",
    "text_blocks",
    "tokenize_texts",
]
