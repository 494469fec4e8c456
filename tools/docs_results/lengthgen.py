"""Views of the length-generalisation study's results files (``docs/results/length-study*.json``), written by
``scripts/run_length_study.sh`` through ``hf_attn_variants.lengthgen.results.publish``
(docs/length_generalization.md).

Data: ``train_length``, ``seeds``, ``eval_lengths``; ``series`` (per series: ``objective``, ``points`` of
``{length, status, loss: [mean, std], loss_delta, accuracy, perplexity, perplexity_beyond_train, blocks,
tokens}``); ``pairs`` (loss of series a − series b per seed and length, ``table`` "mlm" or "llama");
``final_train_loss``; ``run`` (wall time and run counts); ``finetune`` (per task form: ``task`` sizes and
``conditions`` with mean, std and per-seed accuracy); ``cpu`` (the CPU's name). An exact 0 is stored as the
integer 0 and shown as ``0`` (bit-identical values), a rounded one as ``+0.000``.

Spread: every table says what its ± is (the sample standard deviation over seeds, one training run per seed)
and on which CPU it was measured. ``reruns`` (``lengthgen.results.publish_rerun``: some variants of the study
run again, e.g. on another CPU or after a kernel change, each with its own provenance) and ``reported`` (runs
reported by others, transcribed, each naming its ``source``) feed the ``relu2_*`` views, which state the relu²
`fixed` vs `dynamic` comparison over every seed of every run; a comparison whose sign differs between seeds or
runs is worded "not resolved at this scale".
"""

from __future__ import annotations

from typing import Any

from ._common import format_versions, markdown_table, minutes, number, signed, source_line

RELU2_FIXED, RELU2_DYNAMIC = "relu2/fixed", "relu2/dynamic"
"""The finetune conditions of Su's comparison (same pretrained weights, two choices of n)."""
RELU2_PAIR = ("gau_relu2_fixed", "gau_relu2_dynamic")
"""The zero-shot pair of the same comparison (same weights, MLM loss)."""


def _lengths(data: dict[str, Any], beyond: bool = False) -> list[int]:
    lengths = list(data["eval_lengths"])
    return [n for n in lengths if n > data["train_length"]] if beyond else lengths


def _head(data: dict[str, Any], first: str, lengths: list[int]) -> list[str]:
    return [first, *[f"{n} (L)" if n == data["train_length"] else str(n) for n in lengths]]


def _point(data: dict[str, Any], series: str, length: int) -> dict[str, Any] | None:
    return next((p for p in data["series"][series]["points"] if p["length"] == length), None)


def _cell(point: dict[str, Any] | None, metric: str, digits: int, short_status: bool = False) -> str:
    if point is None:
        return "–"
    if point["status"] != "ok":
        return point["status"].split(" ")[0] if short_status else point["status"]
    value = point.get(metric)
    if value is None:
        return "–"
    mean, std = value
    if isinstance(mean, int) and mean == 0:
        return "0"
    return f"{number(mean, digits)} ± {std:.{digits}f}"


def _series_table(data: dict[str, Any], objective: str, metric: str, first: str, digits: int = 3,
                  beyond: bool = False, short_status: bool = False, label=lambda name: f"`{name}`") -> str:
    lengths = _lengths(data, beyond)
    names = [name for name, s in data["series"].items() if s["objective"] == objective
             and any(p.get(metric) is not None or p["status"] != "ok" for p in s["points"])]
    rows = [[label(name), *[_cell(_point(data, name, n), metric, digits, short_status) for n in lengths]]
            for name in names]
    return markdown_table(_head(data, first, lengths), rows)


def _cpu(data: dict[str, Any]) -> str:
    """The CPU of a run (``cpu``, else its ``machine`` description)."""
    return data.get("cpu") or data.get("machine") or "an unrecorded machine"


def _listed(names: list[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _seeds(data: dict[str, Any]) -> str:
    return ", ".join(str(s) for s in data["seeds"])


def _spread(data: dict[str, Any]) -> str:
    """The line under a mean ± std table: what the spread is, and where it was measured."""
    return (f"*Mean ± sample standard deviation over seeds {_seeds(data)} (one training run per seed), on "
            f"{_cpu(data)}, {data['date']}.*")


def _mean_line(data: dict[str, Any]) -> str:
    """The line under a table of means."""
    return f"*Mean over seeds {_seeds(data)}, on {_cpu(data)}, {data['date']}.*"


def _paired_spread(data: dict[str, Any]) -> str:
    """The line under a table of paired differences."""
    return (f"*Mean over seeds {_seeds(data)} (the seeds' own values in brackets), on {_cpu(data)}, "
            f"{data['date']}.*")


def mlm_loss(data: dict[str, Any]) -> str:
    """MLM validation loss, mean ± std over seeds, per variant and evaluation length."""
    return _series_table(data, "mlm", "loss", "variant") + f"\n\n{_spread(data)}"


def mlm_loss_delta(data: dict[str, Any]) -> str:
    """Loss minus the same run's loss at L (paired per seed)."""
    return _series_table(data, "mlm", "loss_delta", "variant", short_status=True) + f"\n\n{_spread(data)}"


def mlm_accuracy(data: dict[str, Any]) -> str:
    """Masked-token accuracy at L/4, L and 8L (the smallest, training and largest lengths), mean over
    seeds."""
    lengths = [min(data["eval_lengths"]), data["train_length"], max(data["eval_lengths"])]
    rows = []
    for name, s in data["series"].items():
        if s["objective"] != "mlm":
            continue
        points = [_point(data, name, n) for n in lengths]
        if all(p and p["status"] == "ok" and p.get("accuracy") for p in points):
            rows.append([f"`{name}`", *[f"{p['accuracy'][0]:.3f}" for p in points]])
    return markdown_table(_head(data, "variant", lengths), rows) + f"\n\n{_mean_line(data)}"


def _pair_label(pair: dict[str, Any], short: bool = False) -> str:
    if short:
        return f"`{pair['a'].split('/')[-1]}`"
    return f"`{pair['a']}` − `{pair['b']}`" + (" (same weights)" if pair["same_weights"] else "")


def _pair_table(data: dict[str, Any], table: str, first: str, with_mean: bool, short: bool) -> str:
    pairs = [p for p in data["pairs"] if p["table"] == table]
    lengths = sorted({pt["length"] for p in pairs for pt in p["points"]})
    rows = []
    for pair in pairs:
        by_length = {pt["length"]: pt for pt in pair["points"]}
        cells = []
        for n in lengths:
            point = by_length.get(n)
            if point is None:
                cells.append("–")
            elif with_mean and isinstance(point["mean"], int) and point["mean"] == 0:
                cells.append("0")
            else:
                seeds = ", ".join(signed(v) for v in point["seeds"])
                cells.append(f"{signed(point['mean'])} ({seeds})" if with_mean else seeds)
        rows.append([_pair_label(pair, short), *cells])
    return markdown_table(_head(data, first, lengths), rows)


def paired(data: dict[str, Any]) -> str:
    """Paired loss differences of the MLM variants: mean (per seed)."""
    return _pair_table(data, "mlm", "pair", with_mean=True, short=False) + f"\n\n{_paired_spread(data)}"


def paired_seeds(data: dict[str, Any]) -> str:
    """Paired loss differences of the MLM variants, per seed only, and the source line."""
    return _pair_table(data, "mlm", "pair (loss difference)", with_mean=False,
                       short=False) + f"\n\n{source_line(data)}"


def llama_perplexity(data: dict[str, Any]) -> str:
    """The stock Llama's perplexity over whole blocks, per evaluation mode (same weights)."""
    return (_series_table(data, "clm", "perplexity", "perplexity (whole block)", digits=2)
            + f"\n\n{_spread(data)}")


def llama_perplexity_beyond(data: dict[str, Any]) -> str:
    """Perplexity of the predictions made from positions ≥ L only."""
    return (_series_table(data, "clm", "perplexity_beyond_train",
                          "perplexity of predictions from positions ≥ L",
                          digits=2, beyond=True) + f"\n\n{_spread(data)}")


def llama_differences(data: dict[str, Any]) -> str:
    """Loss of each log-n mode minus SDPA's, per seed."""
    return (_pair_table(data, "llama", "", with_mean=False, short=True)
            + f"\n\n*Per seed {_seeds(data)}, on {_cpu(data)}, {data['date']}.*")


def train_losses(data: dict[str, Any]) -> str:
    """Final training losses (mean over seeds), one row per model."""
    rows = [[entry["label"], f"{entry['loss']:.2f}"] for entry in data["final_train_loss"]]
    return (markdown_table(["model", f"final training loss (mean of {len(data['seeds'])} seeds)"], rows,
                           ["---", "---:"]))


def counts(data: dict[str, Any]) -> str:
    """Evaluation blocks per length (the same for every model)."""
    blocks: dict[int, int] = {}
    for s in data["series"].values():
        for p in s["points"]:
            if p.get("blocks"):
                blocks.setdefault(p["length"], p["blocks"])
    lengths = sorted(blocks)
    return markdown_table(_head(data, "evaluation length", lengths),
                          [["blocks", *[str(blocks[n]) for n in lengths]]],
                          ["---", *["---:"] * len(lengths)])


def targets(data: dict[str, Any]) -> str:
    """Target tokens behind a point (its masked or predicted tokens), smallest to largest point, per
    objective."""
    if data.get("target_ranges"):
        ranges = data["target_ranges"]
    else:
        ranges = {}
        for objective in ("mlm", "clm"):
            tokens = [p["tokens"] for s in data["series"].values() if s["objective"] == objective
                      for p in s["points"] if p.get("tokens")]
            if tokens:
                ranges[objective] = [min(tokens), max(tokens)]
    names = {"mlm": "MLM (masked tokens)", "clm": "CLM (predicted tokens)"}
    rows = [[names[key], f"≈ {low / 1000:.1f}–{high / 1000:.1f} k"] for key, (low, high) in ranges.items()]
    return markdown_table(["objective", "target tokens per point"], rows, ["---", "---:"])


def run(data: dict[str, Any]) -> str:
    """How long the study took, per part, and the source line."""
    r = data["run"]
    rows = []
    if r.get("wall_seconds") is not None:
        rows.append(["the whole study", "–", f"{minutes(r['wall_seconds'])} wall"])
    train = "–"
    if r.get("train_seconds_range"):
        low, high = r["train_seconds_range"]
        train = f"≈ {low:.0f}–{high:.0f} s each" + (
            f" (Llama ≈ {r['llama_train_seconds']:.0f} s)" if r.get("llama_train_seconds") else "")
    rows.append(["pretraining", str(r["pretrain_runs"]), train])
    if r.get("finetune_runs"):
        runs = (f"{r['finetune_runs']} ({r['finetune_conditions']} conditions × {len(data['seeds'])} seeds × "
                f"{r['finetune_tasks']} task forms)")
        rows.append(["finetuning", runs, f"≈ {r['finetune_seconds'] / 60:.0f} min of CPU in total"])
    return markdown_table(["part", "runs", "time"], rows, ["---", "---:", "---"]) + f"\n\n{source_line(data)}"


def finetune(data: dict[str, Any]) -> str:
    """Finetune accuracy per condition and task form: mean ± std (per seed)."""
    tasks = list(data["finetune"])
    conditions = list(dict.fromkeys(c["condition"] for t in tasks for c in data["finetune"][t]["conditions"]))
    rows = []
    for condition in conditions:
        cells = []
        for t in tasks:
            c = next((c for c in data["finetune"][t]["conditions"] if c["condition"] == condition), None)
            cells.append(f"{c['mean']:.3f} ± {c['std']:.3f} ({', '.join(f'{v:.3f}' for v in c['seeds'])})"
                         if c else "–")
        rows.append([condition, *cells])
    return markdown_table(["condition", *tasks], rows) + f"\n\n{_spread(data)}"


def finetune_task(data: dict[str, Any]) -> str:
    """Size of the finetuning task (the same snippets for both task forms) and its two baselines."""
    task = next(iter(data["finetune"].values()))["task"]
    head = ["train snippets", "validation snippets", "tokens per snippet (mean)", "inputs truncated at",
            "majority class", "chance"]
    row = [f"{task['train_samples']:,}", f"{task['validation_samples']:,}", f"{task['mean_tokens']:.1f}",
           str(task["max_seq_length"]), f"{task['majority']:.3f}", f"{task['chance']:.3f}"]
    return markdown_table(head, [row], ["---:"] * len(head))


# --------------------------------------------------------------------------------------------------
# relu² `fixed` vs `dynamic` over every run: the study, its re-runs and the runs others reported
# --------------------------------------------------------------------------------------------------
def _runs(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The study, then its ``reruns``, then the ``reported`` runs, each with a ``label`` naming its CPU and
    date."""
    runs = [{**data, "label": f"{_cpu(data)}, {data['date']} (the study)"}]
    runs += [{**r, "label": f"{_cpu(r)}, {r['date']} (re-run)"} for r in data.get("reruns", [])]
    runs += [{**r, "label": f"{_cpu(r)}, {r['date']} (reported)"} for r in data.get("reported", [])]
    return runs


def _condition(run: dict[str, Any], task: str, condition: str) -> dict[str, Any] | None:
    conditions = ((run.get("finetune") or {}).get(task) or {}).get("conditions", [])
    return next((c for c in conditions if c["condition"] == condition), None)


def _finetune_differences(run: dict[str, Any], task: str) -> list[float] | None:
    """Per seed, finetune accuracy of relu² `fixed` minus `dynamic` (same pretrained weights) on ``task``."""
    reported = (run.get("finetune_fixed_minus_dynamic") or {}).get(task)
    if reported is not None:
        return list(reported)
    fixed, dynamic = _condition(run, task, RELU2_FIXED), _condition(run, task, RELU2_DYNAMIC)
    if fixed is None or dynamic is None:
        return None
    return [a - b for a, b in zip(fixed["seeds"], dynamic["seeds"])]


def _zero_shot_differences(run: dict[str, Any], shorter: bool) -> list[float] | None:
    """Per seed and evaluation length shorter (or longer) than L, MLM loss of `fixed` minus `dynamic`."""
    pair = next((p for p in run.get("pairs", []) if (p["a"], p["b"]) == RELU2_PAIR), None)
    if pair is None:
        return None
    train_length = run.get("train_length")
    return [v for point in pair["points"] if (point["length"] < train_length) == shorter
            and point["length"] != train_length for v in point["seeds"]]


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return mean, std


def _difference_cell(values: list[float] | None) -> str:
    if not values:
        return "–"
    mean, std = _mean_std(values)
    return f"{signed(mean)} ± {std:.3f} ({', '.join(signed(v) for v in values)})"


def relu2_finetune_runs(data: dict[str, Any]) -> str:
    """Finetune accuracy of the relu² conditions in every run that has them: mean ± std (per seed)."""
    tasks = list(data.get("finetune") or {})
    conditions = [c["condition"] for c in (data.get("finetune") or {}).get(tasks[0], {}).get("conditions", [])
                  if c["condition"].startswith("relu2")] if tasks else []
    rows = []
    for condition in conditions:
        for run in _runs(data):
            cells = []
            for task in tasks:
                c = _condition(run, task, condition)
                cells.append(f"{c['mean']:.3f} ± {c['std']:.3f} ({', '.join(f'{v:.3f}' for v in c['seeds'])})"
                             if c else "–")
            if any(cell != "–" for cell in cells):
                rows.append([condition, run["label"], *cells])
    return (markdown_table(["condition", "run", *tasks], rows)
            + f"\n\n*Mean ± sample standard deviation over seeds {_seeds(data)}, per run (the runs are "
              "listed "
            "under the table above).*")


def relu2_fixed_minus_dynamic(data: dict[str, Any]) -> str:
    """relu² `fixed` − `dynamic` on the same weights, every run: zero-shot MLM loss below and beyond L
    (negative = `fixed` better) and finetune accuracy after finetuning at shorter lengths (positive = `fixed`
    better)."""
    tasks = list(data.get("finetune") or {})
    rows = []
    for run in _runs(data):
        rows.append([run["label"], _difference_cell(_zero_shot_differences(run, shorter=True)),
                     _difference_cell(_zero_shot_differences(run, shorter=False)),
                     *[_difference_cell(_finetune_differences(run, task)) for task in tasks]])
    head = ["run", "zero-shot loss, lengths < L", "zero-shot loss, lengths > L",
            *[f"finetune accuracy, {task}" for task in tasks]]
    return (markdown_table(head, rows) + "\n\n*Mean ± sample standard deviation (the values: per seed, and "
            "per length for the zero-shot columns).*")


def relu2_sources(data: dict[str, Any]) -> str:
    """Where each run of the relu² comparison comes from: one row per run."""
    rows = []
    for index, run in enumerate(_runs(data)):
        if index == 0:
            how = (f"the study on this page ({format_versions(run.get('versions') or {})}; source under its "
                   "run time)")
        elif run.get("source"):
            how = run["source"] + (f"; {format_versions(run['versions'])}" if run.get("versions") else "")
        else:
            how = (f"`{run['command']}` on {run['machine']} ({format_versions(run.get('versions') or {})})"
                   + (f", {run['code']}" if run.get("code") else ""))
        rows.append([run["label"], how])
    return markdown_table(["run", "source"], rows)


NOT_RESOLVED = "**not resolved at this scale**"
"""The verdict of a comparison whose sign differs between seeds or runs (or is 0 somewhere)."""


def _verdict(values: list[float], lower: str, higher: str) -> str:
    """``lower`` when every value is below 0, ``higher`` when every value is above 0, else
    ``NOT_RESOLVED``."""
    if values and all(v < 0 for v in values):
        return lower
    if values and all(v > 0 for v in values):
        return higher
    return NOT_RESOLVED


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _zero_shot_row(runs: list[dict[str, Any]], shorter: bool) -> list[str] | None:
    values = [v for r in runs for v in (_zero_shot_differences(r, shorter) or [])]
    if not values:
        return None
    counted = sum(1 for r in runs if _zero_shot_differences(r, shorter))
    return [f"zero-shot MLM loss, lengths {'<' if shorter else '>'} L",
            f"{_plural(len(values), 'seed × length cell')} of {_plural(counted, 'run')}",
            f"{signed(min(values))} to {signed(max(values))}",
            _verdict(values, "`fixed` lower in every one", "`fixed` higher in every one")]


def _finetune_row(runs: list[dict[str, Any]], task: str) -> list[str] | None:
    per_run = [(r, d) for r in runs if (d := _finetune_differences(r, task))]
    values = [v for _, d in per_run for v in d]
    if not values:
        return None
    cpus = _listed(sorted({_cpu(r) for r, _ in per_run}))
    means = [_mean_std(d)[0] for _, d in per_run]
    return [f"finetune accuracy, {task}",
            f"{_plural(len(values), 'seed')} of {_plural(len(per_run), 'run')} on {cpus}",
            f"{signed(min(values))} to {signed(max(values))} (run means {signed(min(means))} to "
            f"{signed(max(means))})",
            _verdict(values, "`fixed` worse in every one", "`fixed` better in every one")]


def relu2_verdict(data: dict[str, Any]) -> str:
    """Su's relu² claim (`fixed` n transfers better than `dynamic` n) over every seed of every run: one row
    per comparison (zero-shot below and beyond L, each finetune task), the range of `fixed` − `dynamic` and
    whether its sign holds in every value; a comparison whose sign differs between seeds or runs is
    ``NOT_RESOLVED``."""
    runs = _runs(data)
    rows = [_zero_shot_row(runs, shorter=True), _zero_shot_row(runs, shorter=False),
            *[_finetune_row(runs, task) for task in data.get("finetune") or {}]]
    head = ["comparison", "values", "`fixed` − `dynamic`", "sign"]
    return markdown_table(head, [row for row in rows if row is not None])
