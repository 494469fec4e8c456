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
- Peers: our GAU (FLASH and quadratic, bidirectional and causal) against lucidrains' FLASH-pytorch at the same
  shapes (``bench/peers.py``).
- Training loops: ``pretrain``'s loop against transformers' ``Trainer`` on the same model, data, batch and
  AdamW (``bench/loops.py``). Their "variants" are the two loops (family ``loop``): no model of their own,
  they run on no length of the preset; ``Runner`` times them after the models, ``LOOP_SIZES`` gives their
  sizes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

from ..models.configuration_entropy_invariant import EntropyInvariantConfig
from ..models.configuration_gau import GAUConfig
from ..models.configuration_synthesizer import SynthesizerConfig
from ..models.modeling_entropy_invariant import EntropyInvariantModel
from ..models.modeling_gau import GAUModel
from ..models.modeling_synthesizer import SynthesizerModel
from ..pruning import prune_heads
from .peers import flash_pytorch_model, gau_pytorch_model
from .side_by_side import equal_llama_width

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
    equal_parameter_lengths: tuple[int, ...] = ()
    """Lengths beyond ``lengths`` at which only FLASH and Llama at equal parameters run
    (``flash_vs_llama``)."""
    equal_parameter_width_multiple: int = 1
    """The equal-parameter Llama's MLP width is the nearest multiple of this: 64 on a GPU, where a bf16
    matrix product with an odd width (2135) leaves the tensor cores' aligned tiles and would slow the
    baseline; 1 (exact) on CPU."""
    flash_long_lengths: tuple[int, ...] = ()
    """Lengths beyond those at which causal FLASH alone runs: its time per token, flat out to the longest."""
    repeats: int = 5
    long_repeats: int = 3
    long_from: int = 8192
    short_repeats: int = 10
    short_until: int = 512

    def repeats_at(self, length: int) -> int:
        """Timed repeats at ``length``: more for the short, noisy steps, fewer for the longest, slowest
        ones."""
        if length >= self.long_from:
            return self.long_repeats
        return self.short_repeats if length <= self.short_until else self.repeats


PRESETS: dict[str, Preset] = {
    # The CPU run of `make bench`: small enough for ~10-15 minutes on 2 cores, long enough for n² to matter.
    "cpu": Preset("cpu", 256, 2, 4, 1024, (512, 2048, 8192), equal_parameter_lengths=(4096, 32768),
                  flash_long_lengths=(65536, 131072)),
    # ~110M-parameter models (BERT-base widths) for a GPU; n up to 32k for the O(n)-memory paths.
    "gpu": Preset(
        "gpu", 768, 12, 12, 3072, (512, 2048, 8192, 32768), vocab_size=30522, gau_layers=24,
        gau_chunk_size=256, synthesizer_max_length=2048,
        quadratic_max_length=8192,
        prune_heads=12, prune_intermediate_size=3072, prune_lengths=(512, 2048),
        compile_lengths=(512, 2048, 8192),
        repeats=10, long_repeats=5, long_from=32768, short_repeats=20, equal_parameter_lengths=(4096,),
        equal_parameter_width_multiple=64,
    ),
    # CI smoke test: tiny models and lengths, one repeat, seconds.
    "quick": Preset(
        "quick", 32, 2, 4, 64, (32, 64), gau_key_size=16, gau_chunk_size=16, synthesizer_max_length=64,
        prune_heads=4, prune_intermediate_size=32, prune_lengths=(32,), compile_lengths=(32,),
        repeats=1, long_repeats=1, long_from=10**9, short_repeats=1,
    ),
}


EQUAL_PARAMETER_COMPILE_LENGTHS = (8192,)
"""Where FLASH (causal) and Llama of equal parameters are also timed compiled, whatever the preset (issue 47:
compiled FLASH fwd+bwd at 8k within compiled Llama's time)."""


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
    extra_lengths: tuple[int, ...] = ()
    """Lengths outside the preset's at which this variant runs too (with the others that list them)."""
    compile_lengths: tuple[int, ...] = ()
    """Lengths at which this variant is also timed compiled, ``compile`` or not (``compile``: at the preset's
    ``compile_lengths``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def runs_at(self, length: int) -> bool:
        if self.lengths is not None and length not in self.lengths:
            return False
        return self.max_length is None or length <= self.max_length


@dataclass(frozen=True)
class LoopSize:
    """One run of a training loop in the loop comparison: ``steps`` optimizer steps of ``batch_size`` blocks
    of ``length`` tokens, the first ``warmup_steps`` untimed (at least one: a step is timed from the end of
    the one before it)."""

    length: int = 128
    batch_size: int = 8
    steps: int = 20
    warmup_steps: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.warmup_steps < self.steps:
            raise ValueError(f"LoopSize: need 1 <= warmup_steps < steps, got {self.warmup_steps} and "
                             f"{self.steps}.")

    @property
    def timed_steps(self) -> int:
        """Steps whose time is measured."""
        return self.steps - self.warmup_steps

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step (one process, no accumulation)."""
        return self.batch_size * self.length


LOOP_SIZES: dict[str, LoopSize] = {
    "cpu": LoopSize(),  # ~0.2 s per step on one core: ~5 s per loop and round
    "quick": LoopSize(length=32, batch_size=2, steps=4, warmup_steps=1),
}
"""Sizes of the loop comparison per preset (another preset: ``LoopSize()``); its rounds are the preset's
``repeats``."""


def loop_size(preset: Preset) -> LoopSize:
    """The loop comparison's sizes for ``preset``."""
    return LOOP_SIZES.get(preset.name, LoopSize())


def loop_model(preset: Preset) -> dict[str, Any]:
    """Config overrides of the loop comparison's model: the preset's widths, dropout off (the loops draw
    dropout masks from different generators; without dropout both compute the same losses)."""
    return {"hidden_size": preset.hidden_size, "num_hidden_layers": preset.num_layers,
            "num_attention_heads": preset.num_heads, "intermediate_size": preset.intermediate_size,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@dataclass(frozen=True)
class Comparison:
    """A table of the report: variants measured side by side with ``baseline`` (names of ``Variant``s)."""

    key: str
    title: str
    baseline: str
    variants: tuple[str, ...]
    note: str = ""
    default: bool = True  # part of a run without --only


# --------------------------------------------------------------------------------------------------
# Builders: a bare model of a preset for inputs of ``length`` tokens (``Variant.build`` binds preset and
# options) --------------------------------------------------------------------------------------------------
def _longest(p: Preset, *, equal_parameters: bool = False, flash_long: bool = False) -> int:
    """The longest input learned position tables must cover: of ``p`` (its ``lengths``, ``prune_lengths``,
    and where asked its ``equal_parameter_lengths`` / ``flash_long_lengths``) and of the named preset it was
    narrowed from by ``--lengths``, so that a partial run (``--merge --lengths``) builds the tables, and
    parameter counts, of the full run it is merged into."""
    sizes: list[int] = []
    for q in (p, PRESETS.get(p.name, p)):
        sizes += [*q.lengths, *q.prune_lengths]
        sizes += [*q.equal_parameter_lengths] if equal_parameters else []
        sizes += [*q.flash_long_lengths] if flash_long else []
    return max(sizes)


PACKED_DOCUMENT_LENGTH = 512
"""Tokens per document in the packed-FLASH rows: 16 documents per row at n = 8192, 64 at 32768."""


class PackedDocuments(nn.Module):
    """``model`` fed rows that pack documents of ``document_length`` tokens (``position_ids`` restarting at
    each, no mask: a packing pipeline's format), so that the bench's steps time the packed path."""

    def __init__(self, model: nn.Module, document_length: int) -> None:
        super().__init__()
        self.model = model
        self.document_length = document_length

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device) % self.document_length
        return self.model(input_ids, position_ids=positions.expand_as(input_ids), **kwargs)


def packed_flash_model(p: Preset, length: int) -> nn.Module:
    """Causal FLASH (``gau_model``) on rows packing documents of ``PACKED_DOCUMENT_LENGTH`` tokens."""
    model = gau_model(p, length, normalization="relu2", chunk=p.gau_chunk_size, causal=True)
    return PackedDocuments(model, PACKED_DOCUMENT_LENGTH)


def _multi_head_fields(p: Preset, heads: int | None = None) -> dict[str, Any]:
    """The fields BERT, the entropy-invariant models and the Synthesizer share: sizes of ``p``, dropout
    off."""
    return {
        "vocab_size": p.vocab_size, "hidden_size": p.hidden_size, "num_hidden_layers": p.num_layers,
        "num_attention_heads": heads or p.num_heads, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }


def _llama_intermediate(p: Preset) -> int:
    """Llama's gated MLP width i' with the parameters of a two-matrix FFN of width i: 3·i' ≈ 2·i, a multiple
    of 8."""
    return (2 * p.intermediate_size) // 3 // 8 * 8 or 8


def bert_model(p: Preset, length: int) -> nn.Module:
    """Stock ``BertModel`` with SDPA and no pooler: the encoder baseline."""
    config = BertConfig(**_multi_head_fields(p), intermediate_size=p.intermediate_size,
                        max_position_embeddings=_longest(p), attn_implementation="sdpa")
    return BertModel(config, add_pooling_layer=False)


def entropy_encoder_model(p: Preset, length: int, *, scale: str, heads: int | None = None,
                          intermediate: int | None = None) -> nn.Module:
    """``EntropyInvariantModel`` shaped like BERT (learned absolute positions, post-norm LayerNorm, GELU,
    biases), SDPA, with ``attention_scale=scale`` and optionally other head count / FFN width."""
    config = EntropyInvariantConfig(
        **_multi_head_fields(p, heads), intermediate_size=intermediate or p.intermediate_size,
        max_position_embeddings=_longest(p), position_embedding_type="absolute", norm_position="post",
        norm_type="layernorm", layer_norm_eps=1e-12, hidden_act="gelu", use_bias=True, attention_scale=scale,
        attn_implementation="sdpa",
    )
    return EntropyInvariantModel(config)


def pruned_encoder_model(p: Preset, length: int) -> nn.Module:
    """The ``prune_heads``-head entropy-invariant encoder with heads 0 … prune_heads/2 − 1 of every layer
    removed by ``pruning.prune_heads``."""
    model = entropy_encoder_model(p, length, scale="entropy_invariant", heads=p.prune_heads,
                                  intermediate=p.prune_intermediate_size)
    half = list(range(p.prune_heads // 2))
    return prune_heads(model, {layer: half for layer in range(p.num_layers)})


def llama_model(p: Preset, length: int) -> nn.Module:
    """Stock ``LlamaModel`` with SDPA, as many key/value heads as query heads: the decoder baseline."""
    config = LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads, num_key_value_heads=p.num_heads,
        intermediate_size=_llama_intermediate(p),
        max_position_embeddings=_longest(p), attention_dropout=0.0, attn_implementation="sdpa",
    )
    return LlamaModel(config)


def equal_parameter_intermediate(p: Preset) -> int:
    """The MLP width, a multiple of ``p.equal_parameter_width_multiple``, that gives ``llama_equal_model``
    (L/2 Llama layers) the parameters outside the embeddings of the causal FLASH GAU of ``p`` (L GAU layers):
    ``side_by_side.equal_llama_width``."""
    with torch.device("meta"):
        gau = gau_model(p, 0, normalization="relu2", chunk=p.gau_chunk_size, causal=True)
    target = sum(w.numel() for w in gau.parameters()) - gau.get_input_embeddings().weight.numel()
    return equal_llama_width(target, p.hidden_size, max(1, (p.gau_layers or p.num_layers) // 2),
                             p.equal_parameter_width_multiple)


def llama_equal_model(p: Preset, length: int) -> nn.Module:
    """Stock ``LlamaModel`` (SDPA) with the parameters of the causal FLASH GAU of ``p``: one Llama layer per
    two GAU layers, as in Hua et al. 2022 (FLASH's Transformer++ baseline), the MLP width from
    ``equal_parameter_intermediate``."""
    config = LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size,
        num_hidden_layers=max(1, (p.gau_layers or p.num_layers) // 2), num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_heads, intermediate_size=equal_parameter_intermediate(p),
        max_position_embeddings=_longest(p, equal_parameters=True), attention_dropout=0.0,
        attn_implementation="sdpa",
    )
    return LlamaModel(config)


def entropy_decoder_model(p: Preset, length: int) -> nn.Module:
    """``EntropyInvariantModel`` shaped like Llama (RoPE, pre-norm RMSNorm, SiLU, no biases), its two-matrix
    FFN 1.5× Llama's width so parameters and FLOPs are equal."""
    config = EntropyInvariantConfig(
        **_multi_head_fields(p), intermediate_size=_llama_intermediate(p) * 3 // 2,
        max_position_embeddings=_longest(p),
        position_embedding_type="rope", norm_position="pre", norm_type="rmsnorm", layer_norm_eps=1e-6,
        hidden_act="silu", use_bias=False, is_decoder=True, attention_scale="entropy_invariant",
        attn_implementation="sdpa",
    )
    return EntropyInvariantModel(config)


def gau_model(p: Preset, length: int, *, normalization: str, chunk: int | None = None,
              kernel: str = "auto", causal: bool = False) -> nn.Module:
    """``GAUModel`` with ``attention_normalization=normalization``, ``chunk_size=chunk`` and
    ``gau_kernel=kernel`` (``"reference"``: the written-out attention with its n×n map), bidirectional or
    ``causal``."""
    config = GAUConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, num_hidden_layers=p.gau_layers or p.num_layers,
        attention_key_size=p.gau_key_size, attention_normalization=normalization, chunk_size=chunk,
        gau_kernel=kernel,
        max_position_embeddings=_longest(p, equal_parameters=True, flash_long=True),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, is_decoder=causal,
    )
    return GAUModel(config)


def synthesizer_model(p: Preset, length: int, *, components: tuple[str, ...]) -> nn.Module:
    """``SynthesizerModel`` mixing ``components``, its synthesized l×l patterns sized l = ``length``."""
    config = SynthesizerConfig(**_multi_head_fields(p), intermediate_size=p.intermediate_size,
                               max_position_embeddings=length, synthesizer_components=list(components))
    return SynthesizerModel(config)


# --------------------------------------------------------------------------------------------------
# The variants of a preset
# --------------------------------------------------------------------------------------------------
SYNTHESIZER_VARIANTS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("vanilla", ("vanilla",), False),
    ("random", ("random",), False),
    ("factorized_random", ("factorized_random",), False),
    ("dense", ("dense",), True),
    ("factorized_dense", ("factorized_dense",), True),
    ("random_vanilla", ("random", "vanilla"), False),
)
"""(name after ``syn_``, ``synthesizer_components``, measured at the preset's shortest length only)."""


def _encoder_decoder_variants(p: Preset) -> list[Variant]:
    """The stock baselines and the entropy-invariant encoder and decoder measured against them."""
    mid = sorted(p.lengths)[len(p.lengths) // 2] if len(p.lengths) > 2 else max(p.lengths)
    return [
        Variant("bert_sdpa", "stock", "BertModel, SDPA (stock baseline, encoder)",
                functools.partial(bert_model, p)),
        Variant("ei_sdpa", "entropy_invariant",
                "EntropyInvariantModel, BERT-shaped, attention_scale=entropy_invariant, SDPA",
                functools.partial(entropy_encoder_model, p, scale="entropy_invariant"), compile=True),
        Variant("ei_standard_sdpa", "entropy_invariant",
                "EntropyInvariantModel, BERT-shaped, attention_scale=standard, SDPA (factor off)",
                functools.partial(entropy_encoder_model, p, scale="standard"), max_length=mid,
                skip_reason=f"n > {mid}: only a reference for the factor's cost (time budget)"),
        Variant("llama_sdpa", "stock", "LlamaModel, SDPA (stock baseline, decoder)",
                functools.partial(llama_model, p),
                causal=True),
        Variant("ei_decoder_sdpa", "entropy_invariant",
                "EntropyInvariantModel, Llama-shaped decoder, entropy_invariant, SDPA",
                functools.partial(entropy_decoder_model, p), causal=True),
    ]


def _gau_variants(p: Preset) -> list[Variant]:
    """Quadratic GAU (relu², softmax_plus) and FLASH, and the quadratic ones through
    ``gau_kernel="reference"`` (the written-out attention with its n×n map) for the before/after of the
    kernels (``gau_optimisation``)."""
    quadratic = {
        "max_length": p.quadratic_max_length,
        "skip_reason": (f"n > {p.quadratic_max_length}: quadratic in time; the longest lengths are for the "
                        "O(n) paths"
                        if p.quadratic_max_length else ""),
    }
    return [
        Variant("gau_quadratic", "gau", "GAUModel relu² (dynamic L), quadratic",
                functools.partial(gau_model, p, normalization="relu2"), compile=True, **quadratic),
        Variant("gau_flash", "gau", f"GAUModel relu², FLASH chunks of {p.gau_chunk_size}",
                functools.partial(gau_model, p, normalization="relu2", chunk=p.gau_chunk_size), compile=True),
        Variant("gau_softmax_plus", "gau", "GAUModel softmax_plus (GAU-α default), quadratic",
                functools.partial(gau_model, p, normalization="softmax_plus"), **quadratic),
        Variant("gau_quadratic_reference", "gau", "GAUModel relu², quadratic, reference path (n×n tensors)",
                functools.partial(gau_model, p, normalization="relu2", kernel="reference"), **quadratic),
        Variant("gau_softmax_plus_reference", "gau", "GAUModel softmax_plus, quadratic, reference path",
                functools.partial(gau_model, p, normalization="softmax_plus", kernel="reference"),
                **quadratic),
    ]


PEER_VARIANTS: tuple[tuple[str, Callable[..., nn.Module], str, bool], ...] = (
    ("flash_pytorch", flash_pytorch_model, "FLASH-pytorch 0.1.9 FLASHTransformer (peer), bidirectional",
     False),
    ("flash_pytorch_causal", flash_pytorch_model, "FLASH-pytorch 0.1.9 FLASHTransformer (peer), causal",
     True),
    ("gau_pytorch", gau_pytorch_model, "FLASH-pytorch 0.1.9 quadratic GAU (peer), bidirectional", False),
    ("gau_pytorch_causal", gau_pytorch_model, "FLASH-pytorch 0.1.9 quadratic GAU (peer), causal", True),
)
"""(name, builder, description, causal) of the peers (``bench/peers.py``)."""


def _peer_variants(p: Preset) -> list[Variant]:
    """lucidrains' FLASH-pytorch, FLASH and quadratic, causal and bidirectional, at our GAU's shapes; and the
    causal GAUs of ours they are compared with (the bidirectional ones are ``_gau_variants``'s)."""
    quadratic = {"max_length": p.quadratic_max_length,
                 "skip_reason": f"n > {p.quadratic_max_length}: quadratic in time" if p.quadratic_max_length
                 else ""}
    peers = [Variant(name, "peer", description, functools.partial(build, p, causal=causal), causal=causal,
                     compile=True, **({} if name.startswith("flash") else quadratic))
             for name, build, description, causal in PEER_VARIANTS]
    return [
        *peers,
        Variant("gau_flash_causal", "gau", f"GAUModel relu², FLASH chunks of {p.gau_chunk_size}, causal",
                functools.partial(gau_model, p, normalization="relu2", chunk=p.gau_chunk_size, causal=True),
                causal=True, compile=True, extra_lengths=(*p.equal_parameter_lengths, *p.flash_long_lengths),
                compile_lengths=EQUAL_PARAMETER_COMPILE_LENGTHS),
        Variant("gau_flash_causal_packed", "gau",
                f"the same FLASH on rows packing documents of {PACKED_DOCUMENT_LENGTH} tokens (position_ids "
                "restart)",
                functools.partial(packed_flash_model, p), causal=True,
                lengths=(8192, 32768), extra_lengths=p.equal_parameter_lengths),
        Variant("llama_equal_sdpa", "stock",
                "LlamaModel, SDPA, one layer per two GAU layers, MLP width for FLASH's parameter count",
                functools.partial(llama_equal_model, p), causal=True,
                extra_lengths=p.equal_parameter_lengths, compile_lengths=EQUAL_PARAMETER_COMPILE_LENGTHS),
        Variant("gau_quadratic_causal", "gau", "GAUModel relu² (dynamic L), quadratic, causal",
                functools.partial(gau_model, p, normalization="relu2", causal=True), causal=True,
                compile=True,
                **quadratic),
    ]


def _synthesizer_variants(p: Preset) -> list[Variant]:
    """One Synthesizer per row of ``SYNTHESIZER_VARIANTS``, rebuilt per length (l = n)."""
    shortest = min(p.lengths)
    up_to_limit = (
        f"n > {p.synthesizer_max_length}: Synthesizer runs stop where the synthesized components must (their "
        "learned l×l patterns, l = n, hold heads·n² parameters per layer: at n = 8192 with 4 heads 1 GiB of "
        "R per layer, the same again for its gradient)"
    )
    shortest_only = f"n > {shortest}: measured at the shortest length only (time budget)"
    return [
        Variant(f"syn_{name}", "synthesizer", f"SynthesizerModel {'+'.join(components)} (l = n)",
                functools.partial(synthesizer_model, p, components=components),
                max_length=shortest if short else p.synthesizer_max_length,
                skip_reason=shortest_only if short else up_to_limit, shared_across_lengths=False,
                compile=name == "random")
        for name, components, short in SYNTHESIZER_VARIANTS
    ]


def _pruning_variants(p: Preset) -> list[Variant]:
    """A ``prune_heads``-head entropy-invariant encoder with and without half of its heads."""
    return [
        Variant("ei_8h", "entropy_invariant",
                f"EntropyInvariantModel, BERT-shaped, {p.prune_heads} heads, FFN "
                f"{p.prune_intermediate_size}, SDPA",
                functools.partial(entropy_encoder_model, p, scale="entropy_invariant", heads=p.prune_heads,
                                  intermediate=p.prune_intermediate_size), lengths=p.prune_lengths),
        Variant("ei_8h_pruned50", "entropy_invariant",
                f"the same with heads 0…{p.prune_heads // 2 - 1} of every layer removed by "
                "pruning.prune_heads",
                functools.partial(pruned_encoder_model, p), lengths=p.prune_lengths),
    ]


LOOP_FAMILY = "loop"
"""The family of the loop comparison's two sides (``Variant.extra``: ``loop`` and ``objective``)."""

LOOP_MODEL_TYPE = "entropy_invariant"
"""The family both loops train (its causal LM for CLM, its masked LM for MLM)."""

LOOP_VARIANTS: tuple[tuple[str, str, str, str], ...] = (
    ("pretrain_clm", "pretrain", "clm", "`hf-attn-variants pretrain`'s loop (accelerate), CLM"),
    ("trainer_clm", "trainer", "clm", "transformers' `Trainer`, CLM (baseline)"),
    ("pretrain_mlm", "pretrain", "mlm",
     "`hf-attn-variants pretrain`'s loop (accelerate), MLM (head on masked rows)"),
    ("trainer_mlm", "trainer", "mlm", "transformers' `Trainer`, MLM, the model's full LM head (baseline)"),
)
"""(name, loop, objective, description) of the loop comparison's sides (``bench/loops.py``)."""


def _not_a_model(name: str, length: int) -> nn.Module:
    raise TypeError(f"{name} is a training loop (bench/loops.py), not a model to build.")


def _loop_variants(p: Preset) -> list[Variant]:
    """Both loops, CLM and MLM: no model to build and no length of the preset (``Runner`` times them
    apart)."""
    model = f"{LOOP_MODEL_TYPE} {{}} LM, hidden {p.hidden_size}, {p.num_layers} layers, dropout 0"
    return [
        Variant(name, LOOP_FAMILY, f"{description}; {model.format(objective.upper())}",
                functools.partial(_not_a_model, name), causal=objective == "clm", lengths=(),
                extra={"loop": loop, "objective": objective})
        for name, loop, objective, description in LOOP_VARIANTS
    ]


def build_variants(preset: Preset) -> dict[str, Variant]:
    """Every variant of ``preset``, keyed by name (the baselines included)."""
    variants = [
        *_encoder_decoder_variants(preset), *_gau_variants(preset), *_peer_variants(preset),
        *_synthesizer_variants(preset), *_pruning_variants(preset), *_loop_variants(preset),
    ]
    return {v.name: v for v in variants}


PEER_NOTE = ("lucidrains' FLASH-pytorch 0.1.9 (`bench/peers.py`) at our GAU's shapes (width, layers, key "
             "size s, e = 2d, chunk g; token shift off), its own conventions kept: scale-norm (FLASH) or "
             "LayerNorm (GAU), a T5 relative-position bias, partial rotary embeddings. Both compute the same "
             "layer once those are aligned (tests/test_peers.py).")

EQUAL_PARAMETER_NOTE = (
    "FLASH's training-speed claim (Hua et al. 2022) is against Transformer++ at equal parameters: a stock "
    "`LlamaModel` (SDPA, RoPE, gated SiLU MLP) with one layer per two GAU layers and the MLP width that "
    "makes its parameters outside the embeddings those of our causal FLASH GAU (relu², chunks as in the GAU "
    "rows; `bench/specs.py:equal_parameter_intermediate`). Besides the preset's lengths, both run at its "
    "`equal_parameter_lengths` (CPU: 4096 and 32768), where nothing else runs.")

PACKED_NOTE = (
    "Rows packing documents of 512 tokens (`position_ids` restarting at each, no mask: `pretrain --packing "
    "documents`) against the same FLASH on one sequence per row: every document starts on a chunk boundary "
    "of its own (`gau_kernels.DocumentChunks`) and the linear state is summed per document, so packing stays "
    "O(n) (issue 38; the earlier path through the n×n matrix took 13.7× the unpacked time at n = 8192).")

LOOP_NOTE = (
    "`pretrain` (`pretrain(PretrainArguments(...))`, in process) against transformers' `Trainer` on the same "
    "model (same config and seed: the same initial weights), the same blocks of the embedded corpus in the "
    "same order (`EpochShuffleSampler`; CLM labels = input ids), batch, AdamW settings (decay on matrices "
    "only in both), clipping 1.0, linear schedule and number of steps; no evaluation, checkpoint, log row or "
    "progress bar within the timed steps; one process, one thread. Both use fused AdamW (the `Trainer`'s own "
    "default, `adamw_torch_fused` with torch ≥ 2.8; `pretrain`'s since it was measured 3 % slower without "
    "it); the `Trainer` keeps its loop and callbacks. A step is timed from the end of one optimizer step to "
    "the end of the next (a global optimizer post-step hook, the same in both loops: book-keeping, data, "
    "forward, backward, clipping, AdamW); setup, tokenization and the first steps are not. A round runs each "
    "loop once (new model and loop; order rotated per round); a round's value is its mean step time, "
    "tokens/s = tokens per step ÷ that; the ratio is the median of the per-round ratios of the Trainer's "
    "step time to ours, i.e. our tokens/s ÷ the Trainer's (smallest–largest round). The mean training loss "
    "over all steps shows that both trained the same: it should agree to float rounding (`bench/loops.py`).")

COMPARISONS: tuple[Comparison, ...] = (
    Comparison("encoder", "Encoder: entropy-invariant (SDPA) vs stock BERT (SDPA)", "bert_sdpa",
               ("ei_sdpa", "ei_standard_sdpa")),
    Comparison("decoder", "Decoder: entropy-invariant (SDPA) vs stock Llama (SDPA)", "llama_sdpa",
               ("ei_decoder_sdpa",)),
    Comparison("gau", "GAU: FLASH (chunked) and softmax_plus vs quadratic relu² GAU", "gau_quadratic",
               ("gau_flash", "gau_softmax_plus")),
    Comparison("peers", "Peer: our FLASH vs FLASH-pytorch's FLASHTransformer, bidirectional", "flash_pytorch",
               ("gau_flash",), note=PEER_NOTE),
    Comparison("peers_causal", "Peer: our FLASH vs FLASH-pytorch's FLASHTransformer, causal",
               "flash_pytorch_causal",
               ("gau_flash_causal",), note=PEER_NOTE),
    Comparison("flash_vs_llama", "FLASH GAU vs Llama (SDPA) at equal parameters, causal", "llama_equal_sdpa",
               ("gau_flash_causal",), note=EQUAL_PARAMETER_NOTE),
    Comparison("flash_packed", "FLASH on packed documents vs one sequence per row, causal",
               "gau_flash_causal",
               ("gau_flash_causal_packed",), note=PACKED_NOTE),
    Comparison("peers_quadratic", "Peer: our quadratic GAU vs FLASH-pytorch's GAU, bidirectional",
               "gau_pytorch",
               ("gau_quadratic",), note=PEER_NOTE),
    Comparison("peers_quadratic_causal", "Peer: our quadratic GAU vs FLASH-pytorch's GAU, causal",
               "gau_pytorch_causal", ("gau_quadratic_causal",), note=PEER_NOTE),
    Comparison("synthesizer", "Synthesizer components vs vanilla (q·kᵀ) Synthesizer", "syn_vanilla",
               ("syn_random", "syn_factorized_random", "syn_dense", "syn_factorized_dense",
                "syn_random_vanilla")),
    Comparison("pruning", "50 % head pruning (pruning.prune_heads) vs the unpruned model", "ei_8h",
               ("ei_8h_pruned50",)),
    Comparison("gau_optimisation", "Quadratic GAU kernels vs the attention-map path (before/after)",
               "gau_quadratic_reference", ("gau_quadratic", "gau_softmax_plus_reference", "gau_softmax_plus"),
               note=("The attention-map code path (`gau_kernel=\"reference\"`, also what "
                     "`output_attentions=True` runs: the code before the fused and blocked kernels) against "
                     "the kernels, in the same rounds as every other row: the before/after tables of "
                     "*Optimisations made for these targets* below.")),
    Comparison("loop_clm", "Training loop: `pretrain` vs transformers' `Trainer`, CLM", "trainer_clm",
               ("pretrain_clm",), note=LOOP_NOTE),
    Comparison("loop_mlm", "Training loop: `pretrain` vs transformers' `Trainer`, MLM", "trainer_mlm",
               ("pretrain_mlm",),
               note=LOOP_NOTE + (" MLM: both draw the same masks (`mask_tokens`, seeded per block as "
                                 "`pretrain` seeds them); `pretrain` applies the LM head to the masked "
                                 "positions only (`TargetOnlyMLMLoss`: the same loss and gradients), the "
                                 "`Trainer` to every position, so this ratio includes that saving; the CLM "
                                 "one is the loop alone.")),
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
    "LOOP_FAMILY",
    "LOOP_MODEL_TYPE",
    "LOOP_SIZES",
    "PRESETS",
    "Comparison",
    "LoopSize",
    "Preset",
    "Variant",
    "build_variants",
    "loop_model",
    "loop_size",
    "random_input_ids",
    "select",
]
