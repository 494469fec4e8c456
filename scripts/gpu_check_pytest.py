"""A pytest plugin of ``scripts/gpu_check.py``: each test's outcome written the moment pytest has it, and a
crash kept with its traceback.

Loaded with ``-p gpu_check_pytest`` (``scripts/`` on ``PYTHONPATH``) and active when ``GPU_CHECK_REPORTS``
names a folder:

- ``reports.jsonl``: one JSON object a line per test phase that decides an outcome (the call; a setup that
  failed or skipped; a teardown that failed): ``{test, when, outcome, message, traceback, duration_s}``,
  appended and flushed by the process that reports (pytest-xdist's controller, or pytest itself), so a run
  stopped at any moment keeps every outcome it had;
- ``fault-<pid>.log``: per process that runs tests, the id of the test it is running, then what
  ``faulthandler`` writes if the process dies of a signal (a segmentation fault in a compiled kernel, say).
  When pytest-xdist reports a crashed worker, the test's line carries that traceback; a crash that ends a run
  without xdist is found from these files by ``crashes`` afterwards.
"""

from __future__ import annotations

import faulthandler
import json
import os
from pathlib import Path
from typing import IO, Any

import pytest

REPORTS_ENV = "GPU_CHECK_REPORTS"
REPORTS_FILE = "reports.jsonl"
TRACEBACK_CHARS = 6000
"""How much of a failure's traceback a line keeps (its end, where the error is)."""


def reports_folder() -> Path | None:
    folder = os.environ.get(REPORTS_ENV)
    return Path(folder) if folder else None


def is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands tests to pytest-xdist workers (and so runs none itself)."""
    return config.pluginmanager.hasplugin("dsession")


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


class FaultLog:
    """``fault-<pid>.log`` of a process that runs tests: rewritten at each test's start with its id; the
    target of ``faulthandler`` for the process's life."""

    def __init__(self, folder: Path) -> None:
        self.file: IO[str] = open(folder / f"fault-{os.getpid()}.log", "w+", encoding="utf-8")  # noqa: SIM115
        faulthandler.enable(file=self.file, all_threads=True)

    def starting(self, nodeid: str) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.file.write(nodeid + "\n")
        self.file.flush()


def crash_traceback(folder: Path, nodeid: str) -> str:
    """What ``faulthandler`` wrote when the process running ``nodeid`` died ("" when nothing was)."""
    for path in sorted(folder.glob("fault-*.log")):
        test, _, rest = path.read_text(encoding="utf-8", errors="replace").partition("\n")
        if test == nodeid and rest.strip():
            return rest.strip()
    return ""


def crashes(folder: Path) -> list[dict[str, Any]]:
    """A line per fault file that holds a traceback: the test that was running when its process died."""
    found = []
    for path in sorted(folder.glob("fault-*.log")):
        test, _, rest = path.read_text(encoding="utf-8", errors="replace").partition("\n")
        if test and rest.strip():
            found.append(report_line(test, "call", "failed", crash_message(rest), rest.strip(), 0.0))
    return found


def crash_message(traceback: str) -> str:
    """The first line of a ``faulthandler`` dump ("Fatal Python error: Segmentation fault")."""
    first = next((line.strip() for line in traceback.splitlines() if line.strip()), "")
    return f"the process crashed: {first}" if first else "the process crashed"


def report_line(test: str, when: str, outcome: str, message: str, traceback: str,
                duration: float) -> dict[str, Any]:
    return {"test": test, "when": when, "outcome": outcome, "message": message,
            "traceback": traceback[-TRACEBACK_CHARS:], "duration_s": round(duration, 3)}


def skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    return reason.removeprefix("Skipped: ")


def failure_message(report: pytest.TestReport) -> str:
    """The error line of a failure (``reprcrash``'s message), else the last line of its text."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", ""):
        return str(crash.message)
    lines = [line for line in report.longreprtext.splitlines() if line.strip()]
    return lines[-1] if lines else "failed"


def decides(report: pytest.TestReport) -> bool:
    """Whether this phase's report decides the test's outcome (the call, or a setup/teardown that did not
    pass)."""
    return report.when == "call" or not report.passed


class Reporter:
    """Appends a line to ``reports.jsonl`` per deciding report (in the process that reports)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.file = open(folder / REPORTS_FILE, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, report: pytest.TestReport) -> None:
        if report.skipped:
            line = report_line(report.nodeid, report.when, "skipped", skip_reason(report), "",
                               report.duration)
        elif report.failed:
            traceback = report.longreprtext
            message = failure_message(report)
            outcome = "failed" if report.when == "call" else "errors"
            if "crashed while running" in traceback:  # pytest-xdist: the worker died running this test
                dump = crash_traceback(self.folder, report.nodeid)
                message = crash_message(dump) if dump else message
                traceback = dump or traceback
                outcome = "failed"
            line = report_line(report.nodeid, report.when, outcome, message, traceback, report.duration)
        else:
            line = report_line(report.nodeid, report.when, "passed", "", "", report.duration)
        self.file.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.file.flush()


class GpuCheckPlugin:
    def __init__(self, config: pytest.Config, folder: Path) -> None:
        self.reporter = None if is_xdist_worker(config) else Reporter(folder)
        self.faults = None if is_xdist_controller(config) else FaultLog(folder)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        if self.faults is not None:
            self.faults.starting(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.reporter is not None and decides(report):
            self.reporter.write(report)


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler plugin, whose stderr target this replaces
def pytest_configure(config: pytest.Config) -> None:
    folder = reports_folder()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        config.pluginmanager.register(GpuCheckPlugin(config, folder), "gpu_check_reports")
