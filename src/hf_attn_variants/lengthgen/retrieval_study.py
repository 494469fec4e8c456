"""The retrieval study: every variant × position scheme × seed trained on a task at L, scored at L … 64L.

``lengthgen --task passkey|mqar`` runs ``run_retrieval_study``: for each seed (outer loop), position scheme
and variant, one run (``retrieval.run_task``), claimed with ``runfolders.claim`` so that several processes can
share the output folder (``scripts/run_retrieval_study.sh`` with ``WORKERS=2``; rerun once after every worker
finished for the complete outputs). After every run the study files are regenerated from the stored
``result.json`` files: ``results.json`` (args, machine, per-series summary, runs), ``results.csv`` (series ×
seed × length), ``summary.csv`` (mean, std, min, max over seeds), ``results.md`` and ``lengthgen_<task>.png``
(accuracy against length, log₂ x, min–max band over seeds). The repository's ``tools/publish_study.py
retrieval`` merges the tasks' ``results.json`` into the results file the docs render
(``docs/results/retrieval-study.json``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .results import atomic_write_json, atomic_write_text, describe, read_json, to_csv
from .retrieval import plan_task_run, run_task, study_variants
from .runfolders import claim, stop_between_runs
from .tasks import METRICS

logger = logging.getLogger(__name__)

TASK_METRICS = ("accuracy", "exact_match", "answer_accuracy")
TASK_ROW_FIELDS = ("series", "variant", "model_type", "mode", "objective", "seed", "length", "ratio",
                   "status",
                   *TASK_METRICS, "sequences", "answers")
TASK_SUMMARY_FIELDS = ("series", "variant", "model_type", "mode", "objective", "position_embedding_type",
                       "length",
                       "ratio", "status", "n_seeds",
                       *[f"{m}_{s}" for m in TASK_METRICS for s in ("mean", "std", "min", "max", "n")],
                       "sequences")


def summarize_task_rows(rows: list[dict[str, Any]], positions: dict[str, str]) -> list[dict[str, Any]]:
    """One row per (series, length): mean / sample std / min / max over seeds of every task metric."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["series"], int(row["length"])), []).append(row)
    summary = []
    for (series, length), group in groups.items():
        first, ok = group[0], [r for r in group if r["status"] == "ok"]
        out = {k: first[k] for k in ("series", "variant", "model_type", "mode", "objective", "ratio")}
        out.update(length=length, position_embedding_type=positions.get(first["variant"], "rope"),
                   status="ok" if ok else first["status"], n_seeds=len(ok),
                   seeds=sorted(r["seed"] for r in ok),
                   per_seed=[round(r["accuracy"], 4) for r in sorted(ok, key=lambda r: r["seed"])],
                   sequences=first.get("sequences"))
        for metric in TASK_METRICS:
            for stat, value in describe([r.get(metric) for r in ok]).items():
                out[f"{metric}_{stat}"] = value
        summary.append(out)
    return summary


def task_markdown(args: Any, summary: list[dict[str, Any]]) -> str:
    """The study's accuracy table as markdown (mean ± std over seeds; n/a past a model's length)."""
    lengths = args.eval_lengths
    warmup = f" (the first {args.copy_warmup_steps} on the copy warm-up)" if args.copy_warmup_steps else ""
    lines = [f"# {args.task}: {METRICS[args.task]} by evaluation length (trained at L = {args.train_length})",
             "",
             (f"{args.max_train_steps} steps{warmup} × batch {args.per_device_train_batch_size}, lr "
              f"{args.learning_rate}, "
             f"seeds {args.seeds}, {args.eval_samples} sequences per length; mean ± std over seeds."), "",
             "| series | " + " | ".join(f"{n}{' (L)' if n == args.train_length else ''}"
                                        for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    by_key = {(r["series"], r["length"]): r for r in summary}
    for series in dict.fromkeys(r["series"] for r in summary):
        cells = []
        for n in lengths:
            row = by_key.get((series, n))
            cells.append("–" if row is None else row["status"] if row["status"] != "ok"
                         else f"{row['accuracy_mean']:.2f} ± {row['accuracy_std']:.2f}")
        lines.append(f"| `{series}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_task_outputs(args: Any, results: list[dict[str, Any]], machine: dict[str, Any],
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Regenerate ``results.json``, ``results.csv``, ``summary.csv``, ``results.md`` and the plot."""
    out = Path(args.output_dir)
    rows = [row for result in results for row in result["rows"]]
    positions = {r["variant"]: r.get("position_embedding_type", "rope") for r in results}
    summary = summarize_task_rows(rows, positions)
    report = {"args": asdict(args), "machine": machine, "summary": summary,
              "runs": [{k: v for k, v in r.items() if k != "loss_curve"} for r in results], **(extra or {})}
    atomic_write_json(out / "results.json", report)
    atomic_write_text(out / "results.csv", to_csv(rows, TASK_ROW_FIELDS))
    atomic_write_text(out / "summary.csv", to_csv(summary, TASK_SUMMARY_FIELDS))
    atomic_write_text(out / "results.md", task_markdown(args, summary))
    if not args.no_plot:
        from .plotting import plot_accuracy

        plot_accuracy({args.task: summary}, out / f"lengthgen_{args.task}.png",
                      train_length=args.train_length,
                      title=f"trained at L = {args.train_length}, {args.max_train_steps} steps, seeds "
                            f"{args.seeds}")
    return report


def run_retrieval_study(args: Any, stop: Any = None) -> dict[str, Any]:
    """Run (or resume) the retrieval study ``args`` describes; returns the report written to
    ``results.json``. ``stop``: the command line's ``StopSignals``, which every run's training checks and
    which is checked between runs (``StudyStopped``: a signal during an evaluation is not swallowed)."""
    import torch

    from .study import machine_info

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    plans = [plan_task_run(v, seed, args) for seed in args.seeds for v in study_variants(args)]
    results, skipped, elsewhere = [], 0, 0
    for index, plan in enumerate(plans, 1):
        if index > 1:  # a signal during the previous run's evaluation, or between runs
            stop_between_runs(stop, f"after run [{index - 1}/{len(plans)}] (its evaluation finished)")
        label = f"[{index}/{len(plans)}] {args.task} {plan.variant.name} seed {plan.seed}"
        with claim(plan.run_dir) as mine:
            if not mine:
                logger.info("%s: held by another process, skipped", label)
                elsewhere += 1
                continue
            done = read_json(plan.run_dir / "result.json")
            kept = not args.save_models or (plan.model_dir / "config.json").is_file()
            if done and done.get("fingerprint") == plan.fingerprint and kept:
                results.append(done)
                skipped += 1
                continue
            logger.info("%s: training", label)
            result = run_task(plan, args, stop)
            atomic_write_json(plan.run_dir / "result.json", result)
            results.append(result)
        write_task_outputs(args, results, machine)
    stop_between_runs(stop, f"after run [{len(plans)}/{len(plans)}] (its evaluation finished)")
    if elsewhere:
        logger.warning("%d run(s) were held by other processes: rerun when they finish for complete outputs",
                       elsewhere)
    return write_task_outputs(args, results, machine,
                              {"skipped_runs": skipped, "runs_held_elsewhere": elsewhere})


__all__ = [
    "TASK_METRICS",
    "run_retrieval_study",
    "summarize_task_rows",
    "task_markdown",
    "write_task_outputs",
]
