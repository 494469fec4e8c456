"""Views of ``docs/results/pretrain-throughput-cpu.json``, written by ``scripts/pretrain_throughput.py``:
tokens per second of ``pretrain --streaming --packing documents`` in one process, per family.

Data: ``settings`` (``hidden_size``, ``layers``, ``block``, ``batch``, ``steps``, ``overrides``), ``rows`` of
``{family, parameters, tokens_per_second, low, high, windows, final_loss}``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def table(data: dict[str, Any]) -> str:
    """Tokens/s (median, range over the logging windows after the first) and parameters, per family."""
    settings = data["settings"]
    rows = [[f"`{row['family']}`", f"{row['parameters'] / 1e6:.1f} M", f"{row['tokens_per_second']:,.0f}",
             f"{row['low']:,.0f}–{row['high']:,.0f}"] for row in data["rows"]]
    body = markdown_table(["family", "parameters", "tokens/s (median)", "range"], rows,
                          ["---", "---:", "---:", "---:"])
    return (f"Causal models of hidden {settings['hidden_size']} and {settings['layers']} layers, blocks of "
            f"{settings['block']} tokens, batch {settings['batch']}, {settings['steps']} steps, one process "
            f"(median over {data['rows'][0]['windows']} logging windows after the first).\n\n{body}\n\n"
            f"{source_line(data)}")


__all__ = ["table"]
