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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..cli_utils import atomic_write_text

METRICS = ("loss", "accuracy", "perplexity", "loss_beyond_train", "perplexity_beyond_train", "loss_delta",
           "accuracy_delta")
"""Per-point metrics (the ``*_beyond_train`` ones only for causal LMs: predictions from positions ≥ L;
``*_delta``: the value minus the same run's value at the training length, see ``add_deltas``)."""
ROW_FIELDS = ("series", "variant", "model_type", "mode", "objective", "seed", "length", "ratio", "status",
              *METRICS, "tokens", "blocks", "tokens_beyond_train")
SUMMARY_FIELDS = ("series", "variant", "model_type", "mode", "objective", "length", "ratio", "status",
                  "n_seeds",
                  *[f"{m}_{s}" for m in METRICS for s in ("mean", "std", "min", "max", "n")],
                  "tokens", "blocks")


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
    """Copies of ``rows`` with ``loss_delta`` / ``accuracy_delta`` = value − the same series and seed's value
    at ``train_length`` (paired within a run, so the variants' different levels at L cancel; ``None`` when the
    run has no point at L)."""
    rows = [dict(row) for row in rows]
    at_train = {(r["series"], r["seed"]): r for r in rows if int(r["length"]) == train_length
                and r.get("status") == "ok"}
    for row in rows:
        base = at_train.get((row["series"], row["seed"]))
        for metric in ("loss", "accuracy"):
            ok = base is not None and row.get("status") == "ok" and row.get(metric) is not None
            row[f"{metric}_delta"] = row[metric] - base[metric] if ok else None
    return rows


def describe(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean, sample std (ddof 1; 0 for one value), min and max of the finite values (all ``None`` if none),
    and ``n``, how many finite values they describe (a seed's NaN or missing value is left out of them)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}


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
        out = {k: first.get(k)
               for k in ("series", "variant", "model_type", "mode", "objective", "length", "ratio")}
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
    """``mean ± std`` (``mean`` with one value), the row's ``status`` for points that could not run, and
    ``(k of n seeds)`` when only k of the seeds that ran gave a finite value (``{metric}_n``)."""
    if summary_row is None:
        return "–"
    if summary_row.get("status") != "ok":
        return str(summary_row.get("status"))
    mean, std = summary_row.get(f"{metric}_mean"), summary_row.get(f"{metric}_std")
    if mean is None:
        return "–"
    seeds = summary_row.get("n_seeds", 1)
    values = summary_row.get(f"{metric}_n", seeds)
    text = f"{mean:.{digits}f} ± {std:.{digits}f}" if values > 1 and std is not None else f"{mean:.{digits}f}"
    return text if values >= seeds else f"{text} ({values} of {seeds} seeds)"


def markdown_table(summary: Sequence[dict[str, Any]], metric: str, lengths: Sequence[int],
                   series: Sequence[str] | None = None, digits: int = 3,
                   train_length: int | None = None) -> str:
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


__all__ = [
    "METRICS",
    "ROW_FIELDS",
    "SUMMARY_FIELDS",
    "add_deltas",
    "atomic_write_json",
    "atomic_write_text",
    "describe",
    "format_cell",
    "markdown_table",
    "read_json",
    "summarize",
    "to_csv",
]
