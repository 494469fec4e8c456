"""Checks that need a CUDA GPU: ``scripts/gpu_check.sh`` runs them on one; elsewhere they skip.

- GAU's Triton kernels, compiled, against the torch kernels on CUDA tensors (float32, 1e-4 of the output's
  scale): quadratic relu² with padding, causality and a cache offset, FLASH's part inside the chunks; small
  shapes with partial blocks and model shapes (n ≈ 1000, s = 128); whole models with ``gau_kernel="triton"``
  against ``"torch"``, outputs and gradients, in float32 and under bf16 autocast.
- bf16 training steps of every family (causal and masked LM, bf16 autocast and bf16 weights): finite losses
  that fall.
- The entropy-invariant family under ``sdpa``, ``flex_attention`` (whose backward needs a GPU) and
  ``flash_attention_2`` (where flash-attn is installed) against ``eager``: outputs and gradients, with
  padding.
- Packed FLASH (``position_ids`` restarting at every document, no mask) equals each document run alone, with
  the Triton kernels, the torch path and, compiled, ``flash_windows``: logits and the gradients of the summed
  document losses.

``tests/test_gau_triton.py`` checks the same kernels in Triton's interpreter on CPU tensors for ``make test``.
To check these tests themselves without a GPU,
``HF_ATTN_VARIANTS_CUDA_TESTS_ON_CPU=1 pytest tests/test_cuda.py`` runs them on CPU (Triton interpreted; the
bf16 and FlexAttention-backward cases skip there).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from hf_attn_variants import (
    EntropyInvariantForCausalLM,
    EntropyInvariantForMaskedLM,
    EntropyInvariantModel,
    GAUConfig,
    GAUForCausalLM,
    GAUForMaskedLM,
    GAUModel,
    SynthesizerForCausalLM,
    SynthesizerForMaskedLM,
)
from hf_attn_variants.models.gau_kernels import flash_mixed_chunk_attention, relu2_attention
from hf_attn_variants.models.modeling_gau import FlashInputs
from hf_attn_variants.models.gau_triton import triton_relu2_attention
from tests.test_entropy_invariant import tiny_config as ei_config
from tests.test_gau import tiny_config as gau_config
from tests.test_synthesizer import tiny_config as synthesizer_config
from tests.utils import left_padded, random_ids, right_padded, triton_skip_reason

ON_CPU = os.environ.get("HF_ATTN_VARIANTS_CUDA_TESTS_ON_CPU") == "1"
DEVICE = torch.device("cpu" if ON_CPU else "cuda")

pytestmark = pytest.mark.skipif(not ON_CPU and not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (scripts/gpu_check.sh runs these on one)")
needs_triton = pytest.mark.skipif(triton_skip_reason() is not None, reason=triton_skip_reason() or "")
needs_gpu_bf16 = pytest.mark.skipif(ON_CPU,
                                    reason="bf16 on the GPU (HF_ATTN_VARIANTS_CUDA_TESTS_ON_CPU=1: skipped)")


def assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor, relative: float = 1e-4,
                          floor: float = 0.0) -> None:
    """``got`` equals ``expected`` to ``relative`` of ``expected``'s largest magnitude (at least of
    ``floor``): float32 sums taken in another order."""
    scale = max(float(expected.detach().abs().max()), floor) or 1.0
    torch.testing.assert_close(got, expected, atol=relative * scale, rtol=relative)


def assert_same_gradients(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                          relative: float = 2e-4) -> None:
    """Every parameter gradient agrees to ``relative`` of its own scale, or of 1 % of the largest gradient of
    the model where it is smaller: a gradient summed over every position (a per-head scale, a bias) cancels,
    and its rounding follows the size of its terms, not of the sum."""
    assert got.keys() == expected.keys()
    largest = max(float(grad.abs().max()) for grad in expected.values())
    for name, grad in expected.items():
        assert_close_to_scale(got[name], grad, relative, floor=0.01 * largest)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.detach().double().flatten(), b.detach().double().flatten(), dim=0))


# ---------------------------------------------------------------------------------- kernels
SHAPES = {"small": (70, 16, 24), "model": (1030, 128, 512)}
"""(n, key size s, value width e): partial blocks everywhere, and GAU-base's key size with n > 1000."""


def kernel_inputs(n_q: int, n_k: int, s: int, e: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(query, key, value) of batch 2 on the device, with gradients; q·k of order 1."""
    generator = torch.Generator().manual_seed(seed)

    def make(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * std).to(DEVICE).requires_grad_()

    return make(2, n_q, s, std=s**-0.5), make(2, n_k, s, std=1.0), make(2, n_k, e, std=0.5)


def assert_same_kernel(run_triton, run_torch, inputs: tuple[torch.Tensor, ...]) -> None:
    """Outputs and the gradients of every input agree to 1e-4 of their scale."""
    expected = run_torch(*inputs)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    got = run_triton(*inputs)
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    assert_close_to_scale(got, expected)
    for mine, theirs in zip(got_grads, expected_grads, strict=True):
        assert_close_to_scale(mine, theirs)


@needs_triton
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("causal", [False, True])
def test_quadratic_kernel_compiled_equals_torch(causal: bool, shape: str) -> None:
    n, s, e = SHAPES[shape]
    lengths = [n, n * 2 // 3]
    _, keep = left_padded(random_ids(2, n), lengths) if causal else right_padded(random_ids(2, n), lengths)
    mask = keep.bool()[:, None, :].expand(-1, n, -1)
    if causal:
        mask = mask & torch.ones(n, n, dtype=torch.bool).tril()
    mask, offset = mask.to(DEVICE), 0 if causal else None
    assert_same_kernel(lambda q, k, v: triton_relu2_attention(q, k, v, mask, offset),
                       lambda q, k, v: relu2_attention(q, k, v, mask, offset),
                       kernel_inputs(n, n, s, e))


@needs_triton
@pytest.mark.parametrize(("past", "new", "shape"), [(40, 9, "small"), (1000, 30, "model")])
def test_quadratic_kernel_compiled_with_a_cache_offset(past: int, new: int, shape: str) -> None:
    _, s, e = SHAPES[shape]
    mask = torch.ones(new, past + new).tril(past).bool()[None].to(DEVICE)
    assert_same_kernel(lambda q, k, v: triton_relu2_attention(q, k, v, None, past),
                       lambda q, k, v: relu2_attention(q, k, v, mask, past),
                       kernel_inputs(new, past + new, s, e))


def flash_op_inputs(n: int, s: int, e: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """(q, k, q', k', v) of batch 2 on the device, with gradients; q·k of order 1."""
    generator = torch.Generator().manual_seed(0)
    stds = (s**-0.5, 1.0, s**-1.0, 1.0, 0.5)
    return [(torch.randn(2, n, width, generator=generator) * std).to(DEVICE, dtype).requires_grad_()
            for width, std in zip((s, s, s, s, e), stds, strict=True)]


def flash_op_results(inputs: list[torch.Tensor], implementation: str, **options) -> list[torch.Tensor]:
    numerator, state = flash_mixed_chunk_attention(*inputs, implementation=implementation, **options)
    weights = torch.randn(numerator.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = torch.autograd.grad((numerator.float() * weights).sum(), inputs)
    return [numerator, state.linear, *grads]


@needs_triton
@pytest.mark.parametrize(("chunk", "shape"), [(16, "small"), (5, "small"), (256, "model"), (100, "model")])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_op_triton_equals_the_chunked_path(causal: bool, chunk: int, shape: str) -> None:
    """float32 (IEEE products): the op's Triton implementation equals its chunked torch one, gradients too."""
    n, s, e = SHAPES[shape]
    _, keep = right_padded(random_ids(2, n), [n, n * 3 // 4])
    options = {"chunk_size": chunk, "causal": causal, "key_mask": keep.bool().to(DEVICE)}
    inputs = flash_op_inputs(n, s, e)
    expected = flash_op_results(inputs, "chunk", **options)
    for got, want in zip(flash_op_results(inputs, "triton", **options), expected, strict=True):
        assert_close_to_scale(got, want)


@needs_triton
@needs_gpu_bf16
@pytest.mark.parametrize("causal", [False, True])
def test_flash_op_triton_in_bf16_on_the_tensor_cores(causal: bool) -> None:
    """bf16 inputs (tensor-core products, fp32 accumulators) against the float32 reference: within bf16's
    rounding, 2 % of each result's scale; the numerator comes back in bf16."""
    n, s, e = SHAPES["model"]
    options = {"chunk_size": 256, "causal": causal}
    reference = flash_op_results(flash_op_inputs(n, s, e), "reference", **options)
    got = flash_op_results(flash_op_inputs(n, s, e, torch.bfloat16), "triton", **options)
    assert got[0].dtype == torch.bfloat16
    for mine, want in zip(got, reference, strict=True):
        assert_close_to_scale(mine.float(), want, relative=2e-2)


@pytest.mark.parametrize("implementation", [pytest.param("triton", marks=needs_triton), "chunk"])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_op_in_float16_with_states_past_its_range(causal: bool, implementation: str) -> None:
    """float16 (tensor-core products) with k'·v ≈ 100, so that the states Σ k'ᵀv reach about 10⁵, past
    float16's 65,504: divided by a power of two past 2¹⁵ (``gau_triton.state_scales``) before the cast,
    the numerator is within float16 rounding (4e-3 of its scale) of the float64 reference, not NaN."""
    n, s, e = SHAPES["model"]
    generator = torch.Generator().manual_seed(0)
    means, stds = (0.0, 0.0, 1.0, 10.0, 10.0), (s**-0.5, 1.0, s**-1.0, 0.5, 0.5)
    scales = (1 / 16, 1.0, 1 / 4096, 1.0, 1.0)
    inputs = [(torch.randn(2, n, width, generator=generator) * std + mean) * scale
              for width, mean, std, scale in zip((s, s, s, s, e), means, stds, scales, strict=True)]
    options = {"chunk_size": 256, "causal": causal}
    exact, state = flash_mixed_chunk_attention(*(x.to(DEVICE, torch.float64) for x in inputs),
                                               implementation="reference", **options)
    assert float(state.linear.abs().max()) > 65504
    half = flash_mixed_chunk_attention(*(x.to(DEVICE, torch.float16) for x in inputs),
                                       implementation=implementation, **options)[0]
    assert half.dtype == torch.float16 and bool(half.isfinite().all())
    assert_close_to_scale(half.double(), exact, relative=4e-3)


@needs_triton
def test_flash_op_triton_compiles_with_fullgraph() -> None:
    """``torch.compile(fullgraph=True)`` (inductor) of the op and its backward: no graph break, same
    values."""
    n, s, e = SHAPES["model"]
    inputs = flash_op_inputs(n, s, e)

    def run(*tensors):
        return flash_mixed_chunk_attention(*tensors, chunk_size=256, causal=True, implementation="triton")[0]

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True)
    expected, got = run(*inputs), compiled(*inputs)
    assert_close_to_scale(got, expected)
    grads = [torch.autograd.grad(out.square().sum(), inputs) for out in (expected, got)]
    for mine, want in zip(grads[1], grads[0], strict=True):
        assert_close_to_scale(mine, want)


# ---------------------------------------------------------------------------------- GAU models, both kernels
MODEL_CASES = {
    "quadratic-fixed": (GAUModel, {"attention_normalization": "relu2", "relu2_length": "fixed"}, 30),
    "quadratic-causal": (GAUForCausalLM, {"attention_normalization": "relu2"}, 30),
    "flash-causal": (GAUForCausalLM, {"attention_normalization": "relu2", "chunk_size": 8}, 30),
    "flash-bidirectional": (GAUModel, {"attention_normalization": "relu2", "chunk_size": 8}, 30),
    "flash-causal-long": (GAUForCausalLM, {"attention_normalization": "relu2", "chunk_size": 64}, 600),
}


def gau_outputs(model_class, fields: dict, length: int, kernel: str, autocast: bool):
    """(output at real positions, parameter gradients) of a GAU model with ``gau_kernel=kernel`` on the
    device."""
    config = GAUConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, attention_key_size=16,
                       base_length=16, gau_kernel=kernel, **fields)
    causal = model_class is GAUForCausalLM
    ids, mask = (left_padded if causal else right_padded)(random_ids(2, length, vocab=61),
                                                          [length, length * 2 // 3])
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    torch.manual_seed(0)
    model = model_class(config).to(DEVICE).train()
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, attention_mask=mask)
        value = (out.last_hidden_state if hasattr(out, "last_hidden_state")
                 else out.logits)[mask.bool()].float()
    value.square().sum().backward()
    return value.detach(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


@needs_triton
@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_gau_models_give_the_same_outputs_and_gradients_with_either_kernel(case: str) -> None:
    model_class, fields, length = MODEL_CASES[case]
    expected, expected_grads = gau_outputs(model_class, fields, length, "torch", autocast=False)
    got, got_grads = gau_outputs(model_class, fields, length, "triton", autocast=False)
    assert_close_to_scale(got, expected)
    assert_same_gradients(got_grads, expected_grads)


@needs_triton
@needs_gpu_bf16
@pytest.mark.parametrize("case",
                         ["quadratic-causal", "flash-causal", "flash-bidirectional", "flash-causal-long"])
def test_gau_models_under_bf16_autocast_agree_across_kernels(case: str) -> None:
    """bf16 rounds differently in each kernel: the outputs and every gradient point the same way (cosine
    ≥ 0.99)."""
    model_class, fields, length = MODEL_CASES[case]
    expected, expected_grads = gau_outputs(model_class, fields, length, "torch", autocast=True)
    got, got_grads = gau_outputs(model_class, fields, length, "triton", autocast=True)
    assert torch.isfinite(got).all() and cosine(got, expected) >= 0.999
    for name, grad in expected_grads.items():
        assert torch.isfinite(got_grads[name]).all(), name
        assert cosine(got_grads[name], grad) >= 0.99, name


# ---------------------------------------------------------------------------------- bf16 training steps
FAMILIES = {
    "entropy_invariant": ((EntropyInvariantForCausalLM, EntropyInvariantForMaskedLM),
                          lambda: ei_config(attention_scale="entropy_invariant")),
    "entropy_invariant-ssmax": ((EntropyInvariantForCausalLM, EntropyInvariantForMaskedLM),
                                lambda: ei_config(attention_scale="ssmax")),
    "gau-softmax_plus": ((GAUForCausalLM, GAUForMaskedLM),
                         lambda: gau_config(attention_normalization="softmax_plus")),
    "gau-relu2": ((GAUForCausalLM, GAUForMaskedLM), lambda: gau_config(attention_normalization="relu2")),
    "gau-flash": ((GAUForCausalLM, GAUForMaskedLM),
                  lambda: gau_config(attention_normalization="relu2", chunk_size=8)),
    "synthesizer-random+vanilla": ((SynthesizerForCausalLM, SynthesizerForMaskedLM),
                                   lambda: synthesizer_config(max_position_embeddings=32,
                                                              synthesizer_components=["random", "vanilla"])),
    "synthesizer-dense": ((SynthesizerForCausalLM, SynthesizerForMaskedLM),
                          lambda: synthesizer_config(max_position_embeddings=32,
                                                     synthesizer_components=["dense"])),
}


@needs_gpu_bf16
@pytest.mark.parametrize("precision", ["autocast", "bf16-weights"])
@pytest.mark.parametrize("objective", ["causal", "masked"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_training_steps_lower_the_loss(family: str, objective: str, precision: str) -> None:
    """Eight AdamW steps on one padded batch: every loss and gradient finite, the last loss below the
    first."""
    classes, config = FAMILIES[family]
    model_class = classes[objective == "masked"]
    torch.manual_seed(0)
    model = model_class(config()).to(DEVICE).train()
    if precision == "bf16-weights":
        model = model.to(torch.bfloat16)
    ids, mask = (left_padded if objective == "causal" else right_padded)(random_ids(4, 32), [32, 30, 21, 9])
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    labels = ids.masked_fill(mask == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=precision == "autocast"):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), losses
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(map(torch.isfinite, torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses


# ---------------------------------------------------------------------------------- attention implementations
def ei_outputs(model, ids: torch.Tensor, mask: torch.Tensor):
    """(hidden states at real positions, parameter gradients) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()].float()
    hidden.square().sum().backward()
    return hidden.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters()
                             if p.grad is not None}


def implementation_available(implementation: str) -> str | None:
    """Why ``implementation`` cannot run here, or ``None``."""
    if implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return ("flash-attn is not installed (its wheel is larger than what travels to a lent GPU machine, "
                "and it cannot be built there without the network)")
    if implementation == "flex_attention" and ON_CPU:
        return "FlexAttention's backward needs a GPU (HF_ATTN_VARIANTS_CUDA_TESTS_ON_CPU=1)"
    if implementation == "flash_attention_2" and ON_CPU:
        return "FlashAttention-2 needs a GPU"
    return None


@pytest.mark.parametrize("implementation", ["sdpa", "flex_attention", "flash_attention_2"])
@pytest.mark.parametrize("scale", ["entropy_invariant", "ssmax"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_entropy_invariant_attention_implementations_equal_eager(causal: bool, scale: str,
                                                                 implementation: str) -> None:
    reason = implementation_available(implementation)
    if reason:
        pytest.skip(reason)
    dtype = torch.bfloat16 if implementation == "flash_attention_2" else torch.float32
    torch.manual_seed(0)
    config = ei_config(attention_scale=scale, is_decoder=causal, hidden_size=64)  # heads of 16: flex's least
    config._attn_implementation = "eager"
    model = EntropyInvariantModel(config).to(DEVICE, dtype).train()
    ids, mask = (left_padded if causal else right_padded)(random_ids(2, 10), [10, 6])
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    expected, expected_grads = ei_outputs(model, ids, mask)
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    got, got_grads = ei_outputs(model, ids, mask)
    if dtype == torch.bfloat16:
        assert cosine(got, expected) >= 0.999
        for name, grad in expected_grads.items():
            assert cosine(got_grads[name], grad) >= 0.99, name
        return
    assert_close_to_scale(got, expected)
    assert_same_gradients(got_grads, expected_grads)


@pytest.mark.skipif(ON_CPU, reason="the head-size limit is FlexAttention's on CUDA (CPU: skipped)")
def test_flex_attention_on_cuda_refuses_small_heads_in_one_sentence() -> None:
    model = EntropyInvariantModel(ei_config(attention_scale="entropy_invariant")).to(DEVICE)  # heads of 8
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match=r"^attn_implementation='flex_attention' on CUDA needs heads of at "
                                         r"least 16 dimensions .* hidden_size / num_attention_heads is 8"):
        model(random_ids(1, 6).to(DEVICE))


# ---------------------------------------------------------------------------------- packed FLASH
PACKED_CASES = {"chunk4": ((5, 11, 8), 4), "chunk6": ((5, 11, 8), 6), "chunk32": ((37, 100, 63), 32)}
"""Document lengths of one packed row and FLASH's chunk: shorter and longer than documents, off the row's
grid."""


@pytest.mark.parametrize(("case", "kernel"), [
    *[pytest.param(case, "triton", marks=needs_triton) for case in PACKED_CASES],
    *[(case, "torch") for case in PACKED_CASES],
    ("chunk32", "windows"),
])
def test_packed_flash_equals_each_document_alone(case: str, kernel: str) -> None:
    """``windows``: the packed row through a ``fullgraph=True`` compile (``aot_eager``: no kernels to build),
    which takes ``flash_windows`` (chunk 32 over documents off its grid); the lone runs stay eager."""
    lengths, chunk = PACKED_CASES[case]
    torch.manual_seed(0)
    config = gau_config(attention_normalization="relu2", chunk_size=chunk,
                        gau_kernel="torch" if kernel == "windows" else kernel)
    model = GAUForCausalLM(config).to(DEVICE).train()
    if kernel == "windows":
        torch.compiler.reset()  # a fresh compile: nothing of other tests' graphs or dynamic values
    forward = torch.compile(model, backend="aot_eager", fullgraph=True) if kernel == "windows" else model
    documents = [random_ids(1, n, seed=index).to(DEVICE) for index, n in enumerate(lengths)]
    ids = torch.cat(documents, dim=1)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(DEVICE)

    def document_loss(logits: torch.Tensor, document: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits[:-1].float(), document[0, 1:], reduction="sum")

    packed = forward(ids, position_ids=positions).logits[0]
    starts = torch.tensor((0, *lengths)).cumsum(0).tolist()
    sum(document_loss(packed[a:b], d) for a, b, d in zip(starts, starts[1:], documents)).backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    lone = [model(document).logits[0] for document in documents]
    sum(document_loss(logits, d) for logits, d in zip(lone, documents)).backward()
    for a, b, alone in zip(starts, starts[1:], lone):
        assert_close_to_scale(packed[a:b].detach(), alone.detach())
    assert_same_gradients(packed_grads,
                          {n: p.grad for n, p in model.named_parameters() if p.grad is not None})


@pytest.mark.skipif(ON_CPU, reason="CUDA graphs need a GPU (HF_ATTN_VARIANTS_CUDA_TESTS_ON_CPU=1: skipped)")
def test_flash_decoding_in_vllm_slots_replays_from_a_cuda_graph() -> None:
    """vLLM's GPU runner captures batches of one-token decodes in a CUDA graph (unless ``enforce_eager``) and
    replays it with new inputs copied into the same buffers: the captured ``decode_in_slots`` gives FLASH over
    each whole sequence for 9 steps of 3 sequences at different places in their chunks."""
    from hf_attn_variants.serving.flash_slots import decode_in_slots
    from tests.test_flash_slots import (
        decode_batch,
        empty_slots,
        flash_unit,
        prefill,
        reference,
        sequence_inputs,
    )

    unit = flash_unit().to(DEVICE)
    slots = empty_slots(unit, DEVICE)
    lengths = {1: 3, 2: 4, 3: 7}
    inputs = {slot: sequence_inputs(unit, lengths[slot] + 9, seed=slot, device=DEVICE) for slot in lengths}
    got = {slot: [prefill(unit, slots, slot, inputs[slot], 0, lengths[slot])] for slot in lengths}
    rows, at = decode_batch(inputs, lengths)
    static_rows, static_at = FlashInputs(*(t.clone() for t in rows.tensors()), None), at.to(DEVICE)
    index = torch.tensor(list(lengths), device=DEVICE)
    saved = tuple(slot.clone() for slot in slots)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as torch.cuda.graph asks
        decode_in_slots(unit, static_rows, slots, index, static_at)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        numerators = decode_in_slots(unit, static_rows, slots, index, static_at)
    for slot, kept in zip(slots, saved):  # the warm-up wrote the first step: start again
        slot.copy_(kept)
    positions = dict(lengths)
    for _ in range(9):
        rows, at = decode_batch(inputs, positions)
        for static, new in zip(static_rows.tensors(), rows.tensors()):
            static.copy_(new)
        static_at.copy_(at)
        graph.replay()
        for row, slot in enumerate(lengths):
            got[slot].append(numerators[row].clone())
            positions[slot] += 1
    for slot in lengths:
        assert_close_to_scale(torch.cat(got[slot]), reference(unit, inputs[slot]))
