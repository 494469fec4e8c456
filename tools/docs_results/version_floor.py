"""Views of ``docs/results/version-floor.json``, written by ``python scripts/compat.py --torch … --record``:
the package's model tests (``tests/test_transformers_floor.py``'s files) on older torch releases, each with
the oldest supported Transformers and the lock's, in clean environments on the CPU.

Data: ``rows`` of ``{torch, transformers, installed: {torch, triton, numpy}, passed, failed, skipped, seconds,
date, machine}`` (``error`` instead of ``installed`` when the environment could not be built, ``tail`` when a
test failed). pyproject's ``torch>=`` is the lowest release whose every row passed
(``tests/test_version_floor.py``).
"""

from __future__ import annotations

from typing import Any

from hf_attn_variants.models.compat import version_tuple

from ._common import markdown_table


def passed(row: dict[str, Any]) -> bool:
    """The row's model tests ran and none failed."""
    return row["failed"] == 0 and row["passed"] > 0


def lowest_passing(data: dict[str, Any]) -> str:
    """The lowest torch release of ``data`` whose every row passed, with every recorded release above it
    passing too; ``ValueError`` when there is none."""
    releases = sorted({row["torch"] for row in data["rows"]}, key=version_tuple, reverse=True)
    lowest = None
    for release in releases:
        if not all(passed(row) for row in data["rows"] if row["torch"] == release):
            break
        lowest = release
    if lowest is None:
        raise ValueError("no torch release whose model tests all passed")
    return lowest


def table(data: dict[str, Any]) -> str:
    """One row per torch × Transformers pair, newest torch first: what pip installed, pytest's counts, where
    and when."""
    rows = []
    order = sorted(data["rows"], key=lambda r: (version_tuple(r["torch"]), version_tuple(r["transformers"])),
                   reverse=True)
    for row in order:
        installed = row.get("installed") or {}
        build = ", ".join(f"{name} {installed[name]}" for name in ("torch", "triton", "numpy")
                          if name in installed)
        counts = (f"{row['passed']} passed, {row['failed']} failed, {row['skipped']} skipped"
                  if "error" not in row else f"not built: {row['error'][:120]}")
        verdict = "ok" if passed(row) else "**failed**"
        rows.append([row["torch"], build or "–", row["transformers"], counts, verdict, f"{row['seconds']} s",
                     row["date"], row["machine"]])
    head = ["torch", "installed", "transformers", "model tests", "verdict", "time", "date", "machine"]
    body = markdown_table(head, rows)
    return (f"{body}\n\n*Each row measured by `python scripts/compat.py --torch TORCH --releases "
            "TRANSFORMERS --record` on the date and machine it names: a clean environment of those releases, "
            "the model tests in one process, this package from `src/`.*")

