"""Left-padded FLASH rows are computed as they are alone: chunks start at each row's first token.

FLASH groups tokens into chunks of g. Batched ``generate`` and pipelines pad on the left, so a row padded by a
number of tokens that g does not divide used to be chunked at other places than alone (its outputs differed).
Outside training, each row is now rotated so that its chunks start at its first token (``roll_rows``), and a
cache keeps every row's own grid (``GAUChunkCacheLayer.phases``). Training keeps the columns' own chunks (no
host read; collators pad on the right). Everything here runs in float64: the comparisons are exact up to
rounding.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import DynamicCache

from hf_attn_variants import GAUConfig, GAUForCausalLM, GAUForMaskedLM
from hf_attn_variants.models import modeling_gau
from hf_attn_variants.models.compat import CACHE_FIELD, version_tuple
from hf_attn_variants.models.gau_cache import GAUChunkCacheLayer
from tests.utils import left_padded, needs_triton, random_ids

VOCAB = 97
CHUNK = 4
LENGTHS = [11, 6, 9, 3, 7]  # left padding 0, 5, 2, 8 (two chunks), 4 (one chunk)
WIDTH = max(LENGTHS)


def flash(model_class: type = GAUForCausalLM, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    fields = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "attention_key_size": 16,
              "attention_normalization": "relu2", "chunk_size": CHUNK, "initializer_range": 0.2}
    config = GAUConfig(**{**fields, **overrides})
    return model_class(config).double().eval()


def prompts() -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The left-padded batch, its mask, and each row's prompt alone."""
    ids = random_ids(len(LENGTHS), WIDTH, vocab=VOCAB, seed=5).clamp(min=1)
    padded, mask = left_padded(ids, LENGTHS)
    return padded, mask, [padded[row:row + 1, WIDTH - n:] for row, n in enumerate(LENGTHS)]


@pytest.mark.parametrize("gau_kernel", ["auto", "reference"])
@pytest.mark.parametrize("model_class", [GAUForCausalLM, GAUForMaskedLM], ids=["causal", "masked"])
def test_left_padded_rows_equal_their_lone_runs(model_class: type, gau_kernel: str) -> None:
    """Logits and, through the reference, FLASH's effective map W / L of every real token."""
    model = flash(model_class, gau_kernel=gau_kernel)
    padded, mask, alone = prompts()
    maps = gau_kernel == "reference"
    with torch.no_grad():
        batch = model(input_ids=padded, attention_mask=mask, output_attentions=maps)
        assert bool(batch.attentions) == maps
        for row, (n, ids) in enumerate(zip(LENGTHS, alone)):
            lone = model(input_ids=ids, output_attentions=maps)
            torch.testing.assert_close(batch.logits[row, WIDTH - n:], lone.logits[0], atol=1e-12, rtol=0)
            for got, expected in zip(batch.attentions or (), lone.attentions or ()):
                torch.testing.assert_close(got[row, 0, WIDTH - n:, WIDTH - n:], expected[0, 0], atol=1e-12,
                                           rtol=0)


@pytest.mark.parametrize("search", [{"num_beams": 1}, {"num_beams": 3, "num_return_sequences": 2}],
                         ids=["greedy", "beams"])
def test_batched_generate_equals_one_prompt_at_a_time(search: dict) -> None:
    """Greedy (tokens and every step's scores) and beam search (its cache reorders and repeats rows)."""
    model = flash()
    padded, mask, alone = prompts()
    options = {"max_new_tokens": 2 * CHUNK + 1, "do_sample": False, "pad_token_id": 0, "output_scores": True,
               "return_dict_in_generate": True, **search}
    with torch.no_grad():
        batch = model.generate(input_ids=padded, attention_mask=mask, **options)
        copies = search.get("num_return_sequences", 1)
        for row, ids in enumerate(alone):
            lone = model.generate(input_ids=ids, **options)
            for copy in range(copies):
                got = batch.sequences[row * copies + copy, WIDTH:]
                assert torch.equal(got, lone.sequences[copy, ids.shape[1]:]), (row, copy)
                if copies == 1:
                    for step, (a, b) in enumerate(zip(batch.scores, lone.scores)):
                        torch.testing.assert_close(a[row], b[0], atol=1e-10, rtol=0,
                                                   msg=f"row {row} step {step}")


def test_a_cache_of_rows_on_their_own_grids_continues_by_several_tokens_then_one() -> None:
    """Prefill, then 5 tokens in one call (the op row by row), then single steps: every new token's logits
    equal the row's lone full forward, and the layer keeps each row's phase."""
    model = flash()
    padded, mask, alone = prompts()
    more = random_ids(len(LENGTHS), 8, vocab=VOCAB, seed=9).clamp(min=1)
    with torch.no_grad():
        cache = getattr(model(input_ids=padded, attention_mask=mask, use_cache=True), CACHE_FIELD)
        layer = cache.layers[0]
        assert isinstance(layer, GAUChunkCacheLayer)
        assert layer.phases == tuple((WIDTH - n) % CHUNK for n in LENGTHS)
        assert layer.open_lengths(CHUNK) == [n % CHUNK for n in LENGTHS]
        pieces, seen = [], mask
        for new in (more[:, :5], more[:, 5:6], more[:, 6:7], more[:, 7:]):
            seen = torch.cat([seen, torch.ones_like(new)], dim=1)
            out = model(input_ids=new, attention_mask=seen, use_cache=True, **{CACHE_FIELD: cache})
            pieces.append(out.logits)
            cache = getattr(out, CACHE_FIELD)
        got = torch.cat(pieces, dim=1)
        for row, ids in enumerate(alone):
            lone = model(input_ids=torch.cat([ids, more[row:row + 1]], dim=1)).logits[0, ids.shape[1]:]
            torch.testing.assert_close(got[row], lone, atol=1e-10, rtol=0, msg=f"row {row}")


@pytest.mark.parametrize("prompt_pieces", [[(0, 4), (4, 8), (8, WIDTH)],
                                           [(0, 8), *[(n, n + 1) for n in range(8, WIDTH)]]],
                         ids=["pieces", "then-single-tokens"])
def test_a_prompt_given_in_pieces_where_some_rows_are_still_padding(prompt_pieces: list) -> None:
    """A prefill in pieces (as ``prefill_chunk_size`` does): rows padded by 5 and 8 see padding only in the
    first piece(s); each row's first token sets its grid, whichever call brings it (a piece or one step)."""
    model = flash()
    padded, mask, alone = prompts()
    more = random_ids(len(LENGTHS), 3, vocab=VOCAB, seed=4).clamp(min=1)
    ids, seen = torch.cat([padded, more], dim=1), torch.cat([mask, torch.ones_like(more)], dim=1)
    pieces, cache = [], None
    with torch.no_grad():
        for start, stop in [*prompt_pieces, *[(n, n + 1) for n in range(WIDTH, WIDTH + 3)]]:
            out = model(input_ids=ids[:, start:stop], attention_mask=seen[:, :stop], use_cache=True,
                        **({} if cache is None else {CACHE_FIELD: cache}))
            pieces.append(out.logits)
            cache = getattr(out, CACHE_FIELD)
        got = torch.cat(pieces, dim=1)
        assert cache.layers[0].phases == tuple((WIDTH - n) % CHUNK for n in LENGTHS)
        for row, (n, prompt) in enumerate(zip(LENGTHS, alone)):
            lone = model(input_ids=torch.cat([prompt, more[row:row + 1]], dim=1)).logits[0]
            torch.testing.assert_close(got[row, WIDTH - n:], lone, atol=1e-10, rtol=0, msg=f"row {row}")


@pytest.mark.skipif(version_tuple(torch.__version__) < (2, 11), reason="dynamo 2.7 traces no causal GAU "
                    "forward with a cache as one graph (before this change too); 2.11 and 2.13 do")
def test_compiled_with_a_cache_is_one_graph_on_the_columns_chunks() -> None:
    """The rows' grids are host values, so a compiled prefill with a cache keeps the columns' chunks (no
    graph break; rows padded by whole chunks still equal their lone runs); without a cache it rotates."""
    model = flash()
    padded, mask, alone = prompts()
    graphs = []

    def count(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    torch.compiler.reset()
    compiled = torch.compile(model, backend=count, fullgraph=True)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        cached = compiled(input_ids=padded, attention_mask=mask, use_cache=True, **{CACHE_FIELD: cache})
        rotated = compiled(input_ids=padded, attention_mask=mask, use_cache=False).logits
        assert all(layer.phases is None for layer in getattr(cached, CACHE_FIELD).layers)
        for row, (n, prompt) in enumerate(zip(LENGTHS, alone)):
            lone = model(input_ids=prompt).logits[0]
            torch.testing.assert_close(rotated[row, WIDTH - n:], lone, atol=1e-12, rtol=0)
            if (WIDTH - n) % CHUNK == 0:
                torch.testing.assert_close(cached.logits[row, WIDTH - n:], lone, atol=1e-12, rtol=0)
    assert len(graphs) == 2  # one per use_cache


def test_rows_padded_by_whole_chunks_keep_the_plain_cache() -> None:
    """Nothing to rotate: one op call for the batch and no phases (the cache of an unpadded batch)."""
    model = flash()
    ids, mask = left_padded(random_ids(2, 9, vocab=VOCAB, seed=2).clamp(min=1), [9, 5])
    with torch.no_grad():
        cache = getattr(model(input_ids=ids, attention_mask=mask, use_cache=True), CACHE_FIELD)
    assert all(layer.phases is None for layer in cache.layers)


def test_phases_all_at_column_zero_return_to_the_plain_cache() -> None:
    """Rows padded by whole chunks, one of them padding only in the first piece: once its first token sets
    its phase (0), the layer drops the phases, and later calls take one op call for the batch again."""
    model = flash()
    ids, mask = left_padded(random_ids(3, 12, vocab=VOCAB, seed=8).clamp(min=1), [12, 8, 4])
    with torch.no_grad():
        cache = getattr(model(input_ids=ids[:, :8], attention_mask=mask[:, :8], use_cache=True), CACHE_FIELD)
        assert cache.layers[0].phases == (0, 0, None)
        model(input_ids=ids[:, 8:], attention_mask=mask, use_cache=True, **{CACHE_FIELD: cache})
    assert all(layer.phases is None for layer in cache.layers)


def test_selecting_rows_keeps_their_phases() -> None:
    layer = GAUChunkCacheLayer()
    keys, values = torch.zeros(3, 1, 3, 8), torch.zeros(3, 1, 3, 5)
    layer.store(keys, values, torch.zeros(3, 4, 5), added=7, chunk_size=CHUNK, phases=[0, 1, 3])
    assert layer.open_lengths(CHUNK) == [3, 2, 0]
    layer.batch_select_indices(torch.tensor([True, False, True]))
    assert layer.phases == (0, 3)
    layer.batch_repeat_interleave(2)
    assert layer.phases == (0, 0, 3, 3)
    layer.reorder_cache(torch.tensor([3, 0, 1, 2]))
    assert layer.phases == (3, 0, 0, 3)


def test_training_keeps_the_columns_chunks(monkeypatch) -> None:
    """A training step reads nothing on the host for this (no rotation): pad on the right to train."""
    model = flash().train()
    padded, mask, _ = prompts()

    def refuse(*args, **kwargs):
        raise AssertionError("a training step rotated its rows")

    monkeypatch.setattr(modeling_gau, "roll_rows", refuse)
    model(input_ids=padded, attention_mask=mask, labels=padded).loss.backward()


@needs_triton()
def test_the_triton_kernels_take_the_rotated_rows() -> None:
    """``gau_kernel="triton"`` (interpreted on CPU tensors, float32: the kernels refuse float64 on a GPU):
    each left-padded row equals its lone run through the same kernels, prefill and decoding."""
    model = flash(gau_kernel="triton").float()
    padded, mask, alone = prompts()
    options = {"max_new_tokens": CHUNK + 1, "do_sample": False, "pad_token_id": 0, "output_scores": True,
               "return_dict_in_generate": True}
    with torch.no_grad():
        batch = model.generate(input_ids=padded, attention_mask=mask, **options)
        for row, ids in enumerate(alone):
            lone = model.generate(input_ids=ids, **options)
            assert torch.equal(batch.sequences[row, WIDTH:], lone.sequences[0, ids.shape[1]:]), row
            for a, b in zip(batch.scores, lone.scores):
                torch.testing.assert_close(a[row], b[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("seed", range(16))
def test_random_paddings_pieces_and_chunk_sizes_equal_the_lone_runs(seed: int) -> None:
    """Random g (1–5), rows (2–4), prompt widths (1–10, rows of padding only included) and splits of the
    prompt and the new tokens into calls: every real token's logits equal its row's lone run."""
    rng = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=rng))

    chunk, rows, width, new = draw(1, 5), draw(2, 4), draw(1, 10), draw(1, 6)
    model = flash(chunk_size=chunk)
    lengths = [draw(0, width) for _ in range(rows)]
    ids = random_ids(rows, width + new, vocab=VOCAB, seed=seed).clamp(min=1)
    ids[:, :width], mask = left_padded(ids[:, :width], lengths)
    mask = torch.cat([mask, torch.ones(rows, new, dtype=mask.dtype)], dim=1)
    cuts, start = [], 0
    while start < width + new:
        stop = min(width + new, start + draw(1, 4))
        cuts.append((start, stop))
        start = stop
    pieces, cache = [], None
    with torch.no_grad():
        for start, stop in cuts:
            out = model(input_ids=ids[:, start:stop], attention_mask=mask[:, :stop], use_cache=True,
                        **({} if cache is None else {CACHE_FIELD: cache}))
            pieces.append(out.logits)
            cache = getattr(out, CACHE_FIELD)
        got = torch.cat(pieces, dim=1)
        for row, n in enumerate(lengths):
            lone = model(input_ids=ids[row:row + 1, width - n:]).logits[0]
            case = f"g={chunk} lengths={lengths} cuts={cuts} row {row}"
            torch.testing.assert_close(got[row, width - n:], lone, atol=1e-10, rtol=0,
                                       msg=lambda m, case=case: f"{case}: {m}")



class Float32Results(TorchDispatchMode):
    """The shapes of the float32 results of more than ``floor`` elements of the aten calls made inside."""

    def __init__(self, floor: int) -> None:
        super().__init__()
        self.floor = floor
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            float32 = isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
            if float32 and tensor.numel() > self.floor:
                self.shapes.add(tuple(tensor.shape))
        return out


@pytest.mark.parametrize("position_embedding_type", ["rope", "none"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["prefill", "forward"])
def test_a_bfloat16_run_of_padded_rows_makes_no_float32_activations(use_cache: bool,
                                                                    position_embedding_type: str) -> None:
    """Issue 47, no float32 activations: a bf16 left-padded batch, with a cache (each row's state summed
    per chunk, ``summed_state``) or without, makes no float32 tensor of more than one value per token but
    the s × e states (one per chunk, ``[B, c, s, e]``, and the sum ``[B, s, e]``) and what Llama makes as
    well: the RMSNorm's ``[B, T, d]`` and, with RoPE, its angles ``[B, T, s/2]`` and ``[B, T, s]``."""
    model = flash(chunk_size=16, attention_key_size=8,
                  position_embedding_type=position_embedding_type).to(torch.bfloat16)
    ids, mask = left_padded(random_ids(2, 64, vocab=VOCAB, seed=3).clamp(min=1), [64, 59])
    (batch, length), config = ids.shape, model.config
    key, width = config.attention_key_size, config.intermediate_width
    allowed = {(batch, length, config.hidden_size), (batch, key, width)}
    allowed |= {(batch, chunks, key, width) for chunks in range(1, length // 16 + 1)}
    if position_embedding_type == "rope":
        allowed |= {(batch, length, key), (batch, length, key // 2)}
    with torch.no_grad(), Float32Results(ids.numel()) as results:
        model(input_ids=ids, attention_mask=mask, use_cache=use_cache)
    assert results.shapes and results.shapes <= allowed, sorted(results.shapes - allowed)
