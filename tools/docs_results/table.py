"""Results kind ``table``: a small measured table (and figures the docs quote in their sentences) kept as
data.

For one-off measurements that no command of the package regenerates as a whole (a profile during development,
a client's measured differences). Data: ``head`` (column names), ``rows`` (lists of cells, as text), optional
``values`` (name → one figure, as text, quoted by the docs' own sentences through ``value_<name>``), plus the
provenance fields and, when the numbers were copied from an earlier version of the docs, ``provenance``. Older
files also hold ``sentences`` (templates of the sentences those figures sat in): the docs now write those
sentences themselves, and no view renders them.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def table(data: dict[str, Any]) -> str:
    """The table, then the line naming where its numbers come from."""
    return markdown_table(data["head"], data["rows"], data.get("align")) + f"\n\n{source_line(data)}"


def source(data: dict[str, Any]) -> str:
    """Only the line naming where the numbers come from (for a file whose figures the docs quote in
    sentences)."""
    return source_line(data)


def __getattr__(name: str) -> Any:
    """``value_<key>``: the figure ``values[key]`` (one results file, several figures quoted inline)."""
    if name.startswith("value_"):
        key = name[len("value_"):]
        return lambda data: str(data["values"][key])
    raise AttributeError(name)
