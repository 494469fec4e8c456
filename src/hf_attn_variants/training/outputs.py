"""One rule for every command that writes an ``--output_dir`` (``pretrain``, ``finetune``, ``prune``,
``lengthgen``).

Nothing lost, nothing mixed. When a command starts writing it records what it was asked in
``<output_dir>/run.json`` (``RunRecord``: the command, its arguments, and — set when its last file is written
— ``finished``). A later command on the same folder then does one of three things, decided before it writes
anything (``check_output_folder``):

- the folder is new or empty (hidden files and the run lock aside): the run starts there;
- the folder holds files no run wrote (a person's notes) and no run: ``FlagError`` naming ``--output_dir`` in
  one sentence that names those files, ``--write_into_output_dir`` (write beside them, keeping them) and
  ``--overwrite_output_dir`` (clear them first) — raised by ``refuse_foreign_files`` once the command has
  checked its other inputs, just before it writes (so that a bad flag is still the one named first);
- the folder holds an unfinished run of the same command with the same arguments (``OutputRule.aside``
  excepted: the folder itself, the resume flags, the step budget, logging and checkpoint cadence): the run
  resumes it (the command picks the newest complete checkpoint and says which in one line);
- anything else — a finished model, another command's run, a run with other arguments, or a run's files
  without a ``run.json`` (written before this rule): ``FlagError`` naming ``--output_dir``, in one sentence
  that names the differing flags (value there, value here) and ``--overwrite_output_dir``.

``--overwrite_output_dir`` clears the folder first (``start_run``), so one folder never holds two runs; it
refuses to clear a folder that holds the working directory or one of the run's own inputs. An explicit
``--resume_from_checkpoint`` keeps its meaning: the user named what to continue, so the folder is not refused
(differing arguments are logged as a warning) and ``run.json`` records the new arguments.

Several processes of one launch (``torchrun``) all call ``check_output_folder`` (it only reads, so every rank
decides the same), wait for each other, and then only the main process calls ``start_run``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli_utils import FlagError, check_clearable
from .runlock import LOCK_FILES

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
               "adapter_config.json", "adapter_model.safetensors")
"""Files that make a folder hold a model (``save_pretrained`` / peft's ``save_pretrained``)."""
ALWAYS_ASIDE = frozenset({"output_dir", "overwrite_output_dir", "write_into_output_dir",
                          "resume_from_checkpoint"})
"""Arguments that never make two runs differ: where the folder is, and whether to resume, clear it or write
beside a person's files."""
MAX_NAMED_FLAGS = 6
"""How many differing flags a refusal names (then ``and N more``)."""


@dataclass(kw_only=True)
class OutputDirArguments:
    """The flag every command with an ``--output_dir`` shares (a base of the commands' argument
    dataclasses)."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Clear output_dir before writing. Without it, a folder holding an unfinished run "
                  "with the same arguments is resumed, and a folder holding a finished model or another run "
                  "is refused."},
    )
    write_into_output_dir: bool = field(
        default=False,
        metadata={"help": "Write into an output_dir that holds files no run wrote (your notes, say), keeping "
                  "them. Without it such a folder is refused."},
    )


@dataclass
class RunRecord:
    """``run.json``: which command wrote the folder, with which arguments, and whether it finished."""

    command: str
    arguments: dict[str, Any]
    finished: bool = False

    @classmethod
    def read(cls, folder: Path) -> RunRecord | None:
        """The record in ``folder``, or ``None`` when it has none (or an unreadable one)."""
        try:
            data = json.loads((folder / RUN_FILE).read_text())
            return cls(str(data["command"]), dict(data["arguments"]), bool(data.get("finished", False)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, folder: Path) -> None:
        """Write ``run.json`` atomically (a temporary file renamed over it)."""
        staging = folder / f".{RUN_FILE}.tmp"
        staging.write_text(json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n")
        os.replace(staging, folder / RUN_FILE)


@dataclass(frozen=True)
class OutputRule:
    """What a command declares about its output folder."""

    command: str
    aside: frozenset[str] = frozenset()
    """Arguments (besides ``ALWAYS_ASIDE``) that may differ within one run: the step budget, logging,
    cadence."""
    run_files: tuple[str, ...] = ()
    """Glob patterns of what the command writes (besides ``run.json`` and ``MODEL_FILES``): a folder holding
    one of them holds a run's files."""
    refuse_finished: bool = True
    """Refuse a finished run with the same arguments (``lengthgen`` does not: rerunning reuses its runs)."""
    continue_hint: str = ""
    """How to continue a finished run, for the refusal (``pretrain``: ``--resume_from_checkpoint``)."""
    legacy_arguments: Callable[[Path], dict[str, Any] | None] | None = None
    """The arguments of a finished folder written before ``run.json`` existed, if the command can read
    them."""


@dataclass
class FolderState:
    """What ``check_output_folder`` found: how the run may use its folder."""

    folder: Path
    same_run: bool = False
    """The folder holds an unfinished run of these arguments: resume from its newest complete checkpoint."""
    clear: bool = False
    """``--overwrite_output_dir`` on a folder with content: ``start_run`` empties it first."""
    record: RunRecord | None = None
    foreign: tuple[str, ...] = ()
    """The names of a person's files in a folder that holds no run (``foreign_files_in``), unless
    ``--write_into_output_dir``: ``refuse_foreign_files`` refuses the folder."""


def json_arguments(*argument_objects: Any) -> dict[str, Any]:
    """The fields of each argument object (dataclasses; ``TrainingArguments`` through its ``to_dict``, which
    masks tokens; an ``argparse.Namespace``) as one JSON-able dict, as they would read back from
    ``run.json``."""
    merged: dict[str, Any] = {}
    for argument_object in argument_objects:
        if hasattr(argument_object, "to_dict"):
            values = argument_object.to_dict()
        elif dataclasses.is_dataclass(argument_object):
            values = {f.name: getattr(argument_object, f.name) for f in dataclasses.fields(argument_object)
                      if f.init}
        else:
            values = {k: v for k, v in vars(argument_object).items() if not k.startswith("_")}
        merged.update(values)
    return json.loads(json.dumps(merged, default=str))


def differing_flags(recorded: Mapping[str, Any], current: Mapping[str, Any],
                    aside: Iterable[str]) -> list[str]:
    """The argument names whose values differ between ``recorded`` and ``current`` (a name only one of them
    has counts when its value is not ``None``), in ``current``'s order, ``aside`` and ``ALWAYS_ASIDE`` left
    out."""
    skip = ALWAYS_ASIDE | set(aside)
    names = [*current, *(name for name in recorded if name not in current)]
    return [name for name in names if name not in skip and recorded.get(name) != current.get(name)]


def _describe(value: Any, limit: int = 60) -> str:
    text = "unset" if value is None else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_differences(recorded: Mapping[str, Any], current: Mapping[str, Any], names: list[str]) -> str:
    """``--seed 3 there, 4 here; --learning_rate …`` for the first ``MAX_NAMED_FLAGS`` of ``names``."""
    parts = [f"--{name} {_describe(recorded.get(name))} there, {_describe(current.get(name))} here"
             for name in names[:MAX_NAMED_FLAGS]]
    more = f"; and {len(names) - MAX_NAMED_FLAGS} more" if len(names) > MAX_NAMED_FLAGS else ""
    return "; ".join(parts) + more


def run_files_in(folder: Path, rule: OutputRule) -> list[str]:
    """The names of what a run wrote in ``folder`` (``run.json``, a model, the command's ``run_files``),
    sorted."""
    if not folder.is_dir():
        return []
    found = {p.name for pattern in (RUN_FILE, *MODEL_FILES, *rule.run_files) for p in folder.glob(pattern)}
    return sorted(found)


def _refusal(folder: Path, what: str) -> FlagError:
    return FlagError("output_dir",
                     f"--output_dir {str(folder)!r} holds {what}; choose another --output_dir, or pass "
                     "--overwrite_output_dir to clear the folder first.")


def _record_of(folder: Path, rule: OutputRule) -> RunRecord | None:
    """``run.json``, else (a folder written before the rule) the finished run the command can read back."""
    record = RunRecord.read(folder)
    if record is None and rule.legacy_arguments is not None:
        arguments = rule.legacy_arguments(folder)
        if arguments is not None:
            record = RunRecord(rule.command, arguments, finished=True)
    return record


def foreign_files_in(folder: Path) -> list[str]:
    """The names in ``folder`` that count as a person's files when no run wrote there: everything but the
    run lock's files and hidden names (``.DS_Store``, a save's staging files), sorted."""
    if not folder.is_dir():
        return []
    return sorted(path.name for path in folder.iterdir()
                  if path.name not in LOCK_FILES and not path.name.startswith("."))


def check_output_folder(rule: OutputRule, output_dir: str | Path, arguments: Mapping[str, Any], *,
                        overwrite: bool = False, resume: str | None = None,
                        inputs: Mapping[str, str | None] | None = None,
                        write_into: bool = False) -> FolderState:
    """Apply the rule (module docstring) to ``output_dir`` for a run of ``rule.command`` with ``arguments``
    (``json_arguments``); reads only. Returns the ``FolderState``; raises ``FlagError`` naming ``output_dir``
    (or ``overwrite_output_dir`` for a folder it must not clear) in one sentence.

    ``resume``: ``--resume_from_checkpoint``. A checkpoint of this folder (``latest``, or one inside it)
    continues its run, so the folder may hold that run's files, and ``--overwrite_output_dir`` may not clear
    it; a checkpoint elsewhere starts a run here under the usual rule. ``inputs``: the run's other input paths
    (flag → path), which ``--overwrite_output_dir`` must not clear either. ``write_into``:
    ``--write_into_output_dir``, which lets a run start in a folder of files no run wrote."""
    folder = Path(output_dir)
    inputs = {**(inputs or {}), "resume_from_checkpoint": resume_location(folder, resume)}
    explicit_resume = resumes_inside(folder, resume)
    found = run_files_in(folder, rule)
    has_content = folder.is_dir() and any(path.name not in LOCK_FILES for path in folder.iterdir())
    if overwrite:
        if has_content:
            check_clearable(folder, inputs)
        return FolderState(folder, clear=has_content)
    if not found:
        return FolderState(folder, foreign=() if write_into else tuple(foreign_files_in(folder)))
    record = _record_of(folder, rule)
    if explicit_resume:
        if record is not None and (names := differing_flags(record.arguments, arguments, rule.aside)):
            logger.warning("%s: resuming in %s with other arguments than the run that wrote it (%s)",
                           rule.command, folder, describe_differences(record.arguments, arguments, names))
        return FolderState(folder, same_run=record is not None, record=record)
    if record is None:
        return _refuse_unrecorded(folder, found)
    if record.command != rule.command:
        raise _refusal(folder, f"a {record.command} run, not a {rule.command} run")
    names = differing_flags(record.arguments, arguments, rule.aside)
    finished = "finished " if record.finished else ""
    if names:
        raise _refusal(folder, f"a {finished}{rule.command} run with other arguments "
                               f"({describe_differences(record.arguments, arguments, names)})")
    if record.finished and rule.refuse_finished:
        hint = f" ({rule.continue_hint})" if rule.continue_hint else ""
        raise _refusal(folder, f"the finished model of this same {rule.command} run{hint}")
    return FolderState(folder, same_run=True, record=record)


def _refuse_unrecorded(folder: Path, found: list[str]) -> FolderState:
    shown = ", ".join(found[:4]) + (", …" if len(found) > 4 else "")
    raise _refusal(folder, f"files of an earlier run ({shown}) but no {RUN_FILE} recording its arguments")


def refuse_foreign_files(rule: OutputRule, state: FolderState) -> None:
    """``FlagError`` naming ``--output_dir`` (one sentence) when ``state`` found a person's files and no run
    there (and no ``--write_into_output_dir``); every process of a launch calls it, before the first write."""
    if not state.foreign:
        return
    names = state.foreign
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    raise FlagError("output_dir",
                    f"--output_dir {str(state.folder)!r} holds files that no {rule.command} run wrote "
                    f"({shown}); choose another --output_dir, pass --write_into_output_dir to write beside "
                    "them, or --overwrite_output_dir to delete them first.")


def resume_location(folder: str | Path, checkpoint: str | None) -> str | None:
    """Where ``--resume_from_checkpoint`` reads: the named checkpoint folder, or ``folder`` itself for
    ``latest`` (the newest checkpoint in the output folder); ``None`` when the run does not resume
    explicitly."""
    if not checkpoint:
        return None
    return str(folder) if checkpoint == "latest" else str(checkpoint)


def resumes_inside(folder: str | Path, checkpoint: str | None) -> bool:
    """Whether ``--resume_from_checkpoint`` continues a run of ``folder`` (``latest``, or a checkpoint inside
    it). Only then may the folder hold that run's files; a checkpoint elsewhere starts a run here under the
    usual rule."""
    location = resume_location(folder, checkpoint)
    return location is not None and Path(location).resolve().is_relative_to(Path(folder).resolve())


def clear_folder(folder: Path) -> None:
    """Remove everything inside ``folder`` but the run lock's files (the folder itself stays)."""
    for path in folder.iterdir():
        if path.name in LOCK_FILES:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def start_run(rule: OutputRule, state: FolderState, arguments: Mapping[str, Any]) -> None:
    """The run starts writing (main process only): refuse a folder of a person's files
    (``refuse_foreign_files``), clear the folder if ``state.clear``, create it, and record ``arguments`` in
    ``run.json`` (unfinished)."""
    refuse_foreign_files(rule, state)
    if state.clear:
        logger.info("%s: --overwrite_output_dir: clearing %s", rule.command, state.folder)
        clear_folder(state.folder)
    state.folder.mkdir(parents=True, exist_ok=True)
    RunRecord(rule.command, dict(arguments)).write(state.folder)


def finish_run(output_dir: str | Path) -> None:
    """Mark the run in ``output_dir`` finished (its last file is written; main process only)."""
    folder = Path(output_dir)
    record = RunRecord.read(folder)
    if record is not None:
        record.finished = True
        record.write(folder)


__all__ = [
    "ALWAYS_ASIDE",
    "MODEL_FILES",
    "RUN_FILE",
    "FolderState",
    "OutputDirArguments",
    "OutputRule",
    "RunRecord",
    "check_clearable",
    "check_output_folder",
    "clear_folder",
    "describe_differences",
    "differing_flags",
    "foreign_files_in",
    "finish_run",
    "json_arguments",
    "refuse_foreign_files",
    "resume_location",
    "resumes_inside",
    "run_files_in",
    "start_run",
]
