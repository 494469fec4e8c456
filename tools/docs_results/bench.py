"""Views of a benchmark results file (kind ``bench``: ``docs/results/benchmarks-cpu.json``, written by
``hf-attn-variants bench``; format in ``hf_attn_variants.bench.store``).

- ``report``: the whole of docs/benchmarks.md below its title (targets, tables, plots, notes).
- ``speed_summary``: the **Speed.** summary table of docs/benchmarks.md (its sentence is the page's own).
- ``gau_table``: docs/gau.md's quadratic-vs-FLASH measurements.
- ``synthesizer_table``: docs/synthesizer.md's component timings.
- ``targets``: the targets table of a run of its own kept beside the report (docs/benchmarks.md's run on
  oneMKL's Intel code path).
- ``fastest``: per comparison, phase and length, the fastest variant and the baseline's time (the lead table
  of docs/benchmarks-gpu.md).

All of them compute their figures with the same functions as the report ``bench`` writes for a run of its own
(``hf_attn_variants.bench.report``), so a figure has one value wherever it is quoted.
"""

from __future__ import annotations

import statistics
from typing import Any

from hf_attn_variants.bench import report as _report
from hf_attn_variants.bench import store as _store
from hf_attn_variants.bench.plots import plot_names as _plot_names

from ._common import markdown_table


def report(data: dict[str, Any]) -> str:
    """The committed benchmark report (docs/benchmarks.md, or a run of docs/benchmarks-gpu.md: a file that
    ``scripts/gpu_check.py publish`` copied names itself and its plots in ``published``, and its report leaves
    the method notes to docs/benchmarks.md)."""
    run = _store.from_results(data)
    published = data.get("published") or {}
    name = published.get("name") or _store.results_name(run.device)
    prefix = published.get("plot_prefix") or _store.plot_prefix(run.device)
    text = _report.render_report(run, source=f"docs/results/{name}.json", committed=True,
                                 plots=_plot_names(run, prefix), notes=not published)
    return _demoted(text, 2) if published else text


def _demoted(markdown: str, levels: int) -> str:
    """``markdown`` with every heading outside code blocks ``levels`` deeper (a report nested in a run's
    section of docs/benchmarks-gpu.md)."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        lines.append("#" * levels + line if line.startswith("#") and not fenced else line)
    return "\n".join(lines)


def fastest(data: dict[str, Any]) -> str:
    """Per comparison, phase and length: the variant with the lowest median time (eager rows), its time, the
    baseline's and their ratio."""
    run = _store.from_results(data)
    phases = {"train": "fwd+bwd", "infer": "forward"}
    rows = []
    for comparison in run.comparisons:
        names = (comparison.baseline, *comparison.variants)
        ok = [r for r in run.results
              if r.variant in names and r.status == "ok" and r.mode == "eager" and r.wall]
        first = True
        for phase in phases:
            for length in sorted({r.length for r in ok if r.phase == phase}):
                timed = {r.variant: statistics.median(r.wall) for r in ok
                         if (r.phase, r.length) == (phase, length)}
                best = min(timed, key=timed.__getitem__)
                base = timed.get(comparison.baseline)
                rows.append([comparison.title if first else "", phases[phase], f"{length:,}", f"`{best}`",
                             f"{1e3 * timed[best]:.1f} ms",
                             "–" if base is None else f"{1e3 * base:.1f} ms",
                             "–" if base is None else f"{timed[best] / base:.2f}×"])
                first = False
    return markdown_table(["comparison", "pass", "tokens", "fastest", "its time", "baseline's time",
                           "ratio"], rows, ["---", "---", "---:", "---", "---:", "---:", "---:"])


def speed_summary(data: dict[str, Any]) -> str:
    """The speed summary table (docs/benchmarks.md)."""
    run = _store.from_results(data)
    return _report.speed_summary(run, _store.report_path(run.device).as_posix())


def gau_table(data: dict[str, Any]) -> str:
    """Quadratic vs FLASH GAU, fwd+bwd time and peak memory per length (docs/gau.md)."""
    return _report.gau_measurements(_store.from_results(data))


def synthesizer_table(data: dict[str, Any]) -> str:
    """Every Synthesizer component's time relative to vanilla (docs/synthesizer.md)."""
    return _report.synthesizer_measurements(_store.from_results(data))


def targets(data: dict[str, Any]) -> str:
    """The targets of a results file of its own, with its provenance line."""
    return _report.targets_of_run(_store.from_results(data))
