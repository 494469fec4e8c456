"""Results kind ``suite``: how long ``make test`` / ``make demo`` took and what pytest counted, per run.

``scripts/record_suite.py`` appends one run (its label, the command, machine, versions, ``ONEDNN_MAX_CPU_ISA``
as ``isa``, the oneMKL vendor path forced with ``MKL_VENDOR`` as ``mkl_vendor``, pytest's counts, minutes) to
``docs/results/suite.json``; CONTRIBUTING.md renders the table. A run may instead carry ``environment``, the
variables as the package records them (``hf_attn_variants.records.numerics_environment``), which the table
reads the same way.
"""

from __future__ import annotations

import re
from typing import Any

from ._common import MKL_PATH_NAMES, forced_mkl_path, format_versions, markdown_table

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b")


def pytest_counts(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line in ``output`` (``"3 failed, 2320 passed, 5 skipped in
    441.4s"`` → ``{"failed": 3, "passed": 2320, "skipped": 5}``; ``error``/``errors`` counted as ``errors``);
    ``{}`` without one."""
    lines = [line for line in output.splitlines() if " in " in line and _COUNT.search(line)]
    found: dict[str, int] = {}
    for number, kind in _COUNT.findall(lines[-1]) if lines else []:
        found["errors" if kind.startswith("error") else kind] = int(number)
    return found


def _counts(run: dict[str, Any]) -> str:
    counts = run.get("counts") or {}
    order = ("passed", "failed", "errors", "skipped")
    return ", ".join(f"{counts[key]} {key}" for key in order if key in counts) or "–"


def _where(run: dict[str, Any]) -> str:
    """The machine, with the ISA cap and the forced oneMKL vendor path the run had."""
    environment = run.get("environment") or {}
    isa = run.get("isa") or environment.get("ONEDNN_MAX_CPU_ISA")
    notes = [f"`ONEDNN_MAX_CPU_ISA={isa}`"] if isa else []
    vendor = run.get("mkl_vendor") or (environment.get("MKL_VENDOR") if forced_mkl_path(environment)
                                       else None)
    notes += [f"oneMKL's {MKL_PATH_NAMES[vendor]} code path (`MKL_VENDOR={vendor}`)"] if vendor else []
    return "; ".join([run["machine"], *notes])


def runs(data: dict[str, Any]) -> str:
    """One row per recorded run: what, where (CPU, ISA cap, oneMKL path), versions, pytest's counts, time."""
    if not data["runs"]:
        return "*No run recorded yet.*"
    rows = []
    for run in data["runs"]:
        rows.append([
            run["label"], f"`{run['command']}`", _where(run),
            format_versions(run.get("versions") or {}), _counts(run), f"{run['minutes']:.1f} min",
            run["date"],
        ])
    return markdown_table(["run", "command", "machine", "versions", "result", "time", "date"], rows)
