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
import math
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..training.cli_utils import (
    FlagError,
    argparse_type,
    check_file,
    check_output_file,
    check_positive,
    fail_flag,
)
from .specs import COMPARISONS, PRESETS, Comparison, Preset, Variant


def _device(text: str) -> str:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N`` (argparse type)."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected 'cpu', 'cuda' or 'cuda:N', got {text!r}.")
    return text


def _peak_tflops(text: str) -> float:
    """``--peak-tflops``: a finite number > 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}.")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``hf-attn-variants bench``."""
    def positive(flag: str) -> Any:
        return argparse_type(check_positive, int, flag)

    parser.add_argument("--quick", action="store_true",
                        help="CI smoke test: preset 'quick' (tiny models, n = 32/64), 1 repeat, no torch.compile, "
                             "output under runs/bench-quick/ unless --output is given.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="Model sizes and lengths (default: 'cpu' on CPU, 'gpu' — ~110M parameters — on CUDA).")
    parser.add_argument("--device", type=_device, default="cpu", help="'cpu' (default) or 'cuda' / 'cuda:N'.")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="float32 (CPU default) or autocast to bfloat16 (CUDA default) / float16.")
    parser.add_argument("--lengths", type=positive("lengths"), nargs="+", default=None,
                        help="Override the preset's lengths n.")
    parser.add_argument("--repeats", type=positive("repeats"), default=None,
                        help="Timed rounds per length (default: preset's).")
    parser.add_argument("--only", nargs="+", default=None,
                        help=f"Comparisons ({', '.join(c.key for c in COMPARISONS)}) or variant names to run.")
    parser.add_argument("--no-compile", action="store_true", help="Skip the torch.compile measurements.")
    parser.add_argument("--compile-lengths", type=positive("compile-lengths"), nargs="+", default=None,
                        help="Lengths at which compiled models are timed (default: preset's).")
    parser.add_argument("--no-graph-check", action="store_true", help="Skip the torch._dynamo.explain check.")
    parser.add_argument("--no-flops", action="store_true", help="Do not count FLOPs (no GFLOP/s / MFU column).")
    parser.add_argument("--threads", type=positive("threads"), default=None,
                        help="torch intra-op threads (default: 1 on CPU, so CPU time = time on a core of its own).")
    parser.add_argument("--timer", choices=["cpu", "wall"], default=None,
                        help="Primary timer: process CPU time ('cpu', CPU default) or wall clock ('wall', CUDA "
                             "default; use it on a dedicated CPU machine with --threads N).")
    parser.add_argument("--peak-tflops", type=_peak_tflops, default=None,
                        help="Peak TFLOP/s of the device for the MFU column (e.g. 989 for H100 SXM bf16 dense).")
    parser.add_argument("--output", type=Path, default=None,
                        help="Markdown report (default docs/benchmarks.md; docs/benchmarks-gpu.md on CUDA).")
    parser.add_argument("--json", type=Path, default=None, help="Raw results (default runs/bench/<preset>.json).")
    parser.add_argument("--no-plots", action="store_true", help="Do not write PNG plots.")
    parser.add_argument("--report-only", type=Path, default=None, metavar="JSON",
                        help="Measure nothing: re-render the report (and plots) from a results JSON of an earlier run.")


@dataclass
class BenchPlan:
    """What ``run`` does, resolved from the flags and checked before anything is measured or written."""

    preset: Preset
    variants: dict[str, Variant]
    comparisons: tuple[Comparison, ...]
    cuda: bool
    output: Path
    json_path: Path
    report_only: Any = None
    """A ``BenchRun`` read from ``--report-only`` (then nothing is measured)."""


def _load_results(path: Path) -> Any:
    """The ``BenchRun`` saved in ``path``; ``FlagError`` naming ``--report-only`` for a missing or foreign file."""
    from .runner import BenchRun

    check_file("report-only", path)
    try:
        return BenchRun.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError) as error:  # not JSON, or not a bench results file
        raise FlagError("report-only", f"report-only: {str(path)!r} is not a results JSON of `hf-attn-variants "
                                       f"bench` ({type(error).__name__}: {error}).") from error


def plan(args: argparse.Namespace) -> BenchPlan:
    """Resolve and check the flags; ``FlagError`` naming the flag of a bad value (nothing is written)."""
    from .specs import select

    cuda = str(args.device).startswith("cuda")
    if cuda:
        import torch

        if not torch.cuda.is_available():
            raise FlagError("device", "--device cuda: no CUDA device is available (torch.cuda.is_available() is "
                                      "False).")
    if args.quick and args.preset is not None and args.preset != "quick":
        raise FlagError("preset", f"--preset {args.preset} contradicts --quick (which runs the preset 'quick').")
    preset = PRESETS["quick" if args.quick else (args.preset or ("gpu" if cuda else "cpu"))]
    if args.lengths:
        preset = replace(preset, lengths=tuple(sorted(args.lengths)))
    if args.repeats:
        preset = replace(preset, repeats=args.repeats, long_repeats=args.repeats)
    if args.compile_lengths:
        preset = replace(preset, compile_lengths=tuple(args.compile_lengths))
    try:
        variants, comparisons = select(preset, args.only)
    except ValueError as error:
        raise FlagError("only", str(error)) from None
    if args.output is not None:
        output = args.output
    elif args.quick:
        output = Path("runs/bench-quick/benchmarks.md")
    else:
        output = Path("docs/benchmarks-gpu.md" if cuda else "docs/benchmarks.md")
    check_output_file("output", output)
    json_path = args.json or (output.parent / f"{output.stem}.json" if args.quick else Path(f"runs/bench/{preset.name}.json"))
    check_output_file("json", json_path)
    report_only = _load_results(args.report_only) if args.report_only is not None else None
    return BenchPlan(preset, variants, comparisons, cuda, output, json_path, report_only)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; returns 0 (a failed variant is reported, not fatal), or 2
    after one error line naming a flag with a bad value."""
    from .plots import write_plots
    from .report import write_report
    from .runner import Runner

    try:
        bench_plan = plan(args)
    except FlagError as error:
        return fail_flag("bench", error)
    output, json_path = bench_plan.output, bench_plan.json_path
    command = (
        "hf-attn-variants bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else "hf-attn-variants bench (called from Python)"
    )

    if bench_plan.report_only is not None:
        bench = bench_plan.report_only
        command = bench.environment.get("command", "hf-attn-variants bench")
        plots = [] if args.no_plots else write_plots(bench, output.parent, prefix=output.stem)
        write_report(bench, output, command, plots)
        print(f"wrote {output}" + "".join(f", {p}" for p in plots))
        return 0

    cuda = bench_plan.cuda
    runner = Runner(
        bench_plan.preset, bench_plan.variants, bench_plan.comparisons,
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


__all__ = ["BenchPlan", "add_arguments", "plan", "run"]
