"""Views of ``docs/results/decoding-cpu.json``, written by ``scripts/decoding_bench.py``
(``bench/decoding.py``): ``generate`` tokens per second of each family's causal LM against a stock Llama of
equal parameters.

Data: ``settings`` (``batches``, ``contexts``, ``new_tokens``, ``size``, ``threads``; on a GPU also
``device``, e.g. ``"NVIDIA H100 80GB HBM3"``, ``dtype`` (else float32 on CPU) and ``excluded``: model → why it
was not timed), ``models`` (name → description), ``rows`` of ``{model, batch, context, parameters, prefill_s,
step_ms, steps, tokens_per_s}``. ``decoding-gpu.json`` is written
by ``scripts/gpu_check.sh``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table, source_line

BASELINE = "llama"


def _row(data: dict[str, Any], model: str, batch: int, context: int) -> dict[str, Any] | None:
    return next((r for r in data["rows"]
                 if (r["model"], r["batch"], r["context"]) == (model, batch, context)), None)


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
                if row is None:
                    cells.append("–")
                    continue
                ratio = ("" if model == BASELINE or base is None
                         else f" ({row['tokens_per_s'] / base['tokens_per_s']:.2f}×)")
                cells.append(f"{row['tokens_per_s']:.0f} tok/s{ratio}, {row['step_ms']:.1f} ms")
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
    rows_of_settings += [(f"not timed: `{model}`", reason)
                         for model, reason in (settings.get("excluded") or {}).items()]
    return f"{settings_table(rows_of_settings)}\n\n{body}\n\n{source_line(data)}"


__all__ = ["table"]
