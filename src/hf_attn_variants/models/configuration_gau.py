"""Configuration of the Gated Attention Unit family (``model_type = "gau"``)."""

from __future__ import annotations

from typing import Any, ClassVar

from .configuration_common import AttnVariantConfig, check_choice, check_float, check_int, renamed_field

ATTENTION_NORMALIZATIONS = ("softmax", "softmax_plus", "relu2", "relu2_normalized", "laplace")
RELU2_LENGTHS = ("dynamic", "fixed")
GAU_KERNELS = ("auto", "torch", "triton", "reference")
"""Which kernels run the attention: ``auto`` = Triton on CUDA when triton is installed, else torch; ``reference`` =
the written-out formula with the attention map materialised (``modeling_gau.gau_reference_attention``)."""
GAU_INITS = ("gau_alpha", "flash")
"""How a GAU unit is initialised: GAU-α's code (the default) or the FLASH paper's pseudocode (see ``gau_init``)."""
#: Normalisations the FLASH mixed-chunk path (``chunk_size`` set) implements: relu² inside chunks,
#: as in the paper. Softmax has no additive form that a linear cross-chunk term could join, and
#: ``relu2_normalized`` would divide by a row sum that the linear term (which can be negative)
#: makes ill-defined.
CHUNKED_NORMALIZATIONS = ("relu2",)


class GAUConfig(AttnVariantConfig):
    r"""Gated Attention Unit stack: one GAU layer replaces attention + feed-forward.

    Hua, Dai, Liu & Le (2022), "Transformer Quality in Linear Time" (arXiv:2202.10447); GAU-α
    (Su Jianlin, 2022). With hidden size d, e = ``expansion_factor``·d and s = ``attention_key_size``:
    u, v = silu(X Wu), silu(X Wv) (width e); z = silu(X Wz) (width s); q = z·γq + βq, k = z·γk + βk;
    RoPE on q and k; A = norm(q kᵀ); out = (u ⊙ A v) Wo; then residual + norm.

    GAU has a single attention unit per layer: there is no ``num_attention_heads`` and no
    ``intermediate_size`` (the gates u, v of width e play the feed-forward role).

    Args:
        expansion_factor: e / d (default 2, the paper's and GAU-α's e = 2d). ``expansion_factor ·
            hidden_size`` must be a whole number.
        attention_key_size: s, the width of z, q and k (default 128). Must be even with RoPE.
        attention_normalization: how A is computed from the scaled logits a = q·k/√s.
            - ``"softmax"``: softmax(a).
            - ``"softmax_plus"``: softmax((log nᵢ / log ``base_length``)·a), the entropy-invariant
              softmax of GAU-α (nᵢ clamped below at ``entropy_min_length``).
            - ``"relu2"``: relu(a)² / L with L from ``relu2_length`` (the paper's GAU and FLASH).
            - ``"relu2_normalized"``: relu(a)² / (Σⱼ relu(a)² + ε), an explicit row normaliser.
            - ``"laplace"``: laplace(a) / L with Mega's Laplace function 0.5·(1 + erf((a − μ)/(σ√2))), μ = √½,
              σ = 1/√(4π) — a bounded, stabler drop-in for relu² (same logits a, same L from
              ``relu2_length``). Mega itself divides the logits by n *before* the function (laplace(q·k/n));
              here the division by L stays outside, as for relu², so the length choice carries over.
        relu2_length: L of ``"relu2"`` and ``"laplace"``. ``"dynamic"``: L = nᵢ, the number of keys row i
            really sees (padding and causality; as bert4keras). ``"fixed"``: L = ``base_length`` whatever the input
            length — Su (2022) reports it finetunes better at lengths other than the pretraining length.
        base_length: training length m (default 512): softmax_plus equals softmax at nᵢ = m, and the
            fixed relu² length.
        entropy_min_length: lower clamp of nᵢ inside softmax_plus's log (default 16, as bert4keras; configs saved
            under the former name ``min_length`` load unchanged).
        chunk_size: ``None`` (default) = quadratic GAU. An int g = FLASH mixed-chunk attention: exact
            relu² attention inside each chunk of g tokens plus linear attention across chunks
            (non-causal: all chunks; causal: earlier chunks only), O(n) time and memory. Only
            ``attention_normalization="relu2"`` is supported with chunks (see ``CHUNKED_NORMALIZATIONS``).
        gau_init: initialisation of each unit's projections and of γ in q = z·γ + β, k = z·γ + β (β starts at
            0 either way).
            - ``"gau_alpha"`` (default): as GAU-α's code (bert4keras ``GAU_alpha.initializer``, order 3, and
              ``ScaleOffset``): γ = 1; ``in_proj`` and ``out_proj`` ~ truncated normal on ±2σ with
              σ = 1.13684723 / √fan_in · num_hidden_layers^(−1/3) (1.1368… restores the variance the
              truncation removes; the layer factor is DeepNet's).
            - ``"flash"``: the FLASH paper's pseudocode: γ ~ N(0, ``initializer_range``), projections
              ~ N(0, ``initializer_range``). Then q·k ≈ 0 at the start, and relu² attention and its gradient
              vanish at small width: Transformers' overfitting test fails for relu² with it (docs/gau.md has
              the measured loss reductions).

        gau_kernel: the kernels of relu² attention (quadratic, and FLASH's part inside the chunks):
            ``"auto"`` (default) = Triton on CUDA tensors when ``triton`` is installed
            (``pip install 'hf_attn_variants[gpu]'``), torch otherwise; ``"torch"``; ``"triton"`` (also on CPU
            tensors under ``TRITON_INTERPRET=1``, which the tests use). Dropout on A, ``output_attentions`` and
            the other normalisations use the torch path. ``"reference"``: the written-out formula A = norm(q kᵀ/√s),
            out = A v (FLASH: its effective matrix W, out = W v / L) with the n×n map materialised, O(n²) memory —
            what the kernels are tested and benchmarked against (``modeling_gau.gau_reference_attention``).

    Every common field of ``AttnVariantConfig`` applies; here ``hidden_act`` defaults to ``"silu"``
    (the paper's swish), ``use_bias`` to ``False`` (GAU-α has no biases) and ``attention_probs_dropout_prob``
    to 0 (the FLASH pseudocode and lucidrains' FLASH-pytorch have no dropout on A; relu² weights are not a
    distribution, so dropping them rescales the output row by row — with 0.1, relu² GAU fails Transformers'
    overfitting test on its final-step gradient norm, docs/gau.md; ``gau_alpha_base()`` keeps GAU-α's 0.1). The per-dimension
    scale γ and offset β of q and k always exist (the paper's ``scale_offset``); ``use_bias`` only
    concerns the two linear projections.

    Example:
        ```python
        >>> from hf_attn_variants import GAUConfig, GAUForMaskedLM
        >>> config = GAUConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, attention_key_size=16)
        >>> model = GAUForMaskedLM(config)
        >>> alpha = GAUConfig.gau_alpha_base()  # the GAU-α architecture (24 layers, hidden 768)
        ```
    """

    model_type = "gau"
    # Tensor parallelism: GAU has one head, so ranks split its expansion width e — each keeps its slice of u and
    # v ("colwise_gather_partial" gathers in_proj's output; z, the shared base of q and k, stays whole on every
    # rank) and the matching input columns of out_proj. See hf_attn_variants.models.tensor_parallel and docs/scaling.md.
    base_model_tp_plan: ClassVar[dict[str, str]] = {
        "layers.*.gau.in_proj": "colwise_gather_partial",
        "layers.*.gau.out_proj": "rowwise",
        "layers.*.gau": "local_shard",
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
        for field in ("num_attention_heads", "intermediate_size"):
            if field in kwargs:
                raise ValueError(
                    f"{field} does not apply to GAU (one attention unit per layer, no separate feed-forward); "
                    "use expansion_factor and attention_key_size instead."
                )
        self.expansion_factor = expansion_factor
        self.attention_key_size = attention_key_size
        self.attention_normalization = attention_normalization
        self.relu2_length = relu2_length
        self.base_length = base_length
        self.entropy_min_length = renamed_field(kwargs, "min_length", "entropy_min_length", entropy_min_length, 16)
        self.chunk_size = chunk_size
        self.gau_init = gau_init
        self.gau_kernel = gau_kernel
        super().__init__(
            hidden_act=hidden_act, use_bias=use_bias, attention_probs_dropout_prob=attention_probs_dropout_prob, **kwargs
        )

    def check_fields(self) -> None:
        super().check_fields()
        check_float("expansion_factor", self.expansion_factor, 0.0)
        expanded = self.expansion_factor * self.hidden_size
        if self.expansion_factor <= 0 or abs(expanded - round(expanded)) > 1e-6:
            raise ValueError(
                f"expansion_factor * hidden_size must be a positive whole number, got "
                f"{self.expansion_factor} * {self.hidden_size} = {expanded}."
            )
        check_int("attention_key_size", self.attention_key_size, 1)
        if self.position_embedding_type == "rope" and self.attention_key_size % 2:
            raise ValueError(
                f"attention_key_size must be even with position_embedding_type='rope', got {self.attention_key_size}."
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
                f"chunk_size={self.chunk_size} (FLASH mixed-chunk attention) needs attention_normalization in "
                f"{CHUNKED_NORMALIZATIONS}, got attention_normalization={self.attention_normalization!r}; "
                "set chunk_size=None for quadratic GAU with this normalisation."
            )

    @property
    def intermediate_width(self) -> int:
        """e = expansion_factor · hidden_size, the width of the gates u and v."""
        return round(self.expansion_factor * self.hidden_size)

    @classmethod
    def gau_alpha_base(cls, **overrides: Any) -> GAUConfig:
        """The GAU-α architecture (Su 2022, bert4keras): 24 GAU layers, hidden 768, e = 1536, s = 128.

        softmax_plus attention with base length 512 and no clamp of n (``entropy_min_length=1``: GAU-α was
        trained in 2022, before bert4keras clamped n at 16), post-norm with a parameter-free RMSNorm (ε = 1e-12),
        no biases, swish (SiLU) gates, γ = 1 at initialisation (``gau_init="gau_alpha"``), dropout 0.1,
        vocabulary 12000, RoPE. ``overrides`` replace any field. ``hf-attn-variants convert-gau-alpha`` loads
        the released weights (through the PyTorch port's checkpoint) into it.
        Parameter count of ``GAUModel``: 96,522,240 (see docs/gau.md).
        """
        values: dict[str, Any] = {
            "vocab_size": 12000,
            "hidden_size": 768,
            "num_hidden_layers": 24,
            "expansion_factor": 2,
            "attention_key_size": 128,
            "attention_normalization": "softmax_plus",
            "base_length": 512,
            "entropy_min_length": 1,
            "gau_init": "gau_alpha",
            "hidden_act": "silu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "norm_type": "rmsnorm",
            "norm_position": "post",
            "norm_elementwise_affine": False,
            "layer_norm_eps": 1e-12,
            "use_bias": False,
            "position_embedding_type": "rope",
            "max_position_embeddings": 512,
            "pad_token_id": 0,
        }
        values.update(overrides)
        return cls(**values)


__all__ = ["ATTENTION_NORMALIZATIONS", "CHUNKED_NORMALIZATIONS", "GAU_INITS", "GAU_KERNELS", "RELU2_LENGTHS", "GAUConfig"]
