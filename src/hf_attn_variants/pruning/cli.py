"""``hf-attn-variants prune``: score heads, prune iteratively, write the curve, the plots and the pruned model.

Example::

    hf-attn-variants prune --model_name_or_path runs/clf --train_file train.csv --validation_file dev.csv \\
        --output_dir runs/clf-pruned --fraction 0.1 --threshold 0.9

Writes to ``--output_dir``: ``curve.csv`` and ``curve.json`` (one row per step; the JSON also holds the
settings, the baseline and the initial importance matrix), ``pruning_curve.png`` (metric vs % of heads
pruned, with the unpruned baseline), ``head_importance.png`` (the initial importance heat-map) and
``model/`` (the pruned model and its tokenizer; reload with ``hf_attn_variants.pruning.load_pruned``, or
``from_pretrained`` for this package's families).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch

from .data import TASKS, accuracy_metric, build_batches, infer_task, load_rows, perplexity_metric
from .importance import compute_head_importance
from .iterative import iterative_head_pruning, write_curve
from .plotting import plot_head_importance, plot_pruning_curve
from .prune import count_heads, load_pruned

logger = logging.getLogger(__name__)


def _threshold(text: str) -> float | None:
    if text.lower() in ("none", "off", "0"):
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--threshold must be > 0 or 'none', got {text!r}.")
    return value


def _budget(text: str) -> int | float | None:
    if text.lower() == "none":
        return None
    return float(text) if any(c in text for c in ".eE") else int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``prune`` subcommand."""
    parser.add_argument("--model_name_or_path", required=True, help="local folder of the model to prune")
    parser.add_argument("--tokenizer_name", default=None, help="tokenizer folder (default: the model folder)")
    parser.add_argument("--train_file", required=True, help="text/csv/json(l) file used for head importance")
    parser.add_argument("--validation_file", default=None,
                        help="file the metric is evaluated on (default: the last --validation_split_percentage %% "
                             "of --train_file)")
    parser.add_argument("--validation_split_percentage", type=int, default=20)
    parser.add_argument("--task", choices=TASKS, default=None, help="default: from the model class")
    parser.add_argument("--text_column", default=None, help="default: 'text' or the first string column")
    parser.add_argument("--text_pair_column", default=None)
    parser.add_argument("--label_column", default="label")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--num_importance_examples", type=int, default=512,
                        help="examples scored for importance (one forward/backward each)")
    parser.add_argument("--num_eval_examples", type=int, default=2048)
    parser.add_argument("--fraction", type=float, default=0.1, help="share of the remaining heads pruned per step")
    parser.add_argument("--threshold", type=_threshold, default=0.9,
                        help="stop below this fraction of the unpruned metric ('none' to prune to the budget)")
    parser.add_argument("--max_heads_pruned", type=_budget, default=None,
                        help="head budget: an int, a fraction like 0.5 of all heads, or 'none'")
    parser.add_argument("--min_heads_per_layer", type=int, default=0)
    parser.add_argument("--rescore", action="store_true", help="recompute importance after every step")
    parser.add_argument("--no_normalize_per_layer", action="store_true",
                        help="rank raw importance instead of per-layer ℓ2-normalised importance")
    parser.add_argument("--mlm_probability", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", required=True)


def _split(rows: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    if args.validation_file is not None:
        return rows, load_rows(args.validation_file)
    if not 0 < args.validation_split_percentage < 100:
        raise ValueError(f"--validation_split_percentage must be in (0, 100), got {args.validation_split_percentage}.")
    cut = len(rows) - max(1, len(rows) * args.validation_split_percentage // 100)
    if cut < 1:
        raise ValueError("--train_file has too few rows to hold some out; pass --validation_file.")
    return rows.select(range(cut)), rows.select(range(cut, len(rows)))


def _as_json(importance: torch.Tensor) -> list[list[float | None]]:
    return [[None if math.isnan(v) else round(float(v), 6) for v in row] for row in importance.tolist()]


def run(args: argparse.Namespace) -> int:
    """Run the pruning study described by ``args``; returns 0."""
    from transformers import AutoTokenizer

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(args.seed)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model = load_pruned(args.model_name_or_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    task = args.task or infer_task(model)

    train_rows, eval_rows = _split(load_rows(args.train_file), args)
    train_rows = train_rows.select(range(min(len(train_rows), args.num_importance_examples)))
    eval_rows = eval_rows.select(range(min(len(eval_rows), args.num_eval_examples)))
    options = {"text_column": args.text_column, "text_pair_column": args.text_pair_column,
               "label_column": args.label_column, "max_seq_length": args.max_seq_length,
               "batch_size": args.batch_size, "mlm_probability": args.mlm_probability}
    importance_batches = build_batches(train_rows, tokenizer, model, task, seed=args.seed, **options)
    eval_batches = build_batches(eval_rows, tokenizer, model, task, seed=args.seed + 1, **options)
    if task == "classification":
        metric, metric_name, higher_is_better = accuracy_metric(eval_batches), "accuracy", True
    else:
        metric, metric_name, higher_is_better = perplexity_metric(eval_batches, task == "causal-lm"), "perplexity", False

    normalize = not args.no_normalize_per_layer
    importance = compute_head_importance(model, importance_batches, normalize_per_layer=normalize)
    plot_head_importance(importance, output / "head_importance.png",
                         title=f"Head importance\n{type(model).__name__}")
    remaining_before, total = count_heads(model)
    curve = iterative_head_pruning(
        model, importance_batches, metric, fraction=args.fraction, threshold=args.threshold,
        max_heads_pruned=args.max_heads_pruned, rescore=args.rescore, higher_is_better=higher_is_better,
        importance=importance, normalize_per_layer=normalize, min_heads_per_layer=args.min_heads_per_layer,
    )
    metadata = {
        "model": str(args.model_name_or_path), "model_class": type(model).__name__, "task": task,
        "metric": metric_name, "higher_is_better": higher_is_better, "baseline": curve[0].metric,
        "total_heads": total, "heads_before": remaining_before, "heads_after": count_heads(model)[0],
        "pruned_heads": {str(k): v for k, v in (model.config.pruned_heads or {}).items()},
        "importance": _as_json(importance),
        "settings": {k: v for k, v in vars(args).items() if not k.startswith("_")},
    }
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
    logger.info("wrote %s", json.dumps(sorted(p.name for p in output.iterdir())))
    return 0


__all__ = ["add_arguments", "run"]
