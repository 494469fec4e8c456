"""Unit tests of the shared building blocks in ``hf_attn_variants.models.layers``."""

from __future__ import annotations

import math
import re

import pytest
import torch

from hf_attn_variants.models.layers import (
    RMSNorm,
    RotaryEmbedding,
    ScaleNorm,
    apply_rotary,
    boolean_attention_mask,
    build_norm,
    entropy_invariant_factor,
    kept_heads,
    log_key_counts,
    masked_softmax,
    normalize_pruned_heads,
    visible_key_counts,
    widest_dtype,
)
from hf_attn_variants.models import gau_kernels
from hf_attn_variants.models.modeling_entropy_invariant import eager_attention_forward
from tests.utils import NoFloat64


def rotated(x: torch.Tensor, position: int, rope: RotaryEmbedding) -> torch.Tensor:
    cos, sin = rope(torch.tensor([[position]]), torch.float64)
    return apply_rotary(x.view(1, 1, 1, -1), cos, sin).view(-1)


def test_rope_scores_depend_only_on_relative_position() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(16)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    reference = rotated(q, 7, rope) @ rotated(k, 3, rope)
    for shift in (0, 1, 10, 500):
        score = rotated(q, 7 + shift, rope) @ rotated(k, 3 + shift, rope)
        assert torch.allclose(score, reference, atol=1e-10)
    assert not torch.allclose(rotated(q, 8, rope) @ rotated(k, 3, rope), reference)


def test_rope_preserves_norm_and_is_identity_at_zero() -> None:
    rope = RotaryEmbedding(8)
    x = torch.randn(8, dtype=torch.float64)
    assert torch.allclose(rotated(x, 0, rope), x)
    assert torch.allclose(rotated(x, 123, rope).norm(), x.norm())


def test_rope_rejects_odd_dimension() -> None:
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)


def test_rmsnorm_matches_formula_and_is_parameter_free_when_asked() -> None:
    x = torch.randn(3, 5, 8)
    norm = RMSNorm(8, eps=1e-6, elementwise_affine=False)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(norm(x), expected, atol=1e-6)
    assert list(norm.parameters()) == []


def test_scalenorm_has_norm_sqrt_d() -> None:
    x = torch.randn(4, 16)
    out = ScaleNorm(16)(x)
    assert torch.allclose(out.norm(dim=-1), torch.full((4,), 4.0), atol=1e-5)


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm", "scalenorm"])
def test_norms_keep_dtype_and_are_finite_in_half_precision(norm_type: str) -> None:
    norm = build_norm(norm_type, 32, 1e-6)
    x = (torch.randn(2, 32) * 300).to(torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_build_norm_rejects_unknown_type() -> None:
    with pytest.raises(ValueError, match="norm_type"):
        build_norm("batchnorm", 8, 1e-6)


def test_key_counts_bidirectional_count_only_real_tokens() -> None:
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    counts = visible_key_counts(mask, batch_size=2, query_length=5, key_length=5, causal=False,
                                device=mask.device)
    assert counts.tolist() == [[3.0] * 5, [5.0] * 5]


def test_key_counts_causal_with_padding_left_and_right() -> None:
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    counts = visible_key_counts(mask, batch_size=2, query_length=5, key_length=5, causal=True,
                                device=mask.device)
    assert counts.tolist() == [[1, 2, 3, 3, 3], [0, 0, 1, 2, 3]]


def test_key_counts_with_past_cache() -> None:
    # 4 cached keys + 2 new queries; row 1 has one left-padding position in the cache.
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    counts = visible_key_counts(
        mask, batch_size=2, query_length=2, key_length=6, query_offset=4, causal=True, device=mask.device
    )
    assert counts.tolist() == [[5, 6], [4, 5]]
    no_mask = visible_key_counts(
        None, batch_size=1, query_length=2, key_length=6, query_offset=4, causal=True, device=mask.device
    )
    assert no_mask.tolist() == [[5, 6]]


def test_key_counts_match_a_materialised_mask() -> None:
    mask2d = torch.tensor([[0, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1]])
    for causal in (False, True):
        mask4d = boolean_attention_mask(
            mask2d, batch_size=2, query_length=6, key_length=6, causal=causal, device=mask2d.device
        )
        from_4d = visible_key_counts(mask4d, batch_size=2, query_length=6, key_length=6, causal=causal,
                                     device=mask2d.device)
        from_2d = visible_key_counts(mask2d, batch_size=2, query_length=6, key_length=6, causal=causal,
                                     device=mask2d.device)
        assert torch.equal(from_4d, from_2d)


@pytest.mark.parametrize("past", [0, 3])
@pytest.mark.parametrize("padding", ["left", "right", "none"])
def test_position_derived_counts_equal_mask_derived_counts_on_real_tokens(padding: str, past: int) -> None:
    """nᵢ = position + 1 for the positions ``generate`` uses (cumsum(mask) − 1), equal to the mask's count on
    every real token, with or without cached tokens before the queries."""
    total, lengths = 12, [12, 9, 5]
    mask = torch.zeros(3, total, dtype=torch.long)
    for row, n in enumerate(lengths):
        if padding == "left":
            mask[row, total - n :] = 1
        elif padding == "right":
            mask[row, :n] = 1
        else:
            mask[row] = 1
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, past:]  # what generate passes
    geometry = {"batch_size": 3, "query_length": total - past, "key_length": total, "query_offset": past,
                "causal": True, "device": torch.device("cpu")}
    from_mask = visible_key_counts(mask, **geometry)
    from_positions = visible_key_counts(None, **geometry, position_ids=positions)
    real = mask[:, past:].bool()
    assert torch.equal(from_positions[real], from_mask[real])
    # Next to a mask the mask decides, whatever positions are given (here also arange, which counts padding).
    for given in (positions, torch.arange(past, total).expand(3, -1)):
        assert torch.equal(visible_key_counts(mask, **geometry, position_ids=given), from_mask)


def test_key_counts_reject_3d_masks() -> None:
    with pytest.raises(ValueError, match="attention_mask"):
        visible_key_counts(torch.ones(1, 2, 3), batch_size=1, query_length=2, key_length=3, causal=False,
                           device="cpu")


def test_beyond_scope_only_scales_rows_past_base_length() -> None:
    counts = torch.tensor([1.0, 8.0, 16.0, 64.0, 1000.0])
    # the clamp is ignored
    factor = entropy_invariant_factor(counts, base_length=16, min_length=32, scope="beyond")
    expected = torch.tensor([1.0, 1.0, 1.0, math.log(64) / math.log(16), math.log(1000) / math.log(16)])
    torch.testing.assert_close(factor, expected)
    assert entropy_invariant_factor(counts, base_length=16, min_length=1, scope="all")[0] == 0.0


def test_entropy_factor_is_one_at_base_length_and_clamped_below() -> None:
    counts = torch.tensor([512.0, 1024.0, 3.0, 0.0])
    factor = entropy_invariant_factor(counts, base_length=512, min_length=16)
    assert factor[0].item() == pytest.approx(1.0)
    assert factor[1].item() == pytest.approx(math.log(1024) / math.log(512))
    assert factor[2].item() == factor[3].item() == pytest.approx(math.log(16) / math.log(512))
    assert torch.equal(log_key_counts(counts, 16), counts.clamp(min=16).log())


def test_boolean_mask_combines_padding_and_causality() -> None:
    mask2d = torch.tensor([[1, 1, 0]])
    mask = boolean_attention_mask(mask2d, batch_size=1, query_length=3, key_length=3, causal=True,
                                  device="cpu")
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert boolean_attention_mask(None, batch_size=1, query_length=3, key_length=3, causal=False,
                                  device="cpu") is None


def test_masked_softmax_gives_zero_rows_not_nan() -> None:
    scores = torch.randn(1, 1, 2, 3)
    mask = torch.tensor([[[[True, False, True], [False, False, False]]]])
    probs = masked_softmax(scores, mask)
    assert torch.allclose(probs[0, 0, 0].sum(), torch.tensor(1.0))
    assert probs[0, 0, 0, 1] == 0 and torch.equal(probs[0, 0, 1], torch.zeros(3))
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    assert torch.allclose(masked_softmax(scores, additive), probs)


def test_eager_attention_matches_sdpa_including_empty_rows() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5) > 0.4
    mask[0, 0, 2] = False
    module = torch.nn.Module().eval()
    eager, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                            scale=0.5).transpose(1, 2)
    assert torch.allclose(eager, sdpa, atol=1e-6)


def test_pruned_heads_normalisation_and_errors() -> None:
    assert normalize_pruned_heads({"1": [3, 0], 0: []}, num_layers=2, num_heads=4) == {1: [0, 3]}
    assert kept_heads({1: [0, 3]}, 1, 4) == [1, 2]
    with pytest.raises(ValueError, match="out of range"):
        normalize_pruned_heads({0: [4]}, num_layers=2, num_heads=4)
    with pytest.raises(ValueError, match="layer 5"):
        normalize_pruned_heads({5: [0]}, num_layers=2, num_heads=4)
    with pytest.raises(ValueError, match="twice"):
        normalize_pruned_heads({0: [1, 1]}, num_layers=2, num_heads=4)


@pytest.mark.parametrize(("pruned_heads", "message"), [
    ({0: [True]}, "the heads of layer 0 must be a list of integer indices, got [True]"),  # once head 1
    ({0: [1.5]}, "got [1.5]"),
    ({0: 1}, "got 1"),
    ({0: "01"}, "got '01'"),
    ({True: [0]}, "keys must be layer indices, got True"),
    ({1.0: [0]}, "got 1.0"),
    ({"-1": [0]}, "got '-1'"),
])
def test_pruned_heads_must_be_integer_indices(pruned_heads, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        normalize_pruned_heads(pruned_heads, num_layers=2, num_heads=4)


def test_pruned_heads_take_numpy_and_tensor_integers() -> None:
    import numpy as np

    heads = {"1": [np.int64(2), torch.tensor(0)], np.int64(0): (3,)}
    assert normalize_pruned_heads(heads, num_layers=2, num_heads=4) == {0: [3], 1: [0, 2]}
    for bad in (torch.tensor(0.5), torch.tensor(True), np.bool_(True), np.array([1]), torch.tensor([1, 2])):
        with pytest.raises(ValueError, match="must be a list of integer indices"):
            normalize_pruned_heads({0: [bad]}, num_layers=2, num_heads=4)
        if not isinstance(bad, np.ndarray):  # an array cannot be a dict key
            with pytest.raises(ValueError, match="keys must be layer indices"):
                normalize_pruned_heads({bad: [0]}, num_layers=2, num_heads=4)


@pytest.mark.parametrize("family", ["entropy_invariant", "gau", "synthesizer"])
def test_a_mask_of_another_rank_is_named_not_used(family) -> None:
    """A 1D or 3D ``attention_mask`` is one ``ValueError`` in every family; the Synthesizer once ran a 3D one
    at batch 1 and returned other logits than without a mask."""
    from transformers import AutoModelForCausalLM

    from hf_attn_variants.training.modeling import build_config
    from tests.test_pretrain import tiny_overrides

    torch.manual_seed(0)
    config = build_config(family, config_overrides=tiny_overrides(family, is_decoder=True), max_seq_length=16)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 6))
    for mask in (torch.ones(1, 6, 6), torch.ones(6)):
        with pytest.raises(ValueError, match=r"attention_mask must be 2D .* or 4D .*, got shape"):
            model(input_ids=ids, attention_mask=mask)


def test_positions_outside_the_learned_table_are_named() -> None:
    from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForCausalLM

    torch.manual_seed(0)
    model = EntropyInvariantForCausalLM(EntropyInvariantConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, position_embedding_type="absolute", is_decoder=True)).eval()
    ids = torch.randint(0, 64, (1, 6))
    for start, shown in ((20, r"\[20, 25\]"), (-3, r"\[-3, 2\]")):
        with pytest.raises(ValueError, match=r"position_ids must be in \[0, max_position_embeddings=16\) for "
                                             rf"the learned absolute positions, got values in {shown}"):
            model(input_ids=ids, position_ids=torch.arange(start, start + 6)[None])
    assert model(input_ids=ids, position_ids=torch.arange(10, 16)[None]).logits.isfinite().all()


def test_sums_that_must_not_round_take_float64_but_float32_on_mps(monkeypatch) -> None:
    """MPS has no float64 (a float64 tensor there raises TypeError): packed FLASH's per-document prefix sums,
    the evaluation's sums and the entropy take ``widest_dtype``, float32 there. What MPS gets, on the CPU:
    the per-document sums within float32's rounding of float64's."""
    assert widest_dtype(torch.device("cpu")) == widest_dtype(torch.device("cuda")) == torch.float64
    assert widest_dtype(torch.device("mps")) == torch.float32
    summaries = torch.randn(2, 6, 3, 4, generator=torch.Generator().manual_seed(0))
    segments = torch.tensor([[0, 0, 2, 2, 2, 5], [0, 1, 1, 1, 4, 4]])  # each chunk's document's first chunk
    for causal in (True, False):
        expected = gau_kernels.segmented_chunk_sums(summaries, segments, causal)
        with monkeypatch.context() as patch, NoFloat64():
            patch.setattr(gau_kernels, "widest_dtype", lambda device: torch.float32)
            got = gau_kernels.segmented_chunk_sums(summaries, segments, causal)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected)
    assert torch.equal(expected[0, 3], summaries[0, 2:5].sum(0))  # document 2's total (not causal)
