"""Views of ``peers-gpu.json`` (kind ``side_by_side``), written by ``scripts/gpu_check.sh``'s ``peers``
stage (``hf_attn_variants.bench.side_by_side``) and published per run as ``peers-gpu-<run>.json``: our FLASH
causal LM (Triton kernels and torch path) against FLASH-pytorch and a stock Llama of equal non-embedding
parameters, fwd+bwd with the same chunked causal-LM loss.

Data (besides the provenance fields and ``dry_run``): ``settings`` (``SideBySideShape``'s fields, ``rows`` as
``[batch, n]``, ``llama_layers``, ``llama_intermediate``, ``device``, ``dtype``, ``peak_tflops``,
``peak_source``, ``loss``, ``flops``), ``models`` (name → ``{gau_kernel, parameters: {total,
non_embedding}}``), ``rows`` of ``{model, gau_kernel, batch, length, tokens, status}`` with, when ``status``
is ``"ok"``, ``ms`` (median), ``times_ms``, ``tokens_per_s``, ``flops`` (a step, from the formula),
``achieved_tflops``, ``mfu`` (``None`` without a known peak), ``peak_gib`` (``None`` on CPU) and ``loss``,
else ``reason``; ``targets`` (issue 47's done-when: ``llama_sdpa`` → {n: the most our time may be, as a
multiple of Llama's}, ``flash_pytorch`` → the multiple of FLASH-pytorch's, ``peak_memory_vs_llama_at`` → n),
and ``gpu_check`` (``complete``, ``budget_s``).

Views: ``table`` (the settings, the parameters, every row with its ratios to Llama's and FLASH-pytorch's time)
and ``targets`` (per length and kernel, the done-when ratios against their targets; the lead of
docs/benchmarks-gpu.md).
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table, source_line

LLAMA, PEER = "llama_sdpa", "flash_pytorch"
OURS = ("ours_triton", "ours_torch")


def _row(data: dict[str, Any], model: str, length: int) -> dict[str, Any] | None:
    """The measured (status ok) row of ``model`` at length ``length``, or ``None``."""
    return next((r for r in data["rows"] if r["model"] == model and r["length"] == length
                 and r["status"] == "ok"), None)


def _lengths(data: dict[str, Any]) -> list[int]:
    return sorted({r["length"] for r in data["rows"]})


def _ratio(row: dict[str, Any] | None, base: dict[str, Any] | None, key: str = "ms") -> float | None:
    if row is None or base is None or row.get(key) is None or not base.get(key):
        return None
    return row[key] / base[key]


def _against(ratio: float | None, target: float | None) -> str:
    """``0.62 (≤ 0.40 ✗)``; ``–`` when either side is missing."""
    if ratio is None:
        return "–"
    if target is None:
        return f"{ratio:.2f}"
    return f"{ratio:.2f} (≤ {target:.2f} {'✓' if ratio <= target else '✗'})"


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _settings(data: dict[str, Any]) -> str:
    s = data["settings"]
    shapes = ", ".join(f"{b} × {n}" for b, n in s["rows"])
    rows = ([("dry run", "yes: on CPU (`scripts/gpu_check.sh --dry-run`), tiny models; no GPU measured")]
            if data.get("dry_run") else [])
    rows += [("device", f"{s['device']}, {s['dtype']} weights"), ("batch × n", shapes),
             ("our FLASH", f"{s['gau_layers']} GAU layers, width {s['hidden_size']}, e = {s['expansion']}d, "
                           f"key size {s['key_size']}, relu², chunk {s['chunk_size']}, causal"),
             ("Llama", f"{s['llama_layers']} layers, {s['llama_heads']} heads, MLP width "
                       f"{s['llama_intermediate']}, SDPA"),
             ("vocabulary", f"{s['vocab_size']:,}"), ("loss", s["loss"]),
             ("steps", f"median of {s['repeats']} fwd+bwd steps after {s['warmups']} warm-ups"),
             ("FLOPs", s["flops"]),
             ("MFU against", f"{s['peak_tflops']:.1f} TFLOP/s ({s['peak_source']})" if s.get("peak_tflops")
              else "no known peak for this device: no MFU")]
    rows += [(f"parameters `{name}`", f"{m['parameters']['non_embedding'] / 1e6:.2f}M outside the "
                                      f"embeddings, {m['parameters']['total'] / 1e6:.2f}M in all")
             for name, m in data["models"].items()]
    if not (data.get("gpu_check") or {}).get("complete", True):
        rows.append(("complete", "no: the stage stopped before its last row"))
    return settings_table(rows)


def table(data: dict[str, Any]) -> str:
    """The settings and parameters, then every row: median step, tokens/s, TFLOP a step, MFU, peak memory and
    the step's time as a multiple of Llama's and FLASH-pytorch's at the same shape."""
    rows = []
    for length in _lengths(data):
        llama, peer = _row(data, LLAMA, length), _row(data, PEER, length)
        for r in (r for r in data["rows"] if r["length"] == length):
            shape = f"{r['batch']} × {r['length']}"
            name = f"`{r['model']}`" + (f" (`{r['gau_kernel']}`)" if r.get("gau_kernel") else "")
            if r["status"] != "ok":
                rows.append([shape, name, f"{r['status']}: {r.get('reason', '')}", *["–"] * 6])
                continue
            mfu = "–" if r.get("mfu") is None else f"{100 * r['mfu']:.1f} %"
            rows.append([shape, name, f"{r['ms']:.1f}", f"{r['tokens_per_s']:,}",
                         f"{r['flops'] / 1e12:.2f}", mfu, _gib(r.get("peak_gib")),
                         _against(_ratio(r, llama), None) if r["model"] != LLAMA else "1",
                         _against(_ratio(r, peer), None) if r["model"] != PEER else "1"])
    body = markdown_table(["batch × n", "model", "median ms", "tokens/s", "TFLOP a step", "MFU", "peak GiB",
                           "× Llama's time", "× FLASH-pytorch's"], rows,
                          ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"])
    return "\n\n".join([_settings(data), body, source_line(data)])


def targets(data: dict[str, Any]) -> str:
    """Per length and GAU kernel: our time ÷ Llama's and ÷ FLASH-pytorch's against issue 47's targets, and
    peak memory against Llama's (✓ met, ✗ not)."""
    goals = data.get("targets") or {}
    by_length = {int(n): t for n, t in (goals.get(LLAMA) or {}).items()}
    memory_at = goals.get("peak_memory_vs_llama_at")
    rows = []
    for length in _lengths(data):
        llama, peer = _row(data, LLAMA, length), _row(data, PEER, length)
        for model in OURS:
            ours = _row(data, model, length)
            if ours is None:
                continue
            batch = ours["batch"]
            memory = _ratio(ours, llama, "peak_gib")
            memory_cell = (f"{_gib(ours.get('peak_gib'))} vs {_gib((llama or {}).get('peak_gib'))}"
                           + ("" if memory is None or length != memory_at else
                              f" ({'✓' if memory <= 1 else '✗'})"))
            rows.append([f"{batch} × {length}", f"`{ours['gau_kernel']}`", f"{ours['ms']:.1f}",
                         _against(_ratio(ours, llama), by_length.get(length)),
                         _against(_ratio(ours, peer), goals.get(PEER)), memory_cell])
    if not rows:
        return "*No row of our FLASH was measured.*"
    return markdown_table(["batch × n", "our FLASH's kernel", "median ms", "÷ Llama's time (target)",
                           "÷ FLASH-pytorch's time (target)", "peak GiB, ours vs Llama's"], rows,
                          ["---", "---", "---:", "---:", "---:", "---:"])


__all__ = ["table", "targets"]
