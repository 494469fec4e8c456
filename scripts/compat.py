"""``make compat``: the canary for new Transformers releases (not part of ``make test``).

For each release — by default the newest ``transformers`` on the package index at this moment, and the locked
one for comparison — it runs, in cached clean environments (``tests/remote_code.py``: torch and safetensors at
the locked versions, pytest, hypothesis, and that Transformers release; never this package):

(a) the remote-code tests of every family: export folders with the installed package, load them there with
    ``trust_remote_code=True`` and compare outputs and greedy ``generate`` tokens;
(b) the package's model test files (``tests/test_transformers_floor.py``'s list), with this package taken from
    ``src/`` through ``PYTHONPATH``.

It prints one table (release × suite: passed / failed / skipped, time) and writes it as JSON under
``runs/compat/``. Exit code 1 when anything failed: run it before starting new work, and treat a failure as
the first thing to fix.

``--torch`` checks the declared minimum torch instead (DESIGN.md: the lowest version the model tests pass
on): (b) alone, on each given torch release with each release of ``--releases`` (default: the oldest
supported Transformers, ``TRANSFORMERS_RELEASES[0]``, and the installed one). Only the installed torch is a
CPU build on this machine's index; every other release comes from PyPI, which on x86-64 Linux is a CUDA
build of several GB that runs on the CPU, so each such environment is deleted after its run (``--keep-envs``
keeps it). ``--record`` merges the rows into ``docs/results/version-floor.json``, which CONTRIBUTING.md
renders and ``tests/test_version_floor.py`` holds ``pyproject.toml``'s ``torch>=`` to.

Usage: ``python scripts/compat.py [--releases 5.24.0 5.25.0] [--workers 2]`` (``make compat``);
``python scripts/compat.py --torch 2.6.0 2.11.0 [--record]``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.remote_code import TRANSFORMERS_RELEASES, clean_python, installed_transformers  # noqa: E402
from tests.test_transformers_floor import MODEL_TEST_FILES  # noqa: E402
from tools.docs_results import load_results, results_path, write_results  # noqa: E402
from tools.docs_results._common import machine_description, run_metadata  # noqa: E402
from tools.docs_results import version_floor  # noqa: E402
from tools.docs_results.suite import pytest_counts  # noqa: E402

FLOOR_RESULTS = "version-floor"
"""``docs/results/version-floor.json``: the model tests on each torch × Transformers pair ``--torch`` ran."""

REMOTE_CODE_TEST_FILES = (
    "tests/test_remote_code_entropy_invariant.py",
    "tests/test_remote_code_gau.py",
    "tests/test_remote_code_synthesizer.py",
)
@dataclass
class SuiteResult:
    """One suite on one release: pytest's counts, seconds, and the tail of its output when it failed."""

    release: str
    suite: str
    passed: int
    failed: int
    skipped: int
    seconds: float
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0


def newest_transformers() -> str:
    """The newest ``transformers`` release on the index pip is configured with (``pip index versions``)."""
    result = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "transformers"],
                            capture_output=True, text=True, check=False)
    match = re.search(r"^transformers \(([^)]+)\)", result.stdout, re.MULTILINE)
    if result.returncode != 0 or match is None:
        raise SystemExit("compat: could not ask the package index for transformers "
                         f"releases:\n{result.stderr[-2000:]}")
    return match.group(1)


def counts(output: str) -> tuple[int, int, int]:
    """(passed, failed + errors, skipped) from pytest's last summary line
    (``results.suite.pytest_counts``)."""
    found = pytest_counts(output)
    return found.get("passed", 0), found.get("failed", 0) + found.get("errors", 0), found.get("skipped", 0)


def run_suite(release: str, suite: str, command: list[str], env: dict[str, str]) -> SuiteResult:
    """Run one pytest command; its counts, time and (on failure) output tail."""
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    passed, failed, skipped = counts(result.stdout)
    if result.returncode != 0 and failed == 0:
        failed = 1  # a crash or a collection error: no summary counts it
    tail = "" if result.returncode == 0 else (result.stdout[-4000:] + result.stderr[-2000:])
    return SuiteResult(release, suite, passed, failed, skipped, time.monotonic() - started, tail)


def base_env() -> dict[str, str]:
    """This process's environment without this virtual environment's paths, offline and quiet."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_XDIST_WORKER")}
    base.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return base


def model_tests(python: Path, release: str) -> SuiteResult:
    """(b): the model test files in the clean environment of ``python``, this package from ``src/``."""
    model_env = {**base_env(), "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
                 "OMP_NUM_THREADS": "1"}
    # The clean environments hold no pytest-xdist: the model files run in one process there.
    model_command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODEL_TEST_FILES]
    return run_suite(release, f"model tests ({len(MODEL_TEST_FILES)} files)", model_command, model_env)


def check_release(release: str, workers: str) -> list[SuiteResult]:
    """(a) remote code of every family and (b) the model test files, on ``release``."""
    pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers]
    remote_env = {**base_env(), "HF_ATTN_VARIANTS_REMOTE_RELEASES": release}
    remote = run_suite(release, "remote code (3 families)",
                       [sys.executable, *pytest, *REMOTE_CODE_TEST_FILES], remote_env)
    return [remote, model_tests(clean_python(release), release)]


def installed_versions(python: Path) -> dict[str, str]:
    """torch (with its build tag: ``2.7.0+cu126``), Triton (where installed) and numpy in the environment of
    ``python``."""
    code = ("import importlib.metadata as m, json, torch\n"
            "def v(name):\n"
            "    try:\n"
            "        return m.version(name)\n"
            "    except m.PackageNotFoundError:\n"
            "        return None\n"
            "print(json.dumps({'torch': torch.__version__, 'triton': v('triton'), 'numpy': v('numpy')}))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                          env=base_env())
    return {name: version for name, version in json.loads(done.stdout).items() if version}


def check_torch(torch_version: str, releases: list[str], keep_env: bool) -> Iterator[dict[str, Any]]:
    """(b) on ``torch_version`` with each of ``releases``: one row each, as it finishes (versions installed,
    counts, seconds with the environment's build, date, machine). The environments of a torch other than
    the installed one are deleted afterwards unless ``keep_env``."""
    for release in releases:
        started = time.monotonic()
        row: dict[str, Any] = {"torch": torch_version, "transformers": release}
        try:
            python = clean_python(release, torch_version)
        except RuntimeError as error:  # pip could not build it (no such release for this Python, say)
            row.update(passed=0, failed=1, skipped=0, error=" ".join(str(error).split())[-400:])
        else:
            row["installed"] = installed_versions(python)
            result = model_tests(python, release)
            row.update(passed=result.passed, failed=result.failed, skipped=result.skipped,
                       **({"tail": result.tail[-1500:]} if result.tail else {}))
            if not keep_env and torch_version != installed_torch():
                shutil.rmtree(python.parents[1], ignore_errors=True)
                python.parents[1].with_name(python.parents[1].name + ".lock").unlink(missing_ok=True)
        yield {**row, "seconds": round(time.monotonic() - started), "date": datetime.date.today().isoformat(),
               "machine": machine_description()}


def installed_torch() -> str:
    """The (public) version of the torch installed here."""
    return importlib.metadata.version("torch").split("+")[0]


def record_floor(rows: list[dict[str, Any]], command: list[str], root: Path = REPO) -> Path:
    """Merge ``rows`` into ``docs/results/version-floor.json`` under ``root``: a row replaces the recorded one
    of the same torch and Transformers."""
    path = results_path(root, FLOOR_RESULTS)
    old = load_results(root, FLOOR_RESULTS)["rows"] if path.is_file() else []
    keys = {(row["torch"], row["transformers"]) for row in rows}
    kept = [row for row in old if (row["torch"], row["transformers"]) not in keys]
    data = {**run_metadata("version_floor", command), "rows": [*kept, *rows]}
    return write_results(root, FLOOR_RESULTS, data)


def main_torch(args: argparse.Namespace) -> int:
    """``--torch``: (b) on each torch release × Transformers release; the table, and ``--record``."""
    releases = args.releases or list(dict.fromkeys([TRANSFORMERS_RELEASES[0], installed_transformers()]))
    print(f"compat: model tests on torch {', '.join(args.torch)} × transformers {', '.join(releases)}",
          flush=True)
    rows: list[dict[str, Any]] = []
    for torch_version in args.torch:
        for row in check_torch(torch_version, releases, args.keep_envs):
            rows.append(row)
            print(f"compat: torch {row['torch']}, transformers {row['transformers']}: "
                  f"{row['passed']} passed, {row['failed']} failed, {row['skipped']} skipped "
                  f"({row['seconds']} s)", flush=True)
            for key in ("error", "tail"):
                if row.get(key):
                    print(row[key], flush=True)
    command = ["python", "scripts/compat.py", "--torch", *args.torch, "--releases", *releases, "--record"]
    print()
    print(version_floor.table({"command": shlex.join(command), "rows": rows}))
    if args.record:
        print(f"\ncompat: wrote {record_floor(rows, command).relative_to(REPO)}")
    return 0 if all(version_floor.passed(row) for row in rows) else 1


def table(results: list[SuiteResult]) -> str:
    """The Markdown table of all results."""
    lines = ["| transformers | suite | passed | failed | skipped | time | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        verdict = "ok" if r.ok else "**FAILED**"
        lines.append(f"| {r.release} | {r.suite} | {r.passed} | {r.failed} | {r.skipped} | {r.seconds:.0f} s "
                     f"| {verdict} |")
    return "\n".join(lines)


def main() -> int:
    """Check each release, print the table, write the JSON; 1 when anything failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", nargs="+", default=None,
                        help="Transformers releases to check (default: the newest on the index and the "
                             "installed one).")
    parser.add_argument("--workers", default=os.environ.get("PYTEST_WORKERS", "2"),
                        help="pytest-xdist workers for (a).")
    parser.add_argument("--torch", nargs="+", default=None, metavar="VERSION",
                        help="Run the model tests on these torch releases instead (the declared minimum; "
                             "default releases: the oldest supported Transformers and the installed one).")
    parser.add_argument("--keep-envs", action="store_true",
                        help="With --torch: keep the environments (several GB each); deleted otherwise.")
    parser.add_argument("--record", action="store_true",
                        help="With --torch: merge the rows into docs/results/version-floor.json.")
    args = parser.parse_args()
    if args.torch is None and (args.record or args.keep_envs):
        parser.error("--record and --keep-envs go with --torch")
    if args.torch is not None:
        return main_torch(args)
    releases = args.releases or list(dict.fromkeys([newest_transformers(), installed_transformers()]))
    print(f"compat: transformers {', '.join(releases)} (installed: {installed_transformers()}, torch "
          f"{importlib.metadata.version('torch')})", flush=True)
    results: list[SuiteResult] = []
    for release in releases:
        for result in check_release(release, args.workers):
            results.append(result)
            print(f"compat: {release}: {result.suite}: {result.passed} passed, {result.failed} failed, "
                  f"{result.skipped} skipped ({result.seconds:.0f} s)", flush=True)
            if result.tail:
                print(result.tail, flush=True)
    print()
    print(table(results))
    out = REPO / "runs" / "compat" / f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(f"\ncompat: wrote {out.relative_to(REPO)}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
