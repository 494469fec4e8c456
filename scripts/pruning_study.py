"""Head-pruning study for docs/pruning.md: train a small entropy-invariant classifier, prune it iteratively.

Task (synthetic, generated locally, 8 classes, majority class ≈ 19%): 32 tokens (ids 5–47), [CLS] first.
    label = 4·f₁ + 2·f₂ + f₃
    f₁ = at least 6 "marker" tokens (ids 5–12) in the sequence
    f₂ = more even-numbered than odd-numbered tokens
    f₃ = more "low" tokens (ids < 26) than high ones
Each feature needs [CLS] to aggregate a different token class over the whole sequence (attention).

Steps: train → score heads on 512 training examples (Michel et al. 2019: Iₕ = Σₓ |∂L/∂ξₕ|) → four
pruning curves to 100% of heads, 10% of the remaining heads per step: importance scored once (the paper),
re-scored after every step, random orders (baseline, mean of 3), and uniform (the same number of heads
from every layer, max(1, round(10% of the heads per layer)) per step, the least important within each
layer, scored once) → the paper's stop rule (90% of the unpruned accuracy), global and uniform → the
50%-pruned model's accuracy and inference speedup at n = 512 (forward only, one run, medians of
interleaved repetitions).

    python scripts/pruning_study.py                      # ≈ 15–30 min on a busy 2-core CPU
    python scripts/pruning_study.py --steps 200 --quick  # smoke run

Writes runs/pruning_study/{trained/, uniform_stop_rule/, results.json}, docs/pruning_curve.png,
docs/pruning_importance.png and the results file docs/results/pruning-study.json (kind ``pruning_study``),
which ``python tools/render_docs.py`` renders into docs/pruning.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import transformers

from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForSequenceClassification
from hf_attn_variants.pruning import (
    compute_head_importance,
    count_heads,
    iterative_head_pruning,
    prune_heads,
    restate_uniform_heads,
    write_curve,
)
from hf_attn_variants.pruning.iterative import select_heads
from hf_attn_variants.pruning.plotting import plot_head_importance, plot_pruning_curve

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tools/ (the docs' results files and views) is at the repository root

from tools.docs_results import write_results  # noqa: E402
from tools.docs_results._common import run_metadata  # noqa: E402

LENGTH, VOCAB, FIRST_TOKEN, CLS, MARKERS = 32, 48, 5, 1, 8
POSITIONS, MARKER_COUNT, LOW = "rope", 6, 26


def make_task(n: int, seed: int, length: int = LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences and their labels (see the module docstring), from a fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_TOKEN, VOCAB, (n, length), generator=generator)
    ids[:, 0] = CLS
    marker = (ids >= FIRST_TOKEN) & (ids < FIRST_TOKEN + MARKERS)
    many = marker[:, 1:].sum(1) >= MARKER_COUNT
    even = (ids[:, 1:] % 2 == 0).sum(1) > (ids[:, 1:] % 2 == 1).sum(1)
    low = (ids[:, 1:] < LOW).sum(1) > (ids[:, 1:] >= LOW).sum(1)
    return ids, (4 * many.long() + 2 * even.long() + low.long())


def build_model(seed: int) -> EntropyInvariantForSequenceClassification:
    torch.manual_seed(seed)
    config = EntropyInvariantConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=8, intermediate_size=128,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=512,
        attention_scale="entropy_invariant", base_length=LENGTH, num_labels=8, pad_token_id=0,
        position_embedding_type=POSITIONS,
    )
    return EntropyInvariantForSequenceClassification(config)


@torch.no_grad()
def accuracy(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, batch: int = 250) -> float:
    correct = 0
    for start in range(0, len(ids), batch):
        logits = model(input_ids=ids[start : start + batch]).logits
        correct += int((logits.argmax(-1) == labels[start : start + batch]).sum())
    return correct / len(ids)


def train(model, steps: int, eval_set, log_every: int = 250, batch_size: int = 32,
          lr: float = 2e-3) -> list[dict]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    log = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        model.train()
        ids, labels = make_task(batch_size, seed=10_000 + step)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % log_every == 0 or step == steps:
            model.eval()
            acc = accuracy(model, *eval_set)
            log.append({"step": step, "loss": round(loss.item(), 4), "eval_accuracy": acc,
                        "seconds": round(time.perf_counter() - start, 1)})
            print(json.dumps(log[-1]), flush=True)
    return model.eval(), log


@torch.no_grad()
def time_forward(models: dict[str, torch.nn.Module], ids: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median forward time per model, repetitions interleaved so load changes hit both alike."""
    for model in models.values():
        model(input_ids=ids)  # warm-up
    times = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            model(input_ids=ids)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def kept_heads(pruned: dict, layers: int, heads: int) -> dict[str, list[int]]:
    """``{layer: heads kept}`` from ``{layer: heads pruned}`` (keys as strings)."""
    return {str(layer): [h for h in range(heads) if h not in set(pruned.get(str(layer), []))]
            for layer in range(layers)}


def random_spread(results: dict, orders: int) -> dict:
    """The random baseline's number of orders and, per step, the sample standard deviation of the accuracy
    over them (the column shows mean ± sd)."""
    columns = list(zip(*results["random_order_accuracies"]))
    return {"orders": orders, "stdev": [statistics.stdev(c) if len(c) > 1 else 0.0 for c in columns]}


def compact_results(results: dict, args: argparse.Namespace, train_log: list[dict], total: int,
                    eval_examples: int) -> dict:
    """The results file docs/pruning.md renders (``tools.docs_results.pruning_study``)."""
    layers, heads = 4, total // 4
    machine = results["machine"]
    load = (f"load average {machine['load_average_at_start'][0]:.1f} at the start, "
            f"{machine['load_average_at_end'][1]:.1f} over the last 5 minutes at the end")
    data = run_metadata("pruning_study", ["python", "scripts/pruning_study.py", *sys.argv[1:]])
    data["machine"] = f"{data['machine']}; {load}"
    uniform, stop = results["stop_rule_90_uniform"], results["stop_rule_90"]
    once = results["curves"]["importance, scored once"]
    rejected = next((r for r in once if r["heads_pruned"] > stop["heads_pruned"]), None)
    curve_keys = dict(zip(results["curves"], ("once", "rescored", "random_mean", "uniform_once")))
    data.update({
        "total_seconds": results["total_seconds"],
        "task": {"length": LENGTH, "classes": 8, "eval_examples": eval_examples,
                 "majority_class_accuracy": results["task"]["majority_class_accuracy"]},
        "train": {"steps": args.steps, "batch": 32, "lr": 2e-3, "seconds": train_log[-1]["seconds"],
                  "accuracy": results["baseline_accuracy"]},
        "importance": {"examples": 128 if args.quick else 512, "seconds": results["importance_seconds"]},
        "total_heads": total, "heads_per_layer": heads,
        "curves": {curve_keys[label]: {"title": label,
                                       "points": [[r["heads_pruned"], r["accuracy"]] for r in rows],
                                       **(random_spread(results, args.random_orders)
                                          if curve_keys[label] == "random_mean" else {})}
                   for label, rows in results["curves"].items()},
        "stop_rule": {"heads_pruned": stop["heads_pruned"], "accuracy": stop["accuracy"],
                      "rejected_step": ({"heads_pruned": rejected["heads_pruned"],
                                         "accuracy": rejected["accuracy"]}
                                        if rejected else None),
                      "kept_heads": kept_heads(stop["pruned_heads"], layers, heads)},
        "stop_rule_uniform": {"heads_pruned": uniform["heads_pruned"], "accuracy": uniform["accuracy"],
                              "rejected_step": uniform["rejected_step"],
                              "kept_heads": kept_heads(uniform["pruned_heads"], layers, heads),
                              "restated": uniform["restated"],
                              "num_attention_heads": uniform["num_attention_heads"],
                              "head_dim": uniform["head_dim"],
                              "reloaded_accuracy": uniform["reloaded_accuracy"]},
        "half": {"accuracy": results["half"]["accuracy"], "pruned_heads": results["half"]["pruned_heads"],
                 "parameters": results["half"]["parameters"],
                 "timing": {**{k: results["half"]["timing"][k]
                               for k in ("batch", "length", "repeats", "speedup")},
                            "threads": machine["cpu_threads"],
                            "median_seconds": results["half"]["timing"]["median_seconds"]}},
    })
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default="runs/pruning_study")
    parser.add_argument("--docs_dir", default="docs")
    parser.add_argument("--reuse", action="store_true", help="reuse output_dir/trained if it exists")
    parser.add_argument("--timing_batch", type=int, default=4)
    parser.add_argument("--timing_length", type=int, default=512)
    parser.add_argument("--timing_repeats", type=int, default=15)
    parser.add_argument("--random_orders", type=int, default=3, help="random-order baselines to average")
    parser.add_argument("--quick", action="store_true", help="smaller evaluation sets (smoke run)")
    parser.add_argument("--results", default="pruning-study",
                        help="results file docs/results/<RESULTS>.json under --root ('' = none)")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="repository root")
    args = parser.parse_args()
    for flag in ("steps", "timing_batch", "timing_length", "timing_repeats", "random_orders"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be a positive integer, got {getattr(args, flag)}")
    run_start, load_at_start = time.perf_counter(), [round(v, 2) for v in os.getloadavg()]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    output, docs = Path(args.output_dir), Path(args.docs_dir)
    output.mkdir(parents=True, exist_ok=True)
    docs.mkdir(parents=True, exist_ok=True)

    eval_set = make_task(500 if args.quick else 2000, seed=1)
    score_ids, score_labels = make_task(128 if args.quick else 512, seed=2)
    score_batches = [{"input_ids": score_ids[i : i + 64], "labels": score_labels[i : i + 64]}
                     for i in range(0, len(score_ids), 64)]
    chance = torch.bincount(eval_set[1], minlength=8).max().item() / len(eval_set[1])

    trained_dir = output / "trained"
    if args.reuse and (trained_dir / "config.json").exists():
        model = EntropyInvariantForSequenceClassification.from_pretrained(trained_dir).eval()
        train_log = json.loads((output / "train_log.json").read_text())
    else:
        model, train_log = train(build_model(args.seed), args.steps, eval_set)
        model.save_pretrained(trained_dir)
        (output / "train_log.json").write_text(json.dumps(train_log, indent=1))

    def metric(m) -> float:
        return accuracy(m, *eval_set)

    start = time.perf_counter()
    importance = compute_head_importance(model, score_batches)
    importance_seconds = time.perf_counter() - start
    plot_head_importance(importance, docs / "pruning_importance.png",
                         title="Head importance (per-layer ℓ2-normalised), trained classifier")

    curves = {}
    curves["importance, scored once"] = iterative_head_pruning(
        copy.deepcopy(model), score_batches, metric, threshold=None, importance=importance)
    curves["importance, re-scored each step"] = iterative_head_pruning(
        copy.deepcopy(model), score_batches, metric, threshold=None, rescore=True, importance=importance)
    random_curves = []
    for offset in range(args.random_orders):
        generator = torch.Generator().manual_seed(args.seed + offset)
        random_scores = torch.rand(importance.shape, generator=generator)
        random_curves.append(iterative_head_pruning(
            copy.deepcopy(model), None, metric, threshold=None, importance=random_scores))
        write_curve(random_curves[-1], output / f"curve_random_{offset}.csv")
    # Same schedule (10% of the remaining heads) for every order, so the rows align: average the metric.
    curves[f"random order (mean of {args.random_orders})"] = [
        replace(rows[0], metric=statistics.mean(r.metric for r in rows),
                relative_metric=statistics.mean(r.relative_metric for r in rows), newly_pruned={})
        for rows in zip(*random_curves)
    ]
    curves["uniform per layer, scored once"] = iterative_head_pruning(
        copy.deepcopy(model), score_batches, metric, threshold=None, importance=importance, uniform=True)
    for name, curve in zip(("once", "rescored", "random_mean", "uniform_once"), curves.values()):
        write_curve(curve, output / f"curve_{name}.csv")
    plot_pruning_curve(curves, docs / "pruning_curve.png", metric_name="accuracy", threshold=0.9,
                       title="Head pruning: entropy-invariant classifier, 4 layers × 8 heads")

    stopped_model = copy.deepcopy(model)
    stop_curve = iterative_head_pruning(stopped_model, score_batches, metric, threshold=0.9,
                                        importance=importance)
    uniform_model = copy.deepcopy(model)
    uniform_stop = iterative_head_pruning(uniform_model, score_batches, metric, threshold=0.9,
                                          importance=importance,
                                          uniform=True)
    uniform_pruned = {str(k): v for k, v in (uniform_model.config.pruned_heads or {}).items()}
    restated = restate_uniform_heads(uniform_model)
    uniform_model.save_pretrained(output / "uniform_stop_rule")  # plain config when restated
    reloaded = EntropyInvariantForSequenceClassification.from_pretrained(output / "uniform_stop_rule").eval()
    uniform_reloaded_accuracy = metric(reloaded)

    # The 50%-pruned model: the lowest-importance half of the heads (scored once), physically removed.
    half = copy.deepcopy(model)
    total = count_heads(half)[1]
    prune_heads(half, select_heads(importance, total // 2))
    half_accuracy = metric(half)
    timing_ids = make_task(args.timing_batch, seed=3, length=args.timing_length)[0]
    seconds = time_forward({"unpruned": model, "pruned_50": half}, timing_ids, args.timing_repeats)
    parameters = {name: sum(p.numel() for p in m.parameters())
                  for name, m in (("unpruned", model), ("pruned_50", half))}

    results = {
        "machine": {"cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                    "load_average_at_start": load_at_start,
                    "load_average_at_end": [round(v, 2) for v in os.getloadavg()]},
        "total_seconds": round(time.perf_counter() - run_start, 1),
        "task": {"length": LENGTH, "classes": 8, "majority_class_accuracy": chance},
        "train_log": train_log,
        "baseline_accuracy": curves["importance, scored once"][0].metric,
        "importance_seconds": round(importance_seconds, 2),
        "importance": [[round(float(v), 4) for v in row] for row in importance],
        "curves": {label: [{"heads_pruned": r.heads_pruned, "fraction": round(r.fraction, 4),
                            "accuracy": r.metric}
                           for r in curve] for label, curve in curves.items()},
        "random_order_accuracies": [[r.metric for r in curve] for curve in random_curves],
        "stop_rule_90": {"heads_pruned": stop_curve[-2].heads_pruned if not stop_curve[-1].accepted
                         else stop_curve[-1].heads_pruned,
                         "accuracy": [r.metric for r in stop_curve if r.accepted][-1],
                         "pruned_heads": {str(k): v
                                          for k, v in (stopped_model.config.pruned_heads or {}).items()}},
        "stop_rule_90_uniform": {"heads_pruned": [r.heads_pruned for r in uniform_stop if r.accepted][-1],
                                 "accuracy": [r.metric for r in uniform_stop if r.accepted][-1],
                                 "rejected_step": ({"heads_pruned": uniform_stop[-1].heads_pruned,
                                                    "accuracy": uniform_stop[-1].metric}
                                                   if not uniform_stop[-1].accepted else None),
                                 "pruned_heads": uniform_pruned, "restated": restated,
                                 "num_attention_heads": uniform_model.config.num_attention_heads,
                                 "head_dim": uniform_model.config.head_dim,
                                 "reloaded_accuracy": uniform_reloaded_accuracy},
        "half": {"heads": count_heads(half), "accuracy": half_accuracy,
                 "pruned_heads": {str(k): v for k, v in half.config.pruned_heads.items()},
                 "parameters": parameters,
                 "timing": {"batch": args.timing_batch, "length": args.timing_length,
                            "repeats": args.timing_repeats, "median_seconds": seconds,
                            "speedup": seconds["unpruned"] / seconds["pruned_50"]}},
    }
    (output / "results.json").write_text(json.dumps(results, indent=1))
    if args.results:
        print("wrote", write_results(args.root, args.results, compact_results(results, args, train_log, total,
                                                                               len(eval_set[1]))))
    print(json.dumps({k: results[k]
                      for k in ("baseline_accuracy", "stop_rule_90", "stop_rule_90_uniform", "half")},
                     indent=1))
    print("\n| heads pruned | % | scored once | re-scored | random (mean) | uniform |")
    print("|---:|---:|---:|---:|---:|---:|")
    rows = {label: {r.heads_pruned: r.metric for r in curve} for label, curve in curves.items()}
    for pruned in sorted(set().union(*[set(r) for r in rows.values()])):
        cells = [f"{rows[label][pruned]:.3f}" if pruned in rows[label] else "" for label in curves]
        print(f"| {pruned} | {100 * pruned / total:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
