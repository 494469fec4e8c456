"""``hf-attn-variants lengthgen``: train variants at length L, evaluate them at other lengths, report.

Examples::

    hf-attn-variants lengthgen --quick --output_dir runs/lg-smoke          # seconds: two variants
    hf-attn-variants lengthgen --train_length 64 --max_train_steps 400 --seeds 0 1 2 --finetune
    hf-attn-variants lengthgen --variants gau_relu2_dynamic gau_relu2_fixed --mixed_length
    hf-attn-variants lengthgen --task passkey --quick --output_dir runs/passkey-smoke     # retrieval, seconds
    hf-attn-variants lengthgen --task mqar --seeds 0 1 2 --output_dir runs/retrieval_study/mqar

Rerunning the same command resumes: finished variant × seed runs are skipped. The output folder follows the
rule of every command with an ``--output_dir`` (``training/outputs.py``, ``LENGTHGEN_RULE``): the study
records its flags in ``run.json``; more ``--variants``/``--seeds`` (or ``--mixed_length``, ``--finetune``)
extend the study in place, other evaluation settings (``EVALUATION_ONLY``) re-evaluate the trained models
without retraining them, any other changed flag is refused in one sentence naming it and
``--overwrite_output_dir`` (which clears the folder first; not with parallel workers on one folder, whose runs
it would delete).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from ..training.outputs import OutputRule

STUDY_EXTENT = frozenset({"variants", "seeds", "mixed_length", "finetune", "finetune_tasks",
                          "position_embedding_types"})
"""Flags that only add runs to a study (its other runs stay valid): a rerun with more of them extends the
folder."""

EVALUATION_ONLY = frozenset({"eval_lengths", "eval_seed", "eval_mask_repeats", "max_eval_tokens"})
"""Flags that only change how runs are evaluated: a rerun with other values re-evaluates the stored models
without retraining them (they are in the evaluation fingerprint only; the retrieval tasks, which keep no
model unless ``--save_models``, fingerprint them with the run and train it again)."""


def _legacy_arguments(folder: Path) -> dict[str, Any] | None:
    """The flags of a study folder written before ``run.json``: the ``args`` of its ``results.json``."""
    try:
        report = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return None
    return report.get("args") if isinstance(report, dict) and isinstance(report.get("args"), dict) else None


LENGTHGEN_RULE = OutputRule(
    command="lengthgen",
    aside=STUDY_EXTENT | EVALUATION_ONLY | {"checkpointing_steps", "num_threads", "quick", "disable_tqdm",
                                            "no_plot", "save_models", "eval_batch_size", "eval_memory_gib"},
    run_files=("runs", "finetune", "results.json", "results.csv", "summary.csv", "results.md",
               "lengthgen_*.png"),
    refuse_finished=False,  # rerunning a finished study reuses its runs
    legacy_arguments=_legacy_arguments,
)
"""``lengthgen``'s output folder (``training/outputs.py``)."""
TASK_RULE = dataclasses.replace(LENGTHGEN_RULE, aside=LENGTHGEN_RULE.aside - EVALUATION_ONLY)
"""The folder of a retrieval study (``--task``): its runs fingerprint the evaluation flags with the training
(they keep no model unless ``--save_models``), so a changed one is refused as before, not a retraining."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags: one per ``LengthGenArguments`` field, and ``--overwrite_output_dir``."""
    from ..cli_utils import add_dataclass_arguments
    from ..training.outputs import OutputDirArguments
    from .arguments import LengthGenArguments

    add_dataclass_arguments(parser, LengthGenArguments, OutputDirArguments)


def _start(namespace: argparse.Namespace) -> Any:
    """The study's arguments, every input and the output folder checked (``FlagError``); then the folder is
    cleared (``--overwrite_output_dir``) and the study recorded in its ``run.json``."""
    from ..cli_utils import dataclasses_from_namespace
    from ..training.outputs import OutputDirArguments, check_output_folder, json_arguments, start_run
    from .arguments import TASK_ONLY_FIELDS, LengthGenArguments, check_study_inputs

    args, output = dataclasses_from_namespace(namespace, LengthGenArguments, OutputDirArguments)
    check_study_inputs(args)
    arguments = json_arguments(args)
    if args.task == "lm":  # recorded as before the tasks existed, so earlier lm study folders stay valid
        for name in TASK_ONLY_FIELDS:
            arguments.pop(name, None)
    rule = TASK_RULE if args.is_task else LENGTHGEN_RULE
    folder = check_output_folder(rule, args.output_dir, arguments,
                                 overwrite=output.overwrite_output_dir,
                                 write_into=output.write_into_output_dir,
                                 inputs={"train_file": args.train_file,
                                         "validation_file": args.validation_file})
    start_run(rule, folder, arguments)
    return args


def run(namespace: argparse.Namespace) -> int:
    """CLI entry: validate the flags and the output folder, run the study, print where the results are. A bad
    flag value or output folder (``FlagError``, found before anything is written) gives one error line naming
    it and exit status 2; SIGTERM/SIGUSR1 (or Ctrl-C) during a run's training, its checkpoint, one line and
    ``PREEMPTED_EXIT_CODE`` (75; ``INTERRUPTED_EXIT_CODE``, 130, after Ctrl-C)."""
    from ..cli_utils import FlagError, fail_flag
    from ..training.outputs import finish_run
    from ..training.preemption import COMMAND_STOP_SIGNALS, StopSignals, TrainingPreempted, preempted_exit
    from .retrieval_study import run_retrieval_study
    from .study import run_study

    try:
        args = _start(namespace)
    except FlagError as error:
        return fail_flag("lengthgen", error)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_attn_variants").setLevel(logging.INFO)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import datasets

    datasets.disable_progress_bars()  # tokenizing the corpus once per run: noise in a long study's log
    with StopSignals(COMMAND_STOP_SIGNALS) as stop:  # Ctrl-C too, as pretrain and finetune catch it
        try:
            report = run_retrieval_study(args, stop) if args.is_task else run_study(args, stop)
        # the run in training wrote its checkpoint; the same command resumes it
        except TrainingPreempted as stopped:
            return preempted_exit("lengthgen", stopped, stop)
    finish_run(args.output_dir)
    plots = "" if args.no_plot else " and lengthgen_*.png"
    print(f"lengthgen: {len(report['runs'])} runs ({report.get('skipped_runs', 0)} reused); results in "
          f"{args.output_dir}/results.md, results.json, results.csv, summary.csv{plots}")
    if report.get("diverged_runs"):
        print(f"lengthgen: diverged (a loss not finite): {', '.join(report['diverged_runs'])}; see "
              "results.md")
    if report.get("runs_held_elsewhere"):
        print(f"lengthgen: {report['runs_held_elsewhere']} run(s) held by other processes; rerun when they "
              "finish")
    return 0


__all__ = ["EVALUATION_ONLY", "LENGTHGEN_RULE", "STUDY_EXTENT", "TASK_RULE", "add_arguments", "run"]
