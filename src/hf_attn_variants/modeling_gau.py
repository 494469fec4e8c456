"""Gated Attention Unit (GAU), GAU-α and FLASH mixed-chunk attention as Transformers models.

Hua, Dai, Liu & Le (2022), "Transformer Quality in Linear Time" (arXiv:2202.10447), and Su Jianlin's
GAU-α (2022). One GAU layer replaces attention + feed-forward. With hidden d, e = expansion·d, s = key size:

    u, v = silu(X Wu), silu(X Wv)          (b, n, e) gates and values
    z    = silu(X Wz)                       (b, n, s) shared base of queries and keys
    q, k = z·γq + βq, z·γk + βk              per-dimension scale and offset, then RoPE
    A    = norm(q kᵀ / √s)                   (b, n, n), see ``attention_normalization``
    out  = (u ⊙ A v) Wo                      then residual + norm (pre or post)

Wu, Wv and Wz are one fused ``in_proj`` (d → 2e + s, the paper's ``Dense(2e + s)``); Wo is ``out_proj``.

Which normalisation transfers across lengths (Su 2022, "听说Attention与Softmax更配哦~"): a GAU pretrained
with relu²/n at length 512 is sparse and local, so its attention mass does not grow like n; dividing
by the *current* row length n (``relu2_length="dynamic"``) therefore shrinks the output at longer
inputs and inflates it at shorter ones. Keeping L = 512 (``"fixed"``) finetunes better at other
lengths; ``"softmax_plus"`` (GAU-α's choice, softmax with a log n / log 512 scale) is the option that
both normalises itself and extrapolates, because softmax admits an entropy-invariant temperature and
relu² (positively homogeneous) does not. ``"relu2_normalized"`` divides by the row's own relu² mass.

FLASH (``chunk_size`` = g): the sequence is cut into chunks of g tokens (fixed tensor positions
0, g, 2g …). Query i in chunk c(i) gets, with separate scale/offsets for the quadratic (q, k) and
linear (q', k') parts (the paper's four ``scale_offset`` heads),

    out_i = u_i ⊙ (1 / L_i) [ Σ_{j ∈ c(i), visible} relu(q_i·k_j / √s)² v_j  +  Σ_{j ∈ lin(i)} (q'_i·k'_j / √s) v_j ]

lin(i) = every valid key (non-causal: Σ over all chunks of k'ᵀv) or the valid keys of chunks before
c(i) (causal: exclusive cumulative sum of the per-chunk k'ᵀv). L_i is the relu² length (dynamic: nᵢ,
the keys row i sees; fixed: ``base_length``), i.e. both parts share the quadratic GAU's normaliser, so
one chunk covering a causal sequence *is* quadratic relu² GAU and the length-transfer choice above
carries over unchanged. Cost O(n·g·(s + e) + n·s·e): linear in n.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration_gau import GAUConfig
from .layers import (
    apply_rotary,
    boolean_attention_mask,
    build_norm,
    compute_dtype,
    entropy_invariant_factor,
    masked_softmax,
    upcast,
    update_cache,
    visible_key_counts,
)
from .modeling_common import (
    AttnVariantBackbone,
    AttnVariantPreTrainedModel,
    CausalLMHeadMixin,
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
    TokenClassificationHeadMixin,
    residual_block,
)

RELU2_NORMALIZED_EPS = 1e-6
LENGTH_NORMALIZED = ("relu2", "laplace")
"""Normalisations divided by L (``relu2_length``: nᵢ or ``base_length``)."""
TRUNCATED_NORMAL_GAIN = 1.13684723
"""1 / std of a standard normal truncated to ±2: bert4keras scales its truncated normal by it, so σ is the real std."""


# --------------------------------------------------------------------------------------------------
# Attention kernels (at least float32 inside, so fp16/bf16 never overflow in relu² or the logits; float64 stays)
# --------------------------------------------------------------------------------------------------
def relu2_length(key_counts: torch.Tensor | None, config: GAUConfig, like: torch.Tensor) -> torch.Tensor:
    """L of relu(a)²/L (and laplace(a)/L) per query, shape ``(batch, q)``: nᵢ (``dynamic``, ≥ 1) or
    ``base_length`` (``fixed``)."""
    if config.relu2_length == "fixed":
        return torch.full(like.shape[:2], float(config.base_length), device=like.device, dtype=compute_dtype(like.dtype))
    if key_counts is None:
        raise ValueError("relu2_length='dynamic' needs the per-row key counts nᵢ.")
    return upcast(key_counts).clamp(min=1.0)


def gau_attention_weights(
    scores: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None, config: GAUConfig
) -> torch.Tensor:
    """A = norm(a) for scaled logits a = q·kᵀ/√s of shape ``(batch, 1, q, k)`` (at least float32 in and out).

    ``mask`` is boolean ``(batch, 1, q, k)`` (``True`` = visible) or ``None``; ``key_counts`` is nᵢ
    ``(batch, q)``. relu² is masked *after* the activation, so hidden keys contribute exactly 0, and
    a row with no visible key is all zeros for every normalisation.
    """
    kind = config.attention_normalization
    if kind == "softmax":
        return masked_softmax(scores, mask)
    if kind == "softmax_plus":
        factor = entropy_invariant_factor(key_counts, config.base_length, config.entropy_min_length)
        return masked_softmax(scores * factor[:, None, :, None], mask)
    weights = laplace_attention(scores) if kind == "laplace" else F.relu(scores).square()
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    if kind in LENGTH_NORMALIZED:
        return weights / relu2_length(key_counts, config, scores[:, 0])[:, None, :, None]
    return weights / (weights.sum(-1, keepdim=True) + RELU2_NORMALIZED_EPS)


LAPLACE_MU = math.sqrt(0.5)
LAPLACE_SIGMA = 1.0 / math.sqrt(4.0 * math.pi)


def laplace_attention(scores: torch.Tensor) -> torch.Tensor:
    """Mega's Laplace attention function 0.5·(1 + erf((a − μ) / (σ√2))), μ = √½, σ = 1/√(4π).

    Ma et al. (2023), "Mega: Moving Average Equipped Gated Attention", §3.3: chosen to approximate relu² near
    μ while staying bounded in [0, 1] with non-vanishing gradients, a stabler drop-in for relu². Unlike
    relu² it is positive for every logit, so hidden keys are zeroed after it (as for relu²).
    """
    return 0.5 * (1.0 + torch.erf((scores - LAPLACE_MU) / (LAPLACE_SIGMA * math.sqrt(2.0))))


ATTENTION_BLOCK_ELEMENTS = 1 << 22
"""Score elements per query block of ``relu2_attention`` / ``softmax_attention`` (16 MiB of float32)."""


def _query_blocks(queries: int, keys: int, causal_offset: int | None) -> list[tuple[int, int, int]]:
    """(start, stop, key limit) of each query block; a causal block needs no key after its last query."""
    rows = max(1, min(queries, ATTENTION_BLOCK_ELEMENTS // max(keys, 1)))
    blocks = []
    for start in range(0, queries, rows):
        stop = min(start + rows, queries)
        blocks.append((start, stop, keys if causal_offset is None else min(keys, causal_offset + stop)))
    return blocks


def _relu2_block_weights(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """relu(q kᵀ) of one query block with hidden keys set to 0 (in place on the fresh score buffer)."""
    scores = torch.matmul(query, key.transpose(-1, -2))
    if mask is not None:
        scores.masked_fill_(~mask, 0.0)
    return scores.relu_()


class Relu2Attention(torch.autograd.Function):
    """out = relu(q kᵀ)² v over the visible keys, computed in blocks of query rows; saves only q, k, v.

    The caller folds every positive factor into q: relu(c·a)² = c²·relu(a)² for c > 0, so
    relu(a·scaling)² / L = relu((q·scaling/√L)·k)² with a per-row L (see ``relu2_attention``). The
    gradient uses d relu(a)²/da = 2 relu(a), which is 0 wherever the key is hidden or a ≤ 0, so
    no separate activation mask is kept. Peak extra memory is three (block × keys) buffers in the
    backward pass instead of the n×n score, activation and weight tensors autograd would save per
    layer; the scores are recomputed in the backward pass (one extra q·kᵀ, the cheaper of the two
    products since s ≤ e). ``causal_offset`` (queries are keys ``causal_offset …``) lets a block skip
    the keys after its last query, halving causal work.
    """

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        causal_offset: int | None,
    ) -> torch.Tensor:
        outputs = []
        for start, stop, limit in _query_blocks(query.shape[-2], key.shape[-2], causal_offset):
            block_mask = None if mask is None else mask[..., start:stop, :limit]
            weights = _relu2_block_weights(query[..., start:stop, :], key[..., :limit, :], block_mask).square_()
            outputs.append(torch.matmul(weights, value[..., :limit, :]))
        ctx.save_for_backward(query, key, value, mask)
        ctx.causal_offset = causal_offset
        return torch.cat(outputs, dim=-2) if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, mask = ctx.saved_tensors
        grad_query = torch.empty_like(query)
        grad_key = torch.zeros_like(key)
        grad_value = torch.zeros_like(value)
        for start, stop, limit in _query_blocks(query.shape[-2], key.shape[-2], ctx.causal_offset):
            block_mask = None if mask is None else mask[..., start:stop, :limit]
            block_query, block_grad = query[..., start:stop, :], grad_output[..., start:stop, :]
            activation = _relu2_block_weights(block_query, key[..., :limit, :], block_mask)
            grad_scores = torch.matmul(block_grad, value[..., :limit, :].transpose(-1, -2))
            grad_scores.mul_(activation).mul_(2.0)
            grad_value[..., :limit, :] += torch.matmul(activation.square_().transpose(-1, -2), block_grad)
            grad_query[..., start:stop, :] = torch.matmul(grad_scores, key[..., :limit, :])
            grad_key[..., :limit, :] += torch.matmul(grad_scores.transpose(-1, -2), block_query)
        return grad_query, grad_key, grad_value, None, None


def relu2_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    row_scale: torch.Tensor | float,
    causal_offset: int | None = None,
) -> torch.Tensor:
    """Σⱼ relu(q_i·k_j·row_scale_i)² v_j over visible keys, i.e. quadratic relu² GAU with L folded in.

    ``query`` ``(batch, q, s)``, ``key`` ``(batch, k, s)``, ``value`` ``(batch, k, e)`` (float32 or float64),
    ``mask`` ``(batch, q, k)`` bool (``True`` = visible) or ``None``, ``row_scale`` > 0 a float or
    ``(batch, q)`` (scaling / √L). Same value as ``gau_attention_weights(...) @ v`` for ``relu2``.

    A score matrix of at most ``ATTENTION_BLOCK_ELEMENTS`` (16 MiB) is one fused expression — scale folded
    into q, mask and relu in place on the score buffer, then the square: autograd keeps two n×n tensors
    (relu's output and the weights), the minimum for its backward, and no-grad inference one. Larger
    ones go through ``Relu2Attention``: blocks of query rows, nothing n×n kept, scores recomputed in
    the backward pass, so activation memory is linear in n.
    """
    if isinstance(row_scale, torch.Tensor):
        query = query * row_scale[..., None]
    else:
        query = query * row_scale
    if query.shape[-2] * key.shape[-2] > ATTENTION_BLOCK_ELEMENTS:
        return Relu2Attention.apply(query, key, value, mask, causal_offset)
    weights = _relu2_block_weights(query, key, mask)
    tracked = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)
    weights = weights.square() if tracked else weights.square_()
    return torch.matmul(weights, value)


class SoftmaxAttention(torch.autograd.Function):
    """out = softmax(q kᵀ) v over the visible keys in blocks of query rows; saves q, k, v, the output and
    the per-row log-sum-exp (FlashAttention's recomputation, Dao et al. 2022, written with torch matmuls).

    Backward per block: P = exp(S − lse), dV += Pᵀ dO, dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙ O)), dQ = dS K,
    dK += dSᵀ Q. Hidden keys get the most negative logit, so P is 0 there. A row without a visible key
    gets a uniform P; the caller zeroes such rows on the output (see ``softmax_attention``).
    """

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        causal_offset: int | None,
    ) -> torch.Tensor:
        outputs, lses = [], []
        for start, stop, limit in _query_blocks(query.shape[-2], key.shape[-2], causal_offset):
            scores = _masked_block_scores(query[..., start:stop, :], key[..., :limit, :], mask, start, stop, limit)
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            outputs.append(torch.matmul(scores.sub_(lse).exp_(), value[..., :limit, :]))
            lses.append(lse)
        output = torch.cat(outputs, dim=-2) if len(outputs) > 1 else outputs[0]
        ctx.save_for_backward(query, key, value, mask, output, torch.cat(lses, dim=-2))
        ctx.causal_offset = causal_offset
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, mask, output, lse = ctx.saved_tensors
        grad_query = torch.empty_like(query)
        grad_key = torch.zeros_like(key)
        grad_value = torch.zeros_like(value)
        delta = (grad_output * output).sum(-1, keepdim=True)
        for start, stop, limit in _query_blocks(query.shape[-2], key.shape[-2], ctx.causal_offset):
            block_query, block_grad = query[..., start:stop, :], grad_output[..., start:stop, :]
            probs = _masked_block_scores(block_query, key[..., :limit, :], mask, start, stop, limit)
            probs.sub_(lse[..., start:stop, :]).exp_()
            grad_value[..., :limit, :] += torch.matmul(probs.transpose(-1, -2), block_grad)
            grad_scores = torch.matmul(block_grad, value[..., :limit, :].transpose(-1, -2))
            grad_scores.sub_(delta[..., start:stop, :]).mul_(probs)
            grad_query[..., start:stop, :] = torch.matmul(grad_scores, key[..., :limit, :])
            grad_key[..., :limit, :] += torch.matmul(grad_scores.transpose(-1, -2), block_query)
        return grad_query, grad_key, grad_value, None, None


def _masked_block_scores(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, start: int, stop: int, limit: int
) -> torch.Tensor:
    scores = torch.matmul(query, key.transpose(-1, -2))
    if mask is not None:
        scores.masked_fill_(~mask[..., start:stop, :limit], torch.finfo(scores.dtype).min)
    return scores


def softmax_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    causal_offset: int | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """softmax(q kᵀ) v over visible keys for a q that already carries the logit scale; float32/float64 in and out.

    Shapes as ``relu2_attention``; rows without a visible key give zeros. A score matrix of at most
    ``ATTENTION_BLOCK_ELEMENTS`` elements (or any, with attention dropout, which needs the probabilities) is one
    expression keeping a single n×n tensor (the probabilities) for backward; larger ones use
    ``SoftmaxAttention`` (blocked, recomputed, activation memory linear in n).
    """
    blocked = query.shape[-2] * key.shape[-2] > ATTENTION_BLOCK_ELEMENTS and not (training and dropout > 0)
    if blocked:
        attended = SoftmaxAttention.apply(query, key, value, mask, causal_offset)
    else:
        scores = torch.matmul(query, key.transpose(-1, -2))
        if mask is not None:
            scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
        probs = F.dropout(scores.softmax(-1), p=dropout, training=training)
        attended = torch.matmul(probs, value)
    return attended if mask is None else attended * mask.any(-1, keepdim=True)


def flash_mixed_chunk_attention(
    quad_q: torch.Tensor,
    quad_k: torch.Tensor,
    lin_q: torch.Tensor,
    lin_k: torch.Tensor,
    value: torch.Tensor,
    *,
    chunk_size: int,
    causal: bool,
    scaling: float,
    key_mask: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FLASH mixed-chunk attention (Hua et al. 2022, §3.2), unnormalised: returns ``(numerator, state)``.

    Inputs are ``(batch, T, s)`` (``value``: ``(batch, T, e)``), ``key_mask`` ``(batch, T)`` bool
    (``True`` = real token). Position t belongs to chunk ⌊t / g⌋; T is padded internally to a multiple
    of g with masked keys. numerator_i = Σ_{j same chunk, visible} relu(q_i·k_j·scaling)² v_j +
    Σ_{j ∈ lin(i)} (q'_i·k'_j·scaling) v_j, where lin(i) is every valid key (non-causal) or the valid keys
    of earlier chunks plus ``initial_state`` = Σ k'ᵀv of chunks before this segment (causal). ``state``
    is ``initial_state`` + Σ k'ᵀv over the *complete* chunks of the segment (causal), or the total
    (non-causal). Everything is computed in at least float32; cost and memory are O(T·g + T/g·s·e).
    """
    batch, length, key_size = quad_q.shape
    width = value.shape[-1]
    pad = (-length) % chunk_size
    chunks = (length + pad) // chunk_size

    def blocks(x: torch.Tensor) -> torch.Tensor:
        return F.pad(upcast(x), (0, 0, 0, pad)).view(batch, chunks, chunk_size, x.shape[-1])

    valid = key_mask.bool() if key_mask is not None else quad_q.new_ones(batch, length, dtype=torch.bool)
    valid = F.pad(valid, (0, pad), value=False).view(batch, chunks, chunk_size)
    quad_q, quad_k, v = blocks(quad_q), blocks(quad_k), blocks(value)
    lin_q = blocks(lin_q) * scaling
    lin_k = blocks(lin_k) * valid[..., None]

    # Exact relu² attention inside each chunk; mask after the activation.
    weights = F.relu(torch.matmul(quad_q, quad_k.transpose(-1, -2)) * scaling).square()
    visible = valid[:, :, None, :]
    if causal:
        visible = visible & torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=valid.device).tril()
    weights = weights.masked_fill(~visible, 0.0)
    if dropout > 0.0 and training:
        weights = F.dropout(weights, p=dropout, training=True)
    numerator = torch.matmul(weights, v)

    # Linear attention across chunks through per-chunk k'ᵀv summaries (s × e each).
    summaries = torch.einsum("bgcs,bgce->bgse", lin_k, v)
    if causal:
        earlier = torch.cat(
            [summaries.new_zeros(batch, 1, key_size, width), summaries[:, :-1]], dim=1
        ).cumsum(1)
        if initial_state is not None:
            earlier = earlier + initial_state.to(earlier.dtype)[:, None]
        numerator = numerator + torch.einsum("bgcs,bgse->bgce", lin_q, earlier)
        complete = length // chunk_size
        state = summaries[:, :complete].sum(1)
        if initial_state is not None:
            state = state + initial_state.to(state.dtype)
    else:
        state = summaries.sum(1)
        numerator = numerator + torch.matmul(lin_q, state[:, None])
    return numerator.reshape(batch, chunks * chunk_size, width)[:, :length], state


def flash_effective_weights(
    quad_q: torch.Tensor,
    quad_k: torch.Tensor,
    lin_q: torch.Tensor,
    lin_k: torch.Tensor,
    *,
    chunk_size: int,
    causal: bool,
    scaling: float,
    key_mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """The dense (batch, T, T) matrix W with numerator = W v for ``flash_mixed_chunk_attention``.

    W_ij = relu(q_i·k_j·scaling)² [same chunk, visible] + (q'_i·k'_j·scaling) [j ∈ lin(i)], dropout on the
    quadratic part as in the chunked kernel. O(T²): only built when ``output_attentions`` is requested.
    """
    length = quad_q.shape[1]
    chunk = torch.arange(length, device=quad_q.device) // chunk_size
    same = chunk[:, None] == chunk[None, :]
    quad = F.relu(torch.matmul(upcast(quad_q), upcast(quad_k).transpose(-1, -2)) * scaling).square()
    lin = torch.matmul(upcast(lin_q), upcast(lin_k).transpose(-1, -2)) * scaling
    if causal:
        quad = quad * (same & torch.ones_like(same).tril())
        lin = lin * (chunk[None, :] < chunk[:, None])
    else:
        quad = quad * same
    if dropout > 0.0 and training:
        quad = F.dropout(quad, p=dropout, training=True)
    weights = quad + lin
    if key_mask is not None:
        weights = weights * key_mask.bool()[:, None, :]
    return weights


# --------------------------------------------------------------------------------------------------
# Cache for causal FLASH decoding
# --------------------------------------------------------------------------------------------------
class GAUChunkCacheLayer(DynamicLayer):
    """Per-layer cache of causal FLASH attention: the open chunk's keys/values plus Σ k'ᵀv of closed chunks.

    ``keys`` ``(batch, 1, r, 2s)`` hold [k ‖ k'·mask] of the r < g tokens of the current, incomplete
    chunk, ``values`` ``(batch, 1, r, e)`` their v, and ``linear_state`` ``(batch, s, e)`` (≥ float32) the
    sum of k'ᵀv over every complete chunk, so memory is O(g·(s + e) + s·e) whatever the length and a
    decoding step costs O(g + s·e). ``get_seq_length`` reports all tokens seen. A plain
    ``DynamicCache`` works too: the model swaps its empty ``DynamicLayer`` for this class on first use.
    Cropping is not supported (a sum of closed chunks cannot be rolled back).
    """

    is_croppable = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.linear_state: torch.Tensor | None = None
        self.cumulative_length = 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def open_chunk(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """``(keys, values, linear_state)`` of the open chunk (``None`` before the first update)."""
        if not self.is_initialized or self.keys.numel() == 0:
            return None, None, self.linear_state
        return self.keys, self.values, self.linear_state

    def store(
        self, keys: torch.Tensor, values: torch.Tensor, state: torch.Tensor, added: int, chunk_size: int
    ) -> None:
        """Keep the trailing incomplete chunk of a segment that starts on a chunk boundary."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        closed = (keys.shape[-2] // chunk_size) * chunk_size
        self.keys, self.values = keys[..., closed:, :], values[..., closed:, :]
        self.linear_state = state
        self.cumulative_length += added

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "GAUChunkCacheLayer is written by GatedAttentionUnit.store(), not by Cache.update()."
        )

    def reset(self) -> None:
        super().reset()
        self.linear_state = None
        self.cumulative_length = 0

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError(
            "A FLASH (chunk_size) cache cannot be cropped: closed chunks are summed into one state."
        )

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.linear_state is not None:
            self.linear_state = self.linear_state.index_select(0, beam_idx.to(self.linear_state.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.linear_state is not None:
            self.linear_state = self.linear_state.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.linear_state is not None:
            self.linear_state = self.linear_state[indices, ...]


def check_chunk_cache(cache: Cache | None) -> None:
    """Refuse, in one sentence, a cache that cannot hold the FLASH chunk state (anything but a dynamic cache)."""
    fixed = sorted({type(layer).__name__ for layer in getattr(cache, "layers", ()) if not isinstance(layer, DynamicLayer)})
    if fixed:
        raise ValueError(
            f"GAU with chunk_size (FLASH) keeps its past as a constant-size chunk state that only a dynamic cache can "
            f"hold, but got a {type(cache).__name__} of {', '.join(fixed)}: generate with "
            "cache_implementation='dynamic' (the default) instead of 'static' or its variants."
        )


def chunk_cache_layer(cache: Cache, layer_idx: int) -> GAUChunkCacheLayer:
    """The ``GAUChunkCacheLayer`` of ``layer_idx``, installed in place of an unused ``DynamicLayer``."""
    while len(cache.layers) <= layer_idx:
        cache.layers.append(GAUChunkCacheLayer())
    layer = cache.layers[layer_idx]
    if isinstance(layer, GAUChunkCacheLayer):
        return layer
    if type(layer) is DynamicLayer and layer.get_seq_length() == 0:
        cache.layers[layer_idx] = GAUChunkCacheLayer()
        return cache.layers[layer_idx]
    raise TypeError(
        f"GAU with chunk_size needs a DynamicCache (or GAUChunkCacheLayer layers); layer {layer_idx} of the "
        f"cache is a {type(layer).__name__} that already holds {layer.get_seq_length()} tokens."
    )


# --------------------------------------------------------------------------------------------------
# The unit and the layer
# --------------------------------------------------------------------------------------------------
class GatedAttentionUnit(nn.Module):
    """One GAU (Hua et al. 2022, Code 1): fused gates/values/base projection, scale-offset q/k, RoPE,
    normalised single-head attention, gating and output projection (see the module docstring).

    Parameters: ``in_proj`` (d → 2e + s), ``out_proj`` (e → d), ``qk_scale`` γ and ``qk_offset`` β of
    shape ``(2, s)`` — rows q, k — or ``(4, s)`` with ``chunk_size`` (rows q, k, q', k'; FLASH's separate
    quadratic and linear queries/keys from the same base z); their initialisation follows ``gau_init``.
    Returns ``(output, weights)`` with weights ``(batch, 1, q, k)``. Chunked path: ``None`` unless
    ``output_attentions`` is requested; then the effective matrix W / L of ``flash_effective_weights`` is
    materialised (O(n²)) and the output computed as u ⊙ (W/L · v) — the same value, with gradients
    flowing through the returned map. ``None`` when decoding from a non-empty cache (old keys are
    folded into the chunk state and no longer exist).
    """

    def __init__(self, config: GAUConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = config.is_decoder
        self.width = config.intermediate_width
        self.key_size = config.attention_key_size
        self.chunk_size = config.chunk_size
        self.scaling = self.key_size**-0.5
        rows = 2 if config.chunk_size is None else 4
        self.in_proj = nn.Linear(config.hidden_size, 2 * self.width + self.key_size, bias=config.use_bias)
        self.out_proj = nn.Linear(self.width, config.hidden_size, bias=config.use_bias)
        self.qk_scale = nn.Parameter(torch.ones(rows, self.key_size))
        self.qk_offset = nn.Parameter(torch.zeros(rows, self.key_size))
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        key_counts: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        need_weights: bool | None = None,
        query_offset: int = 0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``need_weights``: whether the attention map is wanted (``GAULayer`` passes ``output_attentions``).

        ``None`` keeps the behaviour of a direct call: the quadratic path returns its map, the chunked path
        only when ``output_attentions`` is requested. With ``False`` the quadratic relu² path runs the
        blocked kernel ``relu2_attention`` (no n×n tensors kept for backward) and returns ``None``.
        """
        u, v, z = self.act_fn(self.in_proj(hidden_states)).split(
            [self.width, self.width, self.key_size], dim=-1
        )
        qk = (z.unsqueeze(2) * self.qk_scale + self.qk_offset).transpose(1, 2)  # (batch, rows, n, s)
        if position_embeddings is not None:
            qk = apply_rotary(qk, *position_embeddings)
        if self.chunk_size is None:
            attended, weights = self._quadratic(
                qk, v, attention_mask, key_counts, past_key_values, need_weights is not False, int(query_offset)
            )
        else:
            want_weights = need_weights
            if want_weights is None:
                want_weights = kwargs.get("output_attentions")
                want_weights = self.config.output_attentions if want_weights is None else want_weights
            attended, weights = self._chunked(
                qk, v, key_mask, key_counts, past_key_values, bool(want_weights)
            )
        output = self.out_proj(u * attended.to(u.dtype))
        return output, weights

    def _quadratic(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        key_counts: torch.Tensor | None,
        past_key_values: Cache | None,
        need_weights: bool = True,
        query_offset: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        query, key, value = qk[:, :1], qk[:, 1:2], v.unsqueeze(1)
        if past_key_values is not None:
            key, value = update_cache(past_key_values, key, value, self.layer_idx, query_offset)
        dropout_active = self.training and self.config.attention_probs_dropout_prob > 0
        if not need_weights and not dropout_active and self.config.attention_normalization == "relu2":
            # relu(a·scaling)²/L = relu((q·scaling/√L)·k)²: L folded into q, no n×n tensor kept.
            row_scale = self.scaling * relu2_length(key_counts, self.config, query[:, 0]).rsqrt()
            attended = relu2_attention(
                upcast(query[:, 0]),
                upcast(key[:, 0]),
                upcast(value[:, 0]),
                None if mask is None else mask[:, 0],
                row_scale,
                causal_offset=query_offset if self.is_causal else None,
            )
            return attended, None
        if not need_weights and self.config.attention_normalization in ("softmax", "softmax_plus"):
            return self._softmax_without_weights(query, key, value, mask, key_counts, query_offset), None
        scores = torch.matmul(upcast(query), upcast(key).transpose(-1, -2)) * self.scaling
        weights = gau_attention_weights(scores, mask, key_counts, self.config)
        weights = F.dropout(weights, p=self.config.attention_probs_dropout_prob, training=self.training)
        attended = torch.matmul(weights, upcast(value)).squeeze(1)
        return attended, weights.to(value.dtype)

    def _softmax_without_weights(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        key_counts: torch.Tensor | None,
        query_offset: int,
    ) -> torch.Tensor:
        """softmax / softmax_plus attention through ``softmax_attention``, without the attention map.

        The logit scale — 1/√s, times log nᵢ / log m per row for softmax_plus — multiplies q (O(n·s))
        rather than the n×n logits; the mask fills the fresh score buffer in place; rows without a visible
        key are zeroed on the (n × e) output instead of on the probabilities. Equal to the weights path.
        """
        scale: torch.Tensor | float = self.scaling
        if self.config.attention_normalization == "softmax_plus":
            factor = entropy_invariant_factor(key_counts, self.config.base_length, self.config.entropy_min_length)
            scale = (factor * self.scaling)[:, :, None]
        return softmax_attention(
            upcast(query[:, 0]) * scale,
            upcast(key[:, 0]),
            upcast(value[:, 0]),
            None if mask is None else mask[:, 0],
            causal_offset=query_offset if self.is_causal else None,
            dropout=self.config.attention_probs_dropout_prob,
            training=self.training,
        )

    def _chunked(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        key_mask: torch.Tensor | None,
        key_counts: torch.Tensor | None,
        past_key_values: Cache | None,
        want_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        quad_q, quad_k, lin_q, lin_k = qk.unbind(1)  # each (batch, n, s)
        lengths = relu2_length(key_counts, self.config, quad_q)[..., None]
        options = {"chunk_size": self.chunk_size, "causal": self.is_causal, "scaling": self.scaling}
        dropout = {"dropout": self.config.attention_probs_dropout_prob, "training": self.training}
        past = 0
        if past_key_values is None or not self.is_causal:
            numerator, _ = flash_mixed_chunk_attention(
                quad_q, quad_k, lin_q, lin_k, v, key_mask=key_mask, **options, **dropout
            )
        else:
            layer = chunk_cache_layer(past_key_values, self.layer_idx)
            past = layer.get_seq_length()
            numerator = self._chunked_with_cache(
                layer, quad_q, quad_k, lin_q, lin_k, v, key_mask, options, dropout
            )
        if not want_weights or past > 0:
            return numerator / lengths, None
        # Inspection mode: materialise the effective (batch, n, n) matrix W and use it for the output, so
        # the returned weights are the ones the output depends on (O(n²), like any attention map).
        weights = flash_effective_weights(
            quad_q, quad_k, lin_q, lin_k, key_mask=key_mask, **options, **dropout
        )
        weights = (weights / lengths).unsqueeze(1)
        return torch.matmul(weights, upcast(v).unsqueeze(1)).squeeze(1), weights.to(v.dtype)

    def _chunked_with_cache(
        self,
        layer: GAUChunkCacheLayer,
        quad_q: torch.Tensor,
        quad_k: torch.Tensor,
        lin_q: torch.Tensor,
        lin_k: torch.Tensor,
        v: torch.Tensor,
        key_mask: torch.Tensor | None,
        options: dict[str, Any],
        dropout: dict[str, Any],
    ) -> torch.Tensor:
        """Causal FLASH for new tokens given the open chunk and the closed-chunk state; updates the cache.

        The segment [open chunk ‖ new tokens] starts on a chunk boundary, so it is chunked exactly as the
        full sequence would be; the open chunk's rows get zero queries and are dropped.
        """
        batch, length = quad_q.shape[:2]
        past = layer.get_seq_length()
        if key_mask is not None:
            lin_k = lin_k * key_mask[:, past:, None].to(lin_k.dtype)
        keys, values = torch.cat([quad_k, lin_k], dim=-1).unsqueeze(1), v.unsqueeze(1)
        open_keys, open_values, state = layer.open_chunk()
        opened = 0 if open_keys is None else open_keys.shape[-2]
        if opened:
            keys, values = torch.cat([open_keys, keys], dim=-2), torch.cat([open_values, values], dim=-2)
        seg_quad_k, seg_lin_k = keys.squeeze(1).split(self.key_size, dim=-1)
        no_queries = quad_q.new_zeros(batch, opened, self.key_size)
        numerator, new_state = flash_mixed_chunk_attention(
            torch.cat([no_queries, quad_q], dim=1),
            seg_quad_k,
            torch.cat([no_queries, lin_q], dim=1),
            seg_lin_k,
            values.squeeze(1),
            key_mask=None if key_mask is None else key_mask[:, past - opened :],
            initial_state=state,
            **options,
            **dropout,
        )
        layer.store(keys, values, new_state, added=length, chunk_size=self.chunk_size)
        return numerator[:, opened:]


class GAULayer(GradientCheckpointingLayer):
    """A GAU with its residual connection: x + drop(GAU(norm(x))) (pre) or norm(x + drop(GAU(x))) (post)."""

    def __init__(self, config: GAUConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm_position = config.norm_position
        self.gau = GatedAttentionUnit(config, layer_idx)
        self.norm = build_norm(
            config.norm_type, config.hidden_size, config.layer_norm_eps, config.norm_elementwise_affine
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        key_counts: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        want_weights = kwargs.get("output_attentions")
        want_weights = self.gau.config.output_attentions if want_weights is None else want_weights

        def unit(x: torch.Tensor) -> torch.Tensor:
            return self.gau(
                x,
                position_embeddings=position_embeddings,
                attention_mask=attention_mask,
                key_mask=key_mask,
                key_counts=key_counts,
                past_key_values=past_key_values,
                need_weights=bool(want_weights),
                **kwargs,
            )[0]

        return residual_block(hidden_states, unit, self.norm, self.dropout, self.norm_position)


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------
class GAUPreTrainedModel(AttnVariantPreTrainedModel):
    """Base class of the GAU family: initialisation (``gau_init``), output recording."""

    config_class = GAUConfig
    config: GAUConfig
    family_prefix = "GAU"
    _no_split_modules: ClassVar[list[str]] = ["GAULayer"]
    _can_record_outputs: ClassVar[dict[str, type[nn.Module]]] = {
        "hidden_states": GAULayer,
        "attentions": GatedAttentionUnit,
    }

    def _init_family_weights(self, module: nn.Module) -> None:
        """``gau_init="gau_alpha"``: γ = 1 and fan-in truncated-normal projections (GAU-α's code);
        ``"flash"``: γ and projections ~ N(0, ``initializer_range``) (the FLASH pseudocode); β = 0."""
        if not isinstance(module, GatedAttentionUnit):
            return
        init.zeros_(module.qk_offset)
        if self.config.gau_init == "flash":
            init.normal_(module.qk_scale, mean=0.0, std=self.config.initializer_range)
            return
        init.ones_(module.qk_scale)
        depth_gain = self.config.num_hidden_layers ** (-1.0 / 3.0)
        for linear in (module.in_proj, module.out_proj):
            std = TRUNCATED_NORMAL_GAIN / math.sqrt(linear.in_features) * depth_gain
            init.trunc_normal_(linear.weight, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)


class GAUModel(AttnVariantBackbone, GAUPreTrainedModel):
    """The bare GAU stack: bidirectional encoder, or causal decoder with ``config.is_decoder``.

    Choosing ``attention_normalization`` for inputs of other lengths than pretraining (Su 2022):
    ``softmax_plus`` (GAU-α) for models that must work at shorter *and* longer lengths; ``relu2`` with
    ``relu2_length="fixed"`` (L = ``base_length``) to finetune a relu² model pretrained at one length on
    other lengths; ``relu2`` ``"dynamic"`` (L = nᵢ) only with mixed-length pretraining;
    ``relu2_normalized`` when the model should learn its own row normaliser.

    RoPE rotates the s-dimensional q and k (``attention_key_size``). Masks: a 2D padding mask
    ``(batch, past + seq)``; the quadratic path also takes a prepared 4D mask, the chunked path
    needs the 2D one (its chunks are fixed positions, so right padding gives exactly the unpadded
    result; left padding moves chunk boundaries relative to the text unless it is a multiple of
    ``chunk_size`` — masked keys still contribute exactly zero).
    """

    layer_class = GAULayer

    def _rotary_dim(self, config: GAUConfig) -> int:
        return config.attention_key_size

    def _attention_inputs(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        position_ids: torch.Tensor,
        past_length: int,
        given_position_ids: torch.Tensor | None,
    ) -> dict[str, Any]:
        batch_size, seq_length = hidden_states.shape[:2]
        geometry = {
            "batch_size": batch_size,
            "query_length": seq_length,
            "key_length": past_length + seq_length,
            "query_offset": past_length,
            "causal": self.is_causal,
            "device": hidden_states.device,
        }
        config = self.config
        needs_counts = config.attention_normalization == "softmax_plus" or (
            config.attention_normalization in LENGTH_NORMALIZED and config.relu2_length == "dynamic"
        )
        key_counts = (
            visible_key_counts(
                attention_mask, **geometry, dtype=compute_dtype(hidden_states.dtype), position_ids=given_position_ids
            )
            if needs_counts
            else None
        )
        if config.chunk_size is not None:
            check_chunk_cache(past_key_values)
            if attention_mask is not None and attention_mask.dim() != 2:
                raise ValueError(
                    "GAU with chunk_size (FLASH) needs a 2D attention_mask of shape (batch, past + seq), got "
                    f"shape {tuple(attention_mask.shape)}."
                )
            key_mask = attention_mask.to(hidden_states.device).bool() if attention_mask is not None else None
            return {"key_mask": key_mask, "key_counts": key_counts}
        return {
            "attention_mask": boolean_attention_mask(attention_mask, **geometry),
            "key_counts": key_counts,
        }


class GAUForMaskedLM(MaskedLMHeadMixin, GAUPreTrainedModel):
    """GAU encoder with a masked-language-modelling head (GAU-α's pretraining task)."""

    base_model_class = GAUModel


class GAUForCausalLM(CausalLMHeadMixin, GAUPreTrainedModel, GenerationMixin):
    """GAU decoder with a causal LM head; ``generate`` and a ``DynamicCache`` (FLASH: chunk state cache)."""

    base_model_class = GAUModel


class GAUForSequenceClassification(SequenceClassificationHeadMixin, GAUPreTrainedModel):
    """GAU encoder with a first-token classification / regression head."""

    base_model_class = GAUModel


class GAUForTokenClassification(TokenClassificationHeadMixin, GAUPreTrainedModel):
    """GAU encoder with a per-token classification head."""

    base_model_class = GAUModel


class GAUForQuestionAnswering(QuestionAnsweringHeadMixin, GAUPreTrainedModel):
    """GAU encoder with an extractive question-answering (span) head."""

    base_model_class = GAUModel


__all__ = [
    "GAUChunkCacheLayer",
    "GAUForCausalLM",
    "GAUForMaskedLM",
    "GAUForQuestionAnswering",
    "GAUForSequenceClassification",
    "GAUForTokenClassification",
    "GAULayer",
    "GAUModel",
    "GAUPreTrainedModel",
    "GatedAttentionUnit",
    "flash_effective_weights",
    "flash_mixed_chunk_attention",
    "gau_attention_weights",
    "laplace_attention",
    "relu2_attention",
    "softmax_attention",
]
