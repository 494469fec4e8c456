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

Usage: ``python scripts/compat.py [--releases 5.24.0 5.25.0] [--workers 2]`` (``make compat``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.remote_code import clean_python, installed_transformers  # noqa: E402
from tests.test_transformers_floor import MODEL_TEST_FILES  # noqa: E402
from tools.docs_results.suite import pytest_counts  # noqa: E402

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


def check_release(release: str, workers: str) -> list[SuiteResult]:
    """(a) remote code of every family and (b) the model test files, on ``release``."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_XDIST_WORKER")}
    base.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers]
    remote_env = {**base, "HF_ATTN_VARIANTS_REMOTE_RELEASES": release}
    remote = run_suite(release, "remote code (3 families)",
                       [sys.executable, *pytest, *REMOTE_CODE_TEST_FILES], remote_env)
    python = clean_python(release)
    model_env = {**base, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
                 "OMP_NUM_THREADS": "1"}
    # The clean environments hold no pytest-xdist: the model files run in one process there.
    model_command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODEL_TEST_FILES]
    model = run_suite(release, f"model tests ({len(MODEL_TEST_FILES)} files)", model_command, model_env)
    return [remote, model]


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
    args = parser.parse_args()
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
