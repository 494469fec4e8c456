"""Views of ``docs/results/minilm-log-n.json``, written by ``scripts/minilm_log_n.py``: cosine of the real
all-MiniLM-L6-v2's sentence embeddings with training-free log-n scaling to its plain SDPA embeddings, per
setting and sentence (docs/stock_log_n.md, README.md)."""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def _settings(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["key"]: s for s in data["settings"]}


WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def _cells(cosines: list[float]) -> str:
    if all(round(c, 4) == 1.0 for c in cosines):
        return f"1.0000 for all {WORDS.get(len(cosines), len(cosines))}"
    return ", ".join(f"{c:.3f}" for c in cosines)


def _span(cosines: list[float]) -> str:
    return f"{min(cosines):.2f}–{max(cosines):.2f}"


def table(data: dict[str, Any]) -> str:
    """Cosine per setting (six sentences), the sentence lengths and the source line."""
    tokens = data["sentence_tokens"]
    count = WORDS.get(len(tokens), len(tokens))
    rows = [[s["label"], _cells(s["cosines"])] for s in data["settings"]]
    return (f"Sentences of {min(tokens)}–{max(tokens)} tokens.\n\n"
            + markdown_table(["setting", f"cosine to the SDPA embeddings ({count} sentences)"], rows)
            + f"\n\n{source_line(data)}")


def summary(data: dict[str, Any]) -> str:
    """The sentence under the table."""
    settings = _settings(data)
    return (f"So the old behaviour moved a pretrained encoder's embeddings on ordinary short inputs to a cosine of "
            f"{_span(settings['all']['cosines'])}; the default now leaves it intact up to its training length "
            f"(cosine {min(settings['beyond']['cosines']):.4f}).")


def readme(data: dict[str, Any]) -> str:
    """README.md's sentence."""
    settings = _settings(data)
    return (f"On the real all-MiniLM-L6-v2 the default keeps the sentence embeddings at cosine "
            f"{min(settings['beyond']['cosines']):.4f} to the unscaled ones, where scaling every row (`\"all\"`) moved "
            f"them to {_span(settings['all']['cosines'])} ([docs/stock_log_n.md](docs/stock_log_n.md)).")
