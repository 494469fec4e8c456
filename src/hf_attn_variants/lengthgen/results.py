"""Results of a length-generalisation study: atomic JSON writes, aggregation over seeds, CSV and markdown.

A study writes one ``result.json`` per variant × seed (atomically: a temporary file in the same folder,
then ``os.replace``), so an interrupted study never leaves a half-written result and a rerun skips the
finished runs. Everything else (``results.json``, ``results.csv``, ``summary.csv``, ``results.md``, plots)
is regenerated from those files after every run.

Aggregation over seeds: for each series × evaluation length, mean and sample standard deviation
(ddof = 1; 0 with one seed), min, max and the number of seeds. Points a variant cannot evaluate (the
Synthesizer beyond its ``max_position_embeddings``) keep their ``status`` text instead of numbers.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

METRICS = ("loss", "accuracy", "perplexity", "loss_beyond_train", "perplexity_beyond_train", "loss_delta",
           "accuracy_delta")
"""Per-point metrics (the ``*_beyond_train`` ones only for causal LMs: predictions from positions ≥ L;
``*_delta``: the value minus the same run's value at the training length, see ``add_deltas``)."""
ROW_FIELDS = ("series", "variant", "model_type", "mode", "objective", "seed", "length", "ratio", "status",
              *METRICS, "tokens", "blocks", "tokens_beyond_train")
SUMMARY_FIELDS = ("series", "variant", "model_type", "mode", "objective", "length", "ratio", "status", "n_seeds",
                  *[f"{m}_{s}" for m in METRICS for s in ("mean", "std", "min", "max")], "tokens", "blocks")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, data: Any) -> None:
    """``atomic_write_text`` of ``json.dumps(data, indent=2)`` (NaN/inf written as null)."""
    atomic_write_text(path, json.dumps(_finite(data), indent=2) + "\n")


def read_json(path: str | Path) -> Any | None:
    """The JSON in ``path``, or ``None`` when it is missing or unreadable (a run to redo)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _finite(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def add_deltas(rows: Iterable[dict[str, Any]], train_length: int) -> list[dict[str, Any]]:
    """Copies of ``rows`` with ``loss_delta`` / ``accuracy_delta`` = value − the same series and seed's value at
    ``train_length`` (paired within a run, so the variants' different levels at L cancel; ``None`` when the
    run has no point at L)."""
    rows = [dict(row) for row in rows]
    at_train = {(r["series"], r["seed"]): r for r in rows if int(r["length"]) == train_length and r.get("status") == "ok"}
    for row in rows:
        base = at_train.get((row["series"], row["seed"]))
        for metric in ("loss", "accuracy"):
            ok = base is not None and row.get("status") == "ok" and row.get(metric) is not None
            row[f"{metric}_delta"] = row[metric] - base[metric] if ok else None
    return rows


def describe(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean, sample std (ddof 1; 0 for one value), min and max of the finite values (all ``None`` if none)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values)}


def summarize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Aggregate per-seed rows into one row per (series, length): mean/std/min/max of every metric."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    order: list[tuple[str, int]] = []
    for row in rows:
        key = (row["series"], int(row["length"]))
        if key not in groups:
            order.append(key)
        groups[key].append(row)
    summary = []
    for key in order:
        group = groups[key]
        first = group[0]
        out = {k: first.get(k) for k in ("series", "variant", "model_type", "mode", "objective", "length", "ratio")}
        ok = [r for r in group if r.get("status") == "ok"]
        out["status"] = "ok" if ok else first.get("status")
        out["n_seeds"] = len(ok)
        out["seeds"] = sorted(r["seed"] for r in ok)
        for metric in METRICS:
            for stat, value in describe([r.get(metric) for r in ok]).items():
                out[f"{metric}_{stat}"] = value
        out["tokens"] = first.get("tokens")
        out["blocks"] = first.get("blocks")
        summary.append(out)
    return summary


def to_csv(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> str:
    """CSV text of ``rows`` with the columns ``fields`` (missing values empty)."""
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=list(fields), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return stream.getvalue()


def format_cell(summary_row: dict[str, Any] | None, metric: str, digits: int = 3) -> str:
    """``mean ± std`` (``mean`` with one seed), the row's ``status`` for points that could not run."""
    if summary_row is None:
        return "–"
    if summary_row.get("status") != "ok":
        return str(summary_row.get("status"))
    mean, std = summary_row.get(f"{metric}_mean"), summary_row.get(f"{metric}_std")
    if mean is None:
        return "–"
    if summary_row.get("n_seeds", 1) > 1 and std is not None:
        return f"{mean:.{digits}f} ± {std:.{digits}f}"
    return f"{mean:.{digits}f}"


def markdown_table(summary: Sequence[dict[str, Any]], metric: str, lengths: Sequence[int],
                   series: Sequence[str] | None = None, digits: int = 3, train_length: int | None = None) -> str:
    """A markdown table: one row per series, one column per evaluation length (``L`` marks training)."""
    by_key = {(r["series"], int(r["length"])): r for r in summary}
    names = list(series) if series is not None else list(dict.fromkeys(r["series"] for r in summary))
    head = ["variant", *[f"{n}{' (L)' if n == train_length else ''}" for n in lengths]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        if not any((name, n) in by_key for n in lengths):
            continue
        cells = [format_cell(by_key.get((name, n)), metric, digits) for n in lengths]
        lines.append("| " + " | ".join([f"`{name}`", *cells]) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The compact results file the docs render (docs/results/<name>.json, kind "lengthgen")
# --------------------------------------------------------------------------------------------------
PAIRS: tuple[tuple[str, str, bool, str], ...] = (
    ("gau_relu2_fixed", "gau_relu2_dynamic", True, "mlm"),
    ("gau_softmax_plus", "gau_softmax", True, "mlm"),
    ("ei_entropy_invariant", "ei_standard", True, "mlm"),
    ("ei_ssmax", "ei_standard", False, "mlm"),
    ("gau_relu2_dynamic+mixed", "gau_relu2_dynamic", False, "mlm"),
    ("gau_softmax", "gau_relu2_dynamic", False, "mlm"),
    ("gau_softmax", "gau_relu2_fixed", False, "mlm"),
    ("gau_relu2_normalized", "gau_softmax", False, "mlm"),
    ("llama/entropy_invariant_all", "llama/sdpa", True, "llama"),
    ("llama/entropy_invariant_beyond_L", "llama/sdpa", True, "llama"),
)
"""(series a, series b, same trained weights, table): the paired loss differences a − b the docs show, per seed."""
COMPACT_METRICS = ("loss", "loss_delta", "accuracy", "perplexity", "perplexity_beyond_train")


def _exact(value: float | None) -> float | int | None:
    """An exactly zero difference becomes the integer 0 (rendered ``0``: bit-identical, not rounded)."""
    return 0 if value == 0 else value


def paired_differences(rows: Iterable[dict[str, Any]], pairs: Sequence[tuple[str, str, bool, str]] = PAIRS
                       ) -> list[dict[str, Any]]:
    """Per seed and length, loss of series a minus loss of series b (both evaluated on the same blocks and
    masks), for every pair whose two series are in ``rows``; mean over seeds."""
    loss = {(r["series"], int(r["length"]), r["seed"]): r.get("loss") for r in rows if r.get("status") == "ok"}
    series = {r["series"] for r in rows}
    out = []
    for a, b, same, table in pairs:
        if a not in series or b not in series:
            continue
        points = []
        for length in sorted({key[1] for key in loss if key[0] == a}):
            seeds = sorted(key[2] for key in loss if key[0] == a and key[1] == length and (b, length, key[2]) in loss)
            diffs = [_exact(loss[(a, length, s)] - loss[(b, length, s)]) for s in seeds]
            if not diffs:
                continue
            mean = 0 if all(d == 0 for d in diffs) else sum(diffs) / len(diffs)
            points.append({"length": length, "mean": mean, "seeds": diffs})
        out.append({"a": a, "b": b, "same_weights": same, "table": table,
                    "seeds": sorted({key[2] for key in loss if key[0] == a}), "points": points})
    return out


def compact_results(report: dict[str, Any], *, command: str, wall_seconds: float | None = None) -> dict[str, Any]:
    """The compact results data of a study's ``results.json`` report (``write_outputs``), for
    ``hf_attn_variants.results.write_results`` (kind ``lengthgen``, views in ``hf_attn_variants.results.lengthgen``)."""
    from ..results._common import cpu_name, run_metadata

    args, machine = report["args"], report.get("machine", {})
    load = machine.get("load_average_at_start")
    data = run_metadata("lengthgen", command)
    data["cpu"] = cpu_name()
    if load:
        data["machine"] += f"; load average {' / '.join(f'{x:.1f}' for x in load)} at the start"
    data["versions"].update({k: machine[k] for k in ("torch", "transformers") if k in machine})
    data.update({"train_length": args["train_length"], "steps": args["max_train_steps"], "seeds": list(args["seeds"]),
                 "eval_lengths": list(args["eval_lengths"])})
    series: dict[str, dict[str, Any]] = {}
    for row in report["summary"]:
        entry = series.setdefault(row["series"], {"objective": row["objective"], "model_type": row["model_type"],
                                                  "points": []})
        point: dict[str, Any] = {"length": int(row["length"]), "status": row["status"]}
        if row["status"] == "ok":
            for metric in COMPACT_METRICS:
                if row.get(f"{metric}_mean") is not None:
                    point[metric] = [_exact(row[f"{metric}_mean"]), row[f"{metric}_std"]]
        point["blocks"], point["tokens"] = row.get("blocks"), row.get("tokens")
        entry["points"].append(point)
    data["series"] = series
    runs = report.get("runs", [])
    data["pairs"] = paired_differences([r for run in runs for r in run["rows"]])
    data["final_train_loss"] = [
        {"label": f"`{v['variant']}`", "loss": sum(x for x in v["final_train_loss"] if x is not None)
         / max(1, sum(x is not None for x in v["final_train_loss"]))}
        for v in report.get("variants", [])
    ]
    train_seconds = [(run["variant"], run["train"]["seconds"]) for run in runs]
    others = [s for v, s in train_seconds if v != "llama"]
    llama = [s for v, s in train_seconds if v == "llama"]
    finetune_rows = [row for task in (report.get("finetune") or {}).values() for row in task["rows"]]
    data["run"] = {
        "wall_seconds": wall_seconds, "pretrain_runs": len(runs),
        "train_seconds_range": [min(others), max(others)] if others else None,
        "llama_train_seconds": sum(llama) / len(llama) if llama else None,
        "finetune_runs": len(finetune_rows),
        "finetune_conditions": len({row["condition"] for row in finetune_rows}),
        "finetune_tasks": len(report.get("finetune") or {}),
        "finetune_seconds": sum(row.get("train_seconds") or 0 for row in finetune_rows),
    }
    data["finetune"] = {}
    for level, task_report in (report.get("finetune") or {}).items():
        task = task_report["task"]
        data["finetune"][level] = {
            "task": {"train_samples": task["train_samples"], "validation_samples": task["validation_samples"],
                     "mean_tokens": task["mean_tokens"], "max_seq_length": task_report["max_seq_length"],
                     "majority": task["majority_baseline_accuracy"], "chance": task["chance_accuracy"]},
            "conditions": [{"condition": e["condition"], "mean": e["accuracy_mean"], "std": e["accuracy_std"],
                            "seeds": e["accuracy_per_seed"]} for e in task_report["summary"]],
        }
    return data


KEPT_ON_REPUBLISH = ("reruns", "reported")
"""Entries of a study's results file that a new ``publish`` keeps: re-runs of some of its rows on other machines or
code (``publish_rerun``) and runs reported by others (transcribed by hand, each naming its source). They are
evidence about the spread of the study's conclusions and stay valid when the study itself is re-run."""


def publish(results_json: str | Path, name: str, *, root: str | Path = ".", command: str,
            wall_seconds: float | None = None) -> Path:
    """Write ``docs/results/<name>.json`` under ``root`` from a study's ``results.json`` (what
    ``scripts/run_length_study.sh`` calls at the end; then ``python scripts/render_docs.py``). The ``reruns`` and
    ``reported`` entries of an existing file are kept (``KEPT_ON_REPUBLISH``)."""
    from ..results import load_results, results_path, write_results

    report = json.loads(Path(results_json).read_text(encoding="utf-8"))
    data = compact_results(report, command=command, wall_seconds=wall_seconds)
    if results_path(Path(root), name).is_file():
        previous = load_results(Path(root), name)
        data.update({key: previous[key] for key in KEPT_ON_REPUBLISH if key in previous})
    return write_results(Path(root), name, data)


def publish_rerun(results_json: str | Path, name: str, *, root: str | Path = ".", command: str,
                  wall_seconds: float | None = None, code: str | None = None) -> Path:
    """Add a re-run of some of a study's variants (its own ``results.json``, e.g. the relu² rows on another CPU)
    to the study's results file ``docs/results/<name>.json`` as an entry of ``reruns``: the compact data of the
    re-run with its own provenance (``command``, ``machine``, ``cpu``, ``versions``, ``date``, and ``code``, the
    commit or working tree it ran). A re-run with the same command, date and machine replaces its earlier entry.
    ``ValueError`` naming ``name`` when the study's file does not exist, or ``results_json`` when the re-run's
    settings (training length, steps, seeds, evaluation lengths) differ from the study's."""
    from ..results import load_results, results_path, write_results

    root = Path(root)
    if not results_path(root, name).is_file():
        raise ValueError(f"name: no results file {results_path(root, name)} to add the re-run to.")
    data = load_results(root, name)
    report = json.loads(Path(results_json).read_text(encoding="utf-8"))
    rerun = compact_results(report, command=command, wall_seconds=wall_seconds)
    settings = ("train_length", "steps", "seeds", "eval_lengths")
    different = [key for key in settings if rerun[key] != data.get(key)]
    if different:
        raise ValueError(f"results_json: {results_json} was not run with the study's settings ({', '.join(different)} "
                         f"differ), so its rows are not a re-run of {name}.")
    del rerun["kind"]
    if code:
        rerun["code"] = code
    same = (rerun["command"], rerun["date"], rerun["machine"])
    data["reruns"] = [r for r in data.get("reruns", []) if (r["command"], r["date"], r["machine"]) != same] + [rerun]
    return write_results(root, name, data)


__all__ = [
    "KEPT_ON_REPUBLISH",
    "METRICS",
    "PAIRS",
    "ROW_FIELDS",
    "SUMMARY_FIELDS",
    "add_deltas",
    "atomic_write_json",
    "atomic_write_text",
    "compact_results",
    "describe",
    "format_cell",
    "markdown_table",
    "paired_differences",
    "publish",
    "publish_rerun",
    "read_json",
    "summarize",
    "to_csv",
]
