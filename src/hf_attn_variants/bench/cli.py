"""``hf-attn-variants bench``: run the benchmarks and write docs/benchmarks.md, PNG plots and raw JSON.

Examples::

    hf-attn-variants bench                       # CPU, preset "cpu" → docs/benchmarks.md (make bench)
    hf-attn-variants bench --quick               # smoke test, seconds → runs/bench-quick/
    hf-attn-variants bench --device cuda --peak-tflops 989   # GPU, bf16 autocast, ~110M models, MFU
    hf-attn-variants bench --only gau --lengths 512 2048 --no-compile
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from .specs import COMPARISONS, PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``hf-attn-variants bench``."""
    parser.add_argument("--quick", action="store_true",
                        help="CI smoke test: preset 'quick' (tiny models, n = 32/64), 1 repeat, no torch.compile, "
                             "output under runs/bench-quick/ unless --output is given.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="Model sizes and lengths (default: 'cpu' on CPU, 'gpu' — ~110M parameters — on CUDA).")
    parser.add_argument("--device", default="cpu", help="'cpu' (default) or 'cuda' / 'cuda:N'.")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="float32 (CPU default) or autocast to bfloat16 (CUDA default) / float16.")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="Override the preset's lengths n.")
    parser.add_argument("--repeats", type=int, default=None, help="Timed rounds per length (default: preset's).")
    parser.add_argument("--only", nargs="+", default=None,
                        help=f"Comparisons ({', '.join(c.key for c in COMPARISONS)}) or variant names to run.")
    parser.add_argument("--no-compile", action="store_true", help="Skip the torch.compile measurements.")
    parser.add_argument("--compile-lengths", type=int, nargs="+", default=None,
                        help="Lengths at which compiled models are timed (default: preset's).")
    parser.add_argument("--no-graph-check", action="store_true", help="Skip the torch._dynamo.explain check.")
    parser.add_argument("--no-flops", action="store_true", help="Do not count FLOPs (no GFLOP/s / MFU column).")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: 1 on CPU, so CPU time = time on a core of its own).")
    parser.add_argument("--timer", choices=["cpu", "wall"], default=None,
                        help="Primary timer: process CPU time ('cpu', CPU default) or wall clock ('wall', CUDA "
                             "default; use it on a dedicated CPU machine with --threads N).")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="Peak TFLOP/s of the device for the MFU column (e.g. 989 for H100 SXM bf16 dense).")
    parser.add_argument("--output", type=Path, default=None,
                        help="Markdown report (default docs/benchmarks.md; docs/benchmarks-gpu.md on CUDA).")
    parser.add_argument("--json", type=Path, default=None, help="Raw results (default runs/bench/<preset>.json).")
    parser.add_argument("--no-plots", action="store_true", help="Do not write PNG plots.")
    parser.add_argument("--report-only", type=Path, default=None, metavar="JSON",
                        help="Measure nothing: re-render the report (and plots) from a results JSON of an earlier run.")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; returns 0 (a failed variant is reported, not fatal)."""
    from .plots import write_plots
    from .report import write_report
    from .runner import Runner
    from .specs import select

    cuda = str(args.device).startswith("cuda")
    if cuda:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is available (torch.cuda.is_available() is False).")
    preset_name = "quick" if args.quick else (args.preset or ("gpu" if cuda else "cpu"))
    preset = PRESETS[preset_name]
    if args.lengths:
        preset = replace(preset, lengths=tuple(sorted(args.lengths)))
    if args.repeats:
        preset = replace(preset, repeats=args.repeats, long_repeats=args.repeats)
    if args.compile_lengths:
        preset = replace(preset, compile_lengths=tuple(args.compile_lengths))
    for flag in ("lengths", "compile_lengths"):
        values = getattr(args, flag) or []
        if any(v < 1 for v in values):
            raise SystemExit(f"--{flag.replace('_', '-')} must be positive integers, got {values}.")
    if args.repeats is not None and args.repeats < 1:
        raise SystemExit(f"--repeats must be ≥ 1, got {args.repeats}.")
    try:
        variants, comparisons = select(preset, args.only)
    except ValueError as error:
        raise SystemExit(str(error)) from None

    if args.output is not None:
        output = args.output
    elif args.quick:
        output = Path("runs/bench-quick/benchmarks.md")
    else:
        output = Path("docs/benchmarks-gpu.md" if cuda else "docs/benchmarks.md")
    json_path = args.json or (output.parent / f"{output.stem}.json" if args.quick else Path(f"runs/bench/{preset.name}.json"))
    command = (
        "hf-attn-variants bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else "hf-attn-variants bench (called from Python)"
    )

    if args.report_only is not None:
        if not args.report_only.is_file():
            raise SystemExit(f"--report-only: no such results file {args.report_only}.")
        from .runner import BenchRun

        bench = BenchRun.from_json(json.loads(args.report_only.read_text(encoding="utf-8")))
        command = bench.environment.get("command", "hf-attn-variants bench")
        plots = [] if args.no_plots else write_plots(bench, output.parent, prefix=output.stem)
        write_report(bench, output, command, plots)
        print(f"wrote {output}" + "".join(f", {p}" for p in plots))
        return 0

    runner = Runner(
        preset, variants, comparisons,
        device=args.device,
        dtype=args.dtype or ("bfloat16" if cuda else "float32"),
        timer=args.timer or ("wall" if cuda else "cpu"),
        threads=args.threads if args.threads is not None else (None if cuda else 1),
        compile=not (args.no_compile or args.quick),
        count_flops=not args.no_flops,
        check_graph_breaks=not (args.no_graph_check or args.quick),
        peak_tflops=args.peak_tflops,
        log=lambda line: print(line, flush=True),
    )
    bench = runner.run_all()
    bench.environment["command"] = command.strip()
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(bench.to_json(), indent=1), encoding="utf-8")
    plots = [] if args.no_plots else write_plots(bench, output.parent, prefix=output.stem)
    write_report(bench, output, command.strip(), plots)
    print(f"wrote {output}, {json_path}" + "".join(f", {p}" for p in plots))
    return 0


__all__ = ["add_arguments", "run"]
