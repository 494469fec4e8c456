"""The entropy of attention rows against the number of keys each row sees.

For row i of an attention map, H = −Σⱼ pᵢⱼ log pᵢⱼ (nats). A row that spreads evenly over its nᵢ visible
keys has H = log nᵢ; Su's entropy-invariance argument (2021, "从熵不变性看Attention的Scale操作")
asks for logits scaled by log nᵢ so that H stays put as nᵢ grows.

``entropy_by_length`` measures H per layer and head at each input length n: every row of a bidirectional
model (nᵢ = n), the rows of the second half of a causal one (nᵢ ∈ (n/2, n]). ``fit_slope`` gives
dH/d log n by least squares over the lengths: near 0 where the entropy holds still, near 1 where a head
stays as diffuse as the uniform row.

Rows that are not probabilities (GAU's relu², Laplace) are normalised to sum to 1 first when ``normalize``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LengthPoint:
    """The entropies of one input length: ``entropy[layer][head]`` (mean over the measured rows, nats),
    ``log_keys`` the mean log nᵢ of those rows, ``rows`` how many rows per head were averaged."""

    length: int
    log_keys: float
    entropy: list[list[float]]
    rows: int

    @property
    def mean_entropy(self) -> float:
        values = [h for layer in self.entropy for h in layer]
        return sum(values) / len(values)


def measured_rows(length: int, causal: bool) -> slice:
    """The rows measured at ``length``: all of a bidirectional map, the second half of a causal one."""
    return slice(length // 2, length) if causal else slice(0, length)


def mean_log_keys(length: int, causal: bool) -> float:
    """Mean log nᵢ over ``measured_rows`` (causal row i sees i + 1 keys)."""
    if not causal:
        return math.log(length)
    rows = range(length // 2, length)
    return sum(math.log(i + 1) for i in rows) / len(rows)


def row_entropy(attention: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """H of every row of ``attention`` ``(..., q, k)`` → ``(..., q)``; 0 · log 0 = 0. ``normalize``: each row
    divided by its sum first (rows without mass stay 0)."""
    probs = attention.double()
    if normalize:
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return torch.special.entr(probs).sum(-1)


@torch.no_grad()
def attention_maps(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every layer's attention probabilities ``(batch, heads, n, n)`` for ``input_ids``
    (``output_attentions``; ``ValueError`` when the model's attention implementation returns none, e.g.
    SDPA)."""
    outputs = model(input_ids=input_ids, output_attentions=True)
    maps = outputs.attentions
    if not maps or any(layer is None for layer in maps):
        raise ValueError("the model returned no attention weights: load it with attn_implementation='eager' "
                         "(stock log-n: 'entropy_invariant_eager').")
    return tuple(maps)


def entropy_by_length(
    model: torch.nn.Module,
    batches: Callable[[int], Sequence[torch.Tensor]],
    lengths: Sequence[int],
    *,
    causal: bool,
    normalize: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[LengthPoint]:
    """One ``LengthPoint`` per length of ``lengths``: the mean entropy per layer and head over the
    ``measured_rows`` of every sequence of ``batches(length)`` (a list of ``(batch, length)`` id tensors)."""
    points = []
    for length in lengths:
        totals: torch.Tensor | None = None
        count = 0
        rows = measured_rows(length, causal)
        for input_ids in batches(length):
            maps = attention_maps(model, input_ids)
            # (layers, batch, heads, rows) → sum over batch and rows
            entropy = torch.stack([row_entropy(layer[:, :, rows], normalize) for layer in maps])
            summed = entropy.sum(dim=(1, 3))
            totals = summed if totals is None else totals + summed
            count += entropy.shape[1] * entropy.shape[3]
        if totals is None:
            raise ValueError(f"no input sequences at length {length}.")
        points.append(LengthPoint(length, mean_log_keys(length, causal), (totals / count).tolist(), count))
        if progress is not None:
            progress(length)
    return points


def fit_slope(log_keys: Sequence[float], entropy: Sequence[float]) -> float:
    """Least-squares slope of ``entropy`` against ``log_keys`` (dH/d log n); NaN with fewer than 2 points."""
    if len(log_keys) < 2:
        return math.nan
    mean_x, mean_y = sum(log_keys) / len(log_keys), sum(entropy) / len(entropy)
    spread = sum((x - mean_x) ** 2 for x in log_keys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(log_keys, entropy)) / spread


def head_slopes(points: Sequence[LengthPoint]) -> list[list[float]]:
    """``fit_slope`` of every layer and head over ``points``: ``[layer][head]``."""
    x = [point.log_keys for point in points]
    layers, heads = len(points[0].entropy), len(points[0].entropy[0])
    return [[fit_slope(x, [point.entropy[layer][head] for point in points]) for head in range(heads)]
            for layer in range(layers)]


def diffuse_heads(points: Sequence[LengthPoint], reference: int,
                  threshold: float = 0.5) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs whose entropy at the length ``reference`` is at least ``threshold`` of the
    uniform row's (H ≥ threshold · log nᵢ): heads that spread their attention rather than point."""
    point = min(points, key=lambda p: abs(p.length - reference))
    return [(layer, head) for layer, values in enumerate(point.entropy) for head, value in enumerate(values)
            if value >= threshold * point.log_keys]


__all__ = [
    "LengthPoint",
    "attention_maps",
    "diffuse_heads",
    "entropy_by_length",
    "fit_slope",
    "head_slopes",
    "mean_log_keys",
    "measured_rows",
    "row_entropy",
]
