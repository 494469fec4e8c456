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

LOCK_NAME = ".lock"


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


__all__ = ["LOCK_NAME", "claim", "fingerprint"]
