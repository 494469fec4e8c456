"""Loss and grad-norm reduction of Transformers' overfitting test per GAU normalisation and initialisation.

Runs upstream's ``TrainingTesterMixin.test_training_overfit`` (the same cases as
tests/conformance/test_training_overfit.py) for each GAU variant with ``gau_init`` "gau_alpha" (the default)
and "flash" (the FLASH paper's N(0, 0.02)), for each seed (the mixin's own is 42; other seeds replace the
mixin's ``set_seed`` argument), and prints the markdown table of docs/gau.md.

    .venv/bin/python scripts/gau_init_study.py [--seeds 42 1 2] [--out runs/gau_init_study.json] [--results
    gau-init]

``--results NAME`` also writes the results file ``docs/results/NAME.json`` (kind ``gau_init``), whose
``table`` view (``tools.docs_results.gau_init``) renders the same table into a document that embeds
``<!-- results: NAME table -->`` (then run ``python tools/render_docs.py``).

About 10 s per run on a 2-core CPU (14 runs per seed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.script_paths import output_file_problem, results_name_problem  # noqa: E402
from tests.conformance.test_training_overfit import OVERFIT_VARIANTS, overfit_case  # noqa: E402

METRIC = re.compile(r"(loss_reduction|grad_norm_reduction):\s*(-?[\d.]+)%")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class MetricCollector(logging.Handler):
    """Keeps the reductions the mixin logs (``loss_reduction: 97.6%``)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, float] = {}
        self.generation_matches: bool | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = ANSI.sub("", record.getMessage())
        for name, value in METRIC.findall(text):
            self.values[name] = float(value)
        if "Generation matches" in text:
            self.generation_matches = True
        elif "Generation mismatch" in text:
            self.generation_matches = False


def run_case(name: str, family: str, variant: dict, seed: int = 42) -> dict:
    """Run one overfitting test with ``seed``; return its reductions, generation match and pass/fail."""
    import transformers

    mixin_module = sys.modules[overfit_case(name, family, variant).__mro__[1].__module__]
    mixin_module.set_seed = lambda _seed: transformers.set_seed(seed)
    collector = MetricCollector()
    logger = logging.getLogger("transformers.training_test")
    logger.addHandler(collector)
    try:
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(overfit_case(name, family, variant))
        with open(os.devnull, "w") as quiet:
            result = unittest.TextTestRunner(stream=quiet, verbosity=0).run(suite)
    finally:
        logger.removeHandler(collector)
    return {**collector.values, "generation_matches": collector.generation_matches,
            "passed": result.wasSuccessful()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments; ``parser.error`` (status 2) naming the flag of a bad one, before any run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42], help="Seeds (the mixin's own is 42).")
    parser.add_argument("--variants", nargs="+", default=None,
                        help="Only these GAU variants (names of OVERFIT_VARIANTS without 'GAU_'; default: "
                             "all).")
    parser.add_argument("--out", type=Path, default=None, help="Also write the results as JSON here.")
    parser.add_argument("--results", default=None,
                        help="Also write the results file docs/results/<RESULTS>.json (kind gau_init) for "
                             "the docs.")
    args = parser.parse_args(argv)
    if min(args.seeds) < 0 or len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must be distinct non-negative integers, got {args.seeds}")
    known = [name.removeprefix("GAU_") for name, (family, _) in OVERFIT_VARIANTS.items() if family == "gau"]
    unknown = [name for name in args.variants or () if name not in known]
    if unknown:
        parser.error(f"--variants: unknown variant(s) {unknown}; allowed: {known}")
    problem = None if args.out is None else output_file_problem(args.out)
    if problem:
        parser.error(f"--out: {problem}")
    problem = None if args.results is None else results_name_problem(REPO, args.results)
    if problem:
        parser.error(f"--results: {problem}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for name, (family, variant) in OVERFIT_VARIANTS.items():
        if family != "gau" or (args.variants and name.removeprefix("GAU_") not in args.variants):
            continue
        for init in ("gau_alpha", "flash"):
            for seed in args.seeds:
                result = run_case(f"{name}_{init}", family, {**variant, "gau_init": init}, seed)
                rows.append({"variant": name.removeprefix("GAU_"), "gau_init": init, "seed": seed, **result})
                print(f"{name:24s} {init:9s} {seed:3d} {result}", file=sys.stderr, flush=True)
    print("| normalisation | gau_init | seeds | loss reduction | grad-norm reduction | generates the pattern "
          "| passed |")
    print("|---|---|---|---|---|---|---|")
    for index in range(0, len(rows), len(args.seeds)):
        group = rows[index : index + len(args.seeds)]
        loss = " / ".join(f"{r.get('loss_reduction', float('nan')):.1f}" for r in group)
        grad = " / ".join(f"{r.get('grad_norm_reduction', float('nan')):.1f}" for r in group)
        generated = sum(bool(r["generation_matches"]) for r in group)
        passed = sum(r["passed"] for r in group)
        print(f"| {group[0]['variant']} | {group[0]['gau_init']} | {len(group)} | {loss} % | {grad} % | "
              f"{generated}/{len(group)} | {passed}/{len(group)} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))
    if args.results:
        from tools.docs_results import write_results
        from tools.docs_results._common import run_metadata

        command = ["python", "scripts/gau_init_study.py", *(sys.argv[1:] if argv is None else argv)]
        data = run_metadata("gau_init", command)
        data.update({"seeds": args.seeds, "rows": rows})
        print(f"wrote {write_results(REPO, args.results, data)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
