"""Results kind ``table``: a small measured table (and sentences quoting its numbers) kept as data.

For one-off measurements that no command of the package regenerates as a whole (a profile during development, a
client's measured differences). Data: ``head`` (column names), ``rows`` (lists of cells, as text), optional
``sentences`` (name → template whose ``{field}`` placeholders are filled from ``values``), plus the provenance
fields and, when the numbers were copied from an earlier version of the docs, ``provenance``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def table(data: dict[str, Any]) -> str:
    """The table, then the line naming where its numbers come from."""
    return markdown_table(data["head"], data["rows"], data.get("align")) + f"\n\n{source_line(data)}"


def source(data: dict[str, Any]) -> str:
    """Only the line naming where the numbers come from (for a file whose numbers the docs quote in sentences)."""
    return source_line(data)


def sentence(data: dict[str, Any]) -> str:
    """The ``sentences["main"]`` template filled from ``values``."""
    return data["sentences"]["main"].format(**data.get("values", {}))


def __getattr__(name: str) -> Any:
    """``sentence_<key>``: the view of ``sentences[key]`` filled from ``values`` (one results file, several sentences)."""
    if name.startswith("sentence_"):
        key = name[len("sentence_"):]
        return lambda data: data["sentences"][key].format(**data.get("values", {}))
    raise AttributeError(name)
