"""``hf-attn-variants bench``: run the benchmarks; write a results file, its report and PNG plots.

Every run writes its results file and report under runs/ (a user's run never touches docs/). Only the
repository's publishing path writes docs/: ``--publish`` (``make bench``) makes a full run (no flag that
changes what is measured) write the committed results file docs/results/benchmarks-cpu.json
(benchmarks-gpu.json on CUDA) and the committed plots; ``--merge`` merges a partial run into that file. The
docs that show it (docs/benchmarks.md, its speed summary, the tables of docs/gau.md and docs/synthesizer.md)
are its views, rendered by the repository's ``tools/render_docs.py`` (``make bench`` runs both).

Examples::

    hf-attn-variants bench                       # CPU, preset "cpu" → runs/bench/cpu/benchmarks.md (+ .json)
    hf-attn-variants bench --publish             # the same → docs/results/benchmarks-cpu.json (make bench)
    hf-attn-variants bench --quick               # smoke test, seconds → runs/bench-quick/
    hf-attn-variants bench --device cuda --peak-tflops 989   # GPU, bf16 autocast, ~110M models, MFU
    hf-attn-variants bench --only gau --lengths 512 2048 --no-compile   # → runs/bench/cpu-partial/
    hf-attn-variants bench --only decoder --repeats 7 --merge          # re-measure rows of the committed file
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..cli_utils import (
    FlagError,
    argparse_type,
    check_file,
    check_output_file,
    check_positive,
    check_result_files,
    fail,
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


def file_path(text: str) -> Path:
    """A file flag's value as a ``Path``; an empty string is refused (``Path("")`` is ``.``, a folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file")
    return Path(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``hf-attn-variants bench``."""
    def positive(flag: str) -> Any:
        return argparse_type(check_positive, int, flag)

    parser.add_argument("--quick", action="store_true",
                        help="CI smoke test: preset 'quick' (tiny models, n = 32/64), 1 repeat, no "
                             "torch.compile, output under runs/bench-quick/ unless --output is given.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="Model sizes and lengths (default: 'cpu' on CPU, 'gpu' — ~110M parameters — on "
                             "CUDA).")
    parser.add_argument("--device", type=_device, default="cpu", help="'cpu' (default) or 'cuda' / 'cuda:N'.")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="float32 (CPU default) or autocast to bfloat16 (CUDA default) / float16.")
    parser.add_argument("--lengths", type=positive("lengths"), nargs="+", default=None,
                        help="Override the preset's lengths n.")
    parser.add_argument("--repeats", type=positive("repeats"), default=None,
                        help="Timed rounds per length (default: preset's).")
    parser.add_argument("--only", nargs="+", default=None,
                        help=f"Comparisons ({', '.join(c.key for c in COMPARISONS)}) or variant names to "
                             "run.")
    parser.add_argument("--no-compile", action="store_true", help="Skip the torch.compile measurements.")
    parser.add_argument("--compile-lengths", type=positive("compile-lengths"), nargs="+", default=None,
                        help="Lengths at which compiled models are timed (default: preset's).")
    parser.add_argument("--no-graph-check", action="store_true", help="Skip the torch._dynamo.explain check.")
    parser.add_argument("--no-flops", action="store_true",
                        help="Do not count FLOPs (no GFLOP/s / MFU column).")
    parser.add_argument("--threads", type=positive("threads"), default=None,
                        help="torch intra-op threads (default: 1 on CPU, so CPU time = time on a core of its "
                             "own).")
    parser.add_argument("--timer", choices=["cpu", "wall"], default=None,
                        help="Primary timer: process CPU time ('cpu', CPU default) or wall clock ('wall', "
                             "CUDA default; use it on a dedicated CPU machine with --threads N).")
    parser.add_argument("--peak-tflops", type=_peak_tflops, default=None,
                        help="Peak TFLOP/s of the device for the MFU column (e.g. 989 for H100 SXM bf16 "
                             "dense).")
    parser.add_argument("--publish", action="store_true",
                        help="The repository's publishing path (make bench): a full run writes the committed "
                             "results file (docs/results/benchmarks-cpu.json; -gpu on CUDA) and its plots, "
                             "which the repository's tools/render_docs.py renders into docs/; with "
                             "--report-only of that file, redraws the plots without measuring. Run it from "
                             "the repository root.")
    parser.add_argument("--merge", action="store_true",
                        help="Merge this partial run into the committed results file "
                             "(docs/results/benchmarks-cpu.json; -gpu on CUDA): its rows replace the same "
                             "rows there, the file records which, by which command, when and under what load "
                             "(tools/render_docs.py renders the docs). Widens --only to whole comparisons, "
                             "so every ratio pairs rows of one run.")
    parser.add_argument("--output", type=file_path, default=None,
                        help="Report of a run of its own (default runs/bench/<preset>/benchmarks.md for a "
                             "full run, runs/bench/<preset>-partial/benchmarks.md for a partial one, "
                             "runs/bench-quick/benchmarks.md with --quick).")
    parser.add_argument("--json", type=file_path, default=None,
                        help="Results file of a run of its own (default: next to the report, <report "
                             "stem>.json).")
    parser.add_argument("--no-plots", action="store_true", help="Do not write PNG plots.")
    parser.add_argument("--report-only", type=file_path, default=None, metavar="JSON",
                        help="Measure nothing: re-render from a results file: its own report (--output, "
                             "default next to it); with --publish and the committed file "
                             "(docs/results/benchmarks-cpu.json), the committed plots.")


PARTIAL_FLAGS = ("only", "lengths", "repeats", "compile_lengths", "no_compile", "no_graph_check", "no_flops",
                 "threads", "timer", "dtype")
"""Flags that change what a run measures or how: with any of them (or ``--quick``, or a non-default
``--preset``) a run is partial and never replaces the committed results unless it ``--merge``s."""


@dataclass
class BenchPlan:
    """What ``run`` does, resolved from the flags and checked before anything is measured or written."""

    preset: Preset
    variants: dict[str, Variant]
    comparisons: tuple[Comparison, ...]
    cuda: bool
    dtype: str
    timer: str
    threads: int | None
    target: str
    """``"committed"`` (``--publish``: rewrite the committed results file and its plots), ``"merge"``
    (merge into it), or ``"own"`` (a results file and report of its own, ``json_path`` and ``output``)."""
    json_path: Path
    output: Path | None
    report_only: dict[str, Any] | None = None
    """A results file read from ``--report-only`` (then nothing is measured)."""
    committed: dict[str, Any] | None = None
    """The committed results (``--merge``)."""


def partial_flags(args: argparse.Namespace) -> list[str]:
    """The flags of ``args`` that make the run partial (``--only``, ``--lengths``…)."""
    used = [f"--{name.replace('_', '-')}" for name in PARTIAL_FLAGS
            if getattr(args, name) not in (None, False, [])]
    if args.quick:
        used.append("--quick")
    cuda = str(args.device).startswith("cuda")
    if args.preset is not None and args.preset != ("gpu" if cuda else "cpu"):
        used.append("--preset")
    return used


def _read_results(flag: str, path: Path) -> dict[str, Any]:
    """The results file ``path`` (checked by ``store.from_results``); ``FlagError`` naming ``flag``
    otherwise."""
    from .store import from_results

    check_file(flag, path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        from_results(data)
    # not JSON, or not a bench results file
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise FlagError(flag, f"{flag}: {str(path)!r} is not a results file of `hf-attn-variants bench` "
                              f"({type(error).__name__}: {error}).") from error
    return data


def _committed_paths() -> dict[Path, str]:
    """The committed results, reports and plots of both devices (resolved) → what each is."""
    from .plots import METRICS
    from .store import committed_results_path, plot_prefix, report_path

    paths = {}
    for device in ("cpu", "cuda"):
        paths[committed_results_path(device).resolve()] = "results"
        paths[report_path(device).resolve()] = "report"
        for metric, _ in METRICS:
            paths[(report_path(device).parent / f"{plot_prefix(device)}_{metric}.png").resolve()] = "plot"
    return paths


def _preset(args: argparse.Namespace, cuda: bool) -> Preset:
    """The preset of ``--quick`` / ``--preset`` (default: by device) with ``--lengths``, ``--repeats`` and
    ``--compile-lengths`` applied."""
    if args.quick and args.preset is not None and args.preset != "quick":
        raise FlagError("preset",
                        f"--preset {args.preset} contradicts --quick (which runs the preset 'quick').")
    preset = PRESETS["quick" if args.quick else (args.preset or ("gpu" if cuda else "cpu"))]
    if args.lengths:
        preset = _with_lengths(preset, args.lengths)
    if args.repeats:
        preset = replace(preset, repeats=args.repeats, long_repeats=args.repeats, short_repeats=args.repeats)
    if args.compile_lengths and (args.no_compile or args.quick):
        other = "--no-compile" if args.no_compile else "--quick"
        raise FlagError("compile-lengths",
                        f"--compile-lengths names lengths to compile, but {other} compiles none.")
    if args.compile_lengths:
        measured = {*preset.lengths, *preset.equal_parameter_lengths, *preset.flash_long_lengths}
        unmeasured = sorted(set(args.compile_lengths) - measured)
        if unmeasured:
            raise FlagError("compile-lengths",
                            f"--compile-lengths {' '.join(map(str, unmeasured))}: not among the lengths this "
                            f"run measures ({' '.join(map(str, sorted(measured)))}), so nothing would be "
                            "compiled there.")
        preset = replace(preset, compile_lengths=tuple(args.compile_lengths))
    return preset


MAX_LENGTH = 2**20
"""The longest ``--lengths`` accepted (1,048,576 tokens, 8x the longest preset length): beyond it the input
ids alone, and the learned position tables sized from the lengths, outgrow any machine this bench targets."""


def _with_lengths(preset: Preset, lengths: list[int]) -> Preset:
    """``preset`` measured at exactly ``lengths``: its extra lengths (FLASH vs Llama at equal parameters,
    causal FLASH alone at long lengths) only where listed. ``FlagError`` naming ``--lengths`` beyond
    ``MAX_LENGTH``, before anything is built or measured."""
    too_long = sorted(n for n in set(lengths) if n > MAX_LENGTH)
    if too_long:
        raise FlagError("lengths", f"--lengths {' '.join(map(str, too_long))}: longer than the "
                                   f"{MAX_LENGTH:,} tokens the bench accepts.")
    chosen = set(lengths)
    extra = {*preset.equal_parameter_lengths, *preset.flash_long_lengths}
    return replace(preset, lengths=tuple(sorted(chosen - extra)) or tuple(sorted(chosen)),
                   equal_parameter_lengths=tuple(n for n in preset.equal_parameter_lengths if n in chosen),
                   flash_long_lengths=tuple(n for n in preset.flash_long_lengths if n in chosen))


def _selection(args: argparse.Namespace, preset: Preset) -> tuple[dict[str, Variant], tuple[Comparison, ...]]:
    """The variants and comparisons of ``--only``; with ``--merge`` every comparison sharing a variant with
    them."""
    from .specs import select
    from .store import merge_closure

    only = args.only
    try:
        if args.merge and only:
            select(preset, only)
            chosen = {c.key for c in COMPARISONS if c.key in only or {c.baseline, *c.variants} & set(only)}
            only = sorted(merge_closure(chosen))
        return select(preset, only)
    except ValueError as error:
        raise FlagError("only", str(error)) from None


def _check_publish(args: argparse.Namespace, partial: list[str]) -> None:
    """``--publish`` goes with a full run or ``--report-only`` of the committed file, never with a report of
    its own (``--output``/``--json``) or a partial run (which publishes with ``--merge``)."""
    if not args.publish:
        return
    for flag in ("output", "json"):
        if getattr(args, flag) is not None:
            raise FlagError(flag, f"--{flag}: --publish writes the committed results and plots, not a report "
                                  "of its own; drop one of them.")
    if args.merge:
        raise FlagError("publish", "--publish rewrites the committed results from a full run; --merge "
                                   "already publishes a partial one, drop --publish.")
    if partial and args.report_only is None:
        raise FlagError("publish", "--publish rewrites the committed results from a full run, but "
                                   f"{partial[0]} makes this run partial; publish a partial run with "
                                   "--merge.")


def _plan_report_only(args: argparse.Namespace, base: dict[str, Any],
                      committed: dict[Path, str]) -> BenchPlan:
    """``--report-only``: the committed docs (with ``--publish`` and the committed file) or a report of its
    own."""
    if args.merge:
        raise FlagError("merge", "--merge measures a partial run; --report-only measures nothing.")
    measuring = [flag for flag in partial_flags(args) if flag != "--preset"]
    if measuring:
        flag = measuring[0]
        raise FlagError(flag.removeprefix("--"),
                        f"{flag} says what to measure; --report-only measures nothing (it renders the file).")
    data = _read_results("report-only", args.report_only)
    is_committed = args.report_only.resolve() in committed
    if args.publish:
        if not is_committed:
            raise FlagError("publish", "--publish redraws the committed plots from the committed results "
                                       f"file, not from {str(args.report_only)!r}; drop --publish for a "
                                       "report of its own.")
        return BenchPlan(**base, target="committed", json_path=args.report_only, output=None,
                         report_only=data)
    default = Path("runs/bench/report/benchmarks.md") if is_committed else args.report_only.with_suffix(".md")
    output = args.output or default
    from .report import is_own_report

    files = {"report": output, **_plot_files(args, output)}
    _check_not_committed("output", files, committed)
    check_result_files("output", files, ours=is_own_report, tool="hf-attn-variants bench",
                       inputs={"report-only": [args.report_only]})
    return BenchPlan(**base, target="own", json_path=args.report_only, output=output, report_only=data)


def _plot_files(args: argparse.Namespace, output: Path) -> dict[str, Path]:
    """The plots a report of its own at ``output`` may get (``plots.write_plots``), by role."""
    from .plots import METRICS

    return {} if args.no_plots else {f"{metric} plot": output.parent / f"{output.stem}_{metric}.png"
                                     for metric, _ in METRICS}


def _check_not_committed(flag: str, files: dict[str, Path], committed: dict[Path, str]) -> None:
    """``FlagError`` when a file of a run of its own (its report, results file or a plot, named after
    ``--output``) is one of the committed files (``_committed_paths``), which only ``--publish`` or
    ``--merge`` write."""
    for role, path in files.items():
        if path.resolve() in committed:
            raise FlagError(flag, f"--{flag}: the {role} {str(path)!r} would be the committed "
                                  f"{committed[path.resolve()]}, which only --publish or --merge writes.")


def _is_bench_results(path: Path) -> bool:
    """Whether ``path`` is a results file of this command (``store.from_results`` reads it)."""
    from .store import from_results

    try:
        from_results(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def _plan_merge(args: argparse.Namespace, base: dict[str, Any], committed_json: Path,
                partial: list[str]) -> BenchPlan:
    """``--merge``: a partial run merged into the committed results file, which must be here and
    compatible."""
    from .store import MergeError, check_compatible

    if not partial:
        raise FlagError("merge", "--merge merges a partial run (--only, --lengths, --repeats…) into the "
                                 "committed results; a full run rewrites them anyway.")
    for flag in ("output", "json"):
        if getattr(args, flag) is not None:
            raise FlagError(flag, f"--{flag}: --merge writes the committed results ({committed_json}), not a "
                                  "report of its own.")
    if not committed_json.is_file():
        raise FlagError("merge", f"--merge: no committed results file {str(committed_json)!r} here (run "
                                 "from the repository root, after `hf-attn-variants bench --publish`).")
    data = _read_results("merge", committed_json)
    try:
        check_compatible(data, preset=base["preset"], device=str(args.device), dtype=base["dtype"],
                         timer=base["timer"], threads=base["threads"], machine_now=_this_machine(args.device))
    except MergeError as error:
        raise FlagError("merge", f"--merge: {error}.") from None
    return BenchPlan(**base, target="merge", json_path=committed_json, output=None, committed=data)


def _this_machine(device: str) -> dict[str, Any]:
    """This machine as a results file records it (``store.MACHINE_KEYS``), for ``--merge``'s check."""
    import torch

    from .runner import environment
    from .store import MACHINE_KEYS

    env = environment(torch.device(device))
    return {key: env.get(key) for key in MACHINE_KEYS}


def _plan_own(args: argparse.Namespace, base: dict[str, Any], partial: list[str],
              committed: dict[Path, str]) -> BenchPlan:
    """A run of its own under runs/ (or ``--output``/``--json``)."""
    preset = base["preset"]
    if args.output is not None:
        output = args.output
    elif args.json is not None:  # the report and plots beside the results file it names
        output = args.json.with_suffix(".md")
    elif args.quick:
        output = Path("runs/bench-quick/benchmarks.md")
    else:
        output = Path(f"runs/bench/{preset.name}{'-partial' if partial else ''}/benchmarks.md")
    json_path = args.json or output.parent / f"{output.stem}.json"
    if args.json is not None:  # named by its own flag
        check_output_file("json", args.json)
        if args.json.exists() and not _is_bench_results(args.json):
            raise FlagError("json", f"--json: {str(args.json)!r} exists and is not the results file of an "
                                    "earlier run of `hf-attn-variants bench`; choose another --json or move "
                                    "the file away.")
    files = {"results file": json_path, "report": output, **_plot_files(args, output)}
    flag = "json" if args.json is not None and args.output is None else "output"
    _check_not_committed(flag, files, committed)
    check_result_files(flag, files, ours=_is_bench_results, tool="hf-attn-variants bench")
    return BenchPlan(**base, target="own", json_path=json_path, output=output)


def plan(args: argparse.Namespace) -> BenchPlan:
    """Resolve and check the flags; ``FlagError`` naming the flag of a bad value (nothing is written)."""
    from .store import committed_results_path

    cuda = str(args.device).startswith("cuda")
    if cuda:
        import torch

        if not torch.cuda.is_available():
            raise FlagError("device", "--device cuda: no CUDA device is available (torch.cuda.is_available() "
                                      "is False).")
    cores = os.cpu_count() or 1
    if args.threads is not None and args.threads > cores:  # torch could start none: every row failed
        raise FlagError("threads", f"--threads {args.threads}: this machine has {cores} CPU threads.")
    if args.no_flops and args.peak_tflops is not None:
        raise FlagError("peak-tflops", "--peak-tflops is for the MFU column, which --no-flops leaves out.")
    preset = _preset(args, cuda)
    variants, comparisons = _selection(args, preset)
    base = {"preset": preset, "variants": variants, "comparisons": comparisons, "cuda": cuda,
            "dtype": args.dtype or ("bfloat16" if cuda else "float32"),
            "timer": args.timer or ("wall" if cuda else "cpu"),
            "threads": args.threads if args.threads is not None else (None if cuda else 1)}
    committed_json = committed_results_path(args.device)
    committed = _committed_paths()
    for flag, path in (("output", args.output), ("json", args.json)):
        if path is not None and path.resolve() in committed:
            raise FlagError(flag, f"--{flag} {str(path)!r} is the committed {committed[path.resolve()]}, "
                                  "which only --publish or --merge writes.")
    partial = partial_flags(args)
    _check_publish(args, partial)
    if args.report_only is not None:
        return _plan_report_only(args, base, committed)
    if args.merge:
        return _plan_merge(args, base, committed_json, partial)
    if args.publish:
        if not committed_json.parent.is_dir():
            raise FlagError("publish", f"--publish writes the committed results ({committed_json}) of the "
                                       f"repository, but there is no {committed_json.parent}/ here: run it "
                                       "from the repository root, or drop --publish for a report of its own.")
        return BenchPlan(**base, target="committed", json_path=committed_json, output=None)
    return _plan_own(args, base, partial, committed)


RENDER_HINT = "the docs that show it are re-rendered by the repository's `python tools/render_docs.py`"
"""What ``--publish`` and ``--merge`` leave to the repository: the docs are views of the file they write."""


def _write_committed(data: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Write the committed results file and redraw the committed plots; returns what was written (the docs
    that show the file are rendered by the repository's ``tools/render_docs.py``, which ``make bench``
    runs)."""
    from ..cli_utils import atomic_write_text
    from ..records import format_results
    from .plots import write_plots
    from .store import committed_results_path, from_results, plot_prefix, report_path

    run = from_results(data)
    path = committed_results_path(run.device)
    atomic_write_text(path, format_results(data, inline_depth=2))
    written = [str(path)]
    if not args.no_plots:
        written += [str(p) for p in write_plots(run, report_path(run.device).parent,
                                                prefix=plot_prefix(run.device))]
    return written


def _write_own(data: dict[str, Any], json_path: Path, output: Path, args: argparse.Namespace,
               write_json: bool = True) -> list[str]:
    """A run of its own: its results file and its report (with plots), nowhere near the committed docs."""
    from ..cli_utils import atomic_write_text
    from ..records import format_results
    from .plots import write_plots
    from .report import write_report
    from .store import from_results

    run = from_results(data)
    written = []
    if write_json:
        atomic_write_text(json_path, format_results(data, inline_depth=2))
        written.append(str(json_path))
    plots = [] if args.no_plots else write_plots(run, output.parent, prefix=output.stem)
    title = "# Benchmarks (smoke test)" if run.preset.name == "quick" else "# Benchmarks (a run of its own)"
    if run.interrupted:
        title += " — interrupted"
    write_report(run, output, source=str(json_path), plots=plots, title=title)
    return [str(output), *written, *map(str, plots)]


def _command() -> str:
    """The command line a results file records."""
    if sys.argv[1:2] == ["bench"]:
        return "hf-attn-variants bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    return "hf-attn-variants bench (called from Python)"


def _print_written(written: list[str], bench_plan: BenchPlan) -> None:
    """One line naming what was written; for the committed results file, who renders the docs from it."""
    print("wrote " + ", ".join(written) + ("" if bench_plan.target == "own" else f"; {RENDER_HINT}"))


def interrupted_files(bench_plan: BenchPlan, stopped: datetime.datetime) -> tuple[Path, Path]:
    """Where a run stopped by Ctrl-C at ``stopped`` keeps what it measured (results file, report): its own
    files (beside them, ``<stem>-interrupted-<UTC time>``, where they hold a whole earlier run: a stopped
    rerun never replaces it), or for ``--publish``/``--merge``, whose committed file takes only whole runs, a
    run of its own under ``runs/bench/<preset>-interrupted-<UTC time>/`` (a folder per stopped run: a later
    one replaces nothing)."""
    stamp = stopped.astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if bench_plan.target == "own" and bench_plan.output is not None:
        json_path, output = bench_plan.json_path, bench_plan.output
        if not _holds_whole_run(json_path):
            return json_path, output
        # A whole earlier run there stays: the stopped rerun goes beside it.
        return (json_path.with_name(f"{json_path.stem}-interrupted-{stamp}{json_path.suffix}"),
                output.with_name(f"{output.stem}-interrupted-{stamp}{output.suffix}"))
    folder = Path(f"runs/bench/{bench_plan.preset.name}-interrupted-{stamp}")
    return folder / "benchmarks.json", folder / "benchmarks.md"


def _holds_whole_run(path: Path) -> bool:
    """Whether ``path`` is a results file of this command from a run that was not interrupted."""
    if not _is_bench_results(path):
        return False
    return "interrupted" not in json.loads(path.read_text(encoding="utf-8"))


def _keep_interrupted(data: dict[str, Any], bench_plan: BenchPlan, args: argparse.Namespace) -> int:
    """Write the rows a run stopped by Ctrl-C measured (``interrupted_files``), then its one
    ``interrupted:`` line; returns ``INTERRUPTED_EXIT_CODE``. The committed results stay as they were."""
    from hf_attn_variants_cli import INTERRUPTED_EXIT_CODE

    json_path, output = interrupted_files(bench_plan, datetime.datetime.now(datetime.timezone.utc))
    committed = "" if bench_plan.target == "own" else "; the committed results are unchanged"
    if not data["results"] and not data["graph_checks"]:
        fail("bench", f"{data['interrupted']}; nothing was measured, nothing written{committed}.",
             label="interrupted")
        return INTERRUPTED_EXIT_CODE
    if bench_plan.target != "own":
        try:
            check_result_files("output", {"results file": json_path, "report": output,
                                          **_plot_files(args, output)},
                               ours=_is_bench_results, tool="hf-attn-variants bench")
        except FlagError as error:
            fail("bench", f"{data['interrupted']}; nothing written{committed}: {error}",
                 label="interrupted")
            return INTERRUPTED_EXIT_CODE
    written = _write_own(data, json_path, output, args)
    print("wrote " + ", ".join(written), flush=True)
    fail("bench", f"{data['interrupted']}; they are in {json_path} and its report {output}{committed} "
                  "(rerun with --only or --lengths to measure the rest).", label="interrupted")
    return INTERRUPTED_EXIT_CODE


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args``; returns 0 (a failed variant is reported, not fatal), or 2
    after one error line naming a flag with a bad value."""
    from .runner import Runner
    from .store import merge_results, to_results

    try:
        bench_plan = plan(args)
    except FlagError as error:
        return fail_flag("bench", error)

    if bench_plan.report_only is not None:
        data = bench_plan.report_only
        if bench_plan.target == "committed":
            written = _write_committed(data, args)
        else:
            written = _write_own(data, bench_plan.json_path, bench_plan.output, args, write_json=False)
        _print_written(written, bench_plan)
        return 0

    runner = Runner(
        bench_plan.preset, bench_plan.variants, bench_plan.comparisons,
        device=args.device,
        dtype=bench_plan.dtype,
        timer=bench_plan.timer,
        threads=bench_plan.threads,
        compile=not (args.no_compile or args.quick),
        count_flops=not args.no_flops,
        check_graph_breaks=not (args.no_graph_check or args.quick),
        peak_tflops=args.peak_tflops,
        log=lambda line: print(line, flush=True),
    )
    if bench_plan.target == "merge" and args.only:
        print("--merge: measuring whole comparisons " + ", ".join(c.key for c in bench_plan.comparisons)
              + " (every ratio of the results file pairs rows of one run)", flush=True)
    try:
        bench = runner.run_all()
    except KeyboardInterrupt:  # the run as far as it got, marked where it stopped
        runner.run.environment["command"] = _command()
        return _keep_interrupted(to_results(runner.run), bench_plan, args)
    bench.environment["command"] = _command()
    data = to_results(bench)
    if bench_plan.target == "own":
        written = _write_own(data, bench_plan.json_path, bench_plan.output, args)
    else:
        if bench_plan.target == "merge":
            data = merge_results(bench_plan.committed, data)
            entry = data["replaced"][-1]
            print(f"merge {entry['merge']}: {len(entry['rows_replaced'])} rows replaced, "
                  f"{len(entry['rows_added'])} added", flush=True)
        written = _write_committed(data, args)
    _print_written(written, bench_plan)
    return 0


__all__ = ["BenchPlan", "add_arguments", "partial_flags", "plan", "run"]
