"""FLASH's per-sequence state in vLLM's slots, without vLLM: the decoding step, and what a prefill continues.

A slot holds, for one sequence in one layer, four tensors of a size the config fixes: the open chunk's keys
[k ‖ k'] ``(g, 2s)`` and values ``(g, e)`` in the model's dtype, and two sums in at least float32: S = Σ k'ᵀv
over the closed chunks and O = Σ k'ᵀv over the open chunk's rows, each ``(s, e)``. A decoding step adds its
own token to O as a rank-1 update, and a step that completes a chunk moves O into S; both are masked
arithmetic, so the step has no branch on which rows close their chunk, reads nothing back to the host and
makes no shape from the data. vLLM can then capture it in a CUDA graph: on CUDA its linear-attention backend
captures batches of one-token decodes unless ``enforce_eager`` is set. (Folding a chunk from its g rows
instead costs g·s·e per row, for every row of the batch; counting the open rows in S and taking them back
out of q'·S loses the numerator to cancellation where q'·S is large, early in a sequence.)

A prefill continues from S and the open rows (``SequenceState.open_chunk``) and stores S, the new open rows
and their O (``SequenceState.store``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..models.gau_kernels import flash_decode_step


def open_rows_sum(lin_keys: torch.Tensor, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """O = Σ k'ᵀv over rows of an open chunk.

    Args:
        lin_keys (torch.Tensor): ``[..., M, S]`` the rows' linear keys k'.
        values (torch.Tensor): ``[..., M, E]`` their values.
        dtype (torch.dtype): the sum's dtype (at least float32).

    Returns:
        torch.Tensor: ``[..., S, E]`` in ``dtype``.
    """
    return torch.matmul(lin_keys.to(dtype).transpose(-1, -2), values.to(dtype))


def decode_in_slots(unit: Any, x: Any, slots: tuple[torch.Tensor, ...], index: torch.Tensor,
                    positions: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """One FLASH decoding step for a batch of sequences, each at its place r = position mod g in its chunk.

    The new token's key and value become row r of its slot and join O; the numerator is
    ``flash_decode_step``'s, over the slot's first ``rows`` rows with those after r masked (they may hold
    anything, NaN included). A row that completes its chunk (r = g − 1) moves O into S. A row at position 0
    starts a sequence from empty sums, whatever its slot held: vLLM decodes a one-token prompt (its linear
    backend counts every one-token query as a decode), and pads a captured batch with such rows on its null
    block.

    Args:
        unit (Any): the ``FlashGatedAttentionUnit`` (``chunk_size`` g, ``key_size`` S).
        x (Any): the tokens' ``FlashInputs``, ``[B, 1, ·]`` (queries carrying their factors), the model dtype.
        slots (tuple[torch.Tensor, ...]): the layer's slots: keys ``[N, g, 2S]``, values ``[N, g, E]``, and
            the sums S and O ``[N, S, E]``.
        index (torch.Tensor): ``[B]`` int64, each sequence's slot.
        positions (torch.Tensor): ``[B]`` int64, each new token's position in its sequence.
        rows (int | None): the open chunk's rows to read, at least max(r) + 1. ``None``: all g, a shape that
            does not depend on the data, as a CUDA graph needs; an eager step reads max(r) + 1 (its caller
            reads that bound back from the device).

    Returns:
        torch.Tensor: the numerators ``[B, 1, E]``, in at least float32.
    """
    keys_slot, values_slot, closed_slot, open_slot = slots
    opened = positions % unit.chunk_size
    keys_slot[index, opened] = torch.cat([x.quad_k, x.lin_k], dim=-1)[:, 0].to(keys_slot.dtype)
    values_slot[index, opened] = x.value[:, 0].to(values_slot.dtype)
    rows = unit.chunk_size if rows is None else rows
    visible = torch.arange(rows, device=index.device)[None] <= opened[:, None]
    fresh = (positions == 0)[:, None, None]  # a one-token prompt: vLLM decodes it at position 0
    closed = closed_slot[index].masked_fill(fresh, 0.0)
    opened_sum = open_slot[index].masked_fill(fresh, 0.0) + open_rows_sum(x.lin_k, x.value, open_slot.dtype)
    quad_k, lin_k = keys_slot[index, :rows].split(unit.key_size, dim=-1)
    values = values_slot[index, :rows].masked_fill(~visible[..., None], 0.0)
    numerator, closed = flash_decode_step(x.quad_q, x.lin_q, quad_k, lin_k, values, closed, visible)
    closing = (opened == unit.chunk_size - 1)[:, None, None]
    closed_slot[index] = torch.where(closing, closed + opened_sum, closed).to(closed_slot.dtype)
    open_slot[index] = opened_sum.masked_fill(closing, 0.0).to(open_slot.dtype)
    return numerator


class SequenceState:
    """One sequence's FLASH state in its vLLM slot, behind the interface of ``GAUChunkCacheLayer`` that
    ``FlashGatedAttentionUnit.continue_from`` reads (``get_seq_length``, ``open_chunk``) and writes
    (``store``). ``seen`` tokens are already in it; a new sequence (``seen == 0``) starts from zero sums."""

    def __init__(self, slots: tuple[torch.Tensor, ...], index: int, seen: int, chunk_size: int,
                 key_size: int) -> None:
        self.keys, self.values, self.closed, self.opened = (slot[index] for slot in slots)
        self.seen = seen
        self.chunk_size = chunk_size
        self.key_size = key_size
        if seen == 0:
            self.closed.zero_()
            self.opened.zero_()

    def get_seq_length(self) -> int:
        return self.seen

    def open_chunk(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The open chunk's keys and values ``[1, 1, M, ·]`` (``None`` on a chunk boundary), and S
        ``[1, S, E]``."""
        opened = self.seen % self.chunk_size
        if not opened:
            return None, None, self.closed[None]
        return self.keys[None, None, :opened], self.values[None, None, :opened], self.closed[None]

    def store(self, keys: torch.Tensor, values: torch.Tensor, state: torch.Tensor, added: int,
              chunk_size: int) -> None:
        """Keep the open rows of a segment ``(1, 1, m, ·)`` that starts on a chunk boundary and their O, and S
        (``state``)."""
        tail = keys.shape[-2] % chunk_size
        open_keys, open_values = keys[0, 0, keys.shape[-2] - tail:], values[0, 0, values.shape[-2] - tail:]
        self.keys[:tail] = open_keys
        self.values[:tail] = open_values
        self.closed.copy_(state[0])
        self.opened.copy_(open_rows_sum(open_keys[:, self.key_size:], open_values, self.opened.dtype))
        self.seen += added


__all__ = ["SequenceState", "decode_in_slots", "open_rows_sum"]
