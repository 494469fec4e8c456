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
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration_gau import GAUConfig
from .gau_cache import GAUChunkCacheLayer, check_chunk_cache, chunk_cache_layer
from .gau_kernels import (
    flash_effective_weights,
    flash_mixed_chunk_attention,
    laplace_attention,
    relu2_attention,
    softmax_attention,
)
from .gau_triton import TRITON_AVAILABLE, triton_flash_intra_chunk, triton_relu2_attention
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
from .tensor_parallel import ShardedUnits, register_parallel_styles

register_parallel_styles()

RELU2_NORMALIZED_EPS = 1e-6
TRUNCATED_NORMAL_GAIN = 1.13684723
"""1 / std of a standard normal truncated to ±2: bert4keras scales its truncated normal by it, so σ is the real std."""


# --------------------------------------------------------------------------------------------------
# Normalisations: how A is computed from the scaled logits a = q·kᵀ/√s, chosen once per unit
# --------------------------------------------------------------------------------------------------
class GAUNormalization:
    """One ``attention_normalization``: ``weights`` gives A (the map), ``attend`` A·v without building A.

    ``weights(scores, mask, key_counts)``: ``scores`` a = q·kᵀ/√s ``(batch, 1, q, k)`` (≥ float32), ``mask``
    boolean ``(batch, 1, q, k)`` (``True`` = visible) or ``None``, ``key_counts`` nᵢ ``(batch, q)``. Hidden keys
    get exactly 0 (relu², Laplace: masked *after* the function) and a row without visible keys is all zeros.
    """

    def __init__(self, config: GAUConfig) -> None:
        self.config = config
        self.scaling = config.attention_key_size**-0.5

    @staticmethod
    def counts_needed(config: GAUConfig) -> bool:
        """Whether this normalisation reads nᵢ for ``config`` (the backbone computes them only then)."""
        return False

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        key_counts: torch.Tensor | None,
        causal_offset: int | None,
        dropout: float,
        use_triton: bool,
    ) -> torch.Tensor | None:
        """Σⱼ Aᵢⱼ vⱼ for ``(batch, n, ·)`` q, k, v and a ``(batch, q, k)`` mask without an n×n map kept for
        backward, or ``None`` when this normalisation has no such kernel (then the unit goes through
        ``weights``)."""
        return None


class SoftmaxNormalization(GAUNormalization):
    """``softmax``: softmax(a); ``softmax_plus``: softmax((log nᵢ / log ``base_length``)·a), GAU-α's."""

    def __init__(self, config: GAUConfig) -> None:
        super().__init__(config)
        self.plus = config.attention_normalization == "softmax_plus"

    @staticmethod
    def counts_needed(config: GAUConfig) -> bool:
        return config.attention_normalization == "softmax_plus"

    def logit_factor(self, key_counts: torch.Tensor | None) -> torch.Tensor | None:
        """The per-row factor ``(batch, q)`` of softmax_plus, or ``None`` for softmax."""
        if not self.plus:
            return None
        return entropy_invariant_factor(key_counts, self.config.base_length, self.config.entropy_min_length)

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None) -> torch.Tensor:
        factor = self.logit_factor(key_counts)
        return masked_softmax(scores if factor is None else scores * factor[:, None, :, None], mask)

    def attend(self, query, key, value, mask, key_counts, causal_offset, dropout, use_triton):
        """The logit scale multiplies q (O(n·s), not the n×n logits); then the blocked ``softmax_attention``
        (activation memory linear in n). Under attention dropout, which needs the probabilities, SDPA applies it
        without returning them. Measured on the 2-core CPU, SDPA was no faster in the model (e ≠ s takes its math
        path) and kept several n×n buffers: docs/gau.md."""
        factor = self.logit_factor(key_counts)
        query = query * (self.scaling if factor is None else (factor * self.scaling)[:, :, None])
        if dropout > 0:
            attended = F.scaled_dot_product_attention(
                query[:, None], key[:, None], value[:, None], attn_mask=None if mask is None else mask[:, None],
                dropout_p=dropout, scale=1.0,
            )[:, 0]
            return attended if mask is None else attended * mask.any(-1, keepdim=True)
        return softmax_attention(query, key, value, mask, causal_offset=causal_offset)


class LengthNormalization(GAUNormalization):
    """f(a) / L with L from ``relu2_length``: nᵢ (``dynamic``, the keys row i sees) or ``base_length`` (``fixed``)."""

    @staticmethod
    def counts_needed(config: GAUConfig) -> bool:
        return config.relu2_length == "dynamic"

    def lengths(self, key_counts: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """L per query, shape ``(batch, q)``, for ``like`` ``(batch, q, ·)``."""
        if self.config.relu2_length == "fixed":
            return torch.full(like.shape[:2], float(self.config.base_length), device=like.device,
                              dtype=compute_dtype(like.dtype))
        if key_counts is None:
            raise ValueError("relu2_length='dynamic' needs the per-row key counts nᵢ.")
        return upcast(key_counts).clamp(min=1.0)

    def function(self, scores: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None) -> torch.Tensor:
        weights = self.function(scores)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights / self.lengths(key_counts, scores[:, 0])[:, None, :, None]


class Relu2Normalization(LengthNormalization):
    """``relu2``: relu(a)² / L, the paper's GAU and FLASH."""

    def function(self, scores: torch.Tensor) -> torch.Tensor:
        return F.relu(scores).square()

    def attend(self, query, key, value, mask, key_counts, causal_offset, dropout, use_triton):
        """relu(a·scaling)²/L = relu((q·scaling/√L)·k)²: every factor folded into q, no n×n tensor kept
        (``relu2_attention``, or its Triton kernel). Dropout on A needs the map: ``None`` then."""
        if dropout > 0:
            return None
        query = query * (self.scaling * self.lengths(key_counts, query).rsqrt())[..., None]
        if use_triton:
            return triton_relu2_attention(query, key, value, mask, causal_offset)
        return relu2_attention(query, key, value, mask, 1.0, causal_offset=causal_offset)


class LaplaceNormalization(LengthNormalization):
    """``laplace``: laplace(a) / L with Mega's Laplace function (``gau_kernels.laplace_attention``)."""

    def function(self, scores: torch.Tensor) -> torch.Tensor:
        return laplace_attention(scores)


class Relu2RowNormalization(GAUNormalization):
    """``relu2_normalized``: relu(a)² / (Σⱼ relu(a)² + ε), an explicit row normaliser."""

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None) -> torch.Tensor:
        weights = F.relu(scores).square()
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights / (weights.sum(-1, keepdim=True) + RELU2_NORMALIZED_EPS)


GAU_NORMALIZATIONS: dict[str, type[GAUNormalization]] = {
    "softmax": SoftmaxNormalization,
    "softmax_plus": SoftmaxNormalization,
    "relu2": Relu2Normalization,
    "relu2_normalized": Relu2RowNormalization,
    "laplace": LaplaceNormalization,
}
"""``attention_normalization`` → its normalisation."""


def gau_attention_weights(
    scores: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None, config: GAUConfig
) -> torch.Tensor:
    """A = norm(a) of ``config.attention_normalization`` for scaled logits a ``(batch, 1, q, k)`` (≥ float32)."""
    return GAU_NORMALIZATIONS[config.attention_normalization](config).weights(scores, mask, key_counts)


def use_triton_kernel(config: GAUConfig, tensor: torch.Tensor) -> bool:
    """``gau_kernel``: ``"triton"`` always, ``"auto"`` on CUDA when triton is installed, ``"torch"`` never."""
    return config.gau_kernel == "triton" or (config.gau_kernel == "auto" and tensor.is_cuda and TRITON_AVAILABLE)


# --------------------------------------------------------------------------------------------------
# The unit and the layer
# --------------------------------------------------------------------------------------------------
class GatedAttentionUnit(ShardedUnits, nn.Module):
    """One GAU (Hua et al. 2022, Code 1): fused gates/values/base projection, scale-offset q/k, RoPE,
    normalised single-head attention, gating and output projection (see the module docstring).

    Parameters: ``in_proj`` (d → 2e + s), ``out_proj`` (e → d), ``qk_scale`` γ and ``qk_offset`` β of
    shape ``(2, s)`` — rows q, k — or ``(4, s)`` with ``chunk_size`` (rows q, k, q', k'; FLASH's separate
    quadratic and linear queries/keys from the same base z); their initialisation follows ``gau_init``.
    Returns ``(output, weights)``: ``weights`` is ``None`` unless ``output_attentions``; then ``(batch, 1, q, k)``
    — for FLASH the effective matrix W / L of ``flash_effective_weights``, materialised (O(n²)) and used for the
    output (the same value, with gradients flowing through the returned map), and ``None`` while decoding from a
    non-empty cache (old keys are folded into the chunk state and no longer exist).

    Tensor parallelism splits the expansion width e: each rank keeps its slice ``tp_slice(e)`` of u and v (and
    out_proj's matching input columns) and all of z, so the n×n attention is computed on every rank and only
    its product with v is split.
    """

    tp_replicated_parameters = ("qk_scale", "qk_offset")

    def __init__(self, config: GAUConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = config.is_decoder
        self.width = config.intermediate_width
        self.key_size = config.attention_key_size
        self.chunk_size = config.chunk_size
        self.scaling = self.key_size**-0.5
        self.normalization = GAU_NORMALIZATIONS[config.attention_normalization](config)
        if config.gau_kernel == "triton" and not TRITON_AVAILABLE:
            raise ImportError("gau_kernel='triton' needs the triton package: pip install 'hf_attn_variants[gpu]'.")
        rows = 2 if config.chunk_size is None else 4
        self.in_proj = nn.Linear(config.hidden_size, 2 * self.width + self.key_size, bias=config.use_bias)
        self.out_proj = nn.Linear(self.width, config.hidden_size, bias=config.use_bias)
        self.qk_scale = nn.Parameter(torch.ones(rows, self.key_size))
        self.qk_offset = nn.Parameter(torch.zeros(rows, self.key_size))
        self.act_fn = ACT2FN[config.hidden_act]

    def tp_units(self) -> tuple[int, str]:
        return self.width, "expansion units (intermediate_width)"

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        key_counts: torch.Tensor | None = None,
        cache: Cache | None = None,
        query_offset: int = 0,
        output_attentions: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``output_attentions``: also return the attention map (see the class docstring)."""
        u, v, z = self.act_fn(self.in_proj(hidden_states)).split(
            [self.width, self.width, self.key_size], dim=-1
        )
        share = self.tp_slice(self.width)
        u, v = u[..., share], v[..., share]
        qk = (z.unsqueeze(2) * self.qk_scale + self.qk_offset).transpose(1, 2)  # (batch, rows, n, s)
        if position_embeddings is not None:
            qk = apply_rotary(qk, *position_embeddings)
        if self.chunk_size is None:
            attended, weights = self._quadratic(
                qk, v, attention_mask, key_counts, cache, int(query_offset), output_attentions
            )
        else:
            attended, weights = self._chunked(qk, v, key_mask, key_counts, cache, output_attentions)
        output = self.out_proj(u * attended.to(u.dtype))
        return output, weights

    def _quadratic(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        key_counts: torch.Tensor | None,
        cache: Cache | None,
        query_offset: int,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        query, key, value = qk[:, :1], qk[:, 1:2], v.unsqueeze(1)
        if cache is not None:
            key, value = update_cache(cache, key, value, self.layer_idx, query_offset)
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        if not output_attentions:
            attended = self.normalization.attend(
                upcast(query[:, 0]),
                upcast(key[:, 0]),
                upcast(value[:, 0]),
                None if mask is None else mask[:, 0],
                key_counts,
                query_offset if self.is_causal else None,
                dropout,
                use_triton_kernel(self.config, query),
            )
            if attended is not None:
                return attended, None
        scores = torch.matmul(upcast(query), upcast(key).transpose(-1, -2)) * self.scaling
        weights = F.dropout(self.normalization.weights(scores, mask, key_counts), p=dropout, training=self.training)
        attended = torch.matmul(weights, upcast(value)).squeeze(1)
        return attended, weights.to(value.dtype) if output_attentions else None

    def _chunked(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        key_mask: torch.Tensor | None,
        key_counts: torch.Tensor | None,
        cache: Cache | None,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        quad_q, quad_k, lin_q, lin_k = qk.unbind(1)  # each (batch, n, s)
        lengths = self.normalization.lengths(key_counts, quad_q)[..., None]
        options = {"chunk_size": self.chunk_size, "causal": self.is_causal, "scaling": self.scaling}
        dropout = {"dropout": self.config.attention_probs_dropout_prob, "training": self.training}
        past = 0
        if cache is None or not self.is_causal:
            triton = use_triton_kernel(self.config, quad_q) and not (self.training and dropout["dropout"] > 0)
            numerator, _ = flash_mixed_chunk_attention(
                quad_q, quad_k, lin_q, lin_k, v, key_mask=key_mask, **options, **dropout, intra_chunk=not triton
            )
            if triton:  # the relu² part inside the chunks, fused; the linear state across chunks stays above
                numerator = numerator + triton_flash_intra_chunk(
                    upcast(quad_q) * self.scaling, upcast(quad_k), upcast(v), key_mask, self.chunk_size, self.is_causal
                )
        else:
            layer = chunk_cache_layer(cache, self.layer_idx)
            past = layer.get_seq_length()
            numerator = self._chunked_with_cache(
                layer, quad_q, quad_k, lin_q, lin_k, v, key_mask, options, dropout
            )
        if not output_attentions or past > 0:
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
        cache: Cache | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if output_attentions is None:
            output_attentions = self.gau.config.output_attentions

        def unit(x: torch.Tensor) -> torch.Tensor:
            return self.gau(
                x,
                position_embeddings=position_embeddings,
                attention_mask=attention_mask,
                key_mask=key_mask,
                key_counts=key_counts,
                cache=cache,
                output_attentions=bool(output_attentions),
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
    serving_limitation = (
        "GAU attends with one gated head whose values are wider than its keys, normalised by default by relu² with a "
        "per-row divisor (and with chunk_size through a linear-attention state carried across chunks), which a paged "
        "multi-head softmax kernel with one head size does not compute."
    )
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
        cache: Cache | None,
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
        needs_counts = GAU_NORMALIZATIONS[config.attention_normalization].counts_needed(config)
        key_counts = (
            visible_key_counts(
                attention_mask, **geometry, dtype=compute_dtype(hidden_states.dtype), position_ids=given_position_ids
            )
            if needs_counts
            else None
        )
        if config.chunk_size is not None:
            check_chunk_cache(cache)
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
    "GAU_NORMALIZATIONS",
    "GAUChunkCacheLayer",
    "GAUForCausalLM",
    "GAUForMaskedLM",
    "GAUForQuestionAnswering",
    "GAUForSequenceClassification",
    "GAUForTokenClassification",
    "GAULayer",
    "GAUModel",
    "GAUNormalization",
    "GAUPreTrainedModel",
    "GatedAttentionUnit",
    "gau_attention_weights",
    "use_triton_kernel",
]
