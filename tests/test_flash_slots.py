"""FLASH in vLLM's slots without vLLM (``serving/flash_slots.py``): prefills and decoding steps in the order
vLLM runs them equal FLASH over each whole sequence, and the decoding step is one a CUDA graph can capture.

vLLM's GPU runner captures batches of one-token decodes in CUDA graphs (its linear-attention backend allows
it) unless ``enforce_eager`` is set. A captured step may not read a tensor back to the host, take a shape from
the data, or branch on a tensor. The old step read ``int(opened.max())`` for the rows to read, and took shapes
from ``closing.nonzero()`` for the chunks to fold and ``index[written]`` for the states to write.
``tests/test_cuda.py`` captures
the step in a CUDA graph on a GPU; here ``FakeTensorMode`` stands in for the capture.
"""

from __future__ import annotations

import pytest
import torch

from hf_attn_variants import GAUForCausalLM
from hf_attn_variants.models.gau_kernels import flash_mixed_chunk_attention
from hf_attn_variants.models.modeling_gau import FlashInputs
from hf_attn_variants.serving.flash_slots import SequenceState, decode_in_slots
from tests.test_gau import tiny_config
from tests.utils import one_thread  # noqa: F401 (autouse fixture)

CHUNK = 4
SLOTS = 6


def flash_unit(chunk_size: int = CHUNK):
    """The first FLASH unit of a tiny causal GAU (s = 8, e = 64)."""
    torch.manual_seed(0)
    return GAUForCausalLM(tiny_config(chunk_size=chunk_size, attention_normalization="relu2",
                                             is_decoder=True)).model.layers[0].gau


def sequence_inputs(unit, length: int, seed: int, device: torch.device | str = "cpu") -> FlashInputs:
    """Random FLASH inputs ``[1, length, ·]`` of one sequence (scaled so that both parts of FLASH count)."""
    generator = torch.Generator().manual_seed(seed)
    size, width = unit.key_size, unit.width

    def draw(columns: int) -> torch.Tensor:
        return (torch.randn(1, length, columns, generator=generator) * 0.5).to(device)

    return FlashInputs(draw(size), draw(size), draw(size), draw(size), draw(width), None)


def reference(unit, x: FlashInputs) -> torch.Tensor:
    """FLASH over the whole sequence (the dense W), ``[length, E]``."""
    return flash_mixed_chunk_attention(*x.tensors(), chunk_size=unit.chunk_size, causal=True,
                                       implementation="reference")[0][0]


def empty_slots(unit, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """vLLM's state tensors for ``SLOTS`` sequences, NaN where nothing was written (the step must never read
    a row it has not written)."""
    g, s, e = unit.chunk_size, unit.key_size, unit.width
    return tuple(torch.full((SLOTS, *shape), float("nan"), device=device)
                 for shape in ((g, 2 * s), (g, e), (s, e), (s, e)))


def prefill(unit, slots, slot: int, x: FlashInputs, start: int, end: int) -> torch.Tensor:
    """Tokens ``start:end`` of a sequence as one prefill from its slot (``start`` tokens already in it)."""
    part = FlashInputs(*(t[:, start:end] for t in x.tensors()), None)
    state = SequenceState(slots, slot, start, unit.chunk_size, unit.key_size)
    return unit.continue_from(state, part, "chunk")[0]


def decode_batch(inputs: dict[int, FlashInputs],
                 positions: dict[int, int]) -> tuple[FlashInputs, torch.Tensor]:
    """The one-token rows ``[B, 1, ·]`` of the sequences in ``inputs`` (keyed by slot) at ``positions``."""
    tensors = [torch.cat([x.tensors()[i][:, positions[slot]][:, None] for slot, x in inputs.items()])
               for i in range(5)]
    return FlashInputs(*tensors, None), torch.tensor([positions[slot] for slot in inputs])


@pytest.mark.parametrize("bounded", [False, True], ids=["every-row", "open-rows"])
def test_prefills_and_decodes_in_slots_equal_flash_over_each_whole_sequence(bounded: bool) -> None:
    """Three sequences as vLLM runs them: prompts of 3, 4 (a chunk) and 7 tokens (the last in two pieces,
    split mid-chunk), then 9 decoding steps in one batch, each row at its own place in its chunk; then a
    prefix-cache hit: a copy of one slot continued by a prefill of 6 more tokens. The steps read every row of
    the open chunk (as under a CUDA graph) or the first max(r) + 1 (eager)."""
    unit = flash_unit()
    slots = empty_slots(unit)
    lengths = {1: 3, 2: 4, 3: 7}
    inputs = {slot: sequence_inputs(unit, lengths[slot] + 9 + 6, seed=slot) for slot in lengths}
    got = {slot: [] for slot in lengths}
    got[1].append(prefill(unit, slots, 1, inputs[1], 0, 3))
    got[2].append(prefill(unit, slots, 2, inputs[2], 0, 4))
    got[3].append(prefill(unit, slots, 3, inputs[3], 0, 2))
    got[3].append(prefill(unit, slots, 3, inputs[3], 2, 7))
    positions = dict(lengths)
    index = torch.tensor(list(inputs))
    for _ in range(9):
        rows, at = decode_batch(inputs, positions)
        bound = int((at % unit.chunk_size).max()) + 1 if bounded else None
        numerators = decode_in_slots(unit, rows, slots, index, at, bound)
        for row, slot in enumerate(inputs):
            got[slot].append(numerators[row])
            positions[slot] += 1
    for slot in lengths:
        want = reference(unit, inputs[slot])[: positions[slot]]
        torch.testing.assert_close(torch.cat(got[slot]), want, atol=1e-5, rtol=1e-4)
    for tensor in slots:  # the prefix cache copies a slot whole
        tensor[5] = tensor[1]
    resumed = prefill(unit, slots, 5, inputs[1], positions[1], positions[1] + 6)
    torch.testing.assert_close(resumed, reference(unit, inputs[1])[positions[1]:], atol=1e-5, rtol=1e-4)


def test_a_one_token_prompt_decoded_on_a_used_slot_starts_from_empty_sums() -> None:
    """vLLM's linear backend counts a one-token prompt as a decode, at position 0, in a slot an earlier
    sequence may have filled: its sums start at zero (without that, the earlier sequence's S and O were added
    to it, and served tokens differed from ``generate``)."""
    unit = flash_unit()
    slots = empty_slots(unit)
    earlier = sequence_inputs(unit, 9, seed=5)
    prefill(unit, slots, 1, earlier, 0, 7)
    for position in (7, 8):
        rows = FlashInputs(*(t[:, position:position + 1] for t in earlier.tensors()), None)
        decode_in_slots(unit, rows, slots, torch.tensor([1]), torch.tensor([position]))
    x = sequence_inputs(unit, 6, seed=7)
    got = []
    for position in range(6):
        rows = FlashInputs(*(t[:, position:position + 1] for t in x.tensors()), None)
        got.append(decode_in_slots(unit, rows, slots, torch.tensor([1]), torch.tensor([position]))[0])
    torch.testing.assert_close(torch.cat(got), reference(unit, x), atol=1e-5, rtol=1e-4)


def test_padding_rows_of_a_captured_batch_touch_only_the_null_slot() -> None:
    """vLLM pads a captured batch with rows at position 0 whose slot is its null block (0), holding anything:
    the real rows' numerators and slots are those of the batch without them."""
    unit = flash_unit()
    slots = empty_slots(unit)
    inputs = {slot: sequence_inputs(unit, 6, seed=slot) for slot in (1, 2)}
    for slot, length in ((1, 3), (2, 5)):
        prefill(unit, slots, slot, inputs[slot], 0, length)
    alone = tuple(tensor.clone() for tensor in slots)
    rows, at = decode_batch(inputs, {1: 3, 2: 5})
    want = decode_in_slots(unit, rows, alone, torch.tensor([1, 2]), at)
    padding = sequence_inputs(unit, 1, seed=9)
    padded = FlashInputs(*(torch.cat([a, b, b]) for a, b in zip(rows.tensors(), padding.tensors())), None)
    positions = torch.cat([at, torch.zeros(2, dtype=torch.long)])
    got = decode_in_slots(unit, padded, slots, torch.tensor([1, 2, 0, 0]), positions)
    torch.testing.assert_close(got[:2], want)
    for tensor, kept in zip(slots, alone):
        torch.testing.assert_close(tensor[1:], kept[1:], equal_nan=True)


def test_the_decoding_step_needs_no_value_of_its_tensors() -> None:
    """Under ``FakeTensorMode`` tensors have shapes and no values, as in a CUDA graph's capture: a read back
    to the host (``.item()``, ``.tolist()``, ``int(tensor)``) raises ``DataDependentOutputException`` and a
    shape from the data (``nonzero``) ``DynamicOutputShapeException``. The old step raised the first
    (``int(opened.max())``); the step runs through."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    unit = flash_unit()
    slots = empty_slots(unit)
    inputs = {slot: sequence_inputs(unit, 6, seed=slot) for slot in (1, 2, 3)}
    for slot, length in ((1, 3), (2, 4), (3, 5)):
        prefill(unit, slots, slot, inputs[slot], 0, length)
    rows, at = decode_batch(inputs, {1: 3, 2: 4, 3: 5})
    with FakeTensorMode(allow_non_fake_inputs=True):
        numerator = decode_in_slots(unit, rows, slots, torch.tensor([1, 2, 3]), at)
    assert tuple(numerator.shape) == (3, 1, unit.width)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_decoding_in_slots_of_the_model_dtype_keeps_a_float32_state(dtype: torch.dtype) -> None:
    """A bf16 model's slots hold bf16 keys and values and float32 sums; the step's products run in float32, so
    its numerators stay within bf16's rounding of the inputs of the float32 reference."""
    unit = flash_unit()
    slots = tuple(tensor.to(dtype) for tensor in empty_slots(unit)[:2]) + empty_slots(unit)[2:]
    x = sequence_inputs(unit, 11, seed=3)
    low = FlashInputs(*(t.to(dtype) for t in x.tensors()), None)
    got = [prefill(unit, slots, 1, low, 0, 5)]
    for position in range(5, 11):
        rows = FlashInputs(*(t[:, position:position + 1] for t in low.tensors()), None)
        got.append(decode_in_slots(unit, rows, slots, torch.tensor([1]), torch.tensor([position]))[0])
    assert slots[2].dtype == slots[3].dtype == torch.float32
    want = reference(unit, FlashInputs(*(t.float() for t in low.tensors()), None))
    torch.testing.assert_close(torch.cat(got).float(), want, atol=2e-2, rtol=2e-2)
