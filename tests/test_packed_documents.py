"""Packed documents: rows holding several documents, ``position_ids`` restarting at 0 at each one, no
attention mask.

The format of a packing data pipeline (issue 23). In every family, objective and kernel the documents of a
packed row must be computed as if each ran alone: (a) the logits of each document's slice equal its lone run,
(b) the per-layer nᵢ (the key counts behind the entropy-invariant factor and GAU's normalisers) equal the lone
run's, and (c) the causal LM loss of the packed row, with the label of every document's first token ignored,
is the token-weighted mean of the lone documents' losses. A guard checks each configuration would show mixing:
the same row with a mask of ones (which turns packing off) differs from the lone runs.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import find_packed_sequence_indices

from hf_attn_variants import (
    EntropyInvariantForCausalLM,
    EntropyInvariantForMaskedLM,
    GAUForCausalLM,
    GAUForMaskedLM,
    SynthesizerForCausalLM,
    SynthesizerForMaskedLM,
)
from hf_attn_variants.models.compat import output_cache, version_tuple
from hf_attn_variants.models.layers import document_lengths, document_positions, packed_document_ids
from hf_attn_variants.models.modeling_entropy_invariant import EntropyInvariantAttention
from hf_attn_variants.models.modeling_gau import GatedAttentionUnit
from tests.test_entropy_invariant import tiny as ei_tiny
from tests.test_gau import tiny as gau_tiny
from tests.test_synthesizer import tiny as synthesizer_tiny
from tests.utils import random_ids, rounding_tolerance

DOCUMENTS = ((5, 11, 8), (8, 5, 11))
"""Document lengths of the two packed rows (different splits per row); documents start at columns 5, 16 and 8,
13."""
LENGTH = sum(DOCUMENTS[0])
OBJECTIVES = {"causal": (EntropyInvariantForCausalLM, GAUForCausalLM, SynthesizerForCausalLM),
              "masked": (EntropyInvariantForMaskedLM, GAUForMaskedLM, SynthesizerForMaskedLM)}
FAMILY_INDEX = {"entropy_invariant": 0, "gau": 1, "synthesizer": 2}

FLEX_ABORTS = (version_tuple(torch.__version__) < (2, 13) and not torch.cuda.is_available()
               and torch.get_num_threads() > 1)
"""torch 2.11's inductor CPU kernel for flex attention aborts the process ("Fatal Python error: Aborted") on
these document masks, causal and bidirectional, with more than one thread: measured on 2.11.0 (the GPU
image's, whose CPU-tensor run has 16 threads and would lose every test after it; one thread passes), passes
on 2.13.0; 2.12 was not run. The GPU runs flex on CUDA (tests/test_cuda.py)."""
FLEX_MARKS = [pytest.mark.slow,
              pytest.mark.skipif(FLEX_ABORTS, reason="torch < 2.13's inductor CPU flex kernel aborts the "
                                 "process on a document mask (threads > 1)")]

CASES = [
    *[pytest.param("entropy_invariant", {"implementation": name}, id=f"ei-{name}",
                   marks=FLEX_MARKS if name == "flex_attention" else [])
      for name in ("eager", "sdpa", "flex_attention")],
    pytest.param("gau", {}, id="gau-quadratic-softmax_plus"),
    pytest.param("gau", {"attention_normalization": "relu2"}, id="gau-quadratic-relu2"),
    # Chunk 4 is shorter than every document, chunk 6 longer than the 5-token ones; most document starts lie
    # off the row's chunk grid, so the row's own chunks would straddle document boundaries.
    pytest.param("gau", {"attention_normalization": "relu2", "chunk_size": 4}, id="gau-flash-chunk4"),
    pytest.param("gau", {"attention_normalization": "relu2", "chunk_size": 6}, id="gau-flash-chunk6"),
    *[pytest.param("synthesizer", {"synthesizer_components": components},
                   id="synthesizer-" + "+".join(components))
      for components in (["dense"], ["random"], ["factorized_dense"], ["factorized_random"], ["vanilla"],
                         ["random", "vanilla"])],
]


def build(family: str, objective: str, options: dict):
    """A tiny random model (hidden 32, 2 layers, dropout 0, eval mode) of ``family`` with the head of
    ``objective``."""
    model_class = OBJECTIVES[objective][FAMILY_INDEX[family]]
    if family == "entropy_invariant":
        return ei_tiny(model_class, **{"attention_scale": "entropy_invariant", **options})
    if family == "gau":
        return gau_tiny(model_class, **options)
    return synthesizer_tiny(model_class, max_position_embeddings=32, **options)


def packed_batch() -> tuple[torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    """(input_ids, position_ids) of the packed rows ``(2, LENGTH)``, and each row's documents ``(1, L)``."""
    documents = [[random_ids(1, length, seed=10 * row + index) for index, length in enumerate(lengths)]
                 for row, lengths in enumerate(DOCUMENTS)]
    ids = torch.cat([torch.cat(row, dim=1) for row in documents])
    positions = torch.stack([torch.cat([torch.arange(length) for length in lengths])
                             for lengths in DOCUMENTS])
    return ids, positions, documents


def slices(row: int) -> list[slice]:
    starts = torch.tensor((0, *DOCUMENTS[row])).cumsum(0).tolist()
    return [slice(start, stop) for start, stop in itertools.pairwise(starts)]


def tolerance(model) -> float:
    """``rounding_tolerance`` of the stack: per layer the projections (hidden), the widest inner product (the
    feed-forward or GAU expansion) and the attention over the row; relative to the largest logit."""
    config = model.config
    width = getattr(config, "intermediate_size", None) or config.expansion_factor * config.hidden_size
    return rounding_tolerance(torch.float32, *[config.hidden_size, width, LENGTH] * config.num_hidden_layers,
                              safety=16.0)


def lone_runs_through_sdpa(model) -> None:
    """Switch a flex model to SDPA for its lone runs: each new shape compiles a flex kernel (~15 s on a 2-core
    CPU), and SDPA equals flex on ordinary inputs (tests/test_flex_attention.py). Other models are left
    alone."""
    if model.config._attn_implementation == "flex_attention":
        model.set_attn_implementation("sdpa")


def record_key_counts(model) -> list[torch.Tensor]:
    """nᵢ every attention module receives (``key_counts``), one entry per layer and call, in call order."""
    seen: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        if kwargs.get("key_counts") is not None:
            seen.append(kwargs["key_counts"].detach().clone())

    for module in model.modules():
        if isinstance(module, (EntropyInvariantAttention, GatedAttentionUnit)):
            module.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize("objective", ["causal", "masked"])
@pytest.mark.parametrize(("family", "options"), CASES)
def test_packed_documents_equal_their_lone_runs(family: str, options: dict, objective: str) -> None:
    model = build(family, objective, options)
    ids, positions, documents = packed_batch()
    key_counts = record_key_counts(model)
    with torch.no_grad():
        packed = model(ids, position_ids=positions).logits
    packed_counts = list(key_counts)
    scale = packed.abs().max().item()
    lone_runs_through_sdpa(model)
    with torch.no_grad():
        for row, row_documents in enumerate(documents):
            for where, document in zip(slices(row), row_documents):
                key_counts.clear()
                alone = model(document).logits[0]
                difference = (packed[row, where] - alone).abs().max().item()
                assert difference <= tolerance(model) * scale, f"row {row}, tokens {where}: {difference:.3g}"
                # (b) nᵢ per layer: the packed run's counts of this document are the lone run's.
                layers_with_counts = 0 if family == "synthesizer" else model.config.num_hidden_layers
                assert len(key_counts) == len(packed_counts) == layers_with_counts
                for layer, (lone, together) in enumerate(zip(key_counts, packed_counts)):
                    assert torch.equal(together[row, where], lone[0]), (layer, together[row, where], lone[0])
    with torch.no_grad():  # the guard: the same row with packing turned off (a mask) mixes the documents
        mixed = model(ids, position_ids=positions, attention_mask=torch.ones_like(ids)).logits
    later = slices(0)[1]
    assert (mixed[0, later] - packed[0, later]).abs().max().item() > 10 * tolerance(model) * scale


@pytest.mark.parametrize(("family", "options"), CASES)
def test_packed_causal_lm_loss_is_the_token_weighted_mean_of_the_lone_losses(family: str,
                                                                             options: dict) -> None:
    model = build(family, "causal", options)
    ids, positions, documents = packed_batch()
    labels = ids.clone()
    starts = positions == 0
    labels[starts] = -100  # a document's first token is not predicted from the previous document
    with torch.no_grad():
        packed = model(ids, position_ids=positions, labels=labels).loss
    lone_runs_through_sdpa(model)
    with torch.no_grad():
        losses = [(model(document, labels=document).loss, document.shape[1] - 1)
                  for row in documents for document in row]
    expected = sum(loss * count for loss, count in losses) / sum(count for _, count in losses)
    torch.testing.assert_close(packed, expected, atol=tolerance(model) * expected.item(), rtol=0.0)


def test_packed_runs_build_no_cache_and_a_given_cache_is_refused() -> None:
    """A cache continues one sequence per row: a packed causal forward in eval mode builds none, and one
    passed in is refused with an error naming it (it would continue across the documents)."""
    model = build("entropy_invariant", "causal", {"implementation": "sdpa"})
    ids, positions, _ = packed_batch()
    with torch.no_grad():
        assert output_cache(model(ids, position_ids=positions)) is None
        assert output_cache(model(ids, position_ids=torch.arange(LENGTH).expand(2, -1))) is not None
        with pytest.raises(ValueError, match="cache"):
            model(ids, position_ids=positions, cache=DynamicCache())


@pytest.mark.parametrize("family", ["entropy_invariant", "gau", "synthesizer"])
@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_positions_that_do_not_restart_are_the_ordinary_path(family: str, objective: str) -> None:
    """Increasing positions (or a mask) are not packing: no document ids, and the same outputs as without
    them."""
    model = build(family, objective,
                  {"chunk_size": 4, "attention_normalization": "relu2"} if family == "gau" else {})
    ids = random_ids(2, LENGTH)
    positions = torch.arange(LENGTH).expand(2, -1)
    backbone = model.model
    assert backbone._packed_documents(positions, None, None) is None
    assert backbone._packed_documents(packed_batch()[1], torch.ones_like(ids), None) is None
    with torch.no_grad():
        given, default = model(ids, position_ids=positions).logits, model(ids).logits
    assert (given - default).abs().max().item() <= tolerance(model) * default.abs().max().item()


COUNTED = [case for case in CASES if case.values[0] != "synthesizer" and "flex_attention" not in case.id]
"""The cases whose layers read nᵢ (the synthesizer reads none; flex equals SDPA and compiles per shape)."""


@pytest.mark.parametrize(("family", "options"), COUNTED)
def test_a_mask_decides_the_key_counts_over_given_positions(family: str, options: dict) -> None:
    """With an ``attention_mask``, nᵢ counts the keys the mask lets a query see, whatever ``position_ids``
    the caller passes: passing the default positions (0, 1, … over left padding) equals leaving them out,
    and positions restarting in a row with a mask of ones (not packing, as in Transformers: attention crosses
    the documents) count every earlier key of the row, not the document's."""
    model = build(family, "causal", options)
    ids, restarting, _ = packed_batch()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    seen = record_key_counts(model)
    with torch.no_grad():
        default = model(ids, attention_mask=mask).logits
        given = model(ids, attention_mask=mask, position_ids=torch.arange(LENGTH).expand(2, -1)).logits
        model(ids, attention_mask=torch.ones_like(ids), position_ids=restarting)
    real = mask.bool()
    torch.testing.assert_close(given[real], default[real])
    counted = mask.cumsum(-1).to(seen[0].dtype)
    for counts in seen[:len(seen) * 2 // 3]:
        torch.testing.assert_close(counts[real], counted[real])
    for counts in seen[len(seen) * 2 // 3:]:
        torch.testing.assert_close(counts, torch.arange(1, LENGTH + 1, dtype=counts.dtype).expand(2, -1))


def test_document_helpers() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7]])
    documents = packed_document_ids(positions)
    assert documents.tolist() == [[0, 0, 0, 1, 2, 2, 2, 2], [0] * 8]
    assert document_lengths(documents).tolist() == [[3, 3, 3, 1, 4, 4, 4, 4], [8] * 8]
    assert document_positions(documents).tolist() == positions.tolist()


def padding_free_probe(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                       position_ids=None, **kwargs):
    """A stand-in for flash attention on CPU: no mask, documents from ``position_ids`` in a batch of one row
    only (Transformers' padding-free format, read with its ``find_packed_sequence_indices``), else one
    sequence per row."""
    assert attention_mask is None
    length = query.shape[2]
    visible = torch.ones(length, length, dtype=torch.bool)
    documents = None if position_ids is None else find_packed_sequence_indices(position_ids)
    if documents is not None:
        assert query.shape[0] == 1, "padding-free attention reads one row"
        visible = documents[0, :, None] == documents[0, None, :]
    if module.is_causal:
        visible = visible & torch.ones_like(visible).tril()
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=visible,
                                                              scale=scaling)
    return output.transpose(1, 2).contiguous(), None


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_a_kernel_without_a_mask_gets_the_positions_and_more_than_one_row_is_refused(objective: str) -> None:
    """Flash-attention-like kernels take no mask: packed rows reach them with ``position_ids`` (one row), and
    a batch of several packed rows, which they would mix, raises an error naming ``attn_implementation``."""
    AttentionInterface.register("padding_free_probe", padding_free_probe)
    model = build("entropy_invariant", objective, {"implementation": "padding_free_probe"})
    ids, positions, documents = packed_batch()
    with torch.no_grad():
        packed = model(ids[:1], position_ids=positions[:1]).logits[0]
        for where, document in zip(slices(0), documents[0]):
            alone = model(document).logits[0]
            assert (packed[where] - alone).abs().max().item() <= tolerance(model) * packed.abs().max().item()
        with pytest.raises(ValueError, match="attn_implementation='padding_free_probe'"):
            model(ids, position_ids=positions)


@pytest.mark.parametrize(("family", "options"), [
    pytest.param("entropy_invariant", {"implementation": "sdpa"}, id="ei-sdpa"),
    pytest.param("gau", {"attention_normalization": "relu2"}, id="gau-quadratic-relu2"),
    pytest.param("gau", {"attention_normalization": "relu2", "chunk_size": 4}, id="gau-flash-chunk4"),
    pytest.param("synthesizer", {"synthesizer_components": ["random", "vanilla"]}, id="synthesizer"),
])
def test_packed_rows_compile_as_one_graph_that_reads_nothing_on_the_host(family: str, options: dict) -> None:
    """``torch.compile(fullgraph=True)`` of each family's packed causal LM: a read of a device value on the
    host (whether the rows pack documents, FLASH's layout) would break the graph and fail here, so the
    compiled step reads none (docs/training.md); its logits and loss equal eager's."""
    model = build(family, "causal", options)
    ids, positions, _ = packed_batch()
    with torch.no_grad():
        expected = model(ids, position_ids=positions, labels=ids)
        torch.compiler.reset()  # a fresh compile: nothing of other tests' graphs or dynamic values
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        got = compiled(ids, position_ids=positions, labels=ids)
    atol = tolerance(model) * expected.logits.abs().max().item()
    torch.testing.assert_close(got.logits, expected.logits, atol=atol, rtol=0)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("family", "options"), [
    pytest.param("entropy_invariant", {"implementation": "sdpa"}, id="ei-sdpa"),
    pytest.param("gau", {"attention_normalization": "softmax_plus"}, id="gau-quadratic"),
    pytest.param("gau", {"attention_normalization": "relu2", "chunk_size": 4}, id="gau-flash-chunk4"),
    pytest.param("synthesizer", {"synthesizer_components": ["random", "vanilla"]}, id="synthesizer"),
])
def test_compiled_checkpointed_training_takes_models_of_other_dropouts(family: str, options: dict) -> None:
    """``torch.compile(fullgraph=True)`` of a training step under gradient checkpointing, for a model of
    attention dropout 0.1, then 0.2, then 0 (a sweep in one process, the packed rows of the test above). A
    layer that read the dropout from the config in ``forward`` broke the second compile: dynamo makes the
    changed float symbolic and cannot lift it into the checkpoint's subgraph (``AssertionError:
    lift_tracked_freevar_to_input``, torch 2.13). Each attention reads it once when built, as Llama's does.
    Without dropout the compiled step equals eager's."""
    ids, positions, _ = packed_batch()
    torch.compiler.reset()
    for dropout in (0.1, 0.2, 0.0):
        fields = {**options, "attention_probs_dropout_prob": dropout, "use_cache": False}
        model = build(family, "causal", fields)
        model.train().gradient_checkpointing_enable()
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        loss = compiled(ids, position_ids=positions, labels=ids).loss
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads), dropout
        if dropout == 0.0:
            torch.testing.assert_close(loss, model(ids, position_ids=positions, labels=ids).loss)


@pytest.mark.parametrize(("family", "options", "field", "values"), [
    pytest.param("gau", {"attention_normalization": "softmax_plus"}, "base_length", (8, 64),
                 id="gau-softmax_plus-base_length"),
    pytest.param("gau", {"attention_normalization": "softmax_plus"}, "entropy_min_length", (2, 12),
                 id="gau-softmax_plus-entropy_min_length"),
    pytest.param("gau", {}, "attention_normalization", ("softmax", "softmax_plus"), id="gau-normalization"),
    pytest.param("gau", {"attention_normalization": "relu2", "relu2_length": "fixed"}, "base_length", (8, 64),
                 id="gau-relu2-fixed-base_length"),
    pytest.param("gau", {"attention_normalization": "relu2"}, "relu2_length", ("dynamic", "fixed"),
                 id="gau-relu2_length"),
    pytest.param("gau", {"attention_normalization": "relu2", "relu2_length": "fixed", "chunk_size": 4},
                 "base_length", (8, 64), id="flash-fixed-base_length"),
    pytest.param("entropy_invariant", {"base_length": 8}, "entropy_invariant_scope", ("all", "beyond"),
                 id="ei-scope"),
    pytest.param("entropy_invariant", {"entropy_invariant_scope": "all"}, "base_length", (8, 64),
                 id="ei-base_length"),
    pytest.param("entropy_invariant", {"attention_scale": "ssmax"}, "entropy_min_length", (2, 12),
                 id="ei-ssmax-entropy_min_length"),
    pytest.param("entropy_invariant", {}, "attention_scale", ("standard", "entropy_invariant"),
                 id="ei-attention_scale"),
])
def test_a_second_compiled_model_uses_its_own_config(family: str, options: dict, field: str,
                                                     values: tuple) -> None:
    """Two models compiled one after the other in one process, differing only in a config field their
    attention uses: each compiled model equals its own eager run, and the two runs differ.

    Dynamo below torch 2.11 installs no guard on an attribute read through a ``PreTrainedConfig`` (its class
    has its own ``__getattribute__``), so a field read in ``forward`` kept the first model's value in the
    second (logits off by up to 0.55 on torch 2.7). The modules read these fields once when built."""
    ids, positions, _ = packed_batch()
    torch.compiler.reset()
    runs = []
    for value in values:
        model = build(family, "causal", {**options, field: value, "use_cache": False})
        with torch.no_grad():
            expected = model(ids, position_ids=positions).logits
            got = torch.compile(model, backend="eager", fullgraph=True)(ids, position_ids=positions).logits
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5, msg=lambda m: f"{field}={value}: {m}")
        runs.append(expected)
    assert (runs[0] - runs[1]).abs().max() > 1e-4, f"{field}: both values give the same logits"


@pytest.mark.parametrize(("family", "options"), [
    pytest.param("gau", {"attention_normalization": "relu2", "relu2_length": "fixed", "chunk_size": 4},
                 id="flash-fixed"),
    pytest.param("gau", {"attention_normalization": "softmax_plus"}, id="gau-softmax_plus"),
    pytest.param("entropy_invariant", {"entropy_invariant_scope": "all"}, id="ei-all"),
])
def test_a_second_compiled_model_decodes_with_its_own_config(family: str, options: dict) -> None:
    """The decoding step (a cache of a left-padded prefill; FLASH's chunk cache) of two models compiled one
    after the other, differing only in ``base_length``: each equals its own eager step."""
    ids, _, _ = packed_batch()
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    torch.compiler.reset()
    runs = []
    for value in (8, 64):
        model = build(family, "causal", {**options, "base_length": value})
        compiled = torch.compile(model, backend="eager")
        with torch.no_grad():
            steps = [step(ids[:, -1:], attention_mask=mask, use_cache=True,
                          past_key_values=model(ids[:, :-1], attention_mask=mask[:, :-1],
                                                use_cache=True).past_key_values).logits
                     for step in (model, compiled)]
        torch.testing.assert_close(steps[1], steps[0], atol=1e-6, rtol=1e-5, msg=lambda m: f"{value}: {m}")
        runs.append(steps[0])
    assert (runs[0] - runs[1]).abs().max() > 1e-4, "both base lengths give the same step"
