"""Views of ``docs/results/peer-profile-cpu.json``, written by ``scripts/peer_profile.py``: where one fwd+bwd
step of our FLASH and of the FLASH-pytorch peer spends its time (self CPU time per operator group,
``torch.profiler``).

Data: ``settings`` (``steps``, ``threads``, ``groups``: operator names per group), ``rows`` of
``{model, length, ms: {group: milliseconds per step, …, total}}``.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table, source_line

PAIRS = (("gau_flash", "flash_pytorch", "bidirectional"),
         ("gau_flash_causal", "flash_pytorch_causal", "causal"))


def table(data: dict[str, Any]) -> str:
    """The settings, then milliseconds per step by operator group, ours / the peer's, per direction and
    length."""
    rows_by = {(r["model"], r["length"]): r["ms"] for r in data["rows"]}
    groups = [g for g in data["rows"][0]["ms"] if g != "total"]
    head = ["direction, n", *groups, "total"]
    rows = []
    for ours, peer, direction in PAIRS:
        for length in sorted({r["length"] for r in data["rows"]}):
            a, b = rows_by.get((ours, length)), rows_by.get((peer, length))
            if a and b:
                rows.append([f"{direction}, {length}",
                             *[f"{a[g]:.0f} / {b[g]:.0f}" for g in [*groups, "total"]]])
    body = markdown_table(head, rows, ["---", *["---:"] * (len(head) - 1)])
    settings = settings_table([("profiler", "`torch.profiler`, self CPU time"),
                               ("steps averaged", str(data["settings"]["steps"])),
                               ("threads", str(data["settings"]["threads"]))])
    return f"{settings}\n\n{body}\n\n{source_line(data)}"


__all__ = ["table"]
