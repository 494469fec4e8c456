"""GAU's Triton kernels fit an NVIDIA GPU, checked without one (``scripts/triton_resources.py``).

The committed results (one file per Triton minor: the lock's, and the GPU image's 3.6) are of the kernels as
they are now, and none of their compiles spills a register, exceeds its target's shared memory or leaves the
tensor cores out; one kernel compiled here again gives the committed row.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hf_attn_variants.models import gau_triton


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "triton_resources.py"
RERUN = ("rerun `python scripts/triton_resources.py` with the lock's Triton and with Triton 3.6 (its "
         "docstring says how), then `python tools/render_docs.py`")


def load_script() -> ModuleType:
    """``scripts/triton_resources.py`` as a module."""
    spec = importlib.util.spec_from_file_location("triton_resources_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed() -> list[Path]:
    return sorted((ROOT / "docs" / "results").glob("triton-resources-*.json"))


def locked_triton() -> str:
    """The Triton version ``locks/requirements.txt`` pins."""
    lock = (ROOT / "locks" / "requirements.txt").read_text(encoding="utf-8")
    (version,) = [line.split("==")[1].strip() for line in lock.splitlines() if line.startswith("triton==")]
    return version


def test_results_exist_for_the_lock_and_the_gpu_image() -> None:
    names = {path.name for path in committed()}
    assert "triton-resources-3.6.json" in names, "no results for the GPU image's Triton 3.6: " + RERUN
    assert load_script().results_path(locked_triton()).name in names, (
        f"no results for the lock's Triton ({locked_triton()}): " + RERUN)


@pytest.mark.parametrize("path", committed(), ids=lambda path: path.stem)
def test_committed_results_are_of_these_kernels_and_clean(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["source_sha256"] == hashlib.sha256(Path(gau_triton.__file__).read_bytes()).hexdigest(), (
        f"{path.name} was compiled from another gau_triton.py: " + RERUN)
    script = load_script()
    assert {(r["kernel"], r["variant"], r["target"], r["dtype"]) for r in data["rows"]} == set(script.jobs())
    problems = {f"{r['target']} {r['dtype']} {r['kernel']} ({r['variant']})": script.problems(r)
                for r in data["rows"]}
    assert not {k: v for k, v in problems.items() if v}
    hopper = [r for r in data["rows"] if r["target"] == "sm_90" and r["kernel"] in script.FLASH_KERNELS
              and r["dtype"] == "bfloat16"]
    assert hopper and all(r["wgmma"] for r in hopper), "a FLASH kernel does not use Hopper's wgmma in bf16"


def test_compiled_options_are_the_launches() -> None:
    """The script compiles with what ``flash_launch_options`` gives, which is what the launches pass."""
    script = load_script()
    options = script.kernel_options("_flash_backward_key_kernel", "causal", "bfloat16")
    assert options["num_warps"] == gau_triton.FLASH_LAUNCH["backward_key"]["num_warps"]
    assert options["BLOCK_E"] == gau_triton.FLASH_LAUNCH["backward_key"]["BLOCK_E"]
    assert options["WHOLE"] and options["CAUSAL"] and not options["HAS_KEY_MASK"]
    exact = script.kernel_options("_flash_forward_kernel", "causal", "float32")
    table = gau_triton.FLASH_LAUNCH_FLOAT32["forward"]
    assert (exact["BLOCK"], exact["BLOCK_E"], exact["num_warps"], exact["PRECISION"]) == (
        table["BLOCK"], table["BLOCK_E"], table["num_warps"], "ieee")


@pytest.mark.skipif(not gau_triton.TRITON_AVAILABLE, reason="triton is not installed")
def test_a_kernel_compiled_here_gives_the_committed_row(tmp_path: Path) -> None:
    """FLASH's forward kernel for sm_90, compiled by the script in a child (Triton's interpreter is on in this
    process), equals its committed row: same registers, spills and shared memory."""
    import triton

    if not load_script().results_path(triton.__version__).is_file():  # an older torch's Triton, say
        pytest.skip(f"no committed results for this Triton ({triton.__version__}), only for the lock's "
                    f"({locked_triton()}) and the GPU image's (3.6)")
    out = tmp_path / "one.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, str(SCRIPT), "--kernel", "_flash_forward_kernel", "--target", "sm_90",
               "--dtype", "bfloat16", "--workers", "1", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert len(rows) == 2
    kept = json.loads(load_script().results_path(triton.__version__).read_text(encoding="utf-8"))
    by = {(r["kernel"], r["variant"], r["target"], r["dtype"]): r for r in kept["rows"]}
    for row in rows:
        kept_row = by[(row["kernel"], row["variant"], row["target"], row["dtype"])]
        assert {**row, "compile_s": None} == {**kept_row, "compile_s": None}


@pytest.mark.skipif(not gau_triton.TRITON_AVAILABLE, reason="triton is not installed")
def test_interpreted_kernels_are_one_clear_error(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert load_script().main(["--out", str(tmp_path / "none.json")]) == 2
    assert "TRITON_INTERPRET is set" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
