"""Checkpoints that say whether they are whole: a manifest of every file, the newest complete one, rotation.

At save, every file of a checkpoint gets its size and sha256 in a manifest (``pretrain``: the ``"files"``
entry of its ``training_state.json``, written last, after every rank's files and before the atomic rename;
``finetune``: ``checkpoint_manifest.json`` next to Trainer's files, written by the main process once every
rank has saved). A checkpoint is *complete* when its manifest is there and every listed file has its recorded
size and digest (``checkpoint_problem``); one cut short (a disk that filled, a copy that stopped, a save
killed half-way) is named by its first bad file.

- ``newest_complete``: the newest complete checkpoint among candidates (newest first), with the broken ones it
  passed over — automatic resume warns about each and uses the earlier one.
- ``broken_checkpoint_error``: the one sentence for an explicitly named broken checkpoint (the file, and the
  newest complete checkpoint before it).
- ``rotate``: ``--save_total_limit N`` keeps the newest N checkpoints and never the one the run resumed from.
- ``pretrain``'s checkpoints (``output_dir/checkpoints/<name>/``): ``save_checkpoint`` (staging folder,
  manifest, atomic rename, rotation), ``named_checkpoint`` (``--resume_from_checkpoint``),
  ``check_checkpoint_kind``.

Checkpoints written before manifests existed have none; they are probed instead (``probe_files``: every file
that resuming reads, with the safe loader of its kind, never with pickle), so a truncated one is named too. A
state file or manifest that is there but cut short (not valid JSON) makes its checkpoint broken, named by that
file (``json_problem``), never "not a checkpoint".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cli_utils import FlagError, error_reason

if TYPE_CHECKING:
    from .arguments import PretrainArguments
    from .runtime import TrainingRuntime

logger = logging.getLogger(__name__)

MANIFEST_KEY = "files"
"""The manifest's key in a checkpoint's state file."""
HASH_CHUNK = 1 << 20
CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "training_state.json"
STEP_NAME = re.compile(r"step_(\d+)")
UNKNOWN_STEP = sys.maxsize
"""The step of a checkpoint whose state file cannot be read and whose name (``epoch_<e>``) does not say: it
sorts as the newest, so that automatic resume always names it in a warning, and rotation leaves it alone."""


def file_digest(path: Path) -> str:
    """The sha256 of ``path`` (hex), read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_manifest(folder: Path, exclude: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``folder`` except ``exclude`` (names)."""
    return {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": file_digest(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name not in exclude
    }


def manifest_problem(folder: Path, manifest: dict[str, dict[str, Any]]) -> str | None:
    """``None`` when every file of ``manifest`` is in ``folder`` with its recorded size and sha256, else what
    is wrong with the first one that is not
    (``"<folder>/model.safetensors is 1024 bytes, 40960 recorded at save"``)."""
    for name, recorded in manifest.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != recorded["size"]:
            return f"{path} is {size} bytes, {recorded['size']} recorded at save"
        if file_digest(path) != recorded["sha256"]:
            return f"{path} does not match the sha256 recorded at save"
    return None


NEVER_LOADED = ("training_args.bin",)
"""Files of a checkpoint that resuming never reads (``Trainer``'s pickled arguments of earlier releases): not
probed, so they are never unpickled either."""


def probe_files(folder: Path) -> str | None:
    """For a checkpoint without a manifest, and for every checkpoint before it is resumed: ``None`` when every
    file that resuming reads loads with the safe loader for its kind (``safe_state.probe_file``: safetensors,
    JSON, ``torch.load(weights_only=True)``), else which one fails and how. Pickle files of earlier releases
    (``.pkl``) and ``NEVER_LOADED`` files are not opened."""
    from .safe_state import probe_file

    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name in NEVER_LOADED:
            continue
        try:
            probe_file(path)
        except Exception as error:  # noqa: BLE001 - any failure to read the file is what we report
            reason = error_reason(error, 200)
            return f"{path} cannot be read safely ({type(error).__name__}: {reason})"
    return None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder, its step, and how its completeness is checked."""

    path: Path
    step: int
    manifest: dict[str, dict[str, Any]] | None
    """The recorded files; ``None``: no manifest (written before manifests: probed instead)."""
    manifest_file: str | None = None
    """Set when a missing manifest means the save did not finish: the manifest's file name, for the
    message."""
    unreadable: str | None = None
    """What is wrong with the folder's state file when it cannot be read (``json_problem``): then it is
    broken."""

    def problem(self) -> str | None:
        """``None`` when the checkpoint is complete, else its first bad file and what is wrong with it."""
        if self.unreadable is not None:
            return self.unreadable
        if self.manifest is not None:
            return manifest_problem(self.path, self.manifest)
        if self.manifest_file is not None:
            return missing_manifest_problem(self.path / self.manifest_file)
        return probe_files(self.path)


def missing_manifest_problem(path: Path) -> str:
    """Why the required manifest ``path`` gave no list of files: missing (the save did not finish), cut short,
    or without its ``"files"``."""
    if not path.exists():
        return f"{path} is missing (its save did not finish)"
    return json_problem(path) or f"{path} lists no files"


def newest_complete(
    checkpoints: Sequence[Checkpoint]
) -> tuple[Checkpoint | None, list[tuple[Checkpoint, str]]]:
    """The newest complete checkpoint (highest step) and the newer broken ones passed over with their
    problems."""
    skipped = []
    for checkpoint in sorted(checkpoints, key=lambda c: c.step, reverse=True):
        problem = checkpoint.problem()
        if problem is None:
            return checkpoint, skipped
        skipped.append((checkpoint, problem))
    return None, skipped


def _is_first_rank() -> bool:
    """Whether this process is rank 0 of the launch (or the only one): every rank makes the same choice of
    checkpoint, and only the first says so, so a launch of N processes prints one line, not N."""
    return int(os.environ.get("RANK", "0")) == 0


def warn_skipped(command: str, skipped: list[tuple[Checkpoint, str]], chosen: Checkpoint | None) -> None:
    """One warning per broken checkpoint that automatic resume passed over (from the first rank)."""
    if not _is_first_rank():
        return
    for checkpoint, problem in skipped:
        instead = f"resuming from {chosen.path} instead" if chosen else "no complete checkpoint before it"
        logger.warning("%s: skipping the broken checkpoint %s (%s); %s", command, checkpoint.path, problem,
                       instead)


def newest_resumable(command: str, checkpoints: Sequence[Checkpoint]) -> Checkpoint | None:
    """Automatic resume's choice: the newest complete checkpoint, with a warning for each broken newer one."""
    chosen, skipped = newest_complete(checkpoints)
    warn_skipped(command, skipped, chosen)
    return chosen


AUTOMATIC = "the newest complete checkpoint of this run in --output_dir"
"""Why ``announce_resume`` continues from a checkpoint, for an automatic resume."""


def announce_resume(command: str, checkpoint: Checkpoint, reason: str = AUTOMATIC) -> None:
    """The one line saying which checkpoint the run continues from, and why (``AUTOMATIC``, or the flag that
    named it); from the first rank only."""
    if not _is_first_rank():
        return
    logger.info("%s: resuming from %s (step %d), %s", command, checkpoint.path, checkpoint.step, reason)


def broken_checkpoint_error(flag: str, checkpoint: Checkpoint, problem: str,
                            earlier: Sequence[Checkpoint]) -> FlagError:
    """The one-sentence ``FlagError`` for a named checkpoint that is broken: the bad file and the newest
    complete checkpoint before it (among ``earlier``)."""
    before, _ = newest_complete([c for c in earlier if c.step < checkpoint.step])
    fallback = (f"the newest complete checkpoint before it is {str(before.path)!r}" if before
                else "there is no complete checkpoint before it")
    return FlagError(flag, f"{flag}: checkpoint {str(checkpoint.path)!r} is broken: {problem}; {fallback}.")


def rotate(checkpoints: Sequence[Checkpoint], limit: int | None, keep: Sequence[Path | None] = (),
           saved: Path | None = None) -> list[Path]:
    """Delete all but the newest ``limit`` checkpoints, never one in ``keep`` (the one the run resumed from,
    the one just ``saved``); returns the deleted folders. ``limit=None`` keeps everything. Checkpoints at
    later steps than ``saved`` are left alone and not counted: they are what an interrupted attempt left (a
    broken one automatic resume skipped, say), which this run replaces when it saves that step again."""
    if limit is None:
        return []
    protected = {path.resolve() for path in (*keep, saved) if path is not None}
    upto = next((c.step for c in checkpoints if saved is not None and c.path.resolve() == saved.resolve()),
                None)
    ordered = sorted((c for c in checkpoints if upto is None or c.step <= upto), key=lambda c: c.step,
                     reverse=True)
    doomed = [c.path for c in ordered[limit:] if c.path.resolve() not in protected]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def read_json_file(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def json_problem(path: Path) -> str | None:
    """What is wrong with ``path`` when it is there but holds no JSON object (cut short by a full disk or a
    copy that stopped: ``"<path> is not valid JSON (20 bytes; cut short?)"``); ``None`` when it holds one or
    is missing."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"{path} cannot be read ({error.strerror or type(error).__name__})"
    try:
        data = json.loads(text)
    except ValueError:
        return f"{path} is not valid JSON ({len(text)} bytes; cut short?)"
    return None if isinstance(data, dict) else f"{path} holds no JSON object"


def list_checkpoints(root: Path, pattern: str, read: Callable[[Path], Checkpoint | None]) -> list[Checkpoint]:
    """The checkpoints ``read`` recognises among the folders of ``root`` matching ``pattern``."""
    if not root.is_dir():
        return []
    found = (read(path) for path in sorted(root.glob(pattern)) if path.is_dir())
    return [checkpoint for checkpoint in found if checkpoint is not None]


# ---------------------------------------------------------------- pretrain's checkpoint folders
def read_pretrain_checkpoint(path: Path) -> Checkpoint | None:
    """A ``pretrain`` checkpoint folder (it has ``training_state.json``) as a ``Checkpoint``, else ``None``. A
    state file that cannot be read, or records no step, makes a broken checkpoint (``Checkpoint.unreadable``)
    at the step its name says (``step_<k>``; else ``UNKNOWN_STEP``)."""
    state_file = path / STATE_FILE
    if not state_file.is_file():
        return None
    state = read_json_file(state_file)
    if state is None or not isinstance(state.get("completed_steps"), int):
        problem = json_problem(state_file) or f"{state_file} records no completed_steps"
        return Checkpoint(path, step_in_name(path), None, unreadable=problem)
    return Checkpoint(path, int(state["completed_steps"]), state.get(MANIFEST_KEY))


def step_in_name(path: Path) -> int:
    """The step a checkpoint folder's name says (``step_<k>``), else ``UNKNOWN_STEP``."""
    match = STEP_NAME.fullmatch(path.name)
    return int(match.group(1)) if match else UNKNOWN_STEP


def pretrain_checkpoints(output_dir: str | Path) -> list[Checkpoint]:
    """The checkpoints under ``output_dir/checkpoints`` (not the hidden staging folders of saves in progress
    or killed, ``.<name>.tmp``, nor a sharded run's ``.initial_model``)."""
    return list_checkpoints(Path(output_dir) / CHECKPOINT_DIR, "[!.]*", read_pretrain_checkpoint)


def named_checkpoint(output_dir: str, name: str) -> Checkpoint:
    """Resolve ``--resume_from_checkpoint``: a complete checkpoint folder, or ``latest`` = the newest complete
    one under ``output_dir/checkpoints`` (broken newer ones skipped with a warning). A named broken checkpoint
    (a file cut short, its ``training_state.json`` unreadable) gives one sentence naming its bad file and the
    newest complete checkpoint before it."""
    flag = "resume_from_checkpoint"
    if name != "latest":
        checkpoint = read_pretrain_checkpoint(Path(name))
        if checkpoint is None:
            raise FlagError(flag,
                            f"resume_from_checkpoint: {name!r} is not a checkpoint folder (no {STATE_FILE}).")
        if (problem := checkpoint.problem()) is not None:
            raise broken_checkpoint_error(flag, checkpoint, problem,
                                          pretrain_checkpoints(Path(name).parent.parent))
        return checkpoint
    root = Path(output_dir) / CHECKPOINT_DIR
    found = pretrain_checkpoints(output_dir)
    if not found:
        raise FlagError(flag, f"resume_from_checkpoint='latest' but there is no checkpoint under {root}.")
    chosen, skipped = newest_complete(found)
    warn_skipped("pretrain", skipped, chosen)
    if chosen is None:
        raise FlagError(flag, f"resume_from_checkpoint='latest' but every checkpoint under {root} is broken "
                              f"({skipped[0][1]}).")
    return chosen


def find_checkpoint(output_dir: str, name: str) -> Path:
    """The folder of ``named_checkpoint``."""
    return named_checkpoint(output_dir, name).path


def check_checkpoint_kind(checkpoint: Path, args: PretrainArguments, data_ranks: int) -> None:
    """``FlagError`` naming ``resume_from_checkpoint`` when the checkpoint was written by the other path
    (``sharded`` in its state file; the accelerate path's MLM weights carry the ``model.`` prefix of its loss
    module) or with another global batch (``per_device_train_batch_size`` × the ``data_ranks`` processes that
    see distinct data) or gradient accumulation: the data position is counted in global batches, so it would
    not match, and the epoch would not either. Checkpoints written before the global batch was recorded
    (accelerate runs until 2026-11-30) are taken as they are."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    written_sharded = bool(state.get("sharded"))
    if written_sharded != args.layout.sharded:
        kind = "a sharded (DistributedConfig)" if written_sharded else "an accelerate"
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: {str(checkpoint)!r} was written by {kind} run; resume it "
                        f"with the same kind of launch ({'the same' if written_sharded else 'no'} "
                        "--fsdp_size/--tp_size/--dp_replicate_size).")
    batch = args.per_device_train_batch_size * data_ranks
    if state.get("global_batch_size", batch) != batch:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: {str(checkpoint)!r} was trained with a global batch of "
                        f"{state['global_batch_size']} blocks, this run has per_device_train_batch_size × "
                        f"{data_ranks} data-parallel process(es) = {batch}: resume it with the same product.")
    accumulation = state.get("gradient_accumulation_steps", args.gradient_accumulation_steps)
    if accumulation != args.gradient_accumulation_steps:
        raise FlagError("resume_from_checkpoint",
                        f"resume_from_checkpoint: {str(checkpoint)!r} was trained with "
                        f"gradient_accumulation_steps={accumulation}, this run has "
                        f"{args.gradient_accumulation_steps}.")


def save_checkpoint(runtime: TrainingRuntime, output_dir: str, name: str, state: dict[str, Any], *,
                    limit: int | None = None, keep: Path | None = None,
                    write_extra: Callable[[Path], None] | None = None,
                    needed: Callable[[], int] = lambda: 0) -> Path:
    """``runtime.save_state`` (and ``write_extra(folder)`` on every rank: a streamed run's data position) into
    ``checkpoints/.<name>.tmp``; then the main process records the format and the manifest of every rank's
    files in ``training_state.json`` (last), renames the folder to ``<name>`` atomically, and deletes all but
    the newest ``limit`` checkpoints (never ``keep``). A write that fails (a full disk) removes the staging
    folder and raises ``safe_state.SaveFailed`` with ``needed()`` bytes: the earlier checkpoints are
    untouched. Staging folders that a killed process left (a second Ctrl-C during a save) are removed
    first."""
    from .safe_state import CHECKPOINT_FORMAT, FORMAT_KEY, failing_save_raises

    root = Path(output_dir) / CHECKPOINT_DIR
    final, staging = root / name, root / f".{name}.tmp"
    if runtime.is_main_process:
        # this one's, and any a killed process left (one run per folder: none is being written)
        for leftover in (staging, *root.glob(".step_*.tmp"), *root.glob(".epoch_*.tmp")):
            shutil.rmtree(leftover, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    runtime.wait_for_everyone()
    with failing_save_raises("pretrain", staging, needed, "the checkpoints written before it are intact"):
        runtime.save_state(staging)
        if write_extra is not None:
            write_extra(staging)
        runtime.wait_for_everyone()
        if runtime.is_main_process:
            state = {**state, FORMAT_KEY: CHECKPOINT_FORMAT,
                     MANIFEST_KEY: file_manifest(staging, exclude=(STATE_FILE,))}
            (staging / STATE_FILE).write_text(json.dumps(state))
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
    if runtime.is_main_process:
        rotate(pretrain_checkpoints(output_dir), limit, keep=(keep,), saved=final)
    runtime.wait_for_everyone()
    return final


__all__ = [
    "AUTOMATIC",
    "CHECKPOINT_DIR",
    "MANIFEST_KEY",
    "NEVER_LOADED",
    "STATE_FILE",
    "UNKNOWN_STEP",
    "Checkpoint",
    "announce_resume",
    "broken_checkpoint_error",
    "check_checkpoint_kind",
    "file_digest",
    "file_manifest",
    "find_checkpoint",
    "json_problem",
    "list_checkpoints",
    "manifest_problem",
    "missing_manifest_problem",
    "named_checkpoint",
    "newest_complete",
    "newest_resumable",
    "pretrain_checkpoints",
    "probe_files",
    "read_json_file",
    "read_pretrain_checkpoint",
    "rotate",
    "save_checkpoint",
    "step_in_name",
    "warn_skipped",
]
