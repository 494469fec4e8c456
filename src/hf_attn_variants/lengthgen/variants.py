"""The variants a length-generalisation study can train, and how each becomes a config.

Every variant is trained under the same budget (data, steps, batch, learning rate, seeds) at training
length L; the model size is shared (``ModelSize``) and matched in non-embedding parameters as closely as
the architectures allow:

- ``ei_*``: the ``entropy_invariant`` family (multi-head softmax attention + FFN) with
  ``attention_scale`` = ``standard`` (q·k/√d), ``entropy_invariant`` ((log nᵢ / log L)·q·k/√d, Su 2021) or
  ``ssmax`` (learnable sₕ·log nᵢ, Nakanishi 2025); ``base_length`` = L.
- ``gau_*``: GAU (Hua et al. 2022) with ``attention_normalization`` = ``softmax``, ``softmax_plus``
  (GAU-α's entropy-invariant softmax), ``relu2`` with ``relu2_length`` ``dynamic`` (n = valid keys of the
  row) or ``fixed`` (n = ``base_length`` = L), or ``relu2_normalized`` (explicit row normaliser). One GAU
  layer holds about half the parameters of an attention + FFN layer, so GAU gets ``gau_layer_factor`` (2)
  times as many layers, as the FLASH paper compares them.
- ``gau_flash``: FLASH (Hua et al. 2022): GAU with ``chunk_size`` = 16, relu² inside the chunks (``fixed``
  n = L, the only normalisation chunked attention implements: ``CHUNKED_NORMALIZATIONS``) plus linear
  attention across chunks. Not in the language-model study's defaults (``DEFAULT_VARIANTS``, as before it
  existed); in the retrieval tasks' (``TASK_VARIANTS``).
- ``synthesizer_random_vanilla``: Synthesizer (Tay et al. 2021) mixing a learned random matrix and
  ordinary q·k attention. Its random matrix has one row/column per position up to
  ``max_position_embeddings`` = ``synthesizer_length_factor``·L, so it cannot run on longer inputs
  (those points are reported as ``n/a``); rows beyond L exist but are never trained.
- ``llama``: a tiny stock ``LlamaForCausalLM`` (RoPE, SwiGLU, causal LM) trained with SDPA at L and
  evaluated with the *same weights* three times (``LLAMA_EVAL_MODES``): ``sdpa``;
  ``entropy_invariant_all`` (this package's training-free log-n scaling for stock models,
  ``attn_implementation="entropy_invariant"`` with ``entropy_invariant_scope="all"``: factor
  log max(nᵢ, 16) / log L on every row — below 1 for the causal rows that see fewer than L keys); and
  ``entropy_invariant_beyond_L`` (``entropy_invariant_scope="beyond"``, the stock default: factor
  max(1, log nᵢ / log L), so rows within the training length are untouched — Qwen's ``use_logn_attn``).
  ``base_length`` = L in both.

Any name may carry the suffix ``+mixed``: the same variant pretrained on a mix of lengths (each batch's
blocks cut into k ∈ ``mixed_length_splits`` equal pieces, same tokens per step) — the articles' second
remedy for relu² with a dynamic n.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cli_utils import FlagError

MIXED_SUFFIX = "+mixed"


@dataclass(frozen=True)
class EvalMode:
    """How a trained model is loaded for evaluation: an attention implementation and config attributes.

    ``attn_implementation`` ``None`` = the model as saved (its own attention); ``config_updates`` are set on
    the loaded config before the weights are loaded (e.g. ``entropy_invariant_scope``).
    """

    name: str
    attn_implementation: str | None = None
    config_updates: dict[str, Any] = field(default_factory=dict)


DEFAULT_MODE = EvalMode("default")
LLAMA_EVAL_MODES = (
    EvalMode("sdpa", "sdpa"),
    EvalMode("entropy_invariant_all", "entropy_invariant", {"entropy_invariant_scope": "all"}),
    EvalMode("entropy_invariant_beyond_L", "entropy_invariant", {"entropy_invariant_scope": "beyond"}),
)
"""The stock Llama's evaluation modes: SDPA, and training-free entropy-invariant attention with
``base_length`` = L on every row (``"all"``: log max(nᵢ, 16) / log L) or only on rows that see more than L
keys (``"beyond"``, the stock default: max(1, log nᵢ / log L))."""


@dataclass(frozen=True)
class Variant:
    """One trainable variant: its family (``model_type``), family-specific config fields and eval modes.

    ``eval_modes`` are the ways the trained weights are loaded for evaluation (``EvalMode``); a variant with
    one mode (``DEFAULT_MODE``) yields one result series named like the variant, a variant with several
    (the stock Llama) yields ``"<name>/<mode name>"`` series. ``objective`` is ``None`` for "the study's
    objective" (MLM by default) or fixed (``"clm"`` for the stock Llama).
    """

    name: str
    model_type: str
    description: str
    fields: dict[str, Any] = field(default_factory=dict)
    objective: str | None = None
    eval_modes: tuple[EvalMode, ...] = (DEFAULT_MODE,)
    mixed_length: bool = False
    position: str = "rope"
    """Its position scheme (``POSITION_SCHEMES``)."""

    def series(self, mode: EvalMode) -> str:
        """The result-series name of this variant evaluated with ``mode``."""
        return self.name if len(self.eval_modes) == 1 else f"{self.name}/{mode.name}"

    def mixed(self) -> Variant:
        """The same variant pretrained on mixed lengths (name + ``"+mixed"``)."""
        if self.mixed_length:
            return self
        return Variant(self.name + MIXED_SUFFIX, self.model_type,
                       self.description + "; mixed-length pretraining",
                       dict(self.fields), self.objective, self.eval_modes, True, self.position)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("ei_standard", "entropy_invariant", "softmax attention, logits q·k/√d",
                {"attention_scale": "standard"}),
        Variant("ei_entropy_invariant", "entropy_invariant",
                "softmax attention, logits (log n / log L)·q·k/√d",
                {"attention_scale": "entropy_invariant"}),
        Variant("ei_ssmax", "entropy_invariant", "softmax attention, logits s_h·log n·q·k/√d (s_h learned)",
                {"attention_scale": "ssmax"}),
        Variant("ei_entropy_invariant_nope_layers", "entropy_invariant",
                "softmax attention, logits (log n / log L)·q·k/√d in the layers without RoPE only (Llama 4)",
                {"attention_scale": "entropy_invariant", "attention_scale_layers": "no_rope"}),
        Variant("gau_softmax", "gau", "GAU, softmax(q·k/√s)", {"attention_normalization": "softmax"}),
        Variant("gau_softmax_plus", "gau", "GAU, softmax((log n / log L)·q·k/√s) (GAU-α)",
                {"attention_normalization": "softmax_plus"}),
        Variant("gau_relu2_dynamic", "gau", "GAU, relu(q·k/√s)²/n, n = valid keys of the row",
                {"attention_normalization": "relu2", "relu2_length": "dynamic"}),
        Variant("gau_relu2_fixed", "gau", "GAU, relu(q·k/√s)²/L, L = training length",
                {"attention_normalization": "relu2", "relu2_length": "fixed"}),
        Variant("gau_relu2_normalized", "gau", "GAU, relu(q·k/√s)² / its row sum",
                {"attention_normalization": "relu2_normalized"}),
        Variant("gau_flash", "gau",
                "FLASH: GAU with mixed-chunk attention (relu²/L inside chunks of 16, linear across)",
                {"attention_normalization": "relu2", "relu2_length": "fixed", "chunk_size": 16}),
        Variant("synthesizer_random_vanilla", "synthesizer", "Synthesizer, softmax(α·R + (1-α)·q·k/√d)",
                {"synthesizer_components": ["random", "vanilla"]}),
        Variant("llama", "llama", "stock LlamaForCausalLM (RoPE, SwiGLU), same weights evaluated with sdpa, "
                "entropy_invariant (scope all) and entropy_invariant (scope beyond L) attention", {},
                objective="clm",
                eval_modes=LLAMA_EVAL_MODES),
    )
}
"""The registry, in the order studies report them."""

NOPE_LAYERS_ONLY = ("ei_entropy_invariant_nope_layers",)
"""Variants that scale only the layers without RoPE: they differ from their twins only with NoPE layers among
RoPE ones (``nope_every_4``), so only that scheme runs them."""
DEFAULT_VARIANTS = tuple(name for name in VARIANTS if name != "gau_flash" and name not in NOPE_LAYERS_ONLY)
"""The language-model study's default variants (as before ``gau_flash`` existed; name it to add it)."""
TASK_VARIANTS = tuple(name for name in VARIANTS if name not in NOPE_LAYERS_ONLY)
"""The retrieval tasks' default variants: every one that runs with RoPE and without position embedding."""
NOPE_SUFFIX = "+nope"
"""Series suffix of a variant trained and evaluated without position embedding
(``position_embedding_type="none"``)."""
NOPE_INTERVAL = 4
POSITION_SCHEMES = {
    "rope": ("", "RoPE in every layer"),
    "none": (NOPE_SUFFIX, "no position embedding"),
    "nope_every_4": ("+nope_every_4", f"RoPE, but every {NOPE_INTERVAL}th layer without (SmolLM3's "
                                      "no_rope_layers)"),
}
"""Position scheme → (series suffix, description). ``nope_every_4``: ``no_rope_layers`` with 0 at layers 3,
7, … (layer i has no RoPE when (i + 1) is a multiple of 4), as SmolLM3 and Llama 4 place theirs."""
QUICK_VARIANTS = ("ei_entropy_invariant", "synthesizer_random_vanilla")


def position_refusal(variant: Variant, scheme: str) -> str | None:
    """Why ``variant`` does not run with the position ``scheme``, or ``None`` when it does: the stock Llama
    runs with RoPE only, ``nope_every_4`` exists in the entropy-invariant family only, and the
    NoPE-layers-only variants need ``nope_every_4``."""
    if variant.model_type == "llama":
        return None if scheme == "rope" else "the stock Llama has RoPE only"
    if variant.name.removesuffix(MIXED_SUFFIX) in NOPE_LAYERS_ONLY:
        return None if scheme == "nope_every_4" else ("it scales only the layers without RoPE, which "
                                                      "nope_every_4 has")
    if scheme == "nope_every_4" and variant.model_type != "entropy_invariant":
        return "per-layer RoPE (no_rope_layers) exists in the entropy-invariant family only"
    return None


def position_applies(variant: Variant, scheme: str) -> bool:
    """Whether ``variant`` runs with the position ``scheme`` (``position_refusal``)."""
    return position_refusal(variant, scheme) is None


def no_rope_layers(num_layers: int) -> list[int]:
    """``nope_every_4``'s ``no_rope_layers``: 1 (RoPE) except every ``NOPE_INTERVAL``th layer."""
    return [0 if (i + 1) % NOPE_INTERVAL == 0 else 1 for i in range(num_layers)]


def with_position(variant: Variant, scheme: str) -> Variant:
    """``variant`` with the position ``scheme`` (``"rope"``: unchanged; else its name + the scheme's
    suffix). ``FlagError`` naming ``position_embedding_types`` where the scheme does not apply
    (``position_applies``)."""
    refusal = position_refusal(variant, scheme)
    if refusal is not None:
        raise FlagError("position_embedding_types", f"position_embedding_types: {variant.name} does not run "
                        f"with {scheme!r}: {refusal}.")
    if scheme == "rope":
        return variant
    suffix, description = POSITION_SCHEMES[scheme]
    fields = ({"position_embedding_type": "none"} if scheme == "none"
              else {"position_embedding_type": "rope", "no_rope_interval": NOPE_INTERVAL})
    return Variant(variant.name + suffix, variant.model_type, f"{variant.description}; {description}",
                   {**variant.fields, **fields}, variant.objective, variant.eval_modes, variant.mixed_length,
                   scheme)


def get_variant(name: str) -> Variant:
    """The variant named ``name`` (optionally with the ``+mixed`` suffix); ``FlagError`` (a ``ValueError``)
    naming ``variants`` and listing the names otherwise."""
    base = name.removesuffix(MIXED_SUFFIX)
    if base not in VARIANTS:
        raise FlagError("variants", f"variants: unknown variant {name!r}; allowed: {sorted(VARIANTS)} "
                         f"(each optionally with the suffix {MIXED_SUFFIX!r}).")
    variant = VARIANTS[base]
    return variant.mixed() if name.endswith(MIXED_SUFFIX) else variant


@dataclass(frozen=True)
class ModelSize:
    """The shared model size of a study (tiny by default: a CPU study)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int | None = None
    """FFN width of the multi-head families (``None`` = 4·hidden); the Llama's SwiGLU gets 2/3 of it
    (three matrices instead of two, same parameters)."""
    attention_key_size: int | None = None
    """GAU's s (``None`` = hidden/2)."""
    gau_layer_factor: int = 2
    synthesizer_length_factor: int = 2
    hidden_dropout_prob: float = 0.1
    initializer_range: float | None = None
    """Std of the weight initialisation of every variant (``None`` = each config's default, 0.02). GAU's
    projections and q/k scales γ follow its ``gau_init`` (default ``"gau_alpha"``: γ = 1, projections with
    std 1/√fan_in · layers^(-1/3)); only with ``gau_init="flash"`` are they drawn with this std — with 0.02
    relu² attention then starts at q·k ≈ 0 and does not learn to attend in a short budget."""

    @property
    def ffn(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size


def config_fields(variant: Variant, size: ModelSize, train_length: int) -> dict[str, Any]:
    """The config fields of ``variant`` at ``size`` trained at ``train_length`` (for ``build_config`` or,
    for the stock Llama, ``LlamaConfig``). ``base_length`` = ``train_length`` for every family that has it."""
    common: dict[str, Any] = {"hidden_size": size.hidden_size}
    if size.initializer_range is not None:
        common["initializer_range"] = size.initializer_range
    if variant.model_type == "llama":
        swiglu = max(8, round(size.ffn * 2 / 3 / 8) * 8)
        return {**common, "num_hidden_layers": size.num_hidden_layers,
                "num_attention_heads": size.num_attention_heads,
                "num_key_value_heads": size.num_attention_heads,
                "intermediate_size": swiglu, "max_position_embeddings": train_length,
                "base_length": train_length,
                "tie_word_embeddings": True, "attention_dropout": 0.0}
    common.update(hidden_dropout_prob=size.hidden_dropout_prob, attention_probs_dropout_prob=0.0,
                  max_position_embeddings=train_length)
    if variant.model_type == "gau":
        key = size.attention_key_size or max(2, size.hidden_size // 2 // 2 * 2)
        fields = {**common, "num_hidden_layers": size.num_hidden_layers * size.gau_layer_factor,
                  "attention_key_size": key, "expansion_factor": 2, "base_length": train_length}
    else:
        fields = {**common, "num_hidden_layers": size.num_hidden_layers,
                  "num_attention_heads": size.num_attention_heads, "intermediate_size": size.ffn}
        if variant.model_type == "entropy_invariant":
            fields["base_length"] = train_length
        if variant.model_type == "synthesizer":
            fields["max_position_embeddings"] = size.synthesizer_length_factor * train_length
    fields = {**fields, **variant.fields}
    if fields.pop("no_rope_interval", None) is not None:
        fields["no_rope_layers"] = no_rope_layers(fields["num_hidden_layers"])
    return fields


def resolved_config(variant: Variant, fields: dict[str, Any]) -> dict[str, Any]:
    """Every field of the config ``fields`` give, defaults included (without ``transformers_version``).

    Fingerprinting this instead of ``fields`` alone makes a stored run stale when a library default it
    relied on changes (e.g. GAU's ``gau_init``). The Llama's ``base_length`` is an extra attribute.
    """
    from transformers import AutoConfig

    config = AutoConfig.for_model(variant.model_type, **fields).to_dict()
    config.pop("transformers_version", None)
    return config


def max_length_of(variant: Variant, fields: dict[str, Any]) -> int | None:
    """The longest input the variant accepts (the Synthesizer's ``max_position_embeddings``), else
    ``None``."""
    return int(fields["max_position_embeddings"]) if variant.model_type == "synthesizer" else None


__all__ = [
    "DEFAULT_MODE",
    "DEFAULT_VARIANTS",
    "LLAMA_EVAL_MODES",
    "MIXED_SUFFIX",
    "NOPE_INTERVAL",
    "NOPE_LAYERS_ONLY",
    "NOPE_SUFFIX",
    "POSITION_SCHEMES",
    "QUICK_VARIANTS",
    "TASK_VARIANTS",
    "VARIANTS",
    "EvalMode",
    "ModelSize",
    "Variant",
    "config_fields",
    "get_variant",
    "max_length_of",
    "no_rope_layers",
    "position_applies",
    "position_refusal",
    "resolved_config",
    "with_position",
]
