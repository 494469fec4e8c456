"""Greedy generation is the same under every cache Transformers offers, or refuses in one sentence.

For each family and variant, a left-padded batch is generated with ``cache_implementation`` set to each
cache that applies, and compared with the default dynamic cache: same tokens (or a near tie of the
reference's logits, see ``properties.assert_same_greedy_choices``) and the same scores up to the first
difference.

Which caches apply:

- ``"static"`` and its deprecated aliases ``"sliding_window"``, ``"hybrid"`` (without a ``sliding_window``
  in the config they build full static layers): every family; FLASH GAU (``chunk_size``) refuses them,
  because its past is a constant-size chunk state that only a dynamic cache can hold.
- ``"offloaded"`` / ``"offloaded_static"``: Transformers moves layers between the GPU and the CPU, so on a
  CPU-only torch they fail for every model, a stock Llama included ("Torch not compiled with CUDA
  enabled"); they run here only when CUDA is available.
- ``"quantized"``: not compared — it quantizes keys and values, so its tokens may legitimately differ
  from the full-precision cache for any model (and it needs optimum-quanto or HQQ).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import CompileConfig

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    GAUConfig,
    GAUForCausalLM,
    SynthesizerConfig,
    SynthesizerForCausalLM,
)
from hf_attn_variants.models.compat import CACHE_FIELD, version_tuple
from tests import properties
from tests.utils import left_padded, random_ids

STATIC_CACHES = ["static", "sliding_window", "hybrid"]
OFFLOADED_CACHES = ["offloaded", "offloaded_static"]
NEW_TOKENS = 10
TINY = {"vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 2, "initializer_range": 0.2}
HEADS = {"num_attention_heads": 4, "intermediate_size": 37}

VARIANTS = {
    **{f"entropy_invariant-{scale}-{kernel}": (EntropyInvariantForCausalLM, EntropyInvariantConfig,
                                               {**HEADS, "attention_scale": scale,
                                                "attn_implementation": kernel})
       for scale in ("standard", "entropy_invariant", "ssmax") for kernel in ("eager", "sdpa")},
    **{f"entropy_invariant-no_rope_layers-{kernel}": (
        EntropyInvariantForCausalLM, EntropyInvariantConfig,
        {**HEADS, "no_rope_layers": [1, 0], "attention_scale_layers": "no_rope",
         "attn_implementation": kernel})
       for kernel in ("eager", "sdpa")},
    **{f"gau-{name}": (GAUForCausalLM, GAUConfig, {"attention_key_size": 16, **fields})
       for name, fields in {
           "softmax": {"attention_normalization": "softmax"},
           "softmax_plus": {"attention_normalization": "softmax_plus", "base_length": 8},
           "relu2_dynamic": {"attention_normalization": "relu2"},
           "relu2_fixed": {"attention_normalization": "relu2", "relu2_length": "fixed", "base_length": 8},
           "relu2_normalized": {"attention_normalization": "relu2_normalized"},
           "laplace": {"attention_normalization": "laplace", "relu2_length": "fixed", "base_length": 8},
       }.items()},
    **{f"synthesizer-{'+'.join(components)}": (SynthesizerForCausalLM, SynthesizerConfig,
                                               {**HEADS, "max_position_embeddings": 32,
                                                "random_init_std": 1.0, "synthesizer_components": components})
       for components in (["dense"], ["random"], ["factorized_dense"], ["factorized_random"], ["vanilla"],
                          ["random", "vanilla"])},
    "synthesizer-fixed_random": (SynthesizerForCausalLM, SynthesizerConfig,
                                 {**HEADS, "max_position_embeddings": 32, "random_init_std": 1.0,
                                  "synthesizer_components": ["random"], "random_trainable": False}),
}


def build(name: str) -> torch.nn.Module:
    model_class, config_class, fields = VARIANTS[name]
    fields = dict(fields)
    implementation = fields.pop("attn_implementation", None)
    torch.manual_seed(0)
    model = model_class(config_class(**TINY, **fields)).eval()
    if implementation:
        model.set_attn_implementation(implementation)
    return model


def greedy(model: torch.nn.Module, **kwargs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """New tokens and per-step scores of a greedy ``generate`` on a left-padded batch."""
    ids, mask = left_padded(random_ids(2, 8, vocab=TINY["vocab_size"], seed=3), [8, 5])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0, **kwargs)
    return out.sequences[:, ids.shape[1]:], list(out.scores)


def assert_same_generation(model: torch.nn.Module, cache_implementation: str) -> None:
    expected, scores = greedy(model)
    got, got_scores = greedy(model, cache_implementation=cache_implementation)
    properties.assert_same_greedy_choices(expected, got, scores)
    same = (expected == got).all(0).cumprod(0).sum()  # steps before the first difference in any row
    for step in range(int(same)):
        torch.testing.assert_close(got_scores[step], scores[step], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache_implementation", STATIC_CACHES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_static_caches_generate_what_the_dynamic_cache_does(variant: str, cache_implementation: str) -> None:
    assert_same_generation(build(variant), cache_implementation)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="Transformers' offloaded caches need CUDA (any model)")
@pytest.mark.parametrize("cache_implementation", OFFLOADED_CACHES)
@pytest.mark.parametrize("variant", ["entropy_invariant-entropy_invariant-sdpa", "gau-relu2_dynamic",
                                     "synthesizer-random+vanilla"])
def test_offloaded_caches_generate_what_the_dynamic_cache_does(variant: str,
                                                               cache_implementation: str) -> None:
    if offloaded_static_crashes(cache_implementation):
        pytest.skip(OFFLOADED_STATIC_CRASH)
    assert_same_generation(build(variant).cuda(), cache_implementation)


OFFLOADED_STATIC_CRASH = (
    "torch 2.10-2.11 can end a compiled generate with cache_implementation='offloaded_static' in a "
    "segmentation fault (seen on 2.11.0+cu130: in torch._dynamo's store_user_object_weakrefs, from "
    "cache_utils' update): each such cache makes a new torch.cuda.Stream, and on these versions a freed "
    "Stream leaves the weakref that dynamo keeps of it dangling (pytorch/pytorch#183403). The pattern, on "
    "CUDA: "
    "f = torch.compile(lambda x, s: (torch.cuda.current_stream().wait_stream(s), x + 1)[1]); "
    "f(x, torch.cuda.Stream()); f(x, torch.cuda.Stream())"
)
"""Why the compiled offloaded static cache is not compared on torch < 2.12 (the GPU image's 2.11 among
them)."""


def offloaded_static_crashes(cache_implementation: str) -> bool:
    return cache_implementation == "offloaded_static" and version_tuple(torch.__version__) < (2, 12)


def flash_gau() -> GAUForCausalLM:
    torch.manual_seed(0)
    config = GAUConfig(**TINY, attention_key_size=16, attention_normalization="relu2", chunk_size=4)
    return GAUForCausalLM(config).eval()


@pytest.mark.parametrize("cache_implementation", [*STATIC_CACHES, "offloaded_static"])
def test_flash_gau_refuses_a_static_cache_in_one_sentence(cache_implementation: str) -> None:
    if cache_implementation == "offloaded_static" and not torch.cuda.is_available():
        pytest.skip("Transformers' offloaded caches need CUDA (any model)")
    model = flash_gau()
    if cache_implementation == "hybrid":  # without sliding layers, a hybrid cache is dynamic: it must work
        assert_same_generation(model, cache_implementation)
        return
    with pytest.raises(ValueError, match=r"cache_implementation='dynamic'") as error:
        greedy(model, cache_implementation=cache_implementation)
    assert "\n" not in str(error.value) and "StaticLayer" in str(error.value)


def full_forward_greedy(model: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``greedy``'s tokens and scores from full forward passes without a cache."""
    ids, mask = left_padded(random_ids(2, 8, vocab=TINY["vocab_size"], seed=3), [8, 5])
    manual, scores = ids, []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            scores.append(model(input_ids=manual, attention_mask=mask).logits[:, -1])
            manual = torch.cat([manual, scores[-1].argmax(-1, keepdim=True)], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return manual[:, ids.shape[1]:], scores


@pytest.mark.parametrize("cache_implementation", [None, "dynamic"], ids=["default", "dynamic"])
def test_flash_gau_generates_with_the_default_and_the_dynamic_cache(cache_implementation: str | None) -> None:
    """Both pick the tokens, with the scores, of full forward passes without a cache: the cache carries the
    chunks' state."""
    model = flash_gau()
    expected, scores = full_forward_greedy(model)
    kwargs = {} if cache_implementation is None else {"cache_implementation": cache_implementation}
    got, got_scores = greedy(model, **kwargs)
    properties.assert_same_greedy_choices(expected, got, scores)
    same = int((expected == got).all(0).cumprod(0).sum())  # steps before the first difference in any row
    assert same > NEW_TOKENS // 2, same
    torch.testing.assert_close(got_scores[:same], scores[:same], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(
    version_tuple(transformers.__version__) < (5, 5, 0),
    reason="before Transformers 5.5 a static cache reports its length by scanning its keys, a data-dependent "
    "value that full-graph compilation cannot trace",
)
def test_entropy_invariant_static_cache_generate_compiles_with_fullgraph() -> None:
    """``_can_compile_fullgraph``: the decoding steps compile as one graph (about 20 s on a 2-core CPU)."""
    model = build("entropy_invariant-entropy_invariant-sdpa")
    assert type(model)._can_compile_fullgraph
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True  # Transformers compiles only on accelerators unless told so
    expected, scores = greedy(model)
    got, _ = greedy(model, cache_implementation="static", compile_config=compile_config)
    properties.assert_same_greedy_choices(expected, got, scores)


@pytest.mark.skipif(
    version_tuple(transformers.__version__) < (5, 5, 0),
    reason="before Transformers 5.5 a static cache reports its length by scanning its keys",
)
@pytest.mark.parametrize("variant", ["synthesizer-random+vanilla", "synthesizer-dense"])
def test_synthesizer_static_cache_decoding_traces_as_one_graph(variant: str) -> None:
    """Transformers 5.24 compiles static-cache decoding on CUDA by itself. The Synthesizer's length check and
    its pattern rows read the cache's counter (a tensor) on the host: a graph break at every step, and
    ``fullgraph=True`` failed. Traced with the eager backend (the capture is what is tested): the same
    tokens."""
    model = build(variant)
    compile_config = CompileConfig(fullgraph=True, backend="eager")
    compile_config._compile_all_devices = True  # Transformers compiles only on accelerators unless told so
    expected, scores = greedy(model)
    got, _ = greedy(model, cache_implementation="static", compile_config=compile_config)
    properties.assert_same_greedy_choices(expected, got, scores)


CACHE_NAME_VARIANTS = ["entropy_invariant-entropy_invariant-sdpa", "gau-relu2_dynamic",
                       "synthesizer-random+vanilla"]


@pytest.mark.parametrize("head", ["causal_lm", "base_model"])
@pytest.mark.parametrize("variant", CACHE_NAME_VARIANTS)
def test_the_cache_is_taken_as_cache_and_as_past_key_values(variant: str, head: str) -> None:
    """Transformers 5.24 renamed ``past_key_values`` to ``cache``: a forward takes either (one name inside),
    returns the cache under the installed release's output field, and a decoding step continues it
    identically."""
    model = build(variant)
    module = model if head == "causal_lm" else model.model
    ids = random_ids(2, 8, vocab=TINY["vocab_size"], seed=4)
    steps = {}
    for name in ("cache", "past_key_values"):
        with torch.no_grad():
            prefill = module(input_ids=ids[:, :6], use_cache=True)
            cache = getattr(prefill, CACHE_FIELD)
            assert cache is not None and cache.get_seq_length() == 6, name
            step = module(input_ids=ids[:, 6:], use_cache=True, **{name: cache})
        assert getattr(step, CACHE_FIELD).get_seq_length() == 8, name
        steps[name] = step[0]
    # same tensors, same kernels
    torch.testing.assert_close(steps["cache"], steps["past_key_values"], atol=0, rtol=0)
    with torch.no_grad():
        full = module(input_ids=ids, use_cache=False)[0]
    torch.testing.assert_close(steps["cache"], full[:, 6:], atol=1e-5, rtol=1e-4)


def test_passing_the_cache_under_both_names_is_one_clear_error() -> None:
    model = build("entropy_invariant-entropy_invariant-sdpa")
    ids = random_ids(1, 4, vocab=TINY["vocab_size"])
    cache = getattr(model(input_ids=ids, use_cache=True), CACHE_FIELD)
    with pytest.raises(ValueError, match=r"`cache` or as `past_key_values`, not both"):
        model(input_ids=ids, cache=cache, past_key_values=cache)


ONE_PER_FAMILY = ["entropy_invariant-entropy_invariant-sdpa", "gau-softmax_plus", "synthesizer-dense"]


@pytest.mark.parametrize("variant", [*ONE_PER_FAMILY, "flash"])
def test_continuous_batching_is_refused_in_one_sentence(variant: str) -> None:
    """``generate_batch`` failed every request inside the manager's thread, each with a logged traceback (the
    paged cache has no ``get_seq_length``; GAU has no heads to page): one ``ValueError`` before it starts."""
    model = flash_gau() if variant == "flash" else build(variant)
    if not hasattr(model, "generate_batch"):
        pytest.skip(f"transformers {transformers.__version__} has no generate_batch")
    with pytest.raises(ValueError, match=r"does not run under Transformers' continuous batching") as error:
        config = transformers.GenerationConfig(max_new_tokens=2, do_sample=False)
        model.generate_batch([[5, 6, 7], [8, 9]], generation_config=config)
    assert "\n" not in str(error.value)


def test_a_synthesizer_static_cache_longer_than_its_patterns_names_max_cache_len() -> None:
    """The slots of a ``StaticCache`` are keys to the Synthesizer's l × l patterns: the error names the
    cache's ``max_cache_len``, not a sequence length the caller never had."""
    model = build("synthesizer-dense")
    cache = transformers.StaticCache(config=model.config, max_cache_len=64)
    with pytest.raises(ValueError, match=r"StaticCache's max_cache_len=64 exceeds max_position_embeddings="):
        model(input_ids=random_ids(1, 5, vocab=TINY["vocab_size"]), use_cache=True, **{CACHE_FIELD: cache})


@pytest.mark.parametrize("new", [1, 3])
@pytest.mark.parametrize("cached", [8, 7])
def test_a_flash_cache_of_other_rows_is_refused(cached: int, new: int) -> None:
    """A step with fewer rows than the cache: after whole chunks (8 tokens, chunk 4) a one-token step
    broadcast the state over the rows and gave logits of the cache's batch; mid-chunk (7), or with several
    tokens, it failed naming the op's internal arguments."""
    model = flash_gau()
    ids = random_ids(2, cached + new, vocab=TINY["vocab_size"], seed=5)
    with torch.no_grad():
        cache = getattr(model(input_ids=ids[:, :cached], use_cache=True), CACHE_FIELD)
        with pytest.raises(ValueError, match=r"The cache holds 2 rows and the input has 1: a cache"):
            model(input_ids=ids[:1, cached:], **{CACHE_FIELD: cache})
