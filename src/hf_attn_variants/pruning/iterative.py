"""Iterative head pruning (Michel et al. 2019, §4.2): score → prune the least important heads → evaluate →
repeat.

Each step removes ``fraction`` (10% by default) of the heads that remain, lowest importance first
(importance ranked across layers, so per-layer normalisation matters), and evaluates the user's metric.
A step is evaluated under ``head_mask`` first — whose outputs equal those of the pruned model — and only
applied physically if the metric stays at or above ``threshold`` × the unpruned metric; so the model
returned is the last one that met the threshold, and the curve still shows the step that did not.
With ``rescore=True`` importance is recomputed on the pruned model after every step (the paper scores
once; re-scoring adapts to heads whose role changes once others are gone).

With ``uniform=True`` every step removes the same number of heads from every layer, the least important
ones *within* each layer — Torch-Pruning's uniform mode (``global_pruning=False``, one pruning ratio per
layer) instead of the paper's global ranking — so every layer keeps the same head count, which serving
engines such as vLLM need; ``prune.restate_uniform_heads`` then turns the pruned config into a plain one.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import logging
import math
import numbers
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from .adapters import get_adapter
from .importance import compute_head_importance
from .masking import head_mask
from .prune import prune_heads

logger = logging.getLogger(__name__)


@dataclass
class PruningStep:
    """One point of a pruning curve.

    Attributes:
        step: 0 for the unpruned model, then 1, 2, …
        heads_pruned: heads removed in total after this step (counting heads pruned before the loop).
        heads_remaining: heads left after this step.
        fraction: heads_pruned / total heads.
        metric: the user's metric after this step.
        relative_metric: metric / baseline (baseline / metric when lower is better).
        newly_pruned: ``{layer: [original heads]}`` removed at this step.
        accepted: False for a step that fell below the threshold (evaluated, not applied; the last row).
        seconds: wall time of the step (scoring + evaluation).
    """

    step: int
    heads_pruned: int
    heads_remaining: int
    fraction: float
    metric: float
    relative_metric: float
    newly_pruned: dict[int, list[int]] = field(default_factory=dict)
    accepted: bool = True
    seconds: float = 0.0

    def as_row(self) -> dict[str, Any]:
        """Flat dict for CSV (``newly_pruned`` as JSON text)."""
        row = asdict(self)
        row["newly_pruned"] = json.dumps({str(k): v for k, v in self.newly_pruned.items()})
        return row


def write_curve(curve: list[PruningStep], csv_path: str | os.PathLike,
                json_path: str | os.PathLike | None = None,
                metadata: Mapping[str, Any] | None = None) -> None:
    """Write the curve as CSV (one row per step) and optionally JSON (``{"metadata": …, "curve": [...]}``);
    the CSV atomically (``prune`` rewrites it after every step: a stop leaves the old one or the new one)."""
    from ..cli_utils import atomic_write_text

    names = list(PruningStep.__dataclass_fields__)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=names)
    writer.writeheader()
    for row in curve:
        writer.writerow(row.as_row())
    atomic_write_text(csv_path, text.getvalue())
    if json_path is not None:
        payload = {"metadata": dict(metadata or {}), "curve": [asdict(row) for row in curve]}
        Path(json_path).write_text(json.dumps(payload, indent=2, default=str))


def read_curve(json_path: str | os.PathLike) -> list[PruningStep]:
    """Read a curve written by ``write_curve`` (the JSON file); ``ValueError`` naming the file for one that is
    not such a curve."""
    try:
        payload = json.loads(Path(json_path).read_text())
        rows = []
        for row in payload["curve"]:
            row = dict(row)
            row["newly_pruned"] = {int(k): list(v) for k, v in row.get("newly_pruned", {}).items()}
            rows.append(PruningStep(**row))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{str(json_path)!r} is not a curve written by write_curve "
                         f"({type(error).__name__}: {error}).") from error
    return rows


def head_budget(max_heads_pruned: int | float | None, total: int) -> int:  # noqa: PYI041 (int ≠ fraction)
    """Total number of heads that may be pruned: an int, a fraction in (0, 1] of all heads, or all."""
    if max_heads_pruned is None:
        return total
    if isinstance(max_heads_pruned, bool) or not isinstance(max_heads_pruned, (int, float)):
        raise TypeError("max_heads_pruned must be an int, a float in (0, 1] or None, got "
                        f"{max_heads_pruned!r}.")
    if isinstance(max_heads_pruned, float):
        if not 0.0 < max_heads_pruned <= 1.0:
            raise ValueError(f"max_heads_pruned as a fraction must be in (0, 1], got {max_heads_pruned}.")
        return math.floor(max_heads_pruned * total + 1e-9)
    if max_heads_pruned < 0:
        raise ValueError(f"max_heads_pruned must be >= 0, got {max_heads_pruned}.")
    return min(max_heads_pruned, total)


def uniform_head_count(alive: torch.Tensor) -> int:
    """The number of heads every layer has (``alive``: boolean ``(num_layers, num_heads)``).

    Raises ``ValueError`` naming ``uniform`` when the layers have different head counts (e.g. after global
    pruning): uniform pruning would keep them different.
    """
    counts = alive.sum(-1).tolist()
    if len(set(counts)) > 1:
        raise ValueError(
            f"uniform=True needs the same number of heads in every layer, but the layers have {counts} heads "
            "(an earlier non-uniform pruning); prune it with uniform=False, or start from a uniform model."
        )
    return int(counts[0]) if counts else 0


def _select_uniform(importance: torch.Tensor, per_layer: int,
                    min_heads_per_layer: int) -> dict[int, list[int]]:
    """``per_layer`` lowest-importance heads of every layer (ties by head index), or ``{}`` if a layer would
    go below ``min_heads_per_layer`` — never a non-uniform choice."""
    alive = ~torch.isnan(importance)
    left = uniform_head_count(alive)
    if per_layer <= 0 or left - per_layer < max(min_heads_per_layer, 0):
        return {}
    chosen: dict[int, list[int]] = {}
    for layer in range(importance.shape[0]):
        heads = alive[layer].nonzero().flatten().tolist()
        order = sorted(heads, key=lambda head: (float(importance[layer, head]), head))
        chosen[layer] = sorted(order[:per_layer])
    return chosen


def select_heads(
    importance: torch.Tensor, count: int, min_heads_per_layer: int = 0, uniform: bool = False
) -> dict[int, list[int]]:
    """The ``count`` lowest-importance heads (NaN = already pruned, skipped), keeping ≥
    ``min_heads_per_layer``.

    Ties are broken by (layer, head) order so the choice is deterministic.

    With ``uniform=True`` (Torch-Pruning's uniform mode, ``global_pruning=False``) ``count`` is the number of
    heads taken from *every* layer: the ``count`` lowest-importance heads within each layer, ties by head
    index. Every layer must have the same number of heads left (``ValueError`` naming ``uniform``
    otherwise); when taking ``count`` would leave a layer below ``min_heads_per_layer`` nothing is chosen
    (``{}``) rather than a non-uniform selection.
    """
    if uniform:
        return _select_uniform(importance, count, min_heads_per_layer)
    alive = ~torch.isnan(importance)
    left = alive.sum(-1).tolist()
    order = sorted(
        ((float(importance[layer, head]), layer, head) for layer, head in alive.nonzero().tolist()),
        key=lambda item: item,
    )
    chosen: dict[int, list[int]] = {}
    for _, layer, head in order:
        if sum(len(v) for v in chosen.values()) >= count:
            break
        if left[layer] <= min_heads_per_layer:
            continue
        chosen.setdefault(layer, []).append(head)
        left[layer] -= 1
    return {layer: sorted(heads) for layer, heads in sorted(chosen.items())}


def uniform_step_size(per_layer: int, fraction: float, budget_left: int, num_layers: int,
                      min_heads_per_layer: int) -> int:
    """Heads to take from every layer in one uniform step: ``max(1, round(fraction × per_layer))``, capped so
    the budget and ``min_heads_per_layer`` hold in every layer; 0 when not even one head per layer fits."""
    if num_layers == 0:
        return 0
    wanted = max(1, round(fraction * per_layer))
    return max(0, min(wanted, per_layer - min_heads_per_layer, budget_left // num_layers))


def iterative_head_pruning(
    model: PreTrainedModel,
    importance_data: Iterable[Mapping[str, Any]] | None,
    metric: Callable[[PreTrainedModel], float],
    *,
    fraction: float = 0.1,
    threshold: float | None = 0.9,
    max_heads_pruned: int | float | None = None,  # noqa: PYI041 (an int is a count, a float a fraction)
    rescore: bool = False,
    higher_is_better: bool = True,
    importance: torch.Tensor | None = None,
    normalize_per_layer: bool = True,
    min_heads_per_layer: int = 0,
    uniform: bool = False,
    on_step: Callable[[list[PruningStep]], None] | None = None,
) -> list[PruningStep]:
    """Prune ``model`` in place step by step and return the curve (row 0 = unpruned).

    Args:
        model: any model ``prune_heads`` supports.
        importance_data: batches with labels for ``compute_head_importance`` (re-iterable, e.g. a list or a
            ``DataLoader``, when ``rescore``); may be None when ``importance`` is given and not ``rescore``.
        metric: ``metric(model) -> float``, e.g. accuracy on a held-out set (called with the model in
            eval mode; it may run under ``head_mask``).
        fraction: share of the *remaining* heads removed per step (at least one head).
        threshold: stop when metric / baseline (baseline / metric if lower is better) < threshold; None
            prunes until the budget or no head is left.
        max_heads_pruned: head budget for the whole run, counting earlier pruning: an int, a fraction of
            all heads, or None (no budget).
        rescore: recompute importance after every step instead of scoring once.
        higher_is_better: direction of ``metric``.
        importance: precomputed scores ``(num_layers, num_heads)`` to use first (e.g. random scores for a
            baseline); computed from ``importance_data`` otherwise.
        normalize_per_layer: passed to ``compute_head_importance``.
        min_heads_per_layer: never take a layer below this many heads.
        uniform: remove the same number k = max(1, round(``fraction`` × heads per layer)) of heads from every
            layer at each step, the least important within each layer (Torch-Pruning's uniform mode,
            ``global_pruning=False``), instead of ranking all heads globally (the paper; the default). k is
            capped so the budget and ``min_heads_per_layer`` hold in every layer; when not one head per layer
            fits any more, the loop stops rather than go non-uniform. The model must have the same number of
            heads in every layer (``ValueError`` naming ``uniform`` otherwise).
        on_step: called with the curve so far after each row (``prune`` writes it: a stop keeps the steps).
    """
    _check_flags(rescore=rescore, uniform=uniform, higher_is_better=higher_is_better,
                 normalize_per_layer=normalize_per_layer, min_heads_per_layer=min_heads_per_layer)
    _check_arguments(importance_data, metric, fraction, threshold, rescore, importance)
    adapter, total, budget = _checked_heads(model, importance, max_heads_pruned, uniform)
    was_training = model.training
    model.eval()
    curve = [_unpruned_step(model, metric, total, total - int(adapter.alive().sum()))]
    baseline, pruned_now = curve[0].metric, curve[0].heads_pruned
    report = on_step or (lambda rows: None)
    report(curve)
    scores = None if importance is None else importance.detach().float().cpu().clone()
    try:
        for step in itertools.count(1):
            start = time.perf_counter()
            alive = adapter.alive()
            if int(alive.sum()) == 0 or pruned_now >= budget:
                break
            scores = _scores_of_alive(model, scores, alive, importance_data, normalize_per_layer)
            chosen = _heads_to_try(scores, alive, fraction, budget - pruned_now, min_heads_per_layer, uniform)
            if not chosen:
                break
            value = _metric_without(model, metric, alive, chosen)
            newly = sum(len(h) for h in chosen.values())
            rel = relative_metric(value, baseline, higher_is_better)
            accepted = threshold is None or (not math.isnan(rel) and rel >= threshold)
            if accepted:
                scores = _prune_chosen(model, chosen, scores, rescore)
                pruned_now += newly
            done = pruned_now if accepted else pruned_now + newly
            curve.append(_logged_step(step, done, total, value, rel, chosen, accepted, start))
            report(curve)
            if not accepted:
                break
    finally:
        model.train(was_training)
    return curve


def _checked_heads(model: PreTrainedModel, importance: torch.Tensor | None,
                   max_heads_pruned: int | float | None, uniform: bool) -> tuple[Any, int, int]:  # noqa: PYI041
    """The model's head adapter, its head count and the run's head budget; ``ValueError`` for scores of
    another shape, a bad budget, or (``uniform``) layers of different head counts."""
    adapter = _checked_adapter(model, importance)
    total = adapter.num_layers * adapter.num_heads
    if uniform:
        uniform_head_count(adapter.alive())
    return adapter, total, head_budget(max_heads_pruned, total)


def _unpruned_step(model: PreTrainedModel, metric: Callable[[PreTrainedModel], float], total: int,
                   pruned: int) -> PruningStep:
    """Row 0 of the curve: ``metric`` of the model before this run prunes anything (``pruned`` heads gone)."""
    start = time.perf_counter()
    baseline = metric_value(metric(model))
    if not math.isfinite(baseline):  # every step would be relative to NaN or inf
        raise ValueError(f"metric returned {baseline} for the model before pruning; it must be finite.")
    logger.info("step 0: %d/%d heads pruned, metric %.4f", pruned, total, baseline)
    return PruningStep(0, pruned, total - pruned, pruned / total, baseline, 1.0,
                       seconds=time.perf_counter() - start)


def _scores_of_alive(model: PreTrainedModel, scores: torch.Tensor | None, alive: torch.Tensor,
                     importance_data: Iterable[Mapping[str, Any]] | None,
                     normalize_per_layer: bool) -> torch.Tensor:
    """A copy of ``scores`` (computed from ``importance_data`` when None) with the pruned heads NaN."""
    if scores is None:
        scores = compute_head_importance(model, importance_data, normalize_per_layer=normalize_per_layer)
        check_scores("importance_data", scores, alive)
    scores = scores.clone()
    scores[~alive] = float("nan")
    return scores


def _prune_chosen(model: PreTrainedModel, chosen: dict[int, list[int]], scores: torch.Tensor,
                  rescore: bool) -> torch.Tensor | None:
    """Remove the ``chosen`` heads physically; the scores for the next step (None: score again)."""
    prune_heads(model, chosen)
    for layer, heads in chosen.items():
        scores[layer, heads] = float("nan")
    return None if rescore else scores


def _logged_step(step: int, done: int, total: int, value: float, rel: float, chosen: dict[int, list[int]],
                 accepted: bool, start: float) -> PruningStep:
    """The curve row of step ``step`` (``done`` heads pruned, or that would be for a rejected one), logged."""
    logger.info("step %d: %d/%d heads pruned, metric %.4f (%.3f of baseline)%s", step, done, total, value,
                rel, "" if accepted else " — below threshold, not applied")
    return PruningStep(step, done, total - done, done / total, value, rel, chosen, accepted,
                       time.perf_counter() - start)


def _check_arguments(importance_data: Iterable[Mapping[str, Any]] | None, metric: Any, fraction: float,
                     threshold: float | None, rescore: bool, importance: torch.Tensor | None) -> None:
    """One error naming the argument for every inconsistent choice of ``iterative_head_pruning``."""
    if not callable(metric):
        raise TypeError(f"metric must be a callable metric(model) -> float, got {type(metric).__name__}.")
    for name, value in (("fraction", fraction), ("threshold", 1.0 if threshold is None else threshold)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {value!r}.")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}.")
    if threshold is not None and not threshold > 0:
        raise ValueError(f"threshold must be > 0 or None, got {threshold}.")
    if (importance is None or rescore) and importance_data is None:
        raise ValueError("importance_data is required unless importance is given and rescore is False.")
    if rescore and iter(importance_data) is importance_data:
        raise TypeError("with rescore=True, importance_data must be re-iterable (a list or a DataLoader).")


def _check_flags(*, min_heads_per_layer: Any, **flags: Any) -> None:
    """The switches' types (``flags``: bools; a string such as ``"no"`` would be true) and the count."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}.")
    count = min_heads_per_layer
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"min_heads_per_layer must be an integer >= 0, got {min_heads_per_layer!r}.")


def _checked_adapter(model: PreTrainedModel, importance: Any) -> Any:
    """``get_adapter(model)``, once ``importance`` (when given) fits it (``check_scores``)."""
    adapter = get_adapter(model)
    if importance is not None:
        check_scores("importance", importance, adapter.alive())
    return adapter


def check_scores(name: str, scores: Any, alive: torch.Tensor) -> None:
    """``ValueError`` naming ``name`` unless ``scores`` is a tensor of ``alive``'s shape ``(num_layers,
    num_heads)`` that is finite at every head still there (pruned heads may be NaN): a NaN score would read
    as "already pruned" and hide that head from pruning for good."""
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"{name} must be a tensor (num_layers, num_heads), got {type(scores).__name__}.")
    if tuple(scores.shape) != tuple(alive.shape):
        raise ValueError(f"{name} must have shape (num_layers, num_heads) = {tuple(alive.shape)}, got "
                         f"{tuple(scores.shape)}.")
    bad = (~torch.isfinite(scores.detach().float().cpu())) & alive.cpu()
    if bool(bad.any()):
        layer, head = (int(i) for i in bad.nonzero()[0])
        source = "gives" if name == "importance_data" else "has"
        raise ValueError(f"{name} {source} a score that is not finite for {int(bad.sum())} head(s) still in "
                         f"the model, the first layer {layer} head {head} (NaN or inf: a loss that "
                         "diverged?).")


def relative_metric(value: float, baseline: float, higher_is_better: bool) -> float:
    """The metric relative to the unpruned model: value / baseline, or baseline / value when lower is better
    (so 1.0 is unchanged and smaller is worse either way); NaN where the divisor is 0."""
    numerator, denominator = (value, baseline) if higher_is_better else (baseline, value)
    return numerator / denominator if denominator != 0 else float("nan")


def _heads_to_try(scores: torch.Tensor, alive: torch.Tensor, fraction: float, budget_left: int,
                  min_heads_per_layer: int, uniform: bool) -> dict[int, list[int]]:
    """The heads one step would remove: ``fraction`` of the remaining ones (at least one, within the budget),
    lowest ``scores`` first, globally ranked or the same number per layer (``uniform``)."""
    if uniform:
        count = uniform_step_size(uniform_head_count(alive), fraction, budget_left, alive.shape[0],
                                  min_heads_per_layer)
    else:
        remaining = int(alive.sum())
        count = min(max(1, round(fraction * remaining)), budget_left, remaining)
    return select_heads(scores, count, min_heads_per_layer, uniform=uniform)


def _metric_without(model: PreTrainedModel, metric: Callable[[PreTrainedModel], float], alive: torch.Tensor,
                    chosen: dict[int, list[int]]) -> float:
    """``metric(model)`` with the ``chosen`` heads masked out as well (``head_mask``: the pruned model's
    outputs)."""
    mask = alive.float()
    for layer, heads in chosen.items():
        mask[layer, heads] = 0.0
    with torch.no_grad(), head_mask(model, mask):
        return metric_value(metric(model))


def metric_value(value: Any) -> float:
    """What ``metric(model)`` returned, as a float: a real number or a one-element tensor; ``TypeError``
    naming ``metric`` for anything else (a string such as ``"0.5"`` included)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"metric must return a real number, got {type(value).__name__} {value!r}.")
    return float(value)


__all__ = [
    "PruningStep",
    "head_budget",
    "iterative_head_pruning",
    "read_curve",
    "relative_metric",
    "select_heads",
    "uniform_head_count",
    "uniform_step_size",
    "write_curve",
]
