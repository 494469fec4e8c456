"""Views of ``docs/results/gau-serving-cpu.json``, written by ``scripts/gau_serving_bench.py publish``
(docs/serving.md): FLASH served natively by vLLM, against this package's ``generate`` and a stock Llama of
about the same size in vLLM.

Data: ``settings`` (new tokens, the memory engines' KV-cache budget, torch threads, parameter counts),
``throughput`` rows ``{engine, context, batch, seconds, tokens_per_s}`` (one timed ``generate`` call, prefill
included) and ``memory`` rows ``{model, context, kv_cache_tokens, request_tokens, concurrency,
bytes_per_sequence}`` (what vLLM printed, and the budget divided by its concurrency).
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line

ENGINES = {"flash_vllm": "FLASH, vLLM (native)", "flash_generate": "FLASH, Transformers `generate`",
           "llama_vllm": "Llama, vLLM"}


def throughput(data: dict[str, Any]) -> str:
    """Generated tokens per second per context and batch, one column per engine, and the source line."""
    by_key = {(r["engine"], r["context"], r["batch"]): r for r in data["throughput"]}
    settings = sorted({(r["context"], r["batch"]) for r in data["throughput"]}, key=lambda cb: (cb[1], cb[0]))
    rows = []
    for context, batch in settings:
        cells = []
        for engine in ENGINES:
            row = by_key.get((engine, context, batch))
            cells.append(f"{row['tokens_per_s']:.0f}" if row else "–")
        rows.append([f"{batch}", f"{context:,}", *cells])
    params = data["settings"]["parameters"]
    head = ["batch", "context", *[f"{name}: tokens/s" for name in ENGINES.values()]]
    body = markdown_table(head, rows, ["---:", "---:", "---:", "---:", "---:"])
    settings = data["settings"]
    note = (f"FLASH {params['flash'] / 1e6:.2f} M parameters, Llama {params['llama'] / 1e6:.2f} M; "
            f"{settings['new_tokens']} new tokens per prompt, prefill included, the best of "
            f"{settings.get('repeats', 1)} timed calls after a warm-up; {settings['torch_threads']} torch "
            "thread(s).")
    return f"{body}\n\n{note}\n\n{source_line(data)}"


def memory(data: dict[str, Any]) -> str:
    """What vLLM printed for each model and context ("KV cache size: N tokens, Maximum concurrency for L
    tokens per request: X") and the budget divided by X: what it reserves per sequence."""
    rows = [[row["model"], f"{row['context']:,}", f"{row['kv_cache_tokens']:,.0f}",
             f"{row['concurrency']:g}×", f"{row['bytes_per_sequence'] / 2**20:.2f} MiB"]
            for row in data["memory"] if row.get("bytes_per_sequence")]
    head = ["model", "context", "vLLM: \"KV cache size\" (tokens)", "vLLM: \"Maximum concurrency\"",
            "per sequence"]
    body = markdown_table(head, rows, ["---", "---:", "---:", "---:", "---:"])
    budget = data["settings"]["memory_budget_bytes"] / 2**20
    new_tokens = data["settings"]["new_tokens"]
    return (f"{body}\n\nA KV-cache budget of {budget:g} MiB; requests of context + {new_tokens} tokens; per "
            "sequence = the budget ÷ the maximum concurrency.\n\n"
            f"{source_line(data)}")
