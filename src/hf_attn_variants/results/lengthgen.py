"""Views of the length-generalisation study's results files (``docs/results/length-study*.json``), written by
``scripts/run_length_study.sh`` through ``hf_attn_variants.lengthgen.results.publish`` (docs/length_generalization.md).

Data: ``train_length``, ``seeds``, ``eval_lengths``; ``series`` (per series: ``objective``, ``points`` of
``{length, status, loss: [mean, std], loss_delta, accuracy, perplexity, perplexity_beyond_train, blocks, tokens}``);
``pairs`` (loss of series a − series b per seed and length, ``table`` "mlm" or "llama"); ``final_train_loss``;
``run`` (wall time and run counts); ``finetune`` (per task form: ``task`` sizes and ``conditions`` with mean, std and
per-seed accuracy). An exact 0 is stored as the integer 0 and shown as ``0`` (bit-identical values), a rounded one
as ``+0.000``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, number, signed, source_line


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


def mlm_loss(data: dict[str, Any]) -> str:
    """MLM validation loss, mean ± std over seeds, per variant and evaluation length."""
    return _series_table(data, "mlm", "loss", "variant")


def mlm_loss_delta(data: dict[str, Any]) -> str:
    """Loss minus the same run's loss at L (paired per seed)."""
    return _series_table(data, "mlm", "loss_delta", "variant", short_status=True)


def mlm_accuracy(data: dict[str, Any]) -> str:
    """Masked-token accuracy at L/4, L and 8L (the smallest, training and largest lengths), one sentence."""
    lengths = [min(data["eval_lengths"]), data["train_length"], max(data["eval_lengths"])]
    parts = []
    for name, s in data["series"].items():
        if s["objective"] != "mlm":
            continue
        points = [_point(data, name, n) for n in lengths]
        if all(p and p["status"] == "ok" and p.get("accuracy") for p in points):
            parts.append(f"`{name}` " + " / ".join(f"{p['accuracy'][0]:.3f}" for p in points))
    return (f"Masked-token accuracy at {' / '.join(str(n) for n in lengths)} tokens (mean over seeds): "
            + ", ".join(parts) + " (every point in `runs/length_study/results.md`).")


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
    return _pair_table(data, "mlm", "pair", with_mean=True, short=False)


def paired_seeds(data: dict[str, Any]) -> str:
    """Paired loss differences of the MLM variants, per seed only, and the source line."""
    return _pair_table(data, "mlm", "pair (loss difference)", with_mean=False, short=False) + f"\n\n{source_line(data)}"


def llama_perplexity(data: dict[str, Any]) -> str:
    """The stock Llama's perplexity over whole blocks, per evaluation mode (same weights)."""
    return _series_table(data, "clm", "perplexity", "perplexity (whole block)", digits=2)


def llama_perplexity_beyond(data: dict[str, Any]) -> str:
    """Perplexity of the predictions made from positions ≥ L only."""
    return _series_table(data, "clm", "perplexity_beyond_train", "perplexity of predictions from positions ≥ L",
                         digits=2, beyond=True)


def llama_differences(data: dict[str, Any]) -> str:
    """Loss of each log-n mode minus SDPA's, per seed."""
    return _pair_table(data, "llama", "", with_mean=False, short=True)


def train_losses(data: dict[str, Any]) -> str:
    """Final training losses (mean over seeds), one sentence."""
    seeds = len(data["seeds"])
    return (f"Final training losses (mean of {seeds} seeds): "
            + ", ".join(f"{e['label']} {e['loss']:.2f}" for e in data["final_train_loss"]) + ".")


def counts(data: dict[str, Any]) -> str:
    """Blocks and target tokens behind every point."""
    mlm = [p for s in data["series"].values() if s["objective"] == "mlm" for p in s["points"] if p.get("tokens")]
    clm = [p for s in data["series"].values() if s["objective"] == "clm" for p in s["points"] if p.get("tokens")]
    blocks: dict[int, int] = {}
    for s in data["series"].values():
        for p in s["points"]:
            if p.get("blocks"):
                blocks.setdefault(p["length"], p["blocks"])
    blocks = dict(sorted(blocks.items()))
    text = (f"Blocks per evaluation length {', '.join(str(n) for n in blocks)}: "
            f"{', '.join(str(b) for b in blocks.values())}")
    if data.get("target_ranges"):
        ranges = data["target_ranges"]
    else:
        ranges = {name: [min(p["tokens"] for p in points), max(p["tokens"] for p in points)]
                  for name, points in (("mlm", mlm), ("clm", clm)) if points}
    if "mlm" in ranges:
        text += f"; MLM targets per point ≈ {ranges['mlm'][0] / 1000:.1f}–{ranges['mlm'][1] / 1000:.1f} k"
    if "clm" in ranges:
        text += f", CLM targets ≈ {ranges['clm'][0] / 1000:.1f}–{ranges['clm'][1] / 1000:.1f} k"
    return text + "."


def run(data: dict[str, Any]) -> str:
    """How long the study took, and the source line."""
    r = data["run"]
    parts = []
    if r.get("wall_seconds") is not None:
        minutes, seconds = divmod(round(r["wall_seconds"]), 60)
        parts.append(f"{minutes} min {seconds} s for the whole study:")
    train = ""
    if r.get("train_seconds_range"):
        low, high = r["train_seconds_range"]
        train = f" (≈ {low:.0f}–{high:.0f} s each" + (
            f", Llama ≈ {r['llama_train_seconds']:.0f} s)" if r.get("llama_train_seconds") else ")")
    parts.append(f"{r['pretrain_runs']} pretraining runs{train}")
    if r.get("finetune_runs"):
        parts.append(f"+ {r['finetune_runs']} finetune runs ({r['finetune_conditions']} conditions × {len(data['seeds'])} "
                     f"seeds × {r['finetune_tasks']} task forms, ≈ {r['finetune_seconds'] / 60:.0f} min of CPU in total)")
    return f"Wall time: {' '.join(parts)}.\n\n{source_line(data)}"


def finetune(data: dict[str, Any]) -> str:
    """Finetune accuracy per condition and task form: mean ± std (per seed)."""
    tasks = list(data["finetune"])
    conditions = list(dict.fromkeys(c["condition"] for t in tasks for c in data["finetune"][t]["conditions"]))
    rows = []
    for condition in conditions:
        cells = []
        for t in tasks:
            c = next((c for c in data["finetune"][t]["conditions"] if c["condition"] == condition), None)
            cells.append(f"{c['mean']:.3f} ± {c['std']:.3f} ({', '.join(f'{v:.3f}' for v in c['seeds'])})" if c else "–")
        rows.append([condition, *cells])
    return markdown_table(["condition", *tasks], rows)


def finetune_task(data: dict[str, Any]) -> str:
    """Size of the finetuning task (the same snippets for both task forms)."""
    task = next(iter(data["finetune"].values()))["task"]
    return (f"Task size: {task['train_samples']:,} train / {task['validation_samples']:,} validation snippets of "
            f"{task['mean_tokens']:.1f} tokens on average (inputs truncated at {task['max_seq_length']}); majority "
            f"class {task['majority']:.3f}, chance {task['chance']:.3f}.")
