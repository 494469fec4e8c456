"""Training state that loads without running anything a file carries: safetensors, ``weights_only`` and JSON.

A ``pretrain`` checkpoint (either runtime: ``accelerate`` or sharded) holds exactly these files:

- ``model.safetensors``: the full model state, gathered from every shard
  (``torch.distributed.checkpoint.state_dict.get_state_dict(full_state_dict=True)``), so a checkpoint loads
  into any process layout. A tensor that several names share (tied embeddings) is stored once; its other names
  are in the file's metadata (``aliases``).
- ``optimizer.pt``: the full optimizer state keyed by parameter name, tensors and plain values only, a
  ``torch.save`` that loads with ``torch.load(weights_only=True)``.
- ``scheduler.json``, ``scaler.json`` (fp16 only) and ``rng_state_<rank>.json`` (Python's, NumPy's and torch's
  generators; torch's byte tensor as a list of integers).
- ``training_state.json`` (``checkpoints.py``): step, tokens, ``checkpoint_format`` and the manifest.

Loading reads these files with these loaders and nothing else in the folder. Whatever goes wrong in one of
them (a file cut short, a pickle planted in its place that ``weights_only`` refuses, JSON of the wrong shape)
ends in one ``FlagError`` naming the file (``load_safely``). PyTorch's own reasons for ``weights_only``: its
serialization notes ("torch.load with weights_only=True").

A save that fails (a full disk: any ``OSError``) raises ``SaveFailed`` with the space the save needed; the
caller wrote into a staging folder, so the previous checkpoint and the folder's other files stay as they were.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..cli_utils import FlagError, error_reason

CHECKPOINT_FORMAT = 2
"""``training_state.json``'s ``checkpoint_format``: 2 = the pickle-free files above. Checkpoints without it
were written by releases whose checkpoints held pickle files (``legacy_checkpoint_error``)."""
FORMAT_KEY = "checkpoint_format"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.json"
SCALER_FILE = "scaler.json"
ALIASES_KEY = "aliases"
SAVE_FAILED_EXIT_CODE = 74
"""Exit status after a save that failed (``EX_IOERR`` of sysexits.h): free the space, rerun the same
command."""
RESUME_FLAG = "resume_from_checkpoint"
PICKLE_SUFFIXES = (".pkl", ".bin", ".pt", ".pth")

T = TypeVar("T")


def rng_file(rank: int) -> str:
    """``rng_state_<rank>.json``: one per process."""
    return f"rng_state_{rank}.json"


# ---------------------------------------------------------------- loading, one sentence per bad file
def load_safely(path: Path, load: Callable[[Path], T], flag: str = RESUME_FLAG) -> T:
    """``load(path)``; any failure becomes one ``FlagError`` naming ``path`` and what to do instead."""
    try:
        return load(path)
    except FlagError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever a damaged or hostile file raises, the answer is one sentence
        reason = error_reason(error, 200)
        raise FlagError(flag, f"{flag}: {path} cannot be loaded safely ({type(error).__name__}: {reason}); "
                              "it is not the file this run wrote there (cut short, replaced, or written by "
                              "another tool), so resume from an earlier checkpoint or start afresh with "
                              "--overwrite_output_dir.") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (``ValueError`` when the file holds anything else)."""
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise TypeError("the file holds no JSON object")
    return data


def load_weights_only(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, NumPy's array and dtype types allowed
    (``Trainer``'s RNG states hold NumPy's generator state): tensors and plain containers only; a pickle that
    names anything else is refused without being run."""
    with torch.serialization.safe_globals(numpy_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)


def numpy_globals() -> list[Any]:
    """The NumPy types a NumPy generator state pickles (``np.ndarray``, ``np.dtype`` and their rebuild
    function)."""
    import numpy as np

    core = np._core if hasattr(np, "_core") else np.core  # the module was renamed in NumPy 2
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A ``write_tensors`` file: its tensors, each alias restored as the tensor it names."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 - safe_open has no __iter__
        metadata = handle.metadata() or {}
    aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
    return tensors | {alias: tensors[name] for alias, name in aliases.items()}


def probe_file(path: Path) -> None:
    """Read ``path`` with the loader for its kind (safetensors, JSON, ``weights_only``); raises when it fails.
    Other files (text vocabularies, README) are never loaded as code and are left alone."""
    if path.suffix == ".safetensors":
        read_tensors(path)
    elif path.suffix == ".json":
        read_json_object(path)
    elif path.suffix in (".pt", ".pth", ".bin"):
        load_weights_only(path)


# ---------------------------------------------------------------- random states as JSON
def rng_states() -> dict[str, Any]:
    """This process's random generators as JSON values: Python's, NumPy's, torch's CPU one (bytes as integers)
    and each CUDA device's."""
    import numpy as np

    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        states["cuda"] = [state.tolist() for state in torch.cuda.get_rng_state_all()]
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what ``rng_states`` returned (``ValueError``/``TypeError`` on values of the wrong shape)."""
    import numpy as np

    version, internal, gauss = states["python"]
    random.setstate((int(version), tuple(int(i) for i in internal), gauss if gauss is None else float(gauss)))
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((str(kind), np.asarray(keys, dtype=np.uint32), int(position), int(has_gauss),
                         float(cached)))
    torch.set_rng_state(torch.tensor(states["torch"], dtype=torch.uint8))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(state, dtype=torch.uint8) for state in states["cuda"]])


# ---------------------------------------------------------------- writing
def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """safetensors of ``tensors``; a tensor that an earlier name already holds (same storage, offset, shape
    and strides: tied weights) is written once and recorded under ``aliases``; other views of shared storage
    are copied."""
    from safetensors.torch import save_file

    kept: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    stored: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tensor.stride())
        if tensor.numel() and key in kept:
            aliases[name] = kept[key]
            continue
        pointer = tensor.untyped_storage().data_ptr()
        shared = tensor.numel() and pointer in storages
        stored[name] = tensor.clone() if shared else tensor.contiguous()
        storages.add(pointer)
        kept.setdefault(key, name)
    save_file(stored, str(path), metadata={ALIASES_KEY: json.dumps(aliases)})


def write_json(path: Path, data: Any) -> None:
    """``data`` as JSON in ``path``."""
    path.write_text(json.dumps(data))


class SaveFailed(Exception):
    """A checkpoint or final save that could not be written (a full disk): what failed and the space it
    needed."""

    def __init__(self, command: str, what: Path, needed: int, error: OSError, kept: str) -> None:
        free = free_bytes(what)
        reason = error.strerror or str(error) or type(error).__name__
        super().__init__(f"writing {what} failed ({reason}); the save needs about {megabytes(needed)} and "
                         f"{megabytes(free)} is free there; {kept}. Free some space and run the same command "
                         f"again (exit status {SAVE_FAILED_EXIT_CODE}).")
        self.command, self.needed = command, needed


def megabytes(size: int | None) -> str:
    """``"12.3 MB"`` (``"an unknown amount"`` for ``None``)."""
    return "an unknown amount" if size is None else f"{size / 1e6:.1f} MB"


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem of ``path`` (its nearest existing parent), ``None`` when unknown."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


@contextlib.contextmanager
def failing_save_raises(command: str, what: Path, needed: Callable[[], int], kept: str, *,
                        staging: bool = True) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``what`` into ``SaveFailed`` with ``needed()`` bytes (after removing
    ``what`` when it is a ``staging`` folder)."""
    try:
        yield
    except OSError as error:
        if staging:
            shutil.rmtree(what, ignore_errors=True)
        raise SaveFailed(command, what, needed(), error, kept) from error


def training_state_bytes(model: torch.nn.Module) -> int:
    """About what a checkpoint of ``model`` trained with AdamW writes: its weights and the optimizer's two
    moments (3 × the parameters' bytes; a sharded parameter counts whole)."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters())


# ---------------------------------------------------------------- one checkpoint's training state
def full_states(model: torch.nn.Module,
                optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full model and optimizer states on the CPU, gathered from every shard (a collective: every rank
    calls it; with several processes only rank 0 gets them, the others empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def retied(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each tied name of ``model`` (``all_tied_weights_keys``) pointing at its source's tensor:
    the gather from the shards returns a tensor per name, which ``write_tensors`` (aliases by storage) would
    write twice."""
    for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
        if target in state and source in state:
            state[target] = state[source]
    return state


def save_training_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        scheduler: Any, *, rank: int, is_main_process: bool, scaler: Any = None) -> None:
    """Write the checkpoint files of the module docstring into ``folder`` (every rank calls it; the main
    process writes model, optimizer, scheduler and scaler, each rank its random states)."""
    model_state, optimizer_state = full_states(model, optimizer)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / rng_file(rank), rng_states())
    if not is_main_process:
        return
    write_tensors(folder / MODEL_FILE, retied(model, model_state))
    torch.save(optimizer_state, folder / OPTIMIZER_FILE)
    write_json(folder / SCHEDULER_FILE, scheduler.state_dict())
    if scaler is not None:
        write_json(folder / SCALER_FILE, scaler.state_dict())


def load_training_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        scheduler: Any, *, rank: int, scaler: Any = None) -> None:
    """Restore ``save_training_state``'s files (every rank reads them and keeps its own shards); each file is
    read with ``load_safely``, and a value of the wrong shape names its file too."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    model_state = load_safely(folder / MODEL_FILE, read_tensors)
    optimizer_state = load_safely(folder / OPTIMIZER_FILE, load_weights_only)
    load_safely(folder / MODEL_FILE, lambda _: set_state_dict(
        model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state,
        options=StateDictOptions(full_state_dict=True)))
    load_safely(folder / SCHEDULER_FILE, lambda path: load_scheduler(scheduler, read_json_object(path)))
    if scaler is not None:
        load_safely(folder / SCALER_FILE, lambda path: scaler.load_state_dict(read_json_object(path)))
    own = folder / rng_file(rank)
    if own.exists():
        load_safely(own, lambda path: set_rng_states(read_json_object(path)))


def load_scheduler(scheduler: Any, state: dict[str, Any]) -> None:
    """``scheduler.load_state_dict(state)`` when ``state`` has exactly the scheduler's own keys (a scheduler's
    ``load_state_dict`` sets whatever attributes it is given), else ``ValueError``."""
    expected = set(scheduler.state_dict())
    if set(state) != expected:
        raise ValueError(f"keys {sorted(state)} are not the scheduler's {sorted(expected)}")
    scheduler.load_state_dict(state)


# ---------------------------------------------------------------- checkpoints of earlier releases
def legacy_checkpoint_error(folder: Path, flag: str = RESUME_FLAG) -> FlagError | None:
    """``None`` when ``folder``'s ``training_state.json`` records ``checkpoint_format`` 2; else the one
    sentence for a checkpoint of an earlier release, whose optimizer, scheduler and random states were pickle
    files."""
    state = json.loads((folder / "training_state.json").read_text())
    if state.get(FORMAT_KEY) == CHECKPOINT_FORMAT:
        return None
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES or p.name == ".metadata")
    held = f" ({', '.join(pickles[:4])}{', …' if len(pickles) > 4 else ''})" if pickles else ""
    return FlagError(flag, f"{flag}: {folder} is a checkpoint of an earlier hf_attn_variants release, which "
                           f"kept its training state in pickle files{held}; this release never unpickles a "
                           "checkpoint, so it cannot continue that run: start it afresh with "
                           "--overwrite_output_dir (or into another --output_dir), or finish it with the "
                           "release that wrote it.")


__all__ = [
    "CHECKPOINT_FORMAT",
    "FORMAT_KEY",
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "SAVE_FAILED_EXIT_CODE",
    "SCALER_FILE",
    "SCHEDULER_FILE",
    "SaveFailed",
    "failing_save_raises",
    "legacy_checkpoint_error",
    "load_safely",
    "load_training_state",
    "load_weights_only",
    "probe_file",
    "read_json_object",
    "read_tensors",
    "retied",
    "rng_file",
    "rng_states",
    "save_training_state",
    "set_rng_states",
    "training_state_bytes",
    "write_tensors",
]
