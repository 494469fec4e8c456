"""Entropy-invariant attention for stock Transformers models, as an attention implementation.

After ``import hf_attn_variants``::

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="entropy_invariant")

applies Su's training-free log-n scaling to any model whose attention dispatches through
``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2, Mistral, BERT/RoBERTa, …): each query row's logits are
multiplied by log(max(nᵢ, min_length)) / log(base_length) on top of the model's own scaling, where nᵢ
is the number of keys the row may see (from the mask the model built: padding, causality, sliding
windows, packed sequences; past cache included). The factor is folded into q and the rest is
Transformers' own SDPA kernel, so GQA, dropout and the cache behave exactly as with ``"sdpa"``.

``base_length`` (the training length m at which the factor is 1) is read from ``config.base_length``
when set, else from the RoPE parameters' ``original_max_position_embeddings``, else from
``max_position_embeddings``; ``config.entropy_min_length`` overrides the clamp (default 16).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .layers import compute_dtype, entropy_invariant_factor, upcast, visible_key_counts

ENTROPY_INVARIANT = "entropy_invariant"
DEFAULT_MIN_LENGTH = 16
DEFAULT_BASE_LENGTH = 512


def resolve_base_length(config: PreTrainedConfig | None) -> int:
    """The training length m: ``base_length``, else RoPE's original context, else ``max_position_embeddings``."""
    if config is None:
        return DEFAULT_BASE_LENGTH
    if getattr(config, "base_length", None):
        return int(config.base_length)
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and rope.get("original_max_position_embeddings"):
        return int(rope["original_max_position_embeddings"])
    return int(getattr(config, "max_position_embeddings", None) or DEFAULT_BASE_LENGTH)


def entropy_invariant_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention with logits scaled per row by log max(nᵢ, min_length) / log base_length (Su 2021).

    ``query`` is ``(batch, heads, q, d)``; ``attention_mask`` is the boolean 4D mask from ``sdpa_mask``
    or ``None`` (no padding: nᵢ follows from causality and the cache offset, no mask is built).
    """
    config = getattr(module, "config", None)
    base_length = resolve_base_length(config)
    if base_length < 2:
        raise ValueError(f"base_length must be >= 2 for entropy-invariant attention, got {base_length}.")
    min_length = int(getattr(config, "entropy_min_length", None) or DEFAULT_MIN_LENGTH)
    batch_size, _, query_length, _ = query.shape
    key_length = key.shape[2]
    counts = visible_key_counts(
        attention_mask,
        batch_size=batch_size,
        query_length=query_length,
        key_length=key_length,
        query_offset=key_length - query_length,
        causal=bool(getattr(module, "is_causal", False)),
        device=query.device,
        dtype=compute_dtype(query.dtype),
    )
    factor = entropy_invariant_factor(counts, base_length, min_length)[:, None, :, None]
    query = (upcast(query) * factor).to(query.dtype)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_stock_attention() -> None:
    """Register ``"entropy_invariant"`` with Transformers' attention and attention-mask interfaces."""
    AttentionInterface.register(ENTROPY_INVARIANT, entropy_invariant_attention_forward)
    AttentionMaskInterface.register(ENTROPY_INVARIANT, sdpa_mask)


__all__ = [
    "ENTROPY_INVARIANT",
    "entropy_invariant_attention_forward",
    "register_stock_attention",
    "resolve_base_length",
]
