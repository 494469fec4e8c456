"""Shared pytest configuration."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _cap_onednn_isa_if_bf16_crashes() -> None:
    """Some VMs advertise AMX but do not enable it; oneDNN's bf16 matmul then dies with SIGILL.

    Probe once in a subprocess (before torch is imported here) and, only if the probe crashes, cap
    oneDNN below AMX for this test session. Machines with working AMX keep their fast path.
    """
    if "ONEDNN_MAX_CPU_ISA" in os.environ:
        return
    probe = (
        "import torch; torch.nn.functional.linear("
        "torch.ones(2, 3, 32, dtype=torch.bfloat16), torch.ones(32, 32, dtype=torch.bfloat16))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120)
    if result.returncode != 0:
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE_FP16"


_cap_onednn_isa_if_bf16_crashes()


def _interpret_triton_without_a_gpu() -> None:
    """Without CUDA, Triton kernels run in its interpreter on CPU tensors (tests/test_gau_triton.py).

    Set before the package (and so ``@triton.jit``) is imported; a machine with CUDA runs them compiled.
    """
    if os.environ.get("TRITON_INTERPRET") is None and not os.path.exists("/dev/nvidia0"):
        os.environ["TRITON_INTERPRET"] = "1"


_interpret_triton_without_a_gpu()


def _one_thread_per_xdist_worker() -> None:
    """Two xdist workers on two cores: more torch threads per worker only oversubscribe the CPU."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


_one_thread_per_xdist_worker()

# Markers that transformers' tests/test_modeling_common.py and testing_utils.is_training_test (used by
# tests/test_training_mixin.py) apply at import time; the harness imports them during collection, and
# `--strict-markers` rejects unregistered ones.
TRANSFORMERS_COMMON_TEST_MARKERS = (
    "accelerate_tests",
    "flash_attn_test",
    "flash_attn_3_test",
    "flash_attn_4_test",
    "torch_compile_test",
    "is_training_test",
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers used by the upstream common tests."""
    for name in TRANSFORMERS_COMMON_TEST_MARKERS:
        config.addinivalue_line("markers", f"{name}: used by transformers' common model tests")
