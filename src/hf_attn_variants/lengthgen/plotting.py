"""PNG plots of a study: metric vs evaluation length (log₂ x axis), one line per series, ± seed std.

matplotlib with the non-interactive Agg backend (no display needed). One figure per objective: columns
are the families present, rows the metrics (MLM: loss, loss minus the same run's loss at L (paired per
seed, so differences in level at L cancel) and masked-token accuracy; CLM: perplexity over
whole blocks and over the predictions from positions ≥ L only). A dashed vertical line marks the training
length L; series stop where a model cannot run (the Synthesizer beyond ``max_position_embeddings``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROWS = {
    "mlm": (("loss", "MLM loss (validation)"), ("loss_delta", "loss − same run's loss at L"),
            ("accuracy", "masked-token accuracy")),
    "clm": (("perplexity", "perplexity (whole block)"), ("perplexity_beyond_train", "perplexity, positions ≥ L")),
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp.png", dir=path.parent)
    os.close(handle)
    try:  # unique staging name: several workers may write the same plot at once
        fig.savefig(name, dpi=110)
        os.replace(name, path)
    finally:
        plt.close(fig)
        Path(name).unlink(missing_ok=True)
    return path


__all__ = ["plot_summary"]
