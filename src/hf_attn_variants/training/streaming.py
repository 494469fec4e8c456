"""Pretraining data that is read as it is trained on: packing, the stream of one rank, and its saved position.

Packing itself (``concat`` or ``documents``) is ``data.Packer``'s, the same for a corpus read whole.
- ``PackedStream``: the blocks of one data-parallel rank, from a ``datasets.IterableDataset`` that is
  tokenized on the fly and split across ranks by ``datasets.distributed.split_dataset_by_node`` (whole shards
  per rank when the shard count divides by the world size, else every rank reads all and keeps every world-th
  example: in both cases each example of a pass goes to exactly one rank). When the stream ends, the next pass
  starts. ``state_dict`` is the stream's position (``IterableDataset.state_dict``), the packer's buffer and
  the counts.
- ``TrainStream``: torchdata's ``StatefulDataLoader`` over a ``PackedStream`` (batches by
  ``data.collate_blocks``); ``save``/``load`` put its state in a checkpoint folder
  (``data_state/rank_<r>.json``), so a resumed run trains on exactly the blocks an uninterrupted one would
  have.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..cli_utils import FlagError
from .data import Packer, collate_blocks
from .safe_state import load_safely, read_json_object

PACKING_MODES = ("concat", "documents")
DATA_STATE_DIR = "data_state"


class PackedStream(torch.utils.data.IterableDataset):
    """Packed blocks of one rank's share of a token stream, pass after pass (see the module docstring).

    ``make_source()`` builds the rank's tokenized ``datasets.IterableDataset`` (a column ``input_ids``); it is
    called for every pass and after a restore. Each item: ``input_ids``, ``position_ids`` (``documents``) and
    ``index``, a number no other block of the run has (``blocks * world + rank``; it seeds the block's MLM
    mask).
    """

    def __init__(self, make_source: Callable[[], Any], block_size: int, *, documents: bool, rank: int,
                 world: int, name: str = "train_file") -> None:
        super().__init__()
        self.make_source = make_source
        self.packer = Packer(block_size, documents)
        self.rank, self.world, self.name = rank, world, name
        self.passes = 0
        self.blocks = 0
        self._source: Any = None
        self._source_state: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            self._source = self.make_source()
            if self._source_state is not None:
                self._source.load_state_dict(self._source_state)
            examples = 0
            for example in self._source:
                examples += 1
                self.packer.add(example["input_ids"])
                for block in self.packer.blocks():
                    self.blocks += 1
                    yield {**block, "index": (self.blocks - 1) * self.world + self.rank}
            if examples == 0 and self._source_state is None:
                raise FlagError(self.name,
                                f"{self.name}: data-parallel rank {self.rank} of {self.world} got no "
                                "text from the stream (fewer examples than ranks?).")
            self.passes += 1
            self._source_state = None

    def state_dict(self) -> dict[str, Any]:
        """Passes done, blocks yielded, the stream's position in this pass and the packer's buffer."""
        source = self._source.state_dict() if self._source is not None else self._source_state
        return {"passes": self.passes, "blocks": self.blocks, "source": source,
                "packer": self.packer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state_dict`` was taken (the next iteration starts there)."""
        self.passes, self.blocks = state["passes"], state["blocks"]
        self._source, self._source_state = None, state["source"]
        self.packer.load_state_dict(state["packer"])


@contextlib.contextmanager
def _quiet_loader() -> Iterator[None]:
    # torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates with a UserWarning on every loader.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        yield


class TrainStream:
    """The training batches of one data-parallel rank: a ``StatefulDataLoader`` over a ``PackedStream``."""

    def __init__(self, dataset: PackedStream, batch_size: int, rank: int) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.rank = rank
        with _quiet_loader():
            self.loader = StatefulDataLoader(dataset, batch_size=batch_size, collate_fn=collate_blocks)
        self._iterator: Iterator[dict[str, torch.Tensor]] | None = None

    def batches(self, device: torch.device | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """The next batches, without end (one iterator for the whole run: a resumed loader goes on from its
        loaded state): on ``device``, or as the loader's host tensors without one (``pretrain``'s loop)."""
        if self._iterator is None:
            with _quiet_loader():
                self._iterator = iter(self.loader)
        for batch in self._iterator:
            yield batch if device is None else {name: value.to(device) for name, value in batch.items()}

    def state_file(self, folder: Path) -> Path:
        """``folder/data_state/rank_<r>.json``."""
        return Path(folder) / DATA_STATE_DIR / f"rank_{self.rank}.json"

    def save(self, folder: Path) -> None:
        """Write the loader's state (stream position, packer buffer) into checkpoint ``folder`` (atomically:
        ranks that share a data-parallel rank write the same content)."""
        path = self.state_file(folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(self.loader.state_dict()))
        os.replace(staging, path)

    def load(self, folder: Path) -> None:
        """Restore the state ``save`` wrote into ``folder``; ``FlagError`` naming ``resume_from_checkpoint``
        when the checkpoint has none for this rank (written by a run without ``--streaming`` or with fewer
        ranks)."""
        path = self.state_file(folder)
        if not path.is_file():
            raise FlagError("resume_from_checkpoint",
                            f"resume_from_checkpoint: {folder} holds no stream position for data-parallel "
                            f"rank {self.rank} ({path.relative_to(folder)}); it was written by a run without "
                            "--streaming or with fewer data-parallel ranks.")
        load_safely(path, lambda file: self.loader.load_state_dict(read_json_object(file)))
        self._iterator = None


__all__ = [
    "DATA_STATE_DIR",
    "PACKING_MODES",
    "PackedStream",
    "TrainStream",
]
