"""Views of ``docs/results/tp-bench-cpu.json``, written by ``scripts/tp_bench.py``: one training step
(forward + backward) of GAU and of the entropy-invariant decoder, whole on one process and tensor-parallel
over the processes of ``torchrun``, on the same CPU cores.

The file holds ``settings`` and a list of ``runs`` (each: ``label``, optional ``note``, ``rows`` of
``{family, tp, threads, step_s}``); a run of the script replaces its own rows (same run label, family and TP
degree) and keeps the other runs, so the table shows several runs side by side. A row may carry
``tp_over_one``, the ratio computed from unrounded times (transcribed runs, whose raw times are gone).
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, settings_table, source_line

FAMILY_LABELS = {
    "gau": "GAU (e = {e}, s = 128)",
    "entropy_invariant": "entropy-invariant ({heads} heads, FFN {ffn})",
}


def _family_label(family: str, hidden: int) -> str:
    return FAMILY_LABELS.get(family, family).format(e=2 * hidden, heads=hidden // 64, ffn=4 * hidden)


def _ratio(run: dict[str, Any], family: str) -> tuple[float | None, float | None, float | None]:
    """(one-process seconds, TP seconds, TP / one) of ``family`` in ``run``."""
    one = next((r for r in run["rows"] if r["family"] == family and r["tp"] == 1), None)
    split = next((r for r in run["rows"] if r["family"] == family and r["tp"] > 1), None)
    if one is None or split is None:
        return (one or {}).get("step_s"), (split or {}).get("step_s"), None
    return one["step_s"], split["step_s"], split.get("tp_over_one", split["step_s"] / one["step_s"])


def table(data: dict[str, Any]) -> str:
    """The settings, one row per family with every run's times side by side (``a / b``), and the source
    line."""
    settings, runs = data["settings"], data["runs"]
    families = list(dict.fromkeys(r["family"] for run in runs for r in run["rows"]))
    tp = max(r["tp"] for run in runs for r in run["rows"])
    threads_one = next((r["threads"] for run in runs for r in run["rows"] if r["tp"] == 1), "?")
    threads_tp = next((r["threads"] for run in runs for r in run["rows"] if r["tp"] > 1), "?")
    rows = []
    for family in families:
        cells = [_ratio(run, family) for run in runs]
        one = " / ".join(f"{c[0]:.2f} s" if c[0] is not None else "–" for c in cells)
        split = " / ".join(f"{c[1]:.2f} s" if c[1] is not None else "–" for c in cells)
        ratio = " / ".join(f"{c[2]:.2f}×" if c[2] is not None else "–" for c in cells)
        slower = all(c[2] is not None and c[2] > 1 for c in cells)
        rows.append([_family_label(family, settings["hidden"]), one, split,
                     ratio + (" slower" if slower else "")])
    notes = [run.get("note") for run in runs if run.get("note")]
    intro = settings_table([
        ("hidden", str(settings["hidden"])), ("layers", str(settings["layers"])),
        ("tokens per step (batch × length)", f"{settings['batch']} × {settings['length']}"),
        ("repeats (median)", str(settings["repeats"])),
        ("runs", str(len(runs)) + (f" ({'; '.join(notes)})" if notes else ""))])
    body = markdown_table(
        ["family", f"one process, {threads_one} threads",
         f"TP = {tp}, {threads_tp} thread{'s' if threads_tp != 1 else ''} each",
         "TP / one"],
        rows, ["---", "---:", "---:", "---:"])
    return f"{intro}\n\n{body}\n\n{source_line(data)}"
