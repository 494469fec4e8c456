"""Views of ``docs/results/pruning-study.json``, written by ``scripts/pruning_study.py`` (docs/pruning.md, README.md):
a small entropy-invariant classifier pruned with Michel et al.'s head importance, globally and uniformly.

Data: ``total_seconds``; ``task`` (``eval_examples``, ``majority_class_accuracy``); ``train`` (``steps``,
``seconds``, ``accuracy``); ``importance`` (``examples``, ``seconds``); ``curves`` (``{key: {"title", "points":
[[heads_pruned, accuracy], …]}}``; keys ``once``, ``rescored``, ``random_mean``, ``uniform_once``);
``total_heads``; ``stop_rule`` and ``stop_rule_uniform`` (``heads_pruned``, ``accuracy``, ``kept_heads`` per layer,
``rejected_step``, for the uniform one ``restated`` and ``reloaded_accuracy``); ``half`` (``accuracy``,
``pruned_heads``, ``parameters``, ``timing``). Optional, transcribed from earlier runs: ``previous_run`` and
``earlier_timings``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line

COLUMNS = (("once", "global, scored once"), ("rescored", "global, re-scored each step"),
           ("random_mean", "random order (mean ± sd of {n})"), ("uniform_once", "uniform, scored once"))


def acc(value: float) -> str:
    """An accuracy on a few thousand examples: up to 4 decimals, trailing zeros dropped (0.9245, 0.871)."""
    return f"{value:.4f}".rstrip("0")


def _sets(kept: dict[str, list[int]], heads: int) -> str:
    def one(values: list[int]) -> str:
        if len(values) == heads:
            return "all"
        if len(values) > 4 and values == list(range(values[0], values[-1] + 1)):
            return f"{{{values[0]}, …, {values[-1]}}}"
        return "{" + ", ".join(str(v) for v in values) + "}"

    return ", ".join(one(kept[layer]) for layer in sorted(kept, key=int))


def run(data: dict[str, Any]) -> str:
    """Where the numbers come from: one run, its duration, the machine."""
    minutes = round(data["total_seconds"] / 60)
    return f"All numbers below are from one run of the script ({minutes} minutes in all).\n\n{source_line(data)}"


def task(data: dict[str, Any]) -> str:
    """The majority class of the held-out set."""
    t = data["task"]
    return f"Majority class: {100 * t['majority_class_accuracy']:.1f}% of the {t['eval_examples']:,} held-out examples."


def training(data: dict[str, Any]) -> str:
    """Training time and held-out accuracy (and the previous run's, when the file records it)."""
    t, chance = data["train"], data["task"]["majority_class_accuracy"]
    lr = f"{t['lr']:.0e}".replace("e-0", "e-")
    text = (f"Trained {t['steps']:,} steps (batch {t['batch']}, AdamW, one-cycle lr {lr}; "
            f"{t['seconds'] / 60:.1f} min): **held-out accuracy {acc(t['accuracy'])}** (chance {chance:.2f}).")
    previous = data.get("previous_run")
    if previous:
        text += (f" The previous run of the same script and seed (commit {previous['commit']}) reached "
                 f"{acc(previous['accuracy'])}; {previous['note']}")
    return text


def importance(data: dict[str, Any]) -> str:
    """How long scoring the heads took."""
    i = data["importance"]
    return (f"**Importance**: Iₕ on {i['examples']} training examples (one forward/backward each, {i['seconds']:.1f} s), "
            "per-layer ℓ2-normalised (heat-map: `docs/pruning_importance.png`).")


def curve_table(data: dict[str, Any]) -> str:
    """Accuracy vs heads pruned for every order (columns have values at different counts); the random baseline as
    mean ± sample standard deviation over its orders where the results file has the spread."""
    total = data["total_heads"]
    curves = {key: {int(h): a for h, a in data["curves"][key]["points"]} for key, _ in COLUMNS
              if key in data["curves"]}
    cells = {key: {h: f"{a:.3f}" for h, a in points.items()} for key, points in curves.items()}
    random = data["curves"].get("random_mean", {})
    if "stdev" in random:
        cells["random_mean"] = {int(h): f"{a:.3f} ± {sd:.3f}" for (h, a), sd in zip(random["points"], random["stdev"])}
    counts = sorted({h for points in curves.values() for h in points})
    n_random = random.get("orders", 3)
    titles = [title.format(n=n_random) for key, title in COLUMNS if key in curves]
    if "stdev" not in random:
        titles = [title.replace("mean ± sd", "mean") for title in titles]
    head = ["heads pruned", f"% of {total}", *titles]
    rows = [[str(h), f"{100 * h / total:.0f}", *[c.get(h, "") for c in cells.values()]] for h in counts]
    return markdown_table(head, rows, ["---:"] * len(head))


def stop_rule(data: dict[str, Any]) -> str:
    """The paper's stop rule (90% of the unpruned accuracy), global and uniform."""
    base = data["train"]["accuracy"]
    heads, total = data["heads_per_layer"], data["total_heads"]
    g, u = data["stop_rule"], data["stop_rule_uniform"]
    lines = [f"- **The paper's stop rule** (stop when accuracy < 90% of the unpruned model, i.e. < {0.9 * base:.3f}):"]
    g_kept = [len(v) for _, v in sorted(g["kept_heads"].items(), key=lambda kv: int(kv[0]))]
    lines.append(
        f"  - global, scored once: **{g['heads_pruned']} of {total} heads ({100 * g['heads_pruned'] / total:.0f}%) "
        f"pruned at accuracy {acc(g['accuracy'])}** ({100 * g['accuracy'] / base:.0f}%)"
        + (f"; the next step ({g['rejected_step']['heads_pruned']} heads, {acc(g['rejected_step']['accuracy'])}) was "
           "not applied" if g.get("rejected_step") else "")
        + f". Layers 0–{len(g_kept) - 1} keep {', '.join(str(k) for k in g_kept[:-1])} and {g_kept[-1]} heads "
        f"({_sets(g['kept_heads'], heads)})"
        + (" — a checkpoint only `pruned_heads`/`load_pruned` can describe, which vLLM cannot serve;"
           if len(set(g_kept)) > 1 else ";"))
    u_kept = sorted({len(v) for v in u["kept_heads"].values()})
    text = (f"  - uniform: **{u['heads_pruned']} of {total} heads ({100 * u['heads_pruned'] / total:.0f}%) pruned at "
            f"accuracy {acc(u['accuracy'])}** ({100 * u['accuracy'] / base:.0f}%)"
            + (f"; the next step ({u['rejected_step']['heads_pruned']} heads, {acc(u['rejected_step']['accuracy'])}) "
               "was not applied" if u.get("rejected_step") else ""))
    if len(u_kept) == 1:
        text += (f". Every layer keeps {u_kept[0]} heads ({_sets(u['kept_heads'], heads)}), so the stop rule prunes "
                 f"{u['heads_pruned'] / g['heads_pruned']:.1f}× as many heads as the global scored-once order here, "
                 "with the same head count in every layer.")
    if u.get("restated"):
        text += (f" `restate_uniform_heads` restated it (`num_attention_heads={u['num_attention_heads']}`, "
                 f"`head_dim={u['head_dim']}`, no `pruned_heads` in `config.json`); reloaded with plain "
                 f"`from_pretrained`: {acc(u['reloaded_accuracy'])}.")
    else:
        text += (" In this run `restate_uniform_heads` returned False for it, so it was saved with `pruned_heads`; "
                 f"reloaded with plain `from_pretrained`: {acc(u['reloaded_accuracy'])}.")
    lines.append(text)
    if u.get("note"):
        lines.append(f"- {u['note']}")
    return "\n".join(lines)


def half_model(data: dict[str, Any]) -> str:
    """The 50%-pruned model (global order scored once): accuracy and parameters."""
    h, base, u = data["half"], data["train"]["accuracy"], data["stop_rule_uniform"]
    layers = sorted(h["pruned_heads"].items(), key=lambda kv: int(kv[0]))
    removed = ", ".join(f"layer {layer} {'loses ' if i == 0 else ''}{{{', '.join(str(v) for v in heads)}}}"
                        for i, (layer, heads) in enumerate(layers))
    count = sum(len(v) for v in h["pruned_heads"].values())
    same = (f"; the uniform model with the same {count} heads removed has {acc(u['accuracy'])}"
            if u["heads_pruned"] == count else "")
    p = h["parameters"]
    return (f"**50%-pruned model**: the {count} lowest-importance heads (global, scored once) removed physically — "
            f"{removed}. Accuracy **{acc(h['accuracy'])}** ({100 * h['accuracy'] / base:.0f}% of the unpruned "
            f"{acc(base)}: the weakness of the scored-once order above{same}); parameters {p['unpruned']:,} → "
            f"{p['pruned_50']:,} (the same for any {count} heads: all heads have the same size, so the uniform model "
            "has the same parameters and FLOPs; its speed was not timed separately).")


def speedup(data: dict[str, Any]) -> str:
    """Forward time of the unpruned and the 50%-pruned model."""
    t = data["half"]["timing"]
    seconds = t["median_seconds"]
    ratio = t.get("speedup") or seconds["unpruned"] / seconds["pruned_50"]
    return (f"**Inference speedup at n = {t['length']}** (forward pass, batch {t['batch']} × {t['length']} tokens, eval "
            f"mode, SDPA, {t['threads']} threads; median of {t['repeats']} repetitions interleaved between the two "
            f"models, one run): unpruned {1000 * seconds['unpruned']:.1f} ms, 50%-pruned "
            f"{1000 * seconds['pruned_50']:.1f} ms — **{ratio:.2f}× faster**.")


def earlier_timings(data: dict[str, Any]) -> str:
    """Speedups measured by earlier runs of the script, and a thread-count check (transcribed; absent after a
    re-run)."""
    earlier = data.get("earlier_timings")
    if not earlier:
        return ""
    runs = earlier["speedups"]
    text = (f"The CPU was shared: the previous run of this page measured {runs[0]:.2f}×, two runs before it under "
            f"heavier load {runs[1]:.2f}× and {runs[2]:.2f}×.")
    checks = earlier.get("thread_check")
    if checks:
        parts = []
        for threads in sorted({c["threads"] for c in checks}):
            rows = [c for c in checks if c["threads"] == threads]
            times = " and ".join(f"{c['unpruned_ms']:.1f} → {c['pruned_ms']:.1f} ms" for c in rows)
            ratios = ", ".join(f"{c.get('ratio', c['unpruned_ms'] / c['pruned_ms']):.2f}×" for c in rows)
            parts.append(f"{threads} thread{'s' if threads > 1 else ''} {times} ({ratios})")
        text += (" A separate check on the previous run's two models at low load, alternating thread counts: "
                 + ", ".join(parts) + ". With one thread the speedup is the FLOP ratio; with two the halved per-head "
                 "work parallelises less well.")
    return text


def readme(data: dict[str, Any]) -> str:
    """README.md's summary of the study."""
    base, g, u = data["train"]["accuracy"], data["stop_rule"], data["stop_rule_uniform"]
    total = data["total_heads"]
    t = data["half"]["timing"]["median_seconds"]
    ratio = data["half"]["timing"].get("speedup") or t["unpruned"] / t["pruned_50"]
    return (f"On a small entropy-invariant classifier, uniform pruning removed {100 * u['heads_pruned'] / total:.0f} % of "
            f"the heads at {100 * u['accuracy'] / base:.0f} % of the original accuracy (the paper's stop rule); the "
            f"global order scored once stopped at {100 * g['heads_pruned'] / total:.0f} %. "
            f"Removing half its heads made this classifier (hidden 64, 4 × 8 heads) {ratio:.2f}× faster at n = "
            f"{data['half']['timing']['length']} on CPU ([docs/pruning.md](docs/pruning.md); `make bench` times the "
            "same cut on its hidden-256 model).")
