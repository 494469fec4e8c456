"""Entropy-invariant attention: multi-head softmax attention whose logit scale grows with log nᵢ.

Su Jianlin (2021–2022), "从熵不变性看Attention的Scale操作" (Looking at attention's scale through entropy
invariance): softmax(κ log n / d · QKᵀ) V keeps the attention entropy stable when the number of keys n
changes, so models extrapolate to lengths they were not trained on. Practical form used here:
logits = (log nᵢ / log m) · q·k / √d with m = ``base_length``; the Scalable-Softmax variant
(Nakanishi 2025, arXiv:2501.19399) learns the per-head factor instead. nᵢ counts the keys query i really sees.

The per-row factor is folded into q (a ``[B, 1, T, 1]`` broadcast, never an n×n tensor), so the
rest runs through Transformers' attention interface: eager, SDPA, FlexAttention (and any other registered
kernel).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers import GenerationMixin
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    packed_sequence_mask_function,
)
from transformers.utils.import_utils import is_torchdynamo_compiling

from .compat import ALL_ATTENTION_FUNCTIONS, LEGACY_CACHE_ARGUMENT
from .configuration_entropy_invariant import EntropyInvariantConfig
from .layers import (
    apply_rotary,
    compute_dtype,
    entropy_invariant_factor,
    headless_attention_output,
    log_key_counts,
    masked_softmax,
    upcast,
    update_cache,
)
from .modeling_common import (
    AttentionGeometry,
    AttentionMLPLayer,
    AttnVariantBackbone,
    AttnVariantPreTrainedModel,
    CausalLMHeadMixin,
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
    TokenClassificationHeadMixin,
)
from .tensor_parallel import ShardedUnits

_MASK_PARAMETERS = {
    True: frozenset(inspect.signature(create_causal_mask).parameters),
    False: frozenset(inspect.signature(create_bidirectional_mask).parameters),
}


def prepare_attention_mask(
    *,
    causal: bool,
    config: Any,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: Any,
    position_ids: torch.Tensor | None,
    past_length: int | torch.Tensor,
    document_ids: torch.Tensor | None = None,
) -> Any:
    """The mask ``config._attn_implementation`` expects, from Transformers' masking utilities.

    ``create_causal_mask`` when ``causal``, else ``create_bidirectional_mask``, called with the arguments the
    installed release declares (``input_embeds``/``inputs_embeds``; ``past_key_values``/``cache``; the cache
    positions past_length … past_length + seq − 1 where 5.0 requires them).

    Packed documents (``document_ids``, rows that pack several documents, no mask, no cache): the causal mask
    finds them itself from ``position_ids`` (Transformers' ``find_packed_sequence_indices``, 5.0 on); the
    bidirectional one reads no positions, so it gets Transformers' ``packed_sequence_mask_function`` of
    ``document_ids`` as its ``and_mask_function`` — block-diagonal in every kernel's format (a boolean or
    additive tensor, a flex BlockMask).

    Args:
        causal (bool): a causal or a bidirectional mask.
        config (Any): the model's config (its ``_attn_implementation``).
        inputs_embeds (torch.Tensor): ``[B, T, D]`` hidden states (shape, dtype and device).
        attention_mask (torch.Tensor | None): the caller's 2D ``[B, past + T]`` or 4D mask, or ``None``.
        cache (Any): the model's cache, or ``None``.
        position_ids (torch.Tensor | None): ``[B, T]`` positions (packed documents only), or ``None``.
        past_length (int | torch.Tensor): the cached tokens.
        document_ids (torch.Tensor | None): ``[B, T]`` int64 documents of packed rows, or ``None``.

    Returns:
        Any: the kernel's mask: ``[B, 1, T, T_k]`` bool or additive in the model dtype, a flex ``BlockMask``,
        or ``None`` where the kernel needs none.
    """
    parameters = _MASK_PARAMETERS[causal]
    values: dict[str, Any] = {
        "config": config,
        "attention_mask": attention_mask,
        "cache" if "cache" in parameters else LEGACY_CACHE_ARGUMENT: cache,
        "position_ids": position_ids,
        "inputs_embeds" if "inputs_embeds" in parameters else "input_embeds": inputs_embeds,
    }
    if "cache_position" in parameters:
        length = inputs_embeds.shape[1]
        values["cache_position"] = torch.arange(length, device=inputs_embeds.device) + past_length
    if document_ids is not None and not causal:
        if "and_mask_function" not in parameters:  # never silently: every release from 5.0 to 5.24 has it
            raise NotImplementedError("This Transformers release's create_bidirectional_mask takes no "
                                      "and_mask_function, so packed documents cannot be kept apart.")
        values["and_mask_function"] = packed_sequence_mask_function(document_ids)
    make_mask = create_causal_mask if causal else create_bidirectional_mask
    return make_mask(**{name: value for name, value in values.items() if name in parameters})


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax(q·kᵀ·scaling + mask) v, Transformers' eager attention.

    The signature is Transformers' attention interface, so this is the ``"eager"`` counterpart of
    ``ALL_ATTENTION_FUNCTIONS["sdpa"]``. Unlike a plain additive mask, a row whose keys are all
    hidden gives zeros (as SDPA does), so eager and SDPA agree on every row.

    Args:
        module (nn.Module): the attention module (its ``training`` flag).
        query (torch.Tensor): ``[B, H, T_q, D_h]``, the model dtype.
        key (torch.Tensor): ``[B, H, T_k, D_h]``, the model dtype.
        value (torch.Tensor): ``[B, H, T_k, D_h]``, the model dtype.
        attention_mask (torch.Tensor | None): ``[B, 1, T_q, T_k]`` bool (``True`` = visible) or additive
            float, or ``None``.
        scaling (float): the logit scale (1/√d).
        dropout (float): dropout probability on the weights (in training).
        **kwargs: the interface's other arguments, ignored.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: the output ``[B, T_q, H, D_h]`` and the probabilities
        ``[B, H, T_q, T_k]``, both in the value's dtype.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    probs = masked_softmax(scores, attention_mask).to(value.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return output, probs


FLEX_MIN_HEAD_SIZE = 16
"""The smallest head size torch's FlexAttention kernel takes on CUDA (its Triton template's ``tl.dot``)."""


def check_flex_head_size(head_dim: int) -> None:
    """One sentence instead of Inductor's deep ``NotImplementedError`` for heads FlexAttention cannot take.

    Args:
        head_dim (int): the model's head size.

    Raises:
        ValueError: ``head_dim`` is below ``FLEX_MIN_HEAD_SIZE``.
    """
    if head_dim < FLEX_MIN_HEAD_SIZE:
        raise ValueError(
            f"attn_implementation='flex_attention' on CUDA needs heads of at least {FLEX_MIN_HEAD_SIZE} "
            f"dimensions (torch's FlexAttention kernel), but this model's hidden_size / num_attention_heads "
            f"is {head_dim}: use attn_implementation='sdpa' or 'eager', or fewer, wider heads.")


class EntropyInvariantAttention(ShardedUnits, nn.Module):
    """Multi-head attention with logits s(nᵢ) · q·k/√d, s given by ``config.attention_scale``.

    s applies in the layers ``attention_scale_layers`` names; RoPE in the layers ``no_rope_layers`` marks 1.

    - ``standard``: s = 1.
    - ``entropy_invariant``: s = log max(nᵢ, entropy_min_length) / log base_length (with
      ``entropy_invariant_scope="beyond"``: max(1, s)).
    - ``ssmax``: s = sₕ · log max(nᵢ, entropy_min_length), sₕ learnable per head (``ssmax_scale``).

    The projections are named as in Llama (q/k/v/o_proj) so ``peft`` and the pruning tools find them.
    A layer whose heads were all pruned returns the output projection's bias (zeros without bias).
    Tensor parallelism (``config.base_model_tp_plan``) gives each rank whole heads and their ``ssmax_scale``.

    Args:
        config (EntropyInvariantConfig): the model's config.
        layer_idx (int): the layer's index (its kept heads, position scheme and cache layer).
    """

    def __init__(self, config: EntropyInvariantConfig, layer_idx: int) -> None:
        """Build the projections of the layer's kept heads and sₕ; see the class docstring."""
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = len(config.layer_heads(layer_idx))
        self.num_key_value_groups = 1
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob  # read once: see GatedAttentionUnit
        self.is_causal = config.is_decoder
        self.use_rope = config.layer_uses_rope(layer_idx)
        self.attention_scale = config.layer_attention_scale(layer_idx)
        # The factor's fields, read once as the dropout: dynamo < 2.11 does not guard a config's attributes.
        self.base_length = config.base_length
        self.entropy_min_length = config.entropy_min_length
        self.entropy_invariant_scope = config.entropy_invariant_scope
        inner = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.use_bias)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=config.use_bias)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=config.use_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.use_bias)
        self.ssmax_scale = (
            nn.Parameter(torch.full((self.num_heads,), self.ssmax_init(config)))
            if self.attention_scale == "ssmax"
            else None
        )
        self.tp_sharded_parameters = ("ssmax_scale",) if self.ssmax_scale is not None else ()

    def tp_units(self) -> tuple[int, str]:
        """Tensor parallelism splits the heads.

        Returns:
            tuple[int, str]: the layer's heads and their name.
        """
        return self.num_heads, "attention heads"

    @staticmethod
    def ssmax_init(config: EntropyInvariantConfig) -> float:
        """sₕ at initialisation: 1 / log base_length, so SSMax starts equal to ``entropy_invariant``.

        Args:
            config (EntropyInvariantConfig): the model's config.

        Returns:
            float: the initial sₕ.
        """
        return 1.0 / math.log(config.base_length)

    def logit_scale(self, key_counts: torch.Tensor | None) -> torch.Tensor | None:
        """Factor multiplying q, or ``None`` for ``standard``.

        Args:
            key_counts (torch.Tensor | None): ``[B, T_q]`` nᵢ (at least float32), or ``None``.

        Returns:
            torch.Tensor | None: ``[B, 1, T_q, 1]`` (``entropy_invariant``) or ``[B, H, T_q, 1]``
            (``ssmax``), nᵢ's dtype; ``None`` for ``standard`` or without counts.
        """
        scale = self.attention_scale
        if scale == "standard" or key_counts is None:
            return None
        if scale == "entropy_invariant":
            factor = entropy_invariant_factor(
                key_counts, self.base_length, self.entropy_min_length, self.entropy_invariant_scope)
            return factor[:, None, :, None]
        log_n = log_key_counts(key_counts, self.entropy_min_length)
        return self.ssmax_scale.to(log_n.dtype)[None, :, None, None] * log_n[:, None, :, None]  # type: ignore[union-attr]

    def forward(self, hidden_states: torch.Tensor, geometry: AttentionGeometry,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None, key_counts: torch.Tensor | None = None,
                cache: Cache | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Project, rotate, cache, fold the factor into q, then the configured attention kernel.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            geometry (AttentionGeometry): the call's geometry (query offset, causal mask for eager).
            position_embeddings (tuple | None): RoPE's ``(cos, sin)``, each ``[B, T, D_h]``, or ``None``.
            attention_mask (Any): the mask of ``config._attn_implementation`` (``prepare_attention_mask``):
                ``[B, 1, T, T_k]`` bool or additive, a flex ``BlockMask``, or ``None``.
            key_counts (torch.Tensor | None): ``[B, T]`` nᵢ (at least float32), or ``None`` for ``standard``.
            cache (Cache | None): the model's cache (new keys and values are added to it).
            **kwargs: passed to the attention kernel (e.g. ``position_ids`` for padding-free kernels).

        Returns:
            tuple[torch.Tensor, torch.Tensor | None]: the output ``[B, T, D]`` in the model dtype and the
            weights ``[B, H, T, T_k]`` (eager; ``None`` from kernels that return none).
        """
        batch_size, seq_length = hidden_states.shape[:2]
        query_offset = geometry.query_offset
        if self.num_heads == 0:
            return headless_attention_output(hidden_states, self.o_proj, cache, self.layer_idx, query_offset)
        shape = (batch_size, seq_length, -1, self.head_dim)  # -1: this rank's heads under tensor parallelism
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if self.use_rope and position_embeddings is not None:
            cos, sin = position_embeddings
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        if cache is not None:
            key, value = update_cache(cache, key, value, self.layer_idx, query_offset)

        factor = self.logit_scale(key_counts)
        if factor is not None:
            query = (upcast(query) * factor).to(query.dtype)

        if self.config._attn_implementation == "flex_attention" and query.is_cuda:
            check_flex_head_size(self.head_dim)
        attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                             eager_attention_forward)
        if attention_fn is eager_attention_forward and attention_mask is None:
            attention_mask = geometry.causal_mask(key.shape[2])
        output, weights = attention_fn(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = self.o_proj(output.reshape(batch_size, seq_length, -1).contiguous())
        return output, weights


class EntropyInvariantLayer(AttentionMLPLayer):
    """Entropy-invariant attention + feed-forward block with pre- or post-norm residuals."""

    attention_class = EntropyInvariantAttention


class EntropyInvariantPreTrainedModel(AttnVariantPreTrainedModel):
    """Base class of the entropy-invariant family (init, SDPA support, output recording)."""

    config_class = EntropyInvariantConfig
    config: EntropyInvariantConfig
    layer_class = EntropyInvariantLayer
    _supports_sdpa = True
    _supports_flex_attn = True  # the factor is folded into q; masks come from Transformers' mask utilities
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # static-cache decoding compiles to one graph

    def _init_family_weights(self, module: nn.Module) -> None:
        """Set SSMax's sₕ to its initial value."""
        if isinstance(module, EntropyInvariantAttention) and module.ssmax_scale is not None:
            init.constant_(module.ssmax_scale, EntropyInvariantAttention.ssmax_init(self.config))


class EntropyInvariantModel(AttnVariantBackbone, EntropyInvariantPreTrainedModel):
    """The bare entropy-invariant encoder (bidirectional) or decoder (``config.is_decoder``)."""

    def __init__(self, config: EntropyInvariantConfig) -> None:
        """Build the stack, and read once whether the layers take nᵢ.

        Read here, not in forward: dynamo below torch 2.11 installs no guard on a config's attributes, so a
        model compiled after another would keep the first one's value.
        """
        super().__init__(config)
        self.needs_key_counts = config.attention_scale != "standard"

    def _attention_inputs(
        self, geometry: AttentionGeometry, hidden_states: torch.Tensor, cache: Cache | None
    ) -> dict[str, Any]:
        """The mask of ``config._attn_implementation`` and nᵢ, for every layer.

        The mask comes from ``prepare_attention_mask`` (block-diagonal for packed documents); nᵢ is counted
        per document for packed rows. Transformers reads positions (on the host) to find packed documents, so
        rows of one document pass none.
        """
        key_counts = None
        if self.needs_key_counts:
            key_counts = geometry.key_counts(compute_dtype(hidden_states.dtype))
        positions, documents = geometry.positions(), geometry.document_ids
        mask = prepare_attention_mask(
            causal=self.is_causal, config=self.config, inputs_embeds=hidden_states, cache=cache,
            attention_mask=geometry.attention_mask, past_length=geometry.query_offset,
            position_ids=None if documents is None else positions, document_ids=documents,
        )
        inputs = {"attention_mask": mask, "key_counts": key_counts}
        if geometry.document_ids is not None and mask is None:
            inputs["position_ids"] = self._padding_free_positions(positions)
        return inputs

    def _padding_free_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """``position_ids`` for a maskless kernel (flash attention; a serving engine's own) on packed rows.

        Such kernels find the documents from the positions themselves — Transformers' padding-free format
        (``modeling_flash_attention_utils._is_packed_sequence``: varlen attention over the runs of increasing
        positions) — and only in a batch of one row; with more rows they would attend across documents, so
        that is refused, naming the setting. While compiling the rows may not be packed at all, and nothing is
        refused.
        """
        if position_ids.shape[0] > 1 and not is_torchdynamo_compiling():
            raise ValueError(
                f"attn_implementation={self.config._attn_implementation!r} takes no attention mask, so it "
                "keeps packed documents apart only in a batch of one row (Transformers' padding-free "
                f"format), got {position_ids.shape[0]} rows. Flatten the rows into one (input_ids and "
                "position_ids of shape (1, batch · n)), "
                "or use attn_implementation='sdpa', 'eager' or 'flex_attention'."
            )
        return position_ids


class EntropyInvariantForMaskedLM(MaskedLMHeadMixin, EntropyInvariantPreTrainedModel):
    """``EntropyInvariantModel`` with a masked language-modelling head (``MaskedLMHeadMixin``)."""

    base_model_class = EntropyInvariantModel


class EntropyInvariantForCausalLM(CausalLMHeadMixin, EntropyInvariantPreTrainedModel, GenerationMixin):
    """``EntropyInvariantModel`` with a causal language-modelling head, a cache and ``generate``.

    The head is ``CausalLMHeadMixin``.
    """

    base_model_class = EntropyInvariantModel


class EntropyInvariantForSequenceClassification(
    SequenceClassificationHeadMixin, EntropyInvariantPreTrainedModel
):
    """``EntropyInvariantModel`` with a sequence classification or regression head.

    The head is ``SequenceClassificationHeadMixin``.
    """

    base_model_class = EntropyInvariantModel


class EntropyInvariantForTokenClassification(TokenClassificationHeadMixin, EntropyInvariantPreTrainedModel):
    """``EntropyInvariantModel`` with a token classification head (``TokenClassificationHeadMixin``)."""

    base_model_class = EntropyInvariantModel


class EntropyInvariantForQuestionAnswering(QuestionAnsweringHeadMixin, EntropyInvariantPreTrainedModel):
    """``EntropyInvariantModel`` with an extractive question-answering head.

    The head is ``QuestionAnsweringHeadMixin``.
    """

    base_model_class = EntropyInvariantModel


__all__ = [
    "EntropyInvariantAttention",
    "EntropyInvariantForCausalLM",
    "EntropyInvariantForMaskedLM",
    "EntropyInvariantForQuestionAnswering",
    "EntropyInvariantForSequenceClassification",
    "EntropyInvariantForTokenClassification",
    "EntropyInvariantLayer",
    "EntropyInvariantModel",
    "EntropyInvariantPreTrainedModel",
]
