"""Publishing the studies of ``hf-attn-variants lengthgen`` into the results files the docs render.

``lengthgen`` writes a study's own outputs (``results.json`` and the rest, under its ``--output_dir``);
``scripts/run_length_study.sh`` and ``scripts/run_retrieval_study.sh`` then call ``tools/publish_study.py``,
which turns them into the compact ``docs/results/length-study.json`` (kind ``lengthgen``: ``publish``,
``publish_rerun``) and ``docs/results/retrieval-study.json`` (kind ``retrieval``: ``publish_retrieval``,
``publish_replication``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from . import load_results, results_path, write_results
from ._common import cpu_name, run_metadata

# --------------------------------------------------------------------------------------------------
# The compact results file the docs render (docs/results/<name>.json, kind "lengthgen")
# --------------------------------------------------------------------------------------------------
PAIRS: tuple[tuple[str, str, bool, str], ...] = (
    ("gau_relu2_fixed", "gau_relu2_dynamic", True, "mlm"),
    ("gau_softmax_plus", "gau_softmax", True, "mlm"),
    ("ei_entropy_invariant", "ei_standard", True, "mlm"),
    ("ei_ssmax", "ei_standard", False, "mlm"),
    ("gau_relu2_dynamic+mixed", "gau_relu2_dynamic", False, "mlm"),
    ("gau_softmax", "gau_relu2_dynamic", False, "mlm"),
    ("gau_softmax", "gau_relu2_fixed", False, "mlm"),
    ("gau_relu2_normalized", "gau_softmax", False, "mlm"),
    ("llama/entropy_invariant_all", "llama/sdpa", True, "llama"),
    ("llama/entropy_invariant_beyond_L", "llama/sdpa", True, "llama"),
)
"""(series a, series b, same trained weights, table): the paired loss differences a − b the docs show, per
seed."""
COMPACT_METRICS = ("loss", "loss_delta", "accuracy", "perplexity", "perplexity_beyond_train")


def _exact(value: float | None) -> float | int | None:
    """An exactly zero difference becomes the integer 0 (rendered ``0``: bit-identical, not rounded)."""
    return 0 if value == 0 else value


def paired_differences(rows: Iterable[dict[str, Any]], pairs: Sequence[tuple[str, str, bool, str]] = PAIRS
                       ) -> list[dict[str, Any]]:
    """Per seed and length, loss of series a minus loss of series b (both evaluated on the same blocks and
    masks), for every pair whose two series are in ``rows``; mean over seeds."""
    loss = {(r["series"], int(r["length"]), r["seed"]): r.get("loss") for r in rows
            if r.get("status") == "ok"}
    series = {r["series"] for r in rows}
    out = []
    for a, b, same, table in pairs:
        if a not in series or b not in series:
            continue
        points = []
        for length in sorted({key[1] for key in loss if key[0] == a}):
            seeds = sorted(key[2] for key in loss if key[0] == a and key[1] == length
                           and (b, length, key[2]) in loss)
            diffs = [_exact(loss[(a, length, s)] - loss[(b, length, s)]) for s in seeds]
            if not diffs:
                continue
            mean = 0 if all(d == 0 for d in diffs) else sum(diffs) / len(diffs)
            points.append({"length": length, "mean": mean, "seeds": diffs})
        out.append({"a": a, "b": b, "same_weights": same, "table": table,
                    "seeds": sorted({key[2] for key in loss if key[0] == a}), "points": points})
    return out


def compact_results(report: dict[str, Any], *, command: str,
                    wall_seconds: float | None = None) -> dict[str, Any]:
    """The compact results data of a study's ``results.json`` report (``write_outputs``), for
    ``write_results`` (kind ``lengthgen``, views in ``tools.docs_results.lengthgen``). The environment is the
    one the study recorded (this process's for a report that predates the record)."""
    args, machine = report["args"], report.get("machine", {})
    load = machine.get("load_average_at_start")
    data = run_metadata("lengthgen", command)
    if machine.get("environment") is not None:
        data["environment"] = machine["environment"]
    data["cpu"] = cpu_name(data["environment"])
    if load:
        data["machine"] += f"; load average {' / '.join(f'{x:.1f}' for x in load)} at the start"
    data["versions"].update({k: machine[k] for k in ("torch", "transformers") if k in machine})
    data.update({"train_length": args["train_length"], "steps": args["max_train_steps"],
                 "seeds": list(args["seeds"]),
                 "eval_lengths": list(args["eval_lengths"])})
    series: dict[str, dict[str, Any]] = {}
    for row in report["summary"]:
        entry = series.setdefault(row["series"],
                                  {"objective": row["objective"], "model_type": row["model_type"],
                                                  "points": []})
        point: dict[str, Any] = {"length": int(row["length"]), "status": row["status"]}
        if row["status"] == "ok":
            for metric in COMPACT_METRICS:
                if row.get(f"{metric}_mean") is not None:
                    point[metric] = [_exact(row[f"{metric}_mean"]), row[f"{metric}_std"]]
        point["blocks"], point["tokens"] = row.get("blocks"), row.get("tokens")
        entry["points"].append(point)
    data["series"] = series
    runs = report.get("runs", [])
    data["pairs"] = paired_differences([r for run in runs for r in run["rows"]])
    data["final_train_loss"] = [
        {"label": f"`{v['variant']}`", "loss": sum(x for x in v["final_train_loss"] if x is not None)
         / max(1, sum(x is not None for x in v["final_train_loss"]))}
        for v in report.get("variants", [])
    ]
    train_seconds = [(run["variant"], run["train"]["seconds"]) for run in runs]
    others = [s for v, s in train_seconds if v != "llama"]
    llama = [s for v, s in train_seconds if v == "llama"]
    finetune_rows = [row for task in (report.get("finetune") or {}).values() for row in task["rows"]]
    data["run"] = {
        "wall_seconds": wall_seconds, "pretrain_runs": len(runs),
        "train_seconds_range": [min(others), max(others)] if others else None,
        "llama_train_seconds": sum(llama) / len(llama) if llama else None,
        "finetune_runs": len(finetune_rows),
        "finetune_conditions": len({row["condition"] for row in finetune_rows}),
        "finetune_tasks": len(report.get("finetune") or {}),
        "finetune_seconds": sum(row.get("train_seconds") or 0 for row in finetune_rows),
    }
    data["finetune"] = {}
    for level, task_report in (report.get("finetune") or {}).items():
        task = task_report["task"]
        data["finetune"][level] = {
            "task": {"train_samples": task["train_samples"], "validation_samples": task["validation_samples"],
                     "mean_tokens": task["mean_tokens"], "max_seq_length": task_report["max_seq_length"],
                     "majority": task["majority_baseline_accuracy"], "chance": task["chance_accuracy"]},
            "conditions": [{"condition": e["condition"], "mean": e["accuracy_mean"], "std": e["accuracy_std"],
                            "seeds": e["accuracy_per_seed"]} for e in task_report["summary"]],
        }
    return data


KEPT_ON_REPUBLISH = ("reruns", "reported")
"""Entries of a study's results file that a new ``publish`` keeps: re-runs of some of its rows on other
machines or code (``publish_rerun``) and runs reported by others (transcribed by hand, each naming its
source). They are evidence about the spread of the study's conclusions and stay valid when the study itself is
re-run."""


def publish(results_json: str | Path, name: str, *, root: str | Path = ".", command: str,
            wall_seconds: float | None = None) -> Path:
    """Write ``docs/results/<name>.json`` under ``root`` from a study's ``results.json`` (what
    ``scripts/run_length_study.sh`` calls at the end through ``tools/publish_study.py``; then
    ``python tools/render_docs.py``). The ``reruns`` and ``reported`` entries of an existing file are kept
    (``KEPT_ON_REPUBLISH``)."""
    report = json.loads(Path(results_json).read_text(encoding="utf-8"))
    data = compact_results(report, command=command, wall_seconds=wall_seconds)
    if results_path(Path(root), name).is_file():
        previous = load_results(Path(root), name)
        data.update({key: previous[key] for key in KEPT_ON_REPUBLISH if key in previous})
    return write_results(Path(root), name, data)


def publish_rerun(results_json: str | Path, name: str, *, root: str | Path = ".", command: str,
                  wall_seconds: float | None = None, code: str | None = None) -> Path:
    """Add a re-run of some of a study's variants (its own ``results.json``, e.g. the relu² rows on another
    CPU) to the study's results file ``docs/results/<name>.json`` as an entry of ``reruns``: the compact data
    of the re-run with its own provenance (``command``, ``machine``, ``cpu``, ``versions``, ``date``, and
    ``code``, the commit or working tree it ran). A re-run with the same command, date and machine replaces
    its earlier entry. ``ValueError`` naming ``name`` when the study's file does not exist, or
    ``results_json`` when the re-run's settings (training length, steps, seeds, evaluation lengths) differ
    from the study's."""
    root = Path(root)
    if not results_path(root, name).is_file():
        raise ValueError(f"name: no results file {results_path(root, name)} to add the re-run to.")
    data = load_results(root, name)
    report = json.loads(Path(results_json).read_text(encoding="utf-8"))
    rerun = compact_results(report, command=command, wall_seconds=wall_seconds)
    settings = ("train_length", "steps", "seeds", "eval_lengths")
    different = [key for key in settings if rerun[key] != data.get(key)]
    if different:
        raise ValueError(f"results_json: {results_json} was not run with the study's settings "
                         f"({', '.join(different)} differ), so its rows are not a re-run of {name}.")
    del rerun["kind"]
    if code:
        rerun["code"] = code
    same = (rerun["command"], rerun["date"], rerun["machine"])
    data["reruns"] = [r for r in data.get("reruns", [])
                      if (r["command"], r["date"], r["machine"]) != same] + [rerun]
    return write_results(root, name, data)


# --------------------------------------------------------------------------------------------------
# The retrieval study's results file (docs/results/<name>.json, kind "retrieval")
# --------------------------------------------------------------------------------------------------
REPORTED_PASSKEY: dict[str, Any] = {
    "source": ("issue 29's passkey experiment by its author (random filler, KEY d1 d2 d3, QUERY; trained at "
               "n = 64 for 1500 steps, 2 seeds, on an Intel Xeon; 2 layers, d = 64; GAU 4 layers), "
               "transcribed"),
    "ratios": [1, 4, 16, 64],
    "rows": [
        {"label": "EI family, RoPE, standard", "series": "ei_standard", "accuracy": [0.95, 0.07, 0.01, 0.00]},
        {"label": "EI family, RoPE, entropy_invariant", "series": "ei_entropy_invariant",
         "accuracy": [0.96, 0.49, 0.02, 0.01]},
        {"label": "GAU, RoPE, softmax", "series": "gau_softmax", "accuracy": [0.95, 0.00, 0.00, 0.00]},
        {"label": "GAU, RoPE, softmax_plus", "series": "gau_softmax_plus",
         "accuracy": [0.98, 0.32, 0.02, 0.00]},
        {"label": "EI family, no position embedding, standard", "series": "ei_standard+nope",
         "accuracy": [0.68, 0.66, 0.61, 0.48]},
        {"label": "EI family, no position embedding, entropy_invariant",
         "series": "ei_entropy_invariant+nope",
         "accuracy": [0.83, 0.83, 0.78, 0.78]},
    ],
}
"""The passkey table of issue 29 (its author's runs; ratios = evaluation length / training length)."""


def publish_replication(results_json: str | Path, name: str, *, root: str | Path = ".", command: str,
                        key: str = "replication") -> Path:
    """Add to ``docs/results/<name>.json`` under ``key`` a passkey study at the issue author's setting (its
    ``results.json``), run by ``command``, which the view of that name (``replication``, ``probe``) sets
    beside the reported table."""
    report = json.loads(Path(results_json).read_text(encoding="utf-8"))
    data = load_results(Path(root), name)
    data[key] = {"command": command, "date": datetime.date.today().isoformat(), **compact_task(report)}
    return write_results(Path(root), name, data, inline_depth=4)


def retrieval_data(results_jsons: list[str | Path], kind: str, *, command: str,
                   wall_seconds: float | None = None, plot: str | Path | None = None) -> dict[str, Any]:
    """The results object (``kind``) of one or more task studies (their ``results.json``), and, with ``plot``,
    their combined accuracy figure drawn there."""
    reports = [json.loads(Path(p).read_text(encoding="utf-8")) for p in results_jsons]
    data = run_metadata(kind, command)
    if reports[0]["machine"].get("environment") is not None:
        data["environment"] = reports[0]["machine"]["environment"]
    data["cpu"] = cpu_name(data["environment"])
    data["versions"].update({k: reports[0]["machine"][k] for k in ("torch", "transformers")})
    data["tasks"] = {}
    for report in reports:
        data["tasks"][report["args"]["task"]] = compact_task(report)
    data["wall_seconds"] = wall_seconds
    if plot is not None:
        from hf_attn_variants.lengthgen.plotting import plot_accuracy

        first = reports[0]["args"]
        steps = ", ".join(f"{r['args']['task']} {r['args']['max_train_steps']} steps"
                          + (f", {r['args']['copy_warmup_steps']} of them copy warm-up"
                             if r["args"].get("copy_warmup_steps") else "") for r in reports)
        plot_accuracy({r["args"]["task"]: r["summary"] for r in reports}, plot,
                      train_length=first["train_length"],
                      title=f"trained at L = {first['train_length']} ({steps}), seeds {first['seeds']}; "
                            "band: min–max over seeds")
    return data


def publish_retrieval(results_jsons: list[str | Path], name: str, *, root: str | Path = ".", command: str,
                      wall_seconds: float | None = None, plot: str | Path | None = None) -> Path:
    """Write ``docs/results/<name>.json`` (kind ``retrieval``) from the ``results.json`` of one or more task
    studies (and, with ``plot``, the combined accuracy figure); then ``python tools/render_docs.py``."""
    data = retrieval_data(results_jsons, "retrieval", command=command, wall_seconds=wall_seconds, plot=plot)
    data["reported"] = REPORTED_PASSKEY
    return write_results(Path(root), name, data, inline_depth=4)


def seed_accuracy(report: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per series of a task study's ``results.json``: ``at_L`` (accuracy per seed at L) and ``beyond_L`` (per
    seed, the mean over the evaluated lengths beyond L where the series ran)."""
    train = report["args"]["train_length"]
    out: dict[str, dict[str, list[float]]] = {}
    for series in dict.fromkeys(row["series"] for row in report["summary"]):
        rows = [r for r in report["summary"] if r["series"] == series and r["status"] == "ok"]
        at_l = next((r["per_seed"] for r in rows if r["length"] == train), [])
        beyond = [r["per_seed"] for r in rows if r["length"] > train]
        means = [sum(values) / len(values) for values in zip(*beyond)] if beyond else []
        out[series] = {"at_L": at_l, "beyond_L": [round(v, 4) for v in means]}
    return out


STOCK_ACCURACY = {"llama": "llama/sdpa", "llama + log-n": "llama/entropy_invariant_beyond_L"}
"""The stock Llama's entropy series (eager; stock log-n, scope ``beyond``) → the study series of the same
weights and attention whose accuracy they take."""


def publish_entropy(entropy_json: str | Path, name: str, *, root: str | Path = ".", command: str,
                    study_json: str | Path | None = None, plot: str | Path | None = None) -> Path:
    """Write ``docs/results/<name>.json`` (kind ``attention_entropy``) from the output of ``hf-attn-variants
    entropy`` run by ``command``, with the accuracy of the study that trained the models (``study_json``,
    its ``results.json``) and, with ``plot``, the command's figure copied there."""
    import shutil

    entropy = json.loads(Path(entropy_json).read_text(encoding="utf-8"))
    data = {**run_metadata("attention_entropy", command), **{k: v for k, v in entropy.items()
                                                             if k not in ("kind", "date")}}
    data["cpu"] = entropy["cpu"]
    if study_json is not None:
        accuracy = seed_accuracy(json.loads(Path(study_json).read_text(encoding="utf-8")))
        for measured, evaluated in STOCK_ACCURACY.items():
            if evaluated in accuracy:
                accuracy[measured] = accuracy[evaluated]
        data["accuracy"] = accuracy
    if plot is not None:
        shutil.copyfile(Path(entropy_json).with_suffix(".png"), plot)
    return write_results(Path(root), name, data, inline_depth=4)


def publish_hybrid(results_jsons: list[str | Path], entropy_jsons: list[str | Path], name: str, *,
                   root: str | Path = ".", command: str, wall_seconds: float | None = None,
                   plot: str | Path | None = None) -> Path:
    """Write ``docs/results/<name>.json`` (kind ``hybrid``): the task studies as ``publish_retrieval`` keeps
    them, and per task the entropy slopes (``entropy``: series → slope per seed) of ``hf-attn-variants
    entropy`` run on their models (``entropy_jsons``, one per task, series named ``<series>@<seed>``)."""
    data = retrieval_data(results_jsons, "hybrid", command=command, wall_seconds=wall_seconds, plot=plot)
    data["entropy"] = {}
    for entropy_json in entropy_jsons:
        entropy = json.loads(Path(entropy_json).read_text(encoding="utf-8"))
        slopes: dict[str, list[float]] = {}
        for entry in entropy["series"]:
            slopes.setdefault(entry["name"].rsplit("@", 1)[0], []).append(round(entry["slope"], 4))
        data["entropy"][entropy["task"]] = slopes
    return write_results(Path(root), name, data, inline_depth=4)


CALIBRATION_SETTINGS = ("task", "train_length", "num_kv_pairs", "task_vocab_size", "num_hidden_layers",
                        "hidden_size", "num_attention_heads", "max_train_steps", "copy_warmup_steps",
                        "per_device_train_batch_size", "learning_rate", "num_warmup_steps", "seeds")
"""The flags a calibration run records."""


def publish_calibration(results_jsons: list[str | Path], name: str, *, root: str | Path = ".",
                        command: str) -> Path:
    """Write ``docs/results/<name>.json`` (kind ``calibration``) from the ``results.json`` of single
    calibration runs of ``lengthgen`` (their settings, accuracy at L and training time)."""
    data = run_metadata("calibration", command)
    data["runs"] = []
    for path in results_jsons:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        args = report["args"]
        train = args["train_length"]
        data["runs"].append({
            "settings": {key: args[key] for key in CALIBRATION_SETTINGS},
            "accuracy": {row["series"]: round(row["accuracy_mean"], 4) for row in report["summary"]
                         if row["length"] == train and row["status"] == "ok"},
            "seconds": round(sum(run["train"]["seconds"] for run in report["runs"]), 1),
        })
    return write_results(Path(root), name, data, inline_depth=3)


def compact_task(report: dict[str, Any]) -> dict[str, Any]:
    """The compact data of one task study: its settings, and per series the points (mean, std, per-seed
    accuracy)."""
    args, runs = report["args"], report["runs"]
    keep = ("task", "train_length", "max_train_steps", "per_device_train_batch_size", "learning_rate",
            "num_warmup_steps", "seeds", "eval_lengths", "eval_samples", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "gau_layer_factor", "task_vocab_size", "passkey_digits", "num_kv_pairs",
            "position_embedding_types", "variants")
    series: dict[str, Any] = {}
    for row in report["summary"]:
        entry = series.setdefault(row["series"], {"variant": row["variant"], "model_type": row["model_type"],
                                                  "position": row["position_embedding_type"], "points": []})
        point: dict[str, Any] = {"length": row["length"], "status": row["status"]}
        if row["status"] == "ok":
            point.update(accuracy=[round(row["accuracy_mean"], 4), round(row["accuracy_std"], 4)],
                         seeds=row["per_seed"])
        entry["points"].append(point)
    seconds = [run["train"]["seconds"] + run["train"].get("eval_seconds", 0) for run in runs]
    optional = ("intermediate_size", "task_bos", "weight_decay", "copy_warmup_steps")  # flags added later
    settings = {**{k: args[k] for k in keep}, **{k: args[k] for k in optional if args.get(k) is not None}}
    return {"settings": settings, "runs": len(runs),
            "run_seconds": [round(min(seconds), 1), round(max(seconds), 1)] if seconds else None,
            "series": series}


__all__ = [
    "KEPT_ON_REPUBLISH",
    "PAIRS",
    "REPORTED_PASSKEY",
    "compact_results",
    "compact_task",
    "paired_differences",
    "publish",
    "publish_calibration",
    "publish_entropy",
    "publish_hybrid",
    "publish_replication",
    "publish_rerun",
    "publish_retrieval",
    "retrieval_data",
    "seed_accuracy",
]
