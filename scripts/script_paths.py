"""Checks the maintainer scripts make on their arguments before any work: an output path that can be written,
a results name that stays under ``docs/results/``, a positive finite number. Each returns the problem as the
rest of a one-line error (``None`` when there is none), which the script passes to ``parser.error`` after the
flag's name, so a bad argument stops the script before it measures anything or writes anywhere.

The scripts import it as ``scripts.script_paths`` (the repository root is on ``sys.path`` in each, for
``tools/``), which works both when run as ``python scripts/<name>.py`` and when a test loads them from their
file.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path


def writable_path(path: Path) -> bool:
    """Whether a file ``path`` could be written: its nearest existing ancestor is a folder where a file can
    be created (probed with a temporary file, removed at once: ``os.access`` says yes to root everywhere,
    /proc included); the folders between are created when the results are written."""
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            return True
    except OSError:
        return False


def output_file_problem(path: Path) -> str | None:
    """Why the results file ``path`` cannot be written (a folder, an empty name, a place this user may not
    create or write), or ``None``."""
    if not str(path) or str(path) == ".":
        return "name the JSON file to write"
    if path.is_dir():
        return f"{str(path)!r} is a folder; name the JSON file to write"
    if not writable_path(path):
        return f"{str(path)!r} cannot be written (its folder is not one this user may create or write)"
    return None


def output_folder_problem(folder: Path) -> str | None:
    """Why files cannot be written into ``folder`` (created if missing): an existing file, or a place this
    user may not create or write; ``None`` otherwise."""
    if folder.exists() and not folder.is_dir():
        return f"{str(folder)!r} is a file, not a folder"
    if not writable_path(folder / "probe"):
        return f"{str(folder)!r} cannot be written (not a folder this user may create or write)"
    return None


def foreign_files(folder: Path, *ours: str) -> list[str]:
    """The entries of an existing ``folder`` that the script would not write there (none when the folder is
    missing, or when it holds one of ``ours``: an earlier run's output, which the script may replace)."""
    if not folder.is_dir():
        return []
    names = sorted(entry.name for entry in folder.iterdir())
    if any((folder / name).exists() for name in ours):
        return []
    return names


def results_name_problem(root: Path, name: str) -> str | None:
    """Why ``name`` is not a results file name under ``<root>/docs/results/`` (``results_path``'s
    ``ResultsError``), or ``None``."""
    from tools.docs_results import ResultsError, results_path

    try:
        results_path(root, name)
    except ResultsError as error:
        return str(error)
    return None


def positive_problem(value: float, unit: str, *, zero: bool = False) -> str | None:
    """Why ``value`` is not a finite positive number of ``unit`` (zero allowed with ``zero``), or ``None``."""
    if math.isfinite(value) and (value > 0 or (zero and value == 0)):
        return None
    wanted = "a finite number >= 0" if zero else "a finite positive number"
    return f"must be {wanted} of {unit}, got {value:g}"
