"""Configuration of the Synthesizer family (``model_type = "synthesizer"``)."""

from __future__ import annotations

import math
from typing import Any

from transformers.utils import logging

from .configuration_common import MultiHeadAttnVariantConfig, check_bool, check_float, check_int

logger = logging.get_logger(__name__)

LARGE_PATTERNS = 2**30
"""Parameters of the l×l ``random`` patterns (H·l² a layer) past which the config warns: 4 GiB in float32."""

SYNTHESIZER_COMPONENTS = ("dense", "random", "factorized_dense", "factorized_random", "vanilla")
"""The attention-weight synthesizers of Tay et al. (2021) plus ordinary dot-product attention."""


def balanced_factorization(length: int) -> list[int]:
    """The most balanced ``[a, b]`` with a·b = ``length`` and a ≤ b (a = largest divisor ≤ √length).

    512 → [16, 32], 64 → [8, 8], 12 → [3, 4]; a prime length gives [1, length].

    Args:
        length (int): l, the number to factorise (positive).

    Returns:
        list[int]: ``[a, b]``.
    """
    a = max(d for d in range(1, math.isqrt(length) + 1) if length % d == 0)
    return [a, length // a]


class SynthesizerConfig(MultiHeadAttnVariantConfig):
    r"""Synthesizer attention: attention weights synthesized without (or besides) q·kᵀ.

    Tay, Bahri, Metzler, Juan, Zhao & Zheng (2021), "Synthesizer: Rethinking Self-Attention in
    Transformer Models" (ICML, arXiv:2005.00743). Per head, with l = ``max_position_embeddings``:

    - ``"dense"``: Bᵢ = relu(Xᵢ W₁ + b₁) W₂ + b₂ ∈ ℝˡ, one row of scores per query from the query alone.
    - ``"random"``: a learned (``random_trainable=True``) or frozen (``False``, the paper's Fixed Random)
      l×l matrix R, independent of the input.
    - ``"factorized_dense"``: two dense branches of widths a, b (a·b = l) combined as vec(A ⊗ B).
    - ``"factorized_random"``: R = R₁ R₂ᵀ with R₁, R₂ ∈ ℝ^{l×k}.
    - ``"vanilla"``: q·kᵀ / √d.

    Several components are mixed as softmax(Σᵢ αᵢ Sᵢ(X)) G(X) with α = softmax(per-layer logits).

    Args:
        synthesizer_components (list[str] | None): non-empty list of distinct names from
            ``SYNTHESIZER_COMPONENTS`` (default ``["random", "vanilla"]``, the paper's best mixture on WMT'14
            and GLUE/SuperGLUE).
        random_trainable (bool): whether ``random`` and ``factorized_random`` are learned (default) or frozen
            at their random initialisation (Fixed Random; stored as a persistent buffer, so it is saved,
            reloaded exactly and never touched by an optimizer).
        random_init_std (float | None): std of the random matrix R at initialisation (``None`` =
            ``initializer_range``). The factors of ``factorized_random`` are drawn so that R₁R₂ᵀ has this std
            as well. With the default 0.02 a *frozen* R is close to uniform averaging; use e.g. 1.0 for a
            peaked fixed pattern.
        factorized_dense_shape (list[int] | None): ``[a, b]`` with a·b = ``max_position_embeddings``
            (``None`` = the most balanced factorisation, e.g. [16, 32] for 512).
        factorized_random_rank (int): k of ``factorized_random`` (default 8: for l = 512 that is 2·l·k = 8192
            parameters per head instead of l² = 262144, 32× fewer; the paper's Long Range Arena runs,
            with sequences of 1K–4K, used k = 32).
        dense_hidden_size (int | None): width e of the hidden layer W₁ of each ``dense`` /
            ``factorized_dense`` branch, per head (``None`` = ``head_dim``, so that the heads together have
            the paper's d×d first layer).
        **kwargs: the fields of ``MultiHeadAttnVariantConfig`` and ``AttnVariantConfig``.

    Example:
        ```python
        >>> from hf_attn_variants import SynthesizerConfig, SynthesizerForMaskedLM
        >>> config = SynthesizerConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ...                            intermediate_size=128, vocab_size=1000, max_position_embeddings=128,
        ...                            synthesizer_components=["random", "vanilla"])
        >>> model = SynthesizerForMaskedLM(config)
        >>> model.mixing_weights().shape          # (layers, components), rows sum to 1
        torch.Size([2, 2])
        ```
    """

    model_type = "synthesizer"

    def __init__(
        self,
        synthesizer_components: list[str] | None = None,
        random_trainable: bool = True,
        random_init_std: float | None = None,
        factorized_dense_shape: list[int] | None = None,
        factorized_random_rank: int = 8,
        dense_hidden_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Set the fields and check the components; the arguments are described in the class docstring."""
        if synthesizer_components is None:
            synthesizer_components = ["random", "vanilla"]
        self.synthesizer_components = self._validated_components(synthesizer_components)
        self.random_trainable = random_trainable
        self.random_init_std = random_init_std
        self.factorized_dense_shape = factorized_dense_shape
        self.factorized_random_rank = factorized_random_rank
        self.dense_hidden_size = dense_hidden_size
        super().__init__(**kwargs)

    def check_fields(self) -> None:
        """Check the shared fields, then the random and dense components' fields."""
        super().check_fields()
        check_bool("random_trainable", self.random_trainable)
        check_float("random_init_std", self.random_init_std, 0.0, allow_none=True)
        check_int("factorized_random_rank", self.factorized_random_rank, 1)
        check_int("dense_hidden_size", self.dense_hidden_size, 1, allow_none=True)
        if self.factorized_dense_shape is not None:
            shape = self.factorized_dense_shape
            if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) != 2:
                raise ValueError(f"factorized_dense_shape must be a pair [a, b] or None, got {shape!r}.")
            for value in shape:
                check_int("factorized_dense_shape", value, 1)
            if shape[0] * shape[1] != self.max_position_embeddings:
                raise ValueError(
                    f"factorized_dense_shape {list(shape)} must multiply to max_position_embeddings="
                    f"{self.max_position_embeddings} (a·b = l), got {shape[0] * shape[1]}."
                )
            self.factorized_dense_shape = [int(shape[0]), int(shape[1])]
        patterns = self.num_hidden_layers * self.num_attention_heads * self.max_position_embeddings**2
        if "random" in self.synthesizer_components and patterns > LARGE_PATTERNS:
            logger.warning_once(
                f"max_position_embeddings={self.max_position_embeddings}: the random component stores H·l² = "
                f"{patterns / self.num_hidden_layers:,.0f} parameters a layer ({patterns:,} in all); "
                "factorized_random (H·2·l·k) keeps the Synthesizer at long l."
            )

    @staticmethod
    def _validated_components(components: Any) -> list[str]:
        if isinstance(components, str) or not isinstance(components, (list, tuple)):
            raise TypeError(
                f"synthesizer_components must be a non-empty list of names from {SYNTHESIZER_COMPONENTS}, "
                f"got {components!r}."
            )
        if not components:
            raise ValueError(
                f"synthesizer_components must not be empty; choose from {SYNTHESIZER_COMPONENTS}."
            )
        unknown = [c for c in components if c not in SYNTHESIZER_COMPONENTS]
        if unknown:
            raise ValueError(
                f"synthesizer_components has unknown entries {unknown}; allowed: {SYNTHESIZER_COMPONENTS}."
            )
        if len(set(components)) != len(components):
            raise ValueError(f"synthesizer_components lists a component twice: {list(components)}.")
        return list(components)

    @property
    def resolved_factorized_dense_shape(self) -> list[int]:
        """``factorized_dense_shape``, or the most balanced [a, b] with a·b = ``max_position_embeddings``."""
        return list(self.factorized_dense_shape or balanced_factorization(self.max_position_embeddings))

    @property
    def resolved_dense_hidden_size(self) -> int:
        """``dense_hidden_size``, or ``head_dim`` when unset."""
        return self.dense_hidden_size or self.head_dim

    @property
    def resolved_random_init_std(self) -> float:
        """``random_init_std``, or ``initializer_range`` when unset."""
        return float(self.initializer_range if self.random_init_std is None else self.random_init_std)


__all__ = ["SYNTHESIZER_COMPONENTS", "SynthesizerConfig", "balanced_factorization"]
