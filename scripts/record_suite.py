"""Record one timed run of the suite (or the demo) in ``docs/results/suite.json`` and re-render the docs.

Usage: ``python scripts/record_suite.py --label "fresh clone, make test" --command "make test" --minutes 12.3
[--log pytest.log] [--isa AVX2] [--mkl-vendor intel]``. With ``--log``, pytest's closing line ("N passed, M
skipped …") gives the counts. Run it from the repository root with the package's environment.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import load_results, render_docs, results_path, write_results  # noqa: E402
from tools.docs_results._common import MKL_PATH_NAMES, machine_description, versions  # noqa: E402
from tools.docs_results.suite import pytest_counts  # noqa: E402
from scripts.script_paths import positive_problem  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME = "suite"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments; ``parser.error`` (status 2) naming the flag of a bad one, before anything is read or
    written. ``counts`` holds ``--log``'s pytest counts (``None`` without it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--isa", default=None, help="The ONEDNN_MAX_CPU_ISA the run had, if any.")
    parser.add_argument("--mkl-vendor", choices=tuple(MKL_PATH_NAMES), default=None,
                        help="The MKL_VENDOR the run had (make test MKL_VENDOR=...; tests/mkl_dispatch.py), "
                             "if any.")
    args = parser.parse_args(argv)
    for flag, value in (("--label", args.label), ("--command", args.command)):
        if not value.strip():
            parser.error(f"{flag} must not be empty")
    problem = positive_problem(args.minutes, "minutes")
    if problem:
        parser.error(f"--minutes {problem}")
    args.counts = None
    if args.log is not None:
        if not args.log.is_file():
            parser.error(f"--log: {str(args.log)!r} is not a file (pytest's output of the timed run)")
        try:
            args.counts = pytest_counts(args.log.read_text(errors="replace"))
        except OSError as error:
            parser.error(f"--log: {str(args.log)!r} cannot be read ({error.strerror})")
        if not args.counts:
            parser.error(f"--log: {str(args.log)!r} has no pytest summary line (\"N passed, M skipped …\")")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = load_results(ROOT, NAME) if results_path(ROOT, NAME).exists() else {"kind": "suite", "runs": []}
    run = {"label": args.label, "command": args.command, "machine": machine_description(), "isa": args.isa,
           "mkl_vendor": args.mkl_vendor, "versions": versions(), "minutes": args.minutes,
           "date": datetime.date.today().isoformat()}
    if args.log is not None:
        run["counts"] = args.counts
    data["runs"] = [r for r in data["runs"] if r["label"] != args.label] + [run]
    # The file's own provenance fields are those of its newest run (each run keeps its own too).
    data.update(command="python scripts/record_suite.py (one entry per timed run)", machine=run["machine"],
                versions=run["versions"], date=run["date"])
    write_results(ROOT, NAME, data)
    print("\n".join(render_docs(ROOT)) or "record_suite: docs unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
