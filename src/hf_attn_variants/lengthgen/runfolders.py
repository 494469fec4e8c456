"""Run folders of a study: claiming one for this process, and fingerprinting the settings of a run.

Several processes may work on one output folder at once (``WORKERS=2 scripts/run_length_study.sh``). Each
pretraining run (``runs/<variant>/seed_<s>/``) and each finetune run is *claimed* before it is worked on:
a non-blocking ``filelock.FileLock`` on ``<folder>/.lock``. A process that cannot take the lock skips the
run (another one is working on it). The lock is an OS file lock (``flock``), held by the open file: when
its process ends, crashes or is killed, the operating system releases it, so no stale claim survives a
crashed worker; the ``.lock`` file itself may stay and means nothing without the lock on it.

Every stored result carries a ``fingerprint`` of the settings that produced it; a run whose stored
fingerprint differs from the current one is redone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ..training.preemption import TrainingPreempted, exit_code_for, signal_label

LOCK_NAME = ".lock"


class StudyStopped(TrainingPreempted):
    """A stop signal (Ctrl-C, SIGTERM) that arrived outside a run's training — during an evaluation, between
    runs, in the finetune phase — acted on before the next run or phase starts (``stop_between_runs``): the
    study ends as a stopped training does (one line, exit status 130 after Ctrl-C, 75 after SIGTERM, nothing
    marked finished), keeping every run it finished."""

    def __init__(self, signal_name: str, where: str) -> None:
        code = exit_code_for(signal_name)
        Exception.__init__(self, f"stopped by {signal_label(signal_name)} {where}; the finished runs are "
                                 f"kept: run the same command again to go on (exit status {code}).")
        self.command, self.signal_name, self.step, self.checkpoint = "lengthgen", signal_name, 0, None
        self.exit_code = code


def stop_between_runs(stop: Any, where: str) -> None:
    """Raise ``StudyStopped`` (``where``: "after <run>") when ``stop``, the command line's ``StopSignals``,
    got a signal. A run's training checks it between steps; the studies check it here between runs and
    phases, so a signal during an evaluation or a finetuning is not swallowed."""
    if stop is not None and stop.requested:
        raise StudyStopped(stop.signal_name, where)


@contextlib.contextmanager
def claim(folder: str | Path) -> Iterator[bool]:
    """Claim ``folder`` for this process until the block ends; yields whether the claim succeeded.

    Yields ``False`` (and holds nothing) when any other holder — another process, or another claim of
    this process — holds the folder. The folder is created if needed.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / LOCK_NAME, thread_local=False)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def fingerprint(data: Any) -> str:
    """Short sha256 of the canonical JSON of ``data`` (keys sorted; non-JSON values by ``str``)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


__all__ = ["LOCK_NAME", "StudyStopped", "claim", "fingerprint", "stop_between_runs"]
