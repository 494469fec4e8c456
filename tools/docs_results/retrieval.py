"""Views of the retrieval study's results file (``docs/results/retrieval-study.json``), written by
``scripts/run_retrieval_study.sh`` through ``hf_attn_variants.lengthgen.retrieval_study.publish_retrieval``
(docs/length_generalization.md, "Retrieval tasks").

Data: ``tasks`` (per task, ``passkey`` and ``mqar``: ``settings`` — the study's flags —, ``runs``,
``run_seconds`` and ``series``: per series its ``variant``, ``model_type``, ``position`` (``rope``/``none``)
and ``points`` of ``{length, status, accuracy: [mean, std], seeds: [accuracy per seed]}``); ``reported`` (the
issue author's passkey table, transcribed, with its ``source``); ``wall_seconds``; the provenance fields
(``command``, ``machine``, ``cpu``, ``versions``, ``date``).

Verdicts (``claims``): a claim "a extrapolates better than b" is compared per seed on the mean, over the
evaluation lengths beyond L, of accuracy(a) − accuracy(b): **holds** when its mean over seeds is at least
``MARGIN`` (0.05) and no seed is negative, **fails** when the mean is at most −0.05 and no seed is positive,
**not resolved** when the sign differs between seeds, when the mean is smaller than 0.05 in size, or when
either model did not learn the task at L (``learned_threshold``: mean accuracy below 0.5 on passkey; on MQAR
with P pairs below halfway between answering by elimination and perfect). The models of a pair are trained
separately (the same seeds), except the stock Llama's modes (the same weights).
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table

CLAIMS: tuple[tuple[str, str, str], ...] = (
    ("log-n scale (entropy-invariant attention), multi-head family", "ei_entropy_invariant", "ei_standard"),
    ("SSMax (learned log-n scale), multi-head family", "ei_ssmax", "ei_standard"),
    ("GAU-α `softmax_plus` (log-n softmax)", "gau_softmax_plus", "gau_softmax"),
    ("stock log-n, scope `beyond` (same weights)", "llama/entropy_invariant_beyond_L", "llama/sdpa"),
    ("stock log-n, scope `all` (same weights)", "llama/entropy_invariant_all", "llama/sdpa"),
    ("relu² `fixed` n transfers better than `dynamic`", "gau_relu2_fixed", "gau_relu2_dynamic"),
    ("softmax transfers better than relu²", "gau_softmax", "gau_relu2_dynamic"),
)
"""(claim, series a, series b): "a extrapolates better than b" (RoPE names; ``+nope`` is added for no position
embedding)."""
LEARNED = 0.5
"""Passkey: mean accuracy at L below which a model counts as not having learned the task (no verdict on
it)."""


def elimination(pairs: int) -> float:
    """MQAR accuracy of a model that knows which values the context holds but not which key each belongs to,
    answering the P queries in turn among the values not yet used: (1/P + 1/(P − 1) + … + 1) / P."""
    return sum(1 / k for k in range(1, pairs + 1)) / pairs


def learned_threshold(task: dict[str, Any]) -> float:
    """The accuracy at L that counts as having learned the task: ``LEARNED`` for passkey; for MQAR with P
    pairs halfway between answering by elimination (``elimination``, which binds no key to its value) and 1.
    """
    settings = task["settings"]
    if settings.get("task") == "mqar":
        return (1 + elimination(settings["num_kv_pairs"])) / 2
    return LEARNED
MARGIN = 0.05
"""A mean difference over seeds smaller than this is no difference (not resolved): with 32 sequences per
length and seed, one sequence is 0.03."""
POSITIONS = {"rope": "RoPE", "none": "no position embedding"}
REPORTED_TRAIN_LENGTH = 64
"""The training length L of the issue author's passkey table (``reported``)."""


def _points(task: dict[str, Any], series: str) -> dict[int, dict[str, Any]] | None:
    entry = task["series"].get(series)
    return None if entry is None else {p["length"]: p for p in entry["points"]}


def _cell(point: dict[str, Any] | None) -> str:
    if point is None:
        return "–"
    if point["status"] != "ok":
        return "n/a"
    mean, std = point["accuracy"]
    return f"{mean:.2f} ± {std:.2f}"


def _accuracy_table(data: dict[str, Any], name: str) -> str:
    task = data["tasks"][name]
    settings = task["settings"]
    lengths, train = settings["eval_lengths"], settings["train_length"]
    head = ["series", *[f"{n} (L)" if n == train else f"{n} ({n // train}L)" for n in lengths]]
    rows = [[f"`{series}`", *[_cell(_points(task, series).get(n)) for n in lengths]]
            for series in task["series"]]
    return markdown_table(head, rows) + f"\n\n*{_where(data)}*"


def _where(data: dict[str, Any]) -> str:
    return f"On {data.get('cpu') or data['machine']}, {data['date']}."


def passkey(data: dict[str, Any]) -> str:
    """Passkey accuracy per series and length (mean ± sample std over the seeds of ``setup``)."""
    return _accuracy_table(data, "passkey")


def mqar(data: dict[str, Any]) -> str:
    """MQAR accuracy (per query) per series and length."""
    return _accuracy_table(data, "mqar")


def setup(data: dict[str, Any]) -> str:
    """The study's settings and cost: one row per task, then the models, the wall time and the command."""
    rows = []
    for name, task in data["tasks"].items():
        s = task["settings"]
        detail = (f"{s['passkey_digits']} digits" if name == "passkey"
                  else f"{s['num_kv_pairs']} key-value pairs")
        rows.append([f"**{name}** ({detail})", str(s["task_vocab_size"]), str(s["train_length"]),
                     f"{s['max_train_steps']} × {s['per_device_train_batch_size']}"
                     + (f" (the first {s['copy_warmup_steps']} on the copy warm-up)"
                        if s.get("copy_warmup_steps") else ""),
                     f"{s['learning_rate']}, {s['num_warmup_steps']} warm-up steps",
                     ", ".join(str(x) for x in s["seeds"]), ", ".join(str(n) for n in s["eval_lengths"]),
                     str(s["eval_samples"]),
                     f"{task['runs']} of {task['run_seconds'][0]:.0f}–{task['run_seconds'][1]:.0f} s"])
    head = ["task", "vocabulary", "L", "steps × batch", "AdamW lr (linear decay)", "seeds", "evaluated at",
            "sequences per length", "runs (training + evaluation)"]
    first = next(iter(data["tasks"].values()))["settings"]
    models = [["models", f"hidden {first['hidden_size']}, {first['num_hidden_layers']} layers of attention + "
                         f"FFN with {first['num_attention_heads']} heads (GAU: {first['gau_layer_factor']}× "
                         "as many layers), dropout 0"]]
    if data.get("wall_seconds"):
        models.append(["wall time of the whole study", f"{data['wall_seconds'] / 60:.0f} min"])
    models.append(["command", f"`{data['command']}`"])
    return (markdown_table(head, rows) + "\n\n" + markdown_table(["", ""], models) + f"\n\n*{_where(data)}*")


def _per_seed_difference(task: dict[str, Any], a: str, b: str) -> list[float] | None:
    """Per seed, the mean over lengths beyond L (where both ran) of accuracy(a) − accuracy(b)."""
    pa, pb = _points(task, a), _points(task, b)
    train = task["settings"]["train_length"]
    if pa is None or pb is None:
        return None
    lengths = [n for n in pa if n > train and n in pb and pa[n]["status"] == "ok" and pb[n]["status"] == "ok"]
    if not lengths:
        return None
    seeds = len(pa[lengths[0]]["seeds"])
    return [sum(pa[n]["seeds"][i] - pb[n]["seeds"][i] for n in lengths) / len(lengths) for i in range(seeds)]


def verdict(task: dict[str, Any], a: str, b: str) -> tuple[str, list[float] | None,
                                                           tuple[float, float] | None]:
    """``(verdict, per-seed differences, (accuracy of a at L, of b at L))`` of "a extrapolates better than
    b"."""
    diffs = _per_seed_difference(task, a, b)
    if diffs is None:
        return "not run", None, None
    train = task["settings"]["train_length"]
    at_l = (_points(task, a)[train]["accuracy"][0], _points(task, b)[train]["accuracy"][0])
    if min(at_l) < learned_threshold(task):
        return "not resolved (not learned at L)", diffs, at_l
    mean = sum(diffs) / len(diffs)
    if abs(mean) < MARGIN:
        return f"not resolved (mean difference below {MARGIN})", diffs, at_l
    sign = 1 if mean > 0 else -1
    if any(d * sign < 0 for d in diffs):
        return "not resolved (sign differs between seeds)", diffs, at_l
    equal = sum(d == 0 for d in diffs)
    word = "**holds**" if sign > 0 else "**fails**"
    return (f"{word} ({len(diffs) - equal} of {len(diffs)} seeds; equal in the other)" if equal
            else word), diffs, at_l


def claim_rows(data: dict[str, Any]) -> list[list[str]]:
    """One row per claim × task × position scheme that ran."""
    rows = []
    for claim, a, b in CLAIMS:
        for name, task in data["tasks"].items():
            for position in task["settings"]["position_embedding_types"]:
                suffix = "" if position == "rope" else "+nope"
                result, diffs, at_l = verdict(task, a + suffix, b + suffix)
                if diffs is None:
                    continue
                rows.append([claim, name, POSITIONS[position], f"`{a + suffix}` − `{b + suffix}`",
                             f"{at_l[0]:.2f} / {at_l[1]:.2f}", ", ".join(f"{d:+.2f}" for d in diffs), result])
    return rows


def claims(data: dict[str, Any]) -> str:
    """The verdict of every claim on every task and position scheme."""
    head = ["claim", "task", "position", "a − b", "accuracy at L (a / b)", "a − b beyond L, per seed",
            "verdict"]
    rules = [("lengths averaged per seed", "every evaluated length beyond L where both ran"),
             ("mean over seeds, at least (in size)", str(MARGIN)),
             ("learned at L: passkey accuracy at least", str(LEARNED))]
    for name, task in data["tasks"].items():
        if task["settings"].get("task") == "mqar":
            pairs = task["settings"]["num_kv_pairs"]
            rules.append((f"learned at L: {name} ({pairs} pairs) accuracy at least",
                          f"(1 + {elimination(pairs):.2f} by elimination) / 2 "
                          f"= {learned_threshold(task):.3f}"))
    return (markdown_table(head, claim_rows(data)) + "\n\n" + settings_table(rules) + f"\n\n*{_where(data)}*")


def reported(data: dict[str, Any]) -> str:
    """The issue author's passkey table next to this study's same series at the same multiples of L."""
    report = data.get("reported")
    task = data["tasks"].get("passkey")
    if not report or task is None:
        return "*No reported table.*"
    train = task["settings"]["train_length"]
    ratios = report["ratios"]
    head = ["model", *[f"{r}×: reported / here" for r in ratios]]
    rows = []
    for entry in report["rows"]:
        points = _points(task, entry["series"]) or {}
        cells = []
        for ratio, theirs in zip(ratios, entry["accuracy"]):
            ours = points.get(ratio * train)
            cells.append(f"{theirs:.2f} / " + (_cell(ours) if ours else "–"))
        rows.append([f"{entry['label']} (`{entry['series']}`)", *cells])
    sides = markdown_table(["", "reported", "here"],
                           [["L (training length)", str(REPORTED_TRAIN_LENGTH), str(train)],
                            ["source", report["source"],
                             f"mean ± std over seeds; {data.get('cpu') or data['machine']}, {data['date']}"]])
    return markdown_table(head, rows) + "\n\n" + sides


def _rerun(data: dict[str, Any], key: str, extra: list[tuple[str, str]]) -> str:
    """The issue author's passkey table beside a re-run of the same models (``data[key]``)."""
    report, rerun = data.get(key), data.get("reported")
    if not report or not rerun:
        return f"*No {key}.*"
    settings = report["settings"]
    train, ratios = settings["train_length"], rerun["ratios"]
    head = ["model", *[f"{r}× ({r * train}): reported / re-run" for r in ratios]]
    rows = []
    for entry in rerun["rows"]:
        points = _points({"series": report["series"]}, entry["series"])
        if points is None:
            continue
        cells = [f"{theirs:.2f} / " + _cell(points.get(ratio * train))
                 for ratio, theirs in zip(ratios, entry["accuracy"])]
        rows.append([f"{entry['label']} (`{entry['series']}`)", *cells])
    rerun_settings = settings_table([
        ("L (training length)", str(train)),
        ("steps × batch", f"{settings['max_train_steps']} × {settings['per_device_train_batch_size']}"),
        ("lr", str(settings["learning_rate"])), *extra, ("seeds", ", ".join(map(str, settings["seeds"]))),
        ("sequences per length", str(settings["eval_samples"])), ("cells", "mean ± std over seeds"),
        ("command", f"`{report['command']}`"),
        ("date, machine", f"{report.get('date', data['date'])}, {data.get('cpu') or data['machine']}"),
        ("reported", rerun["source"])])
    return markdown_table(head, rows) + "\n\n" + rerun_settings


def replication(data: dict[str, Any]) -> str:
    """The issue author's passkey table beside this package's run of the same models at the author's setting
    (``replication``: L, steps and evaluation lengths as reported)."""
    return _rerun(data, "replication", [])


def probe(data: dict[str, Any]) -> str:
    """The issue author's passkey table beside a run at the probe's full setting as issue 39 gives it
    (``probe``: also the vocabulary, no BOS, no weight decay, the FFN width)."""
    settings = (data.get("probe") or {}).get("settings") or {}
    bos = "no" if settings.get("task_bos") is False else "yes"
    decay = settings.get("weight_decay")
    return _rerun(data, "probe", [
        ("AdamW weight decay", "0.01" if decay is None else str(decay)),
        ("model", f"hidden {settings.get('hidden_size')}, {settings.get('num_hidden_layers')} layers, "
                  f"{settings.get('num_attention_heads')} heads, FFN {settings.get('intermediate_size')}"),
        ("vocabulary", f"{settings.get('task_vocab_size')} (4 special, 10 digits, the rest filler); "
                       f"BOS: {bos}"),
    ])


__all__ = ["CLAIMS", "claim_rows", "claims", "elimination", "learned_threshold", "mqar", "passkey", "probe",
           "replication", "reported", "setup", "verdict"]
