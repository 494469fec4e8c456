"""Views of ``docs/results/decoding-cpu.json``, written by ``scripts/decoding_bench.py``
(``bench/decoding.py``): ``generate`` tokens per second of each family's causal LM against a stock Llama of
equal parameters.

Data: ``settings`` (``batches``, ``contexts``, ``new_tokens``, ``size``, ``threads``; on a GPU also
``device``, e.g. ``"NVIDIA H100 80GB HBM3"``, ``dtype`` (else float32 on CPU), ``excluded``: model → why it
was not timed, and from the second GPU run ``caches`` (cache → how it ran) and ``sdpa_backends``), ``models``
(name → description), ``rows`` of ``{model, cache, batch, context, parameters, prefill_s, step_ms, steps,
tokens_per_s}`` (``cache`` absent: ``"dynamic"``), and from ``scripts/gpu_check.sh``'s second GPU run
``not_measured`` (``[{model, cache, reason}]``) and ``profiles`` (name → ``bench.decoding.profile_generate``).
``decoding-gpu-<run>.json`` files are written by ``scripts/gpu_check.sh`` and published per run.

Views: ``table`` (tokens/s per model, batch and context, per cache), ``profiles`` (where a decoding step goes)
and ``fastest`` (per batch and context, the fastest model and cache).
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table, source_line

BASELINE = "llama"


def _cache(row: dict[str, Any]) -> str:
    return row.get("cache", "dynamic")


def _row(data: dict[str, Any], model: str, batch: int, context: int,
         cache: str = "dynamic") -> dict[str, Any] | None:
    wanted = (model, batch, context, cache)
    return next((r for r in data["rows"]
                 if (r["model"], r["batch"], r["context"], _cache(r)) == wanted), None)


def _cell(row: dict[str, Any], base: dict[str, Any] | None, model: str) -> str:
    ratio = ("" if model == BASELINE or base is None
             else f" ({row['tokens_per_s'] / base['tokens_per_s']:.2f}×)")
    return f"{row['tokens_per_s']:.0f} tok/s{ratio}, {row['step_ms']:.1f} ms"


def table(data: dict[str, Any]) -> str:
    """The settings (new tokens, dtype, threads or device, models not timed), then tokens/s and median
    decoding step per model × batch × context, the ratio to the Llama's tokens/s, and each model's growth of
    the step from the shortest to the longest context."""
    settings = data["settings"]
    batches, contexts = settings["batches"], settings["contexts"]
    head = ["model", "non-embedding parameters",
            *[f"batch {b}, context {c}" for b in batches for c in contexts],
            f"step growth {min(contexts)} → {max(contexts)} (batch {', '.join(map(str, batches))})"]
    rows = []
    for model, description in data["models"].items():
        cells, growth = [], []
        for batch in batches:
            for context in contexts:
                row, base = _row(data, model, batch, context), _row(data, BASELINE, batch, context)
                cells.append("–" if row is None else _cell(row, base, model))
            short, long = _row(data, model, batch, min(contexts)), _row(data, model, batch, max(contexts))
            if short and long:
                growth.append(f"{long['step_ms'] / short['step_ms']:.2f}×")
        parameters = next((r["parameters"] for r in data["rows"] if r["model"] == model), 0)
        rows.append([f"`{model}`: {description}", f"{parameters / 1e6:.2f}M", *cells,
                     ", ".join(growth) or "–"])
    body = markdown_table(head, rows, ["---", "---:", *["---:"] * (len(head) - 2)])
    where = (("device", settings["device"]) if settings.get("device", "cpu") != "cpu"
             else ("threads", str(settings["threads"])))
    rows_of_settings = [("new tokens (greedy `generate`)", str(settings["new_tokens"])),
                        ("dtype", settings.get("dtype", "float32")), where]
    if where[0] == "device":
        backends = settings.get("sdpa_backends")
        allowed = ", ".join(backends) if backends else (
            "torch's own order: on sm90 with cuDNN ≥ 9.15, cuDNN's first, whose plan for each new key length "
            "is the likely cost of slow dynamic-cache steps")
        rows_of_settings.append(("SDPA kernels allowed", allowed))
    rows_of_settings += [(f"cache `{cache}`", how) for cache, how in (settings.get("caches") or {}).items()]
    rows_of_settings += [(f"not timed: `{model}`", reason)
                         for model, reason in (settings.get("excluded") or {}).items()]
    rows_of_settings += [(f"not timed: `{entry['model']}` with the {entry['cache']} cache", entry["reason"])
                         for entry in data.get("not_measured") or []]
    check = data.get("gpu_check") or {}
    rows_of_settings += [(f"not timed: `{model}`", "not run: the GPU check's decoding budget")
                         for model in check.get("skipped") or []]
    rows_of_settings += [("failed", failure) for failure in check.get("failed") or []]
    if check.get("interrupted"):
        rows_of_settings.append(("stopped", check["interrupted"]))
    parts = [settings_table(rows_of_settings), f"Dynamic cache:\n\n{body}" if _static(data) else body]
    if _static(data):
        parts.append(f"Static cache{', compiled' if where[0] == 'device' else ''}:\n\n{_static_table(data)}")
    return "\n\n".join([*parts, source_line(data)])


def _static(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in data["rows"] if _cache(r) == "static"]


def _static_table(data: dict[str, Any]) -> str:
    """Tokens/s and median step of the static cache's rows (ratio to the Llama's static row)."""
    rows = []
    for row in _static(data):
        base = _row(data, BASELINE, row["batch"], row["context"], "static")
        rows.append([f"`{row['model']}`", str(row["batch"]), str(row["context"]),
                     _cell(row, base, row["model"])])
    return markdown_table(["model", "batch", "context", "tokens/s (× Llama's), median step"], rows,
                          ["---", "---:", "---:", "---:"])


def profiles(data: dict[str, Any]) -> str:
    """Per profiled model: the time of a decoding step, how much of it the GPU worked, and the operator
    calls, kernel launches and host syncs per step, then its top kernels and CPU operators."""
    found = data.get("profiles") or {}
    if not found:
        return "*This run recorded no profiles.*"
    rows = [[f"`{name}`", f"batch {p['batch']}, context {p['context']}", f"{p['wall_ms_per_step']:.1f}",
             f"{p['gpu_ms_per_step']:.2f}", f"{p['cpu_ops_per_step']:.0f}", f"{p['launches_per_step']:.0f}",
             f"{p['syncs_per_step']:.1f}"]
            for name, p in found.items()]
    parts = [markdown_table(["profile", "generate", "ms a step (profiled)", "GPU ms a step", "aten calls",
                             "kernel launches", "host syncs"], rows,
                            ["---", "---", "---:", "---:", "---:", "---:", "---:"])]
    top = [[f"`{name}`", "; ".join(f"`{k['name'][:60]}` {k['ms']:.1f} ms ×{k['calls']}"
                                   for k in p["top_kernels"][:3]) or "–",
            "; ".join(f"`{c['name'][:50]}` {c['self_ms']:.1f} ms ×{c['calls']}" for c in p["top_cpu"][:3])]
           for name, p in found.items()]
    parts.append(markdown_table(["profile", "top kernels (GPU time, calls)", "top CPU operators (self time, "
                                                                              "calls)"], top))
    return "\n\n".join([*parts, source_line(data)])


def fastest(data: dict[str, Any]) -> str:
    """Per batch and context: the model and cache with the most tokens/s, and the Llama's with the same
    cache."""
    keys = sorted({(r["batch"], r["context"]) for r in data["rows"]})
    rows = []
    for batch, context in keys:
        candidates = [r for r in data["rows"] if (r["batch"], r["context"]) == (batch, context)]
        best = max(candidates, key=lambda r: r["tokens_per_s"])
        base = _row(data, BASELINE, batch, context, _cache(best))
        rows.append([str(batch), str(context), f"`{best['model']}`, {_cache(best)} cache",
                     f"{best['tokens_per_s']:.0f} ({best['step_ms']:.1f} ms a step)",
                     "–" if base is None else f"{base['tokens_per_s']:.0f} ({base['step_ms']:.1f} ms)"])
    return markdown_table(["batch", "context", "fastest decoder", "tokens/s", "stock Llama, same cache"],
                          rows, ["---:", "---:", "---", "---:", "---:"])


__all__ = ["fastest", "profiles", "table"]
