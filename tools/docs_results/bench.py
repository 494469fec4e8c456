"""Views of a benchmark results file (kind ``bench``: ``docs/results/benchmarks-cpu.json``, written by
``hf-attn-variants bench``; format in ``hf_attn_variants.bench.store``).

- ``report``: the whole of docs/benchmarks.md below its title (targets, tables, plots, notes).
- ``speed_summary``: the **Speed.** summary table of docs/benchmarks.md (its sentence is the page's own).
- ``gau_table``: docs/gau.md's quadratic-vs-FLASH measurements.
- ``synthesizer_table``: docs/synthesizer.md's component timings.
- ``targets``: the targets table of a run of its own kept beside the report (docs/benchmarks.md's run on
  oneMKL's Intel code path).

All of them compute their figures with the same functions as the report ``bench`` writes for a run of its own
(``hf_attn_variants.bench.report``), so a figure has one value wherever it is quoted.
"""

from __future__ import annotations

from typing import Any

from hf_attn_variants.bench import report as _report
from hf_attn_variants.bench import store as _store
from hf_attn_variants.bench.plots import plot_names as _plot_names


def report(data: dict[str, Any]) -> str:
    """The committed benchmark report (docs/benchmarks.md, or docs/benchmarks-gpu.md for a CUDA run)."""
    run = _store.from_results(data)
    name = _store.results_name(run.device)
    return _report.render_report(run, source=f"docs/results/{name}.json", committed=True,
                                 plots=_plot_names(run, _store.plot_prefix(run.device)))


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
