"""PNG plots of a study: metric vs evaluation length (log₂ x axis), one line per series, ± seed std.

The retrieval tasks (``plot_accuracy``): accuracy (``tasks.METRICS``) vs length, one panel per task × position
scheme, one line per series, a band for the min–max over seeds.

matplotlib with the non-interactive Agg backend (no display needed). One figure per objective: columns
are the families present, rows the metrics (MLM: loss, loss minus the same run's loss at L (paired per
seed, so differences in level at L cancel) and masked-token accuracy; CLM: perplexity over
whole blocks and over the predictions from positions ≥ L only). A dashed vertical line marks the training
length L; series stop where a model cannot run (the Synthesizer beyond ``max_position_embeddings``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cli_utils import save_figure
from .tasks import METRICS
from .variants import POSITION_SCHEMES

ROWS = {
    "mlm": (("loss", "MLM loss (validation)"), ("loss_delta", "loss − same run's loss at L"),
            ("accuracy", "masked-token accuracy")),
    "clm": (("perplexity", "perplexity (whole block)"),
            ("perplexity_beyond_train", "perplexity, positions ≥ L")),
}
FAMILY_TITLES = {"entropy_invariant": "entropy_invariant family", "gau": "GAU", "synthesizer": "Synthesizer",
                 "llama": "stock Llama"}


def plot_summary(summary: Sequence[dict[str, Any]], path: str | Path, *, objective: str, train_length: int,
                 title: str | None = None) -> Path | None:
    """Write the figure of ``objective``'s series in ``summary`` to ``path``; ``None`` if there are none."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    rows = [r for r in summary if r.get("objective") == objective]
    if not rows:
        return None
    families = list(dict.fromkeys(r["model_type"] for r in rows))
    metrics = ROWS[objective]
    fig, axes = plt.subplots(len(metrics), len(families), figsize=(4.8 * len(families), 3.6 * len(metrics)),
                             squeeze=False, sharex=True)
    markers = "osD^vP*Xh<>"
    for col, family in enumerate(families):
        names = list(dict.fromkeys(r["series"] for r in rows if r["model_type"] == family))
        for row_index, (metric, label) in enumerate(metrics):
            ax = axes[row_index][col]
            for i, name in enumerate(names):
                points = sorted((r for r in rows if r["series"] == name and r["status"] == "ok"
                                 and r.get(f"{metric}_mean") is not None), key=lambda r: r["length"])
                if not points:
                    continue
                xs = [p["length"] for p in points]
                ys = [p[f"{metric}_mean"] for p in points]
                errs = [p.get(f"{metric}_std") or 0.0 for p in points]
                style = "-." if name.endswith("+mixed") else "-"
                ax.errorbar(xs, ys, yerr=errs, marker=markers[i % len(markers)], linestyle=style, capsize=3,
                            markersize=4, linewidth=1.4, label=name)
            ax.axvline(train_length, color="0.5", linestyle="--", linewidth=1)
            ax.set_xscale("log", base=2)
            lengths = sorted({r["length"] for r in rows})
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.xaxis.set_minor_locator(NullLocator())
            if metric.startswith("perplexity"):
                ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            if col == 0:
                ax.set_ylabel(label)
            if row_index == 0:
                ax.set_title(FAMILY_TITLES.get(family, family))
            if row_index == len(metrics) - 1:
                ax.set_xlabel(f"evaluation length in tokens (dashed: L = {train_length})")
        axes[0][col].legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def _accuracy_panel(ax: Any, rows: Sequence[dict[str, Any]], names: Sequence[str]) -> None:
    """One line per series (mean over seeds) with a min–max band over seeds."""
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20").colors
    for i, name in enumerate(names):
        points = sorted((r for r in rows if r["series"] == name and r["status"] == "ok"),
                        key=lambda r: r["length"])
        if not points:
            continue
        xs = [p["length"] for p in points]
        color = colors[i % len(colors)]
        ax.plot(xs, [p["accuracy_mean"] for p in points], marker="os^Dv"[i % 5], markersize=3.5,
                linewidth=1.3,
                color=color, linestyle="--" if "llama" in name else "-", label=name)
        ax.fill_between(xs, [p["accuracy_min"] for p in points], [p["accuracy_max"] for p in points],
                        color=color, alpha=0.15, linewidth=0)


def plot_accuracy(summaries: dict[str, Sequence[dict[str, Any]]], path: str | Path, *, train_length: int,
                  title: str | None = None) -> Path | None:
    """Accuracy against evaluation length (log₂ x) of the retrieval tasks: one row of panels per task (key of
    ``summaries``), one column per position scheme (``POSITION_SCHEMES``), one line per series, band =
    min–max over seeds. ``None`` when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    tasks = [task for task, rows in summaries.items() if rows]
    if not tasks:
        return None
    positions = list(dict.fromkeys(r.get("position_embedding_type", "rope") for t in tasks
                                   for r in summaries[t]))
    fig, axes = plt.subplots(len(tasks), len(positions), figsize=(6.4 * len(positions), 4.4 * len(tasks)),
                             squeeze=False, sharey=True)
    for row_index, task in enumerate(tasks):
        for col, position in enumerate(positions):
            ax = axes[row_index][col]
            rows = [r for r in summaries[task] if r.get("position_embedding_type", "rope") == position]
            _accuracy_panel(ax, rows, list(dict.fromkeys(r["series"] for r in rows)))
            lengths = sorted({r["length"] for r in summaries[task]})
            ax.axvline(train_length, color="0.5", linestyle=":", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_ylim(-0.03, 1.03)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{task}, {POSITION_SCHEMES[position][1]}")
            ax.set_ylabel(METRICS.get(task, "accuracy") if col == 0 else "")
            ax.set_xlabel(f"evaluation length (dotted: L = {train_length})")
            ax.legend(fontsize=6.5, loc="best", ncol=2)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = ["plot_accuracy", "plot_summary"]
