"""Views of ``docs/results/memory-estimates.json``, written by ``scripts/memory_estimates.py``.

Per-GPU training-memory *estimates* (computed from exact parameter counts and per-layer activation counts,
checked against autograd traces on the meta device) for GAU-α base and a ~1B entropy-invariant decoder;
rendered into docs/scaling_memory.md (the full tables) and docs/scaling.md (the summary). Bytes in the file,
GiB / GB / MiB in the views.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table

GiB = 1024**3
GB = 1000**3
MiB = 2**20

SUMMARY_LAYOUTS = (
    ("single", "1 GPU"),
    ("fsdp8", "FSDP2 × 8 (1 node)"),
    ("tp8", "TP = 8 (1 node)"),
    ("tp2_fsdp4", "TP 2 × FSDP2 4 (1 node)"),
    ("hsdp2x8", "HSDP 2 nodes × 8"),
)
"""The layouts of docs/scaling.md's summary table, with the short names it uses."""
SHORT_MODEL_NAMES = {"gau-alpha": "GAU-α base", "ei-1b": "EI ~1B"}


def _gib(value: float) -> str:
    return f"{value / GiB:.2f}"


def _models(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {model["key"]: model for model in data["models"]}


def _estimates(data: dict[str, Any], model: str, seq_len: int) -> list[dict[str, Any]]:
    return [e for e in data["estimates_bytes"] if e["model"] == model and e["seq_len"] == seq_len]


def generated_by(data: dict[str, Any]) -> str:
    """The table under the title of docs/scaling_memory.md: the command, its date and versions, and the
    results file."""
    versions = data.get("versions") or {}
    return settings_table([("script", "`scripts/memory_estimates.py`"), ("command", f"`{data['command']}`"),
                           ("date", data["date"]), ("torch", str(versions.get("torch"))),
                           ("transformers", str(versions.get("transformers"))),
                           ("results file", "`docs/results/memory-estimates.json`")])


def models(data: dict[str, Any]) -> str:
    """The exact shapes and parameter counts of the two models: one column per model."""
    rows: list[list[str]] = [["shape"], ["parameters (exact, meta-device class)"], ["layers × per layer"],
                             ["embeddings / head / final norm"], ["TP plan"], ["split across TP ranks"],
                             ["replicated"], ["fp32 params + grads + AdamW (16 B each), unsharded"],
                             ["training setting"]]
    for m in data["models"]:
        total = m["parameters"]
        cells = [m["shape"], f"**{total:,}** (`{m['class']}`)",
                 f"{m['num_layers']} × {m['parameters_per_layer']:,}", f"{m['parameters_root']:,}",
                 m["tp_plan_source"], f"{m['parameters_tp_split']:,}", f"{m['parameters_tp_replicated']:,}",
                 f"{16 * total / GB:.2f} GB = {16 * total / GiB:.2f} GiB", m["training_setting"]]
        for row, cell in zip(rows, cells):
            row.append(cell)
    return markdown_table(["", *[f"**{m['title']}**" for m in data["models"]]], rows)


def layer_activations(data: dict[str, Any]) -> str:
    """Formula vs trace of one layer's saved bytes per token, and the traced loss buffers."""
    rows = []
    for a in data["layer_activations"]:
        trace = (f"{a['traced']:,.0f} | {100 * a['relative_error']:.2f} %" if a["traced"] is not None
                 else "not traced | –")
        mib = " / ".join(f"{value:,.0f}" for _, value in a["mib_per_layer_tp"])
        tps = " / ".join(str(tp) for tp, _ in a["mib_per_layer_tp"])
        rows.append(f"| {a['model']} | {a['seq_len']} | {a['path']} | {a['replicated']:,.0f} | "
                    f"{a['sharded']:,.0f} | {a['quadratic']:,.0f} | {a['formula']:,.0f} | {trace} | {mib} |")
    tps = " / ".join(str(tp) for tp, _ in data["layer_activations"][0]["mib_per_layer_tp"])
    lines = [
        (f"| model | n | path | replicated | ÷ TP | ∝ n | formula total | traced | diff "
         f"| MiB per layer and sequence, TP = {tps} |"),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    loss = data.get("loss_trace")
    if loss:
        lines += [
            "",
            markdown_table(["loss buffers, B per logit", "traced", "formula"],
                           [["kept after forward", f"{loss['kept_after_forward']:.2f}",
                             str(loss["formula_kept"])],
                            ["at the peak in backward", f"{loss['peak_in_backward']:.2f}",
                             str(loss["formula_peak"])]],
                           ["---", "---:", "---:"]),
        ]
    return "\n".join(lines)


def estimate_tables(data: dict[str, Any]) -> str:
    """One table per model × length (its first header cell names them and the micro-batch b): every component
    per GPU and layout, GiB per GPU."""
    lines: list[str] = []
    for m in data["models"]:
        for n in data["seq_lens"]:
            rows = _estimates(data, m["key"], n)
            if not rows:
                continue
            lines += [
                (f"| {m['title']}, n = {n}, b = {rows[0]['micro_batch']}: layout "
                 "| GPUs | seqs/step | params fp32 | grads fp32 | AdamW | FSDP bufs | act. layers "
                 "(no ckpt / ckpt) | other | logits | **total no ckpt** GiB (GB) | **total ckpt** GiB (GB) | "
                 f"+/sample | max b within {data['budget_gib']:g} GiB |"),
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for e in rows:
                lines.append(
                    f"| {e['layout_title']} | {e['gpus']} | {e['sequences_per_step']} | "
                    f"{_gib(e['params'])} | {_gib(e['grads'])} | {_gib(e['adam'])} | "
                    f"{_gib(e['fsdp_buffers'])} | "
                    f"{_gib(e['layers_full'])} / {_gib(e['layers_ckpt'])} | {_gib(e['other'])} | "
                    f"{_gib(e['logits_peak'])} | **{_gib(e['total_full'])}** ({e['total_full'] / GB:.1f}) | "
                    f"**{_gib(e['total_ckpt'])}** ({e['total_ckpt'] / GB:.1f}) | "
                    f"{_gib(e['per_sample_full'])} / {_gib(e['per_sample_ckpt'])} | "
                    f"{e['max_micro_batch_full']} / {e['max_micro_batch_ckpt']} |"
                )
            lines.append("")
    return "\n".join(lines)


def autocast(data: dict[str, Any]) -> str:
    """The torch.autocast alternative: traced per-layer bytes, then the per-GPU table (GiB per GPU)."""
    traced = markdown_table(
        ["model", "autocast, B/token", "bf16 weight copies, MiB per layer", "MixedPrecisionPolicy, B/token"],
        [[a["model"], f"{a['per_token']:,.0f}", f"{a['per_layer'] / MiB:,.1f}",
          f"{a['policy_per_token']:,.0f}"] for a in data["autocast_layers"]],
        ["---", "---:", "---:", "---:"])
    lines = [
        traced,
        "",
        ("| model | n | layout | FSDP bufs (fp32) | bf16 weight copies | act. layers (no ckpt / ckpt) "
         "| **total no ckpt** | **total ckpt** | MixedPrecisionPolicy (no ckpt / ckpt) |"),
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for a in data["autocast_estimates_bytes"]:
        lines.append(
            f"| {a['model']} | {a['seq_len']} | {a['layout_title']} | {_gib(a['fsdp_buffers'])} | "
            f"{_gib(a['weight_casts'])} | {_gib(a['layers_full'])} / {_gib(a['layers_ckpt'])} | "
            f"**{_gib(a['total_full'])}** | **{_gib(a['total_ckpt'])}** | {_gib(a['policy_total_full'])} / "
            f"{_gib(a['policy_total_ckpt'])} |"
        )
    return "\n".join(lines)


def variants(data: dict[str, Any]) -> str:
    """Saved MiB per layer and sequence of each attention variant (TP = 1), one table per model (its first
    header cell names the model)."""
    tables = []
    for block in data["attention_variants"]:
        lengths = [n for n, _ in block["rows"][0]["mib_per_layer"]]
        tables.append(markdown_table([f"{block['model']}: variant", "source", *[f"n = {n}" for n in lengths]],
                                     [[row["variant"], row["source"],
                                       *[f"{v:,.0f}" for _, v in row["mib_per_layer"]]]
                                      for row in block["rows"]],
                                     ["---", "---", *["---:"] * len(lengths)]))
    return "\n\n".join(tables)


def scaling_summary(data: dict[str, Any]) -> str:
    """docs/scaling.md's table (total GiB per GPU without / with checkpointing), the models' sizes and the
    notes' figures (an untied LM head, the decoder's logits at the longest length), as tables."""
    models_by_key = _models(data)
    columns = [(key, n) for key in models_by_key for n in data["seq_lens"]]
    by_cell = {(e["model"], e["seq_len"], e["layout"]): e for e in data["estimates_bytes"]}
    footnote = "¹"
    rows = []
    for layout, name in SUMMARY_LAYOUTS:
        cells = []
        for key, n in columns:
            e = by_cell.get((key, n, layout))
            if e is None:
                cells.append("–")
                continue
            mark = f" {footnote}" if layout == "tp2_fsdp4" and key == "ei-1b" else ""
            cells.append(f"{_gib(e['total_full'])} / {_gib(e['total_ckpt'])}{mark}")
        rows.append([name, *cells])
    head = ["layout", *[f"{SHORT_MODEL_NAMES.get(key, key)}, n = {n}" for key, n in columns]]
    table = markdown_table(head, rows)
    shapes = []
    for key, m in models_by_key.items():
        count = (f"{m['parameters'] / 1e6:.1f} M" if m["parameters"] < 1e9
                 else f"{m['parameters'] / 1e9:.3f} B")
        shapes.append([SHORT_MODEL_NAMES.get(key, key), count, m["summary"]])
    parts = [table, markdown_table(["model", "parameters", "shape"], shapes, ["---", "---:", "---"])]
    if "ei-1b" in models_by_key:
        notes = [[f"{footnote} untying the LM head (required for TP × FSDP2) adds per GPU",
                  f"+ {untied_head_gb(data):.2f} GB"]]
        longest = max(data["seq_lens"])
        peak = [e for e in _estimates(data, "ei-1b", longest) if e["layout"] == "single"]
        if peak:
            notes.append([f"{SHORT_MODEL_NAMES['ei-1b']} logits at the peak of the loss, n = {longest}",
                          f"{peak[0]['logits_peak'] / GiB:.1f} GiB"])
        parts.append(markdown_table(["note", "value"], notes, ["---", "---:"]))
    return "\n\n".join(parts)


def untied_head_gb(data: dict[str, Any], gpus: int = 8) -> float:
    """GB per GPU that untying the ~1B decoder's LM head adds: 16 B (fp32 weight, gradient, AdamW) × V·d /
    GPUs."""
    ei = _models(data)["ei-1b"]
    return 16 * ei["vocab_size"] * ei["hidden_size"] / gpus / GB


def untied_head_cost(data: dict[str, Any]) -> str:
    """What an untied LM head adds to the ~1B decoder: parameters, and fp32 weights, gradients and AdamW
    states per GPU over 8 GPUs."""
    ei = _models(data)["ei-1b"]
    rows = [["~1B decoder", f"{ei['vocab_size'] * ei['hidden_size'] / 1e6:.1f} M",
             f"+{untied_head_gb(data):.2f} GB"]]
    return markdown_table(["model", "parameters untying adds", "per GPU over 8 GPUs (fp32 + grads + AdamW)"],
                          rows,
                          ["---", "---:", "---:"])


def tp_activation_ratio(data: dict[str, Any]) -> str:
    """How much TP = 8 divides each model's per-layer activations (at the shortest length)."""
    n = min(data["seq_lens"])
    ratios = {a["model"]: a["formula"] / (a["replicated"] + a["sharded"] / 8 + a["quadratic"])
              for a in data["layer_activations"] if a["seq_len"] == n}
    rows = [[SHORT_MODEL_NAMES.get(model, model), f"{ratio:.2f}×"] for model, ratio in ratios.items()]
    return markdown_table(["model", f"per-layer activations ÷ TP = 8 (n = {n})"], rows, ["---", "---:"])
