"""Packed FLASH in linear time (issue 38): rows packing several documents through ``DocumentChunks``.

Every document of a packed row starts on a chunk boundary of its own, so the chunked kernels run it as if
alone and no n×n tensor is built. The bar is the lone runs, as in tests/test_packed_documents.py: logits,
per-document losses and parameter gradients of a packed row equal those of its documents run one by one
— causal and bidirectional, for chunk sizes that divide the document lengths and chunk sizes that do not, and
with a leading padding document (a packer's left padding: its labels ignored). The O(n) path also equals the
named O(n²) reference (``flash_documents``), never calls it, and its Triton variant (interpreted on CPU)
equals the torch one.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from hf_attn_variants import GAUForCausalLM, GAUForMaskedLM
from hf_attn_variants.models import gau_kernels, modeling_gau
from hf_attn_variants.models.gau_kernels import DocumentChunks, flash_mixed_chunk_attention
from hf_attn_variants.models.layers import document_positions, packed_document_ids
from tests.test_gau import tiny
from tests.utils import needs_triton, random_ids

ROWS = ((8, 8, 16), (16, 4, 12))
"""Document lengths of the two packed rows: multiples of 4 (chunk 4 divides every document)."""
UNEVEN = ((5, 11, 8), (9, 3, 12))
"""Lengths that chunks of 4 and 8 do not divide, starts off the row's chunk grid."""
PADDED = ((3, 9, 12), (6, 10, 8))
"""The first document of each row is padding (pad ids, labels ignored): a packer's left padding."""
PAD_ID = 0


def packed(lengths: tuple[tuple[int, ...], ...], seed: int = 0):
    """(input_ids, position_ids) of the packed rows and each row's documents ``(1, L)``."""
    documents = [[random_ids(1, length, seed=seed + 10 * row + index)
                  for index, length in enumerate(row_lengths)]
                 for row, row_lengths in enumerate(lengths)]
    ids = torch.cat([torch.cat(row, dim=1) for row in documents])
    positions = torch.stack([torch.cat([torch.arange(length) for length in row]) for row in lengths])
    return ids, positions, documents


def model_for(objective: str, chunk: int, **overrides):
    model_class = GAUForCausalLM if objective == "causal" else GAUForMaskedLM
    return tiny(model_class, attention_normalization="relu2", chunk_size=chunk, **overrides)


def spans(lengths: tuple[int, ...]) -> list[slice]:
    ends = list(itertools.accumulate(lengths, initial=0))
    return [slice(a, b) for a, b in itertools.pairwise(ends)]


CASES = [
    pytest.param(ROWS, 4, id="chunk-divides"),
    pytest.param(UNEVEN, 4, id="chunk4-uneven"),
    pytest.param(UNEVEN, 8, id="chunk8-uneven"),
    pytest.param(PADDED, 4, id="left-padding"),
]


@pytest.mark.parametrize("objective", ["causal", "masked"])
@pytest.mark.parametrize(("lengths", "chunk"), CASES)
def test_packed_flash_logits_losses_and_gradients_equal_the_lone_runs(lengths, chunk, objective) -> None:
    model = model_for(objective, chunk)
    ids, positions, documents = packed(lengths)
    labels = ids.clone()
    labels[positions == 0] = -100  # a document's first token is not predicted across the boundary
    first_is_padding = lengths is PADDED
    if first_is_padding:
        for row, row_lengths in enumerate(lengths):
            ids[row, : row_lengths[0]] = PAD_ID
            labels[row, : row_lengths[0]] = -100
            documents[row][0] = ids[row : row + 1, : row_lengths[0]]
    model.zero_grad()
    out = model(ids, position_ids=positions)
    logits = out.logits
    token_losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1) if objective == "causal" else logits.flatten(0, 1),
        (labels[:, 1:] if objective == "causal" else labels).flatten(), reduction="none", ignore_index=-100,
    )
    token_losses.sum().backward()
    packed_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    total = 0.0
    scale = logits.abs().max().item()
    for row, row_lengths in enumerate(lengths):
        for index, (where, document) in enumerate(zip(spans(row_lengths), documents[row])):
            alone = model(document).logits
            torch.testing.assert_close(logits[row, where], alone[0], atol=2e-5 * scale, rtol=0)
            if first_is_padding and index == 0:
                continue
            lone_labels = document.clone()
            lone_labels[0, 0] = -100
            lone = torch.nn.functional.cross_entropy(
                (alone[0, :-1] if objective == "causal" else alone[0]),
                (lone_labels[0, 1:] if objective == "causal" else lone_labels[0]), reduction="sum",
                ignore_index=-100,
            )
            total = total + lone
    total.backward()
    for name, parameter in model.named_parameters():
        if parameter.grad is None:
            continue
        reference = parameter.grad
        torch.testing.assert_close(packed_grads[name], reference,
                                   atol=2e-5 * reference.abs().max().item() + 1e-7, rtol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")
    expected = float(total)
    torch.testing.assert_close(float(token_losses.sum()), expected, atol=1e-4 * abs(expected), rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_the_linear_path_equals_the_reference_and_never_builds_it(causal, monkeypatch) -> None:
    model_class = GAUForCausalLM if causal else GAUForMaskedLM
    ids, positions, _ = packed(UNEVEN)
    reference = tiny(model_class, attention_normalization="relu2", chunk_size=4, gau_kernel="reference")
    with torch.no_grad():
        expected = reference(ids, position_ids=positions).logits
    linear = tiny(model_class, attention_normalization="relu2", chunk_size=4)

    def refuse(*args, **kwargs):
        raise AssertionError("the O(n) packed path built the n×n reference")

    paths = []
    original = modeling_gau.GatedAttentionUnit.attention_path
    monkeypatch.setattr(modeling_gau, "flash_effective_weights", refuse)
    monkeypatch.setattr(modeling_gau, "flash_visibility", refuse)
    monkeypatch.setattr(modeling_gau.GatedAttentionUnit, "attention_path",
                        lambda self, *a, **k: paths.append(original(self, *a, **k)) or paths[-1])
    with torch.no_grad():
        got = linear(ids, position_ids=positions).logits
    assert set(paths) == {"flash_packed"}
    torch.testing.assert_close(got, expected, atol=2e-5 * expected.abs().max().item(), rtol=0)


def test_the_layout_is_linear_and_puts_every_document_on_a_chunk_boundary() -> None:
    _, positions, _ = packed(UNEVEN)
    document_ids = packed_document_ids(positions)
    tokens = torch.arange(positions.numel()).view_as(positions)[..., None].float()
    for chunk in (4, 8):
        layout = DocumentChunks.build(document_ids, chunk)
        assert layout.slots <= positions.shape[1] + 3 * (chunk - 1) and layout.slots % chunk == 0
        slots = layout.gather(tokens + 1)[..., 0]  # token number + 1 in each slot, 0 where empty
        assert torch.equal(slots > 0, layout.valid) and int(layout.valid.sum()) == positions.numel()
        starts = (slots.flatten(1)[:, ::chunk] - 1).long()  # the token opening each chunk
        # chunks start at document positions
        assert (positions.flatten()[starts[starts >= 0]] % chunk == 0).all()
        first = positions == 0
        slot_of = {int(t): i for row in range(2) for i, t in enumerate(slots[row].tolist()) if t > 0}
        # every document opens a chunk
        assert all(slot_of[int(t) + 1] % chunk == 0 for t in tokens[first][..., 0])
        assert torch.equal(layout.restore(layout.gather(tokens)), tokens)
    whole = DocumentChunks.build(packed_document_ids(packed(ROWS)[1]), 4)
    assert whole.valid is None and whole.source is None and whole.slots == sum(ROWS[0])  # nothing to move


@pytest.mark.parametrize("causal", [True, False])
def test_segmented_sums_equal_each_document_alone(causal) -> None:
    """The kernel level: a packed row through ``segments`` equals each document through the plain kernel."""
    generator = torch.Generator().manual_seed(3)
    lengths, chunk = (7, 13, 4), 4
    document_ids = packed_document_ids(torch.cat([torch.arange(n) for n in lengths])[None])
    layout = DocumentChunks.build(document_ids, chunk)
    def make(width: int) -> torch.Tensor:
        return torch.randn(1, sum(lengths), width, generator=generator)

    qs = [make(8) for _ in range(4)]
    v = make(6)
    aligned = [layout.gather(x) for x in (*qs, v)]
    numerator, _ = flash_mixed_chunk_attention(*aligned, chunk_size=chunk, causal=causal,
                                               key_mask=layout.valid, segments=layout.segment)
    got = layout.restore(numerator)
    for where in spans(lengths):
        alone, _ = flash_mixed_chunk_attention(*(x[:, where] for x in (*qs, v)), chunk_size=chunk,
                                               causal=causal)
        torch.testing.assert_close(got[:, where], alone, atol=1e-5, rtol=1e-5)


@needs_triton()
@pytest.mark.parametrize("causal", [True, False])
def test_the_triton_packed_path_equals_the_torch_one(causal) -> None:
    model_class = GAUForCausalLM if causal else GAUForMaskedLM
    ids, positions, _ = packed(UNEVEN)
    results = {}
    for kernel in ("torch", "triton"):
        model = tiny(model_class, attention_normalization="relu2", chunk_size=4, gau_kernel=kernel)
        logits = model(ids, position_ids=positions).logits
        logits.square().sum().backward()
        results[kernel] = (logits.detach(),
                           {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(results["triton"][0], results["torch"][0], atol=1e-4, rtol=1e-4)
    for name, grad in results["torch"][1].items():
        torch.testing.assert_close(results["triton"][1][name], grad,
                                   atol=1e-4 * grad.abs().max().item() + 1e-6, rtol=1e-4)


def test_packed_flash_keeps_no_row_by_row_term(monkeypatch) -> None:
    """Linear in n: a 2048-token row of 64 documents goes through the O(n) path with at most T + D·(g − 1)
    slots, and the segmented sums touch no C×C term (checked by the shapes they receive)."""
    lengths = ((32,) * 64,)
    ids, positions, _ = packed(lengths)
    model = model_for("causal", 16)
    shapes = []
    original = gau_kernels.segmented_chunk_sums
    monkeypatch.setattr(gau_kernels, "segmented_chunk_sums",
                        lambda summaries, segments, causal: shapes.append(summaries.shape) or original(
                            summaries, segments, causal))
    with torch.no_grad():
        model(ids, position_ids=positions)
    assert shapes and all(shape[1] == 2048 // 16 for shape in shapes)


def random_packing(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``[B, T]`` document ids: contiguous runs, a new document at a token with probability 0.2."""
    starts = torch.rand(batch, length, generator=generator) < 0.2
    starts[:, 0] = False
    return starts.long().cumsum(1)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_the_windows_path_equals_the_reference_for_any_packing(causal) -> None:
    """``flash_packed_windows`` (while compiling: no layout) against W per document, in float64: documents
    starting anywhere in the row's chunks, padding keys, lengths the chunk does not divide, gradients of all
    five inputs included."""
    generator = torch.Generator().manual_seed(7)
    for trial, (length, chunk) in enumerate(itertools.product((1, 5, 16, 37), (1, 3, 4, 8))):
        document_ids = random_packing(2, length, generator)
        key_mask = (torch.rand(2, length, generator=generator) > 0.2) if trial % 2 else None
        inputs = [torch.randn(2, length, width, generator=generator, dtype=torch.float64, requires_grad=True)
                  for width in (3, 3, 3, 3, 4)]
        got = gau_kernels.flash_packed_windows(*inputs, document_ids=document_ids, chunk_size=chunk,
                                               causal=causal, key_mask=key_mask)
        visibility = gau_kernels.flash_visibility(document_positions(document_ids), chunk, causal,
                                                  document_ids)
        weights = gau_kernels.flash_effective_weights(*inputs[:4], chunk_size=chunk, causal=causal,
                                                      key_mask=key_mask, visibility=visibility)
        expected = weights @ inputs[4]
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
        grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_compiled_packed_flash_runs_in_linear_time_as_one_graph(objective, monkeypatch) -> None:
    """Compiled (``fullgraph=True``: no layout on the host), packed rows take ``flash_windows``: the same
    logits and parameter gradients as eager (which equals the lone runs above), and no n×n matrix."""
    model = model_for(objective, 4)
    ids, positions, _ = packed(UNEVEN)

    def run(module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logits = module(ids, position_ids=positions).logits
        logits.square().sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    expected, expected_grads = run(model)

    def refuse(*args, **kwargs):
        raise AssertionError("the compiled packed path built the n×n reference")

    monkeypatch.setattr(modeling_gau, "flash_effective_weights", refuse)
    assert modeling_gau.gau_attention_path(model.config, 24, 24, causal=objective == "causal", device="cpu",
                                           dtype=torch.float32, packed=True, layout=False) == "flash_windows"
    torch.compiler.reset()  # a fresh compile: nothing of other tests' graphs or dynamic values
    logits, grads = run(torch.compile(model, backend="aot_eager", fullgraph=True))
    torch.testing.assert_close(logits, expected, atol=2e-5 * expected.abs().max().item(), rtol=0)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=2e-5 * grad.abs().max().item() + 1e-7, rtol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")
