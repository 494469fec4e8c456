"""Publish a study of ``hf-attn-variants lengthgen`` into the results file the docs render
(docs/results/NAME.json). A maintainer tool of the repository, not part of the installed package;
``scripts/run_length_study.sh`` and ``scripts/run_retrieval_study.sh`` call it at their end, then
``tools/render_docs.py``.

Run from the repository root::

    python tools/publish_study.py length runs/length_study/results.json length-study --command "…"
    --wall-seconds 900 python tools/publish_study.py rerun runs/relu2/results.json length-study --command "…"
    --code "commit abc" python tools/publish_study.py retrieval retrieval-study runs/r/passkey/results.json
    runs/r/mqar/results.json \\
        --command "…" --plot docs/length_generalization_retrieval.png
    python tools/publish_study.py replication runs/passkey_64/results.json retrieval-study --command "…"
    python tools/publish_study.py hybrid hybrid-study runs/h/passkey/results.json runs/h/mqar/results.json \
        --entropy runs/h/passkey/entropy.json runs/h/mqar/entropy.json --command "…"
    python tools/publish_study.py entropy runs/e/entropy.json attention-entropy --study runs/e/results.json \
        --command "…" --plot docs/length_generalization_entropy.png
    python tools/publish_study.py calibration mqar-calibration runs/c1/results.json runs/c2/results.json \
        --command "…"

Prints the file it wrote; a study that cannot be published exits with status 1 and one line saying why.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root makes ``tools`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.docs_results.publish import (  # noqa: E402
    publish,
    publish_calibration,
    publish_entropy,
    publish_hybrid,
    publish_replication,
    publish_rerun,
    publish_retrieval,
)


def parser() -> argparse.ArgumentParser:
    """The seven subcommands and their flags."""
    main_parser = argparse.ArgumentParser(prog="tools/publish_study.py", description=__doc__.splitlines()[0])
    steps = main_parser.add_subparsers(dest="step", required=True)
    for step, what in (("length", "a length-generalisation study (kind lengthgen)"),
                       ("rerun", "a re-run of some of its variants, added to the study's file"),
                       ("replication",
                        "a passkey study at the reported setting, added to the retrieval file")):
        sub = steps.add_parser(step, help=f"Publish {what}.")
        sub.add_argument("results_json", type=Path, help="The study's results.json.")
        sub.add_argument("name", help="The results file under docs/results/, without .json.")
    retrieval = steps.add_parser("retrieval",
                                 help="Publish the retrieval study (kind retrieval) from its tasks.")
    retrieval.add_argument("name", help="The results file under docs/results/, without .json.")
    retrieval.add_argument("results_jsons", type=Path, nargs="+", help="Each task study's results.json.")
    retrieval.add_argument("--plot", type=Path, default=None,
                           help="Also draw the combined accuracy figure here.")
    hybrid = steps.add_parser("hybrid", help="Publish the hybrid position study (kind hybrid) from its tasks "
                                             "and the entropy of their models.")
    hybrid.add_argument("name", help="The results file under docs/results/, without .json.")
    hybrid.add_argument("results_jsons", type=Path, nargs="+", help="Each task study's results.json.")
    hybrid.add_argument("--entropy", type=Path, nargs="+", required=True,
                        help="hf-attn-variants entropy's output for each task's models.")
    hybrid.add_argument("--plot", type=Path, default=None, help="Also draw the accuracy figure here.")
    entropy = steps.add_parser("entropy", help="Publish an output of hf-attn-variants entropy (kind "
                                               "attention_entropy).")
    entropy.add_argument("entropy_json", type=Path, help="The command's results file.")
    entropy.add_argument("name", help="The results file under docs/results/, without .json.")
    entropy.add_argument("--study", type=Path, default=None,
                         help="The results.json of the study that trained the models (their accuracy).")
    entropy.add_argument("--plot", type=Path, default=None, help="Copy the command's figure here.")
    calibration = steps.add_parser("calibration", help="Publish single calibration runs (kind calibration).")
    calibration.add_argument("name", help="The results file under docs/results/, without .json.")
    calibration.add_argument("results_jsons", type=Path, nargs="+", help="Each run's results.json.")
    for sub in steps.choices.values():
        sub.add_argument("--command", required=True, help="The command line that ran the study (recorded).")
        sub.add_argument("--root", type=Path, default=Path("."), help="Repository root (default: here).")
        if sub not in (steps.choices["replication"], steps.choices["entropy"], steps.choices["calibration"]):
            sub.add_argument("--wall-seconds", type=float, default=None, help="How long the study took.")
    steps.choices["rerun"].add_argument("--code", default=None, help="The commit or tree the re-run ran.")
    steps.choices["replication"].add_argument(
        "--key", default="replication", choices=("replication", "probe"),
        help="replication: the author's length, steps and sizes; probe: the full setting of issue 39's "
             "probe.")
    return main_parser


def run(args: argparse.Namespace) -> Path:
    """Write the results file ``args`` describe; returns its path."""
    common = {"root": args.root, "command": args.command}
    if args.step == "length":
        return publish(args.results_json, args.name, wall_seconds=args.wall_seconds, **common)
    if args.step == "rerun":
        return publish_rerun(args.results_json, args.name, wall_seconds=args.wall_seconds, code=args.code,
                             **common)
    if args.step == "replication":
        return publish_replication(args.results_json, args.name, key=args.key, **common)
    if args.step == "calibration":
        return publish_calibration(args.results_jsons, args.name, **common)
    if args.step == "entropy":
        return publish_entropy(args.entropy_json, args.name, study_json=args.study, plot=args.plot, **common)
    if args.step == "hybrid":
        return publish_hybrid(args.results_jsons, args.entropy, args.name, wall_seconds=args.wall_seconds,
                              plot=args.plot, **common)
    return publish_retrieval(args.results_jsons, args.name, wall_seconds=args.wall_seconds, plot=args.plot,
                             **common)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and publish; returns the exit status."""
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        path = run(args)
    except (OSError, ValueError, KeyError) as error:  # a ResultsError or a JSONDecodeError is a ValueError
        kind = "" if isinstance(error, ValueError) else f"{type(error).__name__}: "
        print(f"tools/publish_study.py {args.step}: error: {kind}{error}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
