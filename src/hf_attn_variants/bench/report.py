"""The benchmark report from a ``BenchRun`` (read from its results file): settings, machine, targets, tables.

Every number is computed here from the per-round times, peaks and FLOPs of the results file
(``store.py``); nothing is typed in by hand. ``notes.md`` next to this module holds the static notes
(design choices, how to read the numbers); its ``{{name}}`` placeholders are filled from the run (the
before/after tables of the GAU kernels, compile times). The other views of the results file (the speed
summary, the tables of docs/gau.md and docs/synthesizer.md) live with the docs renderer, in the repository's
``tools/docs_results/bench.py``; they compute their figures with this module's public functions
(``paired_ratio``, ``speedup``, ``per_token_growth``, ``targets`` and the cell formats), so a figure is quoted
with one value everywhere.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .runner import BenchRun, Result
from .specs import LOOP_FAMILY, Comparison

PHASE_TITLES = {"train": "forward+backward", "infer": "inference (no_grad forward)"}


@dataclass
class Ratio:
    """Median of per-round ratios variant/baseline, with the smallest and largest round."""

    median: float
    low: float
    high: float

    def text(self) -> str:
        return f"{self.median:.2f} ({self.low:.2f}–{self.high:.2f})"


def paired_ratio(run: BenchRun, variant: str, baseline: str, mode: str, phase: str, length: int,
                 baseline_mode: str | None = None) -> Ratio | None:
    """Ratio of ``variant`` to ``baseline`` step times, paired round by round (primary timer); ``None`` unless
    both were measured, in the same run (a row merged in by a later partial run pairs only with its own
    run)."""
    a = run.find(variant, mode, phase, length)
    b = run.find(baseline, baseline_mode or mode, phase, length)
    if a is None or b is None or a.status != "ok" or b.status != "ok" or a.merge != b.merge:
        return None
    pairs = [x / y for x, y in zip(a.times(run.timer), b.times(run.timer), strict=False) if y > 0]
    if not pairs:
        return None
    return Ratio(statistics.median(pairs), min(pairs), max(pairs))


def format_ms(seconds: float | None) -> str:
    """Seconds as milliseconds for a table cell (one decimal below 10 s); "–" for none."""
    return "–" if seconds is None else (f"{1e3 * seconds:.1f}" if seconds < 10 else f"{1e3 * seconds:.0f}")


def format_mib(value: int | None) -> str:
    """Bytes as MiB for a table cell; "–" for none."""
    return "–" if value is None else f"{value / 2**20:.1f}"


def _tokens_per_s(result: Result, timer: str) -> str:
    median = result.median(timer)
    if not median:
        return "–"
    rate = result.batch_size * result.length / median
    return f"{rate / 1e3:.1f}k" if rate >= 1e3 else f"{rate:.0f}"


def _throughput(result: Result, timer: str, peak_tflops: float | None) -> str:
    median = result.median(timer)
    if not median or not result.flops:
        return "–"
    gflops = result.flops / median / 1e9
    if peak_tflops:
        return f"{gflops:.1f} ({100 * gflops / (1e3 * peak_tflops):.1f} %)"
    return f"{gflops:.1f}"


def _parameters(info: dict) -> str:
    count = info.get("parameters")
    return "" if not count else f" ({count / 1e6:.2f}M parameters)"


def _rounds(count: int) -> str:
    return "one round" if count == 1 else f"{count} rounds"


def _precision(run: BenchRun) -> str:
    """The precision line: autocast applies to the models' steps, not to the training loops
    (``bench/loops.py`` trains in float32 whatever ``--dtype`` says)."""
    if run.dtype == "float32":
        return run.dtype
    has_loops = any(r.loop for r in run.results)
    loops = " for the models; the training-loop rows run in float32" if has_loops else ""
    return f"{run.dtype} (autocast){loops}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} minutes"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# ---------------------------------------------------------------------------------------------- figures
def speedup(run: BenchRun, fast: str, slow: str, phase: str, length: int,
            mode: str = "eager") -> Ratio | None:
    """How many times faster ``fast`` is than ``slow`` (the inverse of their paired ratio)."""
    ratio = paired_ratio(run, fast, slow, mode, phase, length)
    return None if ratio is None else Ratio(1 / ratio.median, 1 / ratio.high, 1 / ratio.low)


def is_ok(result: Result | None) -> bool:
    """Whether ``result`` is a measured row (not missing, skipped or failed)."""
    return result is not None and result.status == "ok"


def merge_mark(*results: Result | None) -> str:
    """`` [merge k]`` for every partial run among ``results``' rows (empty for rows of the main run)."""
    return "".join(f" [merge {k}]" for k in sorted({r.merge for r in results if r is not None and r.merge}))


def _rows(run: BenchRun, variant: str, phase: str, lengths: Iterable[int],
          mode: str = "eager") -> list[Result | None]:
    return [run.find(variant, mode, phase, n) for n in lengths]


def per_token_growth(run: BenchRun, variant: str, metric: str) -> tuple[int, int, float] | None:
    """(shortest n, longest n, (value/n at the longest) ÷ (value/n at the shortest)) of fwd+bwd time or peak
    memory."""
    lengths = [n for n in run.preset.lengths if is_ok(run.find(variant, "eager", "train", n))]
    if len(lengths) < 2:
        return None
    small, large = min(lengths), max(lengths)
    a, b = run.find(variant, "eager", "train", small), run.find(variant, "eager", "train", large)
    values = (a.median(run.timer), b.median(run.timer)) if metric == "time" else (a.peak_bytes, b.peak_bytes)
    if not all(values):
        return None
    return small, large, (values[1] / large) / (values[0] / small)


def is_loop(run: BenchRun, comparison: Comparison) -> bool:
    """Whether ``comparison`` sets training loops side by side (``bench/loops.py``) rather than models."""
    return run.variants.get(comparison.baseline, {}).get("family") == LOOP_FAMILY


def loop_row(run: BenchRun, name: str) -> Result | None:
    """The row of the training loop ``name`` (``None`` when the run has none)."""
    return next((r for r in run.results if r.variant == name and r.loop is not None), None)


def loop_ratio(run: BenchRun, loop: str, baseline: str) -> Ratio | None:
    """``loop``'s tokens/s ÷ ``baseline``'s: the median over rounds of (baseline's step time ÷ ``loop``'s),
    with the smallest and largest round; ``None`` unless both ran, in one run, with the same tokens per
    step."""
    a, b = loop_row(run, loop), loop_row(run, baseline)
    if not (is_ok(a) and is_ok(b)) or a.length != b.length or a.batch_size != b.batch_size:
        return None
    return paired_ratio(run, baseline, loop, "eager", "train", a.length)


@dataclass
class Target:
    label: str
    measured: str
    met: bool | None  # None: no target (reference row)
    rows: list[Result | None] = field(default_factory=list)

    def cells(self) -> list[str]:
        verdict = "–" if self.met is None else ("**met**" if self.met else "**missed**")
        return [self.label, self.measured + merge_mark(*self.rows), verdict]


def targets(run: BenchRun) -> list[Target]:
    """The targets of the benchmark and what this run measured for them."""
    out: list[Target] = []
    lengths = list(run.preset.lengths)
    small, large = min(lengths), max(lengths)
    for variant, baseline, label in (
        ("ei_sdpa", "bert_sdpa", "entropy_invariant encoder (SDPA) fwd+bwd ≤ 1.05× stock BERT (SDPA)"),
        ("ei_decoder_sdpa", "llama_sdpa",
         "entropy_invariant decoder (SDPA) fwd+bwd ≤ 1.05× stock Llama (SDPA)"),
    ):
        for n in lengths:
            rows = [run.find(variant, "eager", "train", n), run.find(baseline, "eager", "train", n)]
            if not any(rows):
                continue
            ratio = paired_ratio(run, variant, baseline, "eager", "train", n)
            out.append(Target(f"{label}, n = {n}", "–" if ratio is None else f"{ratio.text()}×",
                              None if ratio is None else ratio.median <= 1.05, rows))
    flash_rows = _rows(run, "gau_flash", "train", (small, large))
    growth = per_token_growth(run, "gau_flash", "time")
    if growth is not None:
        out.append(Target(f"GAU FLASH time per token flat: (t/n at {growth[1]}) ÷ (t/n at {growth[0]}) ≤ 1.3",
                          f"{growth[2]:.2f}", growth[2] <= 1.3, flash_rows))
    growth = per_token_growth(run, "gau_flash", "memory")
    if growth is not None:
        out.append(Target(f"GAU FLASH activation memory linear: (peak/n at {growth[1]}) ÷ (peak/n at "
                          f"{growth[0]})",
                          f"{growth[2]:.2f}", growth[2] <= 1.3, flash_rows))
    faster = speedup(run, "gau_flash", "gau_quadratic", "train", large)
    if faster is not None:
        out.append(Target(f"GAU FLASH ≥ 3× faster than quadratic GAU at n = {large} (fwd+bwd)",
                          f"{faster.median:.2f}×", faster.median >= 3,
                          [*flash_rows, run.find("gau_quadratic", "eager", "train", large)]))
    for name in ("gau_quadratic", "gau_softmax_plus"):
        growth = per_token_growth(run, name, "memory")
        result = run.find(name, "eager", "train", large)
        if growth is None or growth[1] != large:
            continue
        layers = run.preset.gau_layers or run.preset.num_layers  # these are GAU models
        per_layer = result.peak_bytes / (4 * large**2 * layers * run.preset.batch_size)
        out.append(Target(
            (f"`{name}` keeps no more n×n tensors than the math needs: fwd+bwd peak at n = {large} in "
             "n×n float32 buffers per layer (autograd's minimum for relu²/softmax: 2 / 1), and peak-per-"
             f"token growth {growth[0]} → {large}"),
            f"{per_layer:.2f} buffers; ×{growth[2]:.2f} per token", per_layer <= 1.0,
            _rows(run, name, "train", (small, large))))
    faster = speedup(run, "syn_random", "syn_vanilla", "train", small)
    if faster is not None:
        out.append(Target(f"Synthesizer random ≥ 1.3× faster than vanilla, fwd+bwd, n = {small}",
                          f"{faster.median:.2f}×", faster.median >= 1.3,
                          [run.find(v, "eager", "train", small) for v in ("syn_random", "syn_vanilla")]))
    for phase in ("infer", "train"):
        n = min(run.preset.prune_lengths)
        faster = speedup(run, "ei_8h_pruned50", "ei_8h", phase, n)
        if faster is not None:
            label = "inference" if phase == "infer" else "fwd+bwd (no target, for reference)"
            out.append(Target(f"50 %-head-pruned model ≥ 1.3× faster than unpruned, {label}, n = {n}",
                              f"{faster.median:.2f}×", faster.median >= 1.3 if phase == "infer" else None,
                              [run.find(v, "eager", phase, n) for v in ("ei_8h_pruned50", "ei_8h")]))
    out += _peer_targets(run)
    out += _equal_parameter_targets(run)
    out += _long_flash_targets(run)
    out += _compile_targets(run)
    out += _loop_targets(run)
    return out


PEER_PAIRS = (("gau_flash", "flash_pytorch", "bidirectional"),
              ("gau_flash_causal", "flash_pytorch_causal", "causal"))
"""(ours, the peer, direction) of the peer targets."""
PEER_TARGET = 0.85
"""The most our FLASH's fwd+bwd time may be of FLASH-pytorch's at equal shapes (issue 24)."""


def _peer_targets(run: BenchRun) -> list[Target]:
    """Our FLASH ≤ 0.85× FLASH-pytorch's fwd+bwd time at n ≥ 2048, at no more peak memory (paired, same run),
    eager and, where both were compiled at that length, ``torch.compile``d."""
    out = []
    for mode in ("eager", "compiled"):
        for ours, peer, direction in PEER_PAIRS:
            for n in (n for n in run.preset.lengths if n >= 2048):
                rows = [run.find(ours, mode, "train", n), run.find(peer, mode, "train", n)]
                ratio = paired_ratio(run, ours, peer, mode, "train", n)
                if ratio is None or not all(is_ok(r) for r in rows):
                    continue
                mine, theirs = rows[0].peak_bytes, rows[1].peak_bytes
                how = ", both `torch.compile`d" if mode == "compiled" else ""
                met = ratio.median <= PEER_TARGET and mine <= theirs
                measured = f"{ratio.text()}×; peak {format_mib(mine)} vs {format_mib(theirs)} MiB"
                if ratio.median > PEER_TARGET:
                    measured += (f"; {ratio.median / PEER_TARGET - 1:.0%} above the target time (why: the "
                                 "profile under \"Where the time goes\" in docs/benchmarks.md)")
                out.append(Target(f"our FLASH ({direction}{how}) fwd+bwd ≤ {PEER_TARGET}× FLASH-pytorch's "
                                  f"time at no more peak memory, n = {n}", measured, met, rows))
    return out


def _equal_parameter_targets(run: BenchRun) -> list[Target]:
    """FLASH faster than Llama (SDPA) at equal parameters from n = 4096 (fwd+bwd time ratio < 1), and ≥ 2×
    faster at n = 32768 (ratio ≤ 0.5); paired, same run (issue 24); and, both compiled, no slower (ratio ≤ 1)
    where both were compiled (issue 47: n = 8192)."""
    out = []
    lengths = sorted({r.length for r in run.results if r.variant == "llama_equal_sdpa" and r.length >= 4096})
    for n in lengths:
        rows = [run.find("gau_flash_causal", "eager", "train", n),
                run.find("llama_equal_sdpa", "eager", "train", n)]
        ratio = paired_ratio(run, "gau_flash_causal", "llama_equal_sdpa", "eager", "train", n)
        if ratio is None or not all(is_ok(r) for r in rows):
            continue
        long = n >= 32768
        out.append(Target(f"FLASH (causal) fwd+bwd {'≥ 2× faster than' if long else 'faster than'} Llama "
                          f"(SDPA) at equal parameters, n = {n}", f"{ratio.text()}× Llama's time",
                          ratio.median <= 0.5 if long else ratio.median < 1.0, rows))
    compiled = {r.length for r in run.results if r.variant == "llama_equal_sdpa" and r.mode == "compiled"}
    for n in sorted(compiled):
        rows = [run.find("gau_flash_causal", "compiled", "train", n),
                run.find("llama_equal_sdpa", "compiled", "train", n)]
        ratio = paired_ratio(run, "gau_flash_causal", "llama_equal_sdpa", "compiled", "train", n)
        if ratio is None or not all(is_ok(r) for r in rows):
            continue
        out.append(Target(f"FLASH (causal) fwd+bwd, both `torch.compile`d, within Llama's (SDPA) time at "
                          f"equal parameters, n = {n}", f"{ratio.text()}× Llama's time", ratio.median <= 1.0,
                          rows))
    return out


FLAT_TARGET = 1.2
"""FLASH's fwd+bwd time per token at long n ÷ at n = 8192, and packed FLASH's time ÷ unpacked at 32768 (issue
38)."""


def per_token_ratio(run: BenchRun, variant: str, short: int, long: int, metric: str = "time") -> float | None:
    """(value / n at ``long``) ÷ (value / n at ``short``) of ``variant``'s fwd+bwd time (median) or peak
    memory."""
    rows = [run.find(variant, "eager", "train", n) for n in (short, long)]
    if not all(is_ok(r) for r in rows):
        return None
    values = [r.median(run.timer) if metric == "time" else r.peak_bytes for r in rows]
    return None if not all(values) else (values[1] / long) / (values[0] / short)


def _long_flash_targets(run: BenchRun) -> list[Target]:
    """Causal FLASH's time per token flat from 8192 to 32768 and to the longest n (≤ ``FLAT_TARGET``×); packed
    documents at 32768 within ``FLAT_TARGET``× of one sequence, their peak memory linear from 8192 to
    32768."""
    out = []
    lengths = sorted({r.length for r in run.results if r.variant == "gau_flash_causal" and r.length > 8192})
    for n in [m for m in lengths if m in (32768, lengths[-1])] if lengths else []:
        ratio = per_token_ratio(run, "gau_flash_causal", 8192, n)
        if ratio is not None:
            out.append(Target(f"FLASH (causal) time per token flat: (t/n at {n}) ÷ (t/n at 8192) ≤ "
                              f"{FLAT_TARGET}",
                              f"{ratio:.2f}", ratio <= FLAT_TARGET, _rows(run, "gau_flash_causal", "train",
                                                                          (8192, n))))
    rows = [run.find("gau_flash_causal_packed", "eager", "train", 32768),
            run.find("gau_flash_causal", "eager", "train", 32768)]
    ratio = paired_ratio(run, "gau_flash_causal_packed", "gau_flash_causal", "eager", "train", 32768)
    if ratio is not None:
        out.append(Target(f"packed FLASH (64 documents) fwd+bwd ≤ {FLAT_TARGET}× one sequence, n = 32768",
                          f"{ratio.text()}×", ratio.median <= FLAT_TARGET, rows))
    growth = per_token_ratio(run, "gau_flash_causal_packed", 8192, 32768, metric="memory")
    if growth is not None:
        out.append(Target("packed FLASH peak memory linear: (peak/n at 32768) ÷ (peak/n at 8192) ≤ 1.1",
                          f"{growth:.2f}", growth <= 1.1, _rows(run, "gau_flash_causal_packed", "train",
                                                                (8192, 32768))))
    return out


LOOP_TARGET = 0.95
"""``pretrain``'s tokens/s ÷ ``Trainer``'s on the same model, data and batch (issue 23)."""


def _loop_targets(run: BenchRun) -> list[Target]:
    """``pretrain``'s loop ≥ 0.95× the ``Trainer``'s tokens/s, per objective; the mean training losses beside
    it show that both trained the same."""
    out = []
    for comparison in (c for c in run.comparisons if is_loop(run, c)):
        for name in comparison.variants:
            rows = [loop_row(run, name), loop_row(run, comparison.baseline)]
            if not all(is_ok(r) for r in rows):
                continue
            ratio = loop_ratio(run, name, comparison.baseline)
            loop = rows[0].loop
            losses = " vs ".join(f"{statistics.median(r.loop['train_loss']):.4f}" for r in rows)
            out.append(Target(
                f"`pretrain` loop ≥ {LOOP_TARGET}× `Trainer`'s tokens/s, {loop['objective'].upper()}, "
                f"{loop['batch_size']} × {rows[0].length} tokens per step (mean training loss: ours vs "
                "Trainer's)",
                "runs differ" if ratio is None else f"{ratio.text()}×; loss {losses}",
                None if ratio is None else ratio.median >= LOOP_TARGET, rows))
    return out


def _compile_targets(run: BenchRun) -> list[Target]:
    """``torch.compile`` of our families (no graph break, every compiled measurement ran); the peers' graph
    breaks as a reference row."""
    if not run.graph_checks:
        return []
    families = {name: info.get("family") for name, info in run.variants.items()}
    ours = [c for c in run.graph_checks if families.get(c["variant"]) != "peer"]
    peers = [c for c in run.graph_checks if families.get(c["variant"]) == "peer"]
    compiled = [r for r in run.results if r.mode == "compiled" and families.get(r.variant) != "peer"]
    failed = [r for r in compiled if r.status == "failed"]
    text = (f"{len(ours)} models, {sum(c['breaks'] or 0 for c in ours)} graph breaks; "
            f"{len(compiled) - len(failed)}/{len(compiled)} compiled measurements ran")
    out = [Target("`torch.compile(model)` works for every family, no graph breaks", text,
                  not [c for c in ours if c["breaks"] != 0] and not failed, compiled)]
    if peers:
        text = "; ".join(f"`{c['variant']}`: {c['breaks'] if c['breaks'] is not None else 'failed'} graph "
                         "breaks"
                         for c in peers)
        out.append(Target("the peers under `torch.compile` (reference, no target)", text, None))
    return out


# ---------------------------------------------------------------------------------------------- sections
def _gpu(env: dict) -> str:
    """`` (<GPU name>, CUDA <version>)`` on a GPU, else ``""``."""
    return f" ({env['gpu']}, CUDA {env['cuda']})" if env.get("gpu") else ""


def _environment(variables: dict[str, str]) -> str:
    """The recorded variables that change numerics (``records.numerics_environment``), as ``NAME=value``."""
    return ", ".join(f"`{name}={value}`" for name, value in variables.items())


def _header(run: BenchRun, source: str, committed: bool) -> list[str]:
    env = run.environment
    command = env.get("command", "hf-attn-variants bench")
    timer = (
        "process CPU time (`time.process_time`) of single-threaded steps — what a step costs on a core of "
        "its own; wall-clock medians are listed too"
        if run.timer == "cpu"
        else "wall-clock time (`time.perf_counter`, CUDA-synchronised on a GPU)"
    )
    preset = run.preset
    if committed:
        intro = (f"Measured by `{command}` on {env['date']} in {_duration(run.elapsed_s)}; rendered from "
                 f"`{source}` by `python tools/render_docs.py`. Do not edit by hand: `make bench` "
                 "re-measures everything and rewrites the results file; a partial run (`--only`, "
                 "`--lengths`, `--repeats`) writes its own report under `runs/`, or with `--merge` replaces "
                 "its rows in the results file, marked [merge k] below. `hf-attn-variants bench --quick` is "
                 "the smoke test (seconds).")
    else:
        intro = (f"Measured by `{command}` on {env['date']} in {_duration(run.elapsed_s)}; results in "
                 f"`{source}`. A run of its own: the committed results (docs/results/) and "
                 "docs/benchmarks.md are unchanged; `--merge` would have replaced their rows with these.")
    versions = f"Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}"
    if env.get("hf_attn_variants"):
        versions += f", hf_attn_variants {env['hf_attn_variants']}"
    return [
        intro,
        "",
        *([f"> Interrupted: {run.interrupted}. The tables hold only the rows measured.", ""]
          if run.interrupted else []),
        *([(f"> Smoke test (preset `quick`): tiny models, {_rounds(preset.repeats)}. The numbers and "
             "verdicts below only show that the pipeline runs; they say nothing about the targets."), ""]
          if preset.name == "quick" else []),
        "## Setup",
        "",
        (f"- Machine: {env['cpu']} ({env['cpu_count']} logical CPUs), {env['platform']}; "
        f"device `{run.device}`{_gpu(env)}; "
        f"torch.get_num_threads() = {run.threads}; load average (1/5/15 min) {env.get('load_average_start')} "
        f"at the start, {env.get('load_average_end')} at the end."),
        *([f"- Environment: {_environment(env['environment'])}."] if env.get("environment") else []),
        f"- Libraries: {versions}.",
        f"- Timer: {timer}. Precision: {_precision(run)}.",
        (f"- Models (preset `{preset.name}`): hidden {preset.hidden_size}, {preset.num_layers} layers, "
        f"{preset.num_heads} heads, FFN {preset.intermediate_size}, batch {preset.batch_size}; GAU key size "
        f"{preset.gau_key_size}, expansion 2, FLASH chunk {preset.gau_chunk_size}. Bare backbones (no LM "
        "head), dropout 0, training mode; loss = mean(h²) of the last hidden state. Lengths n = "
        f"{', '.join(map(str, preset.lengths))}."),
        ("- Protocol: per length, every model is built; one untimed step records its peak memory and one "
        "more counts its FLOPs (both double as warm-up; a compiled model's first call compiles it); then "
        f"timed rounds ({', '.join(f'{preset.repeats_at(n)} at n = {n}' for n in preset.lengths)}); each "
        "round runs every model once, in an order rotated each round. Times are medians; a ratio is the "
        "median of the per-round ratios (in brackets: smallest–largest round), so both sides of a ratio saw "
        "the same machine state."),
        ("- Peak memory: tensor memory allocated during one step above what was live before it (activations, "
        "gradients, temporaries; not parameters). CPU: replay of torch.profiler's allocation events; GPU: "
        "`torch.cuda.max_memory_allocated`."),
        ("- GFLOP/s: FLOPs of the step by `torch.utils.flop_counter`'s formulas (matmuls and attention "
        "kernels; causal attention counted in full) divided by the median time")
        + (f"; in brackets the share of the given peak {run.peak_tflops} TFLOP/s (MFU)." if run.peak_tflops
           else "."),
        "",
    ]


PHASE_SHORT = {"train": "fwd+bwd", "infer": "infer"}


def _merges(run: BenchRun) -> list[str]:
    if not run.replaced:
        return []
    lines = [
        "## Rows re-measured by partial runs (`--merge`)",
        "",
        (f"{len(run.replaced)} partial run(s) replaced rows of the run above. Their rows are marked [merge "
         "k] in every table; a ratio pairs only rows of the same run (\"runs differ\" where its two sides do "
         "not)."),
        "",
    ]
    versions = {k: run.environment.get(k) for k in ("python", "torch", "transformers", "hf_attn_variants")}
    for entry in run.replaced:
        k = entry["merge"]
        changes = []
        for variant, mode, phase, n, previous in entry["rows_replaced"]:
            row = run.find(variant, mode, phase, n)
            now = ("replaced again later" if row is None or row.merge != k
                   else (f"{format_ms(row.median(run.timer))} ms" if row.status == "ok" else row.status))
            before = f"{format_ms(previous / 1e3)} ms" if isinstance(previous, (int, float)) else previous
            changes.append(f"`{variant}` {mode} {PHASE_SHORT[phase]} n = {n}: {before} → {now}")
        added = [f"`{v}` {mode} {PHASE_SHORT[phase]} n = {n}" for v, mode, phase, n in entry["rows_added"]]
        other = {name: value for name, value in entry.get("versions", {}).items()
                 if value != versions.get(name)}
        rounds = ", ".join(f"{r} at n = {n}" for n, r in entry["repeats"].items())
        lines.append(
            f"- **merge {k}**: `{entry['command']}` on {entry['date']} in {_duration(entry['duration_s'])}, "
            f"load average {entry.get('load_average_start')} at the start, {entry.get('load_average_end')} "
            f"at the end; timed rounds {rounds}"
            + (f"; versions differing from the run above: {other}" if other else "; same versions")
            + ". Replaced (previous → new median): " + ("; ".join(changes) or "nothing")
            + (". Added: " + "; ".join(added) if added else "") + "."
        )
    return [*lines, ""]


def ratio_cell(run: BenchRun, variant: str, baseline: str, mode: str, phase: str, n: int,
               baseline_mode: str | None = None) -> str:
    """The paired ratio's cell: "median (smallest–largest round)", "runs differ" when the two rows come from
    different runs, else "–"."""
    ratio = paired_ratio(run, variant, baseline, mode, phase, n, baseline_mode)
    if ratio is not None:
        return ratio.text()
    a, b = run.find(variant, mode, phase, n), run.find(baseline, baseline_mode or mode, phase, n)
    return "runs differ" if is_ok(a) and is_ok(b) and a.merge != b.merge else "–"


def _targets(run: BenchRun) -> list[str]:
    rows = [t.cells() for t in targets(run)]
    if not rows:
        return []
    return ["## Targets", "", *_table(["target", "measured", "verdict"], rows), ""]


def _comparison_tables(run: BenchRun) -> list[str]:
    lines = ["## Results", ""]
    for comparison in run.comparisons:
        members = (comparison.baseline, *comparison.variants)
        lines += [f"### {comparison.title}", ""]
        if comparison.note:
            lines += [comparison.note, ""]
        lines += [f"Baseline: `{comparison.baseline}`. "
                  + "; ".join(f"`{m}`: {run.variants[m]['description']}{_parameters(run.variants[m])}"
                              for m in members if m in run.variants)
                  + ".", ""]
        lines += _loop_table(run, comparison) if is_loop(run, comparison) else _model_table(run, comparison)
        lines.append("")
    return lines


def _model_table(run: BenchRun, comparison: Comparison) -> list[str]:
    """Per length and model: step times, ratios to the baseline, tokens/s, peaks, GFLOP/s."""
    timer = run.timer
    members = (comparison.baseline, *comparison.variants)
    rows = []
    lengths = sorted({r.length for r in run.results if r.variant in members})
    for n in lengths:
        for name in members:
            train = run.find(name, "eager", "train", n)
            infer = run.find(name, "eager", "infer", n)
            if not is_ok(train):
                continue
            ok_infer = is_ok(infer)
            rows.append([
                str(n), f"`{name}`{merge_mark(train, infer)}",
                format_ms(train.median(timer)),
                ratio_cell(run, name, comparison.baseline, "eager", "train", n),
                format_ms(infer.median(timer)) if ok_infer else "–",
                ratio_cell(run, name, comparison.baseline, "eager", "infer", n),
                _tokens_per_s(train, timer), _tokens_per_s(infer, timer) if ok_infer else "–",
                format_mib(train.peak_bytes), format_mib(infer.peak_bytes) if ok_infer else "–",
                _throughput(train, timer, run.peak_tflops),
                format_ms(train.median("wall")),
            ])
    return _table(
        ["n", "variant", "fwd+bwd ms", "× baseline", "infer ms", "× baseline", "tok/s fwd+bwd",
         "tok/s infer", "peak MiB fwd+bwd", "peak MiB infer", "GFLOP/s fwd+bwd", "wall ms fwd+bwd"],
        rows,
    )


def _loop_table(run: BenchRun, comparison: Comparison) -> list[str]:
    """Per training loop: time per optimizer step, tokens/s, its ratio to the baseline loop's, the mean
    loss."""
    rows = []
    for name in (comparison.baseline, *comparison.variants):
        result = loop_row(run, name)
        if not is_ok(result):
            continue
        loop = result.loop
        if name == comparison.baseline:
            ratio = "1.00"
        else:
            paired = loop_ratio(run, name, comparison.baseline)
            ratio = "runs differ" if paired is None else paired.text()
        rows.append([
            f"`{name}`{merge_mark(result)}", f"{loop['batch_size']} × {result.length}",
            f"{len(result.times(run.timer))} × {loop['steps'] - loop['warmup_steps']}",
            format_ms(result.median(run.timer)), _tokens_per_s(result, run.timer), ratio,
            f"{statistics.median(loop['train_loss']):.4f}", format_ms(result.median("wall")),
        ])
    return _table(["loop", "blocks × tokens per step", "rounds × timed steps", "ms per step", "tokens/s",
                   "tokens/s ÷ baseline's", "mean training loss", "wall ms per step"], rows)


def _compiled_table(run: BenchRun) -> list[str]:
    rows = []
    for result in run.results:
        if result.mode != "compiled":
            continue
        eager = run.find(result.variant, "eager", result.phase, result.length)
        name = f"`{result.variant}`{merge_mark(result, eager)}"
        if result.status != "ok":
            rows.append([name, str(result.length), PHASE_TITLES[result.phase], "–", "–", "–", "–",
                         result.reason or result.status])
            continue
        rows.append([
            name, str(result.length), PHASE_TITLES[result.phase],
            format_ms(eager.median(run.timer)) if is_ok(eager) else "–",
            format_ms(result.median(run.timer)),
            ratio_cell(run, result.variant, result.variant, "compiled", result.phase, result.length,
                        "eager"),
            f"{result.compile_s:.1f}" if result.compile_s is not None else "–",
            f"peak {format_mib(result.peak_bytes)} MiB "
            f"(eager {format_mib(eager.peak_bytes) if eager else '–'})",
        ])
    if not rows:
        return []
    lines = [
        "## torch.compile vs eager",
        "",
        ("`torch.compile(model)` (inductor, default mode, static shapes), same rounds as the eager runs. "
        "\"compile s\" is the wall-clock time of the first call (tracing + code generation; a warm inductor "
        "cache in `/tmp/torchinductor_$USER` makes it much shorter)."),
        "",
        *_table(["variant", "n", "phase", "eager ms", "compiled ms", "compiled / eager", "compile s",
                 "memory"],
                rows),
        "",
    ]
    if run.graph_checks:
        lines += ["Graph breaks (`torch._dynamo.explain(model)(input_ids)` on the whole model, forward):", ""]
        lines += _table(
            ["variant", "graphs", "graph breaks", "reasons"],
            ([f"`{c['variant']}`", str(c["graphs"]), str(c["breaks"]), "; ".join(c["reasons"]) or "–"]
             for c in run.graph_checks),
        )
        lines.append("")
    return lines


def _skipped(run: BenchRun) -> list[str]:
    seen: dict[tuple[str, str, str], list[int]] = {}
    for result in run.results:
        if result.status in ("skipped", "failed"):
            seen.setdefault((result.variant, result.status, result.reason), []).append(result.length)
    if not seen:
        return []
    rows = [[f"`{variant}`", ", ".join(map(str, sorted(set(lengths)))), status, reason]
            for (variant, status, reason), lengths in seen.items()]
    return ["## Skipped or failed", "", *_table(["variant", "n", "status", "reason"], rows), ""]


# ---------------------------------------------------------------------------------------------- notes
def _before_after(run: BenchRun, before: str, after: str) -> str:
    """The before/after table of one GAU kernel (``--only gau_optimisation`` rows)."""
    rows = []
    for n in run.preset.lengths:
        cells = [str(n)]
        results = {(v, phase): run.find(v, "eager", phase, n) for v in (before, after)
                   for phase in ("train", "infer")}
        if not all(is_ok(r) for r in results.values()):
            continue
        for phase in ("train", "infer"):
            b, a = results[before, phase], results[after, phase]
            faster = speedup(run, after, before, phase, n)
            factor = "runs differ" if faster is None else f"{faster.median:.2f}×"
            cells += [f"{format_ms(b.median(run.timer))} → {format_ms(a.median(run.timer))} ms "
                      f"({factor}){merge_mark(a, b)}",
                      f"{format_mib(b.peak_bytes)} → {format_mib(a.peak_bytes)} MiB"]
        rows.append(cells)
    if not rows:
        return ("(not measured in this run: `hf-attn-variants bench --only gau_optimisation` measures "
                f"`{before}` against `{after}`.)")
    header = ["n", "fwd+bwd before → after", "peak fwd+bwd", "inference before → after", "peak inference"]
    return "\n".join(_table(header, rows))


def _flash_vs_kernels(run: BenchRun) -> str:
    n = max(run.preset.lengths)
    old = speedup(run, "gau_flash", "gau_quadratic_reference", "train", n)
    new = speedup(run, "gau_flash", "gau_quadratic", "train", n)
    if old is None or new is None:
        return ""
    peaks = {v: run.find(v, "eager", "train", n).peak_bytes for v in
             ("gau_quadratic_reference", "gau_quadratic", "gau_flash")}
    return (f"What the kernels did to FLASH's lead at n = {n}: its fwd+bwd step is {_faster(old)} than "
            f"quadratic GAU through the attention-map path and {_faster(new)} than through the new kernel "
            "(same rounds); fwd+bwd peaks: attention-map path "
            f"{format_mib(peaks['gau_quadratic_reference'])} MiB, "
            f"kernel {format_mib(peaks['gau_quadratic'])} MiB, FLASH {format_mib(peaks['gau_flash'])} MiB.")


def _faster(ratio: Ratio) -> str:
    """A speed-up as "1.23× faster" or, below 1, "1.10× slower"."""
    return f"{ratio.median:.2f}× faster" if ratio.median >= 1 else f"{1 / ratio.median:.2f}× slower"


def _compile_times(run: BenchRun) -> str:
    parts = []
    for phase in ("train", "infer"):
        times = [r.compile_s for r in run.results if r.mode == "compiled" and r.phase == phase
                 and r.compile_s]
        if times:
            parts.append(f"{min(times):.1f}–{max(times):.1f} s for {PHASE_TITLES[phase].split(' ')[0]}")
    if not parts:
        return "This run timed no compiled model."
    return ("In this run the first call of a compiled model (compilation included) took "
            f"{' and '.join(parts)}.")


NOTE_FIELDS: dict[str, Callable[[BenchRun], str]] = {
    "gau_optimisation_relu2": lambda run: _before_after(run, "gau_quadratic_reference", "gau_quadratic"),
    "gau_optimisation_softmax": lambda run: _before_after(run, "gau_softmax_plus_reference",
                                                          "gau_softmax_plus"),
    "flash_vs_kernels": _flash_vs_kernels,
    "compile_times": _compile_times,
}
"""The ``{{name}}`` placeholders of notes.md."""


def _notes(run: BenchRun) -> list[str]:
    text = resources.files(__package__).joinpath("notes.md").read_text(encoding="utf-8")
    def fill(match: re.Match[str]) -> str:  # a multi-line value keeps the placeholder's indentation
        return "\n".join(match[1] + line if line else line for line in NOTE_FIELDS[match[2]](run).split("\n"))

    text = re.sub(r"^([ \t]*)\{\{(\w+)\}\}", fill, text, flags=re.MULTILINE)
    text = re.sub(r"\{\{(\w+)\}\}", lambda m: NOTE_FIELDS[m[1]](run), text)
    return [text.rstrip(), ""]


# ---------------------------------------------------------------------------------------------- report
def render_report(run: BenchRun, *, source: str, committed: bool, plots: Iterable[str] = (),
                  notes: bool = True) -> str:
    """The Markdown body of the report (no title): ``source`` names the results file, ``plots`` the PNGs to
    link (relative to the report), ``committed`` whether it is the committed report or a run of its own,
    ``notes`` whether the method notes (``notes.md``: how to read, baselines, reproduce) close it."""
    lines = _header(run, source, committed)
    lines += _merges(run)
    lines += _targets(run)
    lines += _comparison_tables(run)
    plots = list(plots)
    if plots:
        lines += ["## Plots", ""]
        for plot in plots:
            lines += [f"![{Path(plot).stem}]({plot})", ""]
    lines += _compiled_table(run)
    lines += _skipped(run)
    if notes:
        lines += _notes(run)
    return "\n".join(lines).rstrip("\n") + "\n"


REPORT_MARK = "<!-- a report of `hf-attn-variants bench` -->"
"""The last line of a report of its own: a rerun may replace the file (``is_own_report``), no other."""


def write_report(run: BenchRun, path: Path, *, source: str, plots: Iterable[Path] = (),
                 title: str = "# Benchmarks") -> Path:
    """Write the report of a run of its own (not the committed one) to ``path``; plots are linked relative to
    it."""
    from ..cli_utils import atomic_write_text

    links = [_relative(Path(plot), path.parent) for plot in plots]
    body = render_report(run, source=source, committed=False, plots=links)
    atomic_write_text(path, f"{title}\n\n{body.rstrip()}\n\n{REPORT_MARK}\n")
    return path


def is_own_report(path: Path) -> bool:
    """Whether ``path`` is a report ``write_report`` wrote: it ends with ``REPORT_MARK``, or (one written
    before the mark) starts with its ``# Benchmarks`` title and holds the report's "results in" sentence."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    older = text.startswith("# Benchmarks") and "; results in `" in text
    return text.rstrip().endswith(REPORT_MARK) or older


def _relative(plot: Path, folder: Path) -> str:
    try:
        return plot.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return plot.as_posix()


__all__ = [
    "LOOP_TARGET",
    "REPORT_MARK",
    "Ratio",
    "Target",
    "format_mib",
    "format_ms",
    "is_loop",
    "is_own_report",
    "is_ok",
    "loop_ratio",
    "loop_row",
    "merge_mark",
    "paired_ratio",
    "per_token_growth",
    "ratio_cell",
    "render_report",
    "speedup",
    "targets",
    "write_report",
]
