"""``head_mask``: gate every head's output by a number, without touching the weights.

Michel et al. (2019), eq. 1–2: MHAtt(x) = Σₕ ξₕ Attₕ(x) with ξₕ ∈ {0, 1} (here any real number, so the
same gate also carries the gradient ∂L/∂ξₕ used for importance). Implemented as a forward pre-hook on
the output projection (o_proj / BERT's attention output dense), whose input is the concatenation of
the head outputs: the hook multiplies head h's block of ``head_dim`` features by ``mask[layer, h]``.
Works for this project's families and for stock models alike, and composes with physical pruning:
the mask is indexed by *original* head numbers, and only the heads a layer still has are read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from .adapters import HeadAdapter, get_adapter


class HeadGate:
    """Forward pre-hook scaling head blocks of the output projection's input by ``mask[layer, kept]``."""

    def __init__(self, mask: torch.Tensor, layer: int, kept: list[int], head_dim: int) -> None:
        self.mask = mask
        self.layer = layer
        self.kept = torch.tensor(kept, dtype=torch.long, device=mask.device)
        self.head_dim = head_dim

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            hidden, rest = args[0], args[1:]
        else:
            hidden, rest = kwargs.pop("input"), ()
        gate = self.mask[self.layer].index_select(0, self.kept).repeat_interleave(self.head_dim)
        hidden = hidden * gate.to(device=hidden.device, dtype=hidden.dtype)
        return (hidden, *rest), kwargs


def check_mask(adapter: HeadAdapter, mask: Any) -> torch.Tensor:
    """Validate a head mask: a ``(num_layers, num_heads)`` tensor, finite where heads exist; returns it as
    float."""
    shape = (adapter.num_layers, adapter.num_heads)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor of shape {shape}, got {type(mask).__name__}.")
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask must have shape (num_layers, num_heads) = {shape}, got {tuple(mask.shape)}.")
    if not mask.is_floating_point():
        mask = mask.float()
    alive = adapter.alive().to(mask.device)
    if not torch.isfinite(mask.detach()[alive]).all():
        raise ValueError("mask must be finite for every head the model still has (NaN/inf found).")
    return mask


@contextlib.contextmanager
def head_mask(model: PreTrainedModel, mask: torch.Tensor) -> Iterator[PreTrainedModel]:
    """Context manager: inside it, head h of layer l contributes ``mask[l, h]`` × its output.

    ``mask`` has shape ``(num_layers, num_heads)`` indexed by the heads' original numbers (entries of
    heads already pruned are ignored). Weights are untouched; the hooks are removed on exit, also on
    exceptions. A mask that requires grad makes the gates differentiable (used for head importance).
    """
    adapter = get_adapter(model)
    mask = check_mask(adapter, mask)
    handles = []
    try:
        for layer in range(adapter.num_layers):
            gate = HeadGate(mask, layer, adapter.kept_heads(layer), adapter.head_dim)
            projection = adapter.output_projection(layer)
            handles.append(projection.register_forward_pre_hook(gate, with_kwargs=True))
        yield model
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["HeadGate", "check_mask", "head_mask"]
