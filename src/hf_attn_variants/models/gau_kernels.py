"""Attention kernels of the Gated Attention Unit.

Shapes: B batch, T tokens (T_q queries, T_k keys), S = s the key size, E = e the expansion width (values),
G = g the chunk size, C = ⌈T/g⌉ chunks. GAU has one head, so no head dimension.

- ``relu2_attention`` / ``softmax_attention``: quadratic attention with every factor in q, in at least
  float32; blocked autograd Functions (``Relu2Attention``, ``SoftmaxAttention``) keep nothing n×n.
- ``laplace_attention``: Mega's Laplace function.
- ``flash_mixed_chunk_attention``: the FLASH op (exact relu² inside chunks of g tokens, linear attention
  across chunks) with three implementations of the same arguments, as flash-linear-attention lays out its
  ops: ``flash_mixed_chunk_reference`` (the dense effective matrix, ``flash_effective_weights``),
  ``flash_mixed_chunk_torch`` (chunked, in the inputs' dtype) and ``flash_mixed_chunk_triton``
  (``gau_triton``'s kernels); ``FlashState`` carries a causal sequence's state (and open chunk) from one call
  to the next.
- ``DocumentChunks``: packed documents laid out so that every document starts on a chunk boundary.
- ``roll_rows``: each row rotated so that a left-padded row's chunks start at its first token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from .layers import document_positions, upcast, widest_dtype

LAPLACE_MU = math.sqrt(0.5)
LAPLACE_SIGMA = 1.0 / math.sqrt(4.0 * math.pi)


def laplace_attention(scores: torch.Tensor) -> torch.Tensor:
    """Mega's Laplace attention function 0.5·(1 + erf((a − μ) / (σ√2))), μ = √½, σ = 1/√(4π).

    Ma et al. (2023), "Mega: Moving Average Equipped Gated Attention", §3.3: chosen to approximate relu² near
    μ while staying bounded in [0, 1] with non-vanishing gradients, a stabler drop-in for relu². Unlike
    relu² it is positive for every logit, so hidden keys are zeroed after it (as for relu²).

    Args:
        scores (torch.Tensor): a = q·k/√s, any shape (``[B, 1, T_q, T_k]``), at least float32.

    Returns:
        torch.Tensor: the same shape and dtype, in [0, 1].
    """
    return 0.5 * (1.0 + torch.erf((scores - LAPLACE_MU) / (LAPLACE_SIGMA * math.sqrt(2.0))))


ATTENTION_BLOCK_ELEMENTS = 1 << 22
"""Score elements per query block of ``relu2_attention`` / ``softmax_attention`` (16 MiB of float32; more past
about 23k tokens, ``_query_blocks``)."""


def uses_blocks(queries: int, keys: int) -> bool:
    """Whether quadratic attention runs in query blocks at this size.

    It does beyond ``ATTENTION_BLOCK_ELEMENTS`` scores (``modeling_gau.gau_attention_path`` decides with it).

    Args:
        queries (int): T_q.
        keys (int): T_k.

    Returns:
        bool: whether T_q·T_k > ``ATTENTION_BLOCK_ELEMENTS``.
    """
    return queries * keys > ATTENTION_BLOCK_ELEMENTS


def _query_blocks(queries: int, keys: int, causal_offset: int | None) -> list[tuple[int, int, int]]:
    """(start, stop, key limit) of each query block; a causal block needs no key after its last query.

    c blocks of ⌈T_q / c⌉ rows: c, a power of two, doubles while c · ⌊ATTENTION_BLOCK_ELEMENTS / T_k⌋ < T_q
    and 2c · (2c − 1) ≤ T_q, so that the c blocks are never empty. Under ``torch.compile`` the graph then
    holds for every length with the same c and the same bound setting it: range guards on T_q
    (``range(0, T_q, rows)`` fixed T_q, and each new length compiled again). The second bound keeps c at
    about √T_q at most: past about 23k tokens a block holds more than ``ATTENTION_BLOCK_ELEMENTS`` scores (4×
    at 64k, 16× at 128k).
    """
    rows = max(1, ATTENTION_BLOCK_ELEMENTS // max(keys, 1))
    count = 1
    while count * rows < queries and 2 * count * (2 * count - 1) <= queries:
        count *= 2
    size = (queries + count - 1) // count
    blocks = []
    for index in range(count):  # (c − 1)·⌈T_q/c⌉ ≤ T_q (c² − c ≤ T_q): no min, which dynamo 2.7 guards on
        stop = queries if index == count - 1 else (index + 1) * size
        blocks.append((index * size, stop, keys if causal_offset is None else causal_offset + stop))
    return blocks


def _forward_in_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    causal_offset: int | None,
    block: Callable[..., tuple[torch.Tensor, ...]],
) -> list[torch.Tensor]:
    """``block(query rows, keys, values, mask)`` over the query blocks (each with the keys it may see).

    Every output of ``block`` is concatenated along the query rows.
    """
    parts = []
    for start, stop, limit in _query_blocks(query.shape[-2], key.shape[-2], causal_offset):
        block_mask = None if mask is None else mask[..., start:stop, :limit]
        parts.append(block(query[..., start:stop, :], key[..., :limit, :], value[..., :limit, :], block_mask))
    return [torch.cat(outputs, dim=-2) if len(outputs) > 1 else outputs[0] for outputs in zip(*parts)]


def _backward_in_blocks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    grad_output: torch.Tensor,
    causal_offset: int | None,
    block: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    *row_stats: torch.Tensor,
) -> tuple[torch.Tensor | None, ...]:
    """Gradients of out = P v with P = f(q kᵀ) from one block at a time.

    ``block(query rows, keys, values, mask, dO rows, *row_stats rows)`` recomputes the block's weights P and
    returns them with dS = ∂L/∂(q kᵀ); then dV += Pᵀ dO, dQ = dS K, dK += dSᵀ Q. Returns the gradients of
    ``Function.forward``'s five inputs.
    """
    grad_query = torch.empty_like(query)
    grad_key = torch.zeros_like(key)
    grad_value = torch.zeros_like(value)
    for start, stop, limit in _query_blocks(query.shape[-2], key.shape[-2], causal_offset):
        block_mask = None if mask is None else mask[..., start:stop, :limit]
        block_query, block_grad = query[..., start:stop, :], grad_output[..., start:stop, :]
        weights, grad_scores = block(
            block_query, key[..., :limit, :], value[..., :limit, :], block_mask, block_grad,
            *(stat[..., start:stop, :] for stat in row_stats),
        )
        grad_value[..., :limit, :] += torch.matmul(weights.transpose(-1, -2), block_grad)
        grad_query[..., start:stop, :] = torch.matmul(grad_scores, key[..., :limit, :])
        grad_key[..., :limit, :] += torch.matmul(grad_scores.transpose(-1, -2), block_query)
    return grad_query, grad_key, grad_value, None, None


def _relu2_block_weights(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """relu(q kᵀ) of one query block with hidden keys set to 0 (in place on the fresh score buffer)."""
    scores = torch.matmul(query, key.transpose(-1, -2))
    if mask is not None:
        scores.masked_fill_(~mask, 0.0)
    return scores.relu_()


def _relu2_block_output(query, key, value, mask) -> tuple[torch.Tensor]:
    return (torch.matmul(_relu2_block_weights(query, key, mask).square_(), value),)


def _relu2_block_gradients(query, key, value, mask, grad) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's weights and dS, with d relu(a)²/da = 2 relu(a), 0 wherever the key is hidden or a ≤ 0."""
    activation = _relu2_block_weights(query, key, mask)
    grad_scores = torch.matmul(grad, value.transpose(-1, -2)).mul_(activation).mul_(2.0)
    return activation.square_(), grad_scores


class Relu2Attention(torch.autograd.Function):
    """out = relu(q kᵀ)² v over the visible keys in blocks of query rows, saving only q, k, v.

    Scores are recomputed in backward. The gradient uses d relu(a)²/da = 2 relu(a), which is 0 wherever a key
    is hidden or a ≤ 0; ``causal_offset`` lets a block skip the keys after its last query.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, causal_offset: int | None) -> torch.Tensor:
        """Attend block by block; arguments and result as ``relu2_attention``.

        Args:
            ctx (Any): autograd's context.
            query (torch.Tensor): ``[B, T_q, S]``, float32 or float64.
            key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
            value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
            mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool (``True`` = visible), or ``None``.
            causal_offset (int | None): the first query's position (causal), or ``None``.

        Returns:
            torch.Tensor: ``[B, T_q, E]``, the query's dtype.
        """
        (output,) = _forward_in_blocks(query, key, value, mask, causal_offset, _relu2_block_output)
        ctx.save_for_backward(query, key, value, mask)
        ctx.causal_offset = causal_offset
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Recompute each block's scores and return the gradients of q, k, v.

        Args:
            ctx (Any): autograd's context.
            grad_output (torch.Tensor): ``[B, T_q, E]``, ∂L/∂out.

        Returns:
            tuple: ∂L/∂q ``[B, T_q, S]``, ∂L/∂k ``[B, T_k, S]``, ∂L/∂v ``[B, T_k, E]``, ``None``, ``None``.
        """
        query, key, value, mask = ctx.saved_tensors
        return _backward_in_blocks(query, key, value, mask, grad_output, ctx.causal_offset,
                                   _relu2_block_gradients)


def relu2_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                    causal_offset: int | None = None, blocked: bool = False) -> torch.Tensor:
    """Σⱼ relu(q_i·k_j)² v_j over visible keys: quadratic relu² GAU with every positive factor in q.

    One expression (mask and relu in place on the score buffer): autograd keeps two n×n tensors, no-grad
    inference one.

    Args:
        query (torch.Tensor): ``[B, T_q, S]`` with every factor in it, float32 or float64.
        key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
        value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
        mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool (``True`` = visible), or ``None``; it carries
            causality.
        causal_offset (int | None): the first query's position when ``mask`` is causal, a promise that lets a
            block skip the keys after its last query (it hides nothing by itself), or ``None``.
        blocked (bool): query blocks through ``Relu2Attention`` instead, nothing n×n kept (``uses_blocks``
            says where the unit chooses it).

    Returns:
        torch.Tensor: ``[B, T_q, E]``, the query's dtype.
    """
    if blocked:
        return Relu2Attention.apply(query, key, value, mask, causal_offset)
    weights = _relu2_block_weights(query, key, mask)
    tracked = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)
    weights = weights.square() if tracked else weights.square_()
    return torch.matmul(weights, value)


def _masked_scores(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The scores q kᵀ with hidden keys at the most negative logit (in place on the fresh score buffer)."""
    scores = torch.matmul(query, key.transpose(-1, -2))
    if mask is not None:
        scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    return scores


def _softmax_block_output(query, key, value, mask) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _masked_scores(query, key, mask)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul(scores.sub_(lse).exp_(), value), lse


def _softmax_block_gradients(query, key, value, mask, grad, lse, delta) -> tuple[torch.Tensor, torch.Tensor]:
    """P = exp(S − lse), dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙ O)) with ``delta`` = rowsum(dO ⊙ O)."""
    probs = _masked_scores(query, key, mask).sub_(lse).exp_()
    grad_scores = torch.matmul(grad, value.transpose(-1, -2)).sub_(delta).mul_(probs)
    return probs, grad_scores


class SoftmaxAttention(torch.autograd.Function):
    """out = softmax(q kᵀ) v over the visible keys in blocks of query rows.

    FlashAttention's recomputation (Dao et al. 2022, arXiv:2205.14135) with torch matmuls, saving q, k, v,
    the output and the per-row log-sum-exp. Backward per block: P = exp(S − lse), dV += Pᵀ dO,
    dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙ O)), dQ = dS K, dK += dSᵀ Q.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, causal_offset: int | None) -> torch.Tensor:
        """Attend block by block, keeping each row's log-sum-exp; arguments as ``Relu2Attention.forward``.

        Args:
            ctx (Any): autograd's context.
            query (torch.Tensor): ``[B, T_q, S]`` carrying the logit scale, float32 or float64.
            key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
            value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
            mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool (``True`` = visible), or ``None``.
            causal_offset (int | None): the first query's position (causal), or ``None``.

        Returns:
            torch.Tensor: ``[B, T_q, E]``, the query's dtype.
        """
        output, lse = _forward_in_blocks(query, key, value, mask, causal_offset, _softmax_block_output)
        ctx.save_for_backward(query, key, value, mask, output, lse)
        ctx.causal_offset = causal_offset
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Recompute each block's probabilities from the saved log-sum-exp; the gradients of q, k, v.

        Args:
            ctx (Any): autograd's context.
            grad_output (torch.Tensor): ``[B, T_q, E]``, ∂L/∂out.

        Returns:
            tuple: ∂L/∂q ``[B, T_q, S]``, ∂L/∂k ``[B, T_k, S]``, ∂L/∂v ``[B, T_k, E]``, ``None``, ``None``.
        """
        query, key, value, mask, output, lse = ctx.saved_tensors
        delta = (grad_output * output).sum(-1, keepdim=True)
        return _backward_in_blocks(
            query, key, value, mask, grad_output, ctx.causal_offset, _softmax_block_gradients, lse, delta
        )


def softmax_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      causal_offset: int | None = None, blocked: bool = False) -> torch.Tensor:
    """Softmax(q kᵀ) v over visible keys for a q already carrying the logit scale; float32/float64 in and out.

    Rows without a visible key give zeros. One expression keeps a single n×n tensor (the probabilities) for
    backward.

    Args:
        query (torch.Tensor): ``[B, T_q, S]`` carrying the logit scale, float32 or float64.
        key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
        value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
        mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool (``True`` = visible), or ``None``.
        causal_offset (int | None): the first query's position when causal, or ``None``.
        blocked (bool): ``SoftmaxAttention`` instead (recomputed, activation memory linear in n).

    Returns:
        torch.Tensor: ``[B, T_q, E]``, the query's dtype.
    """
    if blocked:
        attended = SoftmaxAttention.apply(query, key, value, mask, causal_offset)
    else:
        attended = torch.matmul(_masked_scores(query, key, mask).softmax(-1), value)
    return attended if mask is None else attended * mask.any(-1, keepdim=True)


class FlashState(NamedTuple):
    """What causal FLASH carries from earlier tokens to the next ones (a cache, a vLLM slot).

    Attributes:
        linear (torch.Tensor | None): ``[B, S, E]`` float32 (float64 for float64 inputs, except from the
            Triton path), Σ k'ᵀv over every closed chunk (``None``: none yet).
        keys (torch.Tensor | None): ``[B, M, 2S]`` [k ‖ k'] (k' zero at padding) of the M < g tokens of the
            open chunk, the model dtype (``None`` when M = 0).
        values (torch.Tensor | None): ``[B, M, E]``, their values (``None`` when M = 0).
    """

    linear: torch.Tensor | None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


FLASH_IMPLEMENTATIONS = ("reference", "chunk", "triton")
"""The implementations of ``flash_mixed_chunk_attention``.

The O(n²) matrix W, the chunked torch path and the Triton kernels (``flash_mixed_chunk_triton``).
"""


class Float16Summaries(torch.autograd.Function):
    """S_c = k'_cᵀ v_c in float32 from float16 chunks.

    ∂L/∂S_c sums over the later chunks (``chunk_states_backward``) and grows with the length as H_c does, so
    the backward reads it as σ_c · (∂L/∂S_c / σ_c) (``gau_triton.state_scales``), as the Triton key kernel
    does: cast to float16 as it is, dk' and dv were ±inf past 65,504 where the true gradients fit.
    """

    @staticmethod
    def forward(ctx: Any, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The summaries; arguments and result as ``chunk_summaries``."""
        ctx.save_for_backward(keys, values)
        return torch.matmul(keys.transpose(-1, -2), values).float()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradients of k' ``[B, C, G, S]`` and of v ``[B, C, G, E]``, float16."""
        from .gau_triton import state_scales

        keys, values = ctx.saved_tensors
        scales = state_scales(grad)[..., None, None]
        scaled, factor = (grad / scales).to(keys.dtype), scales.to(keys.dtype)
        return (torch.matmul(values, scaled.transpose(-1, -2)) * factor,
                torch.matmul(keys, scaled) * factor)


def state_product(queries: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """q'·H_c in the queries' dtype, with float16's states scaled into range (``gau_triton.state_scales``).

    Args:
        queries (torch.Tensor): ``[B, C, G, S]`` the chunks' linear queries, the model dtype.
        states (torch.Tensor): ``[B, C, S, E]`` (or ``[B, 1, S, E]``) float32 H_c.

    Returns:
        torch.Tensor: ``[B, C, G, E]`` in the queries' dtype.
    """
    from .gau_triton import scales_states, state_scales  # the kernels' own rule (importable without triton)

    if not scales_states(queries.dtype):
        return torch.matmul(queries, states.to(queries.dtype))
    scales = state_scales(states)[..., None, None]  # of each distinct state, before the expand
    # One state a chunk before the cast: a broadcast state's gradient then sums the chunks in float32
    # (expand's backward), not inside the float16 product, where the sum passed 65,504.
    states = states.expand(*queries.shape[:2], *states.shape[-2:])
    return torch.matmul(queries, (states / scales).to(queries.dtype)) * scales.to(queries.dtype)


def chunk_summaries(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """S_c = k'_cᵀ v_c, the chunks' contributions to the linear state, float32 or more.

    Args:
        keys (torch.Tensor): ``[B, C, G, S]`` the chunks' linear keys, zero at padding, the model dtype.
        values (torch.Tensor): ``[B, C, G, E]``, the model dtype.

    Returns:
        torch.Tensor: ``[B, C, S, E]`` in ``compute_dtype`` (float16: ``Float16Summaries``).
    """
    from .gau_triton import scales_states

    if scales_states(keys.dtype):
        return Float16Summaries.apply(keys, values)
    return upcast(torch.matmul(keys.transpose(-1, -2), values))


AUTOCAST_DEVICES = ("cpu", "cuda")
"""Where the op follows autocast (``torch.is_autocast_enabled`` raises for a memory trace's meta device)."""


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """Autocast's dtype on ``device`` while it is on there (``AUTOCAST_DEVICES``), else ``None``.

    Args:
        device (torch.device): where the op runs.

    Returns:
        torch.dtype | None: e.g. ``torch.bfloat16`` inside ``torch.autocast("cuda", dtype=torch.bfloat16)``.
    """
    on = device.type in AUTOCAST_DEVICES and torch.is_autocast_enabled(device.type)
    return torch.get_autocast_dtype(device.type) if on else None


def check_flash_arguments(
    quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, lin_k: torch.Tensor, value: torch.Tensor,
    chunk_size: int, causal: bool, key_mask: torch.Tensor | None, segments: torch.Tensor | None,
    initial_state: FlashState | None, dropout: float, training: bool, implementation: str,
) -> None:
    """``ValueError`` naming the argument of ``flash_mixed_chunk_attention`` that the op cannot take.

    Shapes, dtypes, devices and numbers: nothing is read from a tensor (a training step would wait for each
    read; ``segments``' values are the caller's to get right). The Triton kernels index by these shapes, so a
    mismatch there would read or write out of bounds instead of failing.

    Args: as for ``flash_mixed_chunk_attention``.
    """
    if implementation not in FLASH_IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {FLASH_IMPLEMENTATIONS}, got {implementation!r}.")
    if implementation == "triton" and training and dropout > 0:
        raise ValueError(f"dropout={dropout:g} while training: implementation='triton' has no attention "
                         "dropout; use 'chunk' (the models do so by themselves) or dropout=0.")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}.")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}.")
    # Eager only: compiled, dynamo may make a config's float symbolic, which a checkpoint's subgraph cannot
    # compare (the models' configs check the range when built).
    if not torch.compiler.is_compiling() and not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout must be in [0, 1], got {dropout!r}.")
    if quad_q.dim() != 3 or not quad_q.is_floating_point():
        raise ValueError(f"quad_q must be a [B, T, S] floating tensor, got {quad_q.dim()} dims of "
                         f"{quad_q.dtype}.")
    batch, length, key_size = quad_q.shape
    mixed = quad_q.device.type in AUTOCAST_DEVICES and autocast_dtype(quad_q.device) is None  # else cast
    for name, tensor in (("quad_k", quad_k), ("lin_q", lin_q), ("lin_k", lin_k), ("value", value)):
        width = tensor.shape[-1] if name == "value" else key_size
        if (tensor.shape != (batch, length, width) or not tensor.is_floating_point()
                or mixed and tensor.dtype != quad_q.dtype):
            raise ValueError(f"{name} must be a [{batch}, {length}, {'E' if name == 'value' else key_size}] "
                             f"floating tensor like quad_q, got {list(tensor.shape)} of {tensor.dtype}.")
    state = initial_state if initial_state is not None else FlashState(None)
    if not isinstance(state, FlashState):
        raise ValueError(f"initial_state must be a FlashState or None, got {type(initial_state).__name__}.")
    others: dict[str, torch.Tensor | None] = {
        "quad_k": quad_k, "lin_q": lin_q, "lin_k": lin_k, "value": value, "key_mask": key_mask,
        "segments": segments, "initial_state": state.linear if state.keys is None else state.keys}
    for name, other in others.items():
        if other is not None and other.device != quad_q.device:
            raise ValueError(f"{name} is on {other.device} and quad_q on {quad_q.device}: the op's tensors "
                             "must be on one device.")
    if not causal and state.keys is not None:
        raise ValueError("initial_state has an open chunk, which only a causal row continues: pass "
                         "causal=True, or a FlashState without keys and values.")
    opened = 0 if state.keys is None else state.keys.shape[1]
    open_shapes = (None if state.keys is None else state.keys.shape,
                   None if state.values is None else state.values.shape)
    expected = (None, None) if state.keys is None else ((batch, opened, 2 * key_size),
                                                        (batch, opened, value.shape[-1]))
    if opened >= chunk_size or open_shapes != expected:
        raise ValueError(f"initial_state's open chunk must hold M < chunk_size={chunk_size} keys [{batch}, "
                         f"M, {2 * key_size}] and values [{batch}, M, {value.shape[-1]}].")
    if state.linear is not None and state.linear.shape != (batch, key_size, value.shape[-1]):
        raise ValueError(f"initial_state.linear must be [{batch}, {key_size}, {value.shape[-1]}], got "
                         f"{list(state.linear.shape)}.")
    if key_mask is not None and (key_mask.dim() != 2 or key_mask.shape[0] != batch
                                 or key_mask.shape[1] < opened + length):
        raise ValueError(f"key_mask must be [{batch}, ≥ {opened + length}], got {list(key_mask.shape)}.")
    chunks = -(-(opened + length) // chunk_size)
    if segments is not None and (segments.shape != (batch, chunks) or segments.dtype != torch.int64):
        raise ValueError(f"segments must be [{batch}, {chunks}] int64 (a document per chunk), got "
                         f"{list(segments.shape)} of {segments.dtype}.")


def autocast_inputs(tensors: list[torch.Tensor], state: FlashState,
                    dtype: torch.dtype) -> tuple[list[torch.Tensor], FlashState]:
    """The op's inputs and open chunk in autocast's ``dtype``, as autocast casts a matmul's.

    Args:
        tensors (list[torch.Tensor]): q, k, q', k', v, each ``[B, T, ·]``.
        state (FlashState): the state before these tokens (its open chunk may be kept outside autocast).
        dtype (torch.dtype): autocast's (``autocast_dtype``).

    Returns:
        tuple[list[torch.Tensor], FlashState]: the same, cast (the linear state stays float32).
    """
    if state.keys is not None and state.values is not None:
        state = FlashState(state.linear, state.keys.to(dtype), state.values.to(dtype))
    return [x.to(dtype) for x in tensors], state


def flash_mixed_chunk_attention(
    quad_q: torch.Tensor,
    quad_k: torch.Tensor,
    lin_q: torch.Tensor,
    lin_k: torch.Tensor,
    value: torch.Tensor,
    *,
    chunk_size: int,
    causal: bool,
    key_mask: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
    initial_state: FlashState | None = None,
    dropout: float = 0.0,
    training: bool = False,
    implementation: str = "chunk",
) -> tuple[torch.Tensor, FlashState]:
    """FLASH mixed-chunk attention (Hua et al. 2022, §3.2) with every factor in the queries.

    numerator_i = Σ_{j same chunk, visible} relu(q_i·k_j)² v_j + Σ_{j ∈ lin(i)} (q'_i·k'_j) v_j, where lin(i)
    is every valid key (bidirectional) or the valid keys of earlier chunks and those folded into
    ``initial_state`` (causal). With an open chunk in ``initial_state`` the tokens continue it: the segment
    [open chunk ‖ tokens] starts on a chunk boundary and is chunked exactly as the whole sequence would be.

    Args:
        quad_q (torch.Tensor): ``[B, T, S]`` queries of the quadratic part (every factor folded in), the
            model dtype.
        quad_k (torch.Tensor): ``[B, T, S]`` keys of the quadratic part, the model dtype.
        lin_q (torch.Tensor): ``[B, T, S]`` queries of the linear part (every factor folded in), the model
            dtype.
        lin_k (torch.Tensor): ``[B, T, S]`` keys of the linear part, the model dtype.
        value (torch.Tensor): ``[B, T, E]``, the model dtype.
        chunk_size (int): g, the tokens of a chunk.
        causal (bool): each query sees earlier keys only.
        key_mask (torch.Tensor | None): ``[B, ≥ M + T]`` bool, ``True`` = real token; its last M + T columns
            are the open chunk's M rows and these tokens. ``None``: no padding.
        segments (torch.Tensor | None): ``[B, ⌈(M + T)/g⌉]`` int64, each chunk's document's first chunk
            (in [0, c] for chunk c: not checked, as reading it would sync), for rows packing documents that
            each start on a chunk boundary (``DocumentChunks``); the state then restarts per document.
        initial_state (FlashState | None): the state after earlier tokens (causal), or ``None``.
        dropout (float): dropout on the quadratic weights (``reference`` and ``chunk`` only: ``triton``
            refuses a dropout above 0 while training).
        training (bool): whether that dropout is active.
        implementation (str): one of ``FLASH_IMPLEMENTATIONS``.

    Returns:
        tuple[torch.Tensor, FlashState]: ``numerator`` ``[B, T, E]`` in ``value``'s dtype (under autocast in
        autocast's, to which the five inputs are cast, as for a matmul) and the ``FlashState`` after the
        tokens: Σ k'ᵀv over the closed chunks (bidirectional: over every key; meaningless for packed rows)
        and, causal, the new open chunk.
    """
    check_flash_arguments(quad_q, quad_k, lin_q, lin_k, value, chunk_size, causal, key_mask, segments,
                          initial_state, dropout, training, implementation)
    state = initial_state or FlashState(None)
    if (dtype := autocast_dtype(value.device)) is not None:  # one dtype, autocast's, as for a matmul
        (quad_q, quad_k, lin_q, lin_k, value), state = autocast_inputs([quad_q, quad_k, lin_q, lin_k, value],
                                                                       state, dtype)
    length = quad_q.shape[1]
    opened = 0 if state.keys is None else state.keys.shape[1]
    valid = None if key_mask is None else key_mask[:, key_mask.shape[1] - opened - length:].bool()
    if opened:
        no_queries = quad_q.new_zeros(quad_q.shape[0], opened, quad_q.shape[2])
        open_quad_k, open_lin_k = state.keys.split(quad_k.shape[-1], dim=-1)  # type: ignore[union-attr]
        quad_q, lin_q = torch.cat([no_queries, quad_q], 1), torch.cat([no_queries, lin_q], 1)
        quad_k, lin_k = torch.cat([open_quad_k, quad_k], 1), torch.cat([open_lin_k, lin_k], 1)
        value = torch.cat([state.values, value], 1)  # type: ignore[list-item]
    if valid is not None:  # the open chunk's rows too, as the reference's W drops them
        lin_k = lin_k * valid[..., None].to(lin_k.dtype)
    options: dict[str, Any] = {"chunk_size": chunk_size, "causal": causal, "key_mask": valid,
                               "segments": segments, "initial_state": state.linear}
    if implementation == "triton":
        numerator, linear = flash_mixed_chunk_triton(quad_q, quad_k, lin_q, lin_k, value, **options)
    else:
        run = flash_mixed_chunk_reference if implementation == "reference" else flash_mixed_chunk_torch
        numerator, linear = run(quad_q, quad_k, lin_q, lin_k, value, dropout=dropout, training=training,
                                **options)
    if not causal:
        return numerator[:, opened:], FlashState(linear)
    closed = (opened + length) // chunk_size * chunk_size
    keys = torch.cat([quad_k, lin_k], dim=-1)[:, closed:]
    return numerator[:, opened:], FlashState(linear, keys, value[:, closed:])


def chunk_states(summaries: torch.Tensor, segments: torch.Tensor | None, causal: bool,
                 initial_state: torch.Tensor | None) -> torch.Tensor:
    """H_c, the linear state the queries of chunk c read, from the chunk summaries S_c = k'_cᵀ v_c.

    H_c = initial + Σ_{c' < c} S_c' (causal) or Σ_c' S_c' (bidirectional), within each document for packed
    rows (``segmented_chunk_sums``).

    Args:
        summaries (torch.Tensor): ``[B, C, S, E]`` float32.
        segments (torch.Tensor | None): ``[B, C]`` int64, each chunk's document's first chunk, or ``None``.
        causal (bool): exclusive prefix sums, or totals.
        initial_state (torch.Tensor | None): ``[B, S, E]`` float32 added to every state, or ``None``.

    Returns:
        torch.Tensor: ``[B, C, S, E]`` float32; ``[B, 1, S, E]``, broadcast, where every chunk reads one
        state.
    """
    if segments is not None:
        states = segmented_chunk_sums(summaries, segments, causal)
    elif causal:
        states = F.pad(summaries.cumsum(1)[:, :-1], (0, 0, 0, 0, 1, 0))
    else:
        states = summaries.sum(1, keepdim=True)
    return states if initial_state is None else states + initial_state[:, None]


def chunk_states_backward(grad_states: torch.Tensor, segments: torch.Tensor | None,
                          causal: bool) -> torch.Tensor:
    """The gradient of the summaries S_c from that of the states H_c (``chunk_states``' transpose).

    Σ_{c' > c} ∂L/∂H_c' (causal) or Σ_c' ∂L/∂H_c' (bidirectional), within each document. For packed causal
    rows: reversed, each document is still a run of chunks, starting at its last one, so the exclusive prefix
    sums of the reversed chunks within documents are the suffix sums wanted.

    Args:
        grad_states (torch.Tensor): ``[B, C, S, E]`` float32.
        segments (torch.Tensor | None): ``[B, C]`` int64 or ``None``, as for ``chunk_states``.
        causal (bool): as for ``chunk_states``.

    Returns:
        torch.Tensor: ``[B, C, S, E]`` float32, or ``[B, 1, S, E]`` as for ``chunk_states``.
    """
    if not causal:
        if segments is None:
            return grad_states.sum(1, keepdim=True)
        return segmented_chunk_sums(grad_states, segments, False)
    if segments is None:
        suffix = grad_states.flip(1).cumsum(1).flip(1)
        return F.pad(suffix[:, 1:], (0, 0, 0, 0, 0, 1))
    chunks = segments.shape[1]
    order = torch.arange(chunks, device=segments.device).expand_as(segments)
    last = torch.zeros_like(segments).scatter_reduce_(1, segments, order, "amax").gather(1, segments)
    reversed_segments = (chunks - 1 - last).flip(1)
    return segmented_chunk_sums(grad_states.flip(1), reversed_segments, True).flip(1)


def final_state(summaries: torch.Tensor, complete: int, causal: bool,
                initial_state: torch.Tensor | None) -> torch.Tensor:
    """The linear state after the tokens.

    ``initial_state`` + Σ S_c over the ``complete`` closed chunks (causal) or over every chunk
    (bidirectional).

    Args:
        summaries (torch.Tensor): ``[B, C, S, E]`` float32, S_c = k'_cᵀ v_c.
        complete (int): the number of closed chunks.
        causal (bool): sum the closed chunks only.
        initial_state (torch.Tensor | None): ``[B, S, E]`` float32, or ``None``.

    Returns:
        torch.Tensor: ``[B, S, E]`` float32.
    """
    total = summaries[:, :complete].sum(1) if causal else summaries.sum(1)
    return total if initial_state is None else total + initial_state


def _chunk_blocks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[B, T, W]`` → ``[B, C, G, W]``, zero-padded to whole chunks.

    While compiling, padded whatever T (maybe by nothing), so that one graph holds for lengths that chunks
    divide and for those they do not.
    """
    chunks = (x.shape[1] + chunk_size - 1) // chunk_size
    if torch.compiler.is_compiling() or x.shape[1] % chunk_size:
        x = F.pad(x, (0, 0, 0, chunks * chunk_size - x.shape[1]))
    return x.view(x.shape[0], chunks, chunk_size, x.shape[-1])


def summed_state(lin_k: torch.Tensor, value: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """H = Σ_c k'_cᵀ v_c over the rows' chunks: each chunk's product in the model dtype, the sum in float32.

    The op's own state (``chunk_summaries``, ``final_state``) for rows whose keys are zero wherever they
    are not summed, without float32 copies of the keys and values.

    Args:
        lin_k (torch.Tensor): ``[B, T, S]`` the linear keys, zero at the columns left out, the model dtype.
        value (torch.Tensor): ``[B, T, E]``, the model dtype.
        chunk_size (int): g, the chunk of each product.

    Returns:
        torch.Tensor: ``[B, S, E]`` in ``compute_dtype``.
    """
    return chunk_summaries(_chunk_blocks(lin_k, chunk_size), _chunk_blocks(value, chunk_size)).sum(1)


def flash_mixed_chunk_torch(
    quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, lin_k: torch.Tensor, value: torch.Tensor,
    *, chunk_size: int, causal: bool, key_mask: torch.Tensor | None = None,
    segments: torch.Tensor | None = None, initial_state: torch.Tensor | None = None, dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FLASH in chunks with torch operations, in the inputs' dtype.

    relu(q kᵀ)² v inside each chunk (O(T·g·(s + e))), and q'·H_c across chunks from the summaries k'ᵀv
    (O(T·s·e)); float32 for the summaries and the states only (float16 products scale the states into range,
    ``state_product``).

    Args:
        quad_q (torch.Tensor): ``[B, T, S]`` quadratic queries (factors folded in), the model dtype.
        quad_k (torch.Tensor): ``[B, T, S]`` quadratic keys, the model dtype.
        lin_q (torch.Tensor): ``[B, T, S]`` linear queries (factors folded in), the model dtype.
        lin_k (torch.Tensor): ``[B, T, S]`` linear keys, already zero at padding, the model dtype.
        value (torch.Tensor): ``[B, T, E]``, the model dtype.
        chunk_size (int): g.
        causal (bool): as for ``flash_mixed_chunk_attention``.
        key_mask (torch.Tensor | None): ``[B, T]`` bool or ``None``.
        segments (torch.Tensor | None): ``[B, ⌈T/g⌉]`` int64 or ``None``, as for
            ``flash_mixed_chunk_attention``.
        initial_state (torch.Tensor | None): ``[B, S, E]`` float32 or ``None``.
        dropout (float): dropout on the quadratic weights.
        training (bool): whether that dropout is active.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: numerator ``[B, T, E]`` in the value's dtype, and the state
        ``[B, S, E]`` float32 (``final_state``).
    """
    length = quad_q.shape[1]
    v_blocks = _chunk_blocks(value, chunk_size)
    weights = F.relu(torch.matmul(_chunk_blocks(quad_q, chunk_size),
                                  _chunk_blocks(quad_k, chunk_size).transpose(-1, -2))).square()
    visible = None
    if key_mask is not None:
        visible = _chunk_blocks(key_mask[..., None], chunk_size).transpose(-1, -2)
    if causal:
        tril = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=weights.device).tril()
        visible = tril if visible is None else visible & tril
    if visible is not None:
        weights = weights.masked_fill(~visible, 0.0)
    if training and dropout > 0.0:  # eval never compares dropout (compiled: maybe symbolic)
        weights = F.dropout(weights, p=dropout, training=True)
    summaries = chunk_summaries(_chunk_blocks(lin_k, chunk_size), v_blocks)
    states = chunk_states(summaries, segments, causal, initial_state)
    numerator = torch.matmul(weights, v_blocks) + state_product(_chunk_blocks(lin_q, chunk_size), states)
    final = final_state(summaries, length // chunk_size, causal, initial_state)
    return numerator.flatten(1, 2)[:, :length], final


def flash_mixed_chunk_reference(
    quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, lin_k: torch.Tensor, value: torch.Tensor,
    *, chunk_size: int, causal: bool, key_mask: torch.Tensor | None = None,
    segments: torch.Tensor | None = None, initial_state: torch.Tensor | None = None, dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FLASH written out, the reference the other implementations are checked against.

    numerator = W v + q'·initial with the dense ``[B, T, T]`` matrix W (``flash_effective_weights``), in
    float32 or more. O(T²) time and memory.

    Args:
        quad_q (torch.Tensor): ``[B, T, S]`` quadratic queries (factors folded in), the model dtype.
        quad_k (torch.Tensor): ``[B, T, S]`` quadratic keys, the model dtype.
        lin_q (torch.Tensor): ``[B, T, S]`` linear queries (factors folded in), the model dtype.
        lin_k (torch.Tensor): ``[B, T, S]`` linear keys, already zero at padding, the model dtype.
        value (torch.Tensor): ``[B, T, E]``, the model dtype.
        chunk_size (int): g.
        causal (bool): as for ``flash_mixed_chunk_attention``.
        key_mask (torch.Tensor | None): ``[B, T]`` bool or ``None``.
        segments (torch.Tensor | None): ``[B, ⌈T/g⌉]`` int64 or ``None``.
        initial_state (torch.Tensor | None): ``[B, S, E]`` float32 or ``None``.
        dropout (float): dropout on the quadratic weights.
        training (bool): whether that dropout is active.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: numerator ``[B, T, E]`` in the value's dtype, and the state
        ``[B, S, E]`` (float32 or more).
    """
    length = quad_q.shape[1]
    positions = torch.arange(length, device=quad_q.device)
    document_ids = None
    if segments is not None:
        document_ids = segments.gather(1, (positions // chunk_size).expand(segments.shape[0], -1))
        positions = positions - document_ids * chunk_size
    visibility = flash_visibility(positions, chunk_size, causal, document_ids)
    weights = flash_effective_weights(quad_q, quad_k, lin_q, lin_k, chunk_size=chunk_size, causal=causal,
                                      key_mask=key_mask, dropout=dropout, training=training,
                                      visibility=visibility)
    v = upcast(value)
    numerator = torch.matmul(weights, v)
    if initial_state is not None:
        numerator = numerator + torch.matmul(upcast(lin_q), initial_state.to(numerator.dtype))
    complete = length // chunk_size * chunk_size if causal else length
    total = torch.matmul(upcast(lin_k[:, :complete]).transpose(-1, -2), v[:, :complete])
    final = total if initial_state is None else total + initial_state
    return numerator.to(value.dtype), final


def per_chunk(states: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``states`` ``[B, C or 1, S, E]`` as the contiguous ``[B, C, S, E]`` the Triton kernels read.

    Args:
        states (torch.Tensor): ``[B, C, S, E]`` or ``[B, 1, S, E]`` (``chunk_states``), float32.
        like (torch.Tensor): ``[B, C, S, E]``, the shape wanted.

    Returns:
        torch.Tensor: ``[B, C, S, E]`` contiguous, float32.
    """
    return states.expand_as(like).contiguous()


class FlashTritonAttention(torch.autograd.Function):
    """``flash_mixed_chunk_triton``'s autograd.

    Saves only its inputs (``ctx.save_for_backward``) and recomputes the chunk summaries and states in
    backward.
    """

    @staticmethod
    def forward(ctx: Any, quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor,
                lin_k: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor | None,
                segments: torch.Tensor | None, initial_state: torch.Tensor | None,
                chunk_size: int, causal: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summaries, states, then the output through the Triton kernels.

        Args:
            ctx (Any): autograd's context.
            quad_q (torch.Tensor): ``[B, T, S]`` contiguous, the model dtype.
            quad_k (torch.Tensor): ``[B, T, S]`` contiguous, the model dtype.
            lin_q (torch.Tensor): ``[B, T, S]`` contiguous, the model dtype.
            lin_k (torch.Tensor): ``[B, T, S]`` contiguous, zero at padding, the model dtype.
            value (torch.Tensor): ``[B, T, E]`` contiguous, the model dtype.
            key_mask (torch.Tensor | None): ``[B, T]`` int8 (1 = real token), or ``None``.
            segments (torch.Tensor | None): ``[B, ⌈T/g⌉]`` int64, or ``None``.
            initial_state (torch.Tensor | None): ``[B, S, E]`` float32 contiguous, or ``None``.
            chunk_size (int): g.
            causal (bool): linear attention over earlier chunks only.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: numerator ``[B, T, E]`` in the value's dtype, and the final
            state ``[B, S, E]`` float32.
        """
        summaries = torch.ops.hf_attn_variants.flash_chunk_outer(lin_k, value, chunk_size)
        states = per_chunk(chunk_states(summaries, segments, causal, initial_state), summaries)
        output = torch.ops.hf_attn_variants.flash_forward(quad_q, quad_k, lin_q, value, states, key_mask,
                                                         chunk_size, causal)
        ctx.summed = quad_q.shape[1] // chunk_size if causal else summaries.shape[1]  # the chunks in final
        final = final_state(summaries, ctx.summed, causal, initial_state)
        ctx.save_for_backward(quad_q, quad_k, lin_q, lin_k, value, key_mask, segments, initial_state)
        ctx.chunk_size, ctx.causal = chunk_size, causal
        ctx.set_materialize_grads(False)  # an unused final state costs its backward nothing
        return output, final

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor,
                 grad_final: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """Recompute summaries and states; the gradients of the five inputs and of the initial state.

        The final state is ``initial + Σ S_c`` over the chunks ``final_state`` sums, so ∂L/∂S_c gains
        ∂L/∂final for each of those chunks, and ∂L/∂initial gains it once.

        Args:
            ctx (Any): autograd's context.
            grad_output (torch.Tensor | None): ``[B, T, E]``, ∂L/∂numerator (``None``: not used).
            grad_final (torch.Tensor | None): ``[B, S, E]``, ∂L/∂(final state) (``None``: not used).

        Returns:
            tuple: ∂L/∂(quad_q, quad_k, lin_q, lin_k) ``[B, T, S]``, ∂L/∂value ``[B, T, E]``, ``None``,
            ``None``, ∂L/∂initial_state ``[B, S, E]`` float32 (or ``None``), ``None``, ``None``.
        """
        quad_q, quad_k, lin_q, lin_k, value, key_mask, segments, initial_state = ctx.saved_tensors
        grad_output = torch.zeros_like(value) if grad_output is None else grad_output.contiguous()
        outer = torch.ops.hf_attn_variants.flash_chunk_outer
        summaries = outer(lin_k, value, ctx.chunk_size)
        states = per_chunk(chunk_states(summaries, segments, ctx.causal, initial_state), summaries)
        grad_states = outer(lin_q, grad_output, ctx.chunk_size)  # ∂L/∂H_c = q'_cᵀ dO_c
        grad_summaries = per_chunk(chunk_states_backward(grad_states, segments, ctx.causal), grad_states)
        if grad_final is not None:
            grad_summaries[:, :ctx.summed] += grad_final.float()[:, None]
        grads = torch.ops.hf_attn_variants.flash_backward(quad_q, quad_k, lin_q, lin_k, value, states,
                                                          grad_summaries, key_mask, grad_output,
                                                          ctx.chunk_size, ctx.causal)
        grad_initial = grad_states.sum(1) if ctx.needs_input_grad[7] else None
        if grad_initial is not None and grad_final is not None:
            grad_initial = grad_initial + grad_final.float()
        return (*grads, None, None, grad_initial, None, None)


def flash_mixed_chunk_triton(
    quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, lin_k: torch.Tensor, value: torch.Tensor,
    *, chunk_size: int, causal: bool, key_mask: torch.Tensor | None = None,
    segments: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FLASH mixed-chunk attention in Triton (``gau_triton``'s kernels).

    ``flash_mixed_chunk_torch``'s arguments (without dropout) and result.
    Chunk-parallel: k'ᵀv of every chunk at once (``flash_chunk_outer``), the states H_c by a prefix sum over
    chunks, then one program per (value tile, token block, row) adds relu(q·k)² v over its chunk and q'·H_c
    (``flash_forward``). Backward recomputes scores, summaries and states. bf16/fp16 inputs run on the
    tensor cores with fp32 accumulators; float32 inputs multiply in IEEE precision.

    Args:
        quad_q (torch.Tensor): ``[B, T, S]`` quadratic queries with every factor folded in, the model dtype.
        quad_k (torch.Tensor): ``[B, T, S]`` quadratic keys, the model dtype.
        lin_q (torch.Tensor): ``[B, T, S]`` linear queries with every factor folded in, the model dtype.
        lin_k (torch.Tensor): ``[B, T, S]`` linear keys, already zero at padding, the model dtype.
        value (torch.Tensor): ``[B, T, E]``, the model dtype.
        chunk_size (int): g.
        causal (bool): linear attention over earlier chunks only.
        key_mask (torch.Tensor | None): ``[B, T]`` bool, ``True`` = real token, or ``None``.
        segments (torch.Tensor | None): ``[B, ⌈T/g⌉]`` int64, each chunk's document's first chunk (packed
            rows), or ``None``.
        initial_state (torch.Tensor | None): ``[B, S, E]`` float32 Σ k'ᵀv before these tokens (causal), or
            ``None``.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: numerator ``[B, T, E]`` in the value's dtype, and the state
        ``[B, S, E]`` float32.
    """
    from .gau_triton import TRITON_AVAILABLE, check_compilable  # registers torch.ops.hf_attn_variants.flash_*

    if not TRITON_AVAILABLE:
        raise ImportError("implementation='triton' needs the triton package (pip install triton): or use "
                          "implementation='chunk'.")

    check_compilable(value)
    tensors = [x.contiguous() for x in (quad_q, quad_k, lin_q, lin_k, value)]
    mask = None if key_mask is None else key_mask.to(torch.int8).contiguous()
    initial = None if initial_state is None else initial_state.float().contiguous()
    return FlashTritonAttention.apply(*tensors, mask, segments, initial, chunk_size, causal)


def flash_decode_step(
    quad_q: torch.Tensor,
    lin_q: torch.Tensor,
    quad_k: torch.Tensor,
    lin_k: torch.Tensor,
    value: torch.Tensor,
    state: torch.Tensor | None,
    visible: torch.Tensor | None = None,
    closing: torch.Tensor | bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One causal FLASH step per row, for a new token whose open chunk (itself included) is given.

    numerator = Σ_{j visible} relu(q·k_j)² v_j + q'·state. When the token completes its chunk, the chunk's M
    rows (all of them its own, k' of padding zero) are folded into the returned state. O(M·(s + e) + s·e) per
    row. The products run in at least float32 (queries, keys and values are upcast, ``state`` kept in at
    least theirs, under autocast too), so a bf16 model decodes with float32 sums.

    Args:
        quad_q (torch.Tensor): ``[B, 1, S]`` the new token's quadratic query, carrying its factors, the model
            dtype.
        lin_q (torch.Tensor): ``[B, 1, S]`` its linear query, carrying its factors, the model dtype.
        quad_k (torch.Tensor): ``[B, M, S]`` the open chunk's quadratic keys, the model dtype.
        lin_k (torch.Tensor): ``[B, M, S]`` its linear keys (zero at padding), the model dtype.
        value (torch.Tensor): ``[B, M, E]`` its values, the model dtype.
        state (torch.Tensor | None): ``[B, S, E]`` (≥ float32) Σ k'ᵀv over the closed chunks (``None``: none
            yet).
        visible (torch.Tensor | None): ``[B, M]`` bool, which of the open chunk's rows row b sees (``None``:
            all; a hidden row may hold any finite values).
        closing (torch.Tensor | bool): whether the token completes its chunk: a bool, or ``[B]`` bool per row.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: numerator ``[B, 1, E]`` and the state ``[B, S, E]``, both in at
        least float32.
    """
    weights = F.relu(torch.matmul(upcast(quad_q), upcast(quad_k).transpose(-1, -2))).square()
    if visible is not None:
        weights = weights.masked_fill(~visible[:, None], 0.0)
    value = upcast(value)
    numerator = torch.matmul(weights, value)
    if state is None:
        state = value.new_zeros(value.shape[0], lin_k.shape[-1], value.shape[-1])
    else:  # ≥ float32 under autocast too, whose products are in its dtype
        state = state.to(torch.promote_types(state.dtype, value.dtype))
        numerator = numerator + torch.matmul(upcast(lin_q), state)
    if closing is False:
        return numerator, state
    if closing is True:
        return numerator, state + torch.matmul(upcast(lin_k).transpose(-1, -2), value)
    rows = closing.nonzero()[:, 0]
    closed = torch.matmul(upcast(lin_k[rows]).transpose(-1, -2), value[rows])
    return numerator, state.index_add(0, rows, closed.to(state.dtype))


def roll_rows(tensor: torch.Tensor, shift: torch.Tensor, dim: int = 1, back: bool = False) -> torch.Tensor:
    """Each row's columns rotated left by its shift: out[b, t] = tensor[b, (t + shift_b) mod T].

    With shift_b = (row b's left padding) mod g, a left-padded row's first token lands on a chunk boundary
    and the padding it moves to the end is masked there, so FLASH chunks the row as it chunks the row alone
    (right padding leaves every token's result unchanged); ``back=True`` undoes it. One gather; the index
    wraps by a comparison, not a modulo of the symbolic length (the ONNX exporter's ``remainder`` needs a
    constant). O(n).

    Args:
        tensor (torch.Tensor): ``[B, …]`` with the T columns on ``dim``.
        shift (torch.Tensor): ``[B]`` int64 in [0, T).
        dim (int): the column axis (1, or 2 for the columns of a ``[B, T, T]`` map).
        back (bool): rotate right (the inverse).

    Returns:
        torch.Tensor: like ``tensor``.
    """
    length = tensor.shape[dim]
    shift = shift.to(tensor.device)[:, None]
    columns = torch.arange(length, device=tensor.device)
    columns = columns - shift + length if back else columns + shift  # in [0, 2T)
    columns = torch.where(columns < length, columns, columns - length)
    shape = [tensor.shape[0]] + [1] * (tensor.dim() - 1)
    shape[dim] = length
    return tensor.gather(dim, columns.view(shape).expand_as(tensor))


def segmented_chunk_sums(summaries: torch.Tensor, segments: torch.Tensor, causal: bool) -> torch.Tensor:
    """Per chunk c, the sum of the summaries k'ᵀv of the chunks of its own document.

    Those before c (``causal``, exclusive) or all of them. A document's chunks are contiguous and start at
    ``segments[:, c]``, so the causal sum is a difference of prefix sums (taken in float64, so that the
    documents before it cost no precision: each document gets its lone run's sum; float32 on MPS, which has
    no float64: ``widest_dtype``) and the full one a
    scatter-add per document. O(C·s·e), no C×C term.

    Args:
        summaries (torch.Tensor): ``[B, C, S, E]`` float32.
        segments (torch.Tensor): ``[B, C]`` int64, each chunk's document's first chunk.
        causal (bool): exclusive sums of the earlier chunks, or each document's total.

    Returns:
        torch.Tensor: ``[B, C, S, E]``, the summaries' dtype.
    """
    rows = torch.arange(summaries.shape[0], device=summaries.device)[:, None]
    if causal:
        wide = summaries.to(widest_dtype(summaries.device))
        prefix = F.pad(wide.cumsum(1), (0, 0, 0, 0, 1, 0))  # prefix[c] = Σ_{c' < c}
        return (prefix[:, :-1] - prefix[rows, segments]).to(summaries.dtype)
    chunks = summaries.shape[1]
    flat = (segments + rows * chunks).flatten()
    totals = torch.zeros_like(summaries).flatten(0, 1).index_add(0, flat, summaries.flatten(0, 1))
    return totals[flat].view_as(summaries)


def flash_packed_windows(
    quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, lin_k: torch.Tensor, value: torch.Tensor,
    *, document_ids: torch.Tensor, chunk_size: int, causal: bool, key_mask: torch.Tensor | None = None,
    dropout: float = 0.0, training: bool = False,
) -> torch.Tensor:
    """FLASH over rows packing documents that start anywhere, in static shapes: O(T·g·(s + e) + T·s·e).

    Each document is chunked from its own start, exactly as ``flash_visibility`` with ``document_ids`` says,
    but the tensors keep the row's chunks c = ⌊t / g⌋: nothing is read on the host (``DocumentChunks``' layout
    reads its slot count), so a compiled graph holds for every packing. A token's document chunk lies in its
    row chunk and the one before (and, bidirectional, the one after): in that window both parts are masked
    scores, relu² over [same document, same document chunk (, not later)] and the linear part over [same
    document (, earlier document chunk)]. The linear part's keys before the window are the state of the
    document running through the window's first token (``_state_before_window``); bidirectional, those after
    it are the same on the reversed row.

    Args:
        quad_q (torch.Tensor): ``[B, T, S]`` quadratic queries (factors folded in), the model dtype.
        quad_k (torch.Tensor): ``[B, T, S]`` quadratic keys, the model dtype.
        lin_q (torch.Tensor): ``[B, T, S]`` linear queries (factors folded in), the model dtype.
        lin_k (torch.Tensor): ``[B, T, S]`` linear keys, the model dtype.
        value (torch.Tensor): ``[B, T, E]``, the model dtype.
        document_ids (torch.Tensor): ``[B, T]`` int64, each token's document (≥ 0, contiguous runs).
        chunk_size (int): g.
        causal (bool): whether queries see only earlier keys.
        key_mask (torch.Tensor | None): ``[B, T]`` bool (``True`` = real token), or ``None``.
        dropout (float): dropout on the quadratic weights.
        training (bool): whether that dropout is active.

    Returns:
        torch.Tensor: the numerator ``[B, T, E]`` in the value's dtype (autocast's under autocast).
    """
    if (dtype := autocast_dtype(value.device)) is not None:
        quad_q, quad_k, lin_q, lin_k, value = (x.to(dtype) for x in (quad_q, quad_k, lin_q, lin_k, value))
    length, pad = quad_q.shape[1], (-quad_q.shape[1]) % chunk_size
    valid = torch.ones_like(document_ids, dtype=torch.bool) if key_mask is None else key_mask.bool()
    tensors = (quad_q, quad_k, lin_q, lin_k * valid[..., None].to(lin_k.dtype), value)  # masked keys: k' = 0
    quad_q, quad_k, lin_q, lin_k, value = (_chunk_blocks(x, chunk_size) for x in tensors)
    ids = F.pad(document_ids, (0, pad), value=-1)  # the padding to whole chunks: a document of its own
    valid = F.pad(valid, (0, pad), value=False)
    rows = [_chunk_blocks(x[..., None], chunk_size)[..., 0] for x in (ids, document_positions(ids), valid)]
    query_ids, query_positions, _ = rows
    key_ids, key_positions, key_valid = (_window(x, causal, fill) for x, fill in zip(rows, (-2, 0, False)))
    same = (query_ids[..., :, None] == key_ids[..., None, :]) & key_valid[..., None, :]
    query_chunk, key_chunk = query_positions // chunk_size, key_positions // chunk_size
    quadratic = same & (query_chunk[..., :, None] == key_chunk[..., None, :])
    linear = same
    if causal:
        quadratic = quadratic & (key_positions[..., None, :] <= query_positions[..., :, None])
        linear = same & (key_chunk[..., None, :] < query_chunk[..., :, None])
    weights = F.relu(torch.matmul(quad_q, _window(quad_k, causal, 0).transpose(-1, -2))).square() * quadratic
    if training and dropout > 0.0:  # eval never compares dropout (compiled: maybe symbolic)
        weights = F.dropout(weights, p=dropout, training=True)
    weights = weights + torch.matmul(lin_q, _window(lin_k, causal, 0).transpose(-1, -2)) * linear
    numerator = torch.matmul(weights, _window(value, causal, 0))
    numerator = numerator + _state_before_window(lin_q, lin_k, value, query_ids)
    if not causal:
        flipped = (x.flip(1, 2) for x in (lin_q, lin_k, value, query_ids))
        numerator = numerator + _state_before_window(*flipped).flip(1, 2)
    return numerator.flatten(1, 2)[:, :length]


def _window(x: torch.Tensor, causal: bool, fill: float) -> torch.Tensor:
    """``[B, C, G, ·]`` → ``[B, C, wG, ·]``: each chunk with the one before it (and, bidirectional, after it).

    The chunks beyond the row are ``fill``.
    """
    before = F.pad(x[:, :-1], (0, 0) * (x.dim() - 3) + (0, 0, 1, 0), value=fill)
    if causal:
        return torch.cat([before, x], dim=2)
    after = F.pad(x[:, 1:], (0, 0) * (x.dim() - 3) + (0, 0, 0, 1), value=fill)
    return torch.cat([before, x, after], dim=2)


def _state_before_window(lin_q: torch.Tensor, lin_k: torch.Tensor, value: torch.Tensor,
                         ids: torch.Tensor) -> torch.Tensor:
    """q'_i · Σ k'_jᵀ v_j over the keys j of i's document before chunk c(i) − 1, in chunks ``[B, C, G, ·]``.

    D_m = Σ_{j < m·g, d(j) = d(m·g)} k'_jᵀ v_j, the state of the document of chunk m's first token, follows
    D_m = a_m D_{m−1} + U_m with U_m the part of chunk m − 1 in that document and a_m = [d((m − 1)·g) =
    d(m·g)] (the document then fills chunk m − 1): within runs of chunks joined by a_m = 1, D is the inclusive
    sum of U (``segmented_chunk_sums``). Chunk c's queries read D_{c−1} where their document is d((c − 1)·g);
    otherwise their document starts inside the window and has no key before it.
    """
    first = ids[:, :, 0]
    starts_next = F.pad(first[:, 1:], (0, 1), value=-2)  # d((c + 1)·g): the document of chunk c's tail
    tail = lin_k * (ids == starts_next[..., None])[..., None].to(lin_k.dtype)
    added = F.pad(chunk_summaries(tail, value)[:, :-1], (0, 0, 0, 0, 1, 0))  # U_m
    joined = F.pad(first[:, 1:] == first[:, :-1], (1, 0), value=False)  # a_m
    order = torch.arange(first.shape[1], device=first.device).expand_as(first)
    runs = torch.where(joined, 0, order).cummax(1).values
    states = segmented_chunk_sums(added, runs, True) + added  # D_m
    before = F.pad(states[:, :-1], (0, 0, 0, 0, 1, 0))  # chunk c reads D_{c−1}
    reads = ids == F.pad(first[:, :-1], (1, 0), value=-2)[..., None]
    return state_product(lin_q * reads[..., None].to(lin_q.dtype), before)


@dataclass(frozen=True)
class DocumentChunks:
    """Rows packing several documents, laid out so that every document starts on a chunk boundary.

    Document d takes the slots [o_d, o_d + |d|) with o_d = Σ_{d' < d} ⌈|d'| / g⌉·g, so no chunk straddles two
    documents (T' ≤ T + D·(g − 1) slots). While compiling (static shapes) ``build(layout=False)`` keeps the
    ids alone.

    Attributes:
        document_ids (torch.Tensor): ``[B, T]`` int64, each token's document.
        slots (int): T', the slots per row (0 without a layout).
        segment (torch.Tensor | None): ``[B, T'/g]`` int64, each chunk's document's first chunk.
        valid (torch.Tensor | None): ``[B, T']`` bool, the slots holding a token (``None`` when the slots are
            the tokens).
        source (torch.Tensor | None): ``[B·T']`` int64 flat indices of each slot's token (into the tokens
            padded by one zero row), or ``None`` when the slots are the tokens.
        destination (torch.Tensor | None): ``[B·T]`` int64 flat indices of each token's slot, or ``None``.
    """

    document_ids: torch.Tensor
    slots: int = 0
    segment: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    source: torch.Tensor | None = None
    destination: torch.Tensor | None = None

    @classmethod
    def build(cls, document_ids: torch.Tensor, chunk_size: int, layout: bool = True) -> DocumentChunks:
        """The layout of ``document_ids`` for chunks of ``chunk_size``; O(T), one host sync.

        Args:
            document_ids (torch.Tensor): ``[B, T]`` int64, documents numbered from 0 in each row.
            chunk_size (int): g.
            layout (bool): build the slots; without it (while compiling), the ids alone.

        Returns:
            DocumentChunks: the layout.
        """
        if not layout:
            return cls(document_ids)
        batch, length = document_ids.shape
        device = document_ids.device
        sizes = torch.zeros_like(document_ids).scatter_add_(-1, document_ids, torch.ones_like(document_ids))
        padded = (sizes + chunk_size - 1) // chunk_size * chunk_size  # per document index (< T)
        offsets = (padded.cumsum(-1) - padded).gather(-1, document_ids)  # o_d of each token's document
        destination = offsets + document_positions(document_ids)
        totals = padded.sum(-1)
        slots, fewest = torch.stack([totals.max(), totals.min()]).tolist()  # one read on the host
        segment = torch.arange(slots // chunk_size, device=device).expand(batch, -1).clone()
        segment.scatter_(-1, destination // chunk_size, offsets // chunk_size)
        if fewest == slots == length:  # whole chunks: slots are the tokens
            return cls(document_ids, slots, segment)
        rows = torch.arange(batch, device=device)[:, None]
        source = torch.full((batch, slots), length, device=device).scatter_(
            -1, destination, torch.arange(length, device=device).expand(batch, length))
        valid = source < length
        return cls(document_ids, slots, segment, valid, (source + rows * (length + 1)).flatten(),
                   (destination + rows * slots).flatten())

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[B, T, F]`` → ``[B, T', F]``: each token in its slot, empty slots zero.

        Args:
            tensor (torch.Tensor): ``[B, T, F]``, any dtype.

        Returns:
            torch.Tensor: ``[B, T', F]``, the same dtype.
        """
        if self.source is None:
            return tensor
        padded = F.pad(tensor, (0, 0, 0, 1)).flatten(0, 1)
        return padded.index_select(0, self.source).view(tensor.shape[0], self.slots, tensor.shape[-1])

    def restore(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[B, T', F]`` → ``[B, T, F]``: each token's slot back in token order.

        Args:
            tensor (torch.Tensor): ``[B, T', F]``, any dtype.

        Returns:
            torch.Tensor: ``[B, T, F]``, the same dtype.
        """
        if self.destination is None:
            return tensor
        return (tensor.flatten(0, 1).index_select(0, self.destination)
                .view(tensor.shape[0], -1, tensor.shape[-1]))


def flash_visibility(
    positions: torch.Tensor, chunk_size: int, causal: bool, document_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Which keys FLASH's two parts give each query: boolean ``(quadratic, linear)``.

    With the chunk c(t) = ⌊p_t / g⌋ of position p_t (Hua et al. 2022, §3.2): quadratic_ij = [c(j) = c(i)]
    (∧ p_j ≤ p_i if ``causal``); linear_ij = [c(j) < c(i)] if ``causal``, else every key (``None``).
    For rows packing documents, ``document_ids`` add [d(j) = d(i)] to both, so every document is chunked from
    its own start and its linear state starts empty — exactly its lone run.

    Args:
        positions (torch.Tensor): ``[T]`` int64, the tensor columns 0 … T − 1 of an ordinary row; for rows
            packing documents ``[B, T]``, each token's index within its document
            (``layers.document_positions``).
        chunk_size (int): g.
        causal (bool): whether queries see only earlier keys.
        document_ids (torch.Tensor | None): ``[B, T]`` int64 documents of packed rows, or ``None``.

    Returns:
        tuple[torch.Tensor, torch.Tensor | None]: ``quadratic`` ``[..., T, T]`` bool and ``linear``
        ``[..., T, T]`` bool (``None``: every key), with the leading dimensions of ``positions``.
    """
    chunk = positions // chunk_size
    quadratic = chunk[..., :, None] == chunk[..., None, :]
    linear = None
    if causal:
        quadratic = quadratic & (positions[..., None, :] <= positions[..., :, None])
        linear = chunk[..., None, :] < chunk[..., :, None]
    if document_ids is not None:
        same = document_ids[..., :, None] == document_ids[..., None, :]
        quadratic, linear = quadratic & same, same if linear is None else linear & same
    return quadratic, linear


def flash_effective_weights(
    quad_q: torch.Tensor,
    quad_k: torch.Tensor,
    lin_q: torch.Tensor,
    lin_k: torch.Tensor,
    *,
    chunk_size: int,
    causal: bool,
    key_mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
    visibility: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """The dense matrix W with numerator = W v for ``flash_mixed_chunk_attention`` (factors in the queries).

    W_ij = relu(q_i·k_j)² [same chunk, visible] + (q'_i·k'_j) [j ∈ lin(i)], dropout on the
    quadratic part as in the chunked kernel. O(T²): built for ``output_attentions`` and for packed documents.

    Args:
        quad_q (torch.Tensor): ``[B, T, S]`` quadratic queries (factors folded in), the model dtype.
        quad_k (torch.Tensor): ``[B, T, S]`` quadratic keys, the model dtype.
        lin_q (torch.Tensor): ``[B, T, S]`` linear queries (factors folded in), the model dtype.
        lin_k (torch.Tensor): ``[B, T, S]`` linear keys, the model dtype.
        chunk_size (int): g.
        causal (bool): whether queries see only earlier keys.
        key_mask (torch.Tensor | None): ``[B, T]`` bool (``True`` = real token), or ``None``.
        dropout (float): dropout on the quadratic part.
        training (bool): whether that dropout is active.
        visibility (tuple | None): the two brackets, ``flash_visibility``'s ``(quadratic, linear)``: of the
            tensor columns when ``None``, per document for packed rows.

    Returns:
        torch.Tensor: ``[B, T, T]`` in at least float32.
    """
    if visibility is None:
        visibility = flash_visibility(torch.arange(quad_q.shape[1], device=quad_q.device), chunk_size, causal)
    quadratic, linear = visibility
    quad = F.relu(torch.matmul(upcast(quad_q), upcast(quad_k).transpose(-1, -2))).square() * quadratic
    lin = torch.matmul(upcast(lin_q), upcast(lin_k).transpose(-1, -2))
    if linear is not None:
        lin = lin * linear
    if training and dropout > 0.0:  # eval never compares dropout (compiled: maybe symbolic)
        quad = F.dropout(quad, p=dropout, training=True)
    weights = quad + lin
    if key_mask is not None:
        weights = weights * key_mask.bool()[:, None, :]
    return weights


__all__ = [
    "ATTENTION_BLOCK_ELEMENTS",
    "LAPLACE_MU",
    "LAPLACE_SIGMA",
    "DocumentChunks",
    "FLASH_IMPLEMENTATIONS",
    "FlashState",
    "FlashTritonAttention",
    "Relu2Attention",
    "SoftmaxAttention",
    "AUTOCAST_DEVICES",
    "autocast_dtype",
    "autocast_inputs",
    "flash_decode_step",
    "flash_effective_weights",
    "chunk_states",
    "chunk_states_backward",
    "final_state",
    "flash_mixed_chunk_attention",
    "flash_mixed_chunk_reference",
    "flash_mixed_chunk_torch",
    "flash_mixed_chunk_triton",
    "flash_packed_windows",
    "flash_visibility",
    "laplace_attention",
    "relu2_attention",
    "roll_rows",
    "segmented_chunk_sums",
    "softmax_attention",
    "state_product",
    "uses_blocks",
]
