"""Views of ``docs/results/demo-cpu.json``: the table ``make demo`` prints (``hf_attn_variants.demo``) and its
wall time, for docs/training.md and CONTRIBUTING.md.

Data: ``rows`` as in the demo's own ``runs/demo/results.json`` (per family: ``params``, ``train_seconds``,
``lengths`` of ``{length, multiplier, loss, accuracy}``, ``fill_mask``, ``reload``), ``seconds`` (the demo's
total), ``sentence``, ``max_seq_length``, ``length_multipliers``; ``make_demo`` (``wall_seconds``,
``cpu_seconds``, ``conditions``: ``make demo`` timed from the shell); optional ``earlier_runs`` (transcribed).
``from_report`` turns the demo's report into this data.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, minutes, source_line


def from_report(report: dict[str, Any], **provenance: Any) -> dict[str, Any]:
    """The results data of a demo report (``hf_attn_variants.demo.demo``'s return value) and ``provenance``
    (the fields of ``_common.run_metadata``; ``make_demo`` when timed from the shell)."""
    args = report.get("args", {})
    return {**provenance, "sentence": report["sentence"], "seconds": report["seconds"],
            "max_seq_length": args.get("max_seq_length", 64),
            "length_multipliers": args.get("length_multipliers", [1, 2, 4]),
            "rows": [{k: row[k]
                      for k in ("family", "params", "train_seconds", "lengths", "fill_mask", "reload")}
                     for row in report["rows"]]}


def table(data: dict[str, Any]) -> str:
    """The demo's table (what ``make demo`` prints), then the source line."""
    length, multipliers = data["max_seq_length"], data["length_multipliers"]
    head = ["family", "params", "train s", *[f"loss@{k * length}" for k in multipliers],
            *[f"acc@{k * length}" for k in multipliers], "fill-mask top-3", "reload"]
    rows = []
    for row in data["rows"]:
        by_k = {r["multiplier"]: r for r in row["lengths"]}
        rows.append([row["family"], f"{row['params'] / 1e6:.2f}M", f"{row['train_seconds']:.0f}",
                     *[f"{by_k[k]['loss']:.3f}" for k in multipliers],
                     *[f"{by_k[k]['accuracy']:.3f}" for k in multipliers], ", ".join(row["fill_mask"]),
                     row["reload"]])
    return markdown_table(head, rows) + f"\n\n{source_line(data)}"


def sentence(data: dict[str, Any]) -> str:
    """The fill-mask sentence whose top-3 predictions the table shows (one figure)."""
    return f"`{data['sentence']}`"


def total_time(data: dict[str, Any]) -> str:
    """The demo's own total time, as it reports it (one figure)."""
    return f"{data['seconds']:.0f} s"


def stability(data: dict[str, Any]) -> str:
    """Loss at the longest length in earlier runs, one row per run (to show how stable the families' ranking
    is); ``""`` without earlier runs."""
    runs = data.get("earlier_runs") or []
    if not runs:
        return ""
    longest = data["max_seq_length"] * max(data["length_multipliers"])
    families = list(runs[0]["loss_at_longest"])
    rows = [[run["what"], *[f"{run['loss_at_longest'][family]:.2f}" for family in families]] for run in runs]
    head = [f"earlier run (loss at {longest} tokens)", *[family.replace("_", "-") for family in families]]
    return markdown_table(head, rows, ["---", *["---:"] * len(families)])


def wall_time(data: dict[str, Any]) -> str:
    """How long ``make demo`` took, wall clock (one figure)."""
    return minutes(data["make_demo"]["wall_seconds"])
