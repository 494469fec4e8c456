"""Both CPU vendors' oneMKL code paths on every machine: a tolerance tuned on one CPU fails here, not on the
other.

CI lands on an Intel Xeon one day and an AMD EPYC the next, and oneMKL sums float32 products in a different
order on each (``tests/mkl_dispatch.py``). The suite itself runs on this CPU's own path; the numerics tests
run again on the other vendor's path, so both are checked on every run whichever CPU it gets: the model test
files in ``tests/test_transformers_floor.py`` (on the oldest Transformers), the kernel and peer comparisons
here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.docs_results.suite import pytest_counts
from tests.mkl_dispatch import mkl_code_path, native_env, native_vendor, other_vendor, vendor_env
from tests.test_transformers_floor import MODEL_TEST_FILES
from tests.utils import triton_skip_reason

REPO = Path(__file__).resolve().parents[1]
# The files that compare our kernels and peers against references in float32. The model tests
# (``MODEL_TEST_FILES``) take the other vendor's path in tests/test_transformers_floor.py, on the oldest
# Transformers: one run of them covers both axes.
NUMERICS_TEST_FILES = ("tests/test_peers.py", "tests/test_flex_attention.py", "tests/test_gau_triton.py")
assert not set(NUMERICS_TEST_FILES) & set(MODEL_TEST_FILES)


def test_the_shim_switches_onemkl_to_the_other_vendors_code_path() -> None:
    own_path = mkl_code_path(native_env())
    assert mkl_code_path(vendor_env(native_vendor())) == own_path
    other_path = mkl_code_path(vendor_env(other_vendor()))
    assert other_path != own_path, f"the {other_vendor()!r} shim left oneMKL on its own path: {own_path}"


def test_the_numerics_tests_pass_on_the_other_vendors_onemkl_path() -> None:
    env = vendor_env(other_vendor())
    env = {k: v for k, v in env.items() if k != "PYTEST_XDIST_WORKER"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NUMERICS_TEST_FILES],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )
    counts = pytest_counts(result.stdout)
    assert result.returncode == 0, (
        f"on oneMKL's path {mkl_code_path(env)!r}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    )
    # test_gau_triton.py's 25 cases skip where Triton's interpreter cannot run the kernels (``needs_triton``:
    # Triton 3.6 with numpy >= 2.4); the peers and flex files still pass 11.
    least = 30 if triton_skip_reason() is None else 11
    assert counts.get("passed", 0) >= least and not counts.get("failed") and not counts.get("errors"), counts


def test_results_name_the_forced_path_only_when_the_shim_is_really_preloaded(monkeypatch) -> None:
    """The package records the variables generically (``records.numerics_environment``); only the docs
    renderer (``tools/docs_results``) reads a forced oneMKL path out of that record."""
    from hf_attn_variants.records import numerics_environment
    from tools.docs_results import _common, suite
    from tests.mkl_dispatch import VENDORS

    assert tuple(_common.MKL_PATH_NAMES) == VENDORS
    monkeypatch.delenv("MKL_VENDOR", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert "MKL_VENDOR" not in numerics_environment() and "LD_PRELOAD" not in numerics_environment()
    assert _common.forced_mkl_path() is None and "oneMKL" not in _common.machine_description()
    assert _common.forced_mkl_command_prefix() == ""
    monkeypatch.setenv("MKL_VENDOR", "intel")
    assert numerics_environment()["MKL_VENDOR"] == "intel"
    assert _common.forced_mkl_path() is None  # the variable alone forces nothing
    for key, value in vendor_env("intel", {}).items():
        monkeypatch.setenv(key, value)
    recorded = numerics_environment()
    assert recorded["MKL_VENDOR"] == "intel" and "mkl-vendor" in recorded["LD_PRELOAD"]
    assert _common.forced_mkl_path() == "Intel" == _common.forced_mkl_path(recorded)
    assert _common.forced_mkl_command_prefix() == ("MKL_VENDOR=intel LD_PRELOAD=$(python -m "
                                                   "tests.mkl_dispatch intel) ")
    assert _common.cpu_name().endswith(" (oneMKL's Intel path)")
    assert "(x86_64), oneMKL on its Intel code path" in _common.machine_description()
    assert _common.forced_mkl_path({"MKL_VENDOR": "intel"}) is None
    assert _common.cpu_name({}) == _common.cpu_name({"LD_PRELOAD": recorded["LD_PRELOAD"]})
    run = {"label": "x", "command": "make test MKL_VENDOR=intel",
           "machine": "2-core AMD EPYC CPU (x86_64), no GPU",
           "isa": "AVX2", "mkl_vendor": "intel", "versions": {}, "minutes": 1.0, "date": "2026-11-26"}
    where = "`ONEDNN_MAX_CPU_ISA=AVX2`; oneMKL's Intel code path (`MKL_VENDOR=intel`)"
    assert where in suite.runs({"runs": [run]})
    recorded_run = {**{k: v for k, v in run.items() if k not in ("isa", "mkl_vendor")},
                    "environment": {**recorded, "ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert suite.runs({"runs": [recorded_run]}) == suite.runs({"runs": [run]})
