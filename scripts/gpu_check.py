#!/usr/bin/env python
"""The stages of ``scripts/gpu_check.sh``: every GPU number in one command, each stage's results file written
to the output folder as soon as the stage (or, for the benchmarks, each length or model) is done.

Stages (``scripts/gpu_check.sh`` runs them in this order, each under its own time budget)::

    gpu_check.py environment --out DIR  # environment-gpu.json: GPU, driver, versions, wheels (20 s)
    gpu_check.py tests --out DIR        # tests-gpu.json: the CUDA test selection, summarised (110 s)
    gpu_check.py bench --out DIR        # benchmarks-gpu.json: the bench's format, kind bench (120 s)
    gpu_check.py decoding --out DIR     # decoding-gpu.json: scripts/decoding_bench.py's format (40 s)

(each ``python scripts/gpu_check.py …``; in brackets each stage's default ``--budget``;
``scripts/gpu_check.sh`` passes the same, ``GPU_CHECK_BUDGET_<STAGE>`` overrides them there).

``--dry-run`` runs the same steps on CPU with tiny sizes (every CUDA test skips; GAU's Triton kernels run in
Triton's interpreter, ``TRITON_INTERPRET=1``, set by ``scripts/gpu_check.sh``), for
``tests/test_gpu_check.py``.

Publishing what a GPU run brought back (from the repository root, in the development environment)::

    python scripts/gpu_check.py publish DIR  # DIR/*-gpu.json → docs/results/, plots, docs/benchmarks-gpu.md

Exit status: 0 when the stage ran and everything in it passed; 1 when it ran but something failed (a test, a
measured row) — its results file says what; 2 when the stage could not run (the message names what failed).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import ResultsError, format_results, read_results_file, render_docs  # noqa: E402
from tools.docs_results._common import machine_description, run_metadata  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KIND = "gpu_check"

RESULT_FILES = ("environment-gpu", "tests-gpu", "benchmarks-gpu", "decoding-gpu")
"""The results files a run writes to its output folder (``<name>.json``), one per stage, in stage order."""

PAGE = Path("docs") / "benchmarks-gpu.md"
PAGE_SECTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("environment-gpu", "environment", "",
     "The machine: the GPU, its driver, the speed of one bf16 matrix product, and the versions of the "
     "packages the check used (and the wheels it brought along)."),
    ("tests-gpu", "tests", "## CUDA tests",
     "The CUDA test selection: its outcome and command, the counts per test file, the run's notes, each "
     "failure with its message, and the skipped tests grouped by reason."),
    ("decoding-gpu", "table", "## Decoding",
     "Greedy `generate` of the settings' number of new tokens after a random prompt of the context's length. "
     "A cell of the second table is tokens per second (batch ÷ the median decoding step; in brackets ÷ the "
     "Llama's) and that median step; the prefill is not in it."),
    ("benchmarks-gpu", "report", "", ""),
)
"""(results file, view, heading, the page's own sentence before the region) of docs/benchmarks-gpu.md, in page
order; a section is there only when its file is."""

PACKAGES = ("torch", "triton", "transformers", "accelerate", "peft", "safetensors", "huggingface_hub",
            "tokenizers",
            "numpy", "pytest", "pytest-xdist", "hypothesis", "flash-attn", "datasets", "torchdata")
"""Packages whose versions the environment stage records (``None``: not installed)."""

PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4), ("GH200", 989.4),
    ("A100", 312.0), ("L40S", 362.0),
)
"""Dense bf16 tensor-core peak (TFLOP/s, NVIDIA's data sheets) by a substring of the GPU's name, first match
wins: the denominator of the bench's MFU column. Another GPU gets no MFU unless ``--peak-tflops`` is given."""


# ---------------------------------------------------------------------------------------------- common
def command_line(dry_run: bool) -> str:
    """The command a results file records as its provenance."""
    return "bash scripts/gpu_check.sh" + (" --dry-run" if dry_run else "")


def provenance(dry_run: bool) -> dict[str, Any]:
    """The provenance fields (kind ``gpu_check``, command, machine, versions with triton's, date) and
    ``dry_run``."""
    triton = package_version("triton")
    return {**run_metadata(KIND, command_line(dry_run), **({"triton": triton} if triton else {})),
            "dry_run": dry_run}


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def write_json(out: Path, name: str, data: dict[str, Any]) -> Path:
    """Write ``out/<name>.json`` at once (a temporary file renamed over it), so a stage stopped at its time
    limit leaves the previous complete version, never half a file."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    partial_path = out / f"{name}.json.tmp"
    partial_path.write_text(format_results(data, inline_depth=2), encoding="utf-8")
    os.replace(partial_path, path)
    return path


@dataclass
class Budget:
    """A stage's time budget: ``fits(seconds)`` says whether a step predicted to take that long ends inside
    it."""

    seconds: float
    margin: float = 10.0
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def fits(self, predicted: float) -> bool:
        return predicted + self.margin <= self.left()


def log(message: str) -> None:
    print(f"gpu-check: {message}", flush=True)


# ---------------------------------------------------------------------------------------------- environment
def gpu_facts() -> dict[str, Any]:
    """What torch sees of the GPU (``{"available": False}`` without one)."""
    if not torch.cuda.is_available():
        return {"available": False}
    props = torch.cuda.get_device_properties(0)
    return {"available": True, "name": props.name, "count": torch.cuda.device_count(),
            "capability": f"{props.major}.{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "bf16": torch.cuda.is_bf16_supported()}


def nvidia_smi() -> dict[str, str]:
    """``nvidia-smi``'s name, driver, memory, clocks and power limit, or the reason it could not run."""
    fields = "name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu"
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": f"not run ({type(error).__name__}: {error})"}
    if done.returncode != 0:
        return {"error": f"exit status {done.returncode}: {' '.join(done.stderr.split())[:300]}"}
    return {"query": f"{fields.replace(',', ', ')} = " + "; ".join(done.stdout.strip().splitlines())}


def matmul_tflops(size: int = 8192, repeats: int = 10) -> float | None:
    """bf16 ``size``³ matrix products per second on the GPU (after 3 warm-ups), in TFLOP/s; ``None`` without
    CUDA."""
    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def environment_stage(args: argparse.Namespace) -> int:
    """environment-gpu.json; status 2 when a real run finds no CUDA device (the file says what it found)."""
    wheels = [name for name in os.environ.get("GPU_CHECK_WHEELS", "").split() if name]
    environment = {
        "gpu": gpu_facts(), "nvidia_smi": nvidia_smi(), "matmul_tflops": matmul_tflops(),
        "packages": {name: package_version(name) for name in PACKAGES}, "wheels": wheels,
        "python": sys.executable, "triton_interpret": os.environ.get("TRITON_INTERPRET"),
    }
    path = write_json(args.out, "environment-gpu", {**provenance(args.dry_run), "environment": environment})
    if not args.dry_run and not environment["gpu"]["available"]:
        log("environment: torch sees no CUDA device (torch.cuda.is_available() is False); on CPU use "
            "--dry-run")
        return 2
    log(f"environment: {environment['gpu'].get('name', 'no CUDA device')}, torch {torch.__version__}, "
        f"triton {environment['packages']['triton']}, transformers {environment['packages']['transformers']} "
        f"→ {path}")
    return 0


# ---------------------------------------------------------------------------------------------- tests
CUDA_TESTS = (
    "tests/test_cuda.py",
    "tests/test_flex_attention.py::test_flex_attention_decodes_with_a_cache_like_sdpa",
    "tests/test_generation_caches.py::test_offloaded_caches_generate_what_the_dynamic_cache_does",
    "tests/test_generation_caches.py::test_flash_gau_refuses_a_static_cache_in_one_sentence[offloaded_static]",
)
"""The tests that need CUDA: tests/test_cuda.py (GAU's Triton kernels compiled against the torch path, bf16
training steps of every family, the entropy-invariant family under sdpa / flash_attention_2 / flex_attention
with backward, packed FLASH on CUDA tensors) and the CUDA-only tests of other files, by node id."""

OPTIONAL_TESTS = (("tests/test_packed_flash.py", "packed FLASH in linear time (issue 38)"),)
"""Files selected by name when this checkout has them: (path, what they check). Like tests/test_gau_triton.py
they check the Triton kernels on CPU tensors, which only Triton's interpreter runs, so they run in a second
pytest run with ``TRITON_INTERPRET=1``, as ``make test`` runs them on a machine without a GPU: the device's
torch, Triton and Transformers under the same checks. Packed FLASH on CUDA tensors, compiled, is in
tests/test_cuda.py."""

TEST_TIMEOUT_S = 90
"""Seconds one test may take (compiling kernels included) before pytest-timeout fails it and the others go
on."""

RESULT_WORD = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
NODE_ID = re.compile(r"(tests/\S+\.py::\S+)")


@dataclass
class PytestRun:
    """What one pytest run did: exit status (``None`` when stopped at its time limit), output lines,
    seconds."""

    exit_code: int | None
    lines: list[str]
    seconds: float


def tests_selection(root: Path) -> tuple[list[str], list[str], list[str]]:
    """(CUDA node ids, optional files this checkout has, notes on the optional files it lacks)."""
    present, notes = [], []
    for path, purpose in OPTIONAL_TESTS:
        if (root / path).is_file():
            present.append(path)
        else:
            notes.append(f"`{path}` ({purpose}) is not in this checkout: not selected.")
    return list(CUDA_TESTS), present, notes


def stop_group(process: subprocess.Popen) -> None:
    """Kill ``process`` and everything it started (its own process group: pytest-xdist's workers too)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_streaming(command: list[str], env: dict[str, str], timeout: float, cwd: Path) -> PytestRun:
    """Run ``command`` in a process group of its own, echoing and keeping its output lines; after ``timeout``
    seconds, or when this process is told to stop (SIGTERM), kill the group (then the exit status is
    ``None``)."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               cwd=cwd,
                               start_new_session=True)
    stopped = threading.Event()

    def stop(*_: Any) -> None:
        stopped.set()
        stop_group(process)

    previous = signal.signal(signal.SIGTERM, lambda *_: (stop(), sys.exit(124)))
    timer = threading.Timer(max(timeout, 1.0), stop)
    timer.start()
    lines = []
    try:
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
        process.wait()
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    return PytestRun(None if stopped.is_set() else process.returncode, lines, time.monotonic() - start)


def one_line(text: str | None, limit: int = 300) -> str:
    """``text`` on one line, without backticks or table bars, at most ``limit`` characters."""
    flat = " ".join((text or "").replace("`", "'").replace("|", "/").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def junit_cases(path: Path) -> list[dict[str, str]]:
    """``[{test, file, outcome, message}]`` of a pytest junit XML file (outcome: passed, failed, errors,
    skipped)."""
    outcomes = (("failure", "failed"), ("error", "errors"), ("skipped", "skipped"))
    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        file = case.get("classname", "").replace(".", "/") + ".py"
        outcome, message = "passed", ""
        for tag, name in outcomes:
            found = case.find(tag)
            if found is not None:
                text = (found.text or "").strip().splitlines()
                outcome, message = name, found.get("message") or (text[-1] if text else "")
                break
        cases.append({"test": f"{file}::{case.get('name')}", "file": file, "outcome": outcome,
                      "message": one_line(message)})
    return cases


def cases_from_output(lines: list[str]) -> list[dict[str, str]]:
    """The outcomes ``pytest -v`` printed (for a run stopped before it wrote its junit file)."""
    words = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors",
             "SKIPPED": "skipped",
             "XFAIL": "skipped"}
    cases = {}
    for line in lines:
        node, word = NODE_ID.search(line), RESULT_WORD.search(line)
        if node and word and not line.startswith(("FAILED ", "ERROR ", "SKIPPED ")):
            test = node.group(1)
            cases[test] = {"test": test, "file": test.split("::")[0], "outcome": words[word.group(1)],
                           "message": ""}
    return list(cases.values())


def summarise(cases: list[dict[str, str]]) -> dict[str, Any]:
    """Counts (overall and per file), failures with their messages, skips grouped by reason."""
    counts: dict[str, int] = {}
    files: dict[str, dict[str, int]] = {}
    skipped: dict[str, list[str]] = {}
    for case in cases:
        counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
        per_file = files.setdefault(case["file"], {})
        per_file[case["outcome"]] = per_file.get(case["outcome"], 0) + 1
        if case["outcome"] == "skipped":
            skipped.setdefault(case["message"] or "(no reason given)", []).append(case["test"])
    failures = [{"test": c["test"], "message": c["message"]} for c in cases
                if c["outcome"] in ("failed", "errors")]
    return {"counts": counts, "files": files, "failures": failures,
            "skipped": [{"reason": reason, "tests": tests} for reason, tests in skipped.items()]}


def pytest_command(selection: Sequence[str], junit: Path, workers: int) -> list[str]:
    """pytest over ``selection``, verbose (outcomes can be read from its output), with a junit file,
    ``workers`` pytest-xdist processes where it is installed, and at most ``TEST_TIMEOUT_S`` per test with
    pytest-timeout."""
    xdist = ["-n", str(workers)] if workers > 1 and importlib.util.find_spec("xdist") else []
    timeout = [f"--timeout={TEST_TIMEOUT_S}"] if importlib.util.find_spec("pytest_timeout") else []
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rfEs", f"--junitxml={junit}",
            *xdist,
            *timeout, *selection]


def tests_status(exit_code: int | None) -> str:
    """pytest's exit status in a word: 1 is failing tests; 2–5 (interrupted, internal or usage error, nothing
    collected) mean the selection could not run."""
    if exit_code is None:
        return "timed out"
    return {0: "passed", 1: "failed"}.get(exit_code, "error")


def pytest_cases(selection: Sequence[str], env: dict[str, str], workers: int, timeout: float,
                 notes: list[str]) -> tuple[PytestRun, list[dict[str, str]], str]:
    """Run ``selection``; (the run, its test outcomes, the command as recorded). A run stopped at ``timeout``
    keeps the outcomes it printed, and says so in ``notes``."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-junit-") as scratch:
        junit = Path(scratch) / "junit.xml"
        command = pytest_command(selection, junit, workers)
        run = run_streaming(command, env, timeout, ROOT)
        if run.exit_code is not None and junit.is_file():
            cases = junit_cases(junit)
        else:
            cases = cases_from_output(run.lines)
            notes.append(f"pytest over {' '.join(selection)} was stopped at the stage's time budget: the "
                         "outcomes are those it printed before.")
    if tests_status(run.exit_code) == "error":
        notes.append("pytest could not run the selection: " + one_line(" ".join(run.lines[-5:]), 500))
    shown = [a for a in command[1:] if not a.startswith("--junitxml")]
    return run, cases, shlex.join(["python", *shown])


def interpreted_tests(present: list[str], env: dict[str, str], budget: Budget,
                      notes: list[str]) -> tuple[list[PytestRun], list[dict[str, str]], list[str]]:
    """The optional files in a pytest run of their own under ``TRITON_INTERPRET=1``; (runs, outcomes,
    commands)."""
    if not present:
        return [], [], []
    files = ", ".join(f"`{p}`" for p in present)
    if budget.left() - budget.margin < 15:
        notes.append(f"{files}: not run, the stage's time budget was spent on the CUDA tests.")
        return [], [], []
    notes.append(f"{files}: run with `TRITON_INTERPRET=1` (their Triton checks use CPU tensors); packed "
                 "FLASH compiled on CUDA tensors is in `tests/test_cuda.py`.")
    run, cases, command = pytest_cases(present, {**env, "TRITON_INTERPRET": "1"}, 0,
                                       budget.left() - budget.margin,
                                       notes)
    return [run], cases, [f"TRITON_INTERPRET=1 {command}"]


def deselected(lines: list[str]) -> int:
    """How many tests pytest's last summary line says it deselected."""
    found = [int(m.group(1)) for line in lines if (m := re.search(r"(\d+) deselected", line))]
    return found[-1] if found else 0


def tests_stage(args: argparse.Namespace) -> int:
    """The CUDA tests (pytest-xdist workers on the GPU), then the optional files interpreted. A dry run makes
    one pytest run on CPU in which every CUDA test skips and the optional files are collected (imported), not
    run: on CPU they are part of ``make test``."""
    budget = Budget(args.budget, margin=5.0)
    selection, present, notes = tests_selection(ROOT)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.dry_run:
        extra = [*present, *(f"--deselect={path}" for path in present)]
        run, cases, command = pytest_cases([*selection, *extra], env, 0, budget.left() - budget.margin, notes)
        if present:
            notes.append(f"dry run: {deselected(run.lines)} tests of {', '.join(f'`{p}`' for p in present)} "
                         "collected, not run.")
        runs, commands = [run], [command]
    else:
        share = 0.75 if present else 1.0  # the interpreted files take the rest
        run, cases, command = pytest_cases(selection, env, args.workers,
                                           share * budget.left() - budget.margin, notes)
        more_runs, more_cases, more_commands = interpreted_tests(present, env, budget, notes)
        runs, cases, commands = [run, *more_runs], cases + more_cases, [command, *more_commands]
    summary = summarise(cases)
    statuses = [tests_status(r.exit_code) for r in runs]
    status = next((s for s in ("error", "timed out", "failed") if s in statuses), "passed")
    tests = {"status": status, "exit_code": next((r.exit_code for r in runs if r.exit_code != 0), 0),
             "duration_s": round(sum(r.seconds for r in runs), 1), "command": " && ".join(commands),
             "selection": [*selection, *present], "notes": notes, **summary}
    path = write_json(args.out, "tests-gpu", {**provenance(args.dry_run), "tests": tests})
    log(f"tests: {status}: {summary['counts']} in {tests['duration_s']:.0f} s → {path}")
    return {"passed": 0, "failed": 1}.get(status, 2)


# ---------------------------------------------------------------------------------------------- bench
@dataclass(frozen=True)
class BenchPart:
    """Variants measured side by side at ``lengths``, one bench run per length (so each length is saved at
    once)."""

    comparison: Any
    variants: dict[str, Any]
    lengths: tuple[int, ...]
    growth: float
    """Predicted time factor from one length to the next (2 for linear time, 4 for quadratic)."""


FLASH_NOTE = (
    "FLASH's training-speed claim (Hua et al. 2022) is against Transformer++ at equal parameters: a stock "
    "`LlamaModel` (SDPA: FlashAttention's kernel inside torch on a GPU, RoPE, gated SiLU MLP) with one layer "
    "per two GAU layers and the MLP width that makes its parameters outside the embeddings those of our "
    "causal FLASH GAU (`bench/specs.py:equal_parameter_intermediate`). `gau_flash_causal` runs GAU's Triton "
    "kernels for the attention inside the chunks (`gau_kernel=\"triton\"`), `gau_flash_causal_torch` the "
    "torch path (`gau_kernel=\"torch\"`). FLOPs count matrix products seen by torch: the Triton kernels' own "
    "products are not counted, so FLASH's GFLOP/s and MFU are lower bounds.")


OPTIONAL_FLASH_VARIANTS = ("gau_flash_causal_packed",)
"""Variants of ``bench/specs.py`` measured with FLASH when they exist: packed documents (at the lengths they
list)."""


def on_device(build: Callable[[int], torch.nn.Module], device: str, length: int) -> torch.nn.Module:
    """``build(length)`` with its parameters created on ``device`` (no copy from the CPU)."""
    with torch.device(device):
        return build(length)


def bench_preset(dry_run: bool) -> Any:
    """The GPU preset (~110M-parameter models, BERT-base widths; GAU 24 layers) with the check's repeats, or
    tiny models for a dry run. No compiled rows: compiling every model at every length does not fit the
    budget."""
    from hf_attn_variants.bench.specs import PRESETS

    if dry_run:
        return replace(PRESETS["quick"], name="gpu-check-dry-run", lengths=(32, 64),
                       equal_parameter_lengths=(64,),
                       compile_lengths=())
    return replace(PRESETS["gpu"], name="gpu-check", lengths=(2048, 4096, 8192, 16384, 32768, 65536),
                   equal_parameter_lengths=(65536,), compile_lengths=(), prune_lengths=(512,), repeats=5,
                   long_repeats=3, long_from=32768, short_repeats=5)


def bench_parts(preset: Any, dry_run: bool, device: str) -> list[BenchPart]:
    """Entropy-invariant vs Llama decoders (2k–16k), then FLASH (Triton, torch path) vs Llama at equal
    parameters (4k–64k); a dry run measures both at the preset's tiny lengths."""
    from hf_attn_variants.bench.specs import COMPARISONS, Comparison, Variant, build_variants, gau_model

    def placed(variant: Any) -> Any:  # built on the device; measured at the part's lengths only
        return replace(variant, build=partial(on_device, variant.build, device), extra_lengths=())

    stock = build_variants(preset)
    decoder = next(c for c in COMPARISONS if c.key == "decoder")
    flash = partial(gau_model, preset, normalization="relu2", chunk=preset.gau_chunk_size, causal=True)
    chunks = f"GAUModel relu², FLASH chunks of {preset.gau_chunk_size}, causal"
    no_triton = {} if importlib.util.find_spec("triton") else {"max_length": 0,
                                                               "skip_reason": "triton is not installed"}
    flash_variants = {
        "llama_equal_sdpa": stock["llama_equal_sdpa"],
        "gau_flash_causal": Variant("gau_flash_causal", "gau", f"{chunks}, Triton kernels",
                                    partial(flash, kernel="triton"),
                                    causal=True, **no_triton),
        "gau_flash_causal_torch": Variant("gau_flash_causal_torch", "gau", f"{chunks}, torch path",
                                          partial(flash, kernel="torch"), causal=True),
    }
    for name in OPTIONAL_FLASH_VARIANTS:  # the bench's own rows, where this checkout has them
        if name in stock:
            flash_variants[name] = stock[name]
    comparison = Comparison("flash_vs_llama",
                            "FLASH GAU (Triton kernels and torch path) vs Llama (SDPA) at equal "
                            "parameters, causal", "llama_equal_sdpa", tuple(flash_variants)[1:],
                            note=FLASH_NOTE)
    tiny = preset.lengths if dry_run else None
    return [
        BenchPart(decoder, {n: placed(stock[n]) for n in (decoder.baseline, *decoder.variants)},
                  tiny or (2048, 4096, 8192, 16384), growth=3.0),
        BenchPart(comparison, {n: placed(v) for n, v in flash_variants.items()},
                  tiny or (4096, 8192, 16384, 32768, 65536), growth=2.5),
    ]


def peak_tflops(explicit: float | None) -> float | None:
    """``--peak-tflops``, else the data-sheet peak of this GPU (``PEAK_BF16_TFLOPS``), else ``None``."""
    if explicit or not torch.cuda.is_available():
        return explicit
    name = torch.cuda.get_device_name(0)
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)


def budget_skips(part: BenchPart, length: int, batch: int, seconds: float) -> list[Any]:
    """Skipped rows of every variant of ``part`` at ``length``: the stage's time budget would not hold
    them."""
    from hf_attn_variants.bench.runner import PHASES, Result

    reason = f"not run: the GPU check's bench budget ({seconds:.0f} s) would be exceeded"
    return [Result(name, variant.family, "eager", phase, length, batch, "skipped", reason)
            for name, variant in part.variants.items() if variant.lengths is None or length in variant.lengths
            for phase in PHASES]


def add_run(total: Any, part: Any) -> Any:
    """``total`` (a ``BenchRun``, or ``None``) with the rows, variants and comparisons of ``part`` added."""
    if total is None:
        return part
    total.results += part.results
    for name, info in part.variants.items():
        total.variants[name] = {**total.variants.get(name, {}), **info}
    known = {c.key for c in total.comparisons}
    total.comparisons += tuple(c for c in part.comparisons if c.key not in known)
    total.elapsed_s += part.elapsed_s
    total.environment["load_average_end"] = part.environment.get("load_average_end")
    total.preset = replace(total.preset, lengths=tuple(sorted({*total.preset.lengths, *part.preset.lengths})))
    return total


def bench_results(total: Any, complete: bool, budget: Budget, dry_run: bool) -> dict[str, Any]:
    """The bench's results file (``store.to_results``) with ``dry_run`` and whether every part and length
    ran."""
    from hf_attn_variants.bench.store import to_results

    return {**to_results(total), "dry_run": dry_run,
            "gpu_check": {"complete": complete, "budget_s": budget.seconds}}


def stage_device(args: argparse.Namespace, stage: str) -> str | None:
    """The device a measuring stage runs on: the CPU for a dry run, else CUDA (``None``, after a log line,
    when torch sees no CUDA device)."""
    if args.dry_run:
        return "cpu"
    if not torch.cuda.is_available():
        log(f"{stage}: torch sees no CUDA device (torch.cuda.is_available() is False)")
        return None
    return "cuda"


def bench_stage(args: argparse.Namespace) -> int:
    """benchmarks-gpu.json, rewritten after every length; a length the budget cannot hold is recorded as
    skipped. Status 1 when a row failed (e.g. out of memory: the bench records it and goes on)."""
    from hf_attn_variants.bench.runner import Runner

    budget = Budget(args.budget)
    device = stage_device(args, "bench")
    if device is None:
        return 2
    preset = bench_preset(args.dry_run)
    peak, total, command = peak_tflops(args.peak_tflops), None, command_line(args.dry_run)
    for part in bench_parts(preset, args.dry_run, device):
        last = None
        for length in part.lengths:
            if last is not None and not budget.fits(last * part.growth):
                log(f"bench: {part.comparison.key} n = {length} skipped (budget: {budget.left():.0f} s left)")
                total.results += budget_skips(part, length, preset.batch_size, budget.seconds)
                total.preset = replace(total.preset, lengths=tuple(sorted({*total.preset.lengths, length})))
                continue
            started = time.monotonic()
            runner = Runner(replace(preset, lengths=(length,)), part.variants, (part.comparison,),
                            device=device,
                            dtype="float32" if args.dry_run else "bfloat16", timer="wall",
                            threads=1 if args.dry_run else None,
                            compile=False, count_flops=True, check_graph_breaks=False, peak_tflops=peak,
                            log=log)
            run = runner.run_all()
            del runner  # its models: the next length builds its own
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
            run.environment["command"] = command
            total = add_run(total, run)
            last = time.monotonic() - started
            write_json(args.out, "benchmarks-gpu", bench_results(total, False, budget, args.dry_run))
    path = write_json(args.out, "benchmarks-gpu", bench_results(total, True, budget, args.dry_run))
    failed = [f"{r.variant} n={r.length} {r.phase}: {r.reason}" for r in total.results
              if r.status == "failed"]
    log(f"bench: {len(total.results)} rows, {len(failed)} failed, in {total.elapsed_s:.0f} s → {path}")
    for line in failed:
        log(f"  failed: {line}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------- decoding
DECODING_MODELS = ("llama", "entropy_invariant", "gau_softmax_plus", "gau_flash")
DECODING_EXCLUDED = {
    "synthesizer": ("its prefill materialises batch × heads × n² mixed attention scores (about 51 GB at "
                    "batch 64, 12 heads, n = 4096, float32), and its learned l × l patterns hold 2.4G "
                    "parameters at l = 4128"),
}
"""The decoders of ``bench/decoding.py`` the GPU check times, and the one it leaves out, with the reason."""


def decoding_settings(dry_run: bool) -> dict[str, Any]:
    """Sizes of the decoding table: BERT-base widths (GAU with twice the layers) in bf16, batch 1 and 64,
    contexts 512 and 4096; a dry run's tiny models in float32."""
    from hf_attn_variants.bench.decoding import DecodingSize

    if dry_run:
        size = DecodingSize(hidden_size=64, num_layers=2, num_heads=4, llama_intermediate=168,
                            gau_key_size=16,
                            gau_chunk_size=16)
        return {"size": size, "batches": [1, 2], "contexts": [16], "new_tokens": 4, "dtype": "float32"}
    size = DecodingSize(vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12,
                        llama_intermediate=2048,
                        gau_key_size=128, gau_chunk_size=256)
    return {"size": size, "batches": [1, 64], "contexts": [512, 4096], "new_tokens": 32, "dtype": "bfloat16"}


def decoding_stage(args: argparse.Namespace) -> int:
    """decoding-gpu.json, rewritten after every model; a model that fails (e.g. out of memory) is recorded and
    the others still run (status 1), one the budget cannot hold is recorded as skipped."""
    from hf_attn_variants.bench.decoding import DECODERS, measure

    budget = Budget(args.budget)
    device = stage_device(args, "decoding")
    if device is None:
        return 2
    plan = decoding_settings(args.dry_run)
    size, dtype = plan["size"], plan["dtype"]
    settings = {"batches": plan["batches"], "contexts": plan["contexts"], "new_tokens": plan["new_tokens"],
                "threads": torch.get_num_threads(), "size": asdict(size),
                "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "dtype": dtype,
                "excluded": DECODING_EXCLUDED}
    data = {**run_metadata("decoding", command_line(args.dry_run), machine=machine_description()),
            "dry_run": args.dry_run, "settings": settings, "models": {}, "rows": [],
            "gpu_check": {"complete": False}}
    last, failed = None, []
    for name in DECODING_MODELS:
        if last is not None and not budget.fits(last * 1.5):
            data["gpu_check"].setdefault("skipped", []).append(name)
            log(f"decoding: {name} skipped (budget: {budget.left():.0f} s left)")
            continue
        started = time.monotonic()
        try:
            rows = measure([name], plan["batches"], plan["contexts"], plan["new_tokens"], size, log=log,
                           device=device, dtype=getattr(torch, dtype))
        except Exception as error:  # noqa: BLE001 - e.g. out of memory: recorded, the other models still run
            failed.append(f"{name}: {type(error).__name__}: {one_line(str(error), 200)}")
            data["gpu_check"].setdefault("failed", []).append(failed[-1])
            log(f"decoding: {failed[-1]}")
            continue
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        last = time.monotonic() - started
        data["models"][name] = DECODERS[name][0]
        data["rows"] += [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
                         for row in rows]
        write_json(args.out, "decoding-gpu", data)
    data["gpu_check"]["complete"] = True
    path = write_json(args.out, "decoding-gpu", data)
    log(f"decoding: {len(data['rows'])} rows, {len(failed)} models failed → {path}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------- publish
def read_results(folder: Path, name: str) -> dict[str, Any] | None:
    """``folder/<name>.json`` (``None`` when the run did not bring it back); ``ResultsError`` naming a broken
    one."""
    path = folder / f"{name}.json"
    return read_results_file(path) if path.is_file() else None


def page_text(present: Sequence[str]) -> str:
    """docs/benchmarks-gpu.md with an empty region per results file in ``present`` (filled by rendering)."""
    intro = ("What `bash scripts/gpu_check.sh` measured on a machine with a CUDA GPU ([how to run it]"
             "(../CONTRIBUTING.md#the-gpu-check)), published with `python scripts/gpu_check.py publish DIR`. "
             "Do not edit by hand: every section is rendered from `docs/results/*-gpu.json`.")
    parts = ["# GPU benchmarks", "", intro, ""]
    for name, view, heading, sentence in PAGE_SECTIONS:
        if name in present:
            parts += ([heading, ""] if heading else []) + ([sentence, ""] if sentence else []) + [
                f"<!-- results: {name} {view} -->", "<!-- /results -->", ""]
    return "\n".join(parts)


def publish(folder: Path, root: Path, allow_dry_run: bool = False) -> list[str]:
    """Copy the results files of ``folder`` into ``root/docs/results/``, draw the bench plots, write and
    render ``root/docs/benchmarks-gpu.md``; returns the files written. ``ResultsError`` when ``folder`` holds
    none, or a dry run's files (unless ``allow_dry_run``)."""
    from hf_attn_variants.bench.plots import write_plots
    from hf_attn_variants.bench.store import from_results, plot_prefix

    found = {name: data for name in RESULT_FILES if (data := read_results(folder, name)) is not None}
    if not found:
        raise ResultsError(f"{folder}: none of {', '.join(f'{n}.json' for n in RESULT_FILES)} (the GPU "
                           "check's output folder?).")
    dry = [name for name, data in found.items() if data.get("dry_run")]
    if dry and not allow_dry_run:
        raise ResultsError(f"{folder}: {', '.join(dry)} come from a dry run on CPU; publish the results of a "
                           "GPU run.")
    written = []
    for name, data in found.items():
        target = root / "docs" / "results" / f"{name}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(format_results(data, inline_depth=2), encoding="utf-8")
        written.append(str(target))
    if "benchmarks-gpu" in found:
        run = from_results(found["benchmarks-gpu"])
        written += [str(p) for p in write_plots(run, root / "docs", prefix=plot_prefix(run.device))]
    page = root / PAGE
    page.write_text(page_text(list(found)), encoding="utf-8")
    render_docs(root, [page])
    return [*written, str(page)]


def publish_command(args: argparse.Namespace) -> int:
    try:
        written = publish(args.folder, args.root, args.allow_dry_run)
    except ModuleNotFoundError as error:
        print(f"gpu_check publish: error: {error.name} is not installed (the plots need it): "
              "pip install 'hf_attn_variants[plots]'", file=sys.stderr)
        return 2
    except (ResultsError, ValueError, KeyError) as error:
        print(f"gpu_check publish: error: {one_line(str(error), 1000)}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(written))
    return 0


# ---------------------------------------------------------------------------------------------- command line
def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.splitlines()[0])
    stages = main.add_subparsers(dest="stage", required=True)
    for name, budget in (("environment", 20.0), ("tests", 110.0), ("bench", 120.0), ("decoding", 40.0)):
        stage = stages.add_parser(name, help=f"the {name} stage")
        stage.add_argument("--out", type=Path, required=True, help="Folder for the results file.")
        stage.add_argument("--budget", type=float, default=budget, help=f"Seconds (default {budget:.0f}).")
        stage.add_argument("--dry-run", action="store_true", help="On CPU with tiny sizes.")
        if name == "tests":
            stage.add_argument("--workers", type=int, default=6,
                               help="pytest-xdist workers sharing the GPU (default 6: compiling kernels is "
                                    "CPU work).")
        if name == "bench":
            stage.add_argument("--peak-tflops", type=float, default=None,
                               help="The GPU's bf16 peak for the MFU column (default: by its name).")
    publisher = stages.add_parser("publish",
                                  help="copy a run's results into docs/results and render the page")
    publisher.add_argument("folder", type=Path, help="The folder the GPU check wrote (its OUT).")
    publisher.add_argument("--root", type=Path, default=ROOT,
                           help="Repository root (default: this checkout).")
    publisher.add_argument("--allow-dry-run", action="store_true",
                           help="Publish a dry run's files (tests only).")
    return main


STAGES: dict[str, Callable[[argparse.Namespace], int]] = {
    "environment": environment_stage, "tests": tests_stage, "bench": bench_stage, "decoding": decoding_stage,
    "publish": publish_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one stage; an exception it does not handle is printed with its traceback and ends it with status
    2."""
    args = parser().parse_args(argv)
    try:
        return STAGES[args.stage](args)
    except Exception as error:  # noqa: BLE001 - the stage could not run: say which and why, keep the traceback
        traceback.print_exc()
        log(f"{args.stage}: error: {type(error).__name__}: {one_line(str(error), 500)}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
