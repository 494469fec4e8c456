"""``scripts/gpu_check.sh``, the GPU check: its dry run on CPU goes through every stage the GPU run does and
writes every results file, with the keys the views read; a stage that fails or runs out of time makes the
script fail and say which; its results render into docs/benchmarks-gpu.md (``python scripts/gpu_check.py
publish``); and what pytest reports is read back right."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hf_attn_variants.bench.store import from_results
from tools.docs_results import ResultsError, render_docs, view_function

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
RESULT_FILES = ("environment-gpu.json", "tests-gpu.json", "benchmarks-gpu.json", "decoding-gpu.json")
OTHER_FILES = ("gpu-check.log", "stages.tsv")
PROVENANCE = {"kind", "command", "machine", "versions", "date", "dry_run"}

pytestmark = pytest.mark.slow  # one dry run of the whole script: about 40 s on 2 cores


def load_driver() -> ModuleType:
    """``scripts/gpu_check.py`` as a module (registered under its name, as dataclasses need)."""
    name = "gpu_check_driver"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def script_env(**extra: str) -> dict[str, str]:
    """This environment without the variables that would change what the script does (its output folder, the
    CPU mode of tests/test_cuda.py, a stage budget), plus ``extra``; the script runs with this test's
    Python."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OUT", "HF_ATTN_VARIANTS_CUDA_TESTS_ON_CPU") and not k.startswith("GPU_CHECK_")}
    return {**env, "PYTHON": sys.executable, **extra}


def run_script(out: Path, *arguments: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *arguments, "--out", str(out)], cwd=ROOT,
                          env=script_env(**env),
                          capture_output=True, text=True, timeout=timeout, check=False)


def run_dry_run(out: Path) -> Path:
    """Run the dry run into ``out``; fail with the end of its output when the script does not pass."""
    done = run_script(out, "--dry-run")
    if done.returncode != 0:
        pytest.fail(f"scripts/gpu_check.sh --dry-run exited {done.returncode}:\n{done.stdout[-6000:]}\n"
                    f"{done.stderr[-3000:]}", pytrace=False)
    return out


def read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text(encoding="utf-8"))


def test_the_script_is_executable() -> None:
    assert os.stat(SCRIPT).st_mode & 0o111, "chmod +x scripts/gpu_check.sh"
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text


def check_every_file_a_gpu_run_brings_back(dry_run: Path) -> None:
    names = sorted(p.name for p in dry_run.iterdir())
    assert names == sorted((*RESULT_FILES, *OTHER_FILES)), names
    # what comes back
    assert len(names) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in names)
    stages = [line.split("\t") for line in (dry_run / "stages.tsv").read_text().splitlines()[1:]]
    assert [(stage[0], stage[1]) for stage in stages] == [
        ("environment", "ok"), ("tests", "ok"), ("bench", "ok"), ("decoding", "ok")], stages
    for name in RESULT_FILES:
        data = read(dry_run, name)
        assert PROVENANCE <= data.keys(), (name, sorted(data))
        assert data["dry_run"] is True, name
    log = (dry_run / "gpu-check.log").read_text()
    assert "wheels:" in log and "every stage ok" in log


def check_the_environment_and_tests_files(dry_run: Path) -> None:
    environment = read(dry_run, "environment-gpu.json")
    assert environment["kind"] == "gpu_check"
    assert {"gpu", "nvidia_smi", "matmul_tflops", "packages", "wheels",
            "python"} <= environment["environment"].keys()
    assert environment["environment"]["gpu"] == {"available": False}
    tests = read(dry_run, "tests-gpu.json")["tests"]
    assert tests["status"] == "passed" and tests["exit_code"] == 0
    assert {"counts", "files", "failures", "skipped", "selection", "notes", "command",
            "duration_s"} <= tests.keys()
    # every CUDA test is selected and skips
    assert tests["counts"].get("skipped", 0) > 50 and not tests["failures"]
    assert {"tests/test_cuda.py", "tests/test_flex_attention.py", "tests/test_generation_caches.py"} <= tests[
        "files"].keys()
    for name in ("environment", "tests"):
        assert view_function("gpu_check", name)(read(dry_run, f"{name}-gpu.json")).startswith(
            "| setting | value |\n|---|---|\n| dry run | yes: on CPU")  # tables, no sentences
    shown = view_function("gpu_check", "environment")(read(dry_run, "environment-gpu.json"))
    assert "| device | no CUDA device |" in shown and "| package torch |" in shown
    shown = view_function("gpu_check", "tests")(read(dry_run, "tests-gpu.json"))
    assert "| status | **passed** |" in shown and "| exit | pytest exit status 0 |" in shown


def check_the_bench_file(dry_run: Path) -> None:
    data = read(dry_run, "benchmarks-gpu.json")
    run = from_results(data)
    assert [c.key for c in run.comparisons] == ["decoder", "flash_vs_llama"]
    assert set(run.variants) >= {"llama_sdpa", "ei_decoder_sdpa", "llama_equal_sdpa", "gau_flash_causal",
                                 "gau_flash_causal_torch"}
    assert data["gpu_check"]["complete"] is True
    failed = [(r.variant, r.length, r.reason) for r in run.results if r.status == "failed"]
    assert not failed
    measured = {(r.variant, r.phase, r.length) for r in run.results if r.status == "ok"}
    assert ("gau_flash_causal_torch", "train", 64) in measured and ("ei_decoder_sdpa", "infer",
                                                                    32) in measured


def check_the_decoding_file(dry_run: Path) -> None:
    data = read(dry_run, "decoding-gpu.json")
    settings = data["settings"]
    expected = len(data["models"]) * len(settings["batches"]) * len(settings["contexts"])
    assert len(data["models"]) == 4 and len(data["rows"]) == expected and data["gpu_check"]["complete"]
    assert "synthesizer" in settings["excluded"]
    text = view_function("decoding", "table")(data)
    assert text.startswith("| setting | value |") and "| new tokens (greedy `generate`) |" in text


def check_publish(dry_run: Path, tmp_path: Path) -> None:
    driver = load_driver()
    with pytest.raises(ResultsError, match="dry run"):
        driver.publish(dry_run, tmp_path)
    tmp_path.mkdir()
    written = driver.publish(dry_run, tmp_path, allow_dry_run=True)
    page = tmp_path / "docs" / "benchmarks-gpu.md"
    assert str(page) in written
    text = page.read_text()
    for name in ("environment-gpu environment", "tests-gpu tests", "decoding-gpu table",
                 "benchmarks-gpu report"):
        assert f"<!-- results: {name} -->" in text
    assert "## Results" in text and "FLASH GAU (Triton kernels and torch path)" in text
    assert "The CUDA test selection: its outcome" in text  # the page's own sentences, outside the regions
    assert render_docs(tmp_path, [page], check=True) == []
    assert {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*")} == {"docs"}  # nothing else


def test_the_dry_run_goes_through_every_stage_and_its_results_render(tmp_path: Path) -> None:
    """One dry run (about 40 s on 2 cores; one test, so that pytest-xdist runs it once): every file a GPU run
    brings back, with what its view reads, and docs/benchmarks-gpu.md rendered from them (a dry run refused
    for the docs)."""
    out = run_dry_run(tmp_path / "out")
    check_every_file_a_gpu_run_brings_back(out)
    check_the_environment_and_tests_files(out)
    check_the_bench_file(out)
    check_the_decoding_file(out)
    check_publish(out, tmp_path / "root")


def test_a_stage_that_fails_or_runs_out_of_time_fails_the_script(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    # pip install, the import check
    fake.write_text('#!/bin/sh\ncase "$1" in -m) exit 0 ;; -c) exit 1 ;; esac\n'
                    'case "$2" in environment) exit 1 ;; tests) exit 2 ;; *) sleep 30 ;; esac\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    done = run_script(out, "--dry-run", timeout=120, PYTHON=str(fake), GPU_CHECK_BUDGET_BENCH="1",
                      GPU_CHECK_BUDGET_DECODING="1")
    assert done.returncode == 1, done.stdout
    verdicts = [line.split("\t")[:2] for line in (out / "stages.tsv").read_text().splitlines()[1:]]
    assert verdicts == [["environment", "failed"], ["tests", "error (exit status 2)"], ["bench", "timed out"],
                        ["decoding", "timed out"]]
    assert ("not ok: environment: failed;tests: error (exit status 2);bench: timed out;decoding: timed "
            "out") in done.stdout


def test_the_bench_skips_what_its_budget_cannot_hold(tmp_path: Path) -> None:
    """With no time left after the first length of each comparison, the later lengths are recorded as skipped,
    with the budget in their reason, and the file is complete: everything that ran is in it."""
    env = script_env(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "bench", "--out", str(tmp_path),
                           "--budget", "0",
                           "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                           check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = read(tmp_path, "benchmarks-gpu.json")
    run = from_results(data)
    skipped = {(r.variant, r.length) for r in run.results if r.status == "skipped"}
    assert skipped == {(v, 64)
                       for v in ("llama_sdpa", "ei_decoder_sdpa", "llama_equal_sdpa", "gau_flash_causal",
                                         "gau_flash_causal_torch")}
    assert all("budget" in r.reason for r in run.results
               if r.status == "skipped") and data["gpu_check"]["complete"]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_cuda" name="test_a[x]" time="0.1"/>
<testcase classname="tests.test_cuda" name="test_b" time="0.1">
<failure message="AssertionError: 1 != 2 | `x`">long
text</failure></testcase>
<testcase classname="tests.test_generation_caches" name="test_c" time="0.0">
<skipped message="needs CUDA"/></testcase>
<testcase classname="tests.test_cuda" name="test_d" time="0.0">
<error message="fixture broke"/></testcase>
</testsuite></testsuites>"""


def test_pytest_outcomes_are_read_from_junit_and_from_output(tmp_path: Path) -> None:
    driver = load_driver()
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    summary = driver.summarise(driver.junit_cases(junit))
    assert summary["counts"] == {"passed": 1, "failed": 1, "skipped": 1, "errors": 1}
    assert summary["files"]["tests/test_cuda.py"] == {"passed": 1, "failed": 1, "errors": 1}
    assert summary["failures"][0] == {"test": "tests/test_cuda.py::test_b",
                                      "message": "AssertionError: 1 != 2 / 'x'"}
    assert summary["skipped"] == [{"reason": "needs CUDA",
                                   "tests": ["tests/test_generation_caches.py::test_c"]}]
    lines = ["tests/test_cuda.py::test_a[x] PASSED    [ 50%]",
             "[gw1] [ 75%] FAILED tests/test_cuda.py::test_b",
             "FAILED tests/test_cuda.py::test_b - AssertionError",
             "tests/test_cuda.py::test_e SKIPPED (why) [ 99%]"]
    cases = driver.cases_from_output(lines)
    assert [(c["test"], c["outcome"]) for c in cases] == [
        ("tests/test_cuda.py::test_a[x]", "passed"), ("tests/test_cuda.py::test_b", "failed"),
        ("tests/test_cuda.py::test_e", "skipped")]
    assert [driver.tests_status(code) for code in (0, 1, 2, 5, None)] == [
        "passed", "failed", "error", "error", "timed out"]


def gpu_environment() -> dict:
    return {"kind": "gpu_check", "command": "bash scripts/gpu_check.sh",
            "machine": "16-core CPU, NVIDIA H100",
            "versions": {"python": "3.12.3", "torch": "2.11.0+cu130"}, "date": "2026-12-01", "dry_run": False,
            "environment": {"gpu": {"available": True, "name": "NVIDIA H100 80GB HBM3", "count": 1,
                                    "capability": "9.0",
                                    "memory_gib": 79.2, "multiprocessors": 132, "cuda": "13.0",
                                    "cudnn": 91300,
                                    "bf16": True},
                            "nvidia_smi": {"query": "name, driver_version = NVIDIA H100 80GB HBM3, "
                                                    "580.159.04"},
                            "matmul_tflops": 781.4, "packages": {"torch": "2.11.0+cu130", "flash-attn": None},
                            "wheels": ["transformers-5.24.0-py3-none-any.whl"], "python": "/usr/bin/python3"}}


def test_the_environment_view_of_a_gpu_run() -> None:
    text = view_function("gpu_check", "environment")(gpu_environment())
    for row in ("| device | 1 × NVIDIA H100 80GB HBM3 |", "| compute capability | 9.0 |",
                "| memory | 79.2 GiB |", "| multiprocessors | 132 |", "| CUDA | 13.0 |"):
        assert row in text
    assert "| bf16 8192 × 8192 × 8192 matrix product | 781 TFLOP/s |" in text
    assert "| package flash-attn | not installed |" in text
    assert "transformers-5.24.0-py3-none-any.whl" in text and "dry run" not in text
    with pytest.raises(KeyError, match="without 'tests'"):
        view_function("gpu_check", "tests")(gpu_environment())
