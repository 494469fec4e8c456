"""Configuration of the entropy-invariant attention family (``model_type = "entropy_invariant"``)."""

from __future__ import annotations

from typing import Any, ClassVar

from .configuration_common import MultiHeadAttnVariantConfig, check_choice, check_int, renamed_field
from .layers import ENTROPY_INVARIANT_SCOPES

ATTENTION_SCALES = ("standard", "entropy_invariant", "ssmax")
ATTENTION_SCALE_LAYERS = ("all", "no_rope")


class EntropyInvariantConfig(MultiHeadAttnVariantConfig):
    r"""Multi-head softmax attention whose logit scale grows with log nᵢ.

    nᵢ is the number of keys query i may attend to in its own row (padding and causality, past
    cache included), clamped below at ``entropy_min_length``.

    nᵢ follows the attention mask; without one, the ``position_ids`` the caller passes (nᵢ = position + 1 for
    causal rows: packed sequences, serving engines).

    Args:
        attention_scale (str): how logits are scaled.
            - ``"standard"``: q·k / √d.
            - ``"entropy_invariant"``: (log nᵢ / log ``base_length``) · q·k / √d — Su (2021),
              "从熵不变性看Attention的Scale操作", with κ chosen so that it equals ``"standard"`` at
              nᵢ = ``base_length``.
            - ``"ssmax"``: sₕ · log nᵢ · q·k / √d with one learnable sₕ per layer and head, initialised
              to 1 / log ``base_length`` — Scalable-Softmax (Nakanishi 2025, arXiv:2501.19399).
        base_length (int): the training length m at which the factor is 1 (default 512).
        entropy_min_length (int | None): lower clamp of nᵢ (default 16, as bert4keras). Configs saved under
            its former name ``min_length`` (which collided with the generation parameter) load unchanged.
        entropy_invariant_scope (str): where the ``entropy_invariant`` factor applies: ``"all"`` (default:
            every row; this family is trained with it) or ``"beyond"`` = max(1, log nᵢ / log ``base_length``):
            rows that see at most ``base_length`` keys are standard attention (Qwen's ``use_logn_attn``).
        no_rope_layers (list[int] | None): RoPE per layer, one entry per layer: 1 = RoPE, 0 = no position
            embedding (NoPE), as SmolLM3 and Llama 4 name it (``position_embedding_type="rope"`` only).
            ``None``: every layer follows ``position_embedding_type``.
        attention_scale_layers (str): ``"all"`` (default): ``attention_scale`` in every layer; ``"no_rope"``:
            only in the layers without RoPE, as Llama 4 applies its attention temperature (the others use
            q·k/√d).
        **kwargs: the fields of ``MultiHeadAttnVariantConfig`` and ``AttnVariantConfig``.

    Example:
        ```python
        >>> from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForMaskedLM
        >>> config = EntropyInvariantConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ...                                 intermediate_size=128, vocab_size=1000)
        >>> model = EntropyInvariantForMaskedLM(config)
        ```
    """

    model_type = "entropy_invariant"
    not_applicable: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        attention_scale: str = "entropy_invariant",
        base_length: int = 512,
        entropy_min_length: int | None = None,
        entropy_invariant_scope: str = "all",
        no_rope_layers: list[int] | None = None,
        attention_scale_layers: str = "all",
        **kwargs: Any,
    ) -> None:
        """Set the fields; the arguments are described in the class docstring."""
        self.attention_scale = attention_scale
        self.no_rope_layers = list(no_rope_layers) if isinstance(no_rope_layers, tuple) else no_rope_layers
        self.attention_scale_layers = attention_scale_layers
        self.entropy_invariant_scope = entropy_invariant_scope
        self.base_length = base_length
        self.entropy_min_length = renamed_field(kwargs, "min_length", "entropy_min_length",
                                                entropy_min_length, 16)
        super().__init__(**kwargs)

    def check_fields(self) -> None:
        """Check the shared fields, then the attention scale and the per-layer position schemes."""
        super().check_fields()
        check_choice("attention_scale", self.attention_scale, ATTENTION_SCALES)
        check_int("base_length", self.base_length, 2)
        check_int("entropy_min_length", self.entropy_min_length, 1)
        check_choice("entropy_invariant_scope", self.entropy_invariant_scope, ENTROPY_INVARIANT_SCOPES)
        check_choice("attention_scale_layers", self.attention_scale_layers, ATTENTION_SCALE_LAYERS)
        layers = self.no_rope_layers
        if layers is not None:
            if self.position_embedding_type != "rope":
                raise ValueError("no_rope_layers chooses RoPE per layer and needs position_embedding_type="
                                 f"'rope', got {self.position_embedding_type!r}.")
            if (not isinstance(layers, list) or len(layers) != self.num_hidden_layers
                    or any(isinstance(flag, bool) or flag not in (0, 1) for flag in layers)):
                raise ValueError("no_rope_layers must be a list of num_hidden_layers="
                                 f"{self.num_hidden_layers} entries, each 1 (RoPE) or 0 (no position "
                                 f"embedding), got {layers!r}.")
        if (self.attention_scale_layers == "no_rope" and self.position_embedding_type == "rope"
                and layers is None):
            raise ValueError("attention_scale_layers='no_rope' scales only the layers without RoPE, and "
                             "every layer has RoPE: set no_rope_layers (1 = RoPE, 0 = none per layer).")

    def layer_uses_rope(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` rotates q and k (``position_embedding_type``, ``no_rope_layers``).

        Args:
            layer_idx (int): the layer.

        Returns:
            bool: whether the layer applies RoPE.
        """
        if self.position_embedding_type != "rope":
            return False
        return self.no_rope_layers is None or bool(self.no_rope_layers[layer_idx])

    def layer_attention_scale(self, layer_idx: int) -> str:
        """The ``attention_scale`` layer ``layer_idx`` applies.

        It is ``"standard"`` on a RoPE layer when ``attention_scale_layers="no_rope"``.

        Args:
            layer_idx (int): the layer.

        Returns:
            str: one of ``ATTENTION_SCALES``.
        """
        if self.attention_scale_layers == "no_rope" and self.layer_uses_rope(layer_idx):
            return "standard"
        return self.attention_scale


__all__ = ["EntropyInvariantConfig"]
