"""Views of a ``gau_init`` results file, written by ``scripts/gau_init_study.py --results NAME``:
Transformers' overfitting test (``TrainingTesterMixin.test_training_overfit``) per GAU normalisation,
``gau_init`` and seed.

Data: ``seeds`` and ``rows`` of ``{variant, gau_init, seed, loss_reduction, grad_norm_reduction,
generation_matches, passed}`` (reductions in %). docs/gau.md embeds ``table`` where its owner wants it.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line


def table(data: dict[str, Any]) -> str:
    """One row per normalisation × ``gau_init``: the reductions of every seed, how many generated the pattern
    and passed; then the source line."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in data["rows"]:
        groups.setdefault((row["variant"], row["gau_init"]), []).append(row)
    rows = []
    for (variant, init), group in groups.items():
        loss = " / ".join(f"{r.get('loss_reduction', float('nan')):.1f}" for r in group)
        grad = " / ".join(f"{r.get('grad_norm_reduction', float('nan')):.1f}" for r in group)
        generated = sum(bool(r["generation_matches"]) for r in group)
        passed = sum(bool(r["passed"]) for r in group)
        rows.append([variant, init, str(len(group)), f"{loss} %", f"{grad} %", f"{generated}/{len(group)}",
                     f"{passed}/{len(group)}"])
    head = ["normalisation", "gau_init", "seeds", "loss reduction", "grad-norm reduction",
            "generates the pattern",
            "passed"]
    return markdown_table(head, rows) + f"\n\n{source_line(data)}"
