"""Views of ``docs/results/serving-cpu.json``, written by ``scripts/serving_bench.py publish``
(docs/serving.md): vLLM's Transformers backend against Transformers' ``generate`` on the same model folder.

Data: ``settings`` (prompt / new tokens, repeats), ``engine_start_s`` (vLLM's ``LLM(...)``), ``rows`` of
``{engine, batch, seconds[, tokens_per_s]}`` (median wall seconds of one ``generate`` call of ``batch``
prompts), optionally ``earlier_runs`` (tokens per second of earlier runs under other load, for the fragility
note) and ``vllm_environment`` (the size and build time of the test suite's vLLM environment, and where they
come from).
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line

ENGINES = {"vllm": "vLLM", "transformers": "Transformers `generate`"}


def _tokens_per_s(row: dict[str, Any], new_tokens: int) -> float:
    return row.get("tokens_per_s") or row["batch"] * new_tokens / row["seconds"]


def table(data: dict[str, Any]) -> str:
    """Engine start and generation speed per batch size, vLLM ÷ Transformers, and the source line."""
    new_tokens = data["settings"]["new_tokens"]
    by_key = {(r["engine"], r["batch"]): r for r in data["rows"]}
    batches = sorted({r["batch"] for r in data["rows"]})
    rows = [["engine start (`LLM(...)`, model load, KV-cache allocation, warm-up)",
             f"{data['engine_start_s']:.1f} s",
             "—", ""]]
    for batch in batches:
        cells = []
        for engine in ENGINES:
            row = by_key.get((engine, batch))
            cells.append(f"{row['seconds']:.2f} s = **{_tokens_per_s(row, new_tokens):.0f} tokens/s**" if row
                         else "–")
        vllm, hf = by_key.get(("vllm", batch)), by_key.get(("transformers", batch))
        ratio = (f"{_tokens_per_s(vllm, new_tokens) / _tokens_per_s(hf, new_tokens):.2f}×"
                 if vllm and hf else "")
        what = f"{new_tokens} new tokens" if batch == 1 else f"{batch} × {new_tokens} new tokens"
        rows.append([f"batch {batch}: {what}", *cells, ratio])
    body = markdown_table(["", *ENGINES.values(), "vLLM ÷ Transformers"], rows,
                          ["---", "---:", "---:", "---:"])
    return f"{body}\n\n{source_line(data)}"


def earlier_runs(data: dict[str, Any]) -> str:
    """Tokens per second of earlier runs of the script under other load, one row per run and engine; ``""``
    without any."""
    runs = data.get("earlier_runs") or []
    batches = sorted({int(b) for run in runs for values in run["tokens_per_s"].values() for b in values})
    rows = []
    for run in runs:
        for engine, values in run["tokens_per_s"].items():
            cells = [f"{values[str(b)]:g}" if str(b) in values else "–" for b in batches]
            rows.append([run["when"].rstrip(","), ENGINES.get(engine, engine).split(" ")[0], *cells])
    if not rows:
        return ""
    head = ["run", "engine", *[f"batch {b}: tokens/s" for b in batches]]
    return markdown_table(head, rows, ["---", "---", *["---:"] * len(batches)])


def vllm_size(data: dict[str, Any]) -> str:
    """The size of the test suite's vLLM environment (one figure)."""
    return f"{data['vllm_environment']['size_gb']:g} GB"


def vllm_build_time(data: dict[str, Any]) -> str:
    """How long building that environment took (one figure)."""
    return f"{data['vllm_environment']['build_seconds']:.0f} s"


def vllm_environment_source(data: dict[str, Any]) -> str:
    """Where those two figures come from (one line)."""
    return data["vllm_environment"]["source"]
