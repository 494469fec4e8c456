"""Views of the hybrid position study's results file (``docs/results/hybrid-study.json``), written by
``scripts/run_hybrid_study.sh`` through ``tools/publish_study.py hybrid`` (docs/length_generalization.md,
"NoPE layers in a RoPE model").

Data: as the retrieval study's (``tools/docs_results/retrieval.py``: ``tasks`` with ``settings``, ``runs``,
``run_seconds`` and ``series``; the series' ``position`` is ``rope``, ``none`` or ``nope_every_4``), plus
``entropy``: per task, per series, the slope dH/d log n of ``hf-attn-variants entropy`` (mean over layers and
heads) of each seed's model.

Verdicts follow the retrieval study's rule (``retrieval.verdict``): per seed the mean accuracy difference
beyond L; holds or fails when the mean over seeds is at least 0.05 in size with no seed of the other sign,
not resolved otherwise or when a model has not learned the task at L.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table
from .attention_entropy import spread
from .retrieval import _accuracy_table, _where, learned_threshold, setup, verdict

CLAIMS: tuple[tuple[str, str, str], ...] = (
    ("log-n everywhere, RoPE in every layer", "ei_entropy_invariant", "ei_standard"),
    ("log-n everywhere, no position embedding", "ei_entropy_invariant+nope", "ei_standard+nope"),
    ("log-n everywhere, every 4th layer NoPE", "ei_entropy_invariant+nope_every_4",
     "ei_standard+nope_every_4"),
    ("log-n on the NoPE layers only (Llama 4), every 4th layer NoPE",
     "ei_entropy_invariant_nope_layers+nope_every_4", "ei_standard+nope_every_4"),
    ("every 4th layer NoPE with log-n there reaches further than RoPE",
     "ei_entropy_invariant_nope_layers+nope_every_4", "ei_standard"),
    ("every 4th layer NoPE with log-n there reaches as far as NoPE with log-n",
     "ei_entropy_invariant_nope_layers+nope_every_4", "ei_entropy_invariant+nope"),
)
"""(claim, series a, series b): "a extrapolates better than b"."""


def _slope(data: dict[str, Any], task: str, series: str) -> str:
    return spread((data.get("entropy") or {}).get(task, {}).get(series) or [])


def claims(data: dict[str, Any]) -> str:
    """The verdict of every claim on every task, with each side's entropy slope dH/d log n."""
    head = ["claim", "task", "a − b", "accuracy at L (a / b)", "a − b beyond L, per seed", "verdict",
            "dH/d log n (a / b)"]
    rows = []
    for claim, a, b in CLAIMS:
        for name, task in data["tasks"].items():
            result, diffs, at_l = verdict(task, a, b)
            if diffs is None or at_l is None:
                continue
            rows.append([claim, name, f"`{a}` − `{b}`", f"{at_l[0]:.2f} / {at_l[1]:.2f}",
                         ", ".join(f"{d:+.2f}" for d in diffs), result,
                         f"{_slope(data, name, a)} / {_slope(data, name, b)}"])
    bars = ", ".join(f"{name} {learned_threshold(task):g}" for name, task in data["tasks"].items())
    return (markdown_table(head, rows) + f"\n\n*Learned at L: accuracy at least {bars}. {_where(data)}*")


def slopes(data: dict[str, Any]) -> str:
    """Per task and series: the entropy slope (mean ± std over seeds) beside accuracy at L and beyond L."""
    head = ["task", "series", "dH/d log n", "accuracy at L", "mean accuracy beyond L"]
    rows = []
    for name, task in data["tasks"].items():
        train = task["settings"]["train_length"]
        for series, entry in task["series"].items():
            points = [p for p in entry["points"] if p["status"] == "ok"]
            at_l = next((p["accuracy"][0] for p in points if p["length"] == train), None)
            beyond = [p["accuracy"][0] for p in points if p["length"] > train]
            rows.append([name, f"`{series}`", _slope(data, name, series),
                         "–" if at_l is None else f"{at_l:.2f}",
                         f"{sum(beyond) / len(beyond):.2f}" if beyond else "–"])
    return markdown_table(head, rows) + f"\n\n*{_where(data)}*"


def passkey(data: dict[str, Any]) -> str:
    """Passkey accuracy per series and length (mean ± std over seeds)."""
    return _accuracy_table(data, "passkey")


def mqar(data: dict[str, Any]) -> str:
    """MQAR accuracy (per query) per series and length."""
    return _accuracy_table(data, "mqar")


__all__ = ["CLAIMS", "claims", "mqar", "passkey", "setup", "slopes"]
