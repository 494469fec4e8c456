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
from hf_attn_variants.bench.report import (
    Ratio,
    format_mib,
    format_ms,
    is_ok,
    merge_mark,
    paired_ratio,
    per_token_growth,
    ratio_cell,
    speedup,
)
from hf_attn_variants.bench.runner import BenchRun, Result

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
    """The **Speed.** summary as a table (measure | figure; docs/benchmarks.md): the headline figures of the
    targets table, then the run they come from and the report that holds them all."""
    run = _store.from_results(data)
    report = _store.report_path(run.device).as_posix()
    rows = []
    ratios = _entropy_invariant_ratios(run)
    if ratios:
        medians = [r.median for _, _, r in ratios]
        lengths = sorted({n for _, n, _ in ratios})
        met = sum(m <= 1.05 for m in medians)
        rows += [[f"entropy-invariant encoder and decoder, fwd+bwd time ÷ stock SDPA models (BERT, Llama), "
                  f"n = {lengths[0]}–{lengths[-1]}", f"{min(medians):.2f}–{max(medians):.2f}×"],
                 ["target ≤ 1.05× met at", f"{met} of {len(medians)} lengths"]]
    large = max(run.preset.lengths)
    faster = speedup(run, "gau_flash", "gau_quadratic", "train", large)
    growth = per_token_growth(run, "gau_flash", "time")
    if faster is not None:
        rows.append([f"FLASH GAU vs quadratic GAU, fwd+bwd at {large} tokens",
                     f"{faster.median:.2f}× faster" if faster.median >= 1
                     else f"{1 / faster.median:.2f}× slower"])
        if growth is not None:
            rows.append([f"FLASH GAU, time per token from {growth[0]} to {growth[1]} tokens",
                         f"×{growth[2]:.2f} ({'flat' if growth[2] <= 1.3 else 'growing'})"])
    longest = max((r.length for r in run.results if r.variant == "llama_equal_sdpa" and is_ok(r)),
                  default=None)
    faster = speedup(run, "gau_flash_causal", "llama_equal_sdpa", "train", longest) if longest else None
    if faster is not None:
        rows.append([f"causal FLASH vs Llama (SDPA) at equal parameters, training at {longest} tokens",
                     f"{faster.median:.2f}× as fast"])
    memory = per_token_growth(run, "gau_quadratic", "memory")
    if memory is not None:
        rows.append([f"quadratic GAU, activation memory per token from {memory[0]} to {memory[1]} tokens",
                     f"×{memory[2]:.2f} ({'flat' if memory[2] <= 1.3 else 'growing'})"])
    small = min(run.preset.lengths)
    faster = speedup(run, "syn_random", "syn_vanilla", "train", small)
    if faster is not None:
        rows.append([f"the Synthesizer's `random` vs `vanilla`, training at n = {small}",
                     f"{faster.median:.2f}× faster"])
    prune_n = min(run.preset.prune_lengths)
    faster = speedup(run, "ei_8h_pruned50", "ei_8h", "infer", prune_n)
    if faster is not None:
        rows.append([f"a 50 %-head-pruned model vs unpruned, inference at n = {prune_n}",
                     f"{faster.median:.2f}× faster"])
    env = run.environment
    rows.append(["device", "CPU" if run.device == "cpu" else str(env.get("gpu") or run.device)])
    rows.append(["date", env["date"][:10]])
    if run.replaced:
        rows.append(["partial re-runs merged", str(len(run.replaced))])
    rows.append(["all figures", f"[{report}]({report})"])
    return markdown_table(["measure", "figure"], rows)


def _entropy_invariant_ratios(run: BenchRun) -> list[tuple[str, int, Ratio]]:
    """(label, n, fwd+bwd ratio to the stock SDPA model) of the entropy-invariant encoder and decoder."""
    out = []
    for variant, baseline, label in (("ei_sdpa", "bert_sdpa", "encoder"),
                                     ("ei_decoder_sdpa", "llama_sdpa", "decoder")):
        for n in run.preset.lengths:
            ratio = paired_ratio(run, variant, baseline, "eager", "train", n)
            if ratio is not None:
                out.append((label, n, ratio))
    return out


def gau_table(data: dict[str, Any]) -> str:
    """Quadratic vs FLASH GAU (docs/gau.md): the settings; fwd+bwd time, paired ratio and peak memory per
    length; how time and peak grow between the two longest lengths."""
    run = _store.from_results(data)
    p = run.preset
    rows = []
    lengths = [n for n in p.lengths if is_ok(run.find("gau_quadratic", "eager", "train", n))
               and is_ok(run.find("gau_flash", "eager", "train", n))]
    for n in lengths:
        q, f = run.find("gau_quadratic", "eager", "train", n), run.find("gau_flash", "eager", "train", n)
        faster = speedup(run, "gau_flash", "gau_quadratic", "train", n)
        rows.append([str(n), format_ms(q.median(run.timer)), format_ms(f.median(run.timer)),
                     "runs differ" if faster is None
                     else f"{faster.median:.2f}× ({faster.low:.2f}–{faster.high:.2f})"
                     + merge_mark(q, f),
                     format_mib(q.peak_bytes), format_mib(f.peak_bytes)])
    if not rows:
        return "(no quadratic/FLASH GAU rows in the results file)"
    clock = "single-threaded process CPU time" if run.timer == "cpu" else "wall-clock time"
    measured = [r for n in lengths for r in (run.find("gau_quadratic", "eager", "train", n),
                                             run.find("gau_flash", "eager", "train", n))]
    settings = [["model", "`GAUModel`"], ["hidden", str(p.hidden_size)],
                ["layers", str(p.gau_layers or p.num_layers)], ["e", str(2 * p.hidden_size)],
                ["s", str(p.gau_key_size)], ["attention", "relu²"], ["batch", str(p.batch_size)],
                ["FLASH chunk g", str(p.gau_chunk_size)],
                ["step", "forward + backward of loss = mean of the squared last hidden state"],
                ["rows of [benchmarks.md](benchmarks.md)", "`gau_quadratic`, `gau_flash`"],
                ["measured by", _measured_by(run, measured)], ["timer", clock],
                ["interleaved rounds (median)", ", ".join(f"{p.repeats_at(n)} at n = {n}" for n in lengths)]]
    lines = [
        markdown_table(["setting", "value"], settings),
        "",
        markdown_table(["n", "quadratic fwd+bwd (ms)", "FLASH fwd+bwd (ms)", "quadratic / FLASH",
                 "quadratic peak (MiB)",
                 "FLASH peak (MiB)"], rows),
    ]
    if len(lengths) >= 2:
        a, b = lengths[-2], lengths[-1]
        growth = {}
        for name in ("gau_flash", "gau_quadratic"):
            x, y = run.find(name, "eager", "train", a), run.find(name, "eager", "train", b)
            growth[name] = (y.median(run.timer) / x.median(run.timer), y.peak_bytes / x.peak_bytes)
        linear = growth["gau_quadratic"][1] <= 1.3 * b / a
        lines += ["", markdown_table(
            [f"from {a} to {b} tokens ({b / a:g}×)", "time grows", "peak grows", "why"],
            [["FLASH", f"{growth['gau_flash'][0]:.1f}×", f"{growth['gau_flash'][1]:.1f}×", "–"],
             ["quadratic GAU", f"{growth['gau_quadratic'][0]:.1f}×", f"{growth['gau_quadratic'][1]:.1f}×",
              "time: its n² terms" + ("; peak linear too: above 16 MiB of scores the blocked kernel keeps no "
                                      "n×n tensor for backward" if linear else "")]])]
    first = speedup(run, "gau_flash", "gau_quadratic", "train", lengths[0])
    if first is not None and first.median < 1:
        lines += ["", markdown_table(["n", "chunks", "FLASH slower because"],
                              [[str(lengths[0]), str(lengths[0] // p.gau_chunk_size),
                                "little to skip: its linear-attention summaries cost a little more than they "
                                "save"]])]
    return "\n".join(lines)


def _measured_by(run: BenchRun, results: list[Result]) -> str:
    """Which run measured ``results``: the full run's command, date, CPU, torch and load, or those of the
    partial run(s) merged into it (``[merge k]``) when rows come from them."""
    env = run.environment
    full = (f"`{env.get('command')}`, {env['date']}, {env['cpu']}, torch {env['torch']}, load average "
            f"{env.get('load_average_start')} → {env.get('load_average_end')}")
    merges = sorted({r.merge for r in results if r.merge})
    parts = [] if merges and all(r.merge for r in results) else [full]
    for entry in run.replaced:
        if entry["merge"] in merges:
            parts.append(f"[merge {entry['merge']}]: `{entry['command']}`, {entry['date']}, "
                         f"{entry['machine']['cpu']}, torch {entry['versions']['torch']}, load average "
                         f"{entry.get('load_average_start')} → {entry.get('load_average_end')}")
    return "; ".join(parts)


SYNTHESIZER_ORDER = ("syn_vanilla", "syn_dense", "syn_random", "syn_factorized_dense",
                     "syn_factorized_random",
                     "syn_random_vanilla")


def synthesizer_table(data: dict[str, Any]) -> str:
    """Every Synthesizer component's fwd+bwd (and inference) time relative to vanilla
    (docs/synthesizer.md)."""
    run = _store.from_results(data)
    p = run.preset
    env = run.environment
    lengths = [n for n in p.lengths if is_ok(run.find("syn_vanilla", "eager", "train", n))]
    if not lengths:
        return "(no Synthesizer rows in the results file)"
    header = ["variant"]
    for n in lengths:
        header += [f"fwd+bwd ms, n = {n}", "× vanilla", "infer × vanilla"]
    rows = []
    for name in SYNTHESIZER_ORDER:
        if run.variants.get(name) is None:
            continue
        cells = [run.variants[name]["description"].split(" ")[1]]
        for n in lengths:
            train = run.find(name, "eager", "train", n)
            if not is_ok(train):
                cells += ["–", "–", "–"]
                continue
            cells += [format_ms(train.median(run.timer)) + merge_mark(train),
                      ratio_cell(run, name, "syn_vanilla", "eager", "train", n),
                      ratio_cell(run, name, "syn_vanilla", "eager", "infer", n)]
        rows.append(cells)
    clock = "single-threaded process CPU time" if run.timer == "cpu" else "wall-clock time"
    return "\n".join([
        (f"{p.num_layers} layers, hidden {p.hidden_size}, {p.num_heads} heads, FFN {p.intermediate_size}, l "
         f"= n, batch {p.batch_size}, `SynthesizerModel` in training mode, loss = mean(h²): the Synthesizer "
         f"rows of [benchmarks.md](benchmarks.md) (`{env.get('command')}`, {env['date']}, {env['cpu']}, "
         f"torch {env['torch']}, load average {env.get('load_average_start')} → "
         f"{env.get('load_average_end')}). Times are {clock}, medians of "
         f"{', '.join(str(p.repeats_at(n)) for n in lengths)} interleaved rounds at n = "
         f"{', '.join(map(str, lengths))}; a ratio is the median of the per-round ratios to `vanilla` "
         "(smallest–largest round). Every variant runs eager (the Synthesizer forms its softmax explicitly; "
         "vanilla does not use SDPA here); \"–\": not timed at that length (see *Skipped or failed* in "
         "benchmarks.md)."),
        "",
        markdown_table(header, rows),
    ])


def targets(data: dict[str, Any]) -> str:
    """The targets table of a (partial) run of its own, kept beside the committed report (e.g. on another CPU
    or oneMKL code path), under a line saying where, when and by what command it was measured."""
    run = _store.from_results(data)
    env = run.environment
    where = f"{env['cpu']}, {env['cpu_count']} logical CPUs, {run.threads} thread(s)"
    versions = ", ".join(f"{name} {env[name]}" for name in ("python", "torch", "transformers")
                         if env.get(name))
    rows = [target.cells() for target in _report.targets(run)]
    body = (markdown_table(["target", "measured", "verdict"], rows) if rows
            else "*No target was measured in this run.*")
    return f"*Measured by `{env['command']}` on {env['date']}, on {where} ({versions}).*\n\n{body}\n"
