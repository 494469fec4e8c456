"""Configuration of the Gated Attention Unit family (``model_type = "gau"``)."""

from __future__ import annotations

from typing import Any, ClassVar

from .configuration_common import AttnVariantConfig, check_choice, check_float, check_int, renamed_field

ATTENTION_NORMALIZATIONS = ("softmax", "softmax_plus", "relu2", "relu2_normalized", "laplace")
RELU2_LENGTHS = ("dynamic", "fixed")
GAU_KERNELS = ("auto", "torch", "triton", "reference")
"""Attention kernels of GAU.

``auto`` = Triton on CUDA when triton is installed, else torch; ``reference`` = the written-out formula with
the attention map materialised (``modeling_gau.gau_reference_attention``).
"""
GAU_INITS = ("gau_alpha", "flash")
"""How a GAU unit is initialised: GAU-α's code (the default) or the FLASH pseudocode (see ``gau_init``)."""
#: Normalisations the FLASH mixed-chunk path (``chunk_size`` set) implements: relu² inside chunks,
#: as in the paper. Softmax has no additive form that a linear cross-chunk term could join, and
#: ``relu2_normalized`` would divide by a row sum that the linear term (which can be negative)
#: makes ill-defined.
CHUNKED_NORMALIZATIONS = ("relu2",)


class GAUConfig(AttnVariantConfig):
    """Gated Attention Unit stack: one GAU layer replaces attention + feed-forward.

    Hua, Dai, Liu & Le (2022), "Transformer Quality in Linear Time" (arXiv:2202.10447); GAU-α (Su 2022). With
    hidden size d, e = ``expansion_factor``·d and s = ``attention_key_size``: u, v = silu(X Wu), silu(X Wv);
    z = silu(X Wz); q = z·γq + βq, k = z·γk + βk; RoPE on q and k; A = norm(q kᵀ); out = (u ⊙ A v) Wo; then
    residual + norm. No ``num_attention_heads``, no ``intermediate_size`` (u, v play the feed-forward role).

    Defaults differing from ``AttnVariantConfig``: ``hidden_act="silu"``, ``use_bias=False`` and
    ``attention_probs_dropout_prob=0`` (the FLASH pseudocode has no dropout on A; ``gau_alpha_base()`` keeps
    GAU-α's 0.1). The per-dimension γ and β of q and k always exist (the paper's ``scale_offset``).

    Args:
        expansion_factor (float): e / d (default 2); ``expansion_factor · hidden_size`` must be a whole
            number.
        attention_key_size (int): s, the width of z, q and k (default 128); even with RoPE.
        attention_normalization (str): A from the scaled logits a = q·k/√s.
            - ``"softmax"``: softmax(a).
            - ``"softmax_plus"``: softmax((log nᵢ/log ``base_length``)·a), GAU-α's entropy-invariant softmax.
            - ``"relu2"``: relu(a)² / L with L from ``relu2_length``: the relu² of GAU and FLASH in
              bert4keras's form (the paper's pseudocode: relu(q·kᵀ/n + b)², with a position bias b).
            - ``"relu2_normalized"``: relu(a)² / (Σⱼ relu(a)² + ε).
            - ``"laplace"``: laplace(a) / L with Mega's 0.5·(1 + erf((a − μ)/(σ√2))), μ = √½, σ = 1/√(4π).
        relu2_length (str): L of relu²/Laplace: ``"dynamic"`` = nᵢ, keys row i sees; ``"fixed"`` =
            ``base_length``.
        base_length (int): training length m (default 512): softmax_plus equals softmax at nᵢ = m; the
            fixed L.
        entropy_min_length (int | None): lower clamp of nᵢ in softmax_plus's log (default 16; formerly
            ``min_length``).
        chunk_size (int | None): ``None`` = quadratic GAU; g = FLASH mixed-chunk attention, relu² inside
            chunks of g tokens plus linear attention across chunks (earlier chunks only when causal), O(n).
            Needs ``"relu2"``.
        gau_init (str): ``"gau_alpha"`` (default, GAU-α's code): γ = 1, projections ~ truncated normal on ±2σ
            with σ = 1.13684723 / √fan_in · num_hidden_layers^(−1/3); ``"flash"`` (the FLASH pseudocode): γ
            and projections ~ N(0, ``initializer_range``). β = 0 either way.
        gau_kernel (str): ``"auto"`` (Triton on CUDA when installed and the kernels' inputs are bf16 or
            fp16, else torch), ``"torch"``, ``"triton"`` (also on CPU under ``TRITON_INTERPRET=1``), or
            ``"reference"``: the written-out formula with the n×n map.
        hidden_act (str): as in ``AttnVariantConfig`` (default ``"silu"``).
        use_bias (bool): as in ``AttnVariantConfig`` (default ``False``).
        attention_probs_dropout_prob (float): dropout on A (default 0).
        **kwargs: the other fields of ``AttnVariantConfig``; ``num_attention_heads``,
            ``intermediate_size``, ``head_dim``, ``pruned_heads`` and ``no_rope_layers`` raise ``ValueError``.

    Example:
        ```python
        >>> from hf_attn_variants import GAUConfig, GAUForMaskedLM
        >>> config = GAUConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, attention_key_size=16)
        >>> model = GAUForMaskedLM(config)
        ```
    """

    model_type = "gau"
    # Tensor parallelism: GAU has one head, so ranks split its expansion width e — each keeps its slice of u
    # and v ("colwise_gather_partial" gathers in_proj's output; z, the shared base of q and k, stays whole on
    # every rank) and the matching input columns of out_proj (hf_attn_variants.models.tensor_parallel).
    base_model_tp_plan: ClassVar[dict[str, str]] = {
        "layers.*.gau.in_proj": "colwise_gather_partial",
        "layers.*.gau.out_proj": "rowwise",
        "layers.*.gau": "local_shard",
    }
    not_applicable: ClassVar[dict[str, str]] = {
        **AttnVariantConfig.not_applicable,
        "num_attention_heads": "one attention unit per layer; use expansion_factor and attention_key_size.",
        "intermediate_size": "no separate feed-forward (u and v play its role); use expansion_factor.",
        "head_dim": "its one unit's queries and keys are attention_key_size wide; use that.",
        "pruned_heads": "one attention unit per layer, no heads to prune.",
    }

    def __init__(
        self,
        expansion_factor: float = 2,
        attention_key_size: int = 128,
        attention_normalization: str = "softmax_plus",
        relu2_length: str = "dynamic",
        base_length: int = 512,
        entropy_min_length: int | None = None,
        chunk_size: int | None = None,
        gau_init: str = "gau_alpha",
        gau_kernel: str = "auto",
        hidden_act: str = "silu",
        use_bias: bool = False,
        attention_probs_dropout_prob: float = 0.0,
        **kwargs: Any,
    ) -> None:
        """Set the fields; the arguments are described in the class docstring."""
        self.expansion_factor = expansion_factor
        self.attention_key_size = attention_key_size
        self.attention_normalization = attention_normalization
        self.relu2_length = relu2_length
        self.base_length = base_length
        self.entropy_min_length = renamed_field(kwargs, "min_length", "entropy_min_length",
                                                entropy_min_length, 16)
        self.chunk_size = chunk_size
        self.gau_init = gau_init
        self.gau_kernel = gau_kernel
        super().__init__(
            hidden_act=hidden_act, use_bias=use_bias,
            attention_probs_dropout_prob=attention_probs_dropout_prob, **kwargs
        )

    def check_fields(self) -> None:
        """Check the shared fields, then the unit's widths, normalisation, chunking, init and kernel."""
        super().check_fields()
        check_float("expansion_factor", self.expansion_factor, 0.0)
        expanded = self.expansion_factor * self.hidden_size
        if round(expanded) < 1 or abs(expanded - round(expanded)) > 1e-6:
            raise ValueError(
                f"expansion_factor * hidden_size must be a positive whole number, got "
                f"{self.expansion_factor} * {self.hidden_size} = {expanded}."
            )
        check_int("attention_key_size", self.attention_key_size, 1)
        if self.position_embedding_type == "rope" and self.attention_key_size % 2:
            raise ValueError(
                "attention_key_size must be even with position_embedding_type='rope', got "
                f"{self.attention_key_size}."
            )
        check_choice("attention_normalization", self.attention_normalization, ATTENTION_NORMALIZATIONS)
        check_choice("relu2_length", self.relu2_length, RELU2_LENGTHS)
        check_int("base_length", self.base_length, 2)
        check_int("entropy_min_length", self.entropy_min_length, 1)
        check_int("chunk_size", self.chunk_size, 1, allow_none=True)
        check_choice("gau_init", self.gau_init, GAU_INITS)
        check_choice("gau_kernel", self.gau_kernel, GAU_KERNELS)
        if self.chunk_size is not None and self.attention_normalization not in CHUNKED_NORMALIZATIONS:
            raise ValueError(
                f"chunk_size={self.chunk_size} (FLASH mixed-chunk attention) needs attention_normalization "
                f"in {CHUNKED_NORMALIZATIONS}, got attention_normalization={self.attention_normalization!r}; "
                "set chunk_size=None for quadratic GAU with this normalisation."
            )

    @property
    def layer_types(self) -> list[str]:
        """Transformers' (and vLLM's) per-layer attention kinds, derived and never saved.

        Every quadratic GAU layer is ``"full_attention"`` (a cache of every key). FLASH has no such attribute
        (``AttributeError``): its constant-size state is no cache layer Transformers builds (the model
        installs ``GAUChunkCacheLayer``), and vLLM then serves it as a model of state layers.
        """
        if self.chunk_size is not None:
            raise AttributeError("GAU with chunk_size (FLASH) declares no layer_types.")
        return ["full_attention"] * self.num_hidden_layers

    @property
    def intermediate_width(self) -> int:
        """The width e = expansion_factor · hidden_size of the gates u and v."""
        return round(self.expansion_factor * self.hidden_size)

    @classmethod
    def gau_alpha_base(cls, **overrides: Any) -> GAUConfig:
        """The GAU-α architecture (Su 2022, bert4keras).

        24 GAU layers, hidden 768, e = 1536, s = 128, softmax_plus with base length 512 and no clamp of n,
        post-norm with a parameter-free RMSNorm (ε = 1e-12), no biases, dropout 0.1, vocabulary 12000, RoPE.

        Args:
            **overrides: fields that replace GAU-α's.

        Returns:
            GAUConfig: the config.
        """
        values: dict[str, Any] = dict(
            vocab_size=12000, hidden_size=768, num_hidden_layers=24, expansion_factor=2,
            attention_key_size=128, attention_normalization="softmax_plus", base_length=512,
            entropy_min_length=1, gau_init="gau_alpha",
            hidden_act="silu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, norm_type="rmsnorm",
            norm_position="post", norm_elementwise_affine=False, layer_norm_eps=1e-12, use_bias=False,
            position_embedding_type="rope", max_position_embeddings=512, pad_token_id=0,
        )
        return cls(**{**values, **overrides})


__all__ = ["ATTENTION_NORMALIZATIONS", "CHUNKED_NORMALIZATIONS", "GAU_INITS", "GAU_KERNELS", "RELU2_LENGTHS",
           "GAUConfig"]
