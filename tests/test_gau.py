"""Behaviour of the GAU family: the unit against written-out formulas, normalisations, FLASH chunks, cache.

The reference functions below re-derive every quantity from the parameters in float64 with dense
n×n masks — written independently of ``modeling_gau`` (own RoPE, own masks) — so the tests check the
paper's formulas, not the implementation against itself.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, DynamicCache

from hf_attn_variants import (
    FAMILIES,
    GAUConfig,
    GAUForCausalLM,
    GAUForMaskedLM,
    GAUForSequenceClassification,
    GAUModel,
)
from hf_attn_variants.models import gau_kernels
from hf_attn_variants.models.gau_cache import GAUChunkCacheLayer
from hf_attn_variants.models.gau_kernels import flash_effective_weights, flash_mixed_chunk_attention
from hf_attn_variants.models.gau_triton import TRITON_AVAILABLE
from hf_attn_variants.models.modeling_gau import (
    GAU_ATTENTION_PATHS,
    GatedAttentionUnit,
    gau_attention_path,
    gau_attention_weights,
)
from tests import properties
from tests.remote_code import assert_standalone_code
from tests.utils import (
    layer_inputs,
    left_padded,
    needs_triton,
    random_ids,
    right_padded,
    rounding_tolerance,
    saved_bytes,
)

# (attention_normalization, relu2_length): every normalisation, relu² with both lengths.
NORMALIZATIONS = [
    ("softmax", "dynamic"),
    ("softmax_plus", "dynamic"),
    ("relu2", "dynamic"),
    ("relu2", "fixed"),
    ("relu2_normalized", "dynamic"),
    ("laplace", "dynamic"),
    ("laplace", "fixed"),
]
NORM_IDS = ["softmax", "softmax_plus", "relu2_dynamic", "relu2_fixed", "relu2_normalized", "laplace_dynamic",
            "laplace_fixed"]
CHUNKED = [{"relu2_length": "dynamic"}, {"relu2_length": "fixed"}]


def tiny_config(**overrides) -> GAUConfig:
    values = {
        "vocab_size": 97,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "expansion_factor": 2,
        "attention_key_size": 8,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "base_length": 8,
        "entropy_min_length": 2,
    }
    values.update(overrides)
    return GAUConfig(**values)


def sharpen(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draw the unit weights large enough that attention visibly moves the outputs.

    At the paper's initialisation (γ ~ N(0, 0.02)) q·k ≈ 0 and every property would hold trivially.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, GatedAttentionUnit):
                for param, std in ((module.in_proj.weight, 0.3), (module.out_proj.weight, 0.1)):
                    param.copy_(torch.randn(param.shape, generator=generator) * std)
                module.qk_scale.copy_(torch.randn(module.qk_scale.shape, generator=generator))
                module.qk_offset.copy_(torch.randn(module.qk_offset.shape, generator=generator) * 0.2)
    return model


def tiny(model_class=GAUModel, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return sharpen(model_class(tiny_config(**overrides)), seed).eval()


def norm_kwargs(normalization: tuple[str, str]) -> dict:
    return {"attention_normalization": normalization[0], "relu2_length": normalization[1]}


def chunked(chunk_size: int = 4, **overrides) -> dict:
    return {"attention_normalization": "relu2", "chunk_size": chunk_size, **overrides}


# ----------------------------------------------------------------------------------- references
def rope_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoFormer rotation of (x_j, x_{j+s/2}) by p·θ_j, θ_j = theta^(-2j/s), for x of shape (batch, n, s)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    angles = positions.double()[:, None] * freqs
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def unit_parts(unit: GatedAttentionUnit, x: torch.Tensor, theta: float):
    """u, v and the RoPE-rotated rows z·γ_r + β_r of the paper's GAU, in float64."""
    e, s = unit.width, unit.key_size
    hidden = F.silu(x.double() @ unit.in_proj.weight.double().T)
    u, v, z = hidden[..., :e], hidden[..., e : 2 * e], hidden[..., 2 * e :]
    assert z.shape[-1] == s
    positions = torch.arange(x.shape[1])
    rows = [
        rope_reference(z * unit.qk_scale[r].double() + unit.qk_offset[r].double(), positions, theta)
        for r in range(unit.qk_scale.shape[0])
    ]
    return u, v, rows


def reference_quadratic(unit: GatedAttentionUnit, x: torch.Tensor, visible: torch.Tensor, config: GAUConfig):
    """(u ⊙ A v) Wo with A = norm(q kᵀ/√s) (DESIGN §2.2); ``visible`` (batch, n, n) bool."""
    u, v, (q, k) = unit_parts(unit, x, config.rope_theta)
    logits = q @ k.transpose(-1, -2) / math.sqrt(config.attention_key_size)
    counts = visible.sum(-1).double()
    kind = config.attention_normalization
    if kind in ("softmax", "softmax_plus"):
        if kind == "softmax_plus":
            factor = counts.clamp(min=config.entropy_min_length).log() / math.log(config.base_length)
            logits = logits * factor[..., None]
        attention = logits.masked_fill(~visible, -math.inf).softmax(-1).nan_to_num(0.0)
    else:
        if kind == "laplace":  # Mega: 0.5 (1 + erf((a - μ) / (σ √2))), μ = √½, σ = 1/√(4π)
            mu, sigma = math.sqrt(0.5), 1 / math.sqrt(4 * math.pi)
            attention = 0.5 * (1 + torch.erf((logits - mu) / (sigma * math.sqrt(2)))) * visible
        else:
            attention = F.relu(logits) ** 2 * visible
        if kind in ("relu2", "laplace"):
            length = (
                counts.clamp(min=1)
                if config.relu2_length == "dynamic"
                else torch.full_like(counts, config.base_length)
            )
            attention = attention / length[..., None]
        else:
            attention = attention / (attention.sum(-1, keepdim=True) + 1e-6)
    return (u * (attention @ v)) @ unit.out_proj.weight.double().T, attention


def reference_flash(
    unit: GatedAttentionUnit, x: torch.Tensor, valid: torch.Tensor, causal: bool, config: GAUConfig,
    shift: torch.Tensor | None = None,
):
    """FLASH written densely: u ⊙ ([relu(q kᵀ/√s)²]_same chunk + [q' k'ᵀ/√s]_lin) v / L, then Wo.

    lin(i): every valid key (non-causal) or the valid keys of earlier chunks (causal). L: relu² length.
    Row b's chunks start at the columns ≡ shift_b (mod g) (``None``: 0).
    """
    u, v, (q, k, q_lin, k_lin) = unit_parts(unit, x, config.rope_theta)
    n = x.shape[1]
    shift = torch.zeros(x.shape[0], dtype=torch.long) if shift is None else shift
    chunk = (torch.arange(n) - shift[:, None]).div(config.chunk_size, rounding_mode="floor")[:, :, None]
    visible = valid[:, None, :].expand(-1, n, -1)
    if causal:
        visible = visible & torch.ones(n, n, dtype=torch.bool).tril()
    scale = math.sqrt(config.attention_key_size)
    quad = F.relu(q @ k.transpose(-1, -2) / scale) ** 2 * (visible & (chunk == chunk.mT))
    lin_visible = (
        visible & (chunk.mT < chunk) if causal else valid[:, None, :].expand(-1, n, -1)
    )
    lin = (q_lin @ k_lin.transpose(-1, -2) / scale) * lin_visible
    counts = visible.sum(-1).double()
    length = (
        counts.clamp(min=1)
        if config.relu2_length == "dynamic"
        else torch.full_like(counts, config.base_length)
    )
    return (u * ((quad + lin) @ v / length[..., None])) @ unit.out_proj.weight.double().T


def unit_tolerance(config: GAUConfig, length: int) -> float:
    """``rounding_tolerance`` of one float32 GAU unit: the projections to u, v, z (hidden), q·k (key size),
    A·v (length) and the output projection (expansion width)."""
    width = config.expansion_factor * config.hidden_size
    return rounding_tolerance(torch.float32, config.hidden_size, config.attention_key_size, length, width)


def close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> bool:
    """max |actual − expected| ≤ tol · max(1, max |expected|): float32 against a float64 reference."""
    return (actual.double() - expected).abs().max().item() <= tol * max(1.0, expected.abs().max().item())


def run_unit(model: GAUModel, x: torch.Tensor, valid: torch.Tensor, causal: bool, **kwargs):
    """Call layer 0's unit directly with the model's own masks, counts and RoPE tables."""
    model.is_causal = causal
    model.layers[0].gau.is_causal = causal
    position_ids = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    inputs = layer_inputs(model, x, valid.long())
    return model.layers[0].gau(
        x, position_embeddings=model.rotary_emb(position_ids, x.dtype), **inputs, **kwargs
    )


# ----------------------------------------------------------------------------------- config
def test_config_contract_fields_and_defaults() -> None:
    config = GAUConfig()
    assert config.model_type == "gau"
    assert (config.expansion_factor, config.attention_key_size, config.base_length,
            config.entropy_min_length) == (
        2,
        128,
        512,
        16,
    )
    assert config.chunk_size is None and config.relu2_length == "dynamic"
    assert config.attention_normalization == "softmax_plus" and config.use_bias is False
    assert config.hidden_act == "silu" and config.position_embedding_type == "rope"
    assert not hasattr(config, "num_attention_heads") and not hasattr(config, "intermediate_size")
    assert tiny_config().intermediate_width == 64


def test_gau_alpha_preset_and_parameter_count() -> None:
    config = GAUConfig.gau_alpha_base()
    assert (
        config.num_hidden_layers,
        config.hidden_size,
        config.intermediate_width,
        config.attention_key_size,
    ) == (
        24,
        768,
        1536,
        128,
    )
    assert config.attention_normalization == "softmax_plus" and config.norm_position == "post"
    assert (
        config.norm_type == "rmsnorm" and config.norm_elementwise_affine is False and config.use_bias is False
    )
    assert (config.vocab_size, config.hidden_dropout_prob, config.hidden_act) == (12000, 0.1, "silu")
    # GAU-α's clamp (none: trained before bert4keras clamped n at 16), γ initialisation and norm ε
    assert (config.entropy_min_length, config.gau_init, config.layer_norm_eps) == (1, "gau_alpha", 1e-12)
    assert (config.base_length, config.attention_probs_dropout_prob) == (512, 0.1)
    with torch.device("meta"):
        model = GAUModel(config)
    per_layer = 768 * (2 * 1536 + 128) + 1536 * 768 + 2 * 2 * 128  # in_proj, out_proj, γ and β of q and k
    expected = 12000 * 768 + 24 * per_layer
    assert sum(p.numel() for p in model.parameters()) == expected == 96_522_240
    assert GAUConfig.gau_alpha_base(num_hidden_layers=2).num_hidden_layers == 2


@pytest.mark.parametrize(
    ("field", "value", "extra"),
    [
        ("attention_normalization", "linear", {}),
        ("relu2_length", "average", {}),
        ("base_length", 1, {}),
        ("entropy_min_length", 0, {}),
        ("chunk_size", 0, {"attention_normalization": "relu2"}),
        ("chunk_size", 4, {"attention_normalization": "softmax_plus"}),
        ("chunk_size", 4, {"attention_normalization": "relu2_normalized"}),
        ("expansion_factor", 0, {}),
        ("expansion_factor", 1.3, {}),
        ("expansion_factor", 1e-8, {}),  # e = 0 columns, "whole" within rounding
        ("expansion_factor", float("nan"), {}),
        ("expansion_factor", float("inf"), {}),
        ("layer_norm_eps", float("nan"), {}),  # NaN passes every < and >: the forward was NaN
        ("rope_theta", float("inf"), {}),
        ("initializer_range", float("nan"), {}),
        ("hidden_dropout_prob", float("nan"), {}),
        ("num_hidden_layers", 0, {}),
        ("attention_key_size", 0, {}),
        ("attention_key_size", 7, {}),
        ("norm_type", "batchnorm", {}),
        ("norm_position", "middle", {}),
        ("position_embedding_type", "alibi", {}),
        ("num_attention_heads", 4, {}),
        ("intermediate_size", 64, {}),
        ("head_dim", 16, {}),  # fields GAU has no use for: refused, not kept and ignored
        ("pruned_heads", {0: [0]}, {}),
        ("no_rope_layers", [1, 0], {}),
    ],
)
def test_bad_config_values_raise_value_error_naming_the_field(field: str, value, extra: dict) -> None:
    with pytest.raises(ValueError, match=field):
        tiny_config(**{field: value, **extra})


@pytest.mark.parametrize(
    ("field", "value"), [("chunk_size", "4"), ("attention_key_size", 8.0), ("expansion_factor", "2")]
)
def test_bad_config_types_raise_type_error_naming_the_field(field: str, value) -> None:
    with pytest.raises(TypeError, match=field):
        tiny_config(**{field: value})


def test_fields_of_other_families_that_ask_for_nothing_are_taken() -> None:
    """None or empty ``head_dim``, ``pruned_heads`` and ``no_rope_layers`` mean what GAU does anyway (generic
    code may pass them): taken, so that a folder saved with them still loads."""
    config = tiny_config(head_dim=None, pruned_heads={}, no_rope_layers=None)
    assert GAUConfig.from_dict(config.to_dict()).hidden_size == config.hidden_size


def test_odd_key_size_is_fine_without_rope() -> None:
    assert tiny_config(attention_key_size=7, position_embedding_type="none").attention_key_size == 7


# ----------------------------------------------------------------------------------- the unit = the formulas
@pytest.mark.parametrize("normalization", NORMALIZATIONS, ids=NORM_IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_quadratic_unit_matches_the_written_out_formula(normalization, causal: bool) -> None:
    model = tiny(num_hidden_layers=1, **norm_kwargs(normalization))
    x = torch.randn(2, 9, 32)
    valid = torch.tensor([[1] * 9, [1] * 6 + [0] * 3], dtype=torch.bool)
    visible = valid[:, None, :].expand(-1, 9, -1)
    if causal:
        visible = visible & torch.ones(9, 9, dtype=torch.bool).tril()
    output, weights = run_unit(model, x, valid, causal, output_attentions=True)
    expected, attention = reference_quadratic(model.layers[0].gau, x, visible, model.config)
    assert close(output, expected, unit_tolerance(model.config, 9))
    assert weights.shape == (2, 1, 9, 9)
    config = model.config
    assert close(weights[:, 0], attention,
                 rounding_tolerance(torch.float32, config.hidden_size, config.attention_key_size))


def test_relu2_masks_after_the_activation_and_empty_rows_are_zero() -> None:
    config = tiny_config(attention_normalization="relu2")
    scores = torch.tensor([[[[-3.0, 2.0, 4.0, -1.0], [1.0, 1.0, 1.0, 1.0]]]])  # (1, 1, 2, 4)
    mask = torch.tensor([[[[True, True, False, False], [False, False, False, False]]]])
    weights = gau_attention_weights(scores, mask, torch.tensor([[2.0, 0.0]]), config)
    # relu(2)² / nᵢ = 4 / 2; the masked key (logit 4) gives exactly 0
    assert weights[0, 0, 0].tolist() == [0.0, 2.0, 0.0, 0.0]
    assert weights[0, 0, 1].tolist() == [0.0] * 4
    for kind in ("softmax", "softmax_plus", "relu2_normalized", "laplace"):
        weights = gau_attention_weights(
            scores, mask, torch.tensor([[2.0, 0.0]]), tiny_config(attention_normalization=kind)
        )
        assert torch.isfinite(weights).all() and weights[0, 0, 1].abs().sum() == 0
        assert weights[0, 0, 0, 2:].abs().sum() == 0


def test_relu2_dynamic_length_counts_real_keys_not_the_padded_length() -> None:
    model = tiny(num_hidden_layers=1, attention_normalization="relu2")
    x = torch.randn(1, 10, 32)
    valid = torch.tensor([[1] * 6 + [0] * 4], dtype=torch.bool)
    inputs = layer_inputs(model, x, valid.long())
    assert inputs["key_counts"].tolist() == [[6.0] * 10]


# ----------------------------------------------------------------------------------- equivalences
@pytest.mark.parametrize("model_class", [GAUModel, GAUForCausalLM])
def test_softmax_plus_with_base_length_equal_to_the_input_length_is_softmax(model_class) -> None:
    length = 11
    causal = model_class is GAUForCausalLM
    # In a causal stack only the last query has nᵢ = base_length; one layer keeps the other rows out of it.
    layers = 1 if causal else 2
    softmax = tiny(model_class, num_hidden_layers=layers, attention_normalization="softmax")
    plus = model_class(
        tiny_config(
            num_hidden_layers=layers, attention_normalization="softmax_plus", base_length=length,
            entropy_min_length=1
        )
    )
    plus.load_state_dict(softmax.state_dict())
    plus.eval()
    ids = random_ids(2, length)
    a, b = properties.hidden(softmax, ids), properties.hidden(plus, ids)
    if causal:
        a, b = a[:, -1], b[:, -1]
        assert not torch.allclose(
            properties.hidden(softmax, ids)[:, 1], properties.hidden(plus, ids)[:, 1], atol=1e-4
        )
    assert torch.allclose(a, b, atol=1e-5)


def test_relu2_fixed_with_base_length_equal_to_the_input_length_is_dynamic() -> None:
    length = 11
    dynamic = tiny(attention_normalization="relu2", relu2_length="dynamic")
    fixed = GAUModel(tiny_config(attention_normalization="relu2", relu2_length="fixed", base_length=length))
    fixed.load_state_dict(dynamic.state_dict())
    fixed.eval()
    ids = random_ids(2, length)
    assert torch.allclose(properties.hidden(dynamic, ids), properties.hidden(fixed, ids), atol=1e-5)
    shorter = random_ids(2, 7)
    assert not torch.allclose(
        properties.hidden(dynamic, shorter), properties.hidden(fixed, shorter), atol=1e-4
    )


@pytest.mark.parametrize("relu2_length", ["dynamic", "fixed"])
def test_one_chunk_covering_the_sequence_is_the_flash_formula(relu2_length: str) -> None:
    """Non-causal, g ≥ n: u ⊙ ((relu(q kᵀ/√s)² + q' k'ᵀ/√s) v / L) Wo over all valid keys."""
    model = tiny(num_hidden_layers=1, **chunked(16, relu2_length=relu2_length))
    unit = model.layers[0].gau
    x = torch.randn(2, 9, 32)
    valid = torch.tensor([[1] * 9, [1] * 5 + [0] * 4], dtype=torch.bool)
    u, v, (q, k, q_lin, k_lin) = unit_parts(unit, x, model.config.rope_theta)
    s = math.sqrt(8)
    kernel = F.relu(q @ k.transpose(-1, -2) / s) ** 2 + q_lin @ k_lin.transpose(-1, -2) / s
    kernel = kernel * valid[:, None, :]
    length = valid.sum(-1, keepdim=True).double() if relu2_length == "dynamic" else torch.tensor(8.0)
    expected = (u * (kernel @ v / length[..., None])) @ unit.out_proj.weight.double().T
    output, _ = run_unit(model, x, valid, causal=False)
    assert close(output, expected, unit_tolerance(model.config, 9))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", CHUNKED, ids=["dynamic", "fixed"])
@pytest.mark.parametrize("length", [12, 10])  # a multiple of the chunk size and not
def test_chunked_unit_matches_the_dense_flash_formula(causal: bool, options: dict, length: int) -> None:
    model = tiny(num_hidden_layers=1, **chunked(4, **options))
    x = torch.randn(3, length, 32)
    valid = torch.ones(3, length, dtype=torch.bool)
    valid[1, 7:] = False
    valid[2, :3] = False  # left padding: its keys are masked, its chunks start at its first token (3, 7, 11)
    output, _ = run_unit(model, x, valid, causal)
    shift = torch.tensor([0, 0, 3])
    expected = reference_flash(model.layers[0].gau, x, valid, causal, model.config, shift)
    assert close(output[valid], expected[valid], unit_tolerance(model.config, length))  # padding's: any


def test_causal_chunk_covering_the_sequence_is_quadratic_relu2() -> None:
    """Causal FLASH with g ≥ n has no earlier chunk, so its linear term is empty."""
    quadratic = tiny(GAUForCausalLM, attention_normalization="relu2")
    flash = GAUForCausalLM(tiny_config(**chunked(16)))
    state = {
        k: (v if not k.endswith(("qk_scale", "qk_offset")) else torch.cat([v, torch.randn_like(v)]))
        for k, v in quadratic.state_dict().items()
    }
    flash.load_state_dict(state)
    flash.eval()
    ids, mask = right_padded(random_ids(2, 12), [12, 8])
    assert torch.allclose(
        properties.hidden(quadratic, ids, mask), properties.hidden(flash, ids, mask), atol=1e-5
    )


def test_flash_kernel_state_is_the_sum_over_complete_chunks() -> None:
    torch.manual_seed(0)
    q, k, ql, kl = (torch.randn(1, 10, 4) for _ in range(4))
    v = torch.randn(1, 10, 6)
    for implementation in ("reference", "chunk"):
        _, state = flash_mixed_chunk_attention(q, k, ql, kl, v, chunk_size=4, causal=True,
                                               implementation=implementation)
        assert torch.allclose(state.linear, kl[:, :8].transpose(1, 2) @ v[:, :8], atol=1e-5)
        # The open chunk (tokens 8 and 9) is carried as rows: [k ‖ k'] and v.
        assert torch.equal(state.keys, torch.cat([k, kl], -1)[:, 8:]) and torch.equal(state.values, v[:, 8:])
        _, total = flash_mixed_chunk_attention(q, k, ql, kl, v, chunk_size=4, causal=False,
                                               implementation=implementation)
        assert torch.allclose(total.linear, kl.transpose(1, 2) @ v, atol=1e-5)


def bad_flash_arguments() -> dict[str, tuple[str, dict]]:
    """case → (the argument the error must name, what replaces an argument of a valid call)."""
    q = torch.randn(2, 10, 4)
    return {
        "value-length": ("value", {"value": torch.randn(2, 8, 6)}),
        "value-batch": ("value", {"value": torch.randn(1, 10, 6)}),
        "lin_q-length": ("lin_q", {"lin_q": torch.randn(2, 8, 4)}),
        "quad_k-width": ("quad_k", {"quad_k": torch.randn(2, 10, 6)}),
        "lin_k-int": ("lin_k", {"lin_k": q.long()}),  # mixed float dtypes are autocast's, and taken
        "quad_q-2d": ("quad_q", {"quad_q": q[0]}),
        "quad_q-int": ("quad_q", {"quad_q": q.long()}),
        "chunk_size-0": ("chunk_size", {"chunk_size": 0}),
        "chunk_size-negative": ("chunk_size", {"chunk_size": -4}),
        "dropout": ("dropout", {"dropout": -0.1}),
        "key_mask-1d": ("key_mask", {"key_mask": torch.ones(2, dtype=torch.bool)}),
        "key_mask-short": ("key_mask", {"key_mask": torch.ones(2, 9, dtype=torch.bool)}),
        "segments": ("segments", {"segments": torch.zeros(2, 2, dtype=torch.long)}),
        "initial_state-tensor": ("initial_state", {"initial_state": torch.zeros(2, 4, 6)}),
        "initial_state-full-chunk": ("initial_state", {"initial_state": gau_kernels.FlashState(
            None, torch.randn(2, 4, 8), torch.randn(2, 4, 6))}),
        "initial_state-linear": ("initial_state.linear", {"initial_state": gau_kernels.FlashState(
            torch.zeros(2, 6, 4))}),
        "causal-string": ("causal", {"causal": "yes"}),  # Triton's custom op failed deep on it
        "segments-float": ("segments", {"segments": torch.zeros(2, 3)}),
        "initial_state-bidirectional": ("initial_state", {  # its open chunk was dropped
            "causal": False, "initial_state": gau_kernels.FlashState(None, torch.randn(2, 2, 8),
                                                                     torch.randn(2, 2, 6))}),
        "key_mask-device": ("key_mask", {"key_mask": torch.ones(2, 10, dtype=torch.bool, device="meta")}),
        "value-device": ("value", {"value": torch.randn(2, 10, 6, device="meta")}),
    }


@pytest.mark.parametrize("case", list(bad_flash_arguments()))
@pytest.mark.parametrize("implementation", ["reference", "chunk", "triton"])
def test_the_flash_op_names_the_argument_it_cannot_take(case: str, implementation: str) -> None:
    """Checked before any implementation runs: the Triton kernels index by these shapes (a mismatched value
    once read and wrote out of bounds), and the reference accepted a negative chunk size."""
    flag, changes = bad_flash_arguments()[case]
    torch.manual_seed(0)
    arguments = {**{name: torch.randn(2, 10, 4) for name in ("quad_q", "quad_k", "lin_q", "lin_k")},
                 "value": torch.randn(2, 10, 6), "chunk_size": 4, "causal": True, **changes}
    with pytest.raises(ValueError, match=rf"^{flag}\b"):
        flash_mixed_chunk_attention(**arguments, implementation=implementation)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [12, 10])  # a multiple of the chunk size and not
def test_flash_kernel_without_a_mask_is_the_dense_matrix_times_v(causal: bool, length: int) -> None:
    """No key mask takes the path that masks nothing (zero-padded keys are invisible by themselves): it must
    equal W v of ``flash_effective_weights``, and the kernel given an all-true mask."""
    torch.manual_seed(0)
    q, k, ql, kl = (torch.randn(2, length, 4, dtype=torch.float64) for _ in range(4))
    v = torch.randn(2, length, 6, dtype=torch.float64)
    numerator, _ = flash_mixed_chunk_attention(q, k, ql, kl, v, chunk_size=4, causal=causal)
    dense = flash_effective_weights(q, k, ql, kl, chunk_size=4, causal=causal) @ v
    masked, _ = flash_mixed_chunk_attention(q, k, ql, kl, v, chunk_size=4, causal=causal,
                                            key_mask=torch.ones(2, length, dtype=torch.bool))
    assert torch.allclose(numerator, dense, atol=1e-12) and torch.allclose(numerator, masked, atol=1e-12)


# ----------------------------------------------------------------------------------- masks & padding
@pytest.mark.parametrize("normalization", NORMALIZATIONS, ids=NORM_IDS)
def test_padding_invariance_bidirectional(normalization) -> None:
    properties.assert_padding_invariant(tiny(**norm_kwargs(normalization)))


@pytest.mark.parametrize("normalization", NORMALIZATIONS, ids=NORM_IDS)
@pytest.mark.parametrize("left", [False, True])
def test_padding_invariance_causal(normalization, left: bool) -> None:
    properties.assert_padding_invariant(tiny(GAUForCausalLM, **norm_kwargs(normalization)), left=left)


@pytest.mark.parametrize("options", CHUNKED, ids=["dynamic", "fixed"])
@pytest.mark.parametrize("model_class", [GAUModel, GAUForCausalLM])
def test_padding_invariance_chunked(options: dict, model_class) -> None:
    model = tiny(model_class, **chunked(4, **options))
    properties.assert_padding_invariant(model)  # right padding; 12, 7, 4 tokens: partial chunks included
    if model_class is GAUForCausalLM:
        # Each row is chunked from its first token (tests/test_flash_left_padding.py).
        properties.assert_padding_invariant(model, left=True, lengths=(12, 7, 5))


def test_bidirectional_model_sees_the_future_and_attention_is_material() -> None:
    for overrides in ({}, chunked(4)):
        model = tiny(**overrides)
        ids = random_ids(1, 10)
        changed = ids.clone()
        changed[0, -1] = (changed[0, -1] % 90) + 1
        diff = (properties.hidden(model, ids)[:, 0] - properties.hidden(model, changed)[:, 0]).abs().max()
        assert diff > 1e-3, f"{overrides}: the last token barely moves the first output ({diff:.2g})"


@pytest.mark.parametrize(
    "overrides", [norm_kwargs(n) for n in NORMALIZATIONS] + [chunked(3)], ids=NORM_IDS + ["chunked"]
)
def test_causal_model_does_not_see_the_future(overrides: dict) -> None:
    properties.assert_no_future_leakage(tiny(GAUForCausalLM, **overrides))


# ----------------------------------------------------------------------------------- cache & generate
@pytest.mark.parametrize("normalization", NORMALIZATIONS, ids=NORM_IDS)
def test_cache_equals_full_forward_quadratic(normalization) -> None:
    model = tiny(GAUForCausalLM, **norm_kwargs(normalization))
    properties.assert_cache_matches_full_forward(model, padded=False)
    properties.assert_cache_matches_full_forward(model, padded=True)


@pytest.mark.parametrize("options", CHUNKED, ids=["dynamic", "fixed"])
def test_cache_equals_full_forward_chunked_across_chunk_boundaries(options: dict) -> None:
    # 11 tokens: the chunk boundaries at 3, 6 and 9 are crossed while decoding
    model = tiny(GAUForCausalLM, **chunked(3, **options))
    properties.assert_cache_matches_full_forward(model, padded=False)
    properties.assert_cache_matches_full_forward(model, padded=True)


def test_chunked_cache_over_many_chunks_with_uneven_steps_and_bounded_memory() -> None:
    model = tiny(GAUForCausalLM, **chunked(4))
    ids, mask = left_padded(random_ids(2, 41), [41, 35])
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        cache, pieces, start = DynamicCache(config=model.config), [], 0
        for step in (7, 1, 3, 5, 1, 1, 8, 2, 4, 9):  # prefill 7, then steps that start and end mid-chunk
            stop = start + step
            out = model(
                input_ids=ids[:, start:stop],
                attention_mask=mask[:, :stop],
                past_key_values=cache,
                use_cache=True,
            )
            pieces.append(out.logits)
            start = stop
    assert start == 41
    diff = (torch.cat(pieces, dim=1) - full).abs().amax(-1)[mask.bool()]
    assert diff.max() < 1e-5, f"max diff {diff.max():.3g}"
    assert cache.get_seq_length() == 41
    for layer in cache.layers:
        assert isinstance(layer, GAUChunkCacheLayer) and layer.open_lengths(4) == [41 % 4, 35 % 4]
        assert layer.keys.shape[-2] == 35 % 4  # each row's own open chunk, right-aligned
        assert layer.linear_state.shape == (2, 8, 64)


@pytest.mark.parametrize(
    "overrides", [{}, norm_kwargs(("relu2", "fixed")), chunked(3)], ids=["softmax_plus", "relu2", "chunked"]
)
def test_generate_is_greedy_argmax(overrides: dict) -> None:
    model = tiny(GAUForCausalLM, **overrides)
    properties.assert_generate_matches_greedy_full_forward(model)
    assert model.generation_config.min_length in (None, 0), "config.min_length leaked into generation"


def test_chunked_bf16_generate_decodes_like_the_full_forward() -> None:
    """A bf16 FLASH model's one-token steps (``flash_decode_step``, products in float32) pick the tokens
    the full forward's argmax picks over the generated sequence."""
    model = tiny(GAUForCausalLM, **chunked(3)).to(torch.bfloat16)
    ids = random_ids(2, 5)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=7, do_sample=False, pad_token_id=0)
        full = model(out).logits[:, ids.shape[1] - 1:-1].argmax(-1)
    assert torch.equal(out[:, ids.shape[1]:], full)


def test_chunked_beam_search_with_cache_equals_without_cache() -> None:
    """Beam search reorders the cache (``reorder_cache``), including the FLASH linear state."""
    model = tiny(GAUForCausalLM, **chunked(3))
    ids = random_ids(2, 4)
    with torch.no_grad():
        kwargs = {"max_new_tokens": 7, "num_beams": 3, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(
            model.generate(ids, use_cache=True, **kwargs), model.generate(ids, use_cache=False, **kwargs)
        )


@pytest.mark.parametrize("position_embedding_type", ["absolute", "none"])
def test_other_position_embeddings_decode_like_the_full_forward(position_embedding_type: str) -> None:
    for overrides in ({}, chunked(3)):
        model = tiny(
            GAUForCausalLM,
            position_embedding_type=position_embedding_type,
            max_position_embeddings=32,
            **overrides,
        )
        assert model.model.rotary_emb is None
        properties.assert_cache_matches_full_forward(model, padded=False)


def test_chunk_cache_layer_batch_operations() -> None:
    layer = GAUChunkCacheLayer()
    keys, values, state = torch.randn(3, 1, 2, 8), torch.randn(3, 1, 2, 5), torch.randn(3, 4, 5)
    layer.store(keys, values, state, added=6, chunk_size=4)
    assert layer.get_seq_length() == 6 and layer.keys.shape[-2] == 2
    layer.reorder_cache(torch.tensor([2, 0, 0]))
    assert torch.equal(layer.linear_state, state[[2, 0, 0]]) and torch.equal(layer.keys, keys[[2, 0, 0]])
    layer.batch_select_indices(torch.tensor([1]))
    assert layer.linear_state.shape[0] == 1 and layer.keys.shape[0] == 1
    with pytest.raises(ValueError, match="cropped"):
        layer.crop(-1)
    layer.reset()
    assert layer.get_seq_length() == 0 and layer.linear_state is None


# ----------------------------------------------------------------------------------- numerics
GAU_ALPHA_NORM = {"norm_type": "rmsnorm", "norm_position": "post", "norm_elementwise_affine": False}


@pytest.mark.parametrize(
    "overrides",
    [{**norm_kwargs(n), **GAU_ALPHA_NORM} for n in NORMALIZATIONS]
    + [chunked(4), {**chunked(4), **GAU_ALPHA_NORM}],
    ids=NORM_IDS + ["chunked_prenorm", "chunked_postnorm"],
)
def test_bf16_and_all_padding_rows_are_finite(overrides: dict) -> None:
    for model_class in (GAUModel, GAUForCausalLM):
        properties.assert_finite_bf16_and_all_padding(tiny(model_class, **overrides))


@pytest.mark.parametrize(
    "overrides",
    [norm_kwargs(("relu2", "fixed")), chunked(4, relu2_length="fixed")],
    ids=["quadratic", "chunked"],
)
def test_fp16_relu2_scales_before_squaring(overrides: dict) -> None:
    """q·k ≈ 300 in fp16: (q·k)² = 9e4 would overflow fp16 (max 65504); relu(q·k/√s)² does not."""
    model = tiny(num_hidden_layers=1, base_length=64, **overrides)
    x = torch.randn(1, 6, 32)
    unit = model.layers[0].gau
    with torch.no_grad():
        unit.qk_scale.fill_(1.0)
        unit.qk_offset.fill_(6.0)  # q = k ≈ 6 in every dimension → q·k ≈ 8·36 ≈ 290
        reference = run_unit(model, x, torch.ones(1, 6, dtype=torch.bool), False)[0]
        model.half()
        half = run_unit(model, x.half(), torch.ones(1, 6, dtype=torch.bool), False)[0]
    assert torch.isfinite(half).all()
    assert ((half.float() - reference).abs().max() / reference.abs().max()) < 1e-2


def peak_activation_bytes(fn) -> int:
    """Peak of live CPU tensor memory allocated while ``fn`` runs, from torch.profiler's memory events."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    running = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        running += event.self_cpu_memory_usage
        peak = max(peak, running)
    return peak


def test_chunked_peak_activation_memory_grows_linearly() -> None:
    config = {
        "vocab_size": 50,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "attention_key_size": 8,
        "expansion_factor": 2,
    }
    peaks = {}
    for name, extra in (("chunked", chunked(32)), ("quadratic", {"attention_normalization": "relu2"})):
        model = GAUModel(tiny_config(**config, **extra))
        for n in (2048, 4096) if name == "chunked" else (1024, 2048):
            ids = random_ids(1, n, vocab=50)
            peaks[name, n] = peak_activation_bytes(
                lambda: model(input_ids=ids).last_hidden_state.sum())  # noqa: B023
    assert peaks["chunked", 4096] < 2.5 * peaks["chunked", 2048], peaks
    assert peaks["quadratic", 2048] > 3.0 * peaks["quadratic", 1024], peaks  # the helper does see n² growth


# ----------------------------------------------------------------------------------- outputs & training
def test_attention_weights_quadratic() -> None:
    model = tiny(attention_normalization="softmax")
    ids, mask = right_padded(random_ids(2, 7), [7, 4])
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 1, 7, 7)
    assert len(out.hidden_states) == 3
    assert torch.allclose(out.attentions[0].sum(-1), torch.ones(2, 1, 7), atol=1e-5)
    assert torch.all(out.attentions[0][1, :, :, 4:] == 0)


@pytest.mark.parametrize("causal", [False, True])
def test_chunked_attention_weights_are_the_effective_matrix(causal: bool) -> None:
    model = tiny(num_hidden_layers=1, **chunked(3))
    x = torch.randn(2, 8, 32)
    valid = torch.tensor([[1] * 8, [1] * 5 + [0] * 3], dtype=torch.bool)
    output, weights = run_unit(model, x, valid, causal, output_attentions=True)
    unit = model.layers[0].gau
    u, v, _ = unit_parts(unit, x, model.config.rope_theta)
    rebuilt = (u * (weights[:, 0].double() @ v)) @ unit.out_proj.weight.double().T
    assert weights.shape == (2, 1, 8, 8) and close(output, rebuilt, unit_tolerance(model.config, 8))
    assert torch.all(weights[1, 0, :, 5:] == 0)


def test_chunked_output_attentions_through_the_model_and_none_while_decoding() -> None:
    model = tiny(GAUForCausalLM, **chunked(3))
    ids = random_ids(1, 7)
    out = model(input_ids=ids, output_attentions=True, use_cache=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (1, 1, 7, 7)
    step = model(
        input_ids=ids[:, :1],
        past_key_values=out.past_key_values,
        output_attentions=True,
        attention_mask=torch.ones(1, 8, dtype=torch.long),
    )
    # no map while decoding from the chunk state (() or None, by Transformers release)
    assert not step.attentions


@pytest.mark.parametrize("overrides", [{}, chunked(3)], ids=["quadratic", "chunked"])
def test_gradient_checkpointing_gives_same_gradients(overrides: dict) -> None:
    ids = random_ids(2, 9)
    grads = []
    for checkpointing in (False, True):
        model = tiny(GAUForMaskedLM, **overrides)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(input_ids=ids, labels=ids).loss.backward()
        unit = model.model.layers[0].gau
        grads.append(torch.cat([unit.in_proj.weight.grad.flatten(), unit.qk_scale.grad.flatten()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert grads[0].abs().sum() > 0


def test_gau_init_is_gau_alpha_by_default_and_the_flash_paper_on_request() -> None:
    sizes = {"vocab_size": 97, "hidden_size": 64, "num_hidden_layers": 8, "attention_key_size": 64}
    model = GAUModel(GAUConfig(**sizes))  # GAU-α: γ = 1, weights ~ N(0, σ = 1.1368/√fan_in · L^(-1/3)) on ±2σ
    assert all(torch.all(layer.gau.qk_scale == 1) for layer in model.layers)
    for name, fan_in in (("in_proj", 64), ("out_proj", 128)):
        weights = torch.cat([getattr(layer.gau, name).weight.flatten() for layer in model.layers])
        sigma = 1.13684723 / math.sqrt(fan_in) / 2.0  # 8 layers: 8^(-1/3) = 1/2
        # Truncation at ±2σ leaves a std of σ / 1.1368: exactly 1/√fan_in · L^(-1/3), bert4keras' intent.
        assert (abs(weights.std().item() - sigma / 1.13684723) < 0.05 * sigma
                and weights.abs().max() <= 2 * sigma)
    model = GAUModel(GAUConfig(**sizes, gau_init="flash"))  # FLASH pseudocode: N(0, 0.02)
    scales = torch.cat([layer.gau.qk_scale.flatten() for layer in model.layers])
    assert abs(scales.std().item() - 0.02) < 0.004 and abs(scales.mean().item()) < 0.004
    weights = torch.cat([layer.gau.in_proj.weight.flatten() for layer in model.layers])
    assert abs(weights.std().item() - 0.02) < 0.002
    assert all(torch.all(layer.gau.qk_offset == 0) for layer in model.layers)


def test_peft_all_linear_finds_the_gau_projections() -> None:
    peft = pytest.importorskip("peft")
    model = tiny(GAUForSequenceClassification, num_labels=2)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules="all-linear"))
    names = {name for name, _ in wrapped.named_modules() if name.endswith(("in_proj", "out_proj"))}
    assert any(name.endswith("layers.0.gau.in_proj") for name in names)
    assert any("lora_A" in n for n, _ in wrapped.named_parameters() if "gau.out_proj" in n)


# ----------------------------------------------------------------------------------- kernels & reference path
@pytest.mark.parametrize("blocked", [False, True], ids=["one_expression", "blocked"])
@pytest.mark.parametrize(
    "overrides",
    [norm_kwargs(n) for n in NORMALIZATIONS] + [chunked(3), chunked(3, relu2_length="fixed")],
    ids=NORM_IDS + ["chunked_dynamic", "chunked_fixed"],
)
def test_torch_kernels_match_the_reference_path(overrides: dict, blocked: bool, monkeypatch) -> None:
    """``gau_kernel="torch"`` (softmax/relu² kernels in one expression or in query blocks, FLASH) against
    ``gau_kernel="reference"`` (the written-out formula with its map): outputs and parameter gradients."""
    if blocked:
        monkeypatch.setattr(gau_kernels, "ATTENTION_BLOCK_ELEMENTS", 12)  # 9 keys → blocks of one query row
    for model_class, padded in ((GAUModel, right_padded), (GAUForCausalLM, left_padded)):
        ids, mask = padded(random_ids(2, 9), [9, 6])
        results = []
        for kernel in ("torch", "reference"):
            model = tiny(model_class, gau_kernel=kernel, **overrides)
            out = model(input_ids=ids, attention_mask=mask)
            value = out.last_hidden_state if model_class is GAUModel else out.logits
            probe = torch.randn(value.shape, generator=torch.Generator().manual_seed(1))
            (value * probe)[mask.bool()].sum().backward()
            results.append((value.detach(),
                            {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        (got, got_grads), (expected, expected_grads) = results
        real = mask.bool()
        torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
        assert got_grads.keys() == expected_grads.keys()
        for name, grad in expected_grads.items():
            torch.testing.assert_close(got_grads[name], grad, atol=1e-5 * float(grad.abs().max()), rtol=1e-4)


PATH_DEFAULTS = {"query_length": 8, "key_length": 8, "causal": False, "device": "cpu", "dtype": torch.float32}


@pytest.mark.parametrize(
    ("fields", "call", "expected"),
    [
        ({"attention_normalization": "relu2"}, {}, "relu2"),
        ({"attention_normalization": "relu2"}, {"query_length": 4096, "key_length": 4096}, "relu2_blocked"),
        ({"attention_normalization": "relu2", "gau_kernel": "triton"}, {}, "relu2_triton"),
        # "auto" on CUDA: the Triton kernels for half-precision inputs (tensor cores), the torch path for fp32
        ({"attention_normalization": "relu2"}, {"device": "cuda", "dtype": torch.bfloat16},
         "relu2_triton" if TRITON_AVAILABLE else "relu2"),
        ({"attention_normalization": "relu2"}, {"device": "cuda", "dtype": torch.float16},
         "relu2_triton" if TRITON_AVAILABLE else "relu2"),
        ({"attention_normalization": "relu2"}, {"device": "cuda"}, "relu2"),
        (chunked(4), {"device": "cuda", "dtype": torch.bfloat16},
         "flash_triton" if TRITON_AVAILABLE else "flash"),
        (chunked(4), {"device": "cuda"}, "flash"),
        ({"attention_normalization": "relu2", "gau_kernel": "reference"}, {"device": "cuda"},
         "attention_map"),
        ({"attention_normalization": "relu2"}, {"output_attentions": True}, "attention_map"),
        ({"attention_normalization": "relu2", "attention_probs_dropout_prob": 0.1}, {"dropout": True},
         "attention_map"),
        ({"attention_normalization": "relu2", "attention_probs_dropout_prob": 0.1}, {}, "relu2"),
        ({"attention_normalization": "softmax_plus", "attention_probs_dropout_prob": 0.1}, {"dropout": True},
         "softmax_sdpa"),
        ({"attention_normalization": "softmax"}, {"query_length": 1, "key_length": 1 << 23},
         "softmax_blocked"),
        ({"attention_normalization": "softmax"}, {}, "softmax"),
        ({"attention_normalization": "laplace", "gau_kernel": "triton"}, {}, "attention_map"),
        ({"attention_normalization": "relu2_normalized"}, {}, "attention_map"),
        (chunked(4), {}, "flash"),
        (chunked(4, gau_kernel="triton"), {}, "flash_triton"),
        (chunked(4, gau_kernel="triton", attention_probs_dropout_prob=0.1), {"dropout": True}, "flash"),
        (chunked(4, gau_kernel="reference"), {}, "flash_map"),
        (chunked(4), {"output_attentions": True}, "flash_map"),
        (chunked(4), {"causal": True, "cached": True, "key_length": 12}, "flash_cache"),  # 4 earlier tokens
        # a prefill: parallel, then it starts the cache
        (chunked(4), {"causal": True, "cached": True}, "flash"),
        (chunked(4, gau_kernel="triton"), {"causal": True, "cached": True}, "flash_triton"),
        (chunked(4), {"cached": True}, "flash"),  # a bidirectional unit ignores a cache
        (chunked(4), {"causal": True, "cached": True, "output_attentions": True}, "flash_cache_map"),
        (chunked(4), {"causal": True, "cached": True, "output_attentions": True, "query_length": 1},
         "flash_cache"),
        (chunked(4), {"packed": True}, "flash_packed"),
        (chunked(4), {"packed": True, "layout": False}, "flash_windows"),  # compiling: no layout on the host
        (chunked(4), {"packed": True, "layout": False, "output_attentions": True}, "flash_documents"),
        (chunked(4, gau_kernel="reference"), {"packed": True}, "flash_documents"),
    ],
)
def test_attention_path_names_the_computation(fields: dict, call: dict, expected: str) -> None:
    path = gau_attention_path(tiny_config(**fields), **{**PATH_DEFAULTS, **call})
    assert path == expected and path in GAU_ATTENTION_PATHS


def autograd_node_names(tensor: torch.Tensor) -> set[str]:
    """Names of every autograd node behind ``tensor``."""
    names, stack, seen = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(node.name())
        stack.extend(child for child, _ in node.next_functions)
    return names


@pytest.mark.parametrize(
    ("fields", "path", "node"),
    [
        ({"attention_normalization": "relu2"}, "relu2_blocked", "Relu2AttentionBackward"),
        ({"attention_normalization": "softmax"}, "softmax_blocked", "SoftmaxAttentionBackward"),
        ({"attention_normalization": "relu2", "gau_kernel": "reference"}, "attention_map", None),
    ],
)
def test_the_unit_runs_the_path_it_names(fields: dict, path: str, node: str | None, monkeypatch) -> None:
    monkeypatch.setattr(gau_kernels, "ATTENTION_BLOCK_ELEMENTS", 12)
    model = tiny(num_hidden_layers=1, **fields).train()
    assert model.layers[0].gau.attention_path(9, 9, "cpu", torch.float32) == path
    output, _ = run_unit(model, torch.randn(1, 9, 32), torch.ones(1, 9, dtype=torch.bool), False)
    names = autograd_node_names(output)
    blocked = {"Relu2AttentionBackward", "SoftmaxAttentionBackward"} & names
    assert blocked == ({node} if node else set()), names


# ----------------------------------------------------------------------------------- errors & HF integration
def test_bad_inputs_raise_clear_errors() -> None:
    model = tiny(**chunked(4))
    with pytest.raises(ValueError, match="2D attention_mask"):
        model(input_ids=random_ids(1, 5), attention_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=random_ids(1, 5), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="vocab_size"):
        model(input_ids=torch.tensor([[1, 2, 500]]))


def test_registered_in_families_and_auto_classes(tmp_path) -> None:
    config_class, classes = FAMILIES["gau"]
    assert config_class is GAUConfig and len(classes) == 6
    model = tiny(GAUForMaskedLM, **chunked(4))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert_standalone_code(tmp_path, "gau")
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is GAUForMaskedLM and reloaded.config.chunk_size == 4
    ids = random_ids(2, 10)
    assert torch.allclose(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "gau"
    assert type(AutoModel.from_pretrained(tmp_path)) is GAUModel
    causal = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert causal.config.is_decoder and causal.model.is_causal


def test_one_token_decoding_steps_skip_the_open_chunks_recomputation(monkeypatch) -> None:
    """A decoding step of one token per row takes ``_decode_step`` (its own row only, O(g)), never the general
    cached branch (``continue_from``), and still equals the full forward across chunk boundaries with left
    padding."""
    from hf_attn_variants.models.modeling_gau import FlashGatedAttentionUnit

    general = FlashGatedAttentionUnit.continue_from
    segments: list[int] = []

    def counted(self, layer, inputs, *args, **kwargs):
        segments.append(inputs.quad_q.shape[1])
        return general(self, layer, inputs, *args, **kwargs)

    monkeypatch.setattr(FlashGatedAttentionUnit, "continue_from", counted)
    model = tiny(GAUForCausalLM, **chunked(3))
    ids, mask = left_padded(random_ids(2, 11), [11, 8])
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
        cache, pieces = DynamicCache(config=model.config), []
        for start, stop in [(0, 4), *[(n, n + 1) for n in range(4, 9)], (9, 11)]:
            out = model(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop], cache=cache,
                        use_cache=True)
            pieces.append(out.logits)
    # only the two-token step, once per layer; the prefill is parallel, the rest one row
    assert segments == [2, 2]
    diff = (torch.cat(pieces, dim=1) - full).abs().amax(-1)[mask.bool()]
    assert diff.max() < 1e-5, f"max diff {diff.max():.3g}"


@pytest.mark.parametrize(("width", "chunk"), [(1024, 256), (1536, 256)])  # the GPU side-by-side, the bench
def test_flash_triton_kernels_fill_an_h100_at_batch_one_and_4k(width: int, chunk: int) -> None:
    """At batch 1 and 4,096 tokens every FLASH kernel, forward and backward, launches at least 264 programs:
    two waves on an H100's (or H200's) 132 SMs, key size 128."""
    from hf_attn_variants.models.gau_triton import flash_triton_grids

    grids = flash_triton_grids(1, 4096, 128, width, chunk)
    assert set(grids) == {"chunk_outer", "forward", "backward_query", "backward_key"}
    for name, grid in grids.items():
        assert math.prod(grid) >= 264, (name, grid)


def saved_bytes_per_token(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Bytes autograd keeps for backward after a forward of ``ids``, per token: every distinct storage a
    ``saved_tensors_hooks`` pack sees, parameters excluded."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return saved_bytes(lambda: model(input_ids=ids), parameters) / ids.numel()


def test_flash_layers_save_no_more_than_llama_per_token_in_bf16_at_8k() -> None:
    """In bf16 at 8,192 tokens, without activation checkpointing, FLASH (8 layers, key size 128, chunk 256)
    keeps no more bytes per token for backward than a Llama with SDPA of equal non-embedding parameters (4
    layers): the unit saves ``in_proj``'s output and recomputes the rest. Hidden 256 here (the GPU
    side-by-side's 512 keeps the same proportions: docs/gau.md)."""
    from transformers import LlamaConfig, LlamaModel

    llama = LlamaModel(LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=4, attn_implementation="sdpa"))
    flash = GAUModel(GAUConfig(vocab_size=64, hidden_size=256, num_hidden_layers=8, attention_key_size=128,
                               chunk_size=256, attention_normalization="relu2", is_decoder=True,
                               gau_kernel="torch"))
    sizes = [sum(p.numel() for name, p in model.named_parameters() if "embed" not in name)
             for model in (llama, flash)]
    assert abs(sizes[0] / sizes[1] - 1) < 0.05, sizes
    ids = random_ids(1, 8192, vocab=64)
    llama_bytes, flash_bytes = (saved_bytes_per_token(model.to(torch.bfloat16).train(), ids)
                                for model in (llama, flash))
    assert flash_bytes <= llama_bytes, (flash_bytes, llama_bytes)


def test_the_flash_op_refuses_a_dropout_outside_0_1_in_eager() -> None:
    """The op's own range check (compiled it is left to the config: a symbolic float there could not be
    compared inside a checkpoint)."""
    inputs = [torch.randn(1, 6, 4) for _ in range(4)] + [torch.randn(1, 6, 5)]
    with pytest.raises(ValueError, match=r"^dropout must be in \[0, 1\], got 1.5"):
        flash_mixed_chunk_attention(*inputs, chunk_size=2, causal=True, dropout=1.5, training=True)


@pytest.mark.parametrize("implementation",
                         ["reference", "chunk", pytest.param("triton", marks=needs_triton())])
def test_the_flash_op_takes_an_empty_batch(implementation: str) -> None:
    """B = 0 (a data-parallel split, an empty serving step) gives an empty numerator; the chunked path failed
    to reshape it (so did E = 0, which torch 2.7's padding refuses before)."""
    for batch, width in ((0, 6), (2, 0) if torch.__version__ >= "2.8" else (0, 6)):
        q = torch.randn(batch, 10, 4)
        value = torch.randn(batch, 10, width)
        numerator, state = flash_mixed_chunk_attention(q, q, q, q, value, chunk_size=4, causal=True,
                                                       implementation=implementation)
        assert numerator.shape == (batch, 10, width) and state.linear.shape == (batch, 4, width)


@pytest.mark.parametrize("implementation", ["chunk", pytest.param("triton", marks=needs_triton())])
def test_an_open_chunks_padded_linear_keys_are_masked_like_the_reference(implementation: str) -> None:
    """A caller's open chunk whose k' is not zero at a padded column: every implementation drops that key from
    the linear part, as the reference's W does (the chunked paths kept its k'ᵀv: 2.67 apart), and the
    state carried on holds it masked."""
    torch.manual_seed(0)
    q, k, ql, kl = (torch.randn(2, 7, 4, dtype=torch.float64) for _ in range(4))
    v = torch.randn(2, 7, 6, dtype=torch.float64)
    opened = gau_kernels.FlashState(*(torch.randn(2, *shape, dtype=torch.float64)
                                      for shape in ((4, 6), (3, 8), (3, 6))))
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, 1] = mask[1, 0] = False  # columns of the open chunk
    arguments = dict(chunk_size=4, causal=True, key_mask=mask, initial_state=opened)
    expected, expected_state = flash_mixed_chunk_attention(q, k, ql, kl, v, implementation="reference",
                                                           **arguments)
    numerator, state = flash_mixed_chunk_attention(q, k, ql, kl, v, implementation=implementation,
                                                   **arguments)
    tolerance = 1e-10 if implementation == "chunk" else 1e-5
    torch.testing.assert_close(numerator, expected, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(state.linear.double(), expected_state.linear, atol=tolerance, rtol=tolerance)
