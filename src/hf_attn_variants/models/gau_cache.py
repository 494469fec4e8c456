"""The decoding cache of FLASH GAU (``chunk_size``): a constant-size state instead of every past key.

``GAUChunkCacheLayer`` holds the open chunk's keys/values and Σ k′ᵀv of the closed chunks;
``chunk_cache_layer`` installs it in a ``DynamicCache``; ``check_chunk_cache`` refuses, in one sentence naming
``cache_implementation``, a cache that cannot hold it (static caches).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GAUChunkCacheLayer(DynamicLayer):
    """Per-layer cache of causal FLASH attention: the open chunk's keys/values plus Σ k'ᵀv of closed chunks.

    ``keys`` ``(batch, 1, r, 2s)`` hold [k ‖ k'·mask] of the r < g tokens of the current, incomplete
    chunk, ``values`` ``(batch, 1, r, e)`` their v, and ``linear_state`` ``(batch, s, e)`` (≥ float32) the
    sum of k'ᵀv over every complete chunk, so memory is O(g·(s + e) + s·e) whatever the length and a
    decoding step costs O(g + s·e). ``get_seq_length`` reports all tokens seen. A plain
    ``DynamicCache`` works too: the model swaps its empty ``DynamicLayer`` for this class on first use.
    Cropping is not supported (a sum of closed chunks cannot be rolled back).

    Rows left-padded off the chunk grid keep their own grid: ``phases`` holds each row's left padding mod g
    (on the host), so row b's chunks start at the columns ≡ phase_b (mod g) and its open chunk is the last
    (seen − phase_b) mod g of the r columns held (``open_lengths``); the columns before it belong to chunks
    the row has closed. A row that has seen padding only has no phase yet (``None``, open length 0): its
    first token sets it. ``phases=None``: every row's grid starts at column 0 (no padding, or whole chunks of
    it).
    """

    is_croppable = False

    def __init__(self, **kwargs: Any) -> None:
        """An empty layer: no open chunk, no state, no tokens seen.

        Args:
            **kwargs: passed to ``DynamicLayer``.
        """
        super().__init__(**kwargs)
        self.linear_state: torch.Tensor | None = None
        self.cumulative_length = 0
        self.phases: tuple[int | None, ...] | None = None

    def get_seq_length(self) -> int:
        """The number of tokens seen (closed chunks included), not the number of keys held.

        Returns:
            int: the tokens seen.
        """
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The mask's key length and offset for ``query_length`` new tokens: every token seen plus them, 0.

        Args:
            query_length (int): the number of new tokens.

        Returns:
            tuple[int, int]: ``(kv_length, kv_offset)``.
        """
        return self.cumulative_length + query_length, 0

    def open_lengths(self, chunk_size: int) -> list[int] | None:
        """Each row's open-chunk length, the last columns of ``keys`` that are its own (``None``: all rows).

        Args:
            chunk_size (int): g.

        Returns:
            list[int] | None: (seen − phase_b) mod g per row (0 without a phase yet), or ``None`` without
            ``phases``.
        """
        if self.phases is None:
            return None
        seen = self.cumulative_length
        return [0 if phase is None else (seen - phase) % chunk_size for phase in self.phases]

    def open_chunk(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """``(keys, values, linear_state)`` of the open chunk (``None`` before the first update).

        Returns:
            tuple: ``keys`` ``[B, 1, r, 2s]``, ``values`` ``[B, 1, r, e]`` (the model dtype; ``None`` when no
            chunk is open; with ``phases``, row b's own are its last ``open_lengths()[b]``) and
            ``linear_state`` ``[B, s, e]`` (≥ float32; ``None`` until a chunk closed, or zeros).
        """
        if not self.is_initialized or self.keys.numel() == 0:  # type: ignore[union-attr]
            return None, None, self.linear_state
        return self.keys, self.values, self.linear_state

    def store(
        self, keys: torch.Tensor, values: torch.Tensor, state: torch.Tensor, added: int, chunk_size: int,
        phases: list[int | None] | tuple[int | None, ...] | None = None,
    ) -> None:
        """Keep the trailing incomplete chunk of a segment that starts on a chunk boundary.

        With ``phases`` (their first store) or earlier ones, the last max_b (open length of row b) columns
        instead: each row's own open chunk, right-aligned.

        Args:
            keys (torch.Tensor): ``[B, 1, n, 2s]``, [k ‖ k'·mask] of the segment (the open chunk's earlier
                tokens included), the model dtype.
            values (torch.Tensor): ``[B, 1, n, e]``, their v.
            state (torch.Tensor): ``[B, s, e]`` (≥ float32), Σ k'ᵀv over every closed chunk.
            added (int): the number of new tokens in the segment.
            chunk_size (int): g.
            phases (list | tuple | None): each row's left padding mod g (``None``: no token yet), from the
                prefill of rows off the grid on; ``None`` keeps the layer's.
        """
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        if phases is not None:  # every row's grid at column 0 again: the plain layout (one op call)
            self.phases = tuple(phases) if any(phase != 0 for phase in phases) else None
        self.cumulative_length += added
        opened = self.open_lengths(chunk_size)
        kept = keys.shape[-2] % chunk_size if opened is None else max(opened)
        self.keys, self.values = keys[..., keys.shape[-2] - kept:, :], values[..., keys.shape[-2] - kept:, :]
        self.linear_state = state

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Refuse: the layer is written by ``store``, not by ``Cache.update``.

        Args:
            key_states (torch.Tensor): unused.
            value_states (torch.Tensor): unused.
            *args: unused.
            **kwargs: unused.

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError(
            "GAUChunkCacheLayer is written by GatedAttentionUnit.store(), not by Cache.update()."
        )

    def reset(self) -> None:
        """Empty the open chunk, the state and the token count."""
        super().reset()
        self.linear_state = None
        self.cumulative_length = 0
        self.phases = None

    def crop(self, tokens_to_remove: int) -> None:
        """Refuse: a sum of closed chunks cannot be rolled back.

        Args:
            tokens_to_remove (int): unused.

        Raises:
            ValueError: always.
        """
        raise ValueError(
            "A FLASH (chunk_size) cache cannot be cropped: closed chunks are summed into one state."
        )

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch (beam search): the open chunk and the state alike.

        Args:
            beam_idx (torch.LongTensor): ``[B]``, the batch row each new row takes.
        """
        super().reorder_cache(beam_idx)
        if self.linear_state is not None:
            self.linear_state = self.linear_state.index_select(0, beam_idx.to(self.linear_state.device))
        if self.phases is not None:
            self.phases = tuple(self.phases[row] for row in beam_idx.tolist())

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times: the open chunk and the state alike.

        Args:
            repeats (int): copies per row.
        """
        super().batch_repeat_interleave(repeats)
        if self.linear_state is not None:
            self.linear_state = self.linear_state.repeat_interleave(repeats, dim=0)
        if self.phases is not None:
            self.phases = tuple(phase for phase in self.phases for _ in range(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the batch rows ``indices``: the open chunk and the state alike.

        Args:
            indices (torch.Tensor): ``[B']`` batch indices (int64) or a ``[B]`` bool mask.
        """
        super().batch_select_indices(indices)
        if self.linear_state is not None:
            self.linear_state = self.linear_state[indices, ...]
        if self.phases is not None:
            rows = indices.nonzero()[:, 0] if indices.dtype == torch.bool else indices
            self.phases = tuple(self.phases[row] for row in rows.tolist())


def check_chunk_cache(cache: Cache | None, batch_size: int) -> None:
    """Refuse, in one sentence, a cache that cannot hold the FLASH chunk state, or holds other rows.

    Only a dynamic cache holds the state; one of other rows than the input's would broadcast over them.

    Args:
        cache (Cache | None): the cache passed to the model.
        batch_size (int): the input's rows.

    Raises:
        ValueError: a layer of ``cache`` is not a ``DynamicLayer`` (static caches and their variants), or a
            chunk layer holds another number of rows.
    """
    for layer in getattr(cache, "layers", ()):
        keys, _, state = layer.open_chunk() if isinstance(layer, GAUChunkCacheLayer) else (None, None, None)
        held = state if state is not None else keys
        if held is not None and held.shape[0] != batch_size:
            raise ValueError(f"The cache holds {held.shape[0]} rows and the input has {batch_size}: a "
                             "cache continues the rows it was built for.")
    fixed = sorted({type(layer).__name__ for layer in getattr(cache, "layers", ())
                    if not isinstance(layer, DynamicLayer)})
    if fixed:
        raise ValueError(
            "GAU with chunk_size (FLASH) keeps its past as a constant-size chunk state that only a dynamic "
            f"cache can hold, but got a {type(cache).__name__} of {', '.join(fixed)}: generate with "
            "cache_implementation='dynamic' (the default) instead of 'static' or its variants."
        )


def chunk_cache_layer(cache: Cache, layer_idx: int) -> GAUChunkCacheLayer:
    """The ``GAUChunkCacheLayer`` of ``layer_idx``, installed in place of an unused ``DynamicLayer``.

    Args:
        cache (Cache): a ``DynamicCache`` (layers are appended up to ``layer_idx``).
        layer_idx (int): the layer.

    Returns:
        GAUChunkCacheLayer: the layer's chunk cache.

    Raises:
        TypeError: the cache's layer is of another type and already holds tokens.
    """
    while len(cache.layers) <= layer_idx:
        cache.layers.append(GAUChunkCacheLayer())
    layer = cache.layers[layer_idx]
    if isinstance(layer, GAUChunkCacheLayer):
        return layer
    if type(layer) is DynamicLayer and layer.get_seq_length() == 0:
        cache.layers[layer_idx] = GAUChunkCacheLayer()
        return cache.layers[layer_idx]  # type: ignore[return-value]
    raise TypeError(
        f"GAU with chunk_size needs a DynamicCache (or GAUChunkCacheLayer layers); layer {layer_idx} of the "
        f"cache is a {type(layer).__name__} that already holds {layer.get_seq_length()} tokens."  # type: ignore[union-attr]
    )


__all__ = ["GAUChunkCacheLayer", "check_chunk_cache", "chunk_cache_layer"]
