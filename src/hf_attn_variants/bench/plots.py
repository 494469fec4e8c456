"""Log-log plots of step time and peak memory against sequence length, one panel per comparison."""

from __future__ import annotations

import math
from pathlib import Path

from ..cli_utils import save_figure
from .runner import BenchRun

METRICS = (("time", "ms per step"), ("memory", "peak MiB per step"))
"""The plots of a run: (metric, y axis), one PNG each."""


def _series(run: BenchRun, variant: str, phase: str, metric: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for result in sorted(run.results, key=lambda r: r.length):
        if (result.variant, result.mode, result.phase) != (variant, "eager", phase) or result.status != "ok":
            continue
        value = result.median(run.timer) if metric == "time" else result.peak_bytes
        if value:
            xs.append(result.length)
            ys.append(1e3 * value if metric == "time" else value / 2**20)
    return xs, ys


def _plotted(run: BenchRun) -> list:
    """The comparisons with a baseline measured at more than one length (one panel each)."""
    return [
        c for c in run.comparisons
        if len({r.length for r in run.results if r.variant == c.baseline and r.status == "ok"}) > 1
    ]


def plot_names(run: BenchRun, prefix: str = "benchmarks") -> list[str]:
    """File names ``write_plots`` writes for ``run``, one per metric (none when no comparison spans two
    lengths); the committed report links them by these names."""
    return [f"{prefix}_{metric}.png" for metric, _ in METRICS] if _plotted(run) else []


def write_plots(run: BenchRun, folder: Path, prefix: str = "benchmarks") -> list[Path]:
    """``<prefix>_time.png`` and ``<prefix>_memory.png`` in ``folder`` (``plot_names``); returns the paths
    written."""
    comparisons = _plotted(run)
    names = plot_names(run, prefix)
    if not names:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_name, (metric, unit) in zip(names, METRICS, strict=True):
        columns = min(2, len(comparisons))
        rows = math.ceil(len(comparisons) / columns)
        figure, axes = plt.subplots(rows, columns, figsize=(6.2 * columns, 4.2 * rows), squeeze=False)
        for axis, comparison in zip(axes.flat, comparisons, strict=False):
            for index, name in enumerate((comparison.baseline, *comparison.variants)):
                color = f"C{index}"
                for phase, style in (("train", "-"), ("infer", "--")):
                    xs, ys = _series(run, name, phase, metric)
                    if xs:
                        label = f"{name} ({'fwd+bwd' if phase == 'train' else 'infer'})"
                        axis.plot(xs, ys, style, marker="o", color=color, label=label)
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("sequence length n")
            axis.set_ylabel(unit)
            axis.set_title(comparison.title, fontsize=9)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=7)
        for axis in list(axes.flat)[len(comparisons):]:
            axis.set_visible(False)
        figure.suptitle(
            f"{'Step time' if metric == 'time' else 'Peak step memory'} vs n (log-log), {run.device}, "
            f"preset {run.preset.name}", fontsize=10,
        )
        figure.tight_layout()
        paths.append(save_figure(figure, folder / file_name))  # atomic; closes the figure
    return paths


__all__ = ["plot_names", "write_plots"]
