"""Does tensor parallelism pay for GAU? Time one training step (forward + backward) of each family, whole on
one process and split over the processes of ``torchrun`` with ``DistributedConfig(tp_size=WORLD_SIZE)``.

    python scripts/tp_bench.py --threads 2                              # one process, 2 threads
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/tp_bench.py   # TP = 2, one thread each
    python tools/render_docs.py                                          # docs/scaling.md's table

Both runs use the same cores. Each writes its rows into ``docs/results/tp-bench-cpu.json`` (``--results``;
kind ``tp_bench``), replacing the rows of the same ``--run`` label, family and TP degree and keeping the other
runs, so docs/scaling.md shows the runs side by side; start a fresh file with ``--fresh``. Besides the
measured time, the script prints what each rank computes and sends per layer and token (``traffic``): GAU's
plan gathers in_proj's output (2e + s wide) and all-reduces out_proj's (d wide), where a Llama-style layer
all-reduces d twice; GAU computes its n×n attention on every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers.distributed import DistributedConfig

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    GAUConfig,
    GAUForCausalLM,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import load_results, results_path, write_results  # noqa: E402
from tools.docs_results._common import load_average, run_metadata  # noqa: E402
from scripts.script_paths import foreign_files, output_folder_problem, results_name_problem  # noqa: E402


def models(hidden: int, layers: int) -> dict[str, torch.nn.Module]:
    """Two decoders of equal width: GAU (e = 2d, s = 128) and an entropy-invariant multi-head one (heads of
    64)."""
    common = {"vocab_size": 4096, "hidden_size": hidden, "num_hidden_layers": layers,
              "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0, "tie_word_embeddings": False}
    return {
        "gau": GAUForCausalLM(GAUConfig(**common, expansion_factor=2, attention_key_size=128)),
        "entropy_invariant": EntropyInvariantForCausalLM(EntropyInvariantConfig(
            **common, num_attention_heads=hidden // 64, intermediate_size=4 * hidden)),
    }


def traffic(name: str, hidden: int, tp: int) -> dict[str, int]:
    """Elements each rank receives per layer and token in the forward pass (ring collectives, (tp−1)/tp of
    each)."""
    if tp == 1:
        return {"gathered": 0, "all_reduced": 0}
    share = (tp - 1) / tp
    if name == "gau":
        e, s = 2 * hidden, 128
        return {"gathered": round((2 * e + s) * share), "all_reduced": round(2 * hidden * share)}
    return {"gathered": 0, "all_reduced": round(2 * 2 * hidden * share)}


def time_steps(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> float:
    """Median seconds of forward + backward (after one warm-up step)."""
    times = []
    for index in range(repeats + 1):
        if dist.is_initialized():
            dist.barrier()
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        if index:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


COMMAND = ("python scripts/tp_bench.py --threads 2 && "
           "OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 scripts/tp_bench.py")
"""The two invocations that fill one run of the results file."""


def record(root: Path, name: str, run: str, note: str, settings: dict, rows: list[dict], fresh: bool) -> Path:
    """Put ``rows`` into run ``run`` of ``docs/results/<name>.json`` (same family and TP degree replaced)."""
    data = load_results(root, name) if results_path(root, name).is_file() and not fresh else {"runs": []}
    if data.get("settings", settings) != settings:
        data["runs"] = []  # other settings: the earlier runs are not comparable
    entry = next((r for r in data["runs"] if r["label"] == run), None)
    if entry is None:
        entry = {"label": run, "note": "", "rows": []}
        data["runs"].append(entry)
    keys = {(r["family"], r["tp"]) for r in rows}
    entry["rows"] = [r for r in entry["rows"] if (r["family"], r["tp"]) not in keys] + rows
    entry["note"] = note or entry.get("note", "")
    entry.setdefault("load_average", {})[f"tp={rows[0]['tp']}"] = load_average() if rows else ""
    data.pop("provenance", None)  # measured now
    return write_results(root, name, {**data, **run_metadata("tp_bench", COMMAND), "settings": settings})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments; ``parser.error`` (status 2) naming the flag of a bad one, before any model is built."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512, help="model width, a multiple of 64 (heads of 64)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS)")
    parser.add_argument("--folder", default="runs/tp_bench",
                        help="where rank 0 saves the models the ranks load")
    parser.add_argument("--results", default="tp-bench-cpu",
                        help="results file docs/results/<RESULTS>.json to update ('' = none)")
    parser.add_argument("--run", default="1",
                        help="run label: the rows of this run are replaced, other runs kept")
    parser.add_argument("--note", default="",
                        help="a few words on this run shown under the table (e.g. the load)")
    parser.add_argument("--fresh", action="store_true", help="drop the earlier runs of the results file")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="repository root")
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` naming the first bad flag."""
    if args.hidden < 64 or args.hidden % 64:
        parser.error(f"--hidden must be a positive multiple of 64 (the entropy-invariant model's heads are "
                     f"64 wide, so a narrower width has no head), got {args.hidden}")
    for flag, value in (("--layers", args.layers), ("--length", args.length), ("--batch", args.batch),
                        ("--repeats", args.repeats), ("--threads", args.threads)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if not args.root.is_dir():
        parser.error(f"--root: {str(args.root)!r} is not an existing folder (a checkout of this repository)")
    problem = results_name_problem(args.root, args.results) if args.results else None
    if problem:
        parser.error(f"--results: {problem}")
    folder = Path(args.folder)
    problem = output_folder_problem(folder)
    if problem:
        parser.error(f"--folder: {problem}")
    others = foreign_files(folder, "gau", "entropy_invariant")
    if others:
        parser.error(f"--folder: {str(folder)!r} holds other files ({', '.join(others[:5])}); name a new or "
                     "an earlier run's folder")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    ids = torch.randint(0, 4096, (args.batch, args.length))
    rows = []
    for name, model in models(args.hidden, args.layers).items():
        path = Path(args.folder) / name
        if rank == 0:
            model.save_pretrained(path)
        if world > 1:
            if not dist.is_initialized():
                dist.init_process_group("gloo")
            dist.barrier()
            model = type(model).from_pretrained(path, distributed_config=DistributedConfig(tp_size=world))
        seconds = time_steps(model.train(), ids, args.repeats)
        if rank == 0:
            print(json.dumps({"family": name, "tp": world, "threads": torch.get_num_threads(),
                              "hidden": args.hidden, "layers": args.layers,
                              "tokens": args.batch * args.length,
                              "step_s": round(seconds, 3),
                              "traffic_per_layer_token": traffic(name, args.hidden, world)}))
            rows.append({"family": name, "tp": world, "threads": torch.get_num_threads(),
                         "step_s": round(seconds, 4)})
    if rank == 0 and args.results:
        settings = {"hidden": args.hidden, "layers": args.layers, "batch": args.batch, "length": args.length,
                    "repeats": args.repeats}
        print(f"wrote {record(args.root, args.results, args.run, args.note, settings, rows, args.fresh)}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
