#!/usr/bin/env python
"""The stages of ``scripts/gpu_check.sh``: every GPU number in one command, each stage's results file written
to the output folder as soon as the stage (or, for the benchmarks, each length or model) is done.

Stages (``scripts/gpu_check.sh`` runs them in this order, each under its own time budget; ``--part tests``
the first three, ``--part perf`` environment, bench, peers and decoding)::

    gpu_check.py environment --out DIR  # environment-gpu.json: GPU, driver, versions, wheels (25 s)
    gpu_check.py tests --out DIR        # tests-gpu.json: CUDA tests, then model tests on CPU tensors (185 s)
    gpu_check.py wheel --out DIR        # wheel-gpu.json: the wheel on this torch, README quickstarts (80 s)
    gpu_check.py bench --out DIR        # benchmarks-gpu.json: the bench's format, kind bench (60 s)
    gpu_check.py peers --out DIR        # peers-gpu.json: FLASH vs FLASH-pytorch vs Llama causal LMs, kind
                                        # side_by_side (bench/side_by_side.py) (75 s)
    gpu_check.py decoding --out DIR     # decoding-gpu.json: scripts/decoding_bench.py's format (130 s)

(each ``python scripts/gpu_check.py …``; in brackets each stage's default ``--budget``;
``scripts/gpu_check.sh`` passes the same, ``GPU_CHECK_BUDGET_<STAGE>`` overrides them there).

``--dry-run`` runs the same steps on CPU with tiny sizes (every CUDA test skips, the model tests are
collected, not run), for ``tests/test_gpu_check.py``.

Publishing what a GPU run brought back, as a new run beside the earlier ones (from the repository root, in the
development environment)::

    python scripts/gpu_check.py publish DIR --title "what the run was"  # → docs/results/*-gpu-<run>.json,
                                                                        #   plots, docs/benchmarks-gpu.md

Exit status: 0 when the stage ran and everything in it passed; 1 when it ran but something failed (a test, a
measured row) — its results file says what; 2 when the stage could not run (the message names what failed);
124 when the tests stage was stopped, at its budget or by SIGTERM (its file has the outcomes it had).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
"""When this process began its imports: a stage's budget counts from here, as the shell's ``timeout`` does
(torch and the package take seconds to import on a cold machine)."""

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import ResultsError, format_results, read_results_file, render_docs  # noqa: E402
from tools.docs_results._common import machine_description, run_metadata  # noqa: E402
from scripts.script_paths import output_folder_problem, positive_problem  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))  # the pytest plugin, also when this file is imported by a test
from gpu_check_pytest import REPORTS_ENV, REPORTS_FILE, crashes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KIND = "gpu_check"

RESULT_FILES = ("environment-gpu", "tests-gpu", "wheel-gpu", "benchmarks-gpu", "peers-gpu", "decoding-gpu")
"""The results files a run writes to its output folder (``<name>.json``), one per stage, in stage order."""

PAGE = Path("docs") / "benchmarks-gpu.md"
RUN_SECTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("environment-gpu", "environment", "The machine",
     "The GPU, its driver, the speed of one bf16 matrix product, and the versions of the packages the check "
     "used (and the wheels it brought along)."),
    ("tests-gpu", "tests", "CUDA tests",
     "The CUDA test selection (and, from the second run on, the model tests on this machine's torch with CPU "
     "tensors): the outcome and command, the counts per test file, the run's notes, each failure with its "
     "message, and the skipped tests grouped by reason."),
    ("wheel-gpu", "wheel", "The package on this machine's torch",
     "The wheel installed as a user installs it, on the machine's own torch: what pip says of its "
     "requirements, the README quickstarts run from it, and quickstart 1's model reloaded through its remote "
     "code alone."),
    ("peers-gpu", "table", "FLASH side by side: causal LMs with FLASH-pytorch and Llama",
     "Our FLASH causal LM (Triton kernels and torch path), lucidrains' FLASH-pytorch and a stock Llama of "
     "equal non-embedding parameters, fwd+bwd at 65,536 tokens a step with the same chunked cross-entropy on "
     "each side's final hidden states: median step, tokens/s, MFU from a FLOP formula, peak memory "
     "(`bench/side_by_side.py`)."),
    ("decoding-gpu", "table", "Decoding",
     "Greedy `generate` of the settings' number of new tokens after a random prompt of the context's length. "
     "A cell is tokens per second (batch ÷ the median decoding step; in brackets ÷ the Llama's with the same "
     "cache) and that median step; the prefill is not in it."),
    ("decoding-gpu", "profiles", "Where a decoding step goes",
     "`torch.profiler` over one batch-1 `generate` per model: a step's time against the GPU's share of it, "
     "and the calls, launches and host syncs that fill the rest."),
    ("benchmarks-gpu", "report", "Training and prefill speed",
     "The bench's report of this run: its settings, targets, tables and plots. How the rows are measured and "
     "read is in [benchmarks.md](benchmarks.md) (the same bench on CPU)."),
)
"""(results file, view, heading, the page's own sentence) of one run's section of docs/benchmarks-gpu.md, in
page order; a section is there only when the run brought its file back (the profiles only when it has
them)."""

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
    """A stage's time budget, counted from when this process started (``STARTED``), as ``gpu_check.sh``'s
    ``timeout`` counts it: ``fits(seconds)`` says whether a step predicted to take that long ends inside
    it."""

    seconds: float
    margin: float = 10.0
    start: float = STARTED

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
                              text=True, timeout=8, check=False)  # inside the 25 s stage
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
    """environment-gpu.json, written before the bf16 product is timed and again with its speed (a stage cut
    off at its budget keeps the facts); status 2 when a real run finds no CUDA device (the file says what it
    found)."""
    wheels = [name for name in os.environ.get("GPU_CHECK_WHEELS", "").split() if name]
    environment = {
        "gpu": gpu_facts(), "nvidia_smi": nvidia_smi(), "matmul_tflops": None,
        "packages": {name: package_version(name) for name in PACKAGES}, "wheels": wheels,
        "python": sys.executable, "triton_interpret": os.environ.get("TRITON_INTERPRET"),
    }
    write_json(args.out, "environment-gpu", {**provenance(args.dry_run), "environment": environment})
    environment["matmul_tflops"] = matmul_tflops()
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
    "tests/test_host_syncs.py::test_on_a_gpu_the_steps_between_logging_steps_make_no_synchronising_call",
)
"""The tests that need CUDA: tests/test_cuda.py (GAU's Triton kernels compiled against the torch path, bf16
training steps of every family, the entropy-invariant family under sdpa / flash_attention_2 / flex_attention
with backward, packed FLASH on CUDA tensors) and the CUDA-only tests of other files, by node id."""

CPU_TESTS = (
    ("tests/test_configuration.py", "configs"), ("tests/test_layers.py", "shared layers"),
    ("tests/test_gau.py", "GAU"), ("tests/test_entropy_invariant.py", "entropy-invariant"),
    ("tests/test_synthesizer.py", "Synthesizer"), ("tests/test_generation_caches.py", "every cache"),
    ("tests/test_standalone.py", "exported code"), ("tests/test_packed_documents.py", "packed documents"),
    ("tests/test_packed_flash.py", "packed FLASH in linear time"),
    ("tests/test_flash_left_padding.py", "left-padded FLASH rows as alone"),
    ("tests/test_stock_attention.py", "stock log-n"), ("tests/test_model_inputs.py", "model inputs"),
)
NEEDS_PACKAGE_INDEX: tuple[str, ...] = (
    "tests/test_pruning.py::"
    "test_pruned_checkpoints_of_our_families_load_with_remote_code_in_a_clean_environment",
)
"""Tests of ``CPU_TESTS`` that build a clean environment with pip from the package index, which a lent GPU
machine cannot reach (the first CPU-tensor run there spent its budget on pip's retries): deselected there,
with a note; ``make test`` runs them."""

"""The model tests, run a second time on CPU tensors (``CUDA_VISIBLE_DEVICES=""``, Triton interpreted) as
``make test`` runs them: the device's torch and Triton under the checks that decide the declared minimums
(pyproject's ``torch>=``). Files this checkout lacks are noted, not selected."""

TEST_TIMEOUT_S = 90
"""Seconds one test may take (compiling kernels included) before pytest-timeout fails it and the others go
on."""

RESULT_WORD = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
PLUGIN = "gpu_check_pytest"
"""``scripts/gpu_check_pytest.py``: writes each outcome as it happens and keeps a crash's traceback."""


@dataclass
class PytestRun:
    """What one pytest run did: exit status (``None`` when stopped at its time limit), output lines,
    seconds, and whether it was stopped because this process was told to stop (SIGTERM: the shell's
    ``timeout``), when nothing more may start."""

    exit_code: int | None
    lines: list[str]
    seconds: float
    told_to_stop: bool = False


def tests_selection(root: Path) -> tuple[list[str], list[str], list[str]]:
    """(CUDA node ids, optional files this checkout has, notes on the optional files it lacks)."""
    present, notes = [], []
    for path, purpose in CPU_TESTS:
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


def run_streaming(command: list[str], env: dict[str, str], timeout: float, cwd: Path,
                  on_line: Callable[[str], None] | None = None) -> PytestRun:
    """Run ``command`` in a process group of its own, echoing and keeping its output lines (each passed to
    ``on_line`` too); after ``timeout`` seconds, or when this process is told to stop (SIGTERM), kill the
    group (then the exit status is ``None``) and return, so that the caller writes what it has before the
    shell's ``--kill-after``. The lines are read by a thread of their own, so a process that left the group
    and still holds the pipe (pip's, say) cannot keep this one waiting past its stop or its time limit."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               cwd=cwd,
                               start_new_session=True)
    stopped, told = threading.Event(), threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
            if on_line is not None:
                on_line(line)

    def stop(*_: Any) -> None:
        stopped.set()
        stop_group(process)

    def told_so(*_: Any) -> None:
        told.set()
        stop()

    previous = signal.signal(signal.SIGTERM, told_so)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            process.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            stop()
            process.wait()
        reader.join(timeout=2.0 if stopped.is_set() else max(timeout - (time.monotonic() - start), 2.0))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return PytestRun(None if stopped.is_set() else process.returncode, list(lines), time.monotonic() - start,
                     told.is_set())


def one_line(text: str | None, limit: int = 300) -> str:
    """``text`` on one line, without backticks or table bars, at most ``limit`` characters."""
    flat = " ".join((text or "").replace("`", "'").replace("|", "/").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def read_reports(folder: Path) -> list[dict[str, Any]]:
    """The lines ``gpu_check_pytest`` wrote to ``folder`` (a half-written last line is left for later), then a
    line for each crash that no line reports (pytest itself killed, without xdist)."""
    path, lines = folder / REPORTS_FILE, []
    if path.is_file():
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    reported = {line["test"] for line in lines}
    return lines + [crash for crash in crashes(folder) if crash["test"] not in reported]


def cases_from_reports(lines: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One case per test from its phase lines: failed (errors, for a setup or teardown) when a phase failed,
    else skipped when one skipped, else passed; ``[{test, file, outcome, message, traceback}]``."""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "errors": 2}
    cases: dict[str, dict[str, str]] = {}
    for line in lines:
        test = line["test"]
        case = cases.setdefault(test, {"test": test, "file": test.split("::")[0], "outcome": "passed",
                                       "message": "", "traceback": ""})
        if rank[line["outcome"]] > rank[case["outcome"]]:
            case.update(outcome=line["outcome"], message=one_line(line["message"]),
                        traceback=line.get("traceback", ""))
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
    failures = [{"test": c["test"], "message": c["message"], "traceback": c.get("traceback", "")}
                for c in cases if c["outcome"] in ("failed", "errors")]
    return {"counts": counts, "files": files, "failures": failures,
            "skipped": [{"reason": reason, "tests": tests} for reason, tests in skipped.items()]}


def pytest_command(selection: Sequence[str], workers: int) -> list[str]:
    """pytest over ``selection``, verbose, with the ``gpu_check_pytest`` plugin, ``workers`` pytest-xdist
    processes where it is installed, and at most ``TEST_TIMEOUT_S`` per test with pytest-timeout."""
    xdist = ["-n", str(workers)] if workers > 1 and importlib.util.find_spec("xdist") else []
    timeout = [f"--timeout={TEST_TIMEOUT_S}"] if importlib.util.find_spec("pytest_timeout") else []
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN, "-v", "-rfEs", *xdist,
            *timeout, *selection]


def tests_status(exit_code: int | None) -> str:
    """pytest's exit status in a word: 1 is failing tests; 2–5 (interrupted, internal or usage error, nothing
    collected) mean the selection could not run."""
    if exit_code is None:
        return "timed out"
    return {0: "passed", 1: "failed"}.get(exit_code, "error")


def pytest_cases(selection: Sequence[str], env: dict[str, str], workers: int, timeout: float,
                 notes: list[str], on_cases: Callable[[list[dict[str, str]]], None] | None = None,
                 ) -> tuple[PytestRun, list[dict[str, str]], str]:
    """Run ``selection``; (the run, its test outcomes, the command as recorded). Outcomes come from the
    plugin's lines, read again (and handed to ``on_cases``) whenever pytest prints an outcome, so a run
    stopped at ``timeout`` or killed keeps every outcome and failure message it had, and a crashed process's
    test is a failure with the crash's traceback."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-reports-") as scratch:
        folder = Path(scratch)
        scripts = str(ROOT / "scripts")
        env = {**env, REPORTS_ENV: scratch,
               "PYTHONPATH": os.pathsep.join(p for p in (scripts, env.get("PYTHONPATH", "")) if p)}
        command = pytest_command(selection, workers)

        def outcome_printed(line: str) -> None:
            if on_cases is not None and RESULT_WORD.search(line):
                on_cases(cases_from_reports(read_reports(folder)))

        run = run_streaming(command, env, timeout, ROOT, outcome_printed)
        cases = cases_from_reports(read_reports(folder))
    if run.exit_code is None:
        notes.append(f"pytest over {' '.join(selection)} was stopped at the stage's time budget: the "
                     "outcomes are those it had reported.")
    elif tests_status(run.exit_code) == "error" and not any(c["outcome"] != "passed" for c in cases):
        notes.append("pytest could not run the selection: " + one_line(" ".join(run.lines[-5:]), 500))
    return run, cases, shlex.join(["python", *command[1:]])


def cpu_tests(present: list[str], env: dict[str, str], workers: int, budget: Budget, notes: list[str],
              on_cases: Callable[[list[dict[str, str]]], None],
              ) -> tuple[list[PytestRun], list[dict[str, str]], list[str]]:
    """The model test files on CPU tensors in a pytest run of their own, the GPU hidden and Triton
    interpreted; the CUDA tests inside them are deselected (they ran on the GPU). (runs, outcomes,
    commands)."""
    if not present:
        return [], [], []
    if budget.left() - budget.margin < 15:
        notes.append("The model tests on CPU tensors were not run: the stage's time budget was spent on the "
                     "CUDA tests.")
        return [], [], []
    notes.append("The model tests ran a second time on CPU tensors (`CUDA_VISIBLE_DEVICES=\"\" "
                 "TRITON_INTERPRET=1`), on this machine's torch and Triton: "
                 f"{', '.join(f'`{p}`' for p in present)}.")
    cuda_nodes = [f"--deselect={node}" for node in CUDA_TESTS if node.split("::")[0] in present]
    offline = [f"--deselect={node}" for node in NEEDS_PACKAGE_INDEX if node.split("::")[0] in present]
    if offline:
        names = ", ".join(f"`{n}`" for n in NEEDS_PACKAGE_INDEX)
        notes.append("Not run here, as they build a clean environment from the package index, which this "
                     f"machine cannot reach (`make test` runs them): {names}.")
    cpu = {**env, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
    run, cases, command = pytest_cases([*present, *cuda_nodes, *offline], cpu, workers,
                                       budget.left() - budget.margin, notes, on_cases)
    return [run], cases, [f'CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 {command}']


def collected_not_run(present: Sequence[str], selection: Sequence[str]) -> tuple[list[str], list[str]]:
    """The model test files to collect (import) and deselect in a dry run's one pytest run, and pytest's
    arguments for that: the files of ``present`` that ``selection`` does not name a test of (those it does are
    imported by their selected tests), each followed by its ``--deselect``."""
    files = [path for path in present if not any(node.split("::")[0] == path for node in selection)]
    return files, [argument for path in files for argument in (path, f"--deselect={path}::")]


def deselected(lines: Sequence[str]) -> int:
    """How many tests pytest's summary says it deselected (0 when it names none)."""
    found = [int(m.group(1)) for line in lines if (m := re.search(r"(\d+) deselected", line))]
    return found[-1] if found else 0


@dataclass
class TestsFile:
    """tests-gpu.json of one stage, rewritten whenever an outcome arrives (``status`` "running" until the
    end)."""

    out: Path
    dry_run: bool
    selection: list[str]
    notes: list[str]
    cases: list[dict[str, str]] = field(default_factory=list)
    runs: list[PytestRun] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def running(self, cases: list[dict[str, str]]) -> None:
        """Write the outcomes so far: the finished runs' and ``cases`` of the run under way."""
        self.write("running", None, self.cases + cases)

    def finish(self) -> str:
        statuses = [tests_status(r.exit_code) for r in self.runs]
        status = next((s for s in ("error", "timed out", "failed") if s in statuses), "passed")
        if status == "passed" and any(c["outcome"] in ("failed", "errors") for c in self.cases):
            status = "failed"  # a crash found only in a fault file
        self.write(status, next((r.exit_code for r in self.runs if r.exit_code != 0), 0), self.cases)
        return status

    def write(self, status: str, exit_code: int | None, cases: list[dict[str, str]]) -> Path:
        summary = summarise(cases)
        tests = {"status": status, "exit_code": exit_code,
                 "duration_s": round(sum(r.seconds for r in self.runs), 1),
                 "command": " && ".join(self.commands), "selection": self.selection, "notes": self.notes,
                 **summary}
        return write_json(self.out, "tests-gpu", {**provenance(self.dry_run), "tests": tests})


def tests_stage(args: argparse.Namespace) -> int:
    """The CUDA tests (pytest-xdist workers on the GPU), then the model tests on CPU tensors. A dry run makes
    one pytest run on CPU in which every CUDA test skips and the model test files are collected (imported),
    not run: on CPU they are ``make test``'s. tests-gpu.json is rewritten at every outcome."""
    budget = Budget(args.budget, margin=15.0)  # a stopped pytest's group is killed, then the file is written
    selection, present, notes = tests_selection(ROOT)
    record = TestsFile(args.out, args.dry_run, [*selection, *present], notes)
    record.running([])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.dry_run:  # one pytest run: the CUDA tests skip, the model test files are imported and deselected
        files, arguments = collected_not_run(present, selection)
        run, cases, command = pytest_cases([*selection, *arguments], env, 0, budget.left() - budget.margin,
                                           notes, record.running)
        if files:
            names = ", ".join(f"`{p}`" for p in files)
            notes.append(f"dry run: {deselected(run.lines)} tests of {names} collected, not run.")
        record.runs, record.cases, record.commands = [run], cases, [command]
    else:
        share = 0.7 if present else 1.0  # the model tests on CPU tensors take the rest
        run, cases, command = pytest_cases(selection, env, args.workers,
                                           share * budget.left() - budget.margin, notes, record.running)
        record.runs, record.cases, record.commands = [run], cases, [command]
        if run.told_to_stop:
            notes.append("The stage was told to stop (SIGTERM) during the CUDA tests: the model tests on CPU "
                         "tensors were not run.")
        else:
            more_runs, more_cases, more_commands = cpu_tests(present, env, args.workers, budget, notes,
                                                             record.running)
            record.runs += more_runs
            record.cases += more_cases
            record.commands += more_commands
    status = record.finish()
    counts = summarise(record.cases)["counts"]
    log(f"tests: {status}: {counts} in {sum(r.seconds for r in record.runs):.0f} s → "
        f"{args.out / 'tests-gpu.json'}")
    for case in record.cases:
        if case["outcome"] in ("failed", "errors"):
            log(f"  {case['outcome']}: {case['test']}: {case['message']}")
    return {"passed": 0, "failed": 1, "timed out": 124}.get(status, 2)


# ---------------------------------------------------------------------------------------------- wheel
QUICKSTART_BLOCK = re.compile(
    r"```python\n(?P<code>.*?)```(?:\s*<!-- output -->\s*```text\n(?P<output>.*?)```)?", re.DOTALL)
IMPORTED = re.compile(r"^(?:from|import)\s+([A-Za-z_]\w*)", re.MULTILINE)
FIND_SPEC = re.compile(r"find_spec\(\s*[\"']([A-Za-z_]\w*)")
REMOTE_LOAD = """\
import sys
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("runs/quickstart/gau", trust_remote_code=True)
print(model.generate(torch.tensor([[3, 4, 5, 6]]), max_new_tokens=6, do_sample=False).tolist())
print("class from", type(model).__module__.split(".")[0],
      "| package imported:", "hf_attn_variants" in sys.modules)
"""
"""Reload the model quickstart 1 saved through its own code (``trust_remote_code``), without the package."""


@dataclass(frozen=True)
class Quickstart:
    """A python block of the README's Quickstart section and the output block after it (``None``: none)."""

    number: int
    code: str
    output: str | None

    def needs(self) -> list[str]:
        """Top-level modules it imports or looks up with ``find_spec``, this package's excepted."""
        names = {*IMPORTED.findall(self.code), *FIND_SPEC.findall(self.code)}
        return sorted(names - {"hf_attn_variants", "__future__"})


def readme_quickstarts(readme: Path) -> list[Quickstart]:
    """The python blocks of ``readme``'s "## Quickstart" section, numbered from 1."""
    text = readme.read_text(encoding="utf-8")
    section = text.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [Quickstart(number, match["code"], match["output"])
            for number, match in enumerate(QUICKSTART_BLOCK.finditer(section), start=1)]


def stale_files(wheel: Path) -> list[str]:
    """The package's files in which ``wheel`` differs from ``src/``: changed, or missing on either side (a
    wheel built before the last change)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        packed = {name: archive.read(name) for name in archive.namelist()
                  if not name.endswith("/") and ".dist-info/" not in name}
    source = {path.relative_to(ROOT / "src").as_posix(): path for path in (ROOT / "src").rglob("*")
              if path.is_file() and path.suffix != ".pyc" and "__pycache__" not in path.parts
              and ".egg-info" not in path.as_posix()}
    return sorted(name for name in {*packed, *source}
                  if name not in packed or name not in source or source[name].read_bytes() != packed[name])


def own_wheel(scratch: Path) -> tuple[Path, str]:
    """The package's wheel: the newest ``.whl/hf_attn_variants-*.whl`` (``make gpu-wheels``) when it holds
    ``src/`` as it is, else one built from this checkout into ``scratch`` (a stale carried one only when that
    build fails, and then said); (path, where it came from)."""
    carried = sorted((ROOT / ".whl").glob("hf_attn_variants-*.whl"), key=lambda p: p.stat().st_mtime)
    stale = stale_files(carried[-1]) if carried else []
    if carried and not stale:
        return carried[-1], "carried in .whl/"
    if stale:
        log(f"wheel: the carried {carried[-1].name} differs from src/ in {len(stale)} files ("
            f"{', '.join(stale[:4])}{' …' if len(stale) > 4 else ''}): building one from this checkout")
    try:
        return build_wheel(scratch)
    except RuntimeError as error:
        if not stale:
            raise
        return carried[-1], (f"carried in .whl/ and STALE, {len(stale)} files differ from src/ "
                             f"({', '.join(stale[:8])}); building one failed: {error}")


def build_wheel(scratch: Path) -> tuple[Path, str]:
    """The package's wheel built from this checkout into ``scratch``, offline; (path, where it came from)."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", "-w", str(scratch), str(ROOT)],
                          capture_output=True, text=True, timeout=240, check=False)
    built = sorted(scratch.glob("hf_attn_variants-*.whl"))
    if done.returncode != 0 or not built:
        raise RuntimeError("building the wheel failed: " + one_line(done.stderr or done.stdout, 600))
    return built[0], "built from this checkout (pip wheel --no-deps --no-build-isolation)"


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines without extras (what ``pip install`` of the core needs)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in metadata.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def resolve(wheel: Path, scratch: Path) -> dict[str, Any]:
    """``pip install --dry-run`` of ``wheel`` against this environment, offline (links: ``.whl/`` and the
    wheel's folder): whether pip accepts the installed torch and the other requirements, and what it would
    install."""
    report = scratch / "resolution.json"
    links = [arg for folder in {wheel.parent, ROOT / ".whl"} if folder.is_dir()
             for arg in ("--find-links", str(folder))]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index",
                           *links, "--report", str(report), str(wheel)], capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        return {"status": "failed", "message": one_line(done.stderr or done.stdout, 800)}
    planned = json.loads(report.read_text(encoding="utf-8")).get("install", [])
    return {"status": "ok", "would_install": [f"{item['metadata']['name']} {item['metadata']['version']}"
                                              for item in planned]}


def torch_admitted(requirements: Sequence[str]) -> bool:
    """Whether the wheel's torch requirement admits the installed torch (its release, without a local
    ``+cu130``)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    wanted = next((Requirement(r) for r in requirements if Requirement(r).name == "torch"), None)
    return wanted is None or wanted.specifier.contains(Version(torch.__version__).base_version,
                                                       prereleases=True)


def run_python(code: str, env: dict[str, str], cwd: Path, timeout: float) -> tuple[int | None, str, float]:
    """Run ``code`` in a fresh interpreter with stdin closed; (exit status or ``None`` on time-out, output,
    seconds)."""
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=max(timeout, 1.0), check=False)
    except subprocess.TimeoutExpired as error:
        return None, str(error.stdout or ""), time.monotonic() - started
    return done.returncode, done.stdout + (done.stderr if done.returncode else ""), time.monotonic() - started


def isolated_env(paths: Sequence[Path], scratch: Path) -> dict[str, str]:
    """This environment with ``PYTHONPATH`` set to ``paths`` alone (no ``src/``) and Hugging Face's caches in
    ``scratch``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": os.pathsep.join(str(p) for p in paths), "HF_HOME": str(scratch / "hf-home"),
            "HF_MODULES_CACHE": str(scratch / "hf-modules"), "PYTHONNOUSERSITE": "1"}


def run_quickstart(quickstart: Quickstart, env: dict[str, str], cwd: Path, budget: Budget) -> dict[str, Any]:
    """``quickstart`` run as a user would, its output compared with the README's; "not run" when it needs a
    module this machine lacks or the budget is spent."""
    entry: dict[str, Any] = {"quickstart": quickstart.number, "first_line": quickstart.code.splitlines()[0]}
    missing = [name for name in quickstart.needs() if importlib.util.find_spec(name) is None]
    if missing:
        return {**entry, "status": "not run", "reason": f"needs {', '.join(missing)}, not installed here"}
    if budget.left() - budget.margin < 20:
        return {**entry, "status": "not run", "reason": "the stage's time budget was spent"}
    code, output, seconds = run_python(quickstart.code, env, cwd, budget.left() - budget.margin)
    entry.update(seconds=round(seconds, 1), output=output.strip()[-2000:])
    if code != 0:
        return {**entry, "status": "failed", "reason": "timed out" if code is None else one_line(
            output.strip().splitlines()[-1] if output.strip() else f"exit status {code}")}
    expected = (quickstart.output or "").strip()
    if expected and output.strip() != expected:
        return {**entry, "status": "failed", "reason": "its output differs from the README's",
                "expected": expected}
    return {**entry, "status": "ok"}


def remote_load(env: dict[str, str], cwd: Path, budget: Budget, expected: str | None) -> dict[str, Any]:
    """Reload quickstart 1's saved model through its own code, the package absent from ``PYTHONPATH`` and not
    imported: its class must come from the folder (``transformers_modules``) and generate what quickstart 1
    printed."""
    if not (cwd / "runs" / "quickstart" / "gau" / "config.json").is_file():
        return {"status": "not run", "reason": "quickstart 1 saved no model"}
    code, output, seconds = run_python(REMOTE_LOAD, env, cwd, budget.left() - budget.margin)
    lines = output.strip().splitlines()
    result = {"seconds": round(seconds, 1), "output": output.strip()[-2000:]}
    wanted = [*(expected.strip().splitlines()[-1:] if expected else []),
              "class from transformers_modules | package imported: False"]
    if code != 0:
        reason = lines[-1] if lines else f"exit status {code}"
        return {**result, "status": "failed", "reason": one_line(reason)}
    if lines[-len(wanted):] != wanted:
        return {**result, "status": "failed", "reason": f"expected {' / '.join(wanted)}"}
    return {**result, "status": "ok"}


def wheel_stage(args: argparse.Namespace) -> int:
    """wheel-gpu.json: the package as a user installs it on this machine's torch. Status 1 when the resolver
    refuses the wheel, a quickstart fails or the reload through remote code does."""
    budget = Budget(args.budget, margin=5.0)
    data: dict[str, Any] = {**provenance(args.dry_run), "wheel": {"status": "running"}}
    with tempfile.TemporaryDirectory(prefix="gpu-check-wheel-") as scratch_name:
        scratch = Path(scratch_name)
        wheel, origin = own_wheel(scratch)
        result: dict[str, Any] = {"file": wheel.name, "origin": origin, "requires": wheel_requirements(wheel),
                                  "torch": torch.__version__}
        result["resolution"] = resolve(wheel, scratch)
        result["torch_admitted"] = torch_admitted(result["requires"])
        data["wheel"] = {**result, "status": "running"}
        write_json(args.out, "wheel-gpu", data)
        package, deps = scratch / "package", scratch / "deps"
        carried = [w for w in sorted((ROOT / ".whl").glob("*.whl"))
                   if not w.name.startswith("hf_attn_variants-")]
        for target, wheels in ((package, [wheel]), (deps, carried)):
            if wheels:
                subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                                "--no-compile", "--target", str(target), *map(str, wheels)], check=True,
                               capture_output=True, timeout=120)
        work = scratch / "work"
        work.mkdir()
        with_package = isolated_env([package, deps], scratch)
        _, where, _ = run_python("import importlib.util; print(importlib.util.find_spec('hf_attn_variants')"
                                 ".origin)", with_package, work, 60)  # found, not imported: no torch
        result["imported_from"] = where.strip().replace(str(scratch), "<scratch>")
        quickstarts = readme_quickstarts(ROOT / "README.md")
        result["quickstarts"] = []
        for quickstart in quickstarts:
            result["quickstarts"].append(run_quickstart(quickstart, with_package, work, budget))
            data["wheel"] = {**result, "status": "running"}
            write_json(args.out, "wheel-gpu", data)
        result["remote_code"] = remote_load(isolated_env([deps], scratch), work, budget,
                                            quickstarts[0].output if quickstarts else None)
    failed = ([f"resolution: {result['resolution'].get('message')}"] if result["resolution"]["status"] != "ok"
              else [])
    if not result["torch_admitted"]:
        failed.append(f"the wheel's requirements {result['requires']} exclude the installed torch "
                      f"{torch.__version__}")
    failed += [f"quickstart {q['quickstart']}: {q['reason']}" for q in result["quickstarts"]
               if q["status"] == "failed"]
    if result["remote_code"]["status"] == "failed":
        failed.append(f"remote code: {result['remote_code']['reason']}")
    data["wheel"] = {**result, "status": "failed" if failed else "ok"}
    path = write_json(args.out, "wheel-gpu", data)
    log(f"wheel: {wheel.name} on torch {torch.__version__}: resolution {result['resolution']['status']}, "
        f"quickstarts {[q['status'] for q in result['quickstarts']]}, remote code "
        f"{result['remote_code']['status']} → {path}")
    for line in failed:
        log(f"  failed: {line}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------- bench
@dataclass(frozen=True)
class BenchPart:
    """Variants measured side by side at ``lengths``, one bench run per length (so each length is saved at
    once)."""

    comparison: Any
    variants: dict[str, Any]
    lengths: tuple[int, ...]
    growth: float
    """Predicted factor of the timed steps from one length to the next (``length_seconds``): 2 for linear
    time at doubled lengths, 4 for quadratic; the FLASH part's lengths grow 4× (the first H200 run's rows
    took 4.2× from 16k to 64k, the Llama's 7×)."""


def length_seconds(run: Any, wall: float, growth: float) -> float:
    """The predicted seconds of the next length after a length's bench ``run`` took ``wall`` seconds.

    Building the models and compiling kernels (what ``wall`` holds beyond the timed steps) is paid again
    as it was; the steps, with their warm-ups (as many again, at most), grow by ``growth``.
    """
    steps = sum(sum(result.wall) for result in run.results if result.status == "ok")
    return max(0.0, wall - steps) + 2 * steps * growth


FLASH_NOTE = (
    "FLASH's training-speed claim (Hua et al. 2022) is against Transformer++ at equal parameters: a stock "
    "`LlamaModel` (SDPA: FlashAttention's kernel inside torch on a GPU, RoPE, gated SiLU MLP) with one layer "
    "per two GAU layers and the MLP width that makes its parameters outside the embeddings those of our "
    "causal FLASH GAU (`bench/specs.py:equal_parameter_intermediate`). `gau_flash_causal` runs GAU's Triton "
    "kernels for the attention inside the chunks (`gau_kernel=\"triton\"`), `gau_flash_causal_torch` the "
    "torch path (`gau_kernel=\"torch\"`). FLOPs are those of the products run: torch's formulas for aten's, "
    "`bench/measure.py:flash_flops` for the Triton kernels (the torch path's count for the same work), and "
    "in training the FLASH unit's forward once more (it recomputes it in backward instead of saving it).")


OPTIONAL_FLASH_VARIANTS = ("gau_flash_causal_packed",)
"""Variants of ``bench/specs.py`` measured with FLASH when they exist: packed documents (at the FLASH part's
lengths, not the bench's own)."""


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
    """FLASH (Triton, torch path, packed documents) vs Llama at equal parameters at 4k, 16k and 64k (the side
    by side's lengths; issue 47's rows, first, so that the budget holds them), then entropy-invariant vs
    Llama decoders (2k–16k); a dry run measures both at the preset's tiny lengths."""
    from hf_attn_variants.bench.specs import COMPARISONS, Comparison, Variant, build_variants, gau_model
    from hf_attn_variants.bench.measure import triton_skip_reason

    def placed(variant: Any) -> Any:  # built on the device; measured at the part's lengths only
        return replace(variant, build=partial(on_device, variant.build, device), lengths=None,
                       extra_lengths=())

    stock = build_variants(preset)
    decoder = next(c for c in COMPARISONS if c.key == "decoder")
    flash = partial(gau_model, preset, normalization="relu2", chunk=preset.gau_chunk_size, causal=True)
    chunks = f"GAUModel relu², FLASH chunks of {preset.gau_chunk_size}, causal"
    reason = triton_skip_reason()  # not installed, or (a dry run) an interpreter that cannot run the kernels
    no_triton = {} if reason is None else {"max_length": 0, "skip_reason": reason}
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
    tiny = tuple(sorted(preset.lengths, reverse=True)) if dry_run else None
    return [  # FLASH longest first: its 64k rows are the ones that matter most, and predict the shorter
        BenchPart(comparison, {n: placed(v) for n, v in flash_variants.items()},
                  tiny or (65536, 16384, 4096), growth=0.25),
        BenchPart(decoder, {n: placed(stock[n]) for n in (decoder.baseline, *decoder.variants)},
                  tiny or (2048, 4096, 8192, 16384), growth=3.0),
    ]


def peak_tflops(explicit: float | None) -> float | None:
    """``--peak-tflops``, else the data-sheet peak of this GPU (``PEAK_BF16_TFLOPS``), else ``None``."""
    if explicit or not torch.cuda.is_available():
        return explicit
    name = torch.cuda.get_device_name(0)
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)


BUDGET_SKIP = "not run: the GPU check's bench budget"
"""How a row the bench stage's budget could not hold begins its reason."""
LATER_PART_S = 5.0
"""The least a later comparison's first length is predicted to take, so that one does not start in the
stage's last seconds (its timeout would end the stage as timed out, and the part with it)."""


def budget_skips(part: BenchPart, length: int, batch: int, seconds: float) -> list[Any]:
    """Skipped rows of every variant of ``part`` at ``length``: the stage's time budget would not hold
    them."""
    from hf_attn_variants.bench.runner import PHASES, Result

    reason = f"{BUDGET_SKIP} ({seconds:.0f} s) would be exceeded"
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
    total.interrupted = part.interrupted or total.interrupted
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


TIME_LIMIT = "the stage's time limit (SIGTERM from gpu_check.sh's timeout)"
"""What stopped a bench stage told to stop: ``BenchRun.interrupted`` names it."""


def stop_at_sigterm(signum: int, frame: Any) -> None:
    """A measuring stage's SIGTERM handler: a ``KeyboardInterrupt`` naming ``TIME_LIMIT``, which
    ``Runner.run_all`` answers by keeping the rows of the phases it finished (raised once: the shell's
    ``--kill-after`` ends a stage that does not stop)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(TIME_LIMIT)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside, SIGTERM raises ``stop_at_sigterm``'s ``KeyboardInterrupt``; the previous handler is back after.
    An interrupt the stage does not answer itself ends it with 124 (``main``)."""
    previous = signal.signal(signal.SIGTERM, stop_at_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def bench_stage(args: argparse.Namespace) -> int:
    """benchmarks-gpu.json, rewritten after every length; a length the budget cannot hold is recorded as
    skipped. Status 1 when a row failed (e.g. out of memory: the bench records it and goes on). Told to stop
    (the shell's ``timeout`` sends SIGTERM), it writes the rows of the phases it finished, the length in
    progress included, with ``interrupted`` saying where it stopped, and exits 124: the first length, 64k,
    holds every FLASH row that matters most (a stop between lengths leaves the file of the finished ones)."""
    with sigterm_interrupts():
        return bench_lengths(args)


def bench_lengths(args: argparse.Namespace) -> int:
    """``bench_stage``'s work: each part's lengths, each measured by a ``Runner`` of its own."""
    from hf_attn_variants.bench.runner import Runner

    budget = Budget(args.budget)
    device = stage_device(args, "bench")
    if device is None:
        return 2
    preset = bench_preset(args.dry_run)
    peak, total, command = peak_tflops(args.peak_tflops), None, command_line(args.dry_run)
    stopped = False
    for index, part in enumerate(bench_parts(preset, args.dry_run, device)):
        # A comparison's first length runs whatever is left (a later one's only with LATER_PART_S of it): a
        # row it may get, and one cut off loses nothing, as every finished length is written at once.
        guess = None if index == 0 else LATER_PART_S
        for length in part.lengths:
            if guess is not None and not budget.fits(guess):
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
            try:
                run = runner.run_all()
            except KeyboardInterrupt:  # told to stop: the phases it finished, kept by the runner
                run, stopped = runner.run, True
            run.environment["command"] = command
            total = add_run(total, run)  # written before the clean-up, which a stop may interrupt
            guess = length_seconds(run, time.monotonic() - started, part.growth)
            write_json(args.out, "benchmarks-gpu", bench_results(total, False, budget, args.dry_run))
            if stopped:
                log(f"bench: {total.interrupted}; written to {args.out / 'benchmarks-gpu.json'}")
                return 124
            del runner  # its models: the next length builds its own
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    skipped = any(r.status == "skipped" and r.reason.startswith(BUDGET_SKIP) for r in total.results)
    path = write_json(args.out, "benchmarks-gpu", bench_results(total, not skipped, budget, args.dry_run))
    failed = [f"{r.variant} n={r.length} {r.phase}: {r.reason}" for r in total.results
              if r.status == "failed"]
    log(f"bench: {len(total.results)} rows, {len(failed)} failed, in {total.elapsed_s:.0f} s → {path}")
    for line in failed:
        log(f"  failed: {line}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------- peers
def peak_source(explicit: float | None, peak: float | None) -> str:
    """Where the MFU denominator came from."""
    if explicit:
        return "--peak-tflops"
    if peak:
        return f"dense bf16 peak of the {torch.cuda.get_device_name(0)} (NVIDIA's data sheet)"
    return ""


def peers_stage(args: argparse.Namespace) -> int:
    """peers-gpu.json, rewritten after every row: our FLASH causal LM (Triton kernels, torch path) against
    FLASH-pytorch and a stock Llama of equal non-embedding parameters at 16 × 4k, 4 × 16k and 1 × 64k tokens,
    bf16, fwd+bwd with the same chunked loss (``bench/side_by_side.py``); a dry run's tiny models in float32
    on CPU. A row the budget cannot hold is recorded as skipped; status 1 when a row failed (out of memory, a
    peer not installed)."""
    from hf_attn_variants.bench.side_by_side import BUDGET_REASON, GPU_SHAPE, SMOKE_SHAPE, run_side_by_side

    budget = Budget(args.budget)
    device = stage_device(args, "peers")
    if device is None:
        return 2
    peak = peak_tflops(args.peak_tflops)
    head = {**run_metadata("side_by_side", command_line(args.dry_run), machine=machine_description()),
            "dry_run": args.dry_run}

    def write(run: Any, complete: bool) -> Path:
        results = {**head, **run.as_results(),
                   "gpu_check": {"complete": complete, "budget_s": budget.seconds}}
        if device == "cuda":
            results["settings"]["device"] = torch.cuda.get_device_name(0)
        return write_json(args.out, "peers-gpu", results)

    run = run_side_by_side(SMOKE_SHAPE if args.dry_run else GPU_SHAPE, device,
                           torch.float32 if args.dry_run else torch.bfloat16, peak_tflops=peak,
                           peak_source=peak_source(args.peak_tflops, peak), fits=budget.fits,
                           on_row=lambda so_far: write(so_far, False), log=log)
    path = write(run, not any(r["status"] == "skipped" and r["reason"] == BUDGET_REASON for r in run.rows))
    failed = [f"{r['model']} {r['batch']}×{r['length']}: {r['reason']}" for r in run.rows
              if r["status"] == "failed"]
    log(f"peers: {len(run.rows)} rows, {len(failed)} failed → {path}")
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


STATIC_NOTE = ("`cache_implementation=\"static\"`: Transformers compiles the decoding step (torch.compile, "
               "CUDA graphs) on CUDA; measured at batch 1 and the shortest context only (one compilation per "
               "model fits the budget), after one compiling generation.")


STATIC_LEFT_OUT = {
    "gau_softmax_plus": ("not run: compiling a third model does not fit the perf part's 5 minutes (the "
                         "second GPU run compiled the Llama and the entropy-invariant model in about 100 s "
                         "and had no time left for the GAU models)"),
}
"""Models whose static-cache rows the GPU check leaves out, and why; FLASH GAU is still asked, and refuses in
one sentence at once."""


STATIC_SECONDS = 60.0
"""The predicted seconds of the first model's static-cache rows (compiling its decoding step, then timing
it) before one was measured (the second GPU run: about 50 s a model, so 10 s to spare); each later model is
predicted at the previous one's measured time."""


def static_rows(model: torch.nn.Module, name: str, plan: dict[str, Any],
                device: str) -> tuple[list[dict[str, Any]], str | None]:
    """Batch-1 rows at the shortest context with the static cache (compiled by Transformers on CUDA; a dry
    run's CPU runs it uncompiled); (rows, why there are none)."""
    from hf_attn_variants.bench.decoding import DECODING_SDPA_BACKENDS, measure_model

    try:
        rows = measure_model(model, name, [1], [min(plan["contexts"])], plan["new_tokens"], log,
                             cache_implementation="static", sdpa_backends=DECODING_SDPA_BACKENDS)
    except ValueError as error:  # a model that refuses a static cache says why in one sentence
        return [], f"refused: {one_line(str(error), 400)}"
    for row in rows:
        row["compiled"] = device == "cuda"
    return rows, None


def refuses_static_cache(model: torch.nn.Module) -> bool:
    """Whether ``model`` refuses a static cache at once, before compiling anything: FLASH GAU
    (``chunk_size``; ``gau_cache.check_chunk_cache``)."""
    return getattr(model.config, "chunk_size", None) is not None


def free_device(device: str) -> None:
    """After a model: its compiled step forgotten (the next starts afresh) and its memory returned, that of
    a model a failure left in reference cycles (its traceback's frames) included."""
    if device == "cuda":
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()


def log_profile(name: str, profile: dict[str, Any]) -> None:
    log(f"  {name}: profile of batch 1: {profile['wall_ms_per_step']:.1f} ms a step, "
        f"{profile['gpu_ms_per_step']:.2f} ms of it on the GPU, {profile['launches_per_step']:.0f} "
        f"launches, {profile['syncs_per_step']:.1f} syncs, {profile['cpu_ops_per_step']:.0f} aten calls")


def decoding_stage(args: argparse.Namespace) -> int:
    """decoding-gpu.json, rewritten after every row. First every model's dynamic-cache rows and a profile of
    a batch-1 ``generate`` (top kernels and operators, time per step); then, as the budget allows, the static
    cache's compiled rows, model by model (compiling is the stage's most expensive step, so a short budget
    costs static rows, never a model's dynamic rows). A model that fails (e.g. out of memory) is recorded and
    the others still run (status 1); one the budget cannot hold is recorded as skipped. Told to stop (the
    shell's ``timeout`` sends SIGTERM), it writes every row measured so far, says what stopped it and exits
    124."""
    budget = Budget(args.budget)
    device = stage_device(args, "decoding")
    if device is None:
        return 2
    plan = decoding_settings(args.dry_run)
    data = decoding_data(args.dry_run, plan, device)
    with sigterm_interrupts():
        try:
            return decode_models(args, plan, device, budget, data)
        except KeyboardInterrupt as stop:
            data["gpu_check"]["interrupted"] = (f"stopped by {str(stop) or 'Ctrl-C'}: the rows and profiles "
                                                "measured before it are kept")
            path = write_json(args.out, "decoding-gpu", rounded(data))
            log(f"decoding: {data['gpu_check']['interrupted']}; {len(data['rows'])} rows → {path}")
            return 124


def decoding_data(dry_run: bool, plan: dict[str, Any], device: str) -> dict[str, Any]:
    """decoding-gpu.json before its first row: provenance and settings."""
    from hf_attn_variants.bench.decoding import DECODING_SDPA_BACKENDS

    settings = {"batches": plan["batches"], "contexts": plan["contexts"], "new_tokens": plan["new_tokens"],
                "threads": torch.get_num_threads(), "size": asdict(plan["size"]),
                "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                "dtype": plan["dtype"],
                "excluded": DECODING_EXCLUDED, "caches": {"dynamic": "the default `DynamicCache`",
                                                          "static": STATIC_NOTE},
                "sdpa_backends": [backend.name for backend in DECODING_SDPA_BACKENDS]}
    return {**run_metadata("decoding", command_line(dry_run), machine=machine_description()),
            "dry_run": dry_run, "settings": settings, "models": {}, "rows": [], "profiles": {},
            "not_measured": [], "gpu_check": {"complete": False}}


def decode_models(args: argparse.Namespace, plan: dict[str, Any], device: str, budget: Budget,
                  data: dict[str, Any]) -> int:
    """``decoding_stage``'s work, into ``data``: every model's dynamic rows and profile, then the static
    rows."""
    from hf_attn_variants.bench.decoding import (
        DECODERS,
        DECODING_SDPA_BACKENDS,
        build_decoder,
        measure_model,
        profile_generate,
    )

    longest = max(plan["contexts"]) + plan["new_tokens"]

    def build(name: str) -> torch.nn.Module:
        return build_decoder(name, plan["size"], longest, device, getattr(torch, plan["dtype"]))

    def failure(name: str, error: Exception) -> None:
        failed.append(f"{name}: {type(error).__name__}: {one_line(str(error), 200)}")
        data["gpu_check"].setdefault("failed", []).append(failed[-1])
        log(f"decoding: {failed[-1]}")

    def keep(row: dict[str, Any]) -> None:  # a model is listed with its first row (a failed one: "failed")
        data["models"].setdefault(row["model"], DECODERS[row["model"]][0])
        data["rows"].append(row)
        write_json(args.out, "decoding-gpu", rounded(data))

    last, failed, measured = None, [], []
    for name in DECODING_MODELS:  # the dynamic cache and a profile of every model
        if last is not None and not budget.fits(last):
            data["gpu_check"].setdefault("skipped", []).append(name)
            log(f"decoding: {name} skipped (budget: {budget.left():.0f} s left)")
            continue
        started = time.monotonic()
        try:
            model = build(name)
            measure_model(model, name, plan["batches"], plan["contexts"], plan["new_tokens"], log,
                          sdpa_backends=DECODING_SDPA_BACKENDS, on_row=keep)
            data["profiles"][name] = profile_generate(model, 1, min(plan["contexts"]), plan["new_tokens"],
                                                      sdpa_backends=DECODING_SDPA_BACKENDS)
            if name == DECODING_MODELS[0]:  # the baseline once more, with every backend torch would pick
                data["profiles"][f"{name}, default SDPA backends"] = profile_generate(
                    model, 1, min(plan["contexts"]), plan["new_tokens"])
        except Exception as error:  # noqa: BLE001 - e.g. out of memory: recorded, the other models still run
            failure(name, error)
            continue
        finally:
            model = None
            free_device(device)
        last = time.monotonic() - started
        measured.append(name)
        log_profile(name, data["profiles"][name])
        write_json(args.out, "decoding-gpu", rounded(data))
    predicted = STATIC_SECONDS
    for name in measured:  # then the static cache, compiled, model by model as the budget allows
        if name in STATIC_LEFT_OUT:
            data["not_measured"].append({"model": name, "cache": "static", "reason": STATIC_LEFT_OUT[name]})
            continue
        started = time.monotonic()
        try:
            model = build(name)
            cost = 0.0 if refuses_static_cache(model) else predicted
            if not budget.fits(cost):
                data["not_measured"].append({"model": name, "cache": "static", "reason": (
                    f"not run: the decoding budget ({budget.seconds:.0f} s) would be exceeded (predicted "
                    f"{cost:.0f} s, {budget.left():.0f} s left)")})
                continue
            static, why = static_rows(model, name, plan, device)
        except Exception as error:  # noqa: BLE001 - recorded, the other models still run
            failure(f"{name}, static cache", error)
            continue
        finally:
            model = None
            free_device(device)
        data["rows"] += static
        if why:
            data["not_measured"].append({"model": name, "cache": "static", "reason": why})
        else:
            predicted = time.monotonic() - started
        write_json(args.out, "decoding-gpu", rounded(data))
    data["gpu_check"]["complete"] = not data["gpu_check"].get("skipped") and not any(
        entry["reason"].startswith("not run: the decoding budget") for entry in data["not_measured"])
    path = write_json(args.out, "decoding-gpu", rounded(data))
    log(f"decoding: {len(data['rows'])} rows, {len(failed)} models failed → {path}")
    return 1 if failed else 0


def rounded(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the floats of its rows to 4 decimals."""
    rows = [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in data["rows"]]
    return {**data, "rows": rows}


# ---------------------------------------------------------------------------------------------- publish
def read_results(folder: Path, name: str) -> dict[str, Any] | None:
    """``folder/<name>.json`` (``None`` when the run did not bring it back); ``ResultsError`` naming a broken
    one."""
    path = folder / f"{name}.json"
    return read_results_file(path) if path.is_file() else None


def gpu_short_name(found: dict[str, dict[str, Any]]) -> str:
    """"h200" for an NVIDIA H200 (the GPU's name from environment-gpu.json, else the provenance's machine)."""
    environment = found.get("environment-gpu", {}).get("environment", {})
    name = environment.get("gpu", {}).get("name") or next(
        (data.get("machine", "") for data in found.values()), "")
    name = name.split(",")[-1]
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.replace("NVIDIA", "")) if w]
    return words[0].lower() if words else "gpu"


def published_runs(root: Path) -> list[dict[str, Any]]:
    """The runs published in ``root/docs/results`` (each file's ``published`` names its run and title), oldest
    first: ``[{id, title, date, device, torch, files: {stage: results name}}]``."""
    runs: dict[str, dict[str, Any]] = {}
    for path in sorted((root / "docs" / "results").glob("*-gpu-*.json")):
        data = read_results_file(path)
        published = data.get("published") or {}
        stage = path.stem.removesuffix(f"-{published.get('run')}")
        if not published.get("run") or stage not in RESULT_FILES:
            continue
        run = runs.setdefault(published["run"], {
            "id": published["run"], "title": published.get("title", ""), "date": data.get("date", ""),
            "device": data.get("machine", ""), "torch": (data.get("versions") or {}).get("torch", "?"),
            "files": {}})
        run["files"][stage] = path.stem
    return sorted(runs.values(), key=lambda run: (str(run["date"])[:10], run["id"]))


def page_text(runs: list[dict[str, Any]], root: Path) -> str:
    """docs/benchmarks-gpu.md: the lead tables of the newest runs, then every run, newest first, each with an
    empty region per results file it brought back (filled by rendering)."""
    intro = ("What `bash scripts/gpu_check.sh` measured on machines with a CUDA GPU ([how to run it]"
             "(../CONTRIBUTING.md#the-gpu-check)), one section per run, newest first, each published with "
             "`python scripts/gpu_check.py publish DIR --title ...` and never overwritten by a later one. Do "
             "not edit by hand: every table is rendered from `docs/results/*-gpu-<run>.json`.")
    parts = ["# GPU benchmarks", "", intro, "", "## Fastest on this GPU", ""]
    leads = (
        ("benchmarks-gpu", "fastest", "Training (fwd+bwd) and prefill (forward), from run `{}`: per "
         "comparison and length, the fastest variant and the baseline it is compared with (the run's section "
         "has every row)."),
        ("peers-gpu", "targets", "FLASH as a causal LM against FLASH-pytorch and Llama, from run `{}`: per "
         "length and kernel, our step time as a multiple of theirs and peak memory, against issue 47's "
         "targets."),
        ("decoding-gpu", "fastest", "Decoding, from run `{}`: per batch and context, the fastest decoder and "
         "cache, and the stock Llama's with the same cache."),
    )
    for stage, view, text in leads:
        run = next((run for run in reversed(runs) if stage in run["files"]), None)
        if run:
            parts += [text.format(run["id"]), "", f"<!-- results: {run['files'][stage]} {view} -->",
                      "<!-- /results -->", ""]
    parts += ["## Runs", ""]
    for run in reversed(runs):
        names = run["files"]
        parts += [f"### `{run['id']}`: {run['title']}", "",
                  f"{run['device']}, torch {run['torch']}, {run['date']}.", ""]
        for stage, view, heading, sentence in RUN_SECTIONS:
            if stage not in names:
                continue
            if view == "profiles" and not read_results_file(
                    root / "docs" / "results" / f"{names[stage]}.json").get("profiles"):
                continue
            parts += [f"#### {heading}", ""] + ([sentence, ""] if sentence else []) + [
                f"<!-- results: {names[stage]} {view} -->", "<!-- /results -->", ""]
    return "\n".join(parts)


def publish(folder: Path, root: Path, title: str, allow_dry_run: bool = False) -> list[str]:
    """Add the run whose results files are in ``folder`` to ``root``'s docs: each file copied to
    ``docs/results/<file>-<run>.json`` (the run: its date and GPU, ``2026-11-28-h200``, with ``-2``, ``-3`` …
    when that is taken), the bench plots drawn as ``docs/benchmarks-gpu-<run>_*.png``, the run listed with
    ``title`` in each file's ``published``, and docs/benchmarks-gpu.md rebuilt from every published run and
    rendered. Nothing an earlier run published is overwritten. Returns the files written; ``ResultsError``
    when ``folder`` holds none, or a dry run's files (unless ``allow_dry_run``), or ``title`` is empty."""
    from hf_attn_variants.bench.plots import write_plots
    from hf_attn_variants.bench.store import from_results

    found = {name: data for name in RESULT_FILES if (data := read_results(folder, name)) is not None}
    if not found:
        raise ResultsError(f"{folder}: none of {', '.join(f'{n}.json' for n in RESULT_FILES)} (the GPU "
                           "check's output folder?).")
    dry = [name for name, data in found.items() if data.get("dry_run")]
    if dry and not allow_dry_run:
        raise ResultsError(f"{folder}: {', '.join(dry)} come from a dry run on CPU; publish the results of a "
                           "GPU run.")
    if not title.strip():
        raise ResultsError("--title: say in a few words what the run was (e.g. 'the run that found the "
                           "failures').")
    results = root / "docs" / "results"
    taken = {run["id"] for run in published_runs(root)}
    first = next(iter(found.values()))
    base = f"{first.get('date', 'undated')}-{gpu_short_name(found)}"
    run_id = next(candidate for n in range(1, 1000)
                  if (candidate := base if n == 1 else f"{base}-{n}") not in taken
                  and not any((results / f"{stage}-{candidate}.json").exists() for stage in RESULT_FILES))
    written = []
    for name, data in found.items():
        target = results / f"{name}-{run_id}.json"
        published = {"name": target.stem, "run": run_id, "title": title}
        if name == "benchmarks-gpu":
            published["plot_prefix"] = f"benchmarks-gpu-{run_id}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(format_results({**data, "published": published}, inline_depth=2), encoding="utf-8")
        written.append(str(target))
    if "benchmarks-gpu" in found:
        run = from_results(found["benchmarks-gpu"])
        written += [str(p) for p in write_plots(run, root / "docs", prefix=f"benchmarks-gpu-{run_id}")]
    page = root / PAGE
    page.write_text(page_text(published_runs(root), root), encoding="utf-8")
    render_docs(root, [page])
    return [*written, str(page)]


def publish_command(args: argparse.Namespace) -> int:
    try:
        written = publish(args.folder, args.root, args.title, args.allow_dry_run)
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
STAGE_BUDGETS = {"environment": 25.0, "tests": 185.0, "wheel": 80.0, "bench": 60.0, "peers": 75.0,
                 "decoding": 130.0}
"""Each stage's default ``--budget`` in seconds, those of ``gpu_check.sh`` (each part's add up to 290 s)."""


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.splitlines()[0])
    stages = main.add_subparsers(dest="stage", required=True)
    for name, budget in STAGE_BUDGETS.items():
        stage = stages.add_parser(name, help=f"the {name} stage")
        stage.add_argument("--out", type=Path, required=True, help="Folder for the results file.")
        stage.add_argument("--budget", type=float, default=budget, help=f"Seconds (default {budget:.0f}).")
        stage.add_argument("--dry-run", action="store_true", help="On CPU with tiny sizes.")
        if name == "tests":
            workers = min(12, max(2, (os.cpu_count() or 4) - 4))
            stage.add_argument("--workers", type=int, default=workers,
                               help=f"pytest-xdist workers sharing the GPU (default here {workers}: the CPU "
                                    "count less 4, at most 12; compiling kernels is CPU work).")
        if name in ("bench", "peers"):
            stage.add_argument("--peak-tflops", type=float, default=None,
                               help="The GPU's bf16 peak for the MFU column (default: by its name).")
    publisher = stages.add_parser("publish",
                                  help="copy a run's results into docs/results and render the page")
    publisher.add_argument("folder", type=Path, help="The folder the GPU check wrote (its OUT).")
    publisher.add_argument("--title", required=True,
                           help="What the run was, for its heading (e.g. 'the run that found the failures').")
    publisher.add_argument("--root", type=Path, default=ROOT,
                           help="Repository root (default: this checkout).")
    publisher.add_argument("--allow-dry-run", action="store_true",
                           help="Publish a dry run's files (tests only).")
    return main


STAGES: dict[str, Callable[[argparse.Namespace], int]] = {
    "environment": environment_stage, "tests": tests_stage, "wheel": wheel_stage, "bench": bench_stage,
    "peers": peers_stage, "decoding": decoding_stage,
    "publish": publish_command,
}


def check_args(command: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``command.error`` (status 2) naming the first bad flag, before the stage starts: a stage's ``--out``
    must be a folder this user can create or write (not a file), its ``--budget`` a finite number of seconds
    (0: no time left, each stage still does its first step); publish's ``--title`` must not be empty."""
    if args.stage == "publish":
        if not args.title.strip():
            command.error("--title must not be empty (it is the run's heading)")
        return
    problem = output_folder_problem(args.out)
    if problem:
        command.error(f"--out: {problem}")
    problem = positive_problem(args.budget, "seconds", zero=True)
    if problem:
        command.error(f"--budget {problem}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one stage; an exception it does not handle is printed with its traceback and ends it with status
    2, and a stop (SIGTERM raised as ``KeyboardInterrupt`` by a stage's handler, or Ctrl-C) that reaches here
    after the stage's files were written ends it with 124, as the shell's ``timeout`` does."""
    command = parser()
    args = command.parse_args(argv)
    check_args(command, args)
    try:
        return STAGES[args.stage](args)
    except KeyboardInterrupt as stop:  # between two writes of the stage's file: it holds what was finished
        log(f"{args.stage}: stopped by {str(stop) or 'Ctrl-C'}; its results file holds what it finished")
        return 124
    except Exception as error:  # noqa: BLE001 - the stage could not run: say which and why, keep the traceback
        traceback.print_exc()
        log(f"{args.stage}: error: {type(error).__name__}: {one_line(str(error), 500)}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
