"""Views of a calibration results file (``docs/results/mqar-calibration.json``): single ``lengthgen`` runs
that search for the budget at which a model learns a retrieval task at L, published by
``tools/publish_study.py calibration`` (docs/length_generalization.md, "MQAR at L").

Data: ``runs``, one per calibration run: its ``settings`` (the study flags that vary: steps, batch, learning
rate, width, depth, pairs, task vocabulary), ``series`` and ``accuracy`` (at L, per series), ``seconds``
(training), and the ``command`` that ran it; the provenance fields.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line

COLUMNS = (("num_kv_pairs", "pairs"), ("train_length", "L"), ("task_vocab_size", "vocabulary"),
           ("num_hidden_layers", "layers"),
           ("hidden_size", "hidden"), ("num_attention_heads", "heads"), ("max_train_steps", "steps"),
           ("per_device_train_batch_size", "batch"), ("learning_rate", "lr"))


def elimination(pairs: int) -> float:
    """MQAR accuracy of a model that knows which values the context holds but not which key each belongs to,
    answering the P queries in turn among the values not yet used: (1/P + 1/(P − 1) + … + 1) / P."""
    return sum(1 / k for k in range(1, pairs + 1)) / pairs


def table(data: dict[str, Any]) -> str:
    """One row per calibration run: its settings, the accuracy at L of each series beside the accuracy of
    answering by elimination, the training time."""
    head = [title for _, title in COLUMNS] + ["series", "accuracy at L", "by elimination", "training"]
    rows = []
    for run in data["runs"]:
        settings = run["settings"]
        for series, accuracy in run["accuracy"].items():
            rows.append([str(settings[key]) for key, _ in COLUMNS]
                        + [f"`{series}`", f"{accuracy:.2f}", f"{elimination(settings['num_kv_pairs']):.2f}",
                           f"{run['seconds']:.0f} s"])
    return markdown_table(head, rows) + "\n\n" + source_line(data)


__all__ = ["COLUMNS", "elimination", "table"]
