"""Decoding speed for docs/benchmarks.md: ``generate`` tokens/s of each family against a stock Llama of equal
parameters (``hf_attn_variants.bench.decoding``), written to ``docs/results/decoding-cpu.json``.

Usage (from the repository root, on an otherwise idle machine; a few minutes on 2 cores)::

    .venv/bin/python scripts/decoding_bench.py    # batch 1 and 16, contexts 512 and 4096, 32 new tokens
    .venv/bin/python tools/render_docs.py          # docs/benchmarks.md's decoding table

``--out`` writes elsewhere (e.g. ``runs/decoding.json`` for a trial run that leaves the docs as they are).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from hf_attn_variants.bench.decoding import DECODERS, DecodingSize, measure
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import format_results  # noqa: E402
from tools.docs_results._common import load_average, machine_description, run_metadata  # noqa: E402
from scripts.script_paths import output_file_problem  # noqa: E402

RESULTS = Path("docs/results/decoding-cpu.json")
MAX_CONTEXT = 16384
"""The longest ``--contexts`` accepted: 4 times the default's longest; beyond it one prefill of the
stock Llama alone needs tens of GB on a CPU."""
MINIMA = {"--batches": 1, "--contexts": 1, "--new_tokens": 3, "--threads": 1}
"""The smallest value of each numeric flag (``--new_tokens``: the step clock needs 3 generated tokens)."""


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` (status 2) naming the first bad flag, before anything is built or timed."""
    values = {"--batches": args.batches, "--contexts": args.contexts, "--new_tokens": [args.new_tokens],
              "--threads": [args.threads]}
    for flag, numbers in values.items():
        if min(numbers) < MINIMA[flag]:
            parser.error(f"{flag} must be >= {MINIMA[flag]}, got {min(numbers)}")
    if max(args.contexts) > MAX_CONTEXT:
        parser.error(f"--contexts must be <= {MAX_CONTEXT} (the longest this CPU bench measures), got "
                     f"{max(args.contexts)}")
    problem = output_file_problem(args.out)
    if problem:
        parser.error(f"--out: {problem}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DECODERS), choices=list(DECODERS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--contexts", nargs="+", type=int, default=[512, 4096])
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    check_args(parser, args)
    torch.set_num_threads(args.threads)
    size = DecodingSize()
    start_load = load_average()
    rows = measure(args.models, args.batches, args.contexts, args.new_tokens, size)
    data = {
        **run_metadata("decoding",
                       ["scripts/decoding_bench.py", *(argv if argv is not None else sys.argv[1:])],
                       machine=machine_description(f"{start_load} at the start, {load_average()} at the "
                                                   "end")),
        "settings": {"batches": args.batches, "contexts": args.contexts, "new_tokens": args.new_tokens,
                     "threads": args.threads, "size": asdict(size)},
        "models": {name: DECODERS[name][0] for name in args.models},
        "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(format_results(data, inline_depth=2), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
