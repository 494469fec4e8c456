"""Configuration of the entropy-invariant attention family (``model_type = "entropy_invariant"``)."""

from __future__ import annotations

from typing import Any

from .configuration_common import MultiHeadAttnVariantConfig, check_choice, check_int

ATTENTION_SCALES = ("standard", "entropy_invariant", "ssmax")


class EntropyInvariantConfig(MultiHeadAttnVariantConfig):
    r"""Multi-head softmax attention whose logit scale grows with log nᵢ (DESIGN §2.1).

    nᵢ is the number of keys query i may attend to in its own row (padding and causality, past
    cache included), clamped below at ``min_length``.

    Args:
        attention_scale: how logits are scaled.
            - ``"standard"``: q·k / √d.
            - ``"entropy_invariant"``: (log nᵢ / log ``base_length``) · q·k / √d — Su (2021),
              "从熵不变性看Attention的Scale操作", with κ chosen so that it equals ``"standard"`` at
              nᵢ = ``base_length``.
            - ``"ssmax"``: sₕ · log nᵢ · q·k / √d with one learnable sₕ per layer and head, initialised
              to 1 / log ``base_length`` — Scalable-Softmax (Nakanishi 2025, arXiv:2501.19399).
        base_length: the training length m at which the factor is 1 (default 512).
        min_length: lower clamp of nᵢ (default 16, as bert4keras).

    Example:
        ```python
        >>> from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForMaskedLM
        >>> config = EntropyInvariantConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ...                                 intermediate_size=128, vocab_size=1000)
        >>> model = EntropyInvariantForMaskedLM(config)
        ```
    """

    model_type = "entropy_invariant"

    attention_scale: str = "entropy_invariant"
    base_length: int = 512
    min_length: int = 16

    def __post_init__(self, **kwargs: Any) -> None:
        check_choice("attention_scale", self.attention_scale, ATTENTION_SCALES)
        check_int("base_length", self.base_length, 2)
        check_int("min_length", self.min_length, 1)
        super().__post_init__(**kwargs)


__all__ = ["EntropyInvariantConfig"]
