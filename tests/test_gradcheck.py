"""float64 stays float64: ``torch.autograd.gradcheck`` on every attention kernel.

Internal upcasts go to ``torch.promote_types(dtype, float32)``, never down, so a float64 model is computed in
float64 end to end and its analytical gradients match finite differences. Each check runs a whole tiny
float64 model (embeddings in, last hidden state out, padding and causal masks included) or, for GAU's two
hand-written autograd Functions, the Function itself split into several query blocks.
"""

from __future__ import annotations

import pytest
import torch

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantModel,
    GAUConfig,
    GAUModel,
    SynthesizerConfig,
    SynthesizerModel,
)
from hf_attn_variants.models import gau_kernels
from tests.utils import left_padded, random_ids

SIZES = {"vocab_size": 11, "hidden_size": 8, "num_hidden_layers": 1, "hidden_dropout_prob": 0.0,
         "attention_probs_dropout_prob": 0.0, "initializer_range": 0.5}
HEADS = {"num_attention_heads": 2, "intermediate_size": 6}
BATCH, LENGTH = 2, 5

CASES = {
    **{f"entropy_invariant-{scale}-{kernel}": (EntropyInvariantModel, EntropyInvariantConfig,
                                               {**HEADS, "attention_scale": scale, "base_length": 4,
                                                "entropy_min_length": 1}, kernel)
       for scale in ("standard", "entropy_invariant", "ssmax") for kernel in ("eager", "sdpa")},
    **{f"gau-{name}": (GAUModel, GAUConfig, {"attention_key_size": 4, "base_length": 4,
                                             "entropy_min_length": 1, **fields}, None)
       for name, fields in {
           "softmax": {"attention_normalization": "softmax"},
           "softmax_plus": {"attention_normalization": "softmax_plus"},
           "relu2_dynamic": {"attention_normalization": "relu2"},
           "relu2_fixed": {"attention_normalization": "relu2", "relu2_length": "fixed"},
           "relu2_normalized": {"attention_normalization": "relu2_normalized"},
           "laplace": {"attention_normalization": "laplace"},
           "chunked": {"attention_normalization": "relu2", "chunk_size": 2},
       }.items()},
    **{f"synthesizer-{component}": (SynthesizerModel, SynthesizerConfig,
                                    {**HEADS, "max_position_embeddings": 8, "random_init_std": 1.0,
                                     "synthesizer_components": [component]}, None)
       for component in ("dense", "random", "factorized_dense", "factorized_random", "vanilla")},
}


def graph_node_names(node: object, depth: int = 3) -> set[str]:
    """Names of the autograd nodes within ``depth`` steps of ``node``."""
    if node is None or depth == 0:
        return set()
    names = {node.name()}
    for child, _ in node.next_functions:
        names |= graph_node_names(child, depth - 1)
    return names


def float64_model(name: str, causal: bool) -> torch.nn.Module:
    model_class, config_class, fields, kernel = CASES[name]
    torch.manual_seed(0)
    model = model_class(config_class(**SIZES, **fields, is_decoder=causal)).double().eval()
    if kernel is not None:
        model.set_attn_implementation(kernel)
    return model


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_of_a_float64_model_match_finite_differences(name: str, causal: bool) -> None:
    model = float64_model(name, causal)
    _, mask = left_padded(random_ids(BATCH, LENGTH), [LENGTH, 3])
    embeds = torch.randn(BATCH, LENGTH, SIZES["hidden_size"], dtype=torch.float64, requires_grad=True)

    def run(inputs: torch.Tensor) -> torch.Tensor:
        return model(inputs_embeds=inputs, attention_mask=mask).last_hidden_state

    assert run(embeds).dtype == torch.float64
    assert torch.autograd.gradcheck(run, (embeds,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("kernel", ["relu2", "softmax"])
def test_blocked_gau_kernels_match_finite_differences(monkeypatch, kernel: str, causal: bool) -> None:
    """``relu2_attention`` / ``softmax_attention`` through their hand-written autograd Functions
    (``Relu2Attention``, ``SoftmaxAttention``: recomputing, blocked backward) in float64, over 4 query
    blocks."""
    monkeypatch.setattr(gau_kernels, "ATTENTION_BLOCK_ELEMENTS", 24)  # 12 keys → 4 blocks of 3 query rows
    torch.manual_seed(0)
    query, key = (torch.randn(2, 12, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    value = torch.randn(2, 12, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 12, 12, dtype=torch.bool)
    mask[1, :, :2] = False  # left padding of row 1 (with causality its first two queries see no key)
    if causal:
        mask &= torch.ones(12, 12, dtype=torch.bool).tril()
    offset = 0 if causal else None
    assert len(gau_kernels._query_blocks(12, 12, offset)) == 4

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if kernel == "relu2":
            return gau_kernels.relu2_attention(q * 0.7, k, v, mask, offset, blocked=True)
        return gau_kernels.softmax_attention(q, k, v, mask, offset, blocked=True)

    function = gau_kernels.Relu2Attention if kernel == "relu2" else gau_kernels.SoftmaxAttention
    assert f"{function.__name__}Backward" in graph_node_names(run(query, key, value).grad_fn)
    assert torch.autograd.gradcheck(run, (query, key, value), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_query_blocks_cover_the_queries_and_compile_once_per_block_count(monkeypatch, causal: bool) -> None:
    """A power of two c of blocks of ⌈T_q / c⌉ rows tile [0, T_q) without gaps or empty blocks, within
    ``ATTENTION_BLOCK_ELEMENTS`` unless c is at its bound 2c(2c − 1) ≤ T_q; a compiled blocked kernel
    compiles again only when c changes, not at every length (``range(0, T_q, rows)`` fixed T_q: a compiled
    quadratic GAU past 2,048 tokens compiled once per length), also where the bound holds c (97–110 tokens
    here, as past 23k tokens with the real bound)."""
    monkeypatch.setattr(gau_kernels, "ATTENTION_BLOCK_ELEMENTS", 256)
    offset = 0 if causal else None
    for queries in range(1, 300):
        blocks = gau_kernels._query_blocks(queries, queries, offset)
        count, rows = len(blocks), max(1, 256 // queries)
        assert [start for start, _, _ in blocks] == [0] + [stop for _, stop, _ in blocks[:-1]]
        assert blocks[-1][1] == queries and all(start < stop for start, stop, _ in blocks)
        assert count & (count - 1) == 0
        largest = max(stop - start for start, stop, _ in blocks)
        assert largest <= rows or 2 * count * (2 * count - 1) > queries, (queries, count, largest)
        assert all(limit == (stop if causal else queries) for _, stop, limit in blocks)
    graphs = []

    def count_graphs(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return gau_kernels.relu2_attention(q, k, v, mask, offset, blocked=True)

    # 17–22 tokens: 256 // length = 15 … 11 rows, 2 blocks; 97–110: 2 rows, 8 blocks (the bound on c)
    for lengths, count in ((range(17, 23), 2), (range(97, 111), 8)):
        torch.compiler.reset()  # nothing cached from another test or the other lengths
        graphs.clear()
        compiled = torch.compile(run, backend=count_graphs)
        for length in lengths:
            assert len(gau_kernels._query_blocks(length, length, offset)) == count
            generator = torch.Generator().manual_seed(length)
            inputs = [torch.randn(1, length, 4, generator=generator) for _ in range(3)]
            mask = torch.ones(1, length, length, dtype=torch.bool).tril() if causal else None
            expected = gau_kernels.relu2_attention(*inputs, mask, None)
            # float32 sums of terms up to ~300 that cancel: 1e-6 of the largest output
            torch.testing.assert_close(compiled(*inputs, mask), expected, rtol=0,
                                       atol=1e-6 * float(expected.abs().max()))
        assert len(graphs) <= 2  # the first length's, then one graph for every other (one per length before)
