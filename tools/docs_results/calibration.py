"""Views of a calibration results file (``docs/results/mqar-calibration.json``): single ``lengthgen`` runs
that search for the budget at which a model learns a retrieval task at L, published by
``tools/publish_study.py calibration`` (docs/length_generalization.md, "MQAR at L").

Data: ``runs``, one per calibration run: its ``settings`` (the study flags that vary: steps, batch, learning
rate, width, depth, pairs, task vocabulary, copy warm-up steps), ``series`` and ``accuracy`` (at L, per
series), ``seconds`` (training), and the ``command`` that ran it; the provenance fields.
"""

from __future__ import annotations

from typing import Any

from ._common import markdown_table, source_line
from .retrieval import elimination

COLUMNS = (("num_kv_pairs", "pairs"), ("train_length", "L"), ("task_vocab_size", "vocabulary"),
           ("num_hidden_layers", "layers"),
           ("hidden_size", "hidden"), ("num_attention_heads", "heads"), ("max_train_steps", "steps"),
           ("copy_warmup_steps", "copy warm-up"), ("per_device_train_batch_size", "batch"),
           ("learning_rate", "lr"))


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


__all__ = ["COLUMNS", "table"]
