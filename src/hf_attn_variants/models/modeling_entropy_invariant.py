"""Entropy-invariant attention: multi-head softmax attention whose logit scale grows with log nᵢ.

Su Jianlin (2021–2022), "从熵不变性看Attention的Scale操作" (Looking at attention's scale through entropy
invariance): softmax(κ log n / d · QKᵀ) V keeps the attention entropy stable when the number of keys n
changes, so models extrapolate to lengths they were not trained on. Practical form used here:
logits = (log nᵢ / log m) · q·k / √d with m = ``base_length``; the Scalable-Softmax variant
(Nakanishi 2025) learns the per-head factor instead. nᵢ counts the keys query i really sees.

The per-row factor is folded into q (a ``(batch, 1, q, 1)`` broadcast, never an n×n tensor), so the
rest runs through Transformers' attention interface: eager, SDPA, FlexAttention (and any other registered
kernel).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.utils.import_utils import is_torchdynamo_compiling

from .compat import ALL_ATTENTION_FUNCTIONS, prepare_attention_mask
from .configuration_entropy_invariant import EntropyInvariantConfig
from .layers import (
    apply_rotary,
    boolean_attention_mask,
    check_head_indices,
    compute_dtype,
    eager_attention_forward,
    entropy_invariant_factor,
    head_rows,
    headless_attention_output,
    log_key_counts,
    slice_head_tensor,
    slice_linear,
    upcast,
    update_cache,
    visible_key_counts,
)
from .modeling_common import (
    AttentionMLPLayer,
    AttnVariantBackbone,
    AttnVariantPreTrainedModel,
    CausalLMHeadMixin,
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
    TokenClassificationHeadMixin,
)
from .tensor_parallel import ShardedUnits, register_parallel_styles

register_parallel_styles()


class EntropyInvariantAttention(ShardedUnits, nn.Module):
    """Multi-head attention with logits s(nᵢ) · q·k/√d, s given by ``config.attention_scale`` .

    - ``standard``: s = 1.
    - ``entropy_invariant``: s = log max(nᵢ, entropy_min_length) / log base_length (with
      ``entropy_invariant_scope="beyond"``: max(1, s)).
    - ``ssmax``: s = sₕ · log max(nᵢ, entropy_min_length), sₕ learnable per head (``ssmax_scale``).

    The projections are named as in Llama (q/k/v/o_proj) so ``peft`` and the pruning tools find them.
    A layer whose heads were all pruned returns the output projection's bias (zeros without bias).
    Tensor parallelism (``config.base_model_tp_plan``) gives each rank whole heads and their ``ssmax_scale``.
    """

    def __init__(self, config: EntropyInvariantConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = len(config.layer_heads(layer_idx))
        self.num_key_value_groups = 1
        self.scaling = self.head_dim**-0.5
        self.is_causal = config.is_decoder
        inner = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.use_bias)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=config.use_bias)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=config.use_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.use_bias)
        self.ssmax_scale = (
            nn.Parameter(torch.full((self.num_heads,), self.ssmax_init(config)))
            if config.attention_scale == "ssmax"
            else None
        )
        self.tp_sharded_parameters = ("ssmax_scale",) if self.ssmax_scale is not None else ()

    def tp_units(self) -> tuple[int, str]:
        return self.num_heads, "attention heads"

    @staticmethod
    def ssmax_init(config: EntropyInvariantConfig) -> float:
        """sₕ at initialisation: 1 / log base_length, so SSMax starts equal to ``entropy_invariant``."""
        return 1.0 / math.log(config.base_length)

    def logit_scale(self, key_counts: torch.Tensor | None) -> torch.Tensor | None:
        """The factor multiplying q, broadcastable to ``(batch, heads, q, 1)``, or ``None`` for ``standard``."""
        scale = self.config.attention_scale
        if scale == "standard" or key_counts is None:
            return None
        if scale == "entropy_invariant":
            factor = entropy_invariant_factor(
                key_counts, self.config.base_length, self.config.entropy_min_length, self.config.entropy_invariant_scope
            )
            return factor[:, None, :, None]
        log_n = log_key_counts(key_counts, self.config.entropy_min_length)
        return self.ssmax_scale.to(log_n.dtype)[None, :, None, None] * log_n[:, None, :, None]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        key_counts: torch.Tensor | None = None,
        cache: Cache | None = None,
        query_offset: int = 0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_length = hidden_states.shape[:2]
        if self.num_heads == 0:
            return headless_attention_output(
                hidden_states, self.o_proj, cache, self.layer_idx, query_offset
            )
        shape = (batch_size, seq_length, -1, self.head_dim)  # -1: this rank's heads under tensor parallelism
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if position_embeddings is not None:
            cos, sin = position_embeddings
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        if cache is not None:
            key, value = update_cache(cache, key, value, self.layer_idx, query_offset)

        factor = self.logit_scale(key_counts)
        if factor is not None:
            query = (upcast(query) * factor).to(query.dtype)

        attention_fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        if attention_fn is eager_attention_forward and attention_mask is None and self.is_causal:
            attention_mask = boolean_attention_mask(
                None,
                batch_size=batch_size,
                query_length=seq_length,
                key_length=key.shape[2],
                query_offset=query_offset,
                causal=True,
                device=query.device,
            )
        output, weights = attention_fn(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.config.attention_probs_dropout_prob if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = self.o_proj(output.reshape(batch_size, seq_length, -1).contiguous())
        return output, weights

    @torch.no_grad()
    def prune_heads_(self, keep: list[int]) -> None:
        """Keep only heads ``keep`` (indices into the *current* heads), in place.

        Slices the rows of q/k/v_proj and the columns of o_proj (head-major blocks of ``head_dim``) and
        the per-head ``ssmax_scale``, then updates ``num_heads``. Keeping no head is allowed: the layer
        then outputs o_proj's bias. The caller records the change in ``config.pruned_heads``
        (``hf_attn_variants.pruning.prune_heads`` does both), which ``from_pretrained`` reads back.
        """
        keep = check_head_indices(keep, self.num_heads, what="prune_heads_(keep)")
        device = self.q_proj.weight.device
        rows = head_rows(keep, self.head_dim, device)
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            slice_linear(projection, rows, dim=0)
        slice_linear(self.o_proj, rows, dim=1)
        slice_head_tensor(self, "ssmax_scale", torch.tensor(keep, dtype=torch.long, device=device))
        self.num_heads = len(keep)


class EntropyInvariantLayer(AttentionMLPLayer):
    """Entropy-invariant attention + feed-forward block with pre- or post-norm residuals."""

    attention_class = EntropyInvariantAttention


class EntropyInvariantPreTrainedModel(AttnVariantPreTrainedModel):
    """Base class of the entropy-invariant family (init, SDPA support, output recording)."""

    config_class = EntropyInvariantConfig
    config: EntropyInvariantConfig
    family_prefix = "EntropyInvariant"
    _no_split_modules = ["EntropyInvariantLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True  # the factor is folded into q; masks come from Transformers' mask utilities
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # static-cache decoding compiles as one graph (tests/test_generation_caches.py)
    _can_record_outputs = {"hidden_states": EntropyInvariantLayer, "attentions": EntropyInvariantAttention}

    def _init_family_weights(self, module: nn.Module) -> None:
        if isinstance(module, EntropyInvariantAttention) and module.ssmax_scale is not None:
            init.constant_(module.ssmax_scale, EntropyInvariantAttention.ssmax_init(self.config))


class EntropyInvariantModel(AttnVariantBackbone, EntropyInvariantPreTrainedModel):
    """The bare entropy-invariant encoder (bidirectional) or decoder (``config.is_decoder``)."""

    layer_class = EntropyInvariantLayer

    def _attention_inputs(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Cache | None,
        position_ids: torch.Tensor,
        past_length: int,
        given_position_ids: torch.Tensor | None,
        document_ids: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The mask of ``config._attn_implementation`` (``prepare_attention_mask``; block-diagonal for packed
        documents) and nᵢ (``visible_key_counts``: per document for packed rows), once for every layer."""
        batch_size, seq_length = hidden_states.shape[:2]
        key_counts = None
        if self.config.attention_scale != "standard":
            key_counts = visible_key_counts(
                attention_mask,
                batch_size=batch_size,
                query_length=seq_length,
                key_length=past_length + seq_length,
                query_offset=past_length,
                causal=self.is_causal,
                device=hidden_states.device,
                dtype=compute_dtype(hidden_states.dtype),
                position_ids=given_position_ids,
                document_ids=document_ids,
            )
        mask = prepare_attention_mask(
            causal=self.is_causal,
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
            past_length=past_length,
            document_ids=document_ids,
        )
        inputs = {"attention_mask": mask, "key_counts": key_counts}
        if document_ids is not None and mask is None:
            inputs["position_ids"] = self._padding_free_positions(position_ids)
        return inputs

    def _padding_free_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """``position_ids`` for a kernel that takes no mask (flash attention; a serving engine's own) on packed rows.

        Such kernels find the documents from the positions themselves — Transformers' padding-free format
        (``modeling_flash_attention_utils._is_packed_sequence``: varlen attention over the runs of increasing
        positions) — and only in a batch of one row; with more rows they would attend across documents, so that
        is refused, naming the setting. While compiling the rows may not be packed at all, and nothing is refused.
        """
        if position_ids.shape[0] > 1 and not is_torchdynamo_compiling():
            raise ValueError(
                f"attn_implementation={self.config._attn_implementation!r} takes no attention mask, so it keeps packed "
                f"documents apart only in a batch of one row (Transformers' padding-free format), got "
                f"{position_ids.shape[0]} rows. Flatten the rows into one (input_ids and position_ids of shape "
                "(1, batch · n)), or use attn_implementation='sdpa', 'eager' or 'flex_attention'."
            )
        return position_ids


class EntropyInvariantForMaskedLM(MaskedLMHeadMixin, EntropyInvariantPreTrainedModel):
    """Entropy-invariant encoder with a masked-language-modelling head."""

    base_model_class = EntropyInvariantModel


class EntropyInvariantForCausalLM(CausalLMHeadMixin, EntropyInvariantPreTrainedModel, GenerationMixin):
    """Entropy-invariant decoder with a causal LM head; supports ``generate`` and a ``DynamicCache``."""

    base_model_class = EntropyInvariantModel


class EntropyInvariantForSequenceClassification(SequenceClassificationHeadMixin, EntropyInvariantPreTrainedModel):
    """Entropy-invariant encoder with a first-token classification / regression head."""

    base_model_class = EntropyInvariantModel


class EntropyInvariantForTokenClassification(TokenClassificationHeadMixin, EntropyInvariantPreTrainedModel):
    """Entropy-invariant encoder with a per-token classification head."""

    base_model_class = EntropyInvariantModel


class EntropyInvariantForQuestionAnswering(QuestionAnsweringHeadMixin, EntropyInvariantPreTrainedModel):
    """Entropy-invariant encoder with an extractive question-answering (span) head."""

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
