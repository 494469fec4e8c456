"""Views of ``docs/results/pretrain-throughput-cpu.json``, written by ``scripts/pretrain_throughput.py``:
tokens per second of ``pretrain --streaming --packing documents`` in one process, per family.

Data: ``settings`` (``hidden_size``, ``layers``, ``block``, ``batch``, ``steps``, ``overrides``), ``rows`` of
``{family, parameters, tokens_per_second, low, high, windows, final_loss}``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table, source_line


def table(data: dict[str, Any]) -> str:
    """The settings, then tokens/s (median, range over the logging windows after the first) and parameters,
    per family."""
    settings = data["settings"]
    rows = [[f"`{row['family']}`", f"{row['parameters'] / 1e6:.1f} M", f"{row['tokens_per_second']:,.0f}",
             f"{row['low']:,.0f}–{row['high']:,.0f}"] for row in data["rows"]]
    body = markdown_table(["family", "parameters", "tokens/s (median)", "range"], rows,
                          ["---", "---:", "---:", "---:"])
    table_of_settings = settings_table([
        ("hidden size", str(settings["hidden_size"])), ("layers", str(settings["layers"])),
        ("block", f"{settings['block']} tokens"), ("batch", str(settings["batch"])),
        ("steps", str(settings["steps"])), ("processes", str(settings.get("processes", 1))),
        ("logging windows in the median (after the first)", str(data["rows"][0]["windows"]))])
    return f"{table_of_settings}\n\n{body}\n\n{source_line(data)}"


__all__ = ["table"]
