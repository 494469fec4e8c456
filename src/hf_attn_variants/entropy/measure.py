"""The entropy of attention rows against the number of keys each row sees.

For row i of an attention map, H = −Σⱼ pᵢⱼ log pᵢⱼ (nats). A row that spreads evenly over its nᵢ visible
keys has H = log nᵢ; Su's entropy-invariance argument (2021, "从熵不变性看Attention的Scale操作")
asks for logits scaled by log nᵢ so that H stays put as nᵢ grows.

``entropy_by_length`` measures H per layer and head at each input length n: every row of a bidirectional
model (nᵢ = n), the rows of the second half of a causal one (nᵢ ∈ (n/2, n]). It reduces each layer's map
as the layer returns it (``layer_entropy_sums``), so one layer's map is alive at a time, not the model's:
8 layers × 8 heads at 16k tokens are 64 GiB of fp32 maps together, 8 GiB one at a time. ``fit_slope`` gives
dH/d log n by least squares over the lengths: near 0 where the entropy holds still, near 1 where a head
stays as diffuse as the uniform row.

Rows that are not probabilities (GAU's relu², Laplace) are normalised to sum to 1 first when ``normalize``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..models.layers import widest_dtype


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
    """Mean log nᵢ over ``measured_rows`` (causal row i sees i + 1 keys); ``ValueError`` for a length
    below 1."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}.")
    if not causal:
        return math.log(length)
    rows = range(length // 2, length)
    return sum(math.log(i + 1) for i in rows) / len(rows)


def row_entropy(attention: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """H of every row of ``attention`` ``(..., q, k)`` → ``(..., q)``; 0 · log 0 = 0. ``normalize``: each row
    divided by its sum first (rows without mass stay 0). In float64 (``widest_dtype``: float32 on MPS)."""
    probs = attention.to(widest_dtype(attention.device))
    if normalize:
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny)
    return torch.special.entr(probs).sum(-1)


def layer_memory_bytes(length: int, heads: int) -> float:
    """Bytes ``layer_entropy_sums`` needs per sequence of ``length`` tokens for a layer of ``heads`` heads:
    the layer's fp32 scores and probabilities (2 · 4 · heads · n²) and one head's float64 copy and entropy
    terms (2 · 8 · n²). 20 GiB at 16k tokens and 8 heads."""
    return (8.0 * heads + 16.0) * length * length


def summed_row_entropy(attention: torch.Tensor, rows: slice, normalize: bool = False) -> torch.Tensor:
    """Σ over batch and ``rows`` of ``row_entropy`` for a map ``(batch, heads, q, k)`` → ``(heads,)`` float64,
    one head at a time, so the float64 copy is one head's."""
    return torch.stack([row_entropy(attention[:, head, rows], normalize).sum()
                        for head in range(attention.shape[1])])


def is_attention_map(value: Any, length: int) -> bool:
    """Whether ``value`` is an attention map ``(batch, heads, length, length)``."""
    return (isinstance(value, torch.Tensor) and value.dim() == 4
            and tuple(value.shape[-2:]) == (length, length))


@torch.no_grad()
def layer_entropy_sums(model: torch.nn.Module, input_ids: torch.Tensor, rows: slice,
                       normalize: bool = False) -> torch.Tensor:
    """Σ over batch and ``rows`` of every layer's row entropies, ``(layers, heads)`` float64, layer by layer.

    The model runs with ``output_attentions``; a forward hook, put before every other hook (``prepend``),
    takes the map from each module that returns ``(output, map, ...)``, reduces it with
    ``summed_row_entropy`` and passes ``(output, None, ...)`` on, so neither the layers nor Transformers'
    output recording keep it.
    ``ValueError`` when no module returned a map (e.g. SDPA)."""
    length = input_ids.shape[-1]
    sums: list[torch.Tensor] = []

    def reduce(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if not (isinstance(output, tuple) and len(output) > 1 and is_attention_map(output[1], length)):
            return None
        sums.append(summed_row_entropy(output[1], rows, normalize))
        return (output[0], None, *output[2:])

    handles = [module.register_forward_hook(reduce, prepend=True) for module in model.modules()]
    try:
        model(input_ids=input_ids, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    if not sums:
        raise ValueError("the model returned no attention weights: load it with attn_implementation='eager' "
                         "(stock log-n: 'entropy_invariant_eager').")
    return torch.stack(sums)


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
    ``measured_rows`` of every sequence of ``batches(length)`` (a list of ``(batch, length)`` id tensors),
    one layer's map at a time (``layer_entropy_sums``)."""
    points = []
    for length in lengths:
        totals: torch.Tensor | None = None
        count = 0
        rows = measured_rows(length, causal)
        for input_ids in batches(length):
            summed = layer_entropy_sums(model, input_ids, rows, normalize)
            totals = summed if totals is None else totals + summed
            count += input_ids.shape[0] * len(range(length)[rows])
        if totals is None:
            raise ValueError(f"no input sequences at length {length}.")
        points.append(LengthPoint(length, mean_log_keys(length, causal), (totals / count).tolist(), count))
        if progress is not None:
            progress(length)
    return points


def fit_slope(log_keys: Sequence[float], entropy: Sequence[float]) -> float:
    """Least-squares slope of ``entropy`` against ``log_keys`` (dH/d log n); NaN with fewer than 2 distinct
    points (one length, or the same length twice); ``ValueError`` when the two sequences differ in length."""
    if len(log_keys) != len(entropy):
        raise ValueError(f"log_keys and entropy must have one value per point, got {len(log_keys)} and "
                         f"{len(entropy)}.")
    if len(log_keys) < 2:
        return math.nan
    mean_x, mean_y = sum(log_keys) / len(log_keys), sum(entropy) / len(entropy)
    spread = sum((x - mean_x) ** 2 for x in log_keys)
    if spread == 0:
        return math.nan
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(log_keys, entropy)) / spread


def head_slopes(points: Sequence[LengthPoint]) -> list[list[float]]:
    """``fit_slope`` of every layer and head over ``points``: ``[layer][head]`` (``[]`` without points)."""
    if not points:
        return []
    x = [point.log_keys for point in points]
    layers, heads = len(points[0].entropy), len(points[0].entropy[0])
    return [[fit_slope(x, [point.entropy[layer][head] for point in points]) for head in range(heads)]
            for layer in range(layers)]


def diffuse_heads(points: Sequence[LengthPoint], reference: int,
                  threshold: float = 0.5) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs whose entropy at the length ``reference`` is at least ``threshold`` of the
    uniform row's (H ≥ threshold · log nᵢ): heads that spread their attention rather than point (none without
    points)."""
    if not points:
        return []
    point = min(points, key=lambda p: abs(p.length - reference))
    return [(layer, head) for layer, values in enumerate(point.entropy) for head, value in enumerate(values)
            if value >= threshold * point.log_keys]


__all__ = [
    "LengthPoint",
    "diffuse_heads",
    "entropy_by_length",
    "fit_slope",
    "head_slopes",
    "is_attention_map",
    "layer_memory_bytes",
    "layer_entropy_sums",
    "mean_log_keys",
    "measured_rows",
    "row_entropy",
    "summed_row_entropy",
]
