"""``hf-attn-variants prune``: score heads, prune iteratively, write the curve, the plots and the pruned
model.

Example::

    hf-attn-variants prune --model_name_or_path runs/clf --train_file train.csv --validation_file dev.csv \\
        --output_dir runs/clf-pruned --fraction 0.1 --threshold 0.9

Writes to ``--output_dir``: ``curve.csv`` and ``curve.json`` (one row per step; the JSON also holds the
settings, the baseline and the initial importance matrix), ``pruning_curve.png`` (metric vs % of heads
pruned, with the unpruned baseline), ``head_importance.png`` (the initial importance heat-map) and
``model/`` (the pruned model and its tokenizer; reload with ``hf_attn_variants.pruning.load_pruned``, or
``from_pretrained`` for this package's families).

``--uniform`` removes the same number of heads from every layer at each step (Torch-Pruning's uniform
mode), and before saving ``restate_uniform_heads`` gives the model a plain config (``num_attention_heads`` =
heads per layer, ``head_dim``), so ``model/`` loads and serves (vLLM) like an unpruned model; where the
config cannot state it (BERT-style, some grouped-query layouts) ``pruned_heads`` is kept and a warning says
so. Without ``--uniform`` the config is never rewritten, even when the global ranking happens to leave
every layer the same count: the saved ``pruned_heads`` then keeps the original head numbers.

Numbers are checked by argparse (``type=``); the output folder, model, tokenizer, data and columns by
``prepare`` before anything is written. A bad value gives one error line naming its flag and exit status 2.

The output folder follows the rule of every command with an ``--output_dir`` (``training/outputs.py``): the
run records its flags in ``run.json``; a folder holding a finished pruning run, or one with other flags, is
refused in one sentence naming them and ``--overwrite_output_dir`` (which clears the folder first); the
unfinished run of the same flags (a crash) is redone in place.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..cli_utils import (
    FlagError,
    error_reason,
    argparse_type,
    check_int,
    check_model_folder,
    check_number,
    check_output_dir,
    check_percentage,
    check_positive,
    check_seed,
    fail_flag,
    quiet_progress,
)
from ..training.checkpoints import read_json_file
from ..training.outputs import OutputRule, check_output_folder, finish_run, json_arguments, start_run
from ..training.runlock import run_lock
from .adapters import get_adapter
from .data import (
    TASKS,
    accuracy_metric,
    build_batches,
    count_targets,
    infer_task,
    label_mapping,
    load_rows,
    perplexity_metric,
)
from .importance import compute_head_importance
from .iterative import head_budget, iterative_head_pruning, write_curve
from .plotting import plot_head_importance, plot_pruning_curve
from .prune import count_heads, load_pruned, restate_uniform_heads

if TYPE_CHECKING:
    from ..training.outputs import FolderState

logger = logging.getLogger(__name__)


def _legacy_settings(folder: Path) -> dict[str, Any] | None:
    """The flags of a finished pruning folder written before ``run.json``: the settings in its
    ``curve.json``."""
    settings = (read_json_file(folder / "curve.json") or {}).get("settings")
    return json_arguments(argparse.Namespace(**settings)) if isinstance(settings, dict) else None


PRUNE_RULE = OutputRule(
    command="prune",
    run_files=("curve.csv", "curve.json", "pruning_curve.png", "head_importance.png", "model"),
    legacy_arguments=_legacy_settings,
)
"""``prune``'s output folder (``training/outputs.py``): every flag but ``--output_dir`` and
``--overwrite_output_dir`` makes another run."""


def _threshold(text: str) -> float | None:
    """``--threshold``: a number > 0, or ``none``/``off``/``0`` for no threshold."""
    if text.lower() in ("none", "off", "0"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0 or 'none', got {text!r}.") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"--threshold must be > 0 or 'none', got {text!r}.")
    return value


def _budget(text: str) -> int | float | None:
    """``--max_heads_pruned``: a count >= 0, a fraction in (0, 1] of all heads, or ``none``."""
    if text.lower() == "none":
        return None
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected an int, a fraction in (0, 1] or 'none', got "
                                         f"{text!r}.") from None
    if isinstance(value, float) and not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise argparse.ArgumentTypeError(f"a fraction of all heads must be in (0, 1], got {text!r}.")
    if isinstance(value, int) and value < 0:
        raise argparse.ArgumentTypeError(f"a head count must be >= 0, got {text!r}.")
    return value


def _fraction(flag: str, value: float) -> None:
    check_number(flag, value, 0, 1, open_low=True)


def _probability(flag: str, value: float) -> None:
    check_number(flag, value, 0, 1, open_low=True, open_high=True)


def _non_negative(flag: str, value: int) -> None:
    check_int(flag, value, 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``prune`` subcommand."""
    def positive(flag: str) -> Any:
        return argparse_type(check_positive, int, flag)

    parser.add_argument("--model_name_or_path", required=True, help="local folder of the model to prune")
    parser.add_argument("--tokenizer_name", default=None, help="tokenizer folder (default: the model folder)")
    parser.add_argument("--train_file", required=True, help="text/csv/json(l) file used for head importance")
    parser.add_argument("--validation_file", default=None,
                        help="file the metric is evaluated on (default: the last "
                             "--validation_split_percentage %% of --train_file)")
    parser.add_argument("--validation_split_percentage", default=20,
                        type=argparse_type(check_percentage, int, "validation_split_percentage"))
    parser.add_argument("--task", choices=TASKS, default=None, help="default: from the model class")
    parser.add_argument("--text_column", default=None, help="default: 'text' or the first string column")
    parser.add_argument("--text_pair_column", default=None)
    parser.add_argument("--label_column", default="label")
    parser.add_argument("--max_seq_length", type=positive("max_seq_length"), default=128)
    parser.add_argument("--batch_size", type=positive("batch_size"), default=16)
    parser.add_argument("--num_importance_examples", type=positive("num_importance_examples"), default=512,
                        help="examples scored for importance (one forward/backward each)")
    parser.add_argument("--num_eval_examples", type=positive("num_eval_examples"), default=2048)
    parser.add_argument("--fraction", type=argparse_type(_fraction, float, "fraction"), default=0.1,
                        help="share of the remaining heads pruned per step, in (0, 1]")
    parser.add_argument("--threshold", type=_threshold, default=0.9,
                        help="stop below this fraction of the unpruned metric ('none' to prune to the "
                             "budget)")
    parser.add_argument("--max_heads_pruned", type=_budget, default=None,
                        help="head budget: an int, a fraction like 0.5 of all heads, or 'none'")
    parser.add_argument("--min_heads_per_layer",
                        type=argparse_type(_non_negative, int, "min_heads_per_layer"),
                        default=0, help="never take a layer below this many heads (less than its heads)")
    parser.add_argument("--rescore", action="store_true", help="recompute importance after every step")
    parser.add_argument("--uniform", action="store_true",
                        help="remove the same number of heads from every layer at each step (max(1, "
                             "round(fraction × heads per layer)), the least important within each layer) "
                             "instead of ranking all heads globally; the saved config then states "
                             "num_attention_heads = heads per layer, so the model loads and serves (vLLM) "
                             "like an unpruned one")
    parser.add_argument("--no_normalize_per_layer", action="store_true",
                        help="rank raw importance instead of per-layer ℓ2-normalised importance")
    parser.add_argument("--mlm_probability", type=argparse_type(_probability, float, "mlm_probability"),
                        default=0.15)
    parser.add_argument("--seed", type=argparse_type(check_seed, int, "seed"), default=0)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--overwrite_output_dir", action="store_true",
                        help="clear output_dir first (it may hold a finished pruning run or another run's "
                             "files)")
    parser.add_argument("--write_into_output_dir", action="store_true",
                        help="write into an output_dir that holds files no run wrote (your notes, say), "
                             "keeping them; without it such a folder is refused")


@dataclass
class PruneInputs:
    """Everything ``run`` needs, loaded and checked before anything is written."""

    model: Any
    tokenizer: Any
    task: str
    importance_batches: list[dict[str, torch.Tensor]]
    eval_batches: list[dict[str, torch.Tensor]]
    folder: FolderState
    arguments: dict[str, Any]


def _split(rows: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    if args.validation_file is not None:
        return rows, load_rows(args.validation_file, "validation_file")
    if not 0 < args.validation_split_percentage < 100:
        raise FlagError("validation_split_percentage",
                        f"--validation_split_percentage must be in (0, 100), got "
                        f"{args.validation_split_percentage}.")
    cut = len(rows) - max(1, len(rows) * args.validation_split_percentage // 100)
    if cut < 1:
        raise FlagError("train_file",
                        "--train_file has too few rows to hold some out; pass --validation_file.")
    return rows.select(range(cut)), rows.select(range(cut, len(rows)))


def _load_model(path: str) -> Any:
    """The model to prune, with a head adapter; ``FlagError`` naming ``--model_name_or_path`` otherwise."""
    try:
        model = load_pruned(path, trust_remote_code=False).eval()
    except (OSError, ValueError, KeyError) as error:
        reason = error_reason(error)
        raise FlagError("model_name_or_path", f"{path!r} could not be loaded as a model: {reason}") from error
    try:
        get_adapter(model).check_removable()  # the command removes heads: refused before any scoring
    except (TypeError, ValueError) as error:  # an architecture without (supported) attention heads
        raise FlagError("model_name_or_path", str(error)) from error
    return model


def _load_tokenizer(args: argparse.Namespace) -> Any:
    from ..training.modeling import load_tokenizer

    flag = "tokenizer_name" if args.tokenizer_name else "model_name_or_path"
    tokenizer = load_tokenizer(args.tokenizer_name or args.model_name_or_path, flag=flag)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def _check_uniform(args: argparse.Namespace, model: Any) -> None:
    """``--uniform`` needs a model with the same head count in every layer and room for one uniform step
    (one head from every layer) under ``--min_heads_per_layer`` and ``--max_heads_pruned``."""
    adapter = get_adapter(model)
    counts = adapter.alive().sum(-1).tolist()
    if len(set(counts)) > 1:
        raise FlagError("uniform",
                        f"--uniform needs the same number of heads in every layer, but the model's "
                        f"layers have {counts} heads (pruned non-uniformly before); drop --uniform.")
    if counts and args.min_heads_per_layer >= counts[0]:
        raise FlagError("min_heads_per_layer",
                        f"min_heads_per_layer must be below the {counts[0]} heads each "
                        "layer has now (else --uniform prunes nothing), got "
                        f"{args.min_heads_per_layer}.")
    total = adapter.num_layers * adapter.num_heads
    room = max(0, head_budget(args.max_heads_pruned, total) - (total - sum(counts)))
    if room < adapter.num_layers:
        raise FlagError("uniform",
                        f"--uniform removes at least one head from each of the {adapter.num_layers} "
                        f"layers, but --max_heads_pruned {args.max_heads_pruned} leaves room for {room} "
                        "more; raise --max_heads_pruned or drop --uniform.")


def _task(args: argparse.Namespace, model: Any) -> str:
    """``--task``, or the model's; ``FlagError`` when ``--task`` contradicts the model's head."""
    try:
        inferred = infer_task(model)
    except FlagError:
        if args.task is None:
            raise
        return args.task
    if args.task is not None and args.task != inferred:
        raise FlagError("task",
                        f"task {args.task!r} does not fit {type(model).__name__} (a {inferred} model).")
    return inferred


def prepare(args: argparse.Namespace) -> PruneInputs:
    """Check every flag that needs a file and load model, tokenizer and batches; nothing is written.
    A bad value raises ``FlagError`` naming its flag."""
    check_output_dir("output_dir", args.output_dir)
    arguments = json_arguments(args)
    folder = check_output_folder(PRUNE_RULE, args.output_dir, arguments, overwrite=args.overwrite_output_dir,
                                 write_into=args.write_into_output_dir,
                                 inputs={name: getattr(args, name) for name in (
                                     "model_name_or_path", "tokenizer_name", "train_file",
                                     "validation_file")})
    check_model_folder("model_name_or_path", args.model_name_or_path, weights=True)
    tokenizer = _load_tokenizer(args)
    rows = load_rows(args.train_file, "train_file")
    model = _load_model(args.model_name_or_path)
    heads = get_adapter(model).num_heads
    if args.min_heads_per_layer >= heads:
        raise FlagError("min_heads_per_layer",
                        f"min_heads_per_layer must be below the model's {heads} heads per "
                        f"layer (else no head can be pruned), got {args.min_heads_per_layer}.")
    if args.uniform:
        _check_uniform(args, model)
    task = _task(args, model)
    if task == "classification" and getattr(model.config, "pad_token_id", None) is None:
        # a Llama-style classifier reads the last token of a padded row through pad_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
    train_rows, eval_rows = _split(rows, args)
    train_rows = train_rows.select(range(min(len(train_rows), args.num_importance_examples)))
    eval_rows = eval_rows.select(range(min(len(eval_rows), args.num_eval_examples)))
    options = {"text_column": args.text_column, "text_pair_column": args.text_pair_column,
               "label_column": args.label_column, "max_seq_length": args.max_seq_length,
               "batch_size": args.batch_size, "mlm_probability": args.mlm_probability,
               "labels": _labels(args, model, task, train_rows, eval_rows)}
    importance_batches = build_batches(train_rows, tokenizer, model, task, seed=args.seed, **options)
    eval_batches = build_batches(eval_rows, tokenizer, model, task, seed=args.seed + 1, **options)
    if task != "classification" and not count_targets(eval_batches, task == "causal-lm"):
        flag = "validation_file" if args.validation_file else "train_file"
        raise FlagError(flag, f"--{flag}'s evaluation rows hold no token to predict (rows of one token for "
                              "a causal LM, or of special tokens only): there is no perplexity to prune "
                              "against.")
    return PruneInputs(model, tokenizer, task, importance_batches, eval_batches, folder, arguments)


def _labels(args: argparse.Namespace, model: Any, task: str, *splits: Any) -> dict[str, int] | None:
    """One name → id mapping for the string labels of every split (``label_mapping``), so that importance and
    evaluation rows agree."""
    if task != "classification":
        return None
    names = [value for split in splits if args.label_column in split.column_names
             for value in split[args.label_column]]
    return label_mapping(names, model) if names else None


def _as_json(importance: torch.Tensor) -> list[list[float | None]]:
    return [[None if math.isnan(v) else round(float(v), 6) for v in row] for row in importance.tolist()]


def _restate(model: Any) -> dict[str, int] | None:
    """``restate_uniform_heads`` before saving (``--uniform``): the new head fields, or None (with a
    warning)."""
    if restate_uniform_heads(model):
        fields = ("num_attention_heads", "num_key_value_heads", "head_dim")
        return {name: getattr(model.config, name) for name in fields
                if getattr(model.config, name, None) is not None}
    if get_adapter(model).pruned_heads():
        logger.warning("%s's config cannot state the uniform pruning as a plain num_attention_heads (see "
                       "restate_uniform_heads); it keeps pruned_heads: reload model/ with load_pruned.",
                       type(model).__name__)
    return None


def run(args: argparse.Namespace) -> int:
    """Run the pruning study described by ``args`` while holding ``--output_dir``'s run lock
    (``training/runlock.py``); returns 0, or 2 after one error line for a bad flag or a folder another run
    writes."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(args.seed)
    try:
        check_output_dir("output_dir", args.output_dir)
        with run_lock("prune", args.output_dir):
            with quiet_progress():
                inputs = prepare(args)
            study(args, inputs)
    except FlagError as error:
        return fail_flag("prune", error)
    return 0


def study(args: argparse.Namespace, inputs: PruneInputs) -> None:
    """Score, prune iteratively, and write the curve, plots and pruned model into ``--output_dir``."""
    model, tokenizer, task = inputs.model, inputs.tokenizer, inputs.task
    importance_batches, eval_batches = inputs.importance_batches, inputs.eval_batches
    output = Path(args.output_dir)
    if task == "classification":
        metric, metric_name, higher_is_better = accuracy_metric(eval_batches), "accuracy", True
    else:
        metric = perplexity_metric(eval_batches, task == "causal-lm")
        metric_name, higher_is_better = "perplexity", False

    normalize = not args.no_normalize_per_layer
    try:
        importance = compute_head_importance(model, importance_batches, normalize_per_layer=normalize)
    except ValueError as error:  # a loss that is not finite: the data (a row of special tokens only) or model
        raise FlagError("train_file", f"train_file: head importance cannot be computed: {error} Check that "
                                      "every example has a token to predict, and that the model's loss is "
                                      "finite on it.") from error
    _check_padded_forward(model, eval_batches[0])
    # every input is valid (the scores and a padded batch are the last checks of the data): from here on the
    # run writes
    start_run(PRUNE_RULE, inputs.folder, inputs.arguments)
    plot_head_importance(importance, output / "head_importance.png",
                         title=f"Head importance\n{type(model).__name__}")
    remaining_before, total = count_heads(model)
    curve = iterative_head_pruning(
        model, importance_batches, metric, fraction=args.fraction, threshold=args.threshold,
        max_heads_pruned=args.max_heads_pruned, rescore=args.rescore, higher_is_better=higher_is_better,
        importance=importance, normalize_per_layer=normalize, min_heads_per_layer=args.min_heads_per_layer,
        uniform=args.uniform, on_step=lambda rows: write_curve(rows, output / "curve.csv"),  # kept by a stop
    )
    metadata = {
        "model": str(args.model_name_or_path), "model_class": type(model).__name__, "task": task,
        "metric": metric_name, "higher_is_better": higher_is_better, "baseline": curve[0].metric,
        "total_heads": total, "heads_before": remaining_before, "heads_after": count_heads(model)[0],
        "pruned_heads": {str(k): v for k, v in get_adapter(model).pruned_heads().items()},
        "importance": _as_json(importance),
        "settings": {k: v for k, v in vars(args).items() if not k.startswith("_")},
    }
    if args.uniform:
        metadata["restated_config"] = _restate(model)
    write_curve(curve, output / "curve.csv", output / "curve.json", metadata)
    plot_pruning_curve(curve, output / "pruning_curve.png", metric_name=metric_name,
                       threshold=args.threshold, higher_is_better=higher_is_better,
                       title=f"Iterative head pruning\n{type(model).__name__}")
    model.save_pretrained(output / "model")
    tokenizer.save_pretrained(output / "model")
    logger.info("%5s %8s %10s %12s", "step", "pruned", metric_name, "relative")
    for row in curve:
        logger.info("%5d %8d %10.4f %12.3f%s", row.step, row.heads_pruned, row.metric, row.relative_metric,
                    "" if row.accepted else "  (below threshold, not applied)")
    adapter = get_adapter(model)
    for line in pruning_warnings(adapter.alive().sum(-1).tolist(), adapter.num_heads):
        logger.warning("prune: %s", line)
    finish_run(output)
    for line in end_summary(output, metadata, [row for row in curve if row.accepted][-1]):
        logger.info("prune: %s", line)


@torch.no_grad()
def _check_padded_forward(model: Any, batch: dict[str, torch.Tensor]) -> None:
    """``FlagError`` naming ``--model_name_or_path`` when the model cannot run a padded evaluation batch (the
    scores ran on single rows), before anything is written."""
    device = next(model.parameters()).device
    try:
        model(**{k: v.to(device) for k, v in batch.items() if k != "labels"})
    except (ValueError, RuntimeError, IndexError) as error:
        raise FlagError("model_name_or_path", "--model_name_or_path cannot evaluate a padded batch of the "
                                              f"validation rows: {error_reason(error)}") from error


def end_summary(output: Path, metadata: dict[str, Any], last: Any) -> list[str]:
    """What ``prune`` says it did: heads removed, the metric against the unpruned model's, the files and the
    next command (``last``: the last applied row of the curve)."""
    from ..models import FAMILIES
    from ..training.summary import export_command

    removed, total = metadata["heads_before"] - metadata["heads_after"], metadata["total_heads"]
    model = output / "model"
    family = json.loads((model / "config.json").read_text()).get("model_type") in FAMILIES
    load = (export_command(model, output) if family
            else f"hf_attn_variants.pruning.load_pruned({json.dumps(str(model))})")
    return [
        f"pruned {removed} of {total} heads ({metadata['heads_after']} left); {metadata['metric']} "
        f"{last.metric:.4g} against {metadata['baseline']:.4g} unpruned ({last.relative_metric:.3f} of it)",
        f"wrote the pruned model and its tokenizer to {model}, the curve to {output / 'curve.csv'} and "
        f"curve.json, the plots head_importance.png and pruning_curve.png beside them",
        f"next: {load}",
    ]


MOST_HEADS = 0.5
"""A pruning that leaves at most this share of the heads is called out in the summary."""


def pruning_warnings(remaining: list[int], heads_per_layer: int) -> list[str]:
    """What the summary must call out, given the heads each layer has left and had (``heads_per_layer``):
    layers left without attention, and a pruning that removed most heads (more than ``1 - MOST_HEADS`` of
    them), each with the flags that bound it."""
    lines = []
    total = heads_per_layer * len(remaining)
    removed = total - sum(remaining)
    if total and removed > (1 - MOST_HEADS) * total:
        lines.append(f"removed {removed} of {total} heads ({removed / total:.0%}): most of the model's "
                     "attention is gone; bound it with --max_heads_pruned, --threshold or "
                     "--min_heads_per_layer.")
    empty = [str(layer) for layer, count in enumerate(remaining) if count == 0]
    if empty:
        which = f"layers {', '.join(empty)} have" if len(empty) > 1 else f"layer {empty[0]} has"
        lines.append(f"{which} no attention head left (the layer keeps its feed-forward part only); pass "
                     "--min_heads_per_layer 1 to keep one.")
    return lines


__all__ = ["MOST_HEADS", "PRUNE_RULE", "PruneInputs", "add_arguments", "prepare", "pruning_warnings", "run",
           "study"]
