"""Views of ``docs/results/pruning-study.json``, written by ``scripts/pruning_study.py`` (docs/pruning.md): a
small entropy-invariant classifier pruned with Michel et al.'s head importance, globally and
uniformly.

Data: ``total_seconds``; ``task`` (``eval_examples``, ``majority_class_accuracy``); ``train`` (``steps``,
``seconds``, ``accuracy``); ``importance`` (``examples``, ``seconds``); ``curves`` (``{key: {"title",
"points": [[heads_pruned, accuracy], …]}}``; keys ``once``, ``rescored``, ``random_mean``, ``uniform_once``);
``total_heads``; ``stop_rule`` and ``stop_rule_uniform`` (``heads_pruned``, ``accuracy``, ``kept_heads`` per
layer, ``rejected_step``, for the uniform one ``restated`` and ``reloaded_accuracy``); ``half`` (``accuracy``,
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
    """Where the numbers come from: the source line of the one run."""
    return source_line(data)


def run_minutes(data: dict[str, Any]) -> str:
    """How long the whole run of the script took (one figure)."""
    return f"{round(data['total_seconds'] / 60)} minutes"


def majority(data: dict[str, Any]) -> str:
    """The majority class's share of the held-out set (one figure)."""
    return f"{100 * data['task']['majority_class_accuracy']:.1f}%"


def eval_examples(data: dict[str, Any]) -> str:
    """How many held-out examples every accuracy is measured on (one figure)."""
    return f"{data['task']['eval_examples']:,}"


def training(data: dict[str, Any]) -> str:
    """Training (steps, batch, learning rate, time) and the held-out accuracy against chance; the previous
    run's accuracy when the file records it."""
    t, chance = data["train"], data["task"]["majority_class_accuracy"]
    lr = f"{t['lr']:.0e}".replace("e-0", "e-")
    head = ["run", "steps", "batch", "one-cycle lr (AdamW)", "minutes", "held-out accuracy", "chance"]
    rows = [["this one", f"{t['steps']:,}", str(t["batch"]), lr, f"{t['seconds'] / 60:.1f}",
             f"**{acc(t['accuracy'])}**", f"{chance:.2f}"]]
    previous = data.get("previous_run")
    if previous:
        rows.append([f"the previous one (commit {previous['commit']}; {previous['note']})", "", "", "", "",
                     acc(previous["accuracy"]), ""])
    return markdown_table(head, rows, ["---", *["---:"] * (len(head) - 1)])


def importance_examples(data: dict[str, Any]) -> str:
    """How many training examples the head importance is scored on (one figure)."""
    return str(data["importance"]["examples"])


def importance_seconds(data: dict[str, Any]) -> str:
    """How long scoring the heads took (one figure)."""
    return f"{data['importance']['seconds']:.1f} s"


def curve_table(data: dict[str, Any]) -> str:
    """Accuracy vs heads pruned for every order (columns have values at different counts); the random baseline
    as mean ± sample standard deviation over its orders where the results file has the spread."""
    total = data["total_heads"]
    curves = {key: {int(h): a for h, a in data["curves"][key]["points"]} for key, _ in COLUMNS
              if key in data["curves"]}
    cells = {key: {h: f"{a:.3f}" for h, a in points.items()} for key, points in curves.items()}
    random = data["curves"].get("random_mean", {})
    if "stdev" in random:
        cells["random_mean"] = {int(h): f"{a:.3f} ± {sd:.3f}"
                                for (h, a), sd in zip(random["points"], random["stdev"])}
    counts = sorted({h for points in curves.values() for h in points})
    n_random = random.get("orders", 3)
    titles = [title.format(n=n_random) for key, title in COLUMNS if key in curves]
    if "stdev" not in random:
        titles = [title.replace("mean ± sd", "mean") for title in titles]
    head = ["heads pruned", f"% of {total}", *titles]
    rows = [[str(h), f"{100 * h / total:.0f}", *[c.get(h, "") for c in cells.values()]] for h in counts]
    return markdown_table(head, rows, ["---:"] * len(head))


def stop_threshold(data: dict[str, Any]) -> str:
    """The paper's stop rule as an accuracy: 90% of the unpruned model's (one figure)."""
    return f"{0.9 * data['train']['accuracy']:.3f}"


def _kept(kept: dict[str, list[int]], heads: int) -> str:
    """Heads each layer keeps, with the sets: ``"5, 4, 6, 6 ({0, 1, 4, 6, 7}, …)"``."""
    counts = [len(v) for _, v in sorted(kept.items(), key=lambda kv: int(kv[0]))]
    return f"{', '.join(str(c) for c in counts)} ({_sets(kept, heads)})"


def stop_rule(data: dict[str, Any]) -> str:
    """The paper's stop rule (90% of the unpruned accuracy), global and uniform: heads pruned, accuracy, the
    step that was not applied, the heads every layer keeps, and how the uniform model was saved and
    reloaded."""
    base, heads, total = data["train"]["accuracy"], data["heads_per_layer"], data["total_heads"]
    rows = []
    for name, rule in (("global, scored once", data["stop_rule"]), ("uniform", data["stop_rule_uniform"])):
        rejected = rule.get("rejected_step")
        rows.append([name,
                     f"**{rule['heads_pruned']} of {total} ({100 * rule['heads_pruned'] / total:.0f}%)**",
                     f"**{acc(rule['accuracy'])}** ({100 * rule['accuracy'] / base:.0f}%)",
                     f"{rejected['heads_pruned']} heads, {acc(rejected['accuracy'])}" if rejected else "–",
                     _kept(rule["kept_heads"], heads)])
    head = ["order", "heads pruned", "accuracy (of the unpruned)", "next step, not applied",
            "heads kept per layer (layers 0, 1, …)"]
    u = data["stop_rule_uniform"]
    saved = ("restated by `restate_uniform_heads` (`num_attention_heads`, `head_dim`; no `pruned_heads` in "
             "`config.json`)" if u.get("restated") else
             "saved with `pruned_heads` (`restate_uniform_heads` returned False)")
    reload = [[f"the uniform model, {saved}", f"`num_attention_heads={u['num_attention_heads']}`, "
               f"`head_dim={u['head_dim']}`" if u.get("restated") else "–",
               f"reloaded with plain `from_pretrained`: {acc(u['reloaded_accuracy'])}"]]
    return (markdown_table(head, rows, ["---", "---:", "---:", "---:", "---"]) + "\n\n"
            + markdown_table(["checkpoint", "config", "accuracy"], reload))


def half_model(data: dict[str, Any]) -> str:
    """The 50%-pruned model (global order scored once) against the unpruned one: heads removed per layer,
    accuracy, parameters."""
    h, base = data["half"], data["train"]["accuracy"]
    layers = sorted(h["pruned_heads"].items(), key=lambda kv: int(kv[0]))
    removed = "; ".join(f"{layer}: {{{', '.join(str(v) for v in heads)}}}" for layer, heads in layers)
    count = sum(len(v) for v in h["pruned_heads"].values())
    p = h["parameters"]
    rows = [["unpruned", "–", acc(base), f"{p['unpruned']:,}"],
            [f"{count} lowest-importance heads removed", removed,
             f"**{acc(h['accuracy'])}** ({100 * h['accuracy'] / base:.0f}%)", f"{p['pruned_50']:,}"]]
    u = data["stop_rule_uniform"]
    if u["heads_pruned"] == count:
        rows.append([f"uniform, {count} heads removed", "–", acc(u["accuracy"]), f"{p['pruned_50']:,}"])
    return markdown_table(["model", "heads removed (layer: heads)", "accuracy", "parameters"], rows,
                          ["---", "---", "---:", "---:"])


def speedup(data: dict[str, Any]) -> str:
    """Median forward time of the unpruned and the 50%-pruned model, and their ratio."""
    t = data["half"]["timing"]
    seconds = t["median_seconds"]
    ratio = t.get("speedup") or seconds["unpruned"] / seconds["pruned_50"]
    rows = [["unpruned", f"{1000 * seconds['unpruned']:.1f} ms", ""],
            ["50%-pruned", f"{1000 * seconds['pruned_50']:.1f} ms", f"**{ratio:.2f}× faster**"]]
    return markdown_table(["model", "forward pass (median)", "speedup"], rows, ["---", "---:", "---:"])


def timing_setup(data: dict[str, Any]) -> str:
    """The timing's settings: batch × length, threads, repetitions (one figure)."""
    t = data["half"]["timing"]
    return (f"batch {t['batch']} × {t['length']} tokens, {t['threads']} threads, median of {t['repeats']} "
            "repetitions")


def timing_length(data: dict[str, Any]) -> str:
    """The sequence length of the timing (one figure)."""
    return str(data["half"]["timing"]["length"])


def earlier_timings(data: dict[str, Any]) -> str:
    """Speedups measured by earlier runs of the script, and a thread-count check (transcribed; ``""`` after a
    re-run, which has none)."""
    earlier = data.get("earlier_timings")
    if not earlier:
        return ""
    rows = [[f"earlier run {i + 1}", "", f"{ratio:.2f}×"] for i, ratio in enumerate(earlier["speedups"])]
    for check in earlier.get("thread_check") or []:
        ratio = check.get("ratio", check["unpruned_ms"] / check["pruned_ms"])
        rows.append([f"thread check, {check['threads']} thread{'s' if check['threads'] > 1 else ''}",
                     f"{check['unpruned_ms']:.1f} → {check['pruned_ms']:.1f} ms", f"{ratio:.2f}×"])
    return markdown_table(["run", "forward pass, unpruned → 50%-pruned", "speedup"], rows,
                          ["---", "---:", "---:"])
