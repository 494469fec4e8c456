"""GAU's Triton kernels equal the torch kernels: outputs and gradients, float32, 1e-4.

Without a GPU the kernels run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set by
tests/conftest.py), so sizes stay small (n ≤ 200). Covered: quadratic relu² with padding, causality, a cache
offset and a dense mask (also one broadcast over rows or queries); the FLASH op's Triton implementation
against its reference, causal and bidirectional, with key padding, lengths that chunks do not divide, packed
rows, a carried state and gradients through it, and under ``torch.compile(fullgraph=True)``; whole models
with ``gau_kernel="triton"`` against ``"torch"``. The interpreter multiplies bf16 tiles wrongly (``tl.dot``
of two bf16 tiles, Triton 3.9), so bf16 runs on a GPU only (tests/test_cuda.py); float16, which takes the
same launch (``FLASH_LAUNCH``) and casts, it multiplies right, so the half-precision kernels are checked here
in float16.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from hf_attn_variants import GAUConfig, GAUForCausalLM, GAUModel
from hf_attn_variants.models import gau_kernels, gau_triton
from hf_attn_variants.models.gau_kernels import DocumentChunks, flash_mixed_chunk_attention, relu2_attention
from hf_attn_variants.models.gau_triton import triton_relu2_attention
from tests.utils import left_padded, needs_triton, random_ids, right_padded

pytestmark = needs_triton()


def tensors(batch: int, n_q: int, n_k: int, s: int = 16, e: int = 24, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    def make(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.5).requires_grad_()

    return make(batch, n_q, s), make(batch, n_k, s), make(batch, n_k, e)


def assert_same(run_triton, run_torch, inputs) -> None:
    """Outputs and the gradients of every input agree to 1e-4."""
    expected = run_torch(*inputs)
    weights = torch.randn_like(expected)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    got = run_triton(*inputs)
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for mine, theirs in zip(got_grads, expected_grads):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_quadratic_kernel_with_padding_and_causality(causal: bool) -> None:
    n = 70  # three query and key blocks, the last one partial
    _, keep = left_padded(random_ids(2, n), [n, 45]) if causal else right_padded(random_ids(2, n), [n, 45])
    mask = keep.bool()[:, None, :].expand(-1, n, -1)
    if causal:
        mask = mask & torch.ones(n, n, dtype=torch.bool).tril()
    offset = 0 if causal else None
    assert_same(lambda q, k, v: triton_relu2_attention(q, k, v, mask, offset),
                lambda q, k, v: relu2_attention(q, k, v, mask, offset), tensors(2, n, n))


def test_quadratic_kernel_with_a_cache_offset_and_no_mask() -> None:
    past, new = 40, 9  # 9 queries at positions 40 … 48 over 49 cached keys
    assert_same(lambda q, k, v: triton_relu2_attention(q, k, v, None, past),
                lambda q, k, v: relu2_attention(q, k, v, torch.ones(new, past + new).tril(past).bool()[None],
                                                past),
                tensors(1, new, past + new))


@pytest.mark.parametrize("shape", ["batch 1", "no batch", "one query row"])
def test_quadratic_kernel_takes_a_broadcast_mask_as_the_torch_kernel_does(shape: str) -> None:
    """A mask broadcast over rows (``[1, T_q, T_k]``, ``[T_q, T_k]``) or queries (``[B, 1, T_k]``): each row
    of the batch reads it at stride 0, not the memory after it."""
    n = 40
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    keys = torch.ones(2, 1, n, dtype=torch.bool)
    keys[1, :, 30:] = False
    mask = {"batch 1": causal[None], "no batch": causal, "one query row": keys}[shape]
    assert_same(lambda q, k, v: triton_relu2_attention(q, k, v, mask, None),
                lambda q, k, v: relu2_attention(q, k, v, mask, None), tensors(2, n, n))


def test_a_model_given_a_4d_mask_for_every_row_at_once_gives_the_torch_kernels_result() -> None:
    """``attention_mask`` ``[1, 1, T, T]`` for a batch of 2 (Transformers' broadcast 4D mask), quadratic
    relu²: the Triton kernels' outputs are the torch kernels'."""
    ids = random_ids(2, 20, vocab=61)
    mask = torch.ones(20, 20, dtype=torch.bool).tril()[None, None]
    outputs = []
    for kernel in ("torch", "triton"):
        torch.manual_seed(0)
        config = GAUConfig(vocab_size=61, hidden_size=32, num_hidden_layers=1, attention_key_size=16,
                           attention_normalization="relu2", gau_kernel=kernel, is_decoder=True)
        model = GAUModel(config).eval()
        with torch.no_grad():
            outputs.append(model(input_ids=ids, attention_mask=mask).last_hidden_state)
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)


def flash_inputs(batch: int, length: int, s: int = 16, e: int = 24, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, length, width, generator=generator) * 0.5).requires_grad_()
            for width in (s, s, s, s, e)]


def assert_op_matches_reference(inputs: list[torch.Tensor], **options) -> None:
    """The op's Triton implementation equals its reference (the dense W): numerator, state and the gradients
    of all five inputs, to 1e-4 of their scale."""
    results = []
    for implementation in ("reference", "triton"):
        numerator, state = flash_mixed_chunk_attention(*inputs, implementation=implementation, **options)
        weights = torch.randn(numerator.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad((numerator * weights).sum(), inputs)
        results.append((numerator, state.linear, *grads))
    for got, expected in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-4 * float(expected.detach().abs().max()), rtol=1e-4)


@pytest.mark.parametrize("chunk", [16, 5, 64])  # a whole block, blocks straddling chunks, 64-token blocks
@pytest.mark.parametrize("causal", [False, True])
def test_flash_op_triton_equals_the_reference(causal: bool, chunk: int) -> None:
    """Lengths that chunks do not divide, and key padding."""
    n = 53 if chunk < 64 else 150
    _, keep = right_padded(random_ids(2, n), [n, n * 3 // 4])
    assert_op_matches_reference(flash_inputs(2, n), chunk_size=chunk, causal=causal, key_mask=keep.bool())


@pytest.mark.parametrize("chunk", [16, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_op_triton_on_packed_rows_equals_the_reference(causal: bool, chunk: int) -> None:
    """Rows packing documents (``DocumentChunks``' chunk-aligned layout): the state restarts per document, in
    both directions of the backward's sums over chunks."""
    ids = torch.tensor([[0] * 10 + [1] * 20 + [2] * 15, [0] * 30 + [1] * 15])
    documents = DocumentChunks.build(ids, chunk)
    inputs = [documents.gather(x).detach().requires_grad_() for x in flash_inputs(2, 45)]
    assert_op_matches_reference(inputs, chunk_size=chunk, causal=causal, key_mask=documents.valid,
                                segments=documents.segment)


@pytest.mark.parametrize("split", [20, 32])  # inside a chunk, on a chunk boundary
def test_flash_op_triton_continues_from_a_state(split: int) -> None:
    """Tokens after a ``FlashState`` (open chunk + Σ k'ᵀv) equal the same tokens of one whole call."""
    inputs = [x.detach() for x in flash_inputs(2, 45)]
    keep = torch.ones(2, 45, dtype=torch.bool)
    keep[1, :7] = False
    options = {"chunk_size": 16, "causal": True, "implementation": "triton"}
    whole, final = flash_mixed_chunk_attention(*inputs, key_mask=keep, **options)
    first, state = flash_mixed_chunk_attention(*(x[:, :split] for x in inputs), key_mask=keep[:, :split],
                                               **options)
    rest, state = flash_mixed_chunk_attention(*(x[:, split:] for x in inputs), key_mask=keep,
                                              initial_state=state, **options)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, atol=1e-5, rtol=1e-5)
    for got, expected in zip(state, final, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_flow_through_the_state_as_in_the_reference(causal: bool) -> None:
    """Training across calls (the state of one call fed to the next, the loss reading both numerators and
    the last state), and a loss of the state alone: every input's gradient, through the linear state and the
    open chunk, is the reference's."""
    results = []
    for implementation in ("reference", "chunk", "triton"):
        inputs = flash_inputs(2, 45)
        options = {"chunk_size": 16, "causal": causal, "implementation": implementation}
        first, state = flash_mixed_chunk_attention(*(x[:, :20] for x in inputs), **options)
        if causal:
            rest, state = flash_mixed_chunk_attention(*(x[:, 20:] for x in inputs), initial_state=state,
                                                      **options)
        else:
            rest = first
        generator = torch.Generator().manual_seed(1)
        loss = sum((tensor * torch.randn(tensor.shape, generator=generator)).sum()
                   for tensor in (first, rest, state.linear))
        results.append(torch.autograd.grad(loss, inputs))
        state_only = flash_mixed_chunk_attention(*inputs, **options)[1].linear  # the numerator unused
        results.append(torch.autograd.grad(state_only.sum(), inputs, materialize_grads=True))
    for implementation, grads, expected_grads in zip(("chunk", "chunk", "triton", "triton"), results[2:],
                                                     results[:2] * 2, strict=True):
        for got, expected in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, expected, atol=1e-4 * float(expected.abs().max()), rtol=1e-4,
                                       msg=lambda text, name=implementation: f"{name}: {text}")


def test_the_triton_op_refuses_dropout_while_training_in_one_sentence() -> None:
    """It has no attention dropout: a dropout it would ignore is an error naming it, not a silent no-op."""
    inputs = [x.detach() for x in flash_inputs(1, 20)]
    with pytest.raises(ValueError, match=r"^dropout=0.1 while training: implementation='triton'"):
        flash_mixed_chunk_attention(*inputs, chunk_size=8, causal=True, dropout=0.1, training=True,
                                    implementation="triton")
    flash_mixed_chunk_attention(*inputs, chunk_size=8, causal=True, dropout=0.1, training=False,
                                implementation="triton")  # evaluation: no dropout to apply


@pytest.mark.parametrize("implementation", ["reference", "chunk", "triton"])
def test_the_op_refuses_inputs_of_mixed_dtypes_outside_autocast(implementation: str) -> None:
    """Triton's ``tl.dot`` refuses operands of two dtypes (the compiler, on a GPU): one ``ValueError`` naming
    the argument instead, for every implementation alike."""
    inputs = [x.detach() for x in flash_inputs(1, 20)]
    inputs[4] = inputs[4].to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^value must be a \[1, 20, E\] floating tensor like quad_q, got "
                                         r"\[1, 20, 24\] of torch.bfloat16"):
        flash_mixed_chunk_attention(*inputs, chunk_size=8, causal=True, implementation=implementation)


def test_under_autocast_the_triton_kernels_take_one_dtype(monkeypatch) -> None:
    """Under bf16 autocast with float32 weights, ``in_proj`` gives bf16 and RoPE's angles are float32: q, k,
    q', k' once reached the kernels in float32 beside a bf16 v, which the GPU compiler refuses ("Both
    operands must be same dtype"). The unit casts rotated q, k back to its dtype and the op casts to
    autocast's, so all five arrive in bf16. (Triton's interpreter multiplies bf16 wrongly, so the kernels are
    replaced by a spy here; tests/test_cuda.py compares the values on a GPU.)"""
    seen = []

    def spy(quad_q, quad_k, lin_q, lin_k, value, mask, segments, initial, chunk_size, causal):
        seen.append({x.dtype for x in (quad_q, quad_k, lin_q, lin_k, value)})
        return (value * 0, value.new_zeros(value.shape[0], quad_q.shape[-1], value.shape[-1],
                                           dtype=torch.float32))

    monkeypatch.setattr(gau_kernels.FlashTritonAttention, "apply", spy)
    config = GAUConfig(vocab_size=61, hidden_size=32, num_hidden_layers=1, attention_key_size=16,
                       base_length=16, attention_normalization="relu2", chunk_size=16, gau_kernel="triton")
    model = GAUForCausalLM(config)
    ids = random_ids(2, 40, vocab=61)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids)
        inputs = [x.detach() for x in flash_inputs(1, 20)]
        inputs[4] = inputs[4].to(torch.bfloat16)  # mixed: autocast casts them, as for a matmul
        flash_mixed_chunk_attention(*inputs, chunk_size=8, causal=True, implementation="triton")
        # an open chunk kept outside autocast (float32) joins the new tokens in autocast's dtype too
        opened = gau_kernels.FlashState(None, torch.randn(1, 3, 32), torch.randn(1, 3, 24))
        flash_mixed_chunk_attention(*inputs, chunk_size=8, causal=True, implementation="triton",
                                    initial_state=opened)
        numerator, _ = flash_mixed_chunk_attention(*inputs, chunk_size=8, causal=True, implementation="chunk",
                                                   initial_state=opened)
    assert seen == [{torch.bfloat16}] * 3 and numerator.dtype == torch.bfloat16


def test_the_triton_kernels_refuse_float64_on_a_gpu() -> None:
    """The compiler refuses float64 products into the kernels' float32 accumulators; the interpreter (CPU
    tensors) runs them, as the gradient checks do."""
    with pytest.raises(ValueError, match=r"^gau_kernel='triton' takes float32, bfloat16 or float16 on a GPU"):
        gau_triton.check_compilable(torch.empty(2, dtype=torch.float64, device="meta"))
    gau_triton.check_compilable(torch.empty(2, dtype=torch.float64))
    gau_triton.check_compilable(torch.empty(2, dtype=torch.bfloat16, device="meta"))


@pytest.mark.parametrize("causal", [False, True])
def test_the_bench_counts_the_same_flops_on_either_path(causal: bool) -> None:
    """The FLOP counter cannot see into the Triton kernels; without their formulas (``bench.measure.
    flash_flops``) a Triton row's GFLOP/s and MFU were about a fifth too low for the same work."""
    from hf_attn_variants.bench.measure import count_step_flops, make_step

    counts = {}
    for kernel in ("torch", "triton"):
        config = GAUConfig(vocab_size=61, hidden_size=32, num_hidden_layers=1, attention_key_size=16,
                           base_length=16, attention_normalization="relu2", chunk_size=16, gau_kernel=kernel,
                           is_decoder=causal)
        torch.manual_seed(0)
        model = GAUModel(config).train()
        counts[kernel] = count_step_flops(make_step(model, random_ids(2, 64, vocab=61), True, None))
    assert counts["triton"] == counts["torch"] > 0, counts


def half_and_exact(inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``inputs`` rounded to float16, and the same values in float64, each a leaf that takes gradients."""
    half = [x.detach().half().requires_grad_() for x in inputs]
    return half, [x.detach().double().requires_grad_() for x in half]


def assert_within_half_rounding(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """float16 results within 4e-3 of the largest exact value (float16 rounds at 5e-4 relative)."""
    for mine, exact in zip(got, expected, strict=True):
        torch.testing.assert_close(mine.detach().double(), exact.detach(), rtol=0,
                                   atol=4e-3 * float(exact.detach().abs().max()))


@pytest.mark.parametrize("chunk", [128, 64, 40])  # two blocks a chunk, one, blocks straddling chunks
@pytest.mark.parametrize("causal", [False, True])
def test_flash_op_triton_in_half_precision_equals_the_exact_op(causal: bool, chunk: int) -> None:
    """The launch a GPU runs for bf16 and fp16 (``FLASH_LAUNCH``: 64-token blocks, 128 value columns, the
    casts to the input dtype before each product), here with float16 inputs, whose products Triton's
    interpreter computes right (bf16's it does not): numerator, state and the five inputs' gradients, within
    float16 rounding of the chunked path in float64 on the same values, with key padding."""
    n = 200
    _, keep = right_padded(random_ids(2, n), [n, 150])
    half, exact = half_and_exact(flash_inputs(2, n, s=128, e=256))
    results = []
    for implementation, inputs in (("triton", half), ("chunk", exact)):
        numerator, state = flash_mixed_chunk_attention(*inputs, chunk_size=chunk, causal=causal,
                                                       key_mask=keep.bool(), implementation=implementation)
        weights = torch.randn(numerator.shape, generator=torch.Generator().manual_seed(1),
                              dtype=torch.float64)
        results.append([numerator, state.linear,
                        *torch.autograd.grad((numerator.double() * weights).sum(), inputs)])
    assert half[0].dtype == results[0][0].dtype == torch.float16
    assert_within_half_rounding(results[0], results[1])


def large_state_inputs(length: int, *, e: int, mean: float, linear_scale: float) -> list[torch.Tensor]:
    """(q, k, q', k', v) of batch 2 and key size 16 whose k' and v have mean ``mean``, so that the states
    Σ k'ᵀv grow as ``length`` · ``mean``²; q' has mean 1 times ``linear_scale`` (the folded a/L), q carries
    1/16."""
    generator = torch.Generator().manual_seed(0)

    def make(width: int, shift: float, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(2, length, width, generator=generator) * 0.5 + shift) * scale

    return [make(16, 0.0, 1 / 16), make(16, 0.0), make(16, 1.0, linear_scale), make(16, mean), make(e, mean)]


@pytest.mark.parametrize("implementation", ["chunk", "triton"])
@pytest.mark.parametrize("causal", [False, True])
def test_float16_flash_states_past_65504_give_the_exact_numerator(causal: bool, implementation: str) -> None:
    """Σ k'ᵀv over 1,024 tokens of k'·v ≈ 100 reaches about 10⁵, past float16's 65,504: cast as it is, the
    state gave ±inf and the numerator NaN in both implementations. Divided by a power of two past 2¹⁵
    (``state_scales``), the numerator (about 500) is within float16 rounding of the float64 one, also after a
    carried state. (The gradient of the linear queries, dO·Hᵀ ≈ 10⁶, is past float16's range itself: train
    in bf16.)"""
    inputs = large_state_inputs(1024, e=32, mean=10.0, linear_scale=1 / 4096)
    options = {"chunk_size": 64, "causal": causal}
    exact, state = flash_mixed_chunk_attention(*(x.double() for x in inputs), implementation="reference",
                                               **options)
    assert float(state.linear.abs().max()) > 65504
    half, _ = flash_mixed_chunk_attention(*(x.half() for x in inputs), implementation=implementation,
                                          **options)
    assert half.dtype == torch.float16
    assert_within_half_rounding([half], [exact])
    if causal:  # the next tokens read the carried state (5·10⁵) as well
        carried = gau_kernels.FlashState(state.linear.float())
        exact_next = flash_mixed_chunk_attention(*(x.double() for x in inputs), initial_state=state,
                                                 implementation="reference", **options)[0]
        half_next = flash_mixed_chunk_attention(*(x.half() for x in inputs), initial_state=carried,
                                                implementation=implementation, **options)[0]
        assert_within_half_rounding([half_next], [exact_next])


def test_state_scales_are_one_in_float16s_range_and_powers_of_two_past_it() -> None:
    states = torch.tensor([0.3, -7.0, 32768.0, -40000.0, 1e12]).reshape(1, 5, 1, 1).expand(1, 5, 2, 3)
    assert gau_triton.state_scales(states).tolist() == [[1.0, 1.0, 1.0, 2.0, 2.0**15]]
    assert gau_triton.scales_states(torch.float16)
    assert not any(gau_triton.scales_states(dtype) for dtype in (torch.bfloat16, torch.float32))


@pytest.mark.parametrize("causal", [False, True])
def test_float16_states_in_range_are_read_exactly_as_without_scaling(causal: bool, monkeypatch) -> None:
    """States up to about 1.3·10⁴ (float16 holds them): the scaled launch and the chunked path give the
    same bits as the unscaled ones, and so do the gradients."""
    inputs = [x.half() for x in large_state_inputs(200, e=24, mean=8.0, linear_scale=1 / 256)]
    options = {"chunk_size": 64, "causal": causal}
    weights = torch.randn(2, 200, 24, generator=torch.Generator().manual_seed(1)).half()

    def results() -> list[list[torch.Tensor]]:
        found = []
        for implementation in ("chunk", "triton"):
            leaves = [x.clone().requires_grad_() for x in inputs]
            numerator, state = flash_mixed_chunk_attention(*leaves, implementation=implementation, **options)
            found.append([numerator, *torch.autograd.grad((numerator * weights).sum(), leaves)])
        return found

    state = flash_mixed_chunk_attention(*(x.float() for x in inputs), **options)[1].linear
    assert 4096 < float(state.abs().max()) < 32768
    scaled = results()
    monkeypatch.setattr(gau_triton, "scales_states", lambda dtype: False)
    unscaled = results()
    for mine, theirs in zip(sum(scaled, []), sum(unscaled, []), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("causal", [False, True])
def test_quadratic_kernel_in_half_precision_equals_the_exact_kernel(causal: bool) -> None:
    """The quadratic relu² kernels with float16 inputs (their tensor-core products on a GPU) against the
    torch kernel in float64: output and gradients within float16 rounding."""
    n = 70
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None] if causal else None
    half, exact = half_and_exact(list(tensors(2, n, n, s=64, e=96)))
    outputs = [triton_relu2_attention(*half, mask, 0 if causal else None),
               relu2_attention(*exact, mask, 0 if causal else None)]
    weights = torch.randn(outputs[1].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = [[out, *torch.autograd.grad((out.double() * weights).sum(), inputs)]
               for out, inputs in zip(outputs, (half, exact), strict=True)]
    assert_within_half_rounding(results[0], results[1])


def test_flash_op_triton_compiles_without_graph_breaks() -> None:
    """The kernels are ``torch.library.triton_op``s: ``torch.compile(fullgraph=True)`` traces the op and its
    backward (``aot_eager`` here, whose kernels then run in the interpreter) and gets the eager results."""
    inputs = flash_inputs(1, 40)

    def run(*tensors):
        return flash_mixed_chunk_attention(*tensors, chunk_size=16, causal=True, implementation="triton")[0]

    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    eager, traced = run(*inputs), compiled(*inputs)
    torch.testing.assert_close(traced, eager)
    grads = [torch.autograd.grad(out.square().sum(), inputs) for out in (eager, traced)]
    for got, expected in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    ("model_class", "fields"),
    [
        (GAUModel, {"attention_normalization": "relu2", "relu2_length": "fixed"}),
        (GAUForCausalLM, {"attention_normalization": "relu2"}),
        (GAUForCausalLM, {"attention_normalization": "relu2", "chunk_size": 8}),
        (GAUModel, {"attention_normalization": "relu2", "chunk_size": 8}),
    ],
    ids=["quadratic-fixed", "quadratic-causal", "flash-causal", "flash-bidirectional"],
)
def test_models_give_the_same_outputs_and_gradients_with_either_kernel(model_class, fields: dict) -> None:
    config = {"vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2, "attention_key_size": 16,
              "base_length": 16, **fields}
    ids, mask = (left_padded if model_class is GAUForCausalLM else right_padded)(random_ids(2, 30, vocab=61),
                                                                                 [30, 21])
    results = []
    for kernel in ("torch", "triton"):
        torch.manual_seed(0)
        model = model_class(GAUConfig(**config, gau_kernel=kernel)).eval()
        out = model(input_ids=ids, attention_mask=mask)
        value = out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits
        value[mask.bool()].square().sum().backward()
        results.append((value.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (expected, expected_grads), (got, got_grads) = results
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
    assert expected_grads.keys() == got_grads.keys()
    # Parameter gradients sum float32 products over two layers in another order than the torch kernels: the
    # kernels themselves agree to 1e-4 (tests above); whole-model gradients to 2e-4 of each gradient's scale.
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=2e-4 * float(grad.abs().max()), rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [None, 8], ids=["quadratic", "flash"])
def test_causal_models_with_triton_match_the_reference_path(chunk_size: int | None) -> None:
    """``gau_kernel="triton"`` against ``"reference"``, the written-out attention with its n×n map."""
    config = {"vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2, "attention_key_size": 16,
              "base_length": 16, "attention_normalization": "relu2", "chunk_size": chunk_size}
    ids, mask = left_padded(random_ids(2, 30, vocab=61), [30, 21])
    logits = []
    for kernel in ("triton", "reference"):
        torch.manual_seed(0)
        model = GAUForCausalLM(GAUConfig(**config, gau_kernel=kernel)).eval()
        with torch.no_grad():
            logits.append(model(input_ids=ids, attention_mask=mask).logits)
    real = mask.bool()
    torch.testing.assert_close(logits[0][real], logits[1][real], atol=1e-4, rtol=1e-4)


def test_triton_kernel_without_triton_is_one_clear_error(monkeypatch) -> None:
    from hf_attn_variants.models import modeling_gau

    monkeypatch.setattr(modeling_gau, "TRITON_AVAILABLE", False)
    with pytest.raises(ImportError, match=r"gau_kernel='triton' needs the triton package"):
        GAUModel(GAUConfig(vocab_size=61, hidden_size=32, num_hidden_layers=1, attention_key_size=16,
                           gau_kernel="triton"))


@pytest.mark.parametrize("chunk_size", [None, 4], ids=["quadratic", "flash"])
def test_triton_kernel_on_cpu_outside_the_interpreter_is_one_clear_error(monkeypatch, chunk_size) -> None:
    """A model saved with ``gau_kernel="triton"`` on a GPU and run on a CPU: Triton compiles for GPUs only,
    and failed with "0 active drivers"; now one ValueError names ``gau_kernel`` and what runs on a CPU."""
    from hf_attn_variants.models import gau_triton

    monkeypatch.setattr(gau_triton, "INTERPRETED", False)
    model = GAUModel(GAUConfig(vocab_size=61, hidden_size=32, num_hidden_layers=1, attention_key_size=16,
                               attention_normalization="relu2", chunk_size=chunk_size, is_decoder=True,
                               gau_kernel="triton"))
    with pytest.raises(ValueError, match=r"gau_kernel='triton' runs on GPUs.*use gau_kernel='auto' or "
                                         r"'torch' on a CPU"):
        model(input_ids=torch.randint(0, 61, (1, 8)))


LAUNCHED_KERNELS = ("_chunk_outer_kernel", "_flash_forward_kernel", "_flash_backward_query_kernel",
                    "_flash_backward_key_kernel")


def count_launches(monkeypatch) -> Counter:
    """Wrap the FLASH op's kernels in ``gau_triton`` so that every ``kernel[grid](…)`` launch is counted."""
    counts: Counter = Counter()

    class Counted:
        def __init__(self, name: str, kernel) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launch = self.kernel[grid]

            def counted(*args, **kwargs):
                counts[self.name] += 1
                return launch(*args, **kwargs)

            return counted

    for name in LAUNCHED_KERNELS:
        monkeypatch.setattr(gau_triton, name, Counted(name, getattr(gau_triton, name)))
    return counts


def test_causal_flash_training_and_prefill_launch_the_triton_kernels(monkeypatch) -> None:
    """Causal FLASH training takes the parallel branch (no cache is built in training, though ``use_cache`` is
    on by default), so ``gau_kernel="triton"`` runs: the forward kernels twice per layer (once again to
    recompute) and each gradient kernel once. A prefill with a cache takes it too, and the cache it starts
    decodes exactly as the torch kernels' does."""
    counts = count_launches(monkeypatch)
    config = GAUConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, attention_key_size=16,
                       base_length=16, attention_normalization="relu2", chunk_size=16, gau_kernel="triton")
    assert config.use_cache
    torch.manual_seed(0)
    model = GAUForCausalLM(config).train()
    ids = random_ids(2, 40, vocab=61)
    out = model(input_ids=ids, labels=ids)
    assert getattr(out, "cache", None) is None and getattr(out, "past_key_values", None) is None
    out.loss.backward()
    # Per layer: the forward, its recomputation in backward (the unit saves in_proj's output only), and the
    # backward; k'ᵀv per chunk in each forward, then k'ᵀv and q'ᵀdO in the backward.
    assert counts == {"_chunk_outer_kernel": 8, "_flash_forward_kernel": 4, "_flash_backward_query_kernel": 2,
                      "_flash_backward_key_kernel": 2}, counts

    model.eval()
    counts.clear()
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=5, do_sample=False, min_new_tokens=5)
    # the prefill; decoding steps continue from the cached chunk
    assert counts["_flash_forward_kernel"] == 2, counts
    torch.manual_seed(0)
    reference = GAUForCausalLM(GAUConfig(**{**config.to_dict(), "gau_kernel": "torch"})).eval()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(generated,
                           reference.generate(ids, max_new_tokens=5, do_sample=False, min_new_tokens=5))


@pytest.mark.parametrize("implementation", ["chunk", "triton"])
@pytest.mark.parametrize("causal", [True, False])
def test_float16_gradients_of_long_rows_stay_finite(implementation: str, causal: bool) -> None:
    """The gradient of chunk c's summary k'ᵀv sums q'ᵀdO over every later chunk (every chunk, bidirectional:
    about 1.3·10⁵ here, past float16's 65,504) although dk' (≈ 3·10⁴) and dv fit: read like the states,
    σ·(dSum/σ), the gradients are within float16 rounding of the float64 ones; cast as it was, dk' and dv
    were ±inf (bidirectional chunked: the broadcast state's gradient summed the chunks in float16)."""
    length, width = 4096, 4
    inputs = [torch.full((1, length, width), value) for value in (0.1, 0.1, 8.0, 2.0**-12, 2.0**-4)]
    grad_output = torch.full((1, length, width), 4.0)

    def gradients(dtype: torch.dtype, implementation: str) -> tuple[torch.Tensor, ...]:
        tensors = [x.to(dtype).requires_grad_() for x in inputs]
        numerator, _ = flash_mixed_chunk_attention(*tensors, chunk_size=64, causal=causal,
                                                   implementation=implementation)
        return torch.autograd.grad(numerator, tensors, grad_output.to(dtype))

    exact = gradients(torch.float64, "chunk")
    assert float(exact[3].abs().max()) > 3e4
    assert_within_half_rounding(list(gradients(torch.float16, implementation)), list(exact))


def test_float16_chunked_op_compiles_with_dynamic_shapes_forward_and_backward() -> None:
    """``torch.compile(dynamic=True)`` makes a module's float symbolic; the float16 summaries' custom backward
    (``Float16Summaries``) took one through ``state_scales`` and failed to trace: the scale is computed from
    integers now, and the compiled gradients equal eager's."""
    torch.compiler.reset()

    def loss(*tensors: torch.Tensor) -> torch.Tensor:
        return flash_mixed_chunk_attention(*tensors, chunk_size=8, causal=True)[0].float().sum()

    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, 40, width, generator=generator).half() for width in (8, 8, 8, 8, 6)]
    eager = torch.autograd.grad(loss(*[x.requires_grad_() for x in inputs]), inputs)
    compiled = torch.compile(loss, backend="aot_eager", dynamic=True)
    got = torch.autograd.grad(compiled(*inputs), inputs)
    for mine, want in zip(got, eager, strict=True):
        torch.testing.assert_close(mine, want, atol=0, rtol=0)
