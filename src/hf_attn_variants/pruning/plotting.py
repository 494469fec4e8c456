"""Plots for head pruning: the pruning curve (metric vs fraction of heads pruned) and the importance heat-map.

matplotlib with the non-interactive Agg backend (no display needed); each function writes one PNG.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import torch

from .iterative import PruningStep


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_pruning_curve(
    curves: Sequence[PruningStep] | Mapping[str, Sequence[PruningStep]],
    path: str | os.PathLike,
    *,
    metric_name: str = "metric",
    threshold: float | None = None,
    higher_is_better: bool = True,
    title: str = "Iterative head pruning",
) -> None:
    """Metric vs % of heads pruned, one line per curve, the unpruned baseline dashed.

    ``curves`` is one curve or ``{label: curve}``. Steps that fell below the threshold (not applied) are
    drawn as red crosses; ``threshold`` (relative) adds a dotted line at threshold × baseline (baseline /
    threshold when lower is better).
    """
    plt = _pyplot()
    if not isinstance(curves, Mapping):
        curves = {"importance order": curves}
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    baseline = None
    for label, curve in curves.items():
        if not curve:
            continue
        baseline = curve[0].metric if baseline is None else baseline
        kept = [row for row in curve if row.accepted]
        axes.plot([100 * r.fraction for r in kept], [r.metric for r in kept], marker="o", markersize=3,
                  label=label)
        rejected = [row for row in curve if not row.accepted]
        if rejected:
            axes.scatter([100 * r.fraction for r in rejected], [r.metric for r in rejected], marker="x",
                         color="red", zorder=3, label=f"{label}: below threshold (not applied)")
    if baseline is not None:
        axes.axhline(baseline, linestyle="--", color="grey", linewidth=1, label=f"unpruned ({baseline:.4g})")
        if threshold is not None:
            limit = threshold * baseline if higher_is_better else baseline / threshold
            axes.axhline(limit, linestyle=":", color="grey", linewidth=1,
                         label=f"threshold ({threshold:.0%})")
    axes.set_xlabel("heads pruned (%)")
    axes.set_ylabel(metric_name)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_head_importance(importance: torch.Tensor, path: str | os.PathLike, *,
                         title: str = "Head importance") -> None:
    """Heat-map of a ``(num_layers, num_heads)`` importance tensor; pruned (NaN) heads grey, values
    annotated."""
    plt = _pyplot()
    values = importance.detach().float().cpu().numpy()
    layers, heads = values.shape
    figure, axes = plt.subplots(figsize=(max(5.5, 0.6 * heads + 2), max(2.8, 0.5 * layers + 1.6)))
    colormap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    image = axes.imshow(values, cmap=colormap, aspect="auto")
    figure.colorbar(image, ax=axes, label="importance")
    if layers * heads <= 256:
        finite = values[~torch.isnan(importance.cpu()).numpy()]
        middle = float(finite.mean()) if finite.size else 0.0
        for layer in range(layers):
            for head in range(heads):
                value = values[layer, head]
                missing = math.isnan(value)
                text = "—" if missing else f"{value:.2f}"
                color = "black" if missing or value > middle else "white"
                axes.text(head, layer, text, ha="center", va="center", fontsize=7, color=color)
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    axes.set_xticks(range(heads))
    axes.set_yticks(range(layers))
    axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


__all__ = ["plot_head_importance", "plot_pruning_curve"]
