"""Views of an attention-entropy results file (``docs/results/attention-entropy*.json``): the output of
``hf-attn-variants entropy`` as ``tools/publish_study.py entropy`` publishes it
(docs/length_generalization.md, "Attention entropy").

Data: the command's fields (``task``, ``train_length``, ``settings``, and ``series``: per series its
``name``, ``model_type``, ``attention`` (in words), ``attn_implementation``, ``stock``, ``causal``,
``normalized``, ``lengths``,
``log_keys``, ``mean_entropy``, ``entropy`` per length × layer × head, ``head_slopes``, ``slope``,
``diffuse_heads`` and ``diffuse_slope``), the provenance fields, and, where the models came from a
``lengthgen`` study, ``accuracy``: per study series its accuracy per seed at L and its mean per seed over the
lengths beyond L.

Series named ``<series>@<seed>`` are one study series measured per seed; the views give the mean ± std over
the seeds.
"""

from __future__ import annotations

import statistics
from typing import Any

from ._common import markdown_table, source_line


def study_series(name: str) -> str:
    """``"ei_standard@1"`` → ``"ei_standard"`` (a name without ``@`` is its own series)."""
    return name.rsplit("@", 1)[0]


def grouped(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The entries of ``series`` grouped by study series, in order of first appearance."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in data["series"]:
        groups.setdefault(study_series(entry["name"]), []).append(entry)
    return groups


def spread(values: list[float]) -> str:
    """``mean ± std`` over seeds (the mean alone for one value)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def _attention(entry: dict[str, Any]) -> str:
    return entry["attention"] + (" (rows normalised)" if entry["normalized"] else "")


def slopes(data: dict[str, Any]) -> str:
    """Per series: dH/d log n (mean over heads), over the diffuse heads, H at L and at the longest length,
    and, for a study's models, accuracy at L and beyond."""
    accuracy = data.get("accuracy") or {}
    train = data["train_length"]
    head = ["series", "attention", "seeds", "dH/d log n", "diffuse heads: dH/d log n", "H at L",
            "H at the longest n"]
    if accuracy:
        head += ["accuracy at L", "accuracy beyond L"]
    rows = []
    for name, entries in grouped(data).items():
        first = entries[0]
        at_l = [e["mean_entropy"][e["lengths"].index(train)] for e in entries if train in e["lengths"]]
        longest = [e["mean_entropy"][-1] for e in entries]
        row = [f"`{name}`", _attention(first), str(len(entries)), spread([e["slope"] for e in entries]),
               spread([e["diffuse_slope"] for e in entries]), spread(at_l),
               f"{spread(longest)} (n = {first['lengths'][-1]})"]
        if accuracy:
            found = accuracy.get(name) or {}
            row += [spread(found.get("at_L") or []), spread(found.get("beyond_L") or [])]
        rows.append(row)
    inputs = (f"{data['task']} sequences" if data["task"] != "text" else "text windows")
    return (markdown_table(head, rows) + f"\n\n*Inputs: {inputs}, {data['settings']['samples']} per length, "
            f"n = {', '.join(map(str, data['series'][0]['lengths']))}; L = {train}.*\n\n" + source_line(data))


def slope(data: dict[str, Any]) -> str:
    """The mean slope of the one series a file holds (for a sentence): ``0.12``."""
    entries = next(iter(grouped(data).values()))
    return spread([e["slope"] for e in entries])


__all__ = ["grouped", "slope", "slopes", "spread", "study_series"]
