"""Views of ``docs/results/demo-cpu.json``: the table ``make demo`` prints (``hf_attn_variants.demo``) and its
wall time, for docs/training.md and README.md.

Data: ``rows`` as in the demo's own ``runs/demo/results.json`` (per family: ``params``, ``train_seconds``,
``lengths`` of ``{length, multiplier, loss, accuracy}``, ``fill_mask``, ``reload``), ``seconds`` (the demo's total),
``sentence``, ``max_seq_length``, ``length_multipliers``; ``make_demo`` (``wall_seconds``, ``cpu_seconds``,
``conditions``: ``make demo`` timed from the shell); optional ``earlier_runs`` (transcribed). ``from_report`` turns
the demo's report into this data.
"""

from __future__ import annotations

from typing import Any

from ._common import source_line


def from_report(report: dict[str, Any], **provenance: Any) -> dict[str, Any]:
    """The results data of a demo report (``hf_attn_variants.demo.demo``'s return value) and ``provenance`` (the
    fields of ``_common.run_metadata``; ``make_demo`` when timed from the shell)."""
    args = report.get("args", {})
    return {**provenance, "sentence": report["sentence"], "seconds": report["seconds"],
            "max_seq_length": args.get("max_seq_length", 64), "length_multipliers": args.get("length_multipliers", [1, 2, 4]),
            "rows": [{k: row[k] for k in ("family", "params", "train_seconds", "lengths", "fill_mask", "reload")}
                     for row in report["rows"]]}


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def table(data: dict[str, Any]) -> str:
    """The demo's sentence, its table and its total time."""
    length, multipliers = data["max_seq_length"], data["length_multipliers"]
    head = ["family", "params", "train s", *[f"loss@{k * length}" for k in multipliers],
            *[f"acc@{k * length}" for k in multipliers], "fill-mask top-3", "reload"]
    lines = [f"fill-mask sentence (top-3 predictions in the table): `{data['sentence']}`", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in data["rows"]:
        by_k = {r["multiplier"]: r for r in row["lengths"]}
        cells = [row["family"], f"{row['params'] / 1e6:.2f}M", f"{row['train_seconds']:.0f}",
                 *[f"{by_k[k]['loss']:.3f}" for k in multipliers], *[f"{by_k[k]['accuracy']:.3f}" for k in multipliers],
                 ", ".join(row["fill_mask"]), row["reload"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Total time: {data['seconds']:.0f} s", "", source_line(data)]
    return "\n".join(lines)


def timing(data: dict[str, Any]) -> str:
    """How long ``make demo`` took, and an earlier version for comparison."""
    make = data["make_demo"]
    text = f"Measured ({make['conditions']}): **{_minutes(make['wall_seconds'])} wall**"
    text += f" ({make['cpu_seconds']:.0f} s CPU)." if make.get("cpu_seconds") is not None else "."
    if make.get("earlier"):
        text += f" {make['earlier']}"
    return text


def stability(data: dict[str, Any]) -> str:
    """Loss at the longest length of earlier runs, to show how stable the ranking of the families is."""
    longest = data["max_seq_length"] * max(data["length_multipliers"])
    sentences = []
    for run in data.get("earlier_runs") or []:
        losses = run["loss_at_longest"]
        values = " / ".join(f"{losses[family]:.2f}" for family in losses)
        names = " / ".join(family.replace("_", "-") for family in losses)
        sentences.append(f"Runs with {run['what']} gave losses at {longest} tokens of {values} ({names}).")
    return " ".join(sentences)


def readme_time(data: dict[str, Any]) -> str:
    """README.md: how long ``make demo`` takes."""
    return (f"`make demo` took {_minutes(data['make_demo']['wall_seconds'])} on this project's 2-core "
            "CPU ([docs/training.md](docs/training.md#the-demo-make-demo)).")
