"""Helpers shared by the results kinds of the studies (not a kind itself: its name starts with ``_``).

``run_metadata`` gives the provenance fields a measuring script writes into its results file (``command``,
``machine``, ``versions``, ``date`` and ``environment``, the variables that change numerics as the package
records them: ``hf_attn_variants.records.numerics_environment``); ``source_line`` renders them as the one line
under a table. A results file whose numbers were copied from an earlier version of the docs (the raw outputs
of that run are gone) carries a ``provenance`` sentence saying so, and ``source_line`` shows that sentence
instead.

The test suite can run under oneMKL's code path of the other CPU vendor (``tests/mkl_dispatch.py``:
``MKL_VENDOR`` and its shim in ``LD_PRELOAD``). The package only records those variables; ``forced_mkl_path``
reads them back here, so the docs name the path ("oneMKL's Intel path") beside the CPU.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hf_attn_variants.records import cpu_model, numerics_environment

PROVENANCE_FIELDS = ("kind", "command", "machine", "versions", "date")
"""Fields every results file of the studies carries (``provenance`` too when its numbers were transcribed)."""


MKL_PATH_NAMES = {"intel": "Intel", "other": "non-Intel"}
"""``MKL_VENDOR`` values (``tests/mkl_dispatch.py``) and the oneMKL code path each forces, as results name
it."""


def forced_mkl_path(environment: Mapping[str, str] | None = None) -> str | None:
    """``"Intel"`` or ``"non-Intel"`` when ``environment`` (a results file's record; default this process's)
    ran under oneMKL's code path of a CPU vendor (``MKL_VENDOR`` set and its vendor shim in ``LD_PRELOAD``:
    ``make test MKL_VENDOR=…``, ``tests/mkl_dispatch.py``), else ``None``. Float32 products follow that
    vendor's rounding."""
    environment = numerics_environment() if environment is None else environment
    vendor = environment.get("MKL_VENDOR")
    preloaded = [os.path.basename(entry) for entry in environment.get("LD_PRELOAD", "").split()]
    if vendor not in MKL_PATH_NAMES or not any(name.startswith(f"mkl-{vendor}-") for name in preloaded):
        return None
    return MKL_PATH_NAMES[vendor]


def forced_mkl_command_prefix(environment: Mapping[str, str] | None = None) -> str:
    """The environment that reproduces a forced oneMKL path, put before a recorded command
    (``"MKL_VENDOR=intel LD_PRELOAD=$(python -m tests.mkl_dispatch intel) "``), or ``""`` on the CPU's own
    path."""
    environment = numerics_environment() if environment is None else environment
    vendor = environment.get("MKL_VENDOR") if forced_mkl_path(environment) else None
    return f"MKL_VENDOR={vendor} LD_PRELOAD=$(python -m tests.mkl_dispatch {vendor}) " if vendor else ""


def cpu_name(environment: Mapping[str, str] | None = None) -> str:
    """The CPU's model name, followed by ``"(oneMKL's Intel path)"`` when ``forced_mkl_path`` says the run
    imitates the other vendor's float32 products."""
    forced = forced_mkl_path(environment)
    return cpu_model() + (f" (oneMKL's {forced} path)" if forced else "")


def machine_description(extra: str | None = None) -> str:
    """``"2-core AMD EPYC CPU (x86_64), no GPU"`` and ``extra`` (e.g. the load average), for the ``machine``
    field."""
    forced = forced_mkl_path()
    text = f"{os.cpu_count()}-core {cpu_model()} CPU ({platform.machine()})"
    text += f", oneMKL on its {forced} code path" if forced else ""
    try:
        import torch

        if torch.cuda.is_available():
            text += ", " + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        else:
            text += ", no GPU"
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return f"{text}; {extra}" if extra else text


def load_average() -> str:
    """``"load average 1.3 / 1.5 / 1.7"`` (1, 5, 15 minutes), or ``""`` where the OS has none."""
    if not hasattr(os, "getloadavg"):
        return ""
    return "load average " + " / ".join(f"{x:.1f}" for x in os.getloadavg())


def versions(**extra: str) -> dict[str, str]:
    """Python, torch, transformers and this package's versions (plus ``extra``)."""
    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "hf_attn_variants"):
        module = sys.modules.get(name)
        if module is None:
            try:
                module = __import__(name)
            except ImportError:
                continue
        found[name] = getattr(module, "__version__", "?")
    return {**found, **extra}


def run_metadata(kind: str, command: str | Sequence[str], *, machine: str | None = None,
                 **extra_versions: str) -> dict[str, Any]:
    """The provenance fields of a results file written now by ``command`` (a string, or argv to be quoted)."""
    if not isinstance(command, str):
        command = shlex.join(command)
    return {"kind": kind, "command": command, "machine": machine or machine_description(),
            "versions": versions(**extra_versions), "date": datetime.date.today().isoformat(),
            "environment": numerics_environment()}


def format_versions(found: dict[str, str]) -> str:
    """``"torch 2.13.0+cpu, transformers 5.23.0, Python 3.11.7"``."""
    names = {"python": "Python", "hf_attn_variants": "hf_attn_variants"}
    return ", ".join(f"{names.get(key, key)} {value}" for key, value in found.items())


def source_line(data: dict[str, Any]) -> str:
    """One italic line naming where the numbers above come from."""
    if data.get("provenance"):
        return f"*{data['provenance']}*"
    return (f"*Measured {data['date']} by `{data['command']}` on {data['machine']} "
            f"({format_versions(data.get('versions') or {})}).*")


def signed(value: float, digits: int = 3) -> str:
    """``+0.018`` / ``−0.078`` with a real minus sign; an exact integer 0 (bit-identical values) is ``0``."""
    if isinstance(value, int) and value == 0:
        return "0"
    return f"{value:+.{digits}f}".replace("-", "−")


def number(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals and a real minus sign."""
    return f"{value:.{digits}f}".replace("-", "−")


def minutes(seconds: float) -> str:
    """``"1 min 42 s"``, or ``"42 s"`` under a minute."""
    whole, rest = divmod(round(seconds), 60)
    return f"{whole} min {rest:02d} s" if whole else f"{rest} s"


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]],
                   align: Sequence[str] | None = None) -> str:
    """A markdown table; ``align`` holds ``"---"`` or ``"---:"`` per column (default left)."""
    align = align or ["---"] * len(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def settings_table(rows: Sequence[tuple[str, str]]) -> str:
    """The settings of a measurement as a two-column table (setting | value), rendered above its results
    table; the docs' own sentences say what the settings mean."""
    return markdown_table(["setting", "value"], [[name, value] for name, value in rows])


__all__ = [
    "MKL_PATH_NAMES",
    "PROVENANCE_FIELDS",
    "cpu_name",
    "forced_mkl_command_prefix",
    "forced_mkl_path",
    "format_versions",
    "load_average",
    "machine_description",
    "markdown_table",
    "minutes",
    "number",
    "run_metadata",
    "settings_table",
    "signed",
    "source_line",
    "versions",
]
