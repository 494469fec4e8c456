"""What the benchmark measures: model variants, the stock baselines they are compared with, and presets.

A ``Variant`` builds a bare backbone (no LM head: the vocabulary projection would only dilute the
attention differences) for a given sequence length. Variants are grouped in ``Comparison``s, each with
one baseline measured in the same interleaved rounds, so every ratio is a paired, same-run ratio.

Fairness choices (see docs/benchmarks.md):

- Encoder: stock ``BertModel`` with SDPA. RoFormer would be the RoPE counterpart, but Transformers v5's
  ``RoFormerModel`` has no SDPA path (``_supports_sdpa = False``), so it cannot be the SDPA baseline. The
  entropy-invariant encoder is therefore built *BERT-shaped*: learned absolute positions, post-norm
  LayerNorm, GELU, biases, the same widths — the only differences are the per-row log-n factor and
  BERT's token-type embedding.
- Decoder: stock ``LlamaModel`` (SDPA, RoPE, pre-norm RMSNorm, SiLU, no biases, as many key/value heads
  as query heads). The entropy-invariant decoder uses the same, except that its feed-forward block is the
  two-matrix ``FeedForward`` instead of Llama's gated three-matrix MLP; its intermediate size is 1.5× the
  Llama one so parameters and FLOPs are equal.
- GAU, Synthesizer: compared within the family (quadratic vs FLASH; ``random`` vs ``vanilla``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

VOCAB_SIZE = 1000
"""Token ids are drawn from [1, VOCAB_SIZE) — valid for every preset's vocabulary."""


@dataclass(frozen=True)
class Preset:
    """Model sizes and lengths of one benchmark configuration."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    lengths: tuple[int, ...]
    batch_size: int = 1
    vocab_size: int = 1000
    gau_layers: int | None = None  # None = num_layers
    gau_key_size: int = 128
    gau_chunk_size: int = 256
    synthesizer_max_length: int = 2048
    quadratic_max_length: int | None = None
    prune_heads: int = 8
    prune_intermediate_size: int = 512
    prune_lengths: tuple[int, ...] = (512,)
    compile_lengths: tuple[int, ...] = (512,)
    repeats: int = 5
    long_repeats: int = 3
    long_from: int = 8192
    short_repeats: int = 10
    short_until: int = 512

    def repeats_at(self, length: int) -> int:
        """Timed repeats at ``length``: more for the short, noisy steps, fewer for the longest, slowest ones."""
        if length >= self.long_from:
            return self.long_repeats
        return self.short_repeats if length <= self.short_until else self.repeats


PRESETS: dict[str, Preset] = {
    # The CPU run of `make bench`: small enough for ~10-15 minutes on 2 cores, long enough for n² to matter.
    "cpu": Preset("cpu", 256, 2, 4, 1024, (512, 2048, 8192)),
    # ~110M-parameter models (BERT-base widths) for a GPU; n up to 32k for the O(n)-memory paths.
    "gpu": Preset(
        "gpu", 768, 12, 12, 3072, (512, 2048, 8192, 32768), vocab_size=30522, gau_layers=24,
        gau_chunk_size=256, synthesizer_max_length=2048,
        quadratic_max_length=8192,
        prune_heads=12, prune_intermediate_size=3072, prune_lengths=(512, 2048), compile_lengths=(512, 2048, 8192),
        repeats=10, long_repeats=5, long_from=32768, short_repeats=20,
    ),
    # CI smoke test: tiny models and lengths, one repeat, seconds.
    "quick": Preset(
        "quick", 32, 2, 4, 64, (32, 64), gau_key_size=16, gau_chunk_size=16, synthesizer_max_length=64,
        prune_heads=4, prune_intermediate_size=32, prune_lengths=(32,), compile_lengths=(32,),
        repeats=1, long_repeats=1, long_from=10**9, short_repeats=1,
    ),
}


@dataclass(frozen=True)
class Variant:
    """One model to time. ``build(length)`` returns a fresh bare model for inputs of ``length`` tokens.

    ``max_length``: longest input the variant is run at (``None`` = every length of the preset), with
    ``skip_reason`` explaining why longer ones are skipped. ``shared_across_lengths``: one model serves
    every length (otherwise it is rebuilt per length, e.g. Synthesizer l = n). ``compile``: also time a
    ``torch.compile``d copy at the preset's ``compile_lengths``.
    """

    name: str
    family: str
    description: str
    build: Callable[[int], nn.Module]
    causal: bool = False
    max_length: int | None = None
    skip_reason: str = ""
    shared_across_lengths: bool = True
    compile: bool = False
    lengths: tuple[int, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def runs_at(self, length: int) -> bool:
        if self.lengths is not None and length not in self.lengths:
            return False
        return self.max_length is None or length <= self.max_length


@dataclass(frozen=True)
class Comparison:
    """A table of the report: variants measured side by side with ``baseline`` (names of ``Variant``s)."""

    key: str
    title: str
    baseline: str
    variants: tuple[str, ...]
    note: str = ""
    default: bool = True  # part of a run without --only


def _no_dropout() -> dict[str, float]:
    return {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def build_variants(preset: Preset) -> dict[str, Variant]:
    """Every variant of ``preset``, keyed by name (the baselines included)."""
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    from hf_attn_variants import (
        EntropyInvariantConfig,
        EntropyInvariantModel,
        GAUConfig,
        GAUModel,
        SynthesizerConfig,
        SynthesizerModel,
    )

    p = preset
    longest = max((*p.lengths, *p.prune_lengths))
    short = min(p.lengths)
    mid = sorted(p.lengths)[len(p.lengths) // 2] if len(p.lengths) > 2 else max(p.lengths)
    multi = {
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "num_hidden_layers": p.num_layers,
        "num_attention_heads": p.num_heads,
        **_no_dropout(),
    }

    def bert(_: int) -> nn.Module:
        config = BertConfig(
            **multi, intermediate_size=p.intermediate_size, max_position_embeddings=longest,
            attn_implementation="sdpa",
        )
        return BertModel(config, add_pooling_layer=False)

    def entropy_encoder(scale: str, implementation: str = "sdpa", heads: int | None = None,
                        intermediate: int | None = None) -> Callable[[int], nn.Module]:
        def build(_: int) -> nn.Module:
            config = EntropyInvariantConfig(
                **{**multi, "num_attention_heads": heads or p.num_heads},
                intermediate_size=intermediate or p.intermediate_size, max_position_embeddings=longest,
                position_embedding_type="absolute", norm_position="post", norm_type="layernorm",
                layer_norm_eps=1e-12, hidden_act="gelu", use_bias=True, attention_scale=scale,
                attn_implementation=implementation,
            )
            return EntropyInvariantModel(config)

        return build

    llama_intermediate = (2 * p.intermediate_size) // 3 // 8 * 8 or 8

    def llama(_: int) -> nn.Module:
        config = LlamaConfig(
            vocab_size=p.vocab_size, hidden_size=p.hidden_size, num_hidden_layers=p.num_layers,
            num_attention_heads=p.num_heads, num_key_value_heads=p.num_heads, intermediate_size=llama_intermediate,
            max_position_embeddings=longest, attention_dropout=0.0, attn_implementation="sdpa",
        )
        return LlamaModel(config)

    def entropy_decoder(_: int) -> nn.Module:
        config = EntropyInvariantConfig(
            **multi, intermediate_size=llama_intermediate * 3 // 2, max_position_embeddings=longest,
            position_embedding_type="rope", norm_position="pre", norm_type="rmsnorm", layer_norm_eps=1e-6,
            hidden_act="silu", use_bias=False, is_decoder=True, attention_scale="entropy_invariant",
            attn_implementation="sdpa",
        )
        return EntropyInvariantModel(config)

    def gau(normalization: str, chunk: int | None) -> Callable[[int], nn.Module]:
        def build(_: int) -> nn.Module:
            config = GAUConfig(
                vocab_size=p.vocab_size, hidden_size=p.hidden_size, num_hidden_layers=p.gau_layers or p.num_layers,
                attention_key_size=p.gau_key_size, attention_normalization=normalization, chunk_size=chunk,
                max_position_embeddings=longest, **_no_dropout(),
            )
            return GAUModel(config)

        return build

    def synthesizer(components: list[str]) -> Callable[[int], nn.Module]:
        def build(length: int) -> nn.Module:
            config = SynthesizerConfig(
                **multi, intermediate_size=p.intermediate_size, max_position_embeddings=length,
                synthesizer_components=components,
            )
            return SynthesizerModel(config)

        return build

    def pruned(base: Callable[[int], nn.Module]) -> Callable[[int], nn.Module]:
        def build(length: int) -> nn.Module:
            from hf_attn_variants.pruning import prune_heads

            model = base(length)
            half = list(range(p.prune_heads // 2))
            return prune_heads(model, {layer: half for layer in range(p.num_layers)})

        return build

    quadratic_skip = (f"n > {p.quadratic_max_length}: quadratic in time; the longest lengths are for the O(n) paths"
                      if p.quadratic_max_length else "")

    def reference_path(base: Callable[[int], nn.Module]) -> Callable[[int], nn.Module]:
        """The same model computing attention through the attention-map code path (the pre-kernel code)."""

        def build(length: int) -> nn.Module:
            from hf_attn_variants.models.modeling_gau import GatedAttentionUnit

            model = base(length)
            for unit in model.modules():
                if isinstance(unit, GatedAttentionUnit):
                    unit._quadratic = functools.partial(_reference_quadratic, unit)
            return model

        return build

    syn_skip = (
        f"n > {p.synthesizer_max_length}: Synthesizer runs stop where the synthesized components must (their learned "
        "l×l patterns, l = n, hold heads·n² parameters per layer: at n = 8192 with 4 heads 1 GiB of R per layer, "
        "the same again for its gradient)"
    )
    variants = [
        Variant("bert_sdpa", "stock", "BertModel, SDPA (stock baseline, encoder)", bert),
        Variant("ei_sdpa", "entropy_invariant",
                "EntropyInvariantModel, BERT-shaped, attention_scale=entropy_invariant, SDPA",
                entropy_encoder("entropy_invariant"), compile=True),
        Variant("ei_standard_sdpa", "entropy_invariant",
                "EntropyInvariantModel, BERT-shaped, attention_scale=standard, SDPA (factor off)",
                entropy_encoder("standard"), max_length=mid,
                skip_reason=f"n > {mid}: only a reference for the factor's cost (time budget)"),
        Variant("llama_sdpa", "stock", "LlamaModel, SDPA (stock baseline, decoder)", llama, causal=True),
        Variant("ei_decoder_sdpa", "entropy_invariant",
                "EntropyInvariantModel, Llama-shaped decoder, entropy_invariant, SDPA", entropy_decoder,
                causal=True),
        Variant("gau_quadratic", "gau", "GAUModel relu² (dynamic L), quadratic", gau("relu2", None), compile=True,
                max_length=p.quadratic_max_length, skip_reason=quadratic_skip),
        Variant("gau_flash", "gau", f"GAUModel relu², FLASH chunks of {p.gau_chunk_size}",
                gau("relu2", p.gau_chunk_size), compile=True),
        Variant("gau_softmax_plus", "gau", "GAUModel softmax_plus (GAU-α default), quadratic",
                gau("softmax_plus", None), max_length=p.quadratic_max_length, skip_reason=quadratic_skip),
        # The attention-map code path, i.e. the computation before the fused/blocked kernels, for the
        # before/after measurements of those kernels (comparison ``gau_optimisation``).
        Variant("gau_quadratic_reference", "gau", "GAUModel relu², quadratic, reference path (n×n tensors)",
                reference_path(gau("relu2", None)), max_length=p.quadratic_max_length, skip_reason=quadratic_skip),
        Variant("gau_softmax_plus_reference", "gau", "GAUModel softmax_plus, quadratic, reference path",
                reference_path(gau("softmax_plus", None)), max_length=p.quadratic_max_length,
                skip_reason=quadratic_skip),
    ]
    for name, components, longest_syn in (
        ("vanilla", ["vanilla"], p.synthesizer_max_length),
        ("random", ["random"], p.synthesizer_max_length),
        ("factorized_random", ["factorized_random"], p.synthesizer_max_length),
        ("dense", ["dense"], short),
        ("factorized_dense", ["factorized_dense"], short),
        ("random_vanilla", ["random", "vanilla"], p.synthesizer_max_length),
    ):
        reason = syn_skip if longest_syn == p.synthesizer_max_length else (
            f"n > {short}: measured at the shortest length only (time budget)")
        variants.append(
            Variant(f"syn_{name}", "synthesizer", f"SynthesizerModel {'+'.join(components)} (l = n)",
                    synthesizer(components), max_length=longest_syn, skip_reason=reason,
                    shared_across_lengths=False, compile=name == "random")
        )
    prune_base = entropy_encoder("entropy_invariant", heads=p.prune_heads, intermediate=p.prune_intermediate_size)
    variants += [
        Variant("ei_8h", "entropy_invariant",
                f"EntropyInvariantModel, BERT-shaped, {p.prune_heads} heads, FFN {p.prune_intermediate_size}, SDPA",
                prune_base, lengths=p.prune_lengths),
        Variant("ei_8h_pruned50", "entropy_invariant",
                f"the same with heads 0…{p.prune_heads // 2 - 1} of every layer removed by pruning.prune_heads",
                pruned(prune_base), lengths=p.prune_lengths),
    ]
    return {v.name: v for v in variants}


def _reference_quadratic(unit: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``GatedAttentionUnit._quadratic`` forced through the attention map (``output_attentions``), without it."""
    attended, _ = type(unit)._quadratic(unit, *args[:6], True)
    return attended, None


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("encoder", "Encoder: entropy-invariant (SDPA) vs stock BERT (SDPA)", "bert_sdpa",
               ("ei_sdpa", "ei_standard_sdpa")),
    Comparison("decoder", "Decoder: entropy-invariant (SDPA) vs stock Llama (SDPA)", "llama_sdpa",
               ("ei_decoder_sdpa",)),
    Comparison("gau", "GAU: FLASH (chunked) and softmax_plus vs quadratic relu² GAU", "gau_quadratic",
               ("gau_flash", "gau_softmax_plus")),
    Comparison("synthesizer", "Synthesizer components vs vanilla (q·kᵀ) Synthesizer", "syn_vanilla",
               ("syn_random", "syn_factorized_random", "syn_dense", "syn_factorized_dense", "syn_random_vanilla")),
    Comparison("pruning", "50 % head pruning (pruning.prune_heads) vs the unpruned model", "ei_8h",
               ("ei_8h_pruned50",)),
    Comparison("gau_optimisation", "Quadratic GAU kernels vs the attention-map path (before/after)",
               "gau_quadratic_reference", ("gau_quadratic", "gau_softmax_plus_reference", "gau_softmax_plus"),
               note=("The attention-map code path (`output_attentions=True`'s, the code before the fused and blocked "
                     "kernels) against the kernels, in the same rounds as every other row: the before/after "
                     "tables of *Optimisations made for these targets* below.")),
)


def select(preset: Preset, only: list[str] | None) -> tuple[dict[str, Variant], tuple[Comparison, ...]]:
    """Variants and comparisons restricted to comparison keys or variant names in ``only``."""
    variants = build_variants(preset)
    if not only:
        comparisons = tuple(c for c in COMPARISONS if c.default)
        names = {n for c in comparisons for n in (c.baseline, *c.variants)}
        return {n: v for n, v in variants.items() if n in names}, comparisons
    unknown = [o for o in only if o not in variants and o not in {c.key for c in COMPARISONS}]
    if unknown:
        raise ValueError(
            f"--only: unknown {unknown}; choose comparison keys {[c.key for c in COMPARISONS]} or variants "
            f"{sorted(variants)}."
        )
    comparisons = []
    for comparison in COMPARISONS:
        members = (comparison.baseline, *comparison.variants)
        if comparison.key in only:
            comparisons.append(comparison)
        elif any(m in only for m in members):
            kept = tuple(v for v in comparison.variants if v in only)
            comparisons.append(replace(comparison, variants=kept))
    names = {n for c in comparisons for n in (c.baseline, *c.variants)}
    return {n: v for n, v in variants.items() if n in names}, tuple(comparisons)


def random_input_ids(batch_size: int, length: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """Token ids in [1, vocab) (0 is padding), reproducible."""
    generator = torch.Generator().manual_seed(seed + length)
    return torch.randint(1, VOCAB_SIZE, (batch_size, length), generator=generator).to(device)


__all__ = [
    "COMPARISONS",
    "PRESETS",
    "Comparison",
    "Preset",
    "Variant",
    "build_variants",
    "random_input_ids",
    "select",
]
