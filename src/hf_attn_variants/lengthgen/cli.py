"""``hf-attn-variants lengthgen``: train variants at length L, evaluate them at other lengths, report.

Examples::

    hf-attn-variants lengthgen --quick --output_dir runs/lg-smoke          # seconds: two variants
    hf-attn-variants lengthgen --train_length 64 --max_train_steps 400 --seeds 0 1 2 --finetune
    hf-attn-variants lengthgen --variants gau_relu2_dynamic gau_relu2_fixed --mixed_length

Rerunning the same command resumes: finished variant × seed runs are skipped.
"""

from __future__ import annotations

import argparse
import logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``LengthGenArguments`` field."""
    from ..cli_utils import add_dataclass_arguments
    from .arguments import LengthGenArguments

    add_dataclass_arguments(parser, LengthGenArguments)


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: validate the flags, run the study, print where the results are. A bad flag value
    (``FlagError``, found before anything is written) gives one error line naming it and exit status 2."""
    from ..cli_utils import FlagError, dataclasses_from_namespace, fail_flag
    from .arguments import LengthGenArguments, check_study_inputs
    from .study import run_study

    try:
        (args,) = dataclasses_from_namespace(namespace, LengthGenArguments)
        check_study_inputs(args)
    except FlagError as error:
        return fail_flag("lengthgen", error)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_attn_variants").setLevel(logging.INFO)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import datasets

    datasets.disable_progress_bars()  # tokenizing the corpus once per run: noise in a long study's log
    report = run_study(args)
    print(f"lengthgen: {len(report['runs'])} runs ({report.get('skipped_runs', 0)} reused); results in "
          f"{args.output_dir}/results.md, results.json, results.csv, summary.csv and lengthgen_*.png")
    return 0


__all__ = ["add_arguments", "run"]
