"""Publish the last ``make demo`` run (``runs/demo/results.json``) as ``docs/results/demo-cpu.json`` and
re-render the docs that quote it (README's demo time, docs/training.md's demo table).

``make demo`` itself never writes into ``docs/`` (a new user's run must not change tracked files); run this
from the repository root, on the machine the demo ran on, when its numbers should become the documented ones:
``.venv/bin/python scripts/publish_demo.py [--results runs/demo/results.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import load_results, render_docs, results_path, write_results  # noqa: E402
from tools.docs_results._common import run_metadata  # noqa: E402
from tools.docs_results.demo import from_report  # noqa: E402
from scripts.script_paths import positive_problem  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments; ``parser.error`` (status 2) naming the flag of a bad one, before anything is written.
    ``report`` holds ``--results``'s demo report, checked by turning it into the results data."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "runs" / "demo" / "results.json")
    parser.add_argument("--wall-seconds", type=float, required=True,
                        help="Wall-clock seconds of the whole `make demo` (e.g. from `time make demo`).")
    parser.add_argument("--cpu-seconds", type=float, default=None,
                        help="CPU seconds (user + sys) of that run.")
    parser.add_argument("--conditions",
                        default="`make demo` in a fresh clone, `.venv` installed from the lock",
                        help="How the timed run was made (shown with the time).")
    args = parser.parse_args(argv)
    for flag, value in (("--wall-seconds", args.wall_seconds), ("--cpu-seconds", args.cpu_seconds)):
        problem = None if value is None else positive_problem(value, "seconds")
        if problem:
            parser.error(f"{flag} {problem}")
    if not args.results.is_file():
        parser.error(f"--results {args.results}: no such file; run `make demo` first.")
    try:
        args.report = json.loads(args.results.read_text(encoding="utf-8"))
        from_report(args.report)  # the fields the results file takes
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        parser.error(f"--results {args.results}: not the results of `make demo` (runs/demo/results.json): "
                     f"{type(error).__name__}: {' '.join(str(error).split())[:200]}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    provenance = run_metadata("demo", "make demo (= python -m hf_attn_variants demo)")
    data = from_report(args.report, **provenance)
    data["make_demo"] = {"wall_seconds": round(args.wall_seconds), "conditions": args.conditions}
    if args.cpu_seconds is not None:
        data["make_demo"]["cpu_seconds"] = round(args.cpu_seconds)
    if results_path(ROOT, "demo-cpu").is_file():  # earlier runs, which the docs compare with
        previous = load_results(ROOT, "demo-cpu")
        data["earlier_runs"] = previous.get("earlier_runs", [])
        if previous.get("make_demo", {}).get("earlier"):
            data["make_demo"]["earlier"] = previous["make_demo"]["earlier"]
    write_results(ROOT, "demo-cpu", data)
    print("\n".join(render_docs(ROOT)) or "publish_demo: docs unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
