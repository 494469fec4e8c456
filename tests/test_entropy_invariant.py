"""Behaviour of the entropy-invariant family: scaling, masks, kernels, cache, errors, round trips."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    EntropyInvariantForMaskedLM,
    EntropyInvariantForSequenceClassification,
    EntropyInvariantModel,
)
from tests import properties
from tests.remote_code import assert_standalone_code
from tests.utils import clone_with_config, random_ids, right_padded

SCALES = ["standard", "entropy_invariant", "ssmax"]


def tiny_config(**overrides) -> EntropyInvariantConfig:
    values = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        base_length=8,
        entropy_min_length=2,
    )
    values.update(overrides)
    return EntropyInvariantConfig(**values)


def tiny(model_class=EntropyInvariantModel, implementation: str = "sdpa", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = tiny_config(**overrides)
    config._attn_implementation = implementation
    return model_class(config).eval()


# ---------------------------------------------------------------------- per-layer position schemes
HYBRID = {"no_rope_layers": [1, 0], "attention_scale_layers": "no_rope"}


@pytest.mark.parametrize("model_class", [EntropyInvariantModel, EntropyInvariantForCausalLM])
def test_no_rope_layers_of_zeros_is_no_position_embedding_and_of_ones_is_rope(model_class) -> None:
    model = tiny(model_class, attention_scale="entropy_invariant")
    ids, mask = right_padded(random_ids(2, 10), [10, 6])
    rope = properties.hidden(model, ids, mask)
    torch.testing.assert_close(properties.hidden(clone_with_config(model, no_rope_layers=[1, 1]), ids, mask),
                               rope)
    nope = properties.hidden(clone_with_config(model, no_rope_layers=[0, 0]), ids, mask)
    torch.testing.assert_close(
        nope, properties.hidden(clone_with_config(model, position_embedding_type="none"), ids, mask))
    assert not torch.allclose(nope, rope, atol=1e-3)


def test_no_rope_scale_layers_apply_the_factor_on_the_nope_layers_only() -> None:
    model = tiny(EntropyInvariantForCausalLM, attention_scale="entropy_invariant", **HYBRID)
    ids = random_ids(2, 12)
    standard = clone_with_config(model, attention_scale="standard", attention_scale_layers="all")
    everywhere = clone_with_config(model, attention_scale_layers="all")
    with torch.no_grad():
        states = {name: m(ids, output_hidden_states=True).hidden_states
                  for name, m in (("hybrid", model), ("standard", standard), ("everywhere", everywhere))}
    # Layer 0 has RoPE, so it is standard attention; layer 1 has none, so it is scaled.
    torch.testing.assert_close(states["hybrid"][1], states["standard"][1])
    assert not torch.allclose(states["hybrid"][1], states["everywhere"][1], atol=1e-4)
    assert not torch.allclose(states["hybrid"][2], states["standard"][2], atol=1e-4)
    # With every layer RoPE, attention_scale_layers="no_rope" scales nothing.
    all_rope = clone_with_config(model, no_rope_layers=[1, 1])
    torch.testing.assert_close(properties.hidden(all_rope, ids),
                               properties.hidden(clone_with_config(standard, no_rope_layers=[1, 1]), ids))


def test_ssmax_scales_exist_only_in_the_layers_they_scale() -> None:
    model = tiny(EntropyInvariantModel, attention_scale="ssmax", **HYBRID)
    assert model.layers[0].self_attn.ssmax_scale is None
    assert model.layers[1].self_attn.ssmax_scale is not None


@pytest.mark.parametrize(("fields", "message"), [
    ({"no_rope_layers": [1]}, "no_rope_layers must be a list of num_hidden_layers=2"),
    ({"no_rope_layers": [1, 2]}, "each 1 \\(RoPE\\) or 0"),
    ({"no_rope_layers": [True, False]}, "no_rope_layers must be a list"),
    ({"no_rope_layers": [1, 0], "position_embedding_type": "absolute"},
     "needs position_embedding_type='rope'"),
    ({"attention_scale_layers": "no_rope"}, "set no_rope_layers"),
    ({"attention_scale_layers": "rope"}, "attention_scale_layers must be one of"),
])
def test_bad_per_layer_schemes_raise_one_error_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_config(**fields)


def test_no_rope_layers_round_trip_through_save_and_auto_class(tmp_path) -> None:
    model = tiny(EntropyInvariantForCausalLM, attention_scale="ssmax", **HYBRID)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.no_rope_layers == [1, 0] and loaded.config.attention_scale_layers == "no_rope"
    ids = random_ids(2, 9)
    torch.testing.assert_close(properties.hidden(loaded, ids), properties.hidden(model, ids))


# -------------------------------------------------------------------------------------- scaling
def test_beyond_scope_is_standard_attention_up_to_base_length() -> None:
    """``entropy_invariant_scope="beyond"``: causal rows seeing ≤ base_length keys are standard attention."""
    model = tiny(EntropyInvariantForCausalLM, entropy_invariant_scope="beyond", base_length=8)
    standard = clone_with_config(model, attention_scale="standard")
    ids = random_ids(2, 12)
    scaled, reference = properties.hidden(model, ids), properties.hidden(standard, ids)
    torch.testing.assert_close(scaled[:, :8], reference[:, :8], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(scaled[:, 8:], reference[:, 8:], atol=1e-4)


def test_packed_sequences_without_a_mask_follow_their_positions() -> None:
    """Positions that restart (packed sequences, no mask): nᵢ = position + 1 and a block mask from the
    positions, so the second sequence is computed as if alone."""
    model = tiny(EntropyInvariantForCausalLM, base_length=4, entropy_min_length=1)
    first, second = random_ids(1, 7, seed=1), random_ids(1, 6, seed=2)
    positions = torch.cat([torch.arange(7), torch.arange(6)])[None]
    together = properties.hidden(model, torch.cat([first, second], dim=1), position_ids=positions,
                                 use_cache=False)
    torch.testing.assert_close(together[:, 7:], properties.hidden(model, second, use_cache=False), atol=1e-5,
                               rtol=1e-4)


@pytest.mark.parametrize("scale", ["entropy_invariant", "ssmax"])
def test_given_positions_and_the_mask_give_the_same_real_tokens_with_left_padding_and_cache(
    scale: str
) -> None:
    """nᵢ from the caller's positions (``generate``'s cumsum(mask) − 1; they decide when given) equals nᵢ from
    the mask on every real token, in a left-padded prefill and a cached step. No position embedding, so the
    positions act only through nᵢ."""
    model = tiny(EntropyInvariantForCausalLM, attention_scale=scale, position_embedding_type="none",
                 base_length=4, entropy_min_length=1)
    ids, step_ids = random_ids(3, 9), random_ids(3, 1, seed=5)
    mask = torch.ones_like(ids)
    mask[1, :3], mask[2, :6] = 0, 0
    step_mask = torch.cat([mask, torch.ones_like(step_ids)], -1)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    outputs = {}
    with torch.no_grad():
        for given in (True, False):
            prefill = model(ids, attention_mask=mask, use_cache=True,
                            **({"position_ids": positions} if given else {}))
            step_positions = {"position_ids": positions[:, -1:] + 1} if given else {}
            step = model(step_ids, attention_mask=step_mask, past_key_values=prefill.past_key_values,
                         **step_positions)
            outputs[given] = (prefill.logits, step.logits)
    real = mask.bool()
    torch.testing.assert_close(outputs[True][0][real], outputs[False][0][real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(outputs[True][1], outputs[False][1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_class", [EntropyInvariantModel, EntropyInvariantForCausalLM])
def test_entropy_invariant_equals_standard_when_base_length_is_the_input_length(model_class) -> None:
    length = 11
    causal = model_class is EntropyInvariantForCausalLM
    # In a causal stack only the last query has nᵢ = base_length; one layer keeps the other rows out of it.
    model = tiny(model_class, attention_scale="standard", num_hidden_layers=1 if causal else 2)
    scaled = clone_with_config(model, attention_scale="entropy_invariant", base_length=length,
                               entropy_min_length=1)
    ids = random_ids(2, length)
    if not causal:
        assert torch.allclose(properties.hidden(model, ids), properties.hidden(scaled, ids), atol=1e-5)
    else:
        assert torch.allclose(properties.hidden(model, ids)[:, -1], properties.hidden(scaled, ids)[:, -1],
                              atol=1e-5)
        assert not torch.allclose(properties.hidden(model, ids)[:, 1], properties.hidden(scaled, ids)[:, 1],
                                  atol=1e-4)


def test_entropy_invariant_differs_from_standard_at_other_lengths() -> None:
    model = tiny(attention_scale="standard")
    scaled = clone_with_config(model, attention_scale="entropy_invariant", base_length=64)
    ids = random_ids(2, 11)
    assert not torch.allclose(properties.hidden(model, ids), properties.hidden(scaled, ids), atol=1e-4)


def test_ssmax_starts_equal_to_entropy_invariant_and_its_scale_is_learnable() -> None:
    model = tiny(attention_scale="entropy_invariant")
    ssmax = clone_with_config(model, attention_scale="ssmax")
    ids = random_ids(2, 13)
    assert torch.allclose(properties.hidden(model, ids), properties.hidden(ssmax, ids), atol=1e-5)
    scale = ssmax.layers[0].self_attn.ssmax_scale
    assert scale.shape == (4,) and scale.requires_grad
    assert torch.allclose(scale, torch.full((4,), 1 / math.log(8)))
    ssmax.train()
    ssmax(input_ids=ids).last_hidden_state.sum().backward()
    assert scale.grad is not None and scale.grad.abs().sum() > 0


def test_factor_uses_keys_seen_not_padded_length() -> None:
    """The factor at a padded row must use its real length: compare with an explicit computation."""
    model = tiny(attention_scale="entropy_invariant", num_hidden_layers=1)
    attention = model.layers[0].self_attn
    ids, mask = right_padded(random_ids(1, 10), [6])
    counts_seen = {}
    original = attention.logit_scale

    def spy(key_counts):
        counts_seen["value"] = key_counts
        return original(key_counts)

    attention.logit_scale = spy
    properties.hidden(model, ids, mask)
    assert counts_seen["value"].tolist() == [[6.0] * 10]


# -------------------------------------------------------------------------------------- masks & kernels
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_padding_invariance_bidirectional(scale: str, implementation: str) -> None:
    properties.assert_padding_invariant(tiny(attention_scale=scale, implementation=implementation))


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("left", [False, True])
def test_padding_invariance_causal(scale: str, left: bool) -> None:
    model = tiny(EntropyInvariantForCausalLM, attention_scale=scale)
    properties.assert_padding_invariant(model, left=left)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("model_class", [EntropyInvariantModel, EntropyInvariantForCausalLM])
def test_eager_equals_sdpa(scale: str, model_class) -> None:
    eager = tiny(model_class, implementation="eager", attention_scale=scale)
    sdpa = clone_with_config(eager, attn_implementation="sdpa")
    assert sdpa.config._attn_implementation == "sdpa"
    ids, mask = right_padded(random_ids(3, 12), [12, 9, 5])
    assert torch.allclose(properties.hidden(eager, ids, mask), properties.hidden(sdpa, ids, mask), atol=1e-5)
    assert torch.allclose(properties.hidden(eager, ids), properties.hidden(sdpa, ids), atol=1e-5)


@pytest.mark.parametrize("scale", SCALES)
def test_causal_model_does_not_see_the_future(scale: str) -> None:
    properties.assert_no_future_leakage(tiny(EntropyInvariantForCausalLM, attention_scale=scale))


def test_bidirectional_model_does_see_the_future() -> None:
    model = tiny()
    ids = random_ids(1, 8)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] % 90) + 1
    assert not torch.allclose(properties.hidden(model, ids)[:, 0], properties.hidden(model, changed)[:, 0])


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_cache_equals_full_forward(scale: str, implementation: str) -> None:
    model = tiny(EntropyInvariantForCausalLM, implementation=implementation, attention_scale=scale)
    properties.assert_cache_matches_full_forward(model, padded=False)
    properties.assert_cache_matches_full_forward(model, padded=True)


@pytest.mark.parametrize("position_embedding_type", ["rope", "absolute", "none"])
def test_generate_is_greedy_argmax(position_embedding_type: str) -> None:
    model = tiny(EntropyInvariantForCausalLM, position_embedding_type=position_embedding_type)
    properties.assert_generate_matches_greedy_full_forward(model)
    assert model.generation_config.min_length in (None, 0), "config.min_length leaked into generation"


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("norm", [("layernorm", "pre"), ("rmsnorm", "post"), ("scalenorm", "pre")])
def test_bf16_and_all_padding_rows_are_finite(scale: str, norm: tuple[str, str]) -> None:
    model = tiny(attention_scale=scale, norm_type=norm[0], norm_position=norm[1])
    properties.assert_finite_bf16_and_all_padding(model)
    causal = tiny(EntropyInvariantForCausalLM, attention_scale=scale, norm_type=norm[0],
                  norm_position=norm[1])
    properties.assert_finite_bf16_and_all_padding(causal)


def test_all_padding_row_gives_same_output_in_eager_and_sdpa() -> None:
    eager = tiny(implementation="eager")
    sdpa = clone_with_config(eager, attn_implementation="sdpa")
    ids = random_ids(2, 6)
    mask = torch.ones_like(ids)
    mask[1] = 0
    assert torch.allclose(properties.hidden(eager, ids, mask), properties.hidden(sdpa, ids, mask), atol=1e-5)


def test_attention_weights_are_returned_in_eager_mode() -> None:
    model = tiny(implementation="eager", attention_scale="entropy_invariant")
    ids, mask = right_padded(random_ids(2, 7), [7, 4])
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 7, 7)
    assert len(out.hidden_states) == 3
    weights = out.attentions[0]
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 7), atol=1e-5)
    assert torch.all(weights[1, :, :, 4:] == 0)


def test_gradient_checkpointing_gives_same_gradients() -> None:
    ids = random_ids(2, 9)
    grads = []
    for checkpointing in (False, True):
        model = tiny(EntropyInvariantForMaskedLM, attention_scale="ssmax")
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


# -------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("attention_scale", "linear"),
        ("base_length", 1),
        ("entropy_min_length", 0),
        ("position_embedding_type", "alibi"),
        ("norm_type", "batchnorm"),
        ("norm_position", "middle"),
        ("hidden_act", "nope"),
        ("hidden_dropout_prob", 1.5),
        ("attention_probs_dropout_prob", -0.1),
        ("num_attention_heads", 0),
        ("num_attention_heads", 5),
        ("intermediate_size", 0),
        ("vocab_size", 0),
        ("initializer_range", -1.0),
        ("pruned_heads", {0: [7]}),
    ],
)
def test_bad_config_values_raise_value_error_naming_the_field(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})


@pytest.mark.parametrize(("field", "value"),
                         [("hidden_size", "32"), ("base_length", 5.5), ("use_bias", "yes")])
def test_bad_config_types_raise_type_error_naming_the_field(field: str, value) -> None:
    with pytest.raises(TypeError, match=field):
        tiny_config(**{field: value})


def test_bad_inputs_raise_clear_errors() -> None:
    model = tiny(position_embedding_type="absolute", max_position_embeddings=16)
    with pytest.raises(ValueError, match="vocab_size"):
        model(input_ids=torch.tensor([[1, 2, 500]]))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=random_ids(1, 17))
    with pytest.raises(ValueError, match="Empty input"):
        model(input_ids=torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="exactly one"):
        model()
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=random_ids(1, 5), attention_mask=torch.ones(1, 4))


# -------------------------------------------------------------------------------------- HF integration
def test_readme_snippet_save_and_reload_with_auto_class(tmp_path) -> None:
    config = EntropyInvariantConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    model = EntropyInvariantForMaskedLM(config).eval()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is EntropyInvariantForMaskedLM
    ids = random_ids(2, 10, vocab=1000)
    assert torch.allclose(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)
    assert AutoConfig.from_pretrained(tmp_path).attention_scale == "entropy_invariant"
    assert type(AutoModel.from_pretrained(tmp_path)) is EntropyInvariantModel


def test_saved_folder_has_code_and_full_auto_map(tmp_path) -> None:
    tiny(EntropyInvariantForSequenceClassification).save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert_standalone_code(tmp_path, "entropy_invariant")
    auto_map = AutoConfig.from_pretrained(tmp_path).auto_map
    assert set(auto_map) == {
        "AutoConfig",
        "AutoModel",
        "AutoModelForMaskedLM",
        "AutoModelForCausalLM",
        "AutoModelForSequenceClassification",
        "AutoModelForTokenClassification",
        "AutoModelForQuestionAnswering",
    }


def test_causal_checkpoint_reloads_as_causal_and_keeps_ssmax(tmp_path) -> None:
    model = tiny(EntropyInvariantForCausalLM, attention_scale="ssmax")
    with torch.no_grad():
        model.model.layers[1].self_attn.ssmax_scale.mul_(1.7)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.is_decoder and reloaded.model.is_causal
    ids = random_ids(2, 9)
    assert torch.allclose(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)


def test_causal_head_does_not_mutate_the_callers_config() -> None:
    config = tiny_config()
    model = EntropyInvariantForCausalLM(config)
    assert model.config.is_decoder and not config.is_decoder
