"""Views of ``docs/results/minilm-log-n.json``, written by ``scripts/minilm_log_n.py``: cosine of the real
all-MiniLM-L6-v2's sentence embeddings with training-free log-n scaling to its plain SDPA embeddings, per
setting and sentence (docs/stock_log_n.md)."""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def _cells(cosines: list[float]) -> str:
    if all(round(c, 4) == 1.0 for c in cosines):
        return f"1.0000 for all {WORDS.get(len(cosines), len(cosines))}"
    return ", ".join(f"{c:.3f}" for c in cosines)


def table(data: dict[str, Any]) -> str:
    """Cosine per setting (six sentences) and the source line."""
    count = WORDS.get(len(data["sentence_tokens"]), len(data["sentence_tokens"]))
    rows = [[s["label"], _cells(s["cosines"])] for s in data["settings"]]
    return (markdown_table(["setting", f"cosine to the SDPA embeddings ({count} sentences)"], rows)
            + f"\n\n{source_line(data)}")


def sentence_tokens(data: dict[str, Any]) -> str:
    """The shortest to the longest sentence, in tokens (one figure)."""
    tokens = data["sentence_tokens"]
    return f"{min(tokens)}–{max(tokens)}"
