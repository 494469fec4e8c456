"""The retrieval study: every variant × position scheme × seed trained on a task at L, scored at L … 64L.

``lengthgen --task passkey|mqar`` runs ``run_retrieval_study``: for each seed (outer loop), position scheme and
variant, one run (``retrieval.run_task``), claimed with ``runfolders.claim`` so that several processes can share
the output folder (``scripts/run_retrieval_study.sh`` with ``WORKERS=2``; rerun once after every worker finished
for the complete outputs). After every run the study files are regenerated from the stored ``result.json`` files:
``results.json`` (args, machine, per-series summary, runs), ``results.csv`` (series × seed × length),
``summary.csv`` (mean, std, min, max over seeds), ``results.md`` and ``lengthgen_<task>.png`` (accuracy against
length, log₂ x, min–max band over seeds). ``publish_retrieval`` merges the tasks' ``results.json`` into the
results file the docs render (``docs/results/retrieval-study.json``, kind ``retrieval``).
"""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .results import atomic_write_json, atomic_write_text, describe, read_json, to_csv
from .retrieval import plan_task_run, run_task, study_variants
from .runfolders import claim

logger = logging.getLogger(__name__)

REPORTED_PASSKEY: dict[str, Any] = {
    "source": ("issue 29's passkey experiment by its author (random filler, KEY d1 d2 d3, QUERY; trained at n = 64 for "
               "1500 steps, 2 seeds, on an Intel Xeon; 2 layers, d = 64; GAU 4 layers), transcribed"),
    "ratios": [1, 4, 16, 64],
    "rows": [
        {"label": "EI family, RoPE, standard", "series": "ei_standard", "accuracy": [0.95, 0.07, 0.01, 0.00]},
        {"label": "EI family, RoPE, entropy_invariant", "series": "ei_entropy_invariant",
         "accuracy": [0.96, 0.49, 0.02, 0.01]},
        {"label": "GAU, RoPE, softmax", "series": "gau_softmax", "accuracy": [0.95, 0.00, 0.00, 0.00]},
        {"label": "GAU, RoPE, softmax_plus", "series": "gau_softmax_plus", "accuracy": [0.98, 0.32, 0.02, 0.00]},
        {"label": "EI family, no position embedding, standard", "series": "ei_standard+nope",
         "accuracy": [0.68, 0.66, 0.61, 0.48]},
        {"label": "EI family, no position embedding, entropy_invariant", "series": "ei_entropy_invariant+nope",
         "accuracy": [0.83, 0.83, 0.78, 0.78]},
    ],
}
"""The passkey table of issue 29 (its author's runs; ratios = evaluation length / training length)."""
TASK_METRICS = ("accuracy", "exact_match", "answer_accuracy")
TASK_ROW_FIELDS = ("series", "variant", "model_type", "mode", "objective", "seed", "length", "ratio", "status",
                   *TASK_METRICS, "sequences", "answers")
TASK_SUMMARY_FIELDS = ("series", "variant", "model_type", "mode", "objective", "position_embedding_type", "length",
                       "ratio", "status", "n_seeds",
                       *[f"{m}_{s}" for m in TASK_METRICS for s in ("mean", "std", "min", "max")], "sequences")


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
                   status="ok" if ok else first["status"], n_seeds=len(ok), seeds=sorted(r["seed"] for r in ok),
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
    lines = [f"# {args.task}: exact-match accuracy by evaluation length (trained at L = {args.train_length})", "",
             (f"{args.max_train_steps} steps × batch {args.per_device_train_batch_size}, lr {args.learning_rate}, "
             f"seeds {args.seeds}, {args.eval_samples} sequences per length; mean ± std over seeds."), "",
             "| series | " + " | ".join(f"{n}{' (L)' if n == args.train_length else ''}" for n in lengths) + " |",
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

        plot_accuracy({args.task: summary}, out / f"lengthgen_{args.task}.png", train_length=args.train_length,
                      title=f"trained at L = {args.train_length}, {args.max_train_steps} steps, seeds {args.seeds}")
    return report


def run_retrieval_study(args: Any) -> dict[str, Any]:
    """Run (or resume) the retrieval study ``args`` describes; returns the report written to ``results.json``."""
    import torch

    from .study import machine_info

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    plans = [plan_task_run(v, seed, args) for seed in args.seeds for v in study_variants(args)]
    results, skipped, elsewhere = [], 0, 0
    for index, plan in enumerate(plans, 1):
        label = f"[{index}/{len(plans)}] {args.task} {plan.variant.name} seed {plan.seed}"
        with claim(plan.run_dir) as mine:
            if not mine:
                logger.info("%s: held by another process, skipped", label)
                elsewhere += 1
                continue
            done = read_json(plan.run_dir / "result.json")
            if done and done.get("fingerprint") == plan.fingerprint:
                results.append(done)
                skipped += 1
                continue
            logger.info("%s: training", label)
            result = run_task(plan, args)
            atomic_write_json(plan.run_dir / "result.json", result)
            results.append(result)
        write_task_outputs(args, results, machine)
    if elsewhere:
        logger.warning("%d run(s) were held by other processes: rerun when they finish for complete outputs",
                       elsewhere)
    return write_task_outputs(args, results, machine, {"skipped_runs": skipped, "runs_held_elsewhere": elsewhere})


def publish_replication(results_json: str | Path, name: str, *, root: str | Path = ".", command: str) -> Path:
    """Add to ``docs/results/<name>.json`` the ``replication``: a passkey study at the issue author's setting (its
    ``results.json``), run by ``command``, which the ``replication`` view sets beside the reported table."""
    from ..results import load_results, write_results

    report = json.loads(Path(results_json).read_text(encoding="utf-8"))
    data = load_results(Path(root), name)
    data["replication"] = {"command": command, "date": datetime.date.today().isoformat(), **compact_task(report)}
    return write_results(Path(root), name, data, inline_depth=4)


def publish_retrieval(results_jsons: list[str | Path], name: str, *, root: str | Path = ".", command: str,
                      wall_seconds: float | None = None, plot: str | Path | None = None) -> Path:
    """Write ``docs/results/<name>.json`` (kind ``retrieval``) from the ``results.json`` of one or more task studies
    (and, with ``plot``, the combined accuracy figure); then ``python scripts/render_docs.py``."""
    from ..results import write_results
    from ..results._common import cpu_name, run_metadata

    reports = [json.loads(Path(p).read_text(encoding="utf-8")) for p in results_jsons]
    data = run_metadata("retrieval", command)
    data["cpu"] = cpu_name()
    data["versions"].update({k: reports[0]["machine"][k] for k in ("torch", "transformers")})
    data["tasks"] = {}
    for report in reports:
        data["tasks"][report["args"]["task"]] = compact_task(report)
    data["wall_seconds"] = wall_seconds
    data["reported"] = REPORTED_PASSKEY
    if plot is not None:
        from .plotting import plot_accuracy

        first = reports[0]["args"]
        steps = ", ".join(f"{r['args']['task']} {r['args']['max_train_steps']} steps" for r in reports)
        plot_accuracy({r["args"]["task"]: r["summary"] for r in reports}, plot, train_length=first["train_length"],
                      title=f"trained at L = {first['train_length']} ({steps}), seeds {first['seeds']}; "
                            "band: min–max over seeds")
    return write_results(Path(root), name, data, inline_depth=4)


def compact_task(report: dict[str, Any]) -> dict[str, Any]:
    """The compact data of one task study: its settings, and per series the points (mean, std, per-seed accuracy)."""
    args, runs = report["args"], report["runs"]
    keep = ("task", "train_length", "max_train_steps", "per_device_train_batch_size", "learning_rate",
            "num_warmup_steps", "seeds", "eval_lengths", "eval_samples", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "gau_layer_factor", "task_vocab_size", "passkey_digits", "num_kv_pairs",
            "position_embedding_types", "variants")
    series: dict[str, Any] = {}
    for row in report["summary"]:
        entry = series.setdefault(row["series"], {"variant": row["variant"], "model_type": row["model_type"],
                                                  "position": row["position_embedding_type"], "points": []})
        point: dict[str, Any] = {"length": row["length"], "status": row["status"]}
        if row["status"] == "ok":
            point.update(accuracy=[round(row["accuracy_mean"], 4), round(row["accuracy_std"], 4)],
                         seeds=row["per_seed"])
        entry["points"].append(point)
    seconds = [run["train"]["seconds"] + run["train"].get("eval_seconds", 0) for run in runs]
    return {"settings": {k: args[k] for k in keep}, "runs": len(runs),
            "run_seconds": [round(min(seconds), 1), round(max(seconds), 1)] if seconds else None,
            "series": series}


__all__ = [
    "REPORTED_PASSKEY",
    "TASK_METRICS",
    "compact_task",
    "publish_replication",
    "publish_retrieval",
    "run_retrieval_study",
    "summarize_task_rows",
    "task_markdown",
    "write_task_outputs",
]
