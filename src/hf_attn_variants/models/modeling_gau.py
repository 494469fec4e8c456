"""Gated Attention Unit (GAU), GAU-α and FLASH mixed-chunk attention as Transformers models.

Hua, Dai, Liu & Le (2022), "Transformer Quality in Linear Time" (arXiv:2202.10447), and Su Jianlin's GAU-α
(2022). One GAU layer replaces attention + feed-forward. With hidden d, e = expansion·d, s = key size:

    u, v = silu(X Wu), silu(X Wv)          (b, n, e) gates and values
    z    = silu(X Wz)                       (b, n, s) shared base of queries and keys
    q, k = z·γq + βq, z·γk + βk              per-dimension scale and offset, then RoPE
    A    = norm(q kᵀ / √s)                   (b, n, n), see ``attention_normalization``
    out  = (u ⊙ A v) Wo                      then residual + norm (pre or post)

Wu, Wv, Wz are one fused ``in_proj`` (d → 2e + s); Wo is ``out_proj``.

FLASH (``chunk_size`` = g): chunks of g tokens at tensor positions 0, g, 2g …; with separate scale/offsets for
the quadratic (q, k) and linear (q', k') parts,

    out_i = u_i ⊙ (1/L_i) [Σ_{j ∈ c(i), visible} relu(q_i·k_j/√s)² v_j + Σ_{j ∈ lin(i)} (q'_i·k'_j/√s) v_j]

lin(i) = every valid key (bidirectional) or those of earlier chunks (causal); L_i is relu²'s length, so one
chunk covering a causal sequence is quadratic relu² GAU. O(n·g·(s + e) + n·s·e). Packed documents: every
document starts on a chunk boundary (``DocumentChunks``) and its linear state is summed per document, O(n).

Shapes in the docstrings: B batch, T new tokens (T_q queries, T_k keys with the cache), D = d the hidden size,
S = s the key size, E = e the expansion width; GAU has one head.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging
from transformers.utils.import_utils import is_torchdynamo_compiling

from .configuration_gau import GAUConfig
from .gau_cache import GAUChunkCacheLayer, check_chunk_cache, chunk_cache_layer
from .gau_kernels import (
    DocumentChunks,
    FlashState,
    flash_decode_step,
    flash_effective_weights,
    flash_mixed_chunk_attention,
    flash_packed_windows,
    flash_visibility,
    laplace_attention,
    relu2_attention,
    roll_rows,
    softmax_attention,
    summed_state,
    uses_blocks,
)
from .layers import (
    apply_rotary,
    build_norm,
    compute_dtype,
    document_positions,
    entropy_invariant_factor,
    leading_padding,
    masked_softmax,
    upcast,
    update_cache,
)
from .modeling_common import (
    AttentionGeometry,
    AttnVariantBackbone,
    AttnVariantPreTrainedModel,
    CausalLMHeadMixin,
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
    TokenClassificationHeadMixin,
    residual_block,
)
from .tensor_parallel import ShardedUnits

logger = logging.get_logger(__name__)

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None
"""Whether ``triton`` is installed; its kernels (``gau_triton``) are imported only when paths run them."""
RELU2_NORMALIZED_EPS = 1e-6
TRUNCATED_NORMAL_GAIN = 1.13684723
"""1 / std of a standard normal truncated to ±2.

bert4keras scales its truncated normal by it, so σ is the real std.
"""


@dataclasses.dataclass(frozen=True)
class GAUAttentionSettings:
    """The ``GAUConfig`` fields a unit's attention reads while it runs, copied once when the unit is built.

    Dynamo below torch 2.11 installs no guard on an attribute read through a ``PreTrainedConfig`` (whose class
    has its own ``__getattribute__``): a model compiled after another would silently keep the first one's
    values. It guards the fields of a plain object like this one. As for ``attention_probs_dropout_prob``,
    changing a field on a built model's config changes nothing: build the model from the changed config.
    Only ``gau_kernel`` may be replaced in a built unit's copy (``dataclasses.replace``, as the ONNX export
    does): the unit's normalisation and the backbone read the other fields when built too.

    Args:
        attention_normalization (str): how A is computed (``GAU_NORMALIZATIONS``).
        relu2_length (str): relu²'s and Laplace's L: ``dynamic`` (nᵢ) or ``fixed`` (``base_length``).
        base_length (int): the training length of softmax_plus's factor and of a fixed L.
        entropy_min_length (int): softmax_plus's smallest nᵢ in the factor.
        attention_key_size (int): s, the size of q and k.
        chunk_size (int | None): FLASH's chunk g, or ``None`` for quadratic GAU.
        gau_kernel (str): ``auto``, ``triton``, ``torch`` or ``reference`` (``use_triton_kernel``).
    """

    attention_normalization: str
    relu2_length: str
    base_length: int
    entropy_min_length: int
    attention_key_size: int
    chunk_size: int | None
    gau_kernel: str

    @classmethod
    def of(cls, config: GAUConfig) -> GAUAttentionSettings:
        """The settings of ``config``.

        Args:
            config (GAUConfig): the model's config.

        Returns:
            GAUAttentionSettings: its attention fields.
        """
        return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})


GAUFields = GAUConfig | GAUAttentionSettings
"""What the attention helpers read their fields from: a config, or a unit's ``GAUAttentionSettings``."""


# --------------------------------------------------------------------------------------------------
# Normalisations: how A is computed from the scaled logits a = q·kᵀ/√s, chosen once per unit
# --------------------------------------------------------------------------------------------------
class GAUNormalization:
    """One ``attention_normalization``: ``weights`` gives A (the map), ``attend`` A·v through a kernel.

    Hidden keys get exactly 0 (relu², Laplace: masked *after* the function) and a row without visible keys is
    all zeros.

    Args:
        config (GAUFields): the unit's config or settings; the fields are read here, once.
    """

    def __init__(self, config: GAUFields) -> None:
        """Read the fields the normalisation uses and the logit scale 1/√s; see the class docstring."""
        self.name = config.attention_normalization
        self.base_length = config.base_length
        self.entropy_min_length = config.entropy_min_length
        self.relu2_length = config.relu2_length
        self.scaling = config.attention_key_size**-0.5

    @staticmethod
    def counts_needed(config: GAUConfig) -> bool:
        """Whether this normalisation reads nᵢ for ``config`` (the backbone computes them only then).

        Args:
            config (GAUConfig): the model's config.

        Returns:
            bool: whether nᵢ is needed.
        """
        return False

    @staticmethod
    def kernel_path(dropout: bool, triton: bool, blocked: bool) -> GAUPath | None:
        """The ``GAUPath`` of this normalisation's kernel for quadratic attention.

        Args:
            dropout (bool): attention dropout is active.
            triton (bool): the Triton kernels are chosen.
            blocked (bool): the score matrix is large enough for the blocked torch kernels.

        Returns:
            GAUPath | None: the path, or ``None`` where it has no kernel (the unit then materialises A).
        """
        return None

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None,
                key_counts: torch.Tensor | None) -> torch.Tensor:
        """The map A from the scaled logits.

        Args:
            scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a = q·kᵀ/√s, at least float32.
            mask (torch.Tensor | None): ``[B, 1, T_q, T_k]`` bool (``True`` = visible), or ``None``.
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ, where the normalisation reads them.

        Returns:
            torch.Tensor: ``[B, 1, T_q, T_k]`` A, the scores' dtype.
        """
        raise NotImplementedError

    def attend(
        self, path: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        mask: torch.Tensor | None, key_counts: torch.Tensor | None, causal_offset: int | None, dropout: float,
    ) -> torch.Tensor:
        """Σⱼ Aᵢⱼ vⱼ through the kernel of ``path``, without an n×n map kept for backward.

        Args:
            path (str): one of ``kernel_path``'s ``GAUPath`` values.
            query (torch.Tensor): ``[B, T_q, S]`` unscaled queries, at least float32.
            key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
            value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
            mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool (``True`` = visible), or ``None``.
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ, where the normalisation reads them.
            causal_offset (int | None): the first query's position when causal, or ``None``.
            dropout (float): attention dropout probability (0 outside training).

        Returns:
            torch.Tensor: ``[B, T_q, E]``, the query's dtype.
        """
        raise NotImplementedError(
            f"attention_normalization={self.name!r} has no kernel.")


class SoftmaxNormalization(GAUNormalization):
    """``softmax``: softmax(a); ``softmax_plus``: softmax((log nᵢ / log ``base_length``)·a), GAU-α's.

    Args:
        config (GAUFields): the unit's config or settings.
    """

    def __init__(self, config: GAUFields) -> None:
        """Note whether the logits get softmax_plus's factor; see the class docstring for the argument."""
        super().__init__(config)
        self.plus = self.name == "softmax_plus"

    @staticmethod
    def counts_needed(config: GAUConfig) -> bool:
        """Whether nᵢ is read: for softmax_plus only.

        Args:
            config (GAUConfig): the model's config.

        Returns:
            bool: whether nᵢ is needed.
        """
        return config.attention_normalization == "softmax_plus"

    @staticmethod
    def kernel_path(dropout: bool, triton: bool, blocked: bool) -> GAUPath | None:
        """SDPA under attention dropout, else the (blocked) torch kernel; softmax has no Triton kernel.

        Args:
            dropout (bool): attention dropout is active.
            triton (bool): the Triton kernels are chosen (ignored).
            blocked (bool): the score matrix is large enough for the blocked torch kernel.

        Returns:
            GAUPath | None: the path.
        """
        if dropout:
            return GAUPath.SOFTMAX_SDPA
        return GAUPath.SOFTMAX_BLOCKED if blocked else GAUPath.SOFTMAX

    def logit_factor(self, key_counts: torch.Tensor | None) -> torch.Tensor | None:
        """The per-row factor of softmax_plus, or ``None`` for softmax.

        Args:
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ (softmax_plus).

        Returns:
            torch.Tensor | None: ``[B, T_q]``, ``key_counts``' dtype.
        """
        if not self.plus:
            return None
        return entropy_invariant_factor(key_counts, self.base_length,  # type: ignore[arg-type]
                                        self.entropy_min_length)

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None,
                key_counts: torch.Tensor | None) -> torch.Tensor:
        """A = softmax(factor · a) over the visible keys; arguments as ``GAUNormalization.weights``.

        Args:
            scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a, at least float32.
            mask (torch.Tensor | None): ``[B, 1, T_q, T_k]`` bool, or ``None``.
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ (softmax_plus).

        Returns:
            torch.Tensor: ``[B, 1, T_q, T_k]``, the scores' dtype.
        """
        factor = self.logit_factor(key_counts)
        return masked_softmax(scores if factor is None else scores * factor[:, None, :, None], mask)

    def attend(self, path, query, key, value, mask, key_counts, causal_offset, dropout):
        """Softmax attention with the logit scale multiplying q (O(n·s), not the n×n logits).

        Then ``softmax_attention``, or under attention dropout (which needs the probabilities) SDPA, which
        applies it without returning them.

        Args:
            path (str): ``softmax``, ``softmax_blocked`` or ``softmax_sdpa``.
            query (torch.Tensor): ``[B, T_q, S]`` unscaled queries, at least float32.
            key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
            value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
            mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool, or ``None``.
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ (softmax_plus).
            causal_offset (int | None): the first query's position when causal, or ``None``.
            dropout (float): attention dropout probability.

        Returns:
            torch.Tensor: ``[B, T_q, E]``, the query's dtype.
        """
        factor = self.logit_factor(key_counts)
        query = query * (self.scaling if factor is None else (factor * self.scaling)[:, :, None])
        if path == GAUPath.SOFTMAX_SDPA:
            attended = F.scaled_dot_product_attention(
                query[:, None], key[:, None], value[:, None],
                attn_mask=None if mask is None else mask[:, None], dropout_p=dropout, scale=1.0,
            )[:, 0]
            return attended if mask is None else attended * mask.any(-1, keepdim=True)
        return softmax_attention(query, key, value, mask, causal_offset,
                                 blocked=path == GAUPath.SOFTMAX_BLOCKED)


class LengthNormalization(GAUNormalization):
    """f(a) / L, L from ``relu2_length``: nᵢ (``dynamic``, keys row i sees) or ``base_length`` (``fixed``)."""

    @staticmethod
    def counts_needed(config: GAUConfig) -> bool:
        """Whether nᵢ is read: for ``relu2_length="dynamic"``.

        Args:
            config (GAUConfig): the model's config.

        Returns:
            bool: whether nᵢ is needed.
        """
        return config.relu2_length == "dynamic"

    def lengths(self, key_counts: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """L per query.

        Args:
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ (``dynamic``).
            like (torch.Tensor): ``[B, T_q, ...]``, the queries.

        Returns:
            torch.Tensor: ``[B, T_q]`` in ``compute_dtype(like.dtype)`` (``fixed``) or nᵢ's upcast dtype.
        """
        if self.relu2_length == "fixed":
            return torch.full(like.shape[:2], float(self.base_length), device=like.device,
                              dtype=compute_dtype(like.dtype))
        if key_counts is None:
            raise ValueError("relu2_length='dynamic' needs the per-row key counts nᵢ.")
        return upcast(key_counts).clamp(min=1.0)

    def function(self, scores: torch.Tensor) -> torch.Tensor:
        """The function f applied to the logits.

        Args:
            scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a, at least float32.

        Returns:
            torch.Tensor: f(a), the same shape and dtype.
        """
        raise NotImplementedError

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None,
                key_counts: torch.Tensor | None) -> torch.Tensor:
        """A = f(a) / L, hidden keys zeroed after f.

        Args:
            scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a, at least float32.
            mask (torch.Tensor | None): ``[B, 1, T_q, T_k]`` bool, or ``None``.
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ (``dynamic``).

        Returns:
            torch.Tensor: ``[B, 1, T_q, T_k]``, the scores' dtype.
        """
        weights = self.function(scores)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights / self.lengths(key_counts, scores[:, 0])[:, None, :, None]


class Relu2Normalization(LengthNormalization):
    """``relu2``: relu(a)² / L, the relu² of GAU and FLASH in bert4keras's form.

    Hua et al. (2022) write relu(q·kᵀ/n + b)² with a relative position bias b.
    """

    def function(self, scores: torch.Tensor) -> torch.Tensor:
        """relu(a)².

        Args:
            scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a, at least float32.

        Returns:
            torch.Tensor: the same shape and dtype.
        """
        return F.relu(scores).square()

    @staticmethod
    def kernel_path(dropout: bool, triton: bool, blocked: bool) -> GAUPath | None:
        """The Triton or (blocked) torch relu² kernel; dropout on A needs the map: no kernel then.

        Args:
            dropout (bool): attention dropout is active.
            triton (bool): the Triton kernels are chosen.
            blocked (bool): the score matrix is large enough for the blocked torch kernel.

        Returns:
            GAUPath | None: the path, or ``None`` under dropout.
        """
        if dropout:
            return None
        if triton:
            return GAUPath.RELU2_TRITON
        return GAUPath.RELU2_BLOCKED if blocked else GAUPath.RELU2

    def attend(self, path, query, key, value, mask, key_counts, causal_offset, dropout):
        """relu(a·scaling)²/L = relu((q·scaling/√L)·k)²: every factor folded into q.

        Then ``relu2_attention``, or its Triton kernel.

        Args:
            path (str): ``relu2``, ``relu2_blocked`` or ``relu2_triton``.
            query (torch.Tensor): ``[B, T_q, S]`` unscaled queries, at least float32.
            key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
            value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
            mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool, or ``None``.
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ (``dynamic``).
            causal_offset (int | None): the first query's position when causal, or ``None``.
            dropout (float): unused (0: relu² has no kernel under dropout).

        Returns:
            torch.Tensor: ``[B, T_q, E]``, the query's dtype.
        """
        query = query * (self.scaling * self.lengths(key_counts, query).rsqrt())[..., None]
        if path == GAUPath.RELU2_TRITON:
            from .gau_triton import triton_relu2_attention

            return triton_relu2_attention(query, key, value, mask, causal_offset)
        return relu2_attention(query, key, value, mask, causal_offset, blocked=path == GAUPath.RELU2_BLOCKED)


class LaplaceNormalization(LengthNormalization):
    """``laplace``: laplace(a) / L with Mega's Laplace function (``gau_kernels.laplace_attention``)."""

    def function(self, scores: torch.Tensor) -> torch.Tensor:
        """Mega's laplace(a).

        Args:
            scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a, at least float32.

        Returns:
            torch.Tensor: the same shape and dtype, in [0, 1].
        """
        return laplace_attention(scores)


class Relu2RowNormalization(GAUNormalization):
    """``relu2_normalized``: relu(a)² / (Σⱼ relu(a)² + ε), an explicit row normaliser."""

    def weights(self, scores: torch.Tensor, mask: torch.Tensor | None,
                key_counts: torch.Tensor | None) -> torch.Tensor:
        """A = relu(a)² / (Σⱼ relu(a)² + ε), hidden keys zeroed before the sum.

        Args:
            scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a, at least float32.
            mask (torch.Tensor | None): ``[B, 1, T_q, T_k]`` bool, or ``None``.
            key_counts (torch.Tensor | None): unused.

        Returns:
            torch.Tensor: ``[B, 1, T_q, T_k]``, the scores' dtype.
        """
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
    scores: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None, config: GAUFields
) -> torch.Tensor:
    """A = norm(a) of ``config.attention_normalization`` for the scaled logits a.

    Args:
        scores (torch.Tensor): ``[B, 1, T_q, T_k]`` a = q·kᵀ/√s, at least float32.
        mask (torch.Tensor | None): ``[B, 1, T_q, T_k]`` bool (``True`` = visible), or ``None``.
        key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ, where the normalisation reads them.
        config (GAUFields): the model's config, or a unit's ``GAUAttentionSettings``.

    Returns:
        torch.Tensor: ``[B, 1, T_q, T_k]`` A, the scores' dtype.
    """
    return GAU_NORMALIZATIONS[config.attention_normalization](config).weights(scores, mask, key_counts)


def gau_reference_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
    key_counts: torch.Tensor | None, config: GAUFields, dropout: float = 0.0, training: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAU's attention written out, the reference every kernel is compared against.

    a = q kᵀ / √s, A = norm(a) (``gau_attention_weights``), out = A v, with dropout on A when ``training``.
    O(n²) memory.

    Args:
        query (torch.Tensor): ``[B, T_q, S]``, any floating dtype (upcast).
        key (torch.Tensor): ``[B, T_k, S]``.
        value (torch.Tensor): ``[B, T_k, E]``.
        mask (torch.Tensor | None): ``[B, T_q, T_k]`` bool (``True`` = visible), or ``None``.
        key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ, where the normalisation reads them.
        config (GAUFields): the model's config, or a unit's ``GAUAttentionSettings``.
        dropout (float): dropout probability on A.
        training (bool): whether that dropout is active.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: ``(A v, A)``: ``[B, T_q, E]`` and ``[B, 1, T_q, T_k]``, in at least
        float32.
    """
    scores = (torch.matmul(upcast(query), upcast(key).transpose(-1, -2)).unsqueeze(1)
              * config.attention_key_size**-0.5)
    weights = gau_attention_weights(scores, None if mask is None else mask[:, None], key_counts, config)
    weights = F.dropout(weights, p=dropout, training=training)
    return torch.matmul(weights[:, 0], upcast(value)), weights


# --------------------------------------------------------------------------------------------------
# Which computation a unit runs: decided once per call, from the input's shape and the settings
# --------------------------------------------------------------------------------------------------
class GAUPath(enum.StrEnum):
    """The computations a GAU unit can run.

    ``gau_attention_path`` picks one per call; ``GAU_ATTENTION_PATHS`` says what each computes.
    """

    ATTENTION_MAP = "attention_map"
    SOFTMAX_SDPA = "softmax_sdpa"
    SOFTMAX = "softmax"
    SOFTMAX_BLOCKED = "softmax_blocked"
    RELU2 = "relu2"
    RELU2_BLOCKED = "relu2_blocked"
    RELU2_TRITON = "relu2_triton"
    FLASH = "flash"
    FLASH_TRITON = "flash_triton"
    FLASH_MAP = "flash_map"
    FLASH_PACKED = "flash_packed"
    FLASH_PACKED_TRITON = "flash_packed_triton"
    FLASH_DOCUMENTS = "flash_documents"
    FLASH_WINDOWS = "flash_windows"
    FLASH_CACHE = "flash_cache"
    FLASH_CACHE_MAP = "flash_cache_map"


GAU_ATTENTION_PATHS: dict[GAUPath, str] = {
    GAUPath.ATTENTION_MAP: "A materialised (gau_reference_attention): gau_kernel='reference', "
    "output_attentions, relu² under attention dropout, and the normalisations without a kernel "
    "(relu2_normalized, laplace)",
    GAUPath.SOFTMAX_SDPA: "softmax / softmax_plus under attention dropout: SDPA with dropout, "
    "no map returned",
    GAUPath.SOFTMAX: "softmax_attention in one expression (≤ ATTENTION_BLOCK_ELEMENTS scores)",
    GAUPath.SOFTMAX_BLOCKED: "softmax_attention in query blocks (SoftmaxAttention): nothing n×n saved",
    GAUPath.RELU2: "relu2_attention in one expression (≤ ATTENTION_BLOCK_ELEMENTS scores)",
    GAUPath.RELU2_BLOCKED: "relu2_attention in query blocks (Relu2Attention): nothing n×n saved",
    GAUPath.RELU2_TRITON: "triton_relu2_attention: nothing n×n saved",
    GAUPath.FLASH: "FLASH mixed-chunk attention (flash_mixed_chunk_attention, its chunked torch "
    "implementation); a causal prefill's final state and open chunk then start the cache",
    GAUPath.FLASH_TRITON: "flash through the op's Triton implementation "
    "(gau_kernels.flash_mixed_chunk_triton)",
    GAUPath.FLASH_MAP: "FLASH's effective n×n matrix W materialised (flash_effective_weights), out = W v / L",
    GAUPath.FLASH_PACKED: "rows packing several documents, each starting on a chunk boundary "
    "(DocumentChunks), through flash with the linear state summed per document: O(n)",
    GAUPath.FLASH_PACKED_TRITON: "flash_packed through the op's Triton implementation",
    GAUPath.FLASH_DOCUMENTS: "the reference for packed rows: W restricted to each document, chunked from its "
    "start (flash_visibility), out = W v / L; O(n²)",
    GAUPath.FLASH_WINDOWS: "packed rows while compiling (no layout): each document chunked from its start "
    "within the row's own chunks and their neighbours (flash_packed_windows): O(n), static shapes",
    GAUPath.FLASH_CACHE: "causal FLASH over new tokens from the cached open chunk and cross-chunk state",
    GAUPath.FLASH_CACHE_MAP: "flash_cache to advance the cache, and the output from W (a cache with no "
    "earlier tokens)",
}
"""What each path computes."""


def use_triton_kernel(config: GAUFields, device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether the unit runs its Triton kernels.

    ``gau_kernel``: ``"triton"`` always; ``"auto"`` on CUDA when triton is installed and the kernels' inputs
    are bf16 or fp16, where their products run on the tensor cores (float32 inputs multiply in IEEE float32
    without them, so the torch path's cuBLAS products are taken); ``"torch"`` and ``"reference"`` never.

    Args:
        config (GAUFields): the model's config, or a unit's ``GAUAttentionSettings``.
        device (torch.device | str): where the unit runs.
        dtype (torch.dtype): the dtype of the tensors the kernels would take.

    Returns:
        bool: whether the Triton kernels are chosen.
    """
    auto = (config.gau_kernel == "auto" and torch.device(device).type == "cuda" and TRITON_AVAILABLE
            and dtype in (torch.bfloat16, torch.float16))
    return config.gau_kernel == "triton" or auto


def gau_attention_path(
    config: GAUFields,
    query_length: int,
    key_length: int,
    *,
    causal: bool,
    device: torch.device | str,
    dtype: torch.dtype,
    dropout: bool = False,
    cached: bool = False,
    output_attentions: bool = False,
    packed: bool = False,
    layout: bool = True,
) -> GAUPath:
    """The computation a GAU unit of ``config`` runs for one call.

    The map is materialised for ``gau_kernel="reference"`` and ``output_attentions``; otherwise each
    normalisation names its kernel (``GAUNormalization.kernel_path``) or has none. FLASH with a causal cache
    continues from earlier tokens (``key_length > query_length``) through the cached branch; a prefill (an
    empty cache) runs the parallel path, whose final state and open chunk start the cache. Packed rows (never
    cached) run the chunked kernels on ``DocumentChunks``' layout, the map per document (the reference), or,
    while compiling (no ``layout``), ``flash_packed_windows`` in the row's own chunks. Quadratic GAU takes
    packed rows through its usual kernels, with the mask.

    Args:
        config (GAUFields): the model's config, or a unit's ``GAUAttentionSettings``.
        query_length (int): T_q, the new tokens.
        key_length (int): T_k, the keys (earlier cached tokens included).
        causal (bool): whether queries see only earlier keys.
        device (torch.device | str): where the unit runs.
        dtype (torch.dtype): the dtype of the attention's inputs (``use_triton_kernel``).
        dropout (bool): whether attention dropout applies to the call (training, with
            ``attention_probs_dropout_prob > 0``): the Triton kernels have none.
        cached (bool): whether a cache is given.
        output_attentions (bool): whether the map is returned.
        packed (bool): rows packing several documents.
        layout (bool): whether the documents' chunk-aligned layout was built (not while compiling).

    Returns:
        GAUPath: the path (a ``GAU_ATTENTION_PATHS`` key).
    """
    reference = output_attentions or config.gau_kernel == "reference"
    triton = use_triton_kernel(config, device, dtype) and not dropout
    if config.chunk_size is None:
        if reference:
            return GAUPath.ATTENTION_MAP
        kernel = GAU_NORMALIZATIONS[config.attention_normalization].kernel_path(
            dropout, triton, uses_blocks(query_length, key_length))
        return kernel or GAUPath.ATTENTION_MAP
    if packed:
        if reference:
            return GAUPath.FLASH_DOCUMENTS
        if not layout:
            return GAUPath.FLASH_WINDOWS
        return GAUPath.FLASH_PACKED_TRITON if triton else GAUPath.FLASH_PACKED
    if cached and causal and key_length > query_length:
        return GAUPath.FLASH_CACHE
    if reference:
        return GAUPath.FLASH_CACHE_MAP if cached and causal else GAUPath.FLASH_MAP
    return GAUPath.FLASH_TRITON if triton else GAUPath.FLASH


# --------------------------------------------------------------------------------------------------
# The unit and the layer
# --------------------------------------------------------------------------------------------------
class GatedAttentionUnit(ShardedUnits, nn.Module):
    """What every GAU (Hua et al. 2022, Code 1) shares.

    The fused gates/values/base projection, scale-offset q/k, RoPE and the gated output projection.
    ``QuadraticGatedAttentionUnit`` and ``FlashGatedAttentionUnit`` attend; ``GAULayer`` builds the one its
    config names, once.

    Parameters: ``in_proj`` (d → 2e + s), ``out_proj`` (e → d), ``qk_scale`` γ and ``qk_offset`` β of shape
    ``[2, S]`` (rows q, k) or ``[4, S]`` with ``chunk_size`` (q, k, q', k'). ``forward`` returns
    ``(output, weights)``: ``weights`` only with ``output_attentions``, ``[B, 1, T_q, T_k]`` (FLASH: its
    effective matrix W / L; ``None`` while decoding from a non-empty cache, whose old keys are folded into the
    state). Tensor parallelism splits e: each rank keeps its slice of u and v (and ``out_proj``'s matching
    columns) and all of z.

    Args:
        config (GAUConfig): the model's config.
        layer_idx (int): the layer's index (its cache layer).
    """

    tp_replicated_parameters = ("qk_scale", "qk_offset")
    qk_rows = 2
    """Rows of ``qk_scale`` / ``qk_offset``: q, k (FLASH: q, k, q', k')."""

    def __init__(self, config: GAUConfig, layer_idx: int) -> None:
        """Build the projections and γ, β; the arguments are described in the class docstring."""
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = config.is_decoder
        self.width = config.intermediate_width
        self.key_size = config.attention_key_size
        self.scaling = self.key_size**-0.5
        # Read once, as Llama's attention: a config float read in a compiled, checkpointed forward after a
        # model of another dropout was compiled is symbolic, and dynamo cannot lift it into the checkpoint.
        self.attention_dropout = config.attention_probs_dropout_prob
        self.has_attention_dropout = self.attention_dropout > 0
        # The fields forward reads, copied once: dynamo < 2.11 does not guard a config's attributes.
        self.settings = GAUAttentionSettings.of(config)
        self.normalization = GAU_NORMALIZATIONS[config.attention_normalization](self.settings)
        if config.gau_kernel == "triton" and not TRITON_AVAILABLE:
            raise ImportError("gau_kernel='triton' needs the triton package (pip install triton): or use "
                              "gau_kernel='auto' or 'torch'.")
        self.in_proj = nn.Linear(config.hidden_size, 2 * self.width + self.key_size, bias=config.use_bias)
        self.out_proj = nn.Linear(self.width, config.hidden_size, bias=config.use_bias)
        self.qk_scale = nn.Parameter(torch.ones(self.qk_rows, self.key_size))
        self.qk_offset = nn.Parameter(torch.zeros(self.qk_rows, self.key_size))
        self.act_fn = ACT2FN[config.hidden_act]

    def tp_units(self) -> tuple[int, str]:
        """Tensor parallelism splits the expansion width e.

        Returns:
            tuple[int, str]: e and the units' name.
        """
        return self.width, "expansion units (intermediate_width)"

    def attention_path(self, query_length: int, key_length: int, device: torch.device | str,
                       dtype: torch.dtype, **mode: bool) -> GAUPath:
        """Which computation (a ``GAU_ATTENTION_PATHS`` key) this unit runs.

        ``gau_attention_path`` with the unit's settings, direction and dropout (training mode).

        Args:
            query_length (int): T_q, the new tokens.
            key_length (int): T_k, the keys (cache included).
            device (torch.device | str): where the unit runs.
            dtype (torch.dtype): the dtype of the attention's inputs.
            **mode: ``gau_attention_path``'s ``cached``, ``output_attentions``, ``packed`` and ``layout``.

        Returns:
            GAUPath: the path.
        """
        return gau_attention_path(self.settings, query_length, key_length, causal=self.is_causal,
                                  device=device, dtype=dtype,
                                  dropout=self.training and self.has_attention_dropout, **mode)

    def project(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gates u, values v and the rows q, k (q', k') of the scale-offset base z.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            position_embeddings (tuple | None): RoPE's ``(cos, sin)``, each ``[B, T, S]``, or ``None``.

        Returns:
            tuple[torch.Tensor, torch.Tensor, torch.Tensor]: u ``[B, T, E]``, v ``[B, T, E]`` (E: the rank's
            share under tensor parallelism) and q, k (q', k') ``[B, rows, T, S]`` (rows = ``qk_rows``),
            rotated by RoPE when ``position_embeddings`` are given; the model dtype.
        """
        return self.activate(self.in_proj(hidden_states), position_embeddings)

    def activate(
        self, projected: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``project`` after ``in_proj``: u, v, z = act(``projected``), then q, k (q', k') = z·γ + β, rotated.

        Elementwise, in the model's dtype.

        Args:
            projected (torch.Tensor): ``[B, T, 2E + S]``, ``in_proj``'s output.
            position_embeddings (tuple | None): RoPE's ``(cos, sin)``, each ``[B, T, S]``, or ``None``.

        Returns:
            tuple[torch.Tensor, torch.Tensor, torch.Tensor]: u ``[B, T, E]``, v ``[B, T, E]``, and
            ``[B, rows, T, S]``, as ``project``.
        """
        u, v, z = self.act_fn(projected).split([self.width, self.width, self.key_size], dim=-1)
        share = self.tp_slice(self.width)
        u, v = u[..., share], v[..., share]
        qk = (z.unsqueeze(2) * self.qk_scale.to(z.dtype) + self.qk_offset.to(z.dtype)).transpose(1, 2)
        if position_embeddings is not None:  # back to qk's dtype: autocast's float32 angles made it float32
            qk = apply_rotary(qk, *position_embeddings).to(qk.dtype)
        return u, v, qk


class QuadraticGatedAttentionUnit(GatedAttentionUnit):
    """GAU with quadratic attention over every visible key (no ``chunk_size``).

    A = norm(q kᵀ / √s) of its ``attention_normalization``, out = (u ⊙ A v) Wo. O(n²) time; the kernels keep
    nothing n×n.
    """

    def forward(self, hidden_states: torch.Tensor, geometry: AttentionGeometry,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None, key_counts: torch.Tensor | None = None,
                cache: Cache | None = None, output_attentions: bool = False,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend, gate and project back: (u ⊙ A v) Wo.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            geometry (AttentionGeometry): the call's geometry (its ``query_offset``: the cached tokens).
            position_embeddings (tuple | None): RoPE's ``(cos, sin)``, each ``[B, T, S]``, or ``None``.
            attention_mask (torch.Tensor | None): ``[B, 1, T_q, T_k]`` bool (block-diagonal for packed rows),
                or ``None``.
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ, where the normalisation reads them.
            cache (Cache | None): the model's cache (new keys and values are added to it).
            output_attentions (bool): also return A.
            **kwargs: the other layer inputs, ignored.

        Returns:
            tuple[torch.Tensor, torch.Tensor | None]: the output ``[B, T, D]`` in the model dtype, and A
            ``[B, 1, T_q, T_k]`` (with ``output_attentions``) or ``None``.
        """
        u, v, qk = self.project(hidden_states, position_embeddings)
        attended, weights = self._attend(qk, v, attention_mask, key_counts, cache, geometry.query_offset,
                                         output_attentions)
        return self.out_proj(u * attended.to(u.dtype)), weights

    def _attend(
        self, qk: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, key_counts: torch.Tensor | None,
        cache: Cache | None, query_offset: int | torch.Tensor, output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Quadratic GAU on rows q, k of ``qk`` and values ``v``, after the cache (if any) has new keys."""
        query, key, value = qk[:, :1], qk[:, 1:2], v.unsqueeze(1)
        if cache is not None:
            key, value = update_cache(cache, key, value, self.layer_idx, query_offset)
        query, key, value = upcast(query[:, 0]), upcast(key[:, 0]), upcast(value[:, 0])
        mask = None if mask is None else mask[:, 0]
        path = self.attention_path(query.shape[-2], key.shape[-2], query.device, query.dtype,
                                   cached=cache is not None, output_attentions=output_attentions)
        dropout = self.attention_dropout if self.training else 0.0
        if path == GAUPath.ATTENTION_MAP:
            attended, weights = gau_reference_attention(
                query, key, value, mask, key_counts, self.settings, dropout, self.training
            )
            return attended, weights.to(v.dtype) if output_attentions else None
        causal_offset = int(query_offset) if self.is_causal else None
        return (self.normalization.attend(path, query, key, value, mask, key_counts, causal_offset, dropout),
                None)


RECOMPUTED_PATHS = (GAUPath.FLASH, GAUPath.FLASH_TRITON, GAUPath.FLASH_PACKED, GAUPath.FLASH_PACKED_TRITON,
                    GAUPath.FLASH_WINDOWS)
"""FLASH's paths whose unit recomputes in backward (a tuple: dynamo 2.7–2.8 cannot trace ``in`` a frozenset).

Under autograd and without a cache, ``FlashGatedAttentionUnit`` keeps only ``in_proj``'s output for backward
and recomputes the rest (activations, RoPE, the op's forward, the gate).
"""


class FlashGatedAttentionUnit(GatedAttentionUnit):
    """FLASH (``chunk_size`` = g, Hua et al. 2022 §3): relu² inside chunks, linear attention across them.

    Exact relu² inside chunks of g tokens and linear attention across them, through the op
    ``gau_kernels.flash_mixed_chunk_attention`` (its ``chunk`` or ``triton`` implementation, or the reference
    with ``output_attentions``), in the model's dtype.

    Memory: in training (autograd on, no cache) the unit saves ``in_proj``'s output ``[B, T, 2E + S]``
    and the gated product ``[B, T, E]`` (``out_proj``'s input) and recomputes everything between them in
    backward (``torch.utils.checkpoint`` of ``_gate``), so a layer keeps ≈ (2d + 3e + s) values per token.

    Args:
        config (GAUConfig): the model's config (``chunk_size`` set).
        layer_idx (int): the layer's index (its cache layer).
    """

    qk_rows = 4

    def __init__(self, config: GAUConfig, layer_idx: int) -> None:
        """Build the unit and keep g; the arguments are described in the class docstring."""
        super().__init__(config, layer_idx)
        self.chunk_size: int = config.chunk_size  # type: ignore[assignment]

    def forward(self, hidden_states: torch.Tensor, geometry: AttentionGeometry,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                key_mask: torch.Tensor | None = None, key_counts: torch.Tensor | None = None,
                cache: Cache | None = None, output_attentions: bool = False,
                documents: DocumentChunks | None = None, row_shift: torch.Tensor | None = None,
                row_phases: tuple[int | None, ...] | None = None, **kwargs: Any
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """FLASH on the new tokens, gated and projected back: (u ⊙ FLASH(q, k, q', k', v) / L) Wo.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            geometry (AttentionGeometry): the call's geometry (unused: the cache layer counts the past).
            position_embeddings (tuple | None): RoPE's ``(cos, sin)``, each ``[B, T, S]``, or ``None``.
            key_mask (torch.Tensor | None): ``[B, past + T]`` bool, the 2D padding mask, or ``None``.
            key_counts (torch.Tensor | None): ``[B, T]`` nᵢ (``relu2_length="dynamic"``).
            cache (Cache | None): a dynamic cache (causal: its ``GAUChunkCacheLayer`` holds the state).
            output_attentions (bool): also return W / L.
            documents (DocumentChunks | None): the chunk-aligned layout of rows packing several documents.
            row_shift (torch.Tensor | None): ``[B]`` int64, each row's left padding mod g outside training
                (``FlashInputs.shift``).
            row_phases (tuple | None): the same on the host (``FlashInputs.phases``), eager.
            **kwargs: the other layer inputs, ignored.

        Returns:
            tuple[torch.Tensor, torch.Tensor | None]: the output ``[B, T, D]`` in the model dtype, and W / L
            ``[B, 1, T, T]`` (with ``output_attentions``; ``None`` while decoding from a non-empty cache).
        """
        length = hidden_states.shape[1]
        layer = chunk_cache_layer(cache, self.layer_idx) if cache is not None and self.is_causal else None
        past = 0 if layer is None else layer.get_seq_length()
        projected = self.in_proj(hidden_states)  # under autocast already in the op's dtype
        path = self.attention_path(
            length, past + length, hidden_states.device, projected.dtype, cached=layer is not None,
            output_attentions=output_attentions, packed=documents is not None,
            layout=documents is None or documents.segment is not None,
        )
        if layer is None and path in RECOMPUTED_PATHS and torch.is_grad_enabled():
            gated = checkpoint(self._gate, projected, position_embeddings, key_mask, key_counts, path, None,
                               documents, False, row_shift=row_shift, row_phases=row_phases,
                               use_reentrant=False)
            return self.out_proj(gated), None
        gated, weights = self._gate(projected, position_embeddings, key_mask, key_counts, path, layer,
                                    documents, output_attentions, with_map=True, row_shift=row_shift,
                                    row_phases=row_phases)
        return self.out_proj(gated), weights

    def _gate(
        self, projected: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        key_mask: torch.Tensor | None, key_counts: torch.Tensor | None, path: GAUPath,
        layer: GAUChunkCacheLayer | None, documents: DocumentChunks | None, output_attentions: bool,
        with_map: bool = False, row_shift: torch.Tensor | None = None,
        row_phases: tuple[int | None, ...] | None = None,
    ) -> Any:
        """The gated u ⊙ FLASH(q, k, q', k', v) / L from ``in_proj``'s output, through the runner of ``path``.

        The runner is ``FLASH_RUNNERS[path]``; the result is ``[B, T, E]``, with the map when ``with_map``.
        """
        u, v, qk = self.activate(projected, position_embeddings)
        inputs = self.flash_inputs(qk, v, key_mask, key_counts, row_shift, row_phases)
        numerator, weights = FLASH_RUNNERS[path](self, inputs, path, layer, documents, output_attentions)
        gated = u * numerator.to(u.dtype)
        return (gated, weights) if with_map else gated

    def flash_inputs(self, qk: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                     key_counts: torch.Tensor | None, shift: torch.Tensor | None = None,
                     phases: tuple[int | None, ...] | None = None) -> FlashInputs:
        """FLASH's inputs from the rows q, k, q', k' of ``qk`` and ``v``, with every factor in the queries.

        relu(a·q·k)²/L + (a·q'·k')/L (a = 1/√s) is folded into the queries: q·a/√L and q'·a/L, the factors in
        float32, the products in the model's dtype (O(n·s) work).

        Args:
            qk (torch.Tensor): ``[B, 4, T, S]``, the rows q, k, q', k' (``activate``), the model dtype.
            v (torch.Tensor): ``[B, T, E]``, the model dtype.
            key_mask (torch.Tensor | None): ``[B, past + T]`` bool, or ``None``.
            key_counts (torch.Tensor | None): ``[B, T]`` nᵢ (``relu2_length="dynamic"``).
            shift (torch.Tensor | None): ``FlashInputs.shift``.
            phases (tuple | None): ``FlashInputs.phases``.

        Returns:
            FlashInputs: the queries, keys and values ``[B, T, ·]`` in the model dtype, and ``key_mask``.
        """
        quad_q, quad_k, lin_q, lin_k = qk.unbind(1)
        lengths = self.normalization.lengths(key_counts, quad_q)  # type: ignore[attr-defined]
        quad_q = quad_q * (self.scaling * lengths.rsqrt()).to(quad_q.dtype)[..., None]
        lin_q = lin_q * (self.scaling / lengths).to(lin_q.dtype)[..., None]
        return FlashInputs(quad_q, quad_k, lin_q, lin_k, v, key_mask, shift, phases)

    def implementation(self, path: GAUPath) -> str:
        """The op's implementation for ``path``: ``triton`` on the Triton paths, else ``chunk``.

        Args:
            path (GAUPath): the unit's path.

        Returns:
            str: one of ``gau_kernels.FLASH_IMPLEMENTATIONS``.
        """
        return "triton" if path in (GAUPath.FLASH_TRITON, GAUPath.FLASH_PACKED_TRITON) else "chunk"

    @property
    def _options(self) -> dict[str, Any]:
        return {"chunk_size": self.chunk_size, "causal": self.is_causal,
                "dropout": self.attention_dropout, "training": self.training}

    def _run_parallel(self, x: FlashInputs, path: GAUPath, layer: GAUChunkCacheLayer | None, *_: Any) -> Any:
        """``flash`` / ``flash_triton``; a causal prefill starts the cache from its state and open chunk.

        Rows with a ``shift`` run rotated so that their chunks start at their first token (``roll_rows``);
        a prefill of such rows keeps each row's grid in the cache (``_start_rows``).
        """
        if layer is not None and x.phases is not None:
            return self._start_rows(layer, x, self.implementation(path)), None
        rolled = x.rolled()
        numerator, state = flash_mixed_chunk_attention(*rolled.tensors(), key_mask=rolled.key_mask,
                                                       implementation=self.implementation(path),
                                                       **self._options)
        if layer is not None:
            store_flash_state(layer, state, x.quad_q.shape[1], self.chunk_size)
        return numerator if x.shift is None else roll_rows(numerator, x.shift, back=True), None

    def _run_packed(self, x: FlashInputs, path: GAUPath, layer: Any, documents: DocumentChunks,
                    *_: Any) -> Any:
        """``flash_packed`` (``_triton``): the op on the documents' chunk-aligned layout.

        Its state is summed per document (``segments``).
        """
        aligned = [documents.gather(tensor) for tensor in x.tensors()]
        numerator = flash_mixed_chunk_attention(
            *aligned, key_mask=documents.valid, segments=documents.segment,
            implementation=self.implementation(path), **self._options)[0]
        return documents.restore(numerator), None

    def _run_windows(self, x: FlashInputs, path: GAUPath, layer: Any, documents: DocumentChunks,
                     *_: Any) -> Any:
        """``flash_windows``: packed rows in the row's own chunks (``flash_packed_windows``), no layout."""
        return flash_packed_windows(*x.tensors(), document_ids=documents.document_ids, key_mask=x.key_mask,
                                    **self._options), None

    def _run_cached(self, x: FlashInputs, path: GAUPath, layer: GAUChunkCacheLayer, *_: Any) -> Any:
        """``flash_cache``: new tokens after earlier ones (one token without dropout: ``_decode_step``)."""
        if x.quad_q.shape[1] == 1 and not (self.training and self.has_attention_dropout):
            return self._decode_step(layer, x), None
        return self.continue_from(layer, x), None

    def _run_map(
        self, x: FlashInputs, path: GAUPath, layer: Any, documents: DocumentChunks | None,
        output_attentions: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``flash_map`` / ``flash_documents`` / ``flash_cache_map``: the reference, out = W v.

        W is the effective ``[B, T, T]`` matrix (per document for packed rows), which is the map returned;
        ``flash_cache_map`` advances the cache first. O(n²), like any attention map.
        """
        if path == GAUPath.FLASH_CACHE_MAP:
            self.continue_from(layer, x)
        visibility = None
        if documents is not None:
            ids = documents.document_ids
            visibility = flash_visibility(document_positions(ids), self.chunk_size, self.is_causal,
                                          ids)
        rolled = x.rolled()
        weights = flash_effective_weights(rolled.quad_q, rolled.quad_k, rolled.lin_q, rolled.lin_k,
                                          key_mask=rolled.key_mask, visibility=visibility, **self._options)
        if x.shift is not None:  # back to the columns: queries, then keys
            weights = roll_rows(roll_rows(weights, x.shift, 1, back=True), x.shift, 2, back=True)
        weights = weights.unsqueeze(1)
        attended = torch.matmul(weights, upcast(x.value).unsqueeze(1)).squeeze(1)
        return attended, weights.to(x.value.dtype) if output_attentions else None

    def _decode_step(self, layer: GAUChunkCacheLayer, x: FlashInputs) -> torch.Tensor:
        """One new token per row after the cache in O(g·(s + e) + s·e) (``flash_decode_step``).

        The token joins the open chunk, and a chunk it completes is folded into the state. Rows on their
        own grids (``phases``) see the last (open length + 1) columns held, and fold them when full.
        """
        keys, values = x.cached_keys(slice(None)), x.value.unsqueeze(1)
        open_keys, open_values, state = layer.open_chunk()
        opened = 0 if open_keys is None else open_keys.shape[-2]
        if opened:
            keys = torch.cat([open_keys, keys], dim=-2)  # type: ignore[list-item]
            values = torch.cat([open_values, values], dim=-2)  # type: ignore[list-item]
        seg_quad_k, seg_lin_k = keys.squeeze(1).split(self.key_size, dim=-1)
        visible = None if x.key_mask is None else x.key_mask[:, -(opened + 1):].bool()
        closing: torch.Tensor | bool = opened + 1 == self.chunk_size
        own = layer.open_lengths(self.chunk_size)
        if own is not None:  # each row's open chunk; the columns before it are in its closed chunks
            first = torch.tensor([opened - length for length in own], device=keys.device)
            mine = torch.arange(opened + 1, device=keys.device) >= first[:, None]
            visible = mine if visible is None else visible & mine
            seg_lin_k = seg_lin_k * mine[..., None].to(seg_lin_k.dtype)
            full = [length + 1 == self.chunk_size for length in own]
            closing = all(full) or (any(full) and torch.tensor(full, device=keys.device))
        numerator, state = flash_decode_step(x.quad_q, x.lin_q, seg_quad_k, seg_lin_k, values.squeeze(1),
                                             state, visible, closing=closing)
        phases = layer.phases
        if phases is not None and None in phases:  # a row's first token sets its phase
            seen = layer.get_seq_length() % self.chunk_size
            phases = tuple(seen if phase is None and start == 0 else phase
                           for phase, start in zip(phases, self._first_tokens(layer, x)))
        layer.store(keys, values, state, added=1, chunk_size=self.chunk_size, phases=phases)
        return numerator

    def continue_from(self, layer: Any, x: FlashInputs, implementation: str = "chunk") -> torch.Tensor:
        """Causal FLASH for new tokens after the ``FlashState`` a cache layer holds (``open_chunk``).

        Runs the op's ``implementation``; the layer then holds the new state (``store``).

        Args:
            layer (Any): a ``GAUChunkCacheLayer`` or any object with ``open_chunk()`` and ``store()`` (vLLM's
                ``SequenceState``).
            x (FlashInputs): the new tokens' inputs (``flash_inputs``), ``[B, T, ·]``.
            implementation (str): one of ``gau_kernels.FLASH_IMPLEMENTATIONS``.

        Returns:
            torch.Tensor: the numerator ``[B, T, E]`` in the value's dtype.
        """
        if x.phases is not None:  # a prefill of rows off the grid
            return self._start_rows(layer, x, implementation)
        if getattr(layer, "phases", None) is not None:
            return self._continue_rows(layer, x, implementation)
        open_keys, open_values, linear = layer.open_chunk()
        state = FlashState(linear, None if open_keys is None else open_keys.squeeze(1),
                           None if open_values is None else open_values.squeeze(1))
        numerator, state = flash_mixed_chunk_attention(*x.tensors(), key_mask=x.key_mask, initial_state=state,
                                                       implementation=implementation, **self._options)
        store_flash_state(layer, state, x.quad_q.shape[1], self.chunk_size)
        return numerator

    def _start_rows(self, layer: GAUChunkCacheLayer, x: FlashInputs, implementation: str) -> torch.Tensor:
        """The prefill of rows off the grid: one op call on the rotated rows, then each row's state.

        Row b, rotated by p_b (its left padding mod g, ``x.phases``), has closed c_b = ⌊(T − p_b)/g⌋·g
        columns: its state is Σ k'ᵀv over them, and its open chunk is the row's last (T − p_b) − c_b columns.
        The layer holds those, right-aligned, and the phases (a row of padding only has none yet: its first
        token sets it).

        Args:
            layer (GAUChunkCacheLayer): the empty cache layer.
            x (FlashInputs): the prompt's inputs, ``[B, T, ·]``, with ``shift`` and ``phases``.
            implementation (str): one of ``gau_kernels.FLASH_IMPLEMENTATIONS``.

        Returns:
            torch.Tensor: the numerator ``[B, T, E]`` in the value's dtype.
        """
        rolled = x.rolled()
        numerator = flash_mixed_chunk_attention(*rolled.tensors(), key_mask=rolled.key_mask,
                                                implementation=implementation, **self._options)[0]
        length = x.quad_q.shape[1]
        phases = x.phases or ()
        opened = [0 if phase is None else (length - phase) % self.chunk_size for phase in phases]
        closed = torch.tensor([length - (phase or 0) - own for phase, own in zip(phases, opened)],
                              device=x.value.device)
        summed = torch.arange(length, device=closed.device) < closed[:, None]
        if rolled.key_mask is not None:
            summed = summed & rolled.key_mask[:, -length:]
        lin_k = rolled.lin_k * summed[..., None].to(rolled.lin_k.dtype)
        linear = summed_state(lin_k, rolled.value, self.chunk_size)  # ≥ float32 under autocast too
        kept = slice(length - max(opened), length)
        layer.store(x.cached_keys(kept), x.value[:, kept].unsqueeze(1), linear, added=length,
                    chunk_size=self.chunk_size, phases=phases)
        return roll_rows(numerator, x.shift, back=True)  # type: ignore[arg-type]

    def _continue_rows(self, layer: GAUChunkCacheLayer, x: FlashInputs, implementation: str) -> torch.Tensor:
        """``continue_from`` for rows on their own chunk grids (``phases``): the op row by row.

        Each row continues its own open chunk (``open_lengths``); a row of padding only so far starts at its
        first token here, which sets its phase. The layer then holds every row's new open chunk,
        right-aligned.

        Args:
            layer (GAUChunkCacheLayer): the cache layer.
            x (FlashInputs): the new tokens' inputs, ``[B, T, ·]``.
            implementation (str): one of ``gau_kernels.FLASH_IMPLEMENTATIONS``.

        Returns:
            torch.Tensor: the numerator ``[B, T, E]`` in the value's dtype.
        """
        open_keys, open_values, linear = layer.open_chunk()
        held = 0 if open_keys is None else open_keys.shape[-2]
        if linear is None:  # no row closed a chunk yet
            linear = upcast(x.value).new_zeros(x.value.shape[0], x.lin_k.shape[-1], x.value.shape[-1])
        length, phases = x.quad_q.shape[1], list(layer.phases)  # type: ignore[arg-type]
        starts = self._first_tokens(layer, x) if None in phases else [0] * len(phases)
        owns = layer.open_lengths(self.chunk_size) or []
        numerators, states = [], []
        for row, (opened, start) in enumerate(zip(owns, starts)):
            if start == length:  # padding only, still: no output to compute, nothing to keep
                numerators.append(x.value.new_zeros(1, length, x.value.shape[-1]))
                no_keys = x.cached_keys(slice(0))[row:row + 1, 0]
                states.append(FlashState(linear[row:row + 1], no_keys, x.value[row:row + 1, :0]))
                continue
            if phases[row] is None:
                phases[row] = (layer.get_seq_length() + start) % self.chunk_size
            inputs = x.row(row, start)
            chunk = [None if not opened else kept[row:row + 1, 0, held - opened:]  # type: ignore[index]
                     for kept in (open_keys, open_values)]
            before = FlashState(linear[row:row + 1], *chunk)
            numerator, state = flash_mixed_chunk_attention(*inputs.tensors(), key_mask=inputs.key_mask,
                                                           initial_state=before,
                                                           implementation=implementation, **self._options)
            numerators.append(F.pad(numerator, (0, 0, start, 0)))
            states.append(state)
        width = max(state.keys.shape[1] for state in states)  # type: ignore[union-attr]
        keys, values = (torch.cat([F.pad(tensor, (0, 0, width - tensor.shape[1], 0))  # type: ignore[arg-type, union-attr]
                                   for tensor in tensors])
                        for tensors in ([s.keys for s in states], [s.values for s in states]))
        linear = torch.cat([state.linear for state in states])  # type: ignore[misc]
        layer.store(keys.unsqueeze(1), values.unsqueeze(1), linear, added=length, chunk_size=self.chunk_size,
                    phases=phases)
        return torch.cat(numerators)

    @staticmethod
    def _first_tokens(layer: GAUChunkCacheLayer, x: FlashInputs) -> list[int]:
        """Per row, the first new column holding a token (T: none) for rows without one yet, else 0.

        One host read (``leading_padding``), only while a row of the cache has seen padding only.
        """
        if x.key_mask is None:
            return [0] * x.quad_q.shape[0]
        firsts = leading_padding(x.key_mask[:, -x.quad_q.shape[1]:]).tolist()
        return [first if phase is None else 0 for phase, first in zip(layer.phases or (), firsts)]


class FlashInputs(NamedTuple):
    """FLASH's per-call tensors.

    Attributes:
        quad_q (torch.Tensor): ``[B, T, S]`` quadratic queries (factors folded in), the model dtype.
        quad_k (torch.Tensor): ``[B, T, S]`` quadratic keys.
        lin_q (torch.Tensor): ``[B, T, S]`` linear queries (factors folded in).
        lin_k (torch.Tensor): ``[B, T, S]`` linear keys.
        value (torch.Tensor): ``[B, T, E]``.
        key_mask (torch.Tensor | None): ``[B, past + T]`` bool, the 2D key mask (``None`` without padding).
        shift (torch.Tensor | None): ``[B]`` int64, each row's left padding mod g (outside training, from an
            empty cache): the row is computed on chunks that start at its first token, as alone
            (``roll_rows``). ``None``: on the columns' own chunks.
        phases (tuple | None): ``shift`` on the host, ``None`` for a row of padding only (eager; set when a
            row needs rotating): a cache keeps them (``GAUChunkCacheLayer.phases``).
    """

    quad_q: torch.Tensor
    quad_k: torch.Tensor
    lin_q: torch.Tensor
    lin_k: torch.Tensor
    value: torch.Tensor
    key_mask: torch.Tensor | None
    shift: torch.Tensor | None = None
    phases: tuple[int | None, ...] | None = None

    def rolled(self) -> FlashInputs:
        """The inputs, each row's columns rotated left by its ``shift`` (``roll_rows``; none: as they are).

        Returns:
            FlashInputs: the rotated inputs (``shift`` cleared).
        """
        if self.shift is None:
            return self
        quad_q, quad_k, lin_q, lin_k, value = (roll_rows(tensor, self.shift) for tensor in self.tensors())
        mask = None if self.key_mask is None else roll_rows(self.key_mask, self.shift)
        return FlashInputs(quad_q, quad_k, lin_q, lin_k, value, mask)

    def cached_keys(self, columns: slice) -> torch.Tensor:
        """[k ‖ k'·mask] of the new ``columns``, what a ``GAUChunkCacheLayer`` holds for them.

        Args:
            columns (slice): of the T new columns.

        Returns:
            torch.Tensor: ``[B, 1, n, 2S]``, the model dtype.
        """
        lin_k = self.lin_k[:, columns]
        if self.key_mask is not None:
            visible = self.key_mask[:, -self.lin_k.shape[1]:][:, columns]
            lin_k = lin_k * visible[..., None].to(lin_k.dtype)
        return torch.cat([self.quad_k[:, columns], lin_k], dim=-1).unsqueeze(1)

    def row(self, index: int, start: int = 0) -> FlashInputs:
        """Batch row ``index`` alone, from column ``start``.

        The mask keeps every column: the op reads its last ones.

        Args:
            index (int): the batch row.
            start (int): the first column kept.

        Returns:
            FlashInputs: ``[1, T − start, ·]``.
        """
        quad_q, quad_k, lin_q, lin_k, value = (tensor[index:index + 1, start:] for tensor in self.tensors())
        mask = None if self.key_mask is None else self.key_mask[index:index + 1]
        return FlashInputs(quad_q, quad_k, lin_q, lin_k, value, mask)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The op's first five arguments, named one by one.

        Dynamo 2.7–2.8 fails inside on a slice of a named tuple (``x[:5]``).

        Returns:
            tuple[torch.Tensor, ...]: ``(quad_q, quad_k, lin_q, lin_k, value)``.
        """
        return self.quad_q, self.quad_k, self.lin_q, self.lin_k, self.value


FLASH_RUNNERS: dict[GAUPath, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    GAUPath.FLASH: FlashGatedAttentionUnit._run_parallel,
    GAUPath.FLASH_TRITON: FlashGatedAttentionUnit._run_parallel,
    GAUPath.FLASH_PACKED: FlashGatedAttentionUnit._run_packed,
    GAUPath.FLASH_PACKED_TRITON: FlashGatedAttentionUnit._run_packed,
    GAUPath.FLASH_CACHE: FlashGatedAttentionUnit._run_cached,
    GAUPath.FLASH_MAP: FlashGatedAttentionUnit._run_map,
    GAUPath.FLASH_CACHE_MAP: FlashGatedAttentionUnit._run_map,
    GAUPath.FLASH_DOCUMENTS: FlashGatedAttentionUnit._run_map,
    GAUPath.FLASH_WINDOWS: FlashGatedAttentionUnit._run_windows,
}
"""FLASH's paths → the unit's method that runs each.

``(self, inputs, path, cache layer, documents, output_attentions)`` → ``(numerator, map or None)``.
"""


def store_flash_state(layer: Any, state: FlashState, added: int, chunk_size: int) -> None:
    """Write the op's ``FlashState`` after ``added`` new tokens into a cache layer (``store``).

    Args:
        layer (Any): a ``GAUChunkCacheLayer`` or any object with ``store()``.
        state (FlashState): the causal state after the tokens (open chunk included).
        added (int): the new tokens.
        chunk_size (int): g.
    """
    layer.store(state.keys.unsqueeze(1), state.values.unsqueeze(1),  # type: ignore[union-attr]
                state.linear, added=added, chunk_size=chunk_size)


class GAULayer(GradientCheckpointingLayer):
    """A GAU with its residual connection: x + drop(GAU(norm(x))) (pre) or norm(x + drop(GAU(x))) (post).

    Args:
        config (GAUConfig): the model's config.
        layer_idx (int): the layer's index.
    """

    attention_class = GatedAttentionUnit

    def __init__(self, config: GAUConfig, layer_idx: int) -> None:
        """Build the unit its config names, the norm and the dropout; see the class docstring."""
        super().__init__()
        self.norm_position = config.norm_position
        unit = QuadraticGatedAttentionUnit if config.chunk_size is None else FlashGatedAttentionUnit
        self.gau = unit(config, layer_idx)
        self.norm = build_norm(
            config.norm_type, config.hidden_size, config.layer_norm_eps, config.norm_elementwise_affine
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, hidden_states: torch.Tensor, output_attentions: bool | None = None, **unit_inputs: Any
    ) -> torch.Tensor:
        """Run the unit inside the residual block.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            output_attentions (bool | None): whether the unit computes its map (``None``: the config's);
                the layer returns the hidden states only.
            **unit_inputs: the keyword inputs of the unit's ``forward`` (geometry, RoPE tables, masks, nᵢ,
                cache, documents), passed through unchanged.

        Returns:
            torch.Tensor: ``[B, T, D]``, the model dtype.
        """
        if output_attentions is None:
            output_attentions = self.gau.config.output_attentions

        def unit(x: torch.Tensor) -> torch.Tensor:
            return self.gau(x, output_attentions=bool(output_attentions), **unit_inputs)[0]

        return residual_block(hidden_states, unit, self.norm, self.dropout, self.norm_position)


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------
class GAUPreTrainedModel(AttnVariantPreTrainedModel):
    """Base class of the GAU family: initialisation (``gau_init``), output recording."""

    config_class = GAUConfig
    config: GAUConfig
    layer_class = GAULayer
    serving_limitation = (
        "GAU attends with one gated head whose values are wider than its keys, normalised by default by "
        "relu² with a per-row divisor (and with chunk_size through a linear-attention state carried across "
        "chunks), which that backend does not compute; with hf_attn_variants installed in vLLM's environment "
        "(a wheel built from its clone) and model_impl left at \"auto\" (not --model-impl transformers), its "
        "plugin serves FLASH (chunk_size) and softmax GAU natively; or generate with Transformers "
        "(model.generate with its cache)."
    )

    def _init_family_weights(self, module: nn.Module) -> None:
        """Initialise a unit by ``gau_init``.

        ``"gau_alpha"``: γ = 1 and fan-in truncated-normal projections (GAU-α's code); ``"flash"``: γ and
        projections ~ N(0, ``initializer_range``) (the FLASH pseudocode); β = 0.
        """
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

    RoPE rotates the s-dimensional q and k. Masks: a 2D padding mask ``[B, past + T]``; the quadratic
    path also takes a prepared 4D mask; FLASH needs the 2D one (masked keys contribute exactly zero; right
    padding gives the unpadded result, and outside training left-padded rows are chunked from their first
    token, ``FlashInputs.shift``, so each row gives its lone run's result).
    """

    def __init__(self, config: GAUConfig) -> None:
        """Build the stack, and read once whether the units take nᵢ, and FLASH's g.

        Read here, not in forward: dynamo below torch 2.11 does not guard a config's attributes
        (``GAUAttentionSettings``).
        """
        super().__init__(config)
        normalization = GAU_NORMALIZATIONS[config.attention_normalization]
        self.needs_key_counts = normalization.counts_needed(config)
        self.chunk_size = config.chunk_size

    def _rotary_dim(self, config: GAUConfig) -> int:
        return config.attention_key_size

    def _attention_inputs(
        self, geometry: AttentionGeometry, hidden_states: torch.Tensor, cache: Cache | None
    ) -> dict[str, Any]:
        """The unit's inputs: nᵢ where the normalisation reads it (per document for packed rows), and masks.

        Quadratic GAU gets a boolean ``attention_mask`` (block-diagonal for packed rows), FLASH the 2D
        ``key_mask`` and, for packed rows, their chunk-aligned layout (``DocumentChunks``).
        """
        key_counts = None
        if self.needs_key_counts:
            key_counts = geometry.key_counts(compute_dtype(hidden_states.dtype))
        if self.chunk_size is None:
            return {"attention_mask": geometry.boolean_mask(), "key_counts": key_counts}
        check_chunk_cache(cache, geometry.batch_size)
        attention_mask = geometry.attention_mask
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(
                "GAU with chunk_size (FLASH) needs a 2D attention_mask of shape (batch, past + seq), got "
                f"shape {tuple(attention_mask.shape)}."
            )
        key_mask = attention_mask.to(geometry.device).bool() if attention_mask is not None else None
        documents = row_shift = row_phases = None
        if geometry.document_ids is not None:
            documents = DocumentChunks.build(geometry.document_ids.to(geometry.device), self.chunk_size,
                                             layout=not is_torchdynamo_compiling())
        elif key_mask is not None and not self.training and geometry.query_offset == 0:
            row_shift, row_phases = row_alignment(key_mask, self.chunk_size, cache is not None)
        return {"key_mask": key_mask, "key_counts": key_counts, "documents": documents,
                "row_shift": row_shift, "row_phases": row_phases}


def row_alignment(key_mask: torch.Tensor, chunk_size: int, cached: bool
                  ) -> tuple[torch.Tensor | None, tuple[int | None, ...] | None]:
    """Each row's left padding mod g, so that FLASH chunks it from its first token (``FlashInputs.shift``).

    Eager, one host read: ``(None, None)`` when every row has a token and its padding is a multiple of g (the
    columns' chunks are the rows' own), else the shift and the same on the host (``None``: a row of padding
    only). Compiled, the shift on the device without the host values, or nothing with a cache, whose rows'
    grids are host values (the columns' chunks then, as before).

    Args:
        key_mask (torch.Tensor): ``[B, T]`` bool, the prompt's mask.
        chunk_size (int): g.
        cached (bool): whether a cache starts from this prompt.

    Returns:
        tuple: ``[B]`` int64 or ``None``, and a tuple of ints (or ``None``) or ``None``.
    """
    padding = leading_padding(key_mask)  # T: a row of padding only
    if is_torchdynamo_compiling():
        return (None if cached else padding % chunk_size), None
    phases = tuple(None if pad == key_mask.shape[1] else pad % chunk_size for pad in padding.tolist())
    if all(phase == 0 for phase in phases):
        return None, None
    return padding % chunk_size, phases


class GAUForMaskedLM(MaskedLMHeadMixin, GAUPreTrainedModel):
    """``GAUModel`` with a masked language-modelling head (``MaskedLMHeadMixin``)."""

    base_model_class = GAUModel


class GAUForCausalLM(CausalLMHeadMixin, GAUPreTrainedModel, GenerationMixin):
    """``GAUModel`` with a causal language-modelling head, a cache and ``generate``.

    The head is ``CausalLMHeadMixin``.
    """

    base_model_class = GAUModel


class GAUForSequenceClassification(SequenceClassificationHeadMixin, GAUPreTrainedModel):
    """``GAUModel`` with a sequence classification or regression head.

    The head is ``SequenceClassificationHeadMixin``.
    """

    base_model_class = GAUModel


class GAUForTokenClassification(TokenClassificationHeadMixin, GAUPreTrainedModel):
    """``GAUModel`` with a token classification head (``TokenClassificationHeadMixin``)."""

    base_model_class = GAUModel


class GAUForQuestionAnswering(QuestionAnsweringHeadMixin, GAUPreTrainedModel):
    """``GAUModel`` with an extractive question-answering head (``QuestionAnsweringHeadMixin``)."""

    base_model_class = GAUModel


__all__ = [
    "GAU_ATTENTION_PATHS",
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
    "FlashGatedAttentionUnit",
    "GatedAttentionUnit",
    "QuadraticGatedAttentionUnit",
    "gau_attention_path",
    "gau_attention_weights",
    "gau_reference_attention",
    "use_triton_kernel",
]
