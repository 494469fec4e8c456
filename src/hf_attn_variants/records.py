"""What the tools that users run (``bench``, ``lengthgen``) write into their results files besides the
numbers: the JSON layout, the CPU, and the environment variables that change numerics.

``numerics_environment`` records variables by one rule (``NUMERICS_PREFIXES`` and ``NUMERICS_NAMES``) and
interprets none of them: a results file shows that a run had, say, ``LD_PRELOAD`` or ``MKL_CBWR`` set, and a
reader (or the repository's docs renderer) decides what that means.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from typing import Any

NUMERICS_PREFIXES = ("MKL_", "KMP_", "OMP_", "GOMP_", "ONEDNN_", "DNNL_", "OPENBLAS_", "CUBLAS_", "TRITON_")
"""Prefixes of the variables read by the libraries that do the arithmetic: oneMKL, Intel's and GNU's OpenMP
runtimes, oneDNN, OpenBLAS, cuBLAS and Triton."""
NUMERICS_NAMES = (
    "LD_PRELOAD",
    "ATEN_CPU_CAPABILITY",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
)
"""Variables outside those prefixes that change which kernels run: a preloaded library, torch's CPU kernel
cap, the TF32 overrides."""


def numerics_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default ``os.environ``) that are set and named by ``NUMERICS_NAMES`` or
    start with one of ``NUMERICS_PREFIXES``, sorted by name; ``{}`` when none is set."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in sorted(environ)
            if name in NUMERICS_NAMES or name.startswith(NUMERICS_PREFIXES)}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()`` or the machine type."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            name = next(
                (line.split(":", 1)[1].strip() for line in stream if line.startswith("model name")), name
            )
    except OSError:
        pass
    return name


def format_results(data: Any, *, inline_depth: int | None = None) -> str:
    """``data`` as JSON text, keys in order, 2-space indent; with ``inline_depth`` every list or object nested
    deeper than that many levels is written on one line (e.g. 2: one line per row of a top-level list of
    rows), which keeps files of many small rows short and their diffs one line per changed row."""

    def encode(value: Any, level: int) -> str:
        inline = inline_depth is not None and level >= inline_depth
        if not isinstance(value, (dict, list)) or not value or inline:
            return json.dumps(value, ensure_ascii=False)
        pad, inner = "  " * level, "  " * (level + 1)
        if isinstance(value, dict):
            items = [f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {encode(v, level + 1)}"
                     for k, v in value.items()]
            return "{\n" + ",\n".join(items) + f"\n{pad}}}"
        return "[\n" + ",\n".join(f"{inner}{encode(v, level + 1)}" for v in value) + f"\n{pad}]"

    return encode(data, 0) + "\n"


__all__ = ["NUMERICS_NAMES", "NUMERICS_PREFIXES", "cpu_model", "format_results", "numerics_environment"]
