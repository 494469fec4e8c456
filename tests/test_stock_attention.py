"""``attn_implementation="entropy_invariant"`` on stock Transformers models (Llama with GQA, BERT)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

import hf_attn_variants  # noqa: F401  (registers the attention implementation)
from hf_attn_variants.stock import stock_attention
from hf_attn_variants.stock.stock_attention import resolve_base_length
from tests import properties
from tests.utils import left_padded, random_ids, right_padded


def tiny_llama(implementation: str = "entropy_invariant", layers: int = 2, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **overrides,
    )
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation(implementation)
    return model


def tiny_bert(implementation: str = "entropy_invariant", **overrides) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides,
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    model.set_attn_implementation(implementation)
    return model


def test_bert_equals_sdpa_when_every_row_sees_base_length_keys() -> None:
    model = tiny_bert(base_length=11, entropy_min_length=1)
    ids = random_ids(2, 11)
    scaled = properties.hidden(model, ids)
    model.set_attn_implementation("sdpa")
    assert torch.allclose(scaled, properties.hidden(model, ids), atol=1e-5)


def test_llama_last_row_equals_sdpa_at_base_length_and_other_rows_differ() -> None:
    model = tiny_llama(layers=1, base_length=11, entropy_min_length=1, entropy_invariant_scope="all")
    ids = random_ids(2, 11)
    scaled = properties.hidden(model, ids)
    model.set_attn_implementation("sdpa")
    reference = properties.hidden(model, ids)
    assert torch.allclose(scaled[:, -1], reference[:, -1], atol=1e-5)
    assert not torch.allclose(scaled[:, 3], reference[:, 3], atol=1e-4)


def test_factor_is_applied_on_top_of_the_models_own_scaling() -> None:
    """A longer context than base_length sharpens attention: the scaled logits equal an explicit
    computation."""
    model = tiny_bert(base_length=4, entropy_min_length=1)
    attention = model.encoder.layer[0].attention.self
    captured = {}

    def spy(module, args, kwargs, output):
        captured["output"] = output[0]

    handle = attention.register_forward_hook(spy, with_kwargs=True)
    ids = random_ids(1, 8)
    properties.hidden(model, ids)
    handle.remove()
    hidden = model.embeddings(input_ids=ids)
    q = attention.query(hidden).view(1, 8, 4, 8).transpose(1, 2)
    k = attention.key(hidden).view(1, 8, 4, 8).transpose(1, 2)
    v = attention.value(hidden).view(1, 8, 4, 8).transpose(1, 2)
    factor = math.log(8) / math.log(4)
    probs = (q @ k.transpose(-1, -2) / math.sqrt(8) * factor).softmax(-1)
    expected = (probs @ v).transpose(1, 2).reshape(1, 8, 32)
    assert torch.allclose(captured["output"], expected, atol=1e-5)


def test_bert_padding_invariance() -> None:
    properties.assert_padding_invariant(tiny_bert(base_length=8))


@pytest.mark.parametrize("left", [False, True])
def test_llama_padding_invariance(left: bool) -> None:
    properties.assert_padding_invariant(tiny_llama(base_length=8), left=left)


def test_llama_causal_no_future_leakage() -> None:
    properties.assert_no_future_leakage(tiny_llama(base_length=8))


def test_llama_cache_equals_full_forward_and_generate() -> None:
    model = tiny_llama(base_length=8)
    properties.assert_cache_matches_full_forward(model, padded=False)
    properties.assert_cache_matches_full_forward(model, padded=True)
    properties.assert_generate_matches_greedy_full_forward(model)


def test_from_pretrained_with_attn_implementation(tmp_path) -> None:
    tiny_llama("sdpa", base_length=4).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="entropy_invariant").eval()
    assert model.config._attn_implementation == "entropy_invariant"
    ids, mask = right_padded(random_ids(2, 9), [9, 5])
    out = model(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(out).all()
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert not torch.allclose(out, reference(input_ids=ids, attention_mask=mask).logits, atol=1e-4)


def test_base_length_resolution() -> None:
    assert resolve_base_length(LlamaConfig(max_position_embeddings=2048)) == 2048
    assert resolve_base_length(LlamaConfig(max_position_embeddings=2048, base_length=300)) == 300
    yarn = LlamaConfig(
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                         "original_max_position_embeddings": 2048},
    )
    assert resolve_base_length(yarn) == 2048
    assert resolve_base_length(None) == 512
    assert resolve_base_length(LlamaConfig(base_length=300.0)) == 300
    for bad in ("abc", 2.7, float("nan"), True):
        with pytest.raises(ValueError, match=f"base_length must be a whole number of tokens, got {bad!r}"):
            resolve_base_length(LlamaConfig(base_length=bad))


# --------------------------------------------------------------------------- scope, formulas, positions
@pytest.mark.parametrize("left", [False, True])
def test_llama_is_unchanged_up_to_base_length_by_default(left: bool) -> None:
    """Default scope "beyond": every row that sees at most base_length keys is exactly the SDPA model."""
    model = tiny_llama(base_length=8)
    pad = left_padded if left else right_padded
    ids, mask = pad(random_ids(2, 14), [14, 11])
    scaled = properties.hidden(model, ids, mask)
    model.set_attn_implementation("sdpa")
    reference = properties.hidden(model, ids, mask)
    counts = mask.cumsum(-1)  # keys each causal row sees
    unchanged, beyond = (counts <= 8) & (mask == 1), counts > 8
    torch.testing.assert_close(scaled[unchanged], reference[unchanged], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(scaled[beyond], reference[beyond], atol=1e-4)


@pytest.mark.parametrize("case", ["offset positions", "packed positions with a cache"])
def test_positions_the_caller_passes_do_not_change_which_keys_a_row_counts(case: str) -> None:
    """Without a mask (SDPA skips it), nᵢ came from ``position_ids``: offset positions 100… counted 101…
    keys where a row sees 1…, and packed positions with a cache (Transformers then builds no document mask,
    so rows attend across documents) counted per document. Eager attention counts the keys the row sees;
    both implementations now agree (they differed by up to 0.29 in logits), and equal ``sdpa`` with the
    factor of the visible keys."""
    ids = random_ids(1, 15)
    positions = (torch.arange(100, 115)[None] if case == "offset positions"
                 else torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6]]))
    logits = {}
    for implementation in ("entropy_invariant", "entropy_invariant_eager"):
        model = tiny_llama(implementation, base_length=4, initializer_range=0.5)
        with torch.no_grad():
            logits[implementation] = model(input_ids=ids, position_ids=positions,
                                           use_cache=case != "offset positions").logits
    torch.testing.assert_close(logits["entropy_invariant"], logits["entropy_invariant_eager"], atol=2e-5,
                               rtol=1e-4)
    query, config = torch.zeros(1, 1, 15, 4), tiny_llama(base_length=4).config
    factor = {how: stock_attention.stock_logit_factor(config, query, query, None, positions, causal=True,
                                                      count_from_positions=how == "serving")
              for how in ("model", "serving")}
    unpositioned = stock_attention.stock_logit_factor(config, query, query, None, None, causal=True)
    torch.testing.assert_close(factor["model"], unpositioned)
    assert not torch.allclose(factor["serving"], unpositioned)  # a serving engine's positions still decide


def test_a_prefill_into_a_static_cache_counts_the_keys_sdpa_attends_to() -> None:
    """Transformers builds no mask for a prefill from position 0 into an empty static cache; SDPA's
    ``is_causal`` then lets row i see keys 0…i of the longer key tensor. Counting from the end of that tensor
    (max_cache_len − q + i + 1 keys) sharpened every row: the default scope "beyond" must leave a prompt and
    its continuation below L unchanged, and the two implementations agree."""
    model = tiny_llama("sdpa", base_length=16, initializer_range=0.5)
    ids = random_ids(1, 10)
    logits = {}
    for implementation in ("sdpa", "entropy_invariant", "entropy_invariant_eager"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=30, do_sample=False, cache_implementation="static",
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        logits[implementation] = torch.stack(out.logits)  # (30, 1, vocab): the prefill's, then each step's
    for implementation in ("entropy_invariant", "entropy_invariant_eager"):  # the prompt's rows: ≤ 10 keys
        torch.testing.assert_close(logits[implementation][0], logits["sdpa"][0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(logits["entropy_invariant"], logits["entropy_invariant_eager"], atol=2e-5,
                               rtol=1e-4)
    assert not torch.allclose(logits["entropy_invariant"][-1], logits["sdpa"][-1], atol=1e-3)  # past 16 keys


def test_values_a_config_sets_are_used_or_refused_never_replaced_by_defaults() -> None:
    """``attn_scale=0.0`` was read as 0.1, ``entropy_min_length=0`` as 16, and ``base_length=0`` fell back to
    ``max_position_embeddings`` (``or DEFAULT``); RoPE parameters per layer type (Gemma 3) hid the original
    context, so L was the extended one."""
    query = torch.zeros(1, 1, 40, 4)
    positions = torch.arange(9000, 9040)[None]
    off = LlamaConfig(entropy_invariant_formula="llama4", attn_scale=0.0)
    factor = stock_attention.stock_logit_factor(off, query, query, None, positions, causal=True)
    assert factor.eq(1).all()
    for field, value, message in (("entropy_min_length", 0, "entropy_min_length must be a whole number >= 1"),
                                  ("entropy_min_length", 2.5, "entropy_min_length must be a whole number"),
                                  ("base_length", 0, "base_length must be >= 2")):
        config = LlamaConfig(max_position_embeddings=64, **{field: value})
        with pytest.raises(ValueError, match=message):
            stock_attention.stock_logit_factor(config, query, query, None, None, causal=True)
    with pytest.raises(ValueError, match="floor_scale must be a whole number >= 1"):
        stock_attention.stock_logit_factor(LlamaConfig(entropy_invariant_formula="llama4", floor_scale=0),
                                           query, query, None, positions, causal=True)
    per_layer_type = LlamaConfig(max_position_embeddings=32768)
    per_layer_type.rope_parameters = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                           "rope_theta": 1000000.0}}
    assert stock_attention.resolve_base_length(per_layer_type) == 4096


def test_bert_is_unchanged_up_to_base_length_by_default() -> None:
    model = tiny_bert(base_length=8, initializer_range=0.5)
    short, long = random_ids(2, 8), random_ids(2, 12)
    scaled_short, scaled_long = properties.hidden(model, short), properties.hidden(model, long)
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(scaled_short, properties.hidden(model, short), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(scaled_long, properties.hidden(model, long), atol=1e-4)


def test_qwen_use_logn_attn_formula_is_reproduced() -> None:
    """Qwen (v1): q × log_L(n) for n > L (n = the token's 1-based position), else 1 — with any clamp ≤ L."""
    length = 8
    config = LlamaConfig(max_position_embeddings=length, base_length=length)
    positions = torch.arange(40)[None]
    query, key = torch.zeros(1, 1, 40, 4), torch.zeros(1, 1, 40, 4)
    factor = stock_attention.stock_logit_factor(config, query, key, None, positions, causal=True)
    qwen = [math.log(n, length) if n > length else 1.0 for n in range(1, 41)]
    torch.testing.assert_close(factor[0], torch.tensor(qwen), atol=1e-6, rtol=0)


def test_llama4_attention_temperature_formula_is_reproduced() -> None:
    """Llama 4: 1 + attn_scale · log1p(⌊(p + 1) / floor_scale⌋) per query position p (≥ 1)."""
    config = LlamaConfig(entropy_invariant_formula="llama4", attn_scale=0.25, floor_scale=4)
    positions = torch.arange(3, 40)[None]
    query, key = torch.zeros(1, 1, 37, 4), torch.zeros(1, 1, 40, 4)
    factor = stock_attention.stock_logit_factor(config, query, key, None, positions, causal=True)
    cache_position = torch.arange(3, 40)
    # Llama4TextAttention
    reference = torch.log1p(torch.floor((cache_position.float() + 1.0) / 4)) * 0.25 + 1.0
    torch.testing.assert_close(factor[0], reference)
    llama4 = LlamaConfig(entropy_invariant_formula="llama4")  # Llama 4's defaults: 0.1 and 8192
    defaults = stock_attention.stock_logit_factor(llama4, query[:, :, :2], key, None,
                                                  torch.tensor([[8190, 8191]]), causal=True)
    assert defaults[0, 0] == 1.0 and defaults[0, 1].item() == pytest.approx(1 + 0.1 * math.log(2))


def test_llama4_formula_runs_end_to_end_and_is_the_model_below_floor_scale() -> None:
    model = tiny_llama(entropy_invariant_formula="llama4", floor_scale=8, attn_scale=1.0)
    ids = random_ids(1, 12)
    scaled = properties.hidden(model, ids)
    model.set_attn_implementation("sdpa")
    reference = properties.hidden(model, ids)
    torch.testing.assert_close(scaled[:, :7], reference[:, :7], atol=1e-6, rtol=1e-5)  # p + 1 < 8: factor 1
    assert not torch.allclose(scaled[:, 7:], reference[:, 7:], atol=1e-4)


def test_compiled_checkpointed_models_of_other_attn_scales_train_after_a_reset() -> None:
    """docs/stock_log_n.md's advice for a sweep: the attention reads ``attn_scale`` from the config at every
    call, and a compiled, checkpointed training step of a second model of another value failed on torch 2.13
    (dynamo's ``lift_tracked_freevar_to_input`` assertion); after ``torch.compiler.reset()`` each model's
    compiled loss and gradients equal its eager ones, and the values give different losses."""
    ids = random_ids(2, 12)
    losses = []
    for attn_scale in (0.5, 2.0):
        model = tiny_llama(entropy_invariant_formula="llama4", floor_scale=4, attn_scale=attn_scale,
                           use_cache=False).train()
        model.gradient_checkpointing_enable()
        eager = model(ids, labels=ids).loss
        eager.backward()
        expected = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        torch.compiler.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True)(ids, labels=ids).loss
        compiled.backward()
        torch.testing.assert_close(compiled, eager)
        torch.testing.assert_close([p.grad for p in model.parameters()], expected)
        losses.append(eager.item())
    assert abs(losses[0] - losses[1]) > 1e-4, losses


@pytest.mark.parametrize("scope", ["beyond", "all"])
def test_packed_sequences_follow_their_positions(scope: str) -> None:
    """Two sequences packed in one row without a mask, positions restarting (packed training): Transformers
    builds a block mask from the positions, and nᵢ follows it — the second sequence is computed as if
    alone."""
    model = tiny_llama(base_length=4, entropy_min_length=1, entropy_invariant_scope=scope)
    first, second = random_ids(1, 7, seed=1), random_ids(1, 6, seed=2)
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(7), torch.arange(6)])[None]
    together = properties.hidden(model, packed, position_ids=positions, use_cache=False)
    alone = properties.hidden(model, second, use_cache=False)
    torch.testing.assert_close(together[:, 7:], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("scope", ["all", "beyond"])
def test_eager_variant_equals_the_sdpa_one_and_returns_the_weights(scope: str) -> None:
    """``entropy_invariant_eager``: the same scaling over eager attention (GQA, padding, causality), with the
    probabilities for ``output_attentions`` (what ``hf-attn-variants entropy`` reads)."""
    for model, ids, mask in ((tiny_llama(base_length=8, entropy_invariant_scope=scope),
                              *left_padded(random_ids(2, 20), [20, 13])),
                             (tiny_bert(base_length=8, entropy_invariant_scope=scope),
                              *right_padded(random_ids(2, 20), [20, 13]))):
        reference = properties.hidden(model, ids, mask)
        model.set_attn_implementation("entropy_invariant_eager")
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
        real = mask.bool()
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits
        torch.testing.assert_close(hidden[real], reference[real], atol=1e-5, rtol=1e-4)
        weights = out.attentions[0]
        assert weights.shape == (2, 4, 20, 20)
        torch.testing.assert_close(weights.sum(-1)[0], torch.ones(4, 20))
        assert (weights[1][:, real[1]][..., ~real[1]] == 0).all()  # a real row gives padded keys no weight


# ----------------------------------------------------------------------- configure_log_n, what is refused
def tiny_t5(implementation: str, stacks: bool = True) -> torch.nn.Module:
    """A tiny T5 set to ``implementation``, its stacks too unless ``stacks`` is False (Transformers
    5.15-5.19's ``set_attn_implementation`` leaves them as they were)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                num_heads=4, dropout_rate=0.0)).eval()
    model.set_attn_implementation(implementation)
    for stack in (model.encoder, model.decoder) if stacks else ():
        stack.set_attn_implementation(implementation)
    return model


def t5_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, decoder_input_ids=ids).logits


def test_configure_log_n_reaches_configs_that_model_config_does_not() -> None:
    """T5's stacks read copies of the config: ``model.config.base_length = 4`` alone changed nothing there
    (the factor came from ``max_position_embeddings`` instead), silently. ``configure_log_n`` sets every
    config the attention reads, as setting each stack's own does; on Llama it is ``model.config``'s field."""
    llama = tiny_llama()
    stock_attention.configure_log_n(llama, base_length=8, scope="all", formula="log_ratio", min_length=2)
    assert (llama.config.base_length, llama.config.entropy_invariant_scope) == (8, "all")
    ids = random_ids(1, 40)
    model = tiny_t5("entropy_invariant")
    if not stock_attention.dispatches_attention(model):  # Transformers' T5 before its attention interface
        with pytest.raises(TypeError, match="T5ForConditionalGeneration computes its attention itself"):
            stock_attention.configure_log_n(model, base_length=4)
        return
    plain = t5_logits(tiny_t5("sdpa"), ids)
    model.config.base_length = 4
    assert torch.equal(t5_logits(model, ids), plain)  # the attention never saw it
    by_hand = tiny_t5("entropy_invariant")
    for config in (by_hand.config, by_hand.encoder.config, by_hand.decoder.config):
        config.base_length = 4
    assert stock_attention.configure_log_n(model, base_length=4) >= 3
    scaled = t5_logits(model, ids)
    assert not torch.allclose(scaled, plain, atol=1e-3)
    torch.testing.assert_close(scaled, t5_logits(by_hand, ids))


def test_configure_log_n_refuses_submodels_set_attn_implementation_did_not_reach() -> None:
    """T5's stacks hold copies of its config; Transformers 5.15-5.19's ``set_attn_implementation`` on the
    model skips them (same config class), so log-n would silently apply nowhere: one TypeError naming them.
    From 5.20 the method reaches them and ``configure_log_n`` sets all three configs."""
    model = tiny_t5("entropy_invariant")
    if not stock_attention.dispatches_attention(model):
        pytest.skip("Transformers' T5 before 5.15 computes its attention itself (configure_log_n refuses it)")
    model.encoder.set_attn_implementation("sdpa")
    with pytest.raises(TypeError, match=r"runs attn_implementation='entropy_invariant' but its submodels "
                                        r"encoder \('sdpa'\) still run another one"):
        stock_attention.configure_log_n(model, base_length=4)
    top_only = tiny_t5("entropy_invariant", stacks=False)
    if top_only.encoder.config._attn_implementation == "entropy_invariant":  # Transformers 5.20 and later
        assert stock_attention.configure_log_n(top_only, base_length=4) >= 3
    else:
        with pytest.raises(TypeError, match=r"submodels encoder \('sdpa'\), decoder \('sdpa'\)"):
            stock_attention.configure_log_n(top_only, base_length=4)


def test_configure_log_n_refuses_what_it_cannot_scale_in_one_error() -> None:
    from transformers import BloomConfig, BloomForCausalLM

    bloom = BloomForCausalLM(BloomConfig(vocab_size=97, hidden_size=32, n_layer=1, n_head=4))
    bloom.config._attn_implementation = "entropy_invariant"  # from_pretrained accepts it: it changes nothing
    with pytest.raises(TypeError, match="BloomForCausalLM computes its attention itself, not through"):
        stock_attention.configure_log_n(bloom, base_length=8)
    with pytest.raises(TypeError, match="loaded with attn_implementation='sdpa': load it with"):
        stock_attention.configure_log_n(tiny_llama("sdpa"), base_length=8)
    for field, value in (("base_length", 1), ("base_length", 8.5), ("formula", "cubic"), ("scope", "some"),
                         ("min_length", 0)):
        with pytest.raises(ValueError, match="base_length|entropy_invariant_formula|entropy_invariant_scope|"
                                             "entropy_min_length"):
            stock_attention.configure_log_n(tiny_llama(), **{field: value})
    with pytest.raises(TypeError, match="PreTrainedModel"):
        stock_attention.configure_log_n(torch.nn.Linear(2, 2))


def test_configure_log_n_on_a_compiled_model_names_the_model_to_pass_and_the_compiled_one_follows() -> None:
    """``torch.compile``'s wrapper is refused with what to pass instead; the compiled model then recompiles
    for the new fields (Dynamo guards the config's values), so its logits equal the eager model's."""
    model = tiny_llama().eval()
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(TypeError, match="got OptimizedModule \\(torch.compile's wrapper: pass the model you"):
        stock_attention.configure_log_n(compiled, base_length=4)
    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    with torch.no_grad():
        before = compiled(ids).logits
        stock_attention.configure_log_n(model, base_length=4)
        after = compiled(ids).logits
        torch.testing.assert_close(after, model(ids).logits)
    assert not torch.allclose(before, after, atol=1e-5)


def test_attention_arguments_the_functions_do_not_compute_are_refused_not_dropped() -> None:
    """T5's relative ``position_bias`` (the eager function added none: 0.21 off eager within the training
    length), Gemma 2's ``softcap`` and GPT-OSS's attention sinks (``s_aux``: 0.097 off with either function)
    change the weights: the first forward raises one ValueError naming the argument and what to use."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, GptOssConfig, GptOssForCausalLM

    ids = random_ids(1, 12)
    t5 = tiny_t5("entropy_invariant_eager")
    if stock_attention.dispatches_attention(t5):  # T5 passes position_bias to the attention interface
        with pytest.raises(ValueError, match=r"does not compute a relative position bias \(T5's "
                                             r"position_bias\).*use attn_implementation='entropy_invariant', "
                                             r"which adds it"):
            t5_logits(t5, ids)
        torch.testing.assert_close(t5_logits(tiny_t5("entropy_invariant"), ids),
                                   t5_logits(tiny_t5("eager"), ids),
                                   atol=1e-5, rtol=1e-5)  # the SDPA function adds it: unchanged within L
    shared = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2}
    gemma = Gemma2ForCausalLM(Gemma2Config(**shared, head_dim=8, attn_logit_softcapping=1.0)).eval()
    sinks = GptOssForCausalLM(GptOssConfig(**shared, num_local_experts=2, num_experts_per_tok=1)).eval()
    for model, what in ((gemma, "softcap"), (sinks, "s_aux")):
        for implementation in ("entropy_invariant", "entropy_invariant_eager"):
            model.set_attn_implementation(implementation)
            with pytest.raises(ValueError, match=rf"{implementation}' does not compute .*{what}.*the "
                                                 r"model's own attention \(attn_implementation='eager'\)"):
                with torch.no_grad():
                    model(input_ids=ids)


def test_configure_log_n_scales_the_sub_configs_that_run_it_and_reads_through_peft() -> None:
    """A vision-language model whose text model alone runs the scaled attention (the vision tower keeps
    SDPA): its text config is set and its top config, which says "sdpa", is not refused; a PeftModel is
    configured through its base model; the new attention arguments are refused too (``sinks``)."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, image_size=16, patch_size=8)
    config = LlavaConfig(text_config=text, vision_config=vision, image_token_id=96)
    model = LlavaForConditionalGeneration(config)
    model.set_attn_implementation({"text_config": "entropy_invariant", "vision_config": "sdpa"})
    assert stock_attention.configure_log_n(model, base_length=8) >= 1
    assert model.config.text_config.base_length == 8
    assert getattr(model.config.vision_config, "base_length", None) is None
    peft = pytest.importorskip("peft")
    llama = tiny_llama()
    wrapped = peft.get_peft_model(llama, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert stock_attention.configure_log_n(wrapped, base_length=12) == 1 and llama.config.base_length == 12
    with pytest.raises(ValueError, match=r"does not compute attention sinks \(sinks\)"):
        stock_attention.check_computed(stock_attention.ENTROPY_INVARIANT, stock_attention.UNCOMPUTED,
                                       {"sinks": torch.zeros(4), "position_ids": None})


def test_a_model_whose_source_cannot_be_read_is_not_refused(monkeypatch) -> None:
    """A model defined in a notebook or at the prompt has no source to read: it may dispatch through
    ALL_ATTENTION_FUNCTIONS, so configure_log_n does not refuse it (Bloom, whose source is read, is)."""
    from transformers import BloomConfig, BloomForCausalLM

    bloom = BloomForCausalLM(BloomConfig(vocab_size=97, hidden_size=32, n_layer=1, n_head=4))
    assert not stock_attention.dispatches_attention(bloom)

    def unreadable(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(stock_attention.inspect, "getsource", unreadable)
    assert stock_attention.dispatches_attention(bloom)
