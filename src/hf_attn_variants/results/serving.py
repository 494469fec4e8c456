"""Views of ``docs/results/serving-cpu.json``, written by ``scripts/serving_bench.py publish`` (docs/serving.md):
vLLM's Transformers backend against Transformers' ``generate`` on the same model folder.

Data: ``settings`` (prompt / new tokens, repeats), ``engine_start_s`` (vLLM's ``LLM(...)``), ``rows`` of
``{engine, batch, seconds[, tokens_per_s]}`` (median wall seconds of one ``generate`` call of ``batch`` prompts),
optionally ``earlier_runs`` (tokens per second of earlier runs under other load, for the fragility note) and
``vllm_environment`` (the size and build time of the test suite's vLLM environment).
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
    rows = [["engine start (`LLM(...)`, model load, KV-cache allocation, warm-up)", f"{data['engine_start_s']:.1f} s",
             "—", ""]]
    for batch in batches:
        cells = []
        for engine in ENGINES:
            row = by_key.get((engine, batch))
            cells.append(f"{row['seconds']:.2f} s = **{_tokens_per_s(row, new_tokens):.0f} tokens/s**" if row else "–")
        vllm, hf = by_key.get(("vllm", batch)), by_key.get(("transformers", batch))
        ratio = f"{_tokens_per_s(vllm, new_tokens) / _tokens_per_s(hf, new_tokens):.2f}×" if vllm and hf else ""
        what = f"{new_tokens} new tokens" if batch == 1 else f"{batch} × {new_tokens} new tokens"
        rows.append([f"batch {batch}: {what}", *cells, ratio])
    body = markdown_table(["", *ENGINES.values(), "vLLM ÷ Transformers"], rows, ["---", "---:", "---:", "---:"])
    return f"{body}\n\n{source_line(data)}"


def earlier_runs(data: dict[str, Any]) -> str:
    """The fragility note: tokens per second of earlier runs of the script under other load."""
    sentences = []
    for run in data.get("earlier_runs") or []:
        parts = []
        for engine, values in run["tokens_per_s"].items():
            batches = " and ".join(f"{v:g}" for v in values.values())
            parts.append(f"{ENGINES.get(engine, engine).split(' ')[0]} at {batches} tokens/s")
        where = " and ".join(str(b) for b in next(iter(run["tokens_per_s"].values())))
        sentences.append(f"{run['when']} measured {' and '.join(parts)} (batch {where}).")
    return " ".join(sentences)


def vllm_environment(data: dict[str, Any]) -> str:
    """One sentence: how large the vLLM test environment is and how long it took to build."""
    env = data["vllm_environment"]
    return (f"It takes about {env['size_gb']:g} GB; building it took {env['build_seconds']:.0f} s on this project's "
            f"CPU ({env['source']}).")
