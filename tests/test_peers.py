"""Our FLASH unit against lucidrains' FLASH-pytorch 0.1.9, the peer `make bench` times it against.

The two compute the same layer once their conventions are aligned: the peer divides the quadratic scores by
the chunk size g inside relu² and the linear part by g (causal) or by the unpadded length n (bidirectional),
and adds a T5 relative-position bias; ours multiplies both parts by 1/√s and divides the sum by L
(``relu2_length="fixed"``: ``base_length``). Zeroing the peer's T5 bias (and RoPE off in both), the peer's
offset-scale rows for q and q' carry the ratio of the two conventions, c = g/(√s·√L) for q and g/(√s·L)
(causal) or n/(√s·L) for q'; then the peer's ``FLASH(x)`` equals ``x + unit(norm(x))`` of our
``GatedAttentionUnit`` with the peer's weights.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hf_attn_variants import GAUConfig, GAUModel
from hf_attn_variants.bench.peers import INSTALL
from tests.utils import layer_inputs

try:
    from flash_pytorch.flash_pytorch import FLASH
except ModuleNotFoundError as error:
    # a peer from the lock: missing means the install is incomplete, not a skip
    raise ModuleNotFoundError(INSTALL) from error

DIM, KEY, G, L = 32, 16, 8, 8


def run_unit(model: GAUModel, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Layer 0's unit of ``model`` (no position embedding) on ``x`` with no padding."""
    assert model.is_causal == causal
    mask = torch.ones(x.shape[:2], dtype=torch.long)
    inputs = layer_inputs(model, x, mask)
    return model.layers[0].gau(x, position_embeddings=None, **inputs)[0]


def aligned_pair(causal: bool, length: int) -> tuple[nn.Module, GAUModel]:
    """The peer's FLASH layer with random weights (T5 bias zeroed, no RoPE, LayerNorm) and our one-layer
    GAUModel holding the same weights, rescaled as the module docstring says."""
    torch.manual_seed(0)
    peer = FLASH(dim=DIM, group_size=G, query_key_dim=KEY, expansion_factor=2.0, causal=causal,
                 norm_klass=nn.LayerNorm, shift_tokens=False).eval()
    with torch.no_grad():
        peer.rel_pos_bias.relative_attention_bias.weight.zero_()
        for parameter in peer.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
        peer.rel_pos_bias.relative_attention_bias.weight.zero_()
    ours = GAUModel(GAUConfig(vocab_size=11, hidden_size=DIM, num_hidden_layers=1, expansion_factor=2,
                              attention_key_size=KEY, attention_normalization="relu2", relu2_length="fixed",
                              base_length=L, chunk_size=G, is_decoder=causal, position_embedding_type="none",
                              use_bias=True, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)).eval()
    unit = ours.layers[0].gau
    width = 2 * DIM
    hidden_w, hidden_b = peer.to_hidden[0].weight, peer.to_hidden[0].bias  # rows: [v | gate]
    gamma, beta = peer.qk_offset_scale.gamma, peer.qk_offset_scale.beta  # rows: quad_q, lin_q, quad_k, lin_k
    quad_q = G / (math.sqrt(KEY) * math.sqrt(L))
    lin_q = (G if causal else length) / (math.sqrt(KEY) * L)
    with torch.no_grad():
        unit.in_proj.weight.copy_(torch.cat([hidden_w[width:], hidden_w[:width], peer.to_qk[0].weight]))
        unit.in_proj.bias.copy_(torch.cat([hidden_b[width:], hidden_b[:width], peer.to_qk[0].bias]))
        unit.out_proj.weight.copy_(peer.to_out.weight)
        unit.out_proj.bias.copy_(peer.to_out.bias)
        # ours: rows quad_q, quad_k, lin_q, lin_k; q rows divided by the convention ratio
        unit.qk_scale.copy_(torch.stack([gamma[0] / quad_q, gamma[2], gamma[1] / lin_q, gamma[3]]))
        unit.qk_offset.copy_(torch.stack([beta[0] / quad_q, beta[2], beta[1] / lin_q, beta[3]]))
    return peer, ours


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("length", [16, 21], ids=["whole_chunks", "padded"])
def test_our_flash_unit_equals_flash_pytorch_once_conventions_are_aligned(causal: bool, length: int) -> None:
    peer, ours = aligned_pair(causal, length)
    x = torch.randn(2, length, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = peer(x)
        got = x + run_unit(ours, peer.norm(x), causal)
    assert (expected - x).abs().max() > 0.1  # the layer does something the comparison can see
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_the_alignment_is_what_makes_them_equal() -> None:
    """Without the peer's T5 bias zeroed the outputs differ: the comparison is not vacuous."""
    peer, ours = aligned_pair(True, 16)
    with torch.no_grad():
        peer.rel_pos_bias.relative_attention_bias.weight.fill_(0.5)
        x = torch.randn(1, 16, DIM, generator=torch.Generator().manual_seed(2))
        assert (peer(x) - (x + run_unit(ours, peer.norm(x), True))).abs().max() > 1e-3
