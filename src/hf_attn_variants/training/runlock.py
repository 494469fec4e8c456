"""One live run per output folder: ``pretrain``, ``finetune`` and ``prune`` hold a lock on ``--output_dir``.

The main process takes an exclusive ``filelock.FileLock`` on ``<output_dir>/.hf_attn_variants.lock`` (an OS
file lock, which the kernel releases when its process dies, so a killed run never blocks the rerun) and
records who holds it in ``.hf_attn_variants.owner.json`` (process id, host, command, start). A second run into
the same folder is refused in one sentence naming that process, before it reads or writes anything else. The
processes of one ``torchrun`` / ``accelerate launch`` are one run: only its main process takes the lock, and
every rank learns the answer (``agree``). Both files go when the run ends; a folder the lock had to create,
and the run left empty, goes too.

``lengthgen`` keeps its own per-run locks: several study workers may write one study folder on purpose.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..cli_utils import FlagError

LOCK_FILE = ".hf_attn_variants.lock"
OWNER_FILE = ".hf_attn_variants.owner.json"
LOCK_FILES = (LOCK_FILE, OWNER_FILE)
"""What the lock puts in the folder: never a run's file (``outputs.clear_folder`` leaves them)."""
OWNER_WAIT_S = 2.0
"""How long a refused run waits for the holder to record itself (it takes the lock first, then writes)."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (``os.kill(pid, 0)``; another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_owner(folder: Path, wait_s: float = OWNER_WAIT_S) -> dict[str, object]:
    """The holder's record (``{}`` when none appears within ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
            if isinstance(owner, dict):
                return owner
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.05)


def describe_owner(owner: dict[str, object]) -> str:
    """``"process 4242 (pretrain, started 2026-11-27 01:02:03)"``, saying when that process is not alive
    here."""
    pid, host = owner.get("pid"), owner.get("host")
    if not isinstance(pid, int):
        return "another process"
    where = "" if host == socket.gethostname() else f" on {host}"
    state = "" if where or pid_alive(pid) else ", which no longer runs here"
    return f"process {pid}{where} ({owner.get('command', '?')}, started {owner.get('started', '?')}{state})"


def locked_error(folder: Path, command: str, owner: dict[str, object]) -> FlagError:
    """The refusal: one sentence naming the process that writes ``folder``."""
    return FlagError("output_dir", f"--output_dir {str(folder)!r} is being written by another run right now: "
                                   f"{describe_owner(owner)}; wait for it to end, or give this {command} "
                                   "another --output_dir.")


@contextlib.contextmanager
def run_lock(command: str, output_dir: str | Path, *, main_process: bool = True,
             agree: Callable[[int], int] = lambda refused: refused) -> Iterator[None]:
    """Hold ``output_dir``'s lock for the block (see the module docstring); ``FlagError`` naming
    ``output_dir`` when another live run holds it. ``agree(refused)``: the largest value over the launch's
    processes (a collective every rank calls), so that every rank of a refused launch stops."""
    from filelock import FileLock, Timeout

    folder = Path(output_dir)
    created = _first_missing(folder) if main_process else None
    lock = FileLock(folder / LOCK_FILE, timeout=0)
    owner: dict[str, object] = {}
    refused = 0
    if main_process:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire()
        except Timeout:
            refused, owner = 1, read_owner(folder)
    if agree(refused):
        raise locked_error(folder, command, owner)
    if main_process:
        started = datetime.datetime.now().isoformat(sep=" ", timespec="seconds")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": started}
        (folder / OWNER_FILE).write_text(json.dumps(record))
    try:
        yield
    finally:
        if main_process:
            with contextlib.suppress(OSError):
                (folder / OWNER_FILE).unlink()
            with contextlib.suppress(OSError):
                (folder / LOCK_FILE).unlink()
            lock.release()
            if created is not None:
                _remove_if_empty(folder, created)


def _first_missing(folder: Path) -> Path | None:
    """The outermost of ``folder`` and its parents that does not exist yet (what ``mkdir`` creates), or
    ``None``."""
    missing = None
    for path in (folder, *folder.parents):
        if path.exists():
            return missing
        missing = path
    return missing


def _remove_if_empty(folder: Path, created: Path) -> None:
    """Remove ``folder`` and its parents up to ``created`` (the folders the lock had to make) while empty: a
    run refused before it wrote anything leaves nothing behind."""
    with contextlib.suppress(OSError):
        for path in (folder, *folder.parents):
            if any(path.iterdir()):
                return
            path.rmdir()
            if path == created:
                return


__all__ = ["LOCK_FILE", "LOCK_FILES", "OWNER_FILE", "describe_owner", "pid_alive", "run_lock"]
