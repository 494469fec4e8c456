"""Behaviour of the Synthesizer family: components, mixing, masks, cache, limits, Fixed Random, pruning."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, DynamicCache

from hf_attn_variants import (
    EntropyInvariantModel,
    SynthesizerConfig,
    SynthesizerForCausalLM,
    SynthesizerForMaskedLM,
    SynthesizerForSequenceClassification,
    SynthesizerModel,
)
from hf_attn_variants.models.configuration_synthesizer import SYNTHESIZER_COMPONENTS, balanced_factorization
from hf_attn_variants.models.modeling_synthesizer import SynthesizerAttention
from hf_attn_variants.pruning.adapters import prune_attention_heads
from tests import properties
from tests.remote_code import assert_standalone_code
from tests.test_entropy_invariant import tiny_config as ei_tiny_config
from tests.utils import left_padded, random_ids, right_padded

LENGTH = 16  # l = max_position_embeddings of the tiny models
MIXTURES = [[name] for name in SYNTHESIZER_COMPONENTS] + [["random", "vanilla"], list(SYNTHESIZER_COMPONENTS)]
MIXTURE_IDS = ["+".join(m) for m in MIXTURES]


def tiny_config(**overrides) -> SynthesizerConfig:
    values = {
        "vocab_size": 97,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": LENGTH,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "factorized_random_rank": 4,
        "random_init_std": 0.5,  # peaked enough that position-dependent bugs show up in the outputs
    }
    values.update(overrides)
    return SynthesizerConfig(**values)


def tiny(model_class=SynthesizerModel, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return model_class(tiny_config(**overrides)).eval()


def attention_weights(model, ids, mask=None, layer: int = 0) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[layer]


def capture_attention_input(model, ids) -> torch.Tensor:
    """The hidden states entering layer 0's attention (after the pre-norm)."""
    seen = {}
    attention = model.layers[0].self_attn

    def hook(_module, args, _kwargs) -> None:
        seen.setdefault("x", args[0])

    handle = attention.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    return seen["x"]


# -------------------------------------------------------------------------------------- config
def test_config_defaults() -> None:
    config = SynthesizerConfig()
    assert config.model_type == "synthesizer"
    assert config.synthesizer_components == ["random", "vanilla"]
    assert config.random_trainable is True and config.factorized_random_rank == 8
    assert config.resolved_factorized_dense_shape == [16, 32]  # l = 512
    assert config.resolved_dense_hidden_size == config.head_dim
    assert config.resolved_random_init_std == config.initializer_range


@pytest.mark.parametrize(
    ("length", "shape"), [(512, [16, 32]), (64, [8, 8]), (12, [3, 4]), (13, [1, 13]), (1, [1, 1])]
)
def test_balanced_factorization(length: int, shape: list[int]) -> None:
    assert balanced_factorization(length) == shape


def test_config_round_trip_keeps_synthesizer_fields(tmp_path) -> None:
    config = tiny_config(
        synthesizer_components=("dense", "factorized_dense"),
        factorized_dense_shape=[2, 8],
        random_trainable=False,
    )
    assert config.synthesizer_components == ["dense", "factorized_dense"]
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, SynthesizerConfig)
    assert loaded.synthesizer_components == ["dense", "factorized_dense"]
    assert loaded.factorized_dense_shape == [2, 8] and loaded.random_trainable is False


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("synthesizer_components", []),
        ("synthesizer_components", ["dense", "attention"]),
        ("synthesizer_components", ["random", "random"]),
        ("factorized_dense_shape", [3, 5]),
        ("factorized_dense_shape", [16]),
        ("factorized_dense_shape", [0, 16]),
        ("factorized_random_rank", 0),
        ("dense_hidden_size", 0),
        ("random_init_std", -1.0),
        ("num_attention_heads", 5),
        ("position_embedding_type", "alibi"),
        ("pruned_heads", {0: [9]}),
        ("no_rope_layers", [1, 0]),  # per-layer RoPE is the entropy-invariant family's: refused, not ignored
    ],
)
def test_bad_config_values_raise_value_error_naming_the_field(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("random_trainable", "no"),
        ("factorized_random_rank", 2.5),
        ("dense_hidden_size", "8"),
        ("factorized_dense_shape", [2.0, 8]),
        ("synthesizer_components", "random"),
        ("synthesizer_components", {"random": 1}),
    ],
)
def test_bad_config_types_raise_type_error_naming_the_field(field: str, value) -> None:
    with pytest.raises(TypeError, match=field):
        tiny_config(**{field: value})


# -------------------------------------------------------------------------------------- components
def test_random_weights_are_softmax_of_the_sliced_matrix() -> None:
    model = tiny(synthesizer_components=["random"])
    ids = random_ids(2, 9)
    weights = attention_weights(model, ids)
    matrix = model.layers[0].self_attn.random_matrix
    expected = matrix[:, :9, :9].softmax(-1).expand(2, -1, -1, -1)
    assert torch.allclose(weights, expected, atol=1e-6)


def test_factorized_random_weights_are_softmax_of_the_low_rank_product() -> None:
    model = tiny(synthesizer_components=["factorized_random"])
    ids = random_ids(1, 7)
    attention = model.layers[0].self_attn
    assert attention.random_left.shape == (4, LENGTH, 4)
    product = attention.random_left @ attention.random_right.transpose(-1, -2)
    assert torch.allclose(attention_weights(model, ids)[0], product[:, :7, :7].softmax(-1), atol=1e-6)


def test_dense_weights_follow_the_two_layer_formula() -> None:
    model = tiny(synthesizer_components=["dense"])
    ids = random_ids(1, 6)
    x = capture_attention_input(model, ids)[0]  # (n, d)
    dense = model.layers[0].self_attn.dense
    expected = []
    for head in range(4):
        scores = torch.relu(x @ dense.w1[head] + dense.b1[head]) @ dense.w2[head] + dense.b2[head]  # (n, l)
        expected.append(scores[:, :6].softmax(-1))
    assert torch.allclose(attention_weights(model, ids)[0], torch.stack(expected), atol=1e-6)


def test_factorized_dense_is_the_flattened_outer_product_of_the_two_branches() -> None:
    model = tiny(synthesizer_components=["factorized_dense"], factorized_dense_shape=[4, 4])
    ids = random_ids(1, 11)
    x = capture_attention_input(model, ids)[0]
    attention = model.layers[0].self_attn
    a_scores = attention.factor_a(x[None])[0]  # (heads, n, a)
    b_scores = attention.factor_b(x[None])[0]  # (heads, n, b)
    full = (a_scores[..., :, None] * b_scores[..., None, :]).flatten(-2)  # (heads, n, a·b = l)
    j = 6  # key 6 = (6 // 4, 6 % 4) = (1, 2)
    assert torch.allclose(full[..., j], a_scores[..., 1] * b_scores[..., 2])
    assert torch.allclose(attention_weights(model, ids)[0], full[..., :11].softmax(-1), atol=1e-6)


def test_vanilla_only_equals_standard_softmax_attention() -> None:
    """Same weights as EntropyInvariantModel(attention_scale="standard"): the two must agree exactly."""
    torch.manual_seed(0)
    reference_config = ei_tiny_config(attention_scale="standard")
    reference_config._attn_implementation = "eager"
    reference = EntropyInvariantModel(reference_config).eval()
    model = tiny(synthesizer_components=["vanilla"])
    model.load_state_dict(reference.state_dict())
    ids, mask = right_padded(random_ids(2, 10), [10, 6])
    assert torch.allclose(
        properties.hidden(model, ids, mask), properties.hidden(reference, ids, mask), atol=1e-5
    )


def test_synthesized_components_have_no_query_key_projections() -> None:
    for components in (["dense"], ["random"], ["factorized_dense", "factorized_random"]):
        attention = tiny(synthesizer_components=components).layers[0].self_attn
        assert attention.q_proj is None and attention.k_proj is None
        assert not any("q_proj" in n or "k_proj" in n for n, _ in attention.named_parameters())
    attention = tiny(synthesizer_components=["random", "vanilla"]).layers[0].self_attn
    assert attention.q_proj is not None and attention.k_proj is not None


def _expected_attention_params(config: SynthesizerConfig) -> int:
    """The per-layer formula of docs/synthesizer.md (with biases)."""
    d, h, dh, length, k = 32, 4, 8, LENGTH, config.factorized_random_rank
    e = config.resolved_dense_hidden_size
    a, b = config.resolved_factorized_dense_shape
    counts = {
        "vanilla": 2 * (d * h * dh + h * dh),
        "dense": h * (d * e + e + e * length + length),
        "factorized_dense": h * (2 * (d * e + e) + e * (a + b) + a + b),
        "random": h * length * length if config.random_trainable else 0,
        "factorized_random": 2 * h * length * k if config.random_trainable else 0,
    }
    components = config.synthesizer_components
    mixing = len(components) if len(components) > 1 else 0
    return (d * h * dh + h * dh) + (h * dh * d + d) + sum(counts[c] for c in components) + mixing


@pytest.mark.parametrize("components", MIXTURES, ids=MIXTURE_IDS)
@pytest.mark.parametrize("trainable", [True, False])
def test_parameter_count_matches_the_documented_formula(components: list[str], trainable: bool) -> None:
    config = tiny_config(synthesizer_components=components, random_trainable=trainable, dense_hidden_size=6)
    attention = SynthesizerAttention(config, 0)
    assert sum(p.numel() for p in attention.parameters()) == _expected_attention_params(config)


# -------------------------------------------------------------------------------------- mixing
def test_mixing_weights_sum_to_one_per_layer_and_stay_normalised_after_training() -> None:
    model = tiny(SynthesizerForMaskedLM, synthesizer_components=list(SYNTHESIZER_COMPONENTS))
    alpha = model.mixing_weights()
    assert alpha.shape == (2, 5) and torch.allclose(alpha, torch.full((2, 5), 0.2))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    ids = random_ids(4, 12)
    for _ in range(3):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        assert model.model.layers[0].self_attn.mixing_logits.grad.abs().sum() > 0
        optimizer.step()
    alpha = model.mixing_weights()
    assert torch.allclose(alpha.sum(-1), torch.ones(2), atol=1e-6)
    assert not torch.allclose(alpha, torch.full((2, 5), 0.2), atol=1e-4), "mixing weights did not learn"
    assert (alpha > 0).all()


def test_single_component_has_weight_one_and_no_mixing_parameter() -> None:
    model = tiny(synthesizer_components=["dense"])
    assert model.layers[0].self_attn.mixing_logits is None
    assert torch.equal(model.mixing_weights(), torch.ones(2, 1))


def test_mixture_logits_are_the_alpha_weighted_sum() -> None:
    """With α ≈ (1, 0) the mixture equals the random-only model; in general rows are a convex mix of
    logits."""
    mixture = tiny(synthesizer_components=["random", "vanilla"])
    single = tiny(synthesizer_components=["random"])
    state = {
        k: v
        for k, v in mixture.state_dict().items()
        if "q_proj" not in k and "k_proj" not in k and "mixing" not in k
    }
    single.load_state_dict(state)
    for layer in mixture.layers:
        layer.self_attn.mixing_logits.data = torch.tensor([30.0, -30.0])
    ids = random_ids(2, 9)
    assert torch.allclose(properties.hidden(mixture, ids), properties.hidden(single, ids), atol=1e-5)
    # general α: log-weights of the mixture = α₁·random + α₂·vanilla up to a per-row constant
    logits = torch.tensor([0.4, -0.3])
    mixture.layers[0].self_attn.mixing_logits.data = logits
    alpha = logits.softmax(-1)
    attention = mixture.layers[0].self_attn
    x = capture_attention_input(mixture, ids)
    with torch.no_grad():
        q = attention.q_proj(x).view(2, 9, 4, 8).transpose(1, 2)
        k = attention.k_proj(x).view(2, 9, 4, 8).transpose(1, 2)
        cos, sin = mixture.rotary_emb(torch.arange(9)[None].expand(2, -1), x.dtype)
        from hf_attn_variants.models.layers import apply_rotary

        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        vanilla = q @ k.transpose(-1, -2) / 8**0.5
        expected = (alpha[0] * attention.random_matrix[:, :9, :9] + alpha[1] * vanilla).softmax(-1)
    assert torch.allclose(attention_weights(mixture, ids), expected, atol=1e-5)


# -------------------------------------------------------------------------------------- masks & positions
@pytest.mark.parametrize("components", MIXTURES, ids=MIXTURE_IDS)
@pytest.mark.parametrize("left", [False, True])
def test_padding_invariance_bidirectional(components: list[str], left: bool) -> None:
    properties.assert_padding_invariant(tiny(synthesizer_components=components), left=left)


@pytest.mark.parametrize("components", MIXTURES, ids=MIXTURE_IDS)
@pytest.mark.parametrize("left", [False, True])
def test_padding_invariance_causal(components: list[str], left: bool) -> None:
    properties.assert_padding_invariant(
        tiny(SynthesizerForCausalLM, synthesizer_components=components), left=left
    )


def test_positions_are_counted_from_the_first_real_token() -> None:
    """Right padding keeps absolute indices (sliced path); left padding shifts each row by its padding; a
    prepared 4D mask over a static cache's 7 slots gives the same positions for the real keys."""
    assert SynthesizerModel._positions(None, 0, 4, 4) is None
    _, right = right_padded(random_ids(2, 5), [5, 3])
    assert SynthesizerModel._positions(right, 0, 5, 5) is None
    _, left = left_padded(random_ids(2, 5), [5, 3])
    queries, keys = SynthesizerModel._positions(left, 3, 2, 5)
    assert keys.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]
    assert queries.tolist() == [[3, 4], [1, 2]]
    slots = torch.zeros(2, 1, 2, 7, dtype=torch.bool)
    slots[:, 0, 0, :4], slots[:, 0, 1, :5] = True, True
    slots[1, :, :, :2] = False  # row 1: two padding tokens first
    queries, keys = SynthesizerModel._positions(slots, 3, 2, 5)
    assert keys[:, :5].tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]] and keys.shape == (2, 7)
    assert queries.tolist() == [[3, 4], [1, 2]]


def test_absolute_index_would_break_left_padding(monkeypatch) -> None:
    """Guard that the left-padding test has teeth: without the position shift (absolute indices) it fails.

    A prepared 4D mask gets the same shift as the 2D one (its leading hidden keys are the padding)."""
    model = tiny(synthesizer_components=["random"])
    ids, mask = left_padded(random_ids(1, 10), [6])
    mask4d = mask[:, None, None, :].bool().expand(1, 1, 10, 10)
    alone = properties.hidden(model, ids[:, 4:])[0]
    assert torch.allclose(properties.hidden(model, ids, mask)[0, 4:], alone, atol=1e-5)
    assert torch.allclose(properties.hidden(model, ids, mask4d)[0, 4:], alone, atol=1e-5)
    monkeypatch.setattr(SynthesizerModel, "_positions", staticmethod(lambda *args: None))
    assert not torch.allclose(properties.hidden(model, ids, mask)[0, 4:], alone, atol=1e-3)


@pytest.mark.parametrize("components", MIXTURES, ids=MIXTURE_IDS)
def test_causal_model_does_not_see_the_future(components: list[str]) -> None:
    properties.assert_no_future_leakage(tiny(SynthesizerForCausalLM, synthesizer_components=components))


@pytest.mark.parametrize("components", MIXTURES, ids=MIXTURE_IDS)
def test_cache_equals_full_forward(components: list[str]) -> None:
    model = tiny(SynthesizerForCausalLM, synthesizer_components=components)
    properties.assert_cache_matches_full_forward(model, padded=False)
    properties.assert_cache_matches_full_forward(model, padded=True)


@pytest.mark.parametrize(
    "components", [["random", "vanilla"], ["dense"], ["factorized_random"]], ids="+".join
)
def test_generate_is_greedy_argmax(components: list[str]) -> None:
    properties.assert_generate_matches_greedy_full_forward(
        tiny(SynthesizerForCausalLM, synthesizer_components=components)
    )


@pytest.mark.parametrize("components", MIXTURES, ids=MIXTURE_IDS)
def test_bf16_and_all_padding_rows_are_finite(components: list[str]) -> None:
    properties.assert_finite_bf16_and_all_padding(tiny(synthesizer_components=components))
    properties.assert_finite_bf16_and_all_padding(
        tiny(SynthesizerForCausalLM, synthesizer_components=components)
    )


@pytest.mark.parametrize("norm", [("rmsnorm", "post"), ("scalenorm", "pre")])
def test_bf16_finite_with_other_norms(norm: tuple[str, str]) -> None:
    model = tiny(
        synthesizer_components=list(SYNTHESIZER_COMPONENTS), norm_type=norm[0], norm_position=norm[1]
    )
    properties.assert_finite_bf16_and_all_padding(model)


@pytest.mark.parametrize("model_class", [SynthesizerModel, SynthesizerForCausalLM])
def test_output_attentions_returns_the_mixed_weights(model_class) -> None:
    model = tiny(model_class, synthesizer_components=["dense", "random", "vanilla"])
    ids, mask = right_padded(random_ids(3, 7), [7, 4, 0])
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3
    weights = out.attentions[1]
    assert weights.shape == (3, 4, 7, 7)
    assert torch.allclose(weights[:2, :, :4].sum(-1), torch.ones(2, 4, 4), atol=1e-5)
    assert torch.all(weights[1, :, :, 4:] == 0), "padded keys got weight"
    assert torch.all(weights[2] == 0), "an all-padding row must give zeros, not NaN"
    if model_class is SynthesizerForCausalLM:
        assert torch.all(weights[0].triu(1) == 0), "causal mask not applied to the mixed logits"


# -------------------------------------------------------------------------------------- length limit
@pytest.mark.parametrize("components", [["vanilla"], ["random", "vanilla"], ["dense"]], ids="+".join)
def test_too_long_input_raises_value_error_naming_the_limit(components: list[str]) -> None:
    model = tiny(synthesizer_components=components)
    properties.hidden(model, random_ids(1, LENGTH))  # exactly l is fine
    with pytest.raises(ValueError, match=rf"{LENGTH + 1}.*max_position_embeddings={LENGTH}"):
        model(input_ids=random_ids(1, LENGTH + 1))


def test_too_long_during_incremental_decoding_raises_value_error() -> None:
    model = tiny(SynthesizerForCausalLM)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=random_ids(1, LENGTH - 1), past_key_values=cache, use_cache=True)
        out = model(input_ids=random_ids(1, 1), past_key_values=out.past_key_values, use_cache=True)  # = l
        with pytest.raises(
            ValueError, match=rf"{LENGTH + 1} \(past \+ new.*max_position_embeddings={LENGTH}"
        ):
            model(input_ids=random_ids(1, 1), past_key_values=out.past_key_values, use_cache=True)


# -------------------------------------------------------------------------------------- Fixed Random
@pytest.mark.parametrize("components", [["random"], ["factorized_random", "vanilla"]], ids="+".join)
def test_fixed_random_is_a_buffer_untouched_by_an_optimizer_step_and_reloads_exactly(
    components, tmp_path
) -> None:
    model = tiny(SynthesizerForMaskedLM, synthesizer_components=components, random_trainable=False)
    names = [n for n, _ in model.named_buffers() if "random_" in n]
    assert names and not any("random_" in n for n, _ in model.named_parameters())
    frozen = {n: b.clone() for n, b in model.named_buffers() if "random_" in n}
    other = model.model.layers[0].self_attn.v_proj.weight.detach().clone()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = random_ids(2, 10)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    buffers = dict(model.named_buffers())
    assert all(torch.equal(buffers[n], frozen[n]) for n in names)
    assert not torch.equal(model.model.layers[0].self_attn.v_proj.weight, other), (
        "the step changed nothing at all"
    )

    model.eval().save_pretrained(tmp_path)
    reloaded = SynthesizerForMaskedLM.from_pretrained(tmp_path).eval()  # v5: meta-device build, then load
    reloaded_buffers = dict(reloaded.named_buffers())
    assert all(torch.equal(reloaded_buffers[n], frozen[n]) for n in names), "the frozen matrix was re-drawn"
    # Same weights, but another model object (other memory alignment): BLAS kernels may differ in the last
    # bit.
    torch.testing.assert_close(properties.hidden(model, ids), properties.hidden(reloaded, ids), atol=1e-6,
                               rtol=1e-5)
    base = AutoModel.from_pretrained(tmp_path)
    assert torch.equal(base.layers[0].self_attn.get_buffer(names[0].split("self_attn.")[1]), frozen[names[0]])


def test_trainable_random_matrix_gets_gradients() -> None:
    model = tiny(SynthesizerForMaskedLM, synthesizer_components=["random", "factorized_random"]).train()
    ids = random_ids(2, 8)
    model(input_ids=ids, labels=ids).loss.backward()
    attention = model.model.layers[0].self_attn
    for tensor in (attention.random_matrix, attention.random_left, attention.random_right):
        assert isinstance(tensor, torch.nn.Parameter) and tensor.grad.abs().sum() > 0
    assert attention.random_matrix.grad[:, 8:].abs().sum() == 0, "rows beyond the sequence were used"


# -------------------------------------------------------------------------------------- pruning
def _zero_heads(model, heads: dict[int, list[int]]):
    """Reference for pruning: the same model with the given heads' outputs zeroed (o_proj columns)."""
    masked = copy.deepcopy(model)
    for layer, removed in heads.items():
        o_proj = masked.layers[layer].self_attn.o_proj
        for head in removed:
            o_proj.weight.data[:, head * 8 : (head + 1) * 8] = 0
    return masked


@pytest.mark.filterwarnings(
    "ignore:Initializing zero-element tensors:UserWarning"
)  # the layer rebuilt with 0 heads
@pytest.mark.parametrize("components", MIXTURES, ids=MIXTURE_IDS)
def test_prune_heads_equals_zeroing_their_outputs(components: list[str]) -> None:
    model = tiny(synthesizer_components=components, use_bias=True)
    removed = {0: [1, 3], 1: [0, 1, 2, 3]}
    reference = _zero_heads(model, removed)
    for layer, heads in removed.items():
        prune_attention_heads(model.layers[layer].self_attn, [h for h in range(4) if h not in heads])
    attention = model.layers[0].self_attn
    assert (
        attention.num_heads == 2
        and attention.v_proj.weight.shape == (16, 32)
        and attention.o_proj.weight.shape == (32, 16)
    )
    for tensor in (attention.random_matrix, attention.random_left, attention.dense and attention.dense.w2):
        if tensor is not None:
            assert tensor.shape[0] == 2
    assert model.layers[1].self_attn.num_heads == 0
    ids, mask = right_padded(random_ids(2, 9), [9, 5])
    out = properties.hidden(model, ids, mask)
    assert torch.allclose(out, properties.hidden(reference, ids, mask), atol=1e-5)
    # a config recording the pruned heads rebuilds the same shapes and loads the weights strictly
    rebuilt = SynthesizerModel(tiny_config(synthesizer_components=components, pruned_heads=removed)).eval()
    rebuilt.load_state_dict(model.state_dict())
    assert torch.allclose(properties.hidden(rebuilt, ids, mask), out, atol=1e-6)


def test_pruned_decoder_with_an_empty_first_layer_keeps_cache_equal_to_full_forward() -> None:
    model = tiny(SynthesizerForCausalLM, synthesizer_components=["dense", "random"])
    prune_attention_heads(model.model.layers[0].self_attn, [])
    prune_attention_heads(model.model.layers[1].self_attn, [2])
    properties.assert_cache_matches_full_forward(model, padded=True)
    with torch.no_grad():
        attentions = model(input_ids=random_ids(1, 5), output_attentions=True).attentions
    assert [tuple(a.shape) for a in attentions] == [(1, 0, 5, 5), (1, 1, 5, 5)], "one entry per layer"


def test_prune_heads_rejects_bad_indices() -> None:
    attention = tiny().layers[0].self_attn
    with pytest.raises(ValueError, match="out of range"):
        prune_attention_heads(attention, [0, 4])
    with pytest.raises(ValueError, match="twice"):
        prune_attention_heads(attention, [1, 1])


def test_fixed_random_buffer_is_pruned_too() -> None:
    model = tiny(synthesizer_components=["random"], random_trainable=False)
    attention = model.layers[0].self_attn
    original = attention.random_matrix.clone()
    prune_attention_heads(attention, [2, 0])
    assert "random_matrix" in dict(attention.named_buffers())
    assert torch.equal(attention.random_matrix, original[[0, 2]])


# -------------------------------------------------------------------------------------- HF integration
def test_gradient_checkpointing_gives_same_gradients() -> None:
    ids = random_ids(2, 9)
    grads = []
    for checkpointing in (False, True):
        model = tiny(SynthesizerForMaskedLM, synthesizer_components=list(SYNTHESIZER_COMPONENTS)).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append(model.model.layers[0].self_attn.dense.w1.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_save_and_reload_with_auto_classes(tmp_path) -> None:
    model = tiny(SynthesizerForCausalLM, synthesizer_components=["factorized_dense", "vanilla"])
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert_standalone_code(tmp_path, "synthesizer")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is SynthesizerForCausalLM and reloaded.model.is_causal
    ids = random_ids(2, 9)
    # Equal weights in two model objects: BLAS may pick other kernels for other memory, so not bit-exact.
    torch.testing.assert_close(model(input_ids=ids).logits, reloaded(input_ids=ids).logits, atol=1e-6,
                               rtol=1e-5)
    torch.testing.assert_close(model.mixing_weights(), reloaded.mixing_weights(), atol=1e-7, rtol=1e-6)


def test_heads_expose_mixing_weights_of_their_base_model() -> None:
    """The head's α are its base model's, layer by layer: softmax of each layer's mixing logits."""
    model = tiny(SynthesizerForSequenceClassification, num_labels=3)
    logits = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    with torch.no_grad():
        for row, attention in zip(logits, [layer.self_attn for layer in model.base_model.layers]):
            attention.mixing_logits.copy_(row)
    torch.testing.assert_close(model.mixing_weights(), logits.softmax(-1))
    torch.testing.assert_close(model.mixing_weights(), model.base_model.mixing_weights())
