"""Classification metrics without downloads: accuracy, macro-F1 and CoNLL entity-level precision/recall/F1.

Entity chunks follow the conlleval script (CoNLL-2000 shared task; also seqeval's default, non-strict
mode): tags ``B-X``, ``I-X``, ``E-X``, ``S-X`` (and IOB1/IO, where ``I-X`` after ``O`` or another type
starts a chunk) and ``O``. A predicted chunk counts as correct only if its type, start and end all match
a gold chunk. precision = correct / predicted, recall = correct / gold, F1 = 2PR / (P + R) (0 when
undefined). Token accuracy counts every labelled token, ``O`` included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def accuracy(predictions: Sequence, references: Sequence) -> float:
    """Share of positions where prediction == reference (0.0 for empty input)."""
    if len(predictions) != len(references):
        raise ValueError(f"predictions ({len(predictions)}) and references ({len(references)}) differ in "
                         "length.")
    if not references:
        return 0.0
    return sum(int(p == r) for p, r in zip(predictions, references)) / len(references)


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def macro_f1(predictions: Sequence, references: Sequence) -> float:
    """Unweighted mean over the reference classes of the per-class F1."""
    classes = sorted(set(references), key=str)
    if not classes:
        return 0.0
    scores = []
    for label in classes:
        tp = sum(1 for p, r in zip(predictions, references) if p == label and r == label)
        fp = sum(1 for p, r in zip(predictions, references) if p == label and r != label)
        fn = sum(1 for p, r in zip(predictions, references) if p != label and r == label)
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        scores.append(_f1(precision, recall))
    return sum(scores) / len(scores)


def _split_tag(tag: str) -> tuple[str, str]:
    if tag in ("O", "", None):
        return "O", ""
    if len(tag) > 1 and tag[1] in "-_" and tag[0] in "BIES":
        return tag[0], tag[2:]
    return "I", tag  # a bare type name is treated as inside that type (IO scheme)


def _boundary(own: str, other: str, type_changes: bool, always: tuple[str, ...], inside: tuple[str, ...],
              breaking: tuple[str, ...]) -> bool:
    """conlleval's rule for a chunk boundary, seen from one tag's prefix ``own``: always after/at ``always``
    prefixes; for ``inside`` prefixes when the ``other`` tag's prefix is ``breaking`` or the type changes."""
    if own in always:
        return True
    return own in inside and (other in breaking or type_changes)


def _chunk_end(prev_prefix: str, prev_type: str, prefix: str, type_: str) -> bool:
    """conlleval's endOfChunk: does a chunk end between the previous tag and this one?"""
    return _boundary(prev_prefix, prefix, type_ != prev_type, always=("E", "S"), inside=("B", "I"),
                     breaking=("B", "S", "O"))


def _chunk_start(prev_prefix: str, prev_type: str, prefix: str, type_: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at this tag?"""
    return _boundary(prefix, prev_prefix, type_ != prev_type, always=("B", "S"), inside=("I", "E"),
                     breaking=("E", "S", "O"))


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Chunks ``(type, start, end)`` (inclusive) of one tag sequence, conlleval-style."""
    entities, start = [], None
    prev_prefix, prev_type = "O", ""
    for index, tag in enumerate([*tags, "O"]):
        prefix, type_ = _split_tag(tag)
        if start is not None and _chunk_end(prev_prefix, prev_type, prefix, type_):
            entities.append((prev_type, start, index - 1))
            start = None
        if _chunk_start(prev_prefix, prev_type, prefix, type_):
            start = index
        prev_prefix, prev_type = prefix, type_
    return entities


def entity_scores(
    predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]], per_type: bool = False
) -> dict[str, float]:
    """Entity-level ``precision``, ``recall``, ``f1`` and token ``accuracy`` over sentences of tags.

    With ``per_type``, also ``<TYPE>_precision``/``_recall``/``_f1``/``_number`` for each entity type.
    """
    if len(predictions) != len(references):
        raise ValueError(f"predictions ({len(predictions)}) and references ({len(references)}) differ in "
                         "length.")
    correct, predicted, gold = Counter(), Counter(), Counter()
    tokens = hits = 0
    for pred, ref in zip(predictions, references):
        if len(pred) != len(ref):
            raise ValueError(f"A sentence has {len(pred)} predicted tags but {len(ref)} reference tags.")
        pred_entities, ref_entities = set(get_entities(pred)), set(get_entities(ref))
        for type_, *_ in pred_entities:
            predicted[type_] += 1
        for type_, *_ in ref_entities:
            gold[type_] += 1
        for type_, *_ in pred_entities & ref_entities:
            correct[type_] += 1
        tokens += len(ref)
        hits += sum(int(p == r) for p, r in zip(pred, ref))

    def prf(c: int, p: int, g: int) -> tuple[float, float, float]:
        precision, recall = (c / p if p else 0.0), (c / g if g else 0.0)
        return precision, recall, _f1(precision, recall)

    precision, recall, f1 = prf(sum(correct.values()), sum(predicted.values()), sum(gold.values()))
    scores = {"precision": precision, "recall": recall, "f1": f1,
              "accuracy": hits / tokens if tokens else 0.0}
    if per_type:
        for type_ in sorted(set(gold) | set(predicted)):
            p, r, f = prf(correct[type_], predicted[type_], gold[type_])
            scores.update({f"{type_}_precision": p, f"{type_}_recall": r, f"{type_}_f1": f,
                           f"{type_}_number": float(gold[type_])})
    return scores


__all__ = ["accuracy", "entity_scores", "get_entities", "macro_f1"]
