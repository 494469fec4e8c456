"""Where the time of one fwd+bwd step goes, ours against the FLASH-pytorch peer: the profile behind the peer
targets of docs/benchmarks.md (issue 24), written to ``docs/results/peer-profile-cpu.json``.

For each model (the bench's ``gau_flash``, ``flash_pytorch`` and their causal twins at the CPU preset's
shapes) and length: two warm-up steps, then ``--steps`` profiled steps (``torch.profiler``, one thread); the
self CPU time of every operator, summed over the steps and grouped (``GROUPS``): matrix products, elementwise
arithmetic and activations, layout (concatenations, copies, padding, views that copy), reductions and scans,
and the rest.

Usage (from the repository root, on an otherwise idle machine; about a minute)::

    .venv/bin/python scripts/peer_profile.py && .venv/bin/python tools/render_docs.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from hf_attn_variants.bench.specs import PRESETS, build_variants, random_input_ids

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import format_results  # noqa: E402
from tools.docs_results._common import load_average, machine_description, run_metadata  # noqa: E402
from scripts.script_paths import output_file_problem  # noqa: E402

RESULTS = Path("docs/results/peer-profile-cpu.json")
MODELS = ("gau_flash", "flash_pytorch", "gau_flash_causal", "flash_pytorch_causal")
GROUPS = {
    "matrix products": ("aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear",
                        "aten::baddbmm"),
    "elementwise": ("aten::mul", "aten::add", "aten::div", "aten::sub", "aten::neg", "aten::silu",
                    "aten::silu_backward",
                    "aten::relu", "aten::pow", "aten::threshold_backward", "aten::masked_fill_",
                    "aten::where",
                    "aten::add_", "aten::mul_", "aten::sin", "aten::cos", "aten::exp", "aten::rsqrt",
                    "aten::sqrt"),
    "layout": ("aten::cat", "aten::copy_", "aten::constant_pad_nd", "aten::clone", "aten::contiguous",
               "aten::fill_",
               "aten::zero_", "aten::index_select", "aten::embedding_dense_backward", "aten::stack"),
    "reductions and scans": ("aten::sum", "aten::cumsum", "aten::mean", "aten::norm",
                             "aten::linalg_vector_norm",
                             "aten::native_layer_norm", "aten::native_layer_norm_backward"),
}


def profile_step(name: str, length: int, steps: int) -> dict[str, float]:
    """Self CPU milliseconds per step of ``name`` at ``length`` by group (and ``total``)."""
    preset = PRESETS["cpu"]
    torch.manual_seed(0)
    model = build_variants(preset)[name].build(length).train()
    ids = random_input_ids(1, length, torch.device("cpu"))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids).last_hidden_state.float().square().mean().backward()

    step()
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    groups = dict.fromkeys([*GROUPS, "other"], 0.0)
    for event in prof.key_averages():
        group = next((g for g, names in GROUPS.items() if event.key in names), "other")
        groups[group] += event.self_cpu_time_total / 1e3 / steps
    return {**{k: round(v, 2) for k, v in groups.items()}, "total": round(sum(groups.values()), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 8192])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be >= 1, got {min(args.lengths)}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1 (profiled steps per model and length), got {args.steps}")
    problem = output_file_problem(args.out)
    if problem:
        parser.error(f"--out: {problem}")
    torch.set_num_threads(1)
    start = load_average()
    rows = []
    for length in args.lengths:
        for name in MODELS:
            rows.append({"model": name, "length": length, "ms": profile_step(name, length, args.steps)})
            print(name, length, rows[-1]["ms"])
    command = ["scripts/peer_profile.py", *(argv or [])]
    data = {**run_metadata("peer_profile", command,
                           machine=machine_description(f"{start} at the start, {load_average()} at the end")),
            "settings": {"steps": args.steps, "threads": 1,
                         "groups": {k: list(v) for k, v in GROUPS.items()}},
            "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(format_results(data, inline_depth=2), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
