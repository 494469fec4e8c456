"""Run oneMKL's code path for the other CPU vendor: an Intel Xeon's on an AMD CPU, an AMD EPYC's on an Intel
one.

Why this exists: torch's CPU build does its float32 and float64 matrix products in oneMKL, which picks its
kernels by the CPU's *vendor* as well as by its instruction sets. On an Intel CPU with AVX-512 it runs its
AVX-512 kernels; on any other vendor's CPU it runs its generic "Intel(R) Architecture processors" path, even
where that CPU has AVX-512 (AMD Zen 4). The two sum in different orders, so float32 results differ in their
last bits between an Intel Xeon and an AMD EPYC: the cause of issue 21's Intel-only tolerance failures.
``ONEDNN_MAX_CPU_ISA`` caps oneDNN only and does not reach them.

How: oneMKL asks two functions of its service layer whether the CPU is Intel's, ``mkl_serv_intel_cpu`` and
``mkl_serv_intel_cpu_true``. torch's ``libtorch_cpu.so`` exports both, so a small library preloaded with
``LD_PRELOAD`` that defines them gives oneMKL the answer of the other vendor. This is the widely used way to
get MKL's fast paths on AMD, not a documented MKL interface; ``mkl_code_path`` therefore reads, from
``MKL_VERBOSE``, which path oneMKL really took, and ``tests/test_cpu_dispatch.py`` checks that the switch
takes effect.

Checked bit for bit: on a 2-core AMD EPYC with the Intel answer, the three relu² unit tests that failed on
issue 21's Intel Xeon (before their tolerances followed from dtype and size) fail again with the very errors
the issue quotes, 1.09e-5 against 1.02e-5 allowed and 8.43e-6 against 7.67e-6. The switch cannot imitate what
oneMKL does not decide (a CPU's own instruction sets, its cache sizes), nor oneDNN, whose kernels follow the
instruction sets only (``ONEDNN_MAX_CPU_ISA`` covers those).

Usage: ``make test MKL_VENDOR=intel`` (the whole suite on an Intel CPU's MKL path), or
``LD_PRELOAD=$(python -m tests.mkl_dispatch intel) python ...``. Needs a C compiler (``cc``; ``CC`` to
choose).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from filelock import FileLock

from tests.remote_code import cache_root

VENDORS = ("intel", "other")
"""The CPU vendors whose oneMKL code path the shim forces (``MKL_VENDOR``)."""
SOURCE = """\
/* oneMKL's CPU-vendor check, answered as {vendor}'s CPU (tests/mkl_dispatch.py). */
int mkl_serv_intel_cpu(void) {{ return {answer}; }}
int mkl_serv_intel_cpu_true(void) {{ return {answer}; }}
"""
_CODE_PATH = re.compile(r"MKL_VERBOSE oneMKL .*? for Intel\(R\) 64 architecture (.*?), Lnx")


def native_vendor() -> str:
    """``"intel"`` when ``/proc/cpuinfo`` names a ``GenuineIntel`` CPU, else ``"other"`` (AMD and the
    rest)."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text(errors="replace") if cpuinfo.is_file() else ""
    return "intel" if re.search(r"^vendor_id\s*:\s*GenuineIntel", text, re.MULTILINE) else "other"


def other_vendor() -> str:
    """The vendor whose oneMKL path this CPU does not take by itself."""
    return "other" if native_vendor() == "intel" else "intel"


def _check_vendor(vendor: str) -> None:
    if vendor not in VENDORS:
        raise ValueError(f"vendor: expected one of {', '.join(VENDORS)}, got {vendor!r}.")


def shim(vendor: str) -> Path:
    """The preload library answering oneMKL's vendor check as ``vendor``'s CPU: built once with the C compiler
    into the cache (keyed by its source) and reused; ``RuntimeError`` naming ``CC`` when there is no
    compiler."""
    _check_vendor(vendor)
    source = SOURCE.format(vendor=vendor, answer=int(vendor == "intel"))
    cache = cache_root() / "mkl-vendor"
    library = cache / f"mkl-{vendor}-{hashlib.sha256(source.encode()).hexdigest()[:12]}.so"
    if library.is_file():
        return library
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("CC: no C compiler (cc or gcc) on PATH to build the oneMKL vendor shim; install "
                           "gcc.")
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(library) + ".lock"):
        if not library.is_file():
            with tempfile.TemporaryDirectory(dir=cache) as scratch:
                c_file, built = Path(scratch) / "shim.c", Path(scratch) / "shim.so"
                c_file.write_text(source, encoding="utf-8")
                subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(c_file)],
                               check=True)
                built.replace(library)
    return library


def native_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) without any vendor shim in ``LD_PRELOAD``: this CPU's own oneMKL
    path."""
    env = dict(os.environ if base is None else base)
    kept = [entry for entry in env.get("LD_PRELOAD", "").split() if Path(entry).parent.name != "mkl-vendor"]
    env.pop("LD_PRELOAD", None)
    env.pop("MKL_VENDOR", None)
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    return env


def vendor_env(vendor: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with ``vendor``'s shim, and no other, first in ``LD_PRELOAD``, and
    ``MKL_VENDOR=vendor``. Results files record both variables (``hf_attn_variants.records``), and the docs
    renderer names the forced path from them (``tools.docs_results._common.forced_mkl_path``)."""
    env = native_env(base)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(shim(vendor)), env.get("LD_PRELOAD", "")]))
    env["MKL_VENDOR"] = vendor
    return env


def mkl_code_path(env: dict[str, str] | None = None, python: str = sys.executable) -> str:
    """The code path oneMKL reports (``MKL_VERBOSE=1``) for one float32 product under ``env``, e.g.
    ``"Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) …"`` or ``"Intel(R) Architecture
    processors"``."""
    env = dict(os.environ if env is None else env, MKL_VERBOSE="1", OMP_NUM_THREADS="1")
    program = "import torch; torch.ones(64, 64) @ torch.ones(64, 64)"
    result = subprocess.run([python, "-c", program], env=env, capture_output=True, text=True, check=True)
    match = _CODE_PATH.search(result.stdout + result.stderr)
    if match is None:
        raise RuntimeError("MKL_VERBOSE printed no code path (is torch built with "
                           f"MKL?):\n{result.stdout[-2000:]}")
    return match.group(1)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in VENDORS:
        sys.exit(f"usage: python -m tests.mkl_dispatch {{{','.join(VENDORS)}}}  (prints the shim's path)")
    print(shim(sys.argv[1]))
