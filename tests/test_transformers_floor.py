"""The declared floor is tested: the model tests pass on the oldest Transformers the model code supports.

``pyproject.toml`` asks for ``transformers>=5``; ``hf_attn_variants.models.compat.MIN_TRANSFORMERS_VERSION``
(5.0.0) is what the model code — the same code that ``save_pretrained`` exports — is written for. This test
runs the model test files with that release: in the cached clean environment of ``tests/remote_code.py``
(torch, safetensors, pytest, hypothesis and Transformers 5.0.0, built once in about 20 s), with this
package taken from ``src/`` through ``PYTHONPATH``. The tools (training, pruning, benchmarks) are tested with
the installed release only.

The run also takes the oneMKL code path of the CPU vendor this machine is not (``tests/mkl_dispatch.py``):
the suite covers (the lock's Transformers, this CPU's float32 products), this run (the oldest Transformers,
the other vendor's), so each axis is checked by one run of these files instead of two
(``tests/test_cpu_dispatch.py`` runs the other numerics files on that path).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hf_attn_variants.models.compat import MIN_TRANSFORMERS_VERSION
from tests.mkl_dispatch import mkl_code_path, native_env, other_vendor, vendor_env
from tests.remote_code import clean_python

REPO = Path(__file__).resolve().parents[1]
MODEL_TEST_FILES = (
    "tests/test_layers.py",
    "tests/test_configuration.py",
    "tests/test_entropy_invariant.py",
    "tests/test_gau.py",
    "tests/test_synthesizer.py",
    "tests/test_generation_caches.py",
    "tests/test_gradcheck.py",
    "tests/test_stock_attention.py",
    "tests/test_packed_documents.py",
    "tests/test_flash_left_padding.py",
    "tests/test_model_inputs.py",
)


def test_model_tests_pass_on_the_oldest_supported_transformers() -> None:
    python = clean_python(MIN_TRANSFORMERS_VERSION)
    env = {k: v for k, v in vendor_env(other_vendor()).items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_XDIST_WORKER")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]), HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1")
    version = subprocess.run([str(python), "-c", "import transformers; print(transformers.__version__)"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert version == MIN_TRANSFORMERS_VERSION
    own_path = mkl_code_path(native_env(env), str(python))
    other_path = mkl_code_path(env, str(python))
    assert other_path != own_path, f"the {other_vendor()!r} shim left oneMKL on its own path: {own_path}"
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODEL_TEST_FILES],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, (f"model tests on transformers {version}, oneMKL's path {other_path!r}:\n"
                                    f"{result.stdout[-6000:]}\n{result.stderr[-2000:]}")
    assert " passed" in summary and "failed" not in summary, summary
