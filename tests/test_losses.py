"""The chunked causal-LM cross-entropy (``models/losses.py``): the same loss and gradients as Transformers'
``ForCausalLMLoss`` on the full logits, without keeping a row of logits per token for backward; our causal LM
heads use it when training, and stock models through ``use_chunked_loss`` (also under ``Trainer``)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.loss.loss_utils import ForCausalLMLoss

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForCausalLM,
    GAUConfig,
    GAUForCausalLM,
    SynthesizerConfig,
    SynthesizerForCausalLM,
    chunked_cross_entropy,
    use_chunked_loss,
)
from hf_attn_variants.models import gau_kernels
from hf_attn_variants.models.losses import chunk_layout, default_chunk_tokens
from tests.utils import saved_bytes

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2e-2, atol=2e-3)}
"""bf16: the stock path rounds ∂L/∂W once, the chunked one per chunk (each in float32 accumulation)."""


def stock_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
               bias: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """Transformers' causal-LM loss on the full logits, as its heads compute it."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return ForCausalLMLoss(logits, labels, weight.shape[0], **kwargs)


def leaves(dtype: torch.dtype, batch: int, length: int, width: int, vocab: int, bias: bool, seed: int = 0):
    """Hidden states, head weight and bias (or ``None``) of ``dtype`` that require gradients."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, width, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator) / math.sqrt(width)).to(dtype).requires_grad_()
    b = (torch.randn(vocab, generator=generator) * 0.1).to(dtype).requires_grad_() if bias else None
    return hidden, weight, b


def loss_and_grads(function, hidden, weight, bias, labels, **kwargs):
    for tensor in (hidden, weight, bias):
        if tensor is not None:
            tensor.grad = None
    loss = function(hidden, weight, labels, bias=bias, **kwargs)
    loss.backward()
    return loss, [t.grad.clone() for t in (hidden, weight, bias) if t is not None]


def padded_labels(batch: int, length: int, vocab: int) -> torch.Tensor:
    """Random labels with a left-padded prompt in row 0 and right padding in the last row (-100)."""
    labels = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1))
    labels[0, :5] = -100
    labels[-1, length - 7:] = -100
    return labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("num_items", [None, 50])
def test_equals_transformers_loss_and_gradients(dtype: torch.dtype, bias: bool,
                                                num_items: int | None) -> None:
    """Odd lengths (3 × 37 tokens in chunks of 10), padding and prompts ignored, Trainer's
    ``num_items_in_batch``."""
    hidden, weight, b = leaves(dtype, 3, 37, 16, 500, bias)
    labels = padded_labels(3, 37, 500)
    expected, expected_grads = loss_and_grads(stock_loss, hidden, weight, b, labels,
                                              num_items_in_batch=num_items)
    loss, grads = loss_and_grads(chunked_cross_entropy, hidden, weight, b, labels, chunk_tokens=10,
                                 num_items_in_batch=num_items)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected_grads):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_shift_labels_and_the_default_chunk() -> None:
    """``shift=False`` takes labels already shifted (Transformers' ``shift_labels``); the default chunk holds
    every token of a small batch."""
    hidden, weight, _ = leaves(torch.float32, 2, 9, 8, 50, False)
    labels = padded_labels(2, 10, 50)[:, :9]
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
    expected = stock_loss(hidden, weight, labels)
    torch.testing.assert_close(chunked_cross_entropy(hidden, weight, shifted, shift=False), expected)
    torch.testing.assert_close(stock_loss(hidden, weight, None, shift_labels=shifted), expected)
    assert default_chunk_tokens(32000) == 1048 and default_chunk_tokens(10**9) == 1


def test_no_gradients_no_work_and_all_ignored_is_nan_as_transformers() -> None:
    hidden, weight, _ = leaves(torch.float32, 1, 6, 8, 20, False)
    with torch.no_grad():
        loss = chunked_cross_entropy(hidden, weight, torch.randint(0, 20, (1, 6)))
    assert loss.grad_fn is None and torch.isfinite(loss)
    ignored = torch.full((1, 6), -100)
    assert torch.isnan(chunked_cross_entropy(hidden, weight, ignored))
    hidden.requires_grad_()
    for num_items in (None, 0):  # the loss NaN, its gradients those of Transformers' loss (0, not NaN)
        expected, expected_grads = loss_and_grads(stock_loss, hidden, weight, None, ignored,
                                                  num_items_in_batch=num_items)
        loss, grads = loss_and_grads(chunked_cross_entropy, hidden, weight, None, ignored,
                                     num_items_in_batch=num_items)
        assert torch.isnan(loss) and torch.isnan(expected)
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.isnan(stock_loss(hidden, weight, ignored))


def test_under_autocast_it_equals_the_stock_head() -> None:
    """float32 weights under ``torch.autocast(bfloat16)``: the logits in bf16 as the stock head's."""
    hidden, weight, _ = leaves(torch.float32, 2, 11, 16, 300, False)
    labels = padded_labels(2, 11, 300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, expected_grads = loss_and_grads(stock_loss, hidden, weight, None, labels)
        loss, grads = loss_and_grads(chunked_cross_entropy, hidden, weight, None, labels, chunk_tokens=4)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, **TOLERANCE[torch.bfloat16])


@pytest.mark.parametrize(("arguments", "error", "message"), [
    (dict(weight=torch.zeros(10, 7)), ValueError, "^weight: expected \\(vocab_size, 8\\)"),
    (dict(labels=torch.zeros(2, 4)), TypeError, "^labels: expected integer token ids"),
    (dict(labels=torch.zeros(2, 5, dtype=torch.long)), ValueError, "^labels: expected shape \\(2, 4\\)"),
    (dict(labels=torch.full((2, 4), 10)), ValueError, "^labels: token ids must be in \\[0, 10\\)"),
    (dict(bias=torch.zeros(9)), ValueError, "^bias: expected \\(10,\\)"),
    (dict(chunk_tokens=0), ValueError, "^chunk_tokens: expected a positive int"),
    (dict(weight=torch.zeros(10, 8, dtype=torch.bfloat16)), ValueError, "^weight: dtype torch.bfloat16"),
])
def test_bad_input_names_the_argument(arguments: dict, error: type, message: str) -> None:
    inputs = {"hidden_states": torch.zeros(2, 4, 8), "weight": torch.zeros(10, 8),
              "labels": torch.zeros(2, 4, dtype=torch.long), **arguments}
    with pytest.raises(error, match=message):
        hidden, weight, labels = (inputs.pop(name) for name in ("hidden_states", "weight", "labels"))
        chunked_cross_entropy(hidden, weight, labels, **inputs)


def test_the_loss_saves_at_most_one_bf16_row_of_logits_per_token() -> None:
    """Issue 47's done-when at V = 32,000 in bf16, 4 × 300 tokens, hidden 16: what the chunked loss saves
    beyond the final hidden states and the head's weight is ∂L/∂h (2·d bytes a token) and ∂L/∂W (2·V·d bytes
    in all, the size of the weight: backward creates that gradient in any case), far under one bf16 row of
    logits (2·V bytes a token); the stock loss saves float32 log-probabilities, 4·V bytes a token and more."""
    vocab, width, batch, length = 32000, 16, 4, 300
    hidden, weight, _ = leaves(torch.bfloat16, batch, length, width, vocab, False)
    labels = padded_labels(batch, length, vocab)
    inputs = {hidden.untyped_storage().data_ptr(), weight.untyped_storage().data_ptr()}

    def beyond_inputs(function) -> float:
        return saved_bytes(lambda: function(hidden, weight, labels).backward(), inputs) / (batch * length)

    chunked = beyond_inputs(lambda h, w, y: chunked_cross_entropy(h, w, y, chunk_tokens=256))
    stock = beyond_inputs(stock_loss)
    print(f"saved per token beyond the hidden states and weight: chunked {chunked:.0f} B, stock "
          f"{stock:.0f} B, one bf16 row of logits {2 * vocab} B")
    assert chunked <= 2 * vocab, chunked
    assert chunked == 2 * width + 2 * vocab * width / (batch * length)  # ∂L/∂h and ∂L/∂W, nothing else
    assert stock >= 4 * vocab, stock


def tiny_causal_lm(family: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "entropy_invariant":
        config = EntropyInvariantConfig(vocab_size=211, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)
        return EntropyInvariantForCausalLM(config)
    config = SynthesizerConfig(vocab_size=211, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
    return SynthesizerForCausalLM(config)


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["entropy_invariant", "synthesizer"])
def test_our_causal_lm_heads_train_with_it_and_keep_logits_for_eval(family: str) -> None:
    """Training with labels: the chunked loss, ``logits=None``, the stock loss and gradients (the head with
    ``chunked_lm_loss = False``); eval, no labels or no gradients: logits as before."""
    model = tiny_causal_lm(family)
    ids = torch.randint(1, 211, (2, 13), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[1, 9:] = -100
    model.train()
    chunked = model(input_ids=ids, labels=labels)
    assert chunked.logits is None
    chunked.loss.backward()
    chunked_grads = gradients(model)
    model.zero_grad()
    model.chunked_lm_loss = False
    stock = model(input_ids=ids, labels=labels)
    stock.loss.backward()
    assert stock.logits.shape == (2, 13, 211)
    torch.testing.assert_close(chunked.loss, stock.loss)
    stock_grads = gradients(model)
    assert chunked_grads.keys() == stock_grads.keys()
    for name, grad in chunked_grads.items():
        torch.testing.assert_close(grad, stock_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    model.chunked_lm_loss = True
    with torch.no_grad():
        assert model(input_ids=ids, labels=labels).logits is not None  # training mode, no gradients
    model.eval()
    evaluated = model(input_ids=ids, labels=labels)
    assert evaluated.logits.shape == (2, 13, 211)
    torch.testing.assert_close(evaluated.loss, stock.loss)
    assert model.generate(ids[:1, :4], max_new_tokens=3, do_sample=False).shape == (1, 7)


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=199, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64))


def test_stock_models_take_it_through_use_chunked_loss() -> None:
    """A stock ``LlamaForCausalLM``: the hooked training forward gives the stock loss and gradients without
    logits (``num_items_in_batch`` as Trainer passes it); eval is untouched; ``remove()`` restores it."""
    model = tiny_llama()
    ids = torch.randint(1, 199, (3, 11), generator=torch.Generator().manual_seed(4))
    labels = torch.where(torch.arange(11) < 2, -100, ids)
    model.train()
    stock = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(25))
    stock.loss.backward()
    stock_grads = gradients(model)
    model.zero_grad()
    handle = use_chunked_loss(model, chunk_tokens=7)
    chunked = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(25))
    assert chunked.logits is None and chunked.hidden_states is None
    chunked.loss.backward()
    torch.testing.assert_close(chunked.loss, stock.loss)
    for name, grad in gradients(model).items():
        torch.testing.assert_close(grad, stock_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    model.eval()
    assert model(input_ids=ids, labels=labels).logits.shape == (3, 11, 199)
    handle.remove()
    model.train()
    assert model(input_ids=ids, labels=labels).logits is not None


def test_use_chunked_loss_refuses_models_whose_logits_are_not_the_heads() -> None:
    model = tiny_llama()
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="^model: its config sets final_logit_softcapping=30.0"):
        use_chunked_loss(model)
    with pytest.raises(ValueError, match="^model: LlamaModel has no nn.Linear LM head"):
        use_chunked_loss(model.model)


def test_trainer_trains_a_stock_model_with_it_as_with_its_own_loss(tmp_path) -> None:
    """Two ``Trainer`` steps (gradient accumulation 2, so ``num_items_in_batch`` is used) of a stock Llama
    with and without ``use_chunked_loss``: the same weights after them, no logits with it."""
    pytest.importorskip("accelerate")
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    ids = torch.randint(1, 199, (8, 12), generator=torch.Generator().manual_seed(5))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    trained = []
    for chunked in (False, True):
        model = tiny_llama(seed=1)
        logits = []
        if chunked:
            use_chunked_loss(model)
        model.register_forward_hook(lambda module, args, output: logits.append(output.logits))
        arguments = TrainingArguments(output_dir=str(tmp_path / str(chunked)), per_device_train_batch_size=2,
                                      gradient_accumulation_steps=2, max_steps=2, learning_rate=1e-2,
                                      report_to=[], save_strategy="no", use_cpu=True, seed=0,
                                      dataloader_num_workers=0, disable_tqdm=True)
        Trainer(model=model, args=arguments, train_dataset=data).train()
        trained.append(model.state_dict())
        assert len(logits) == 4 and all((found is None) == chunked for found in logits)
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_a_head_that_is_not_a_plain_linear_keeps_the_stock_loss() -> None:
    """Hooks on ``lm_head`` or a forward replaced on it (as Transformers' tensor parallelism installs): the
    logits are computed and the loss is the stock one."""
    model = tiny_causal_lm("entropy_invariant").train()
    ids = torch.randint(1, 211, (1, 9), generator=torch.Generator().manual_seed(6))
    handle = model.lm_head.register_forward_hook(lambda module, args, output: output)
    hooked = model(input_ids=ids, labels=ids)
    assert hooked.logits is not None
    stock = model.loss_function(hooked.logits, ids, vocab_size=model.config.vocab_size)
    torch.testing.assert_close(hooked.loss, stock)
    handle.remove()
    chunked = model(input_ids=ids, labels=ids)
    assert chunked.logits is None
    torch.testing.assert_close(chunked.loss, stock)
    model.lm_head.forward = model.lm_head.forward
    replaced = model(input_ids=ids, labels=ids)
    assert replaced.logits is not None
    torch.testing.assert_close(replaced.loss, stock)


def test_a_compiled_loss_compiles_once_per_chunk_count_not_per_length() -> None:
    """Trainer's dynamic padding gives every batch its own length: the compiled loss compiles again only
    when the power-of-two chunk count changes (``chunk_layout``), with equal losses and gradients (the
    ``range(0, tokens, chunk)`` loop fixed the token count: one graph per length, eight then uncompiled)."""
    graphs = []

    def count_graphs(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    torch.compiler.reset()  # nothing cached from another test

    @torch.compile(backend=count_graphs)
    def compiled(hidden, weight, labels, bias=None):
        return chunked_cross_entropy(hidden, weight, labels, bias=bias, chunk_tokens=64)

    lengths = [50, 66, 70, 85, 100, 131, 170, 200, 256]  # 100 … 512 tokens: 2, 4, …, 8 chunks of ≤ 64
    for length in lengths:
        hidden, weight, _ = leaves(torch.float32, 2, length, 8, 50, False, seed=length)
        labels = padded_labels(2, length, 50)
        expected, expected_grads = loss_and_grads(stock_loss, hidden, weight, None, labels)
        loss, grads = loss_and_grads(compiled, hidden, weight, None, labels)
        torch.testing.assert_close(loss, expected, **TOLERANCE[torch.float32])
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, **TOLERANCE[torch.float32])
    counts = {chunk_layout(2 * length, 64)[0] for length in lengths}
    assert counts == {2, 4, 8} and len(graphs) <= len(counts) + 1 < len(lengths)


@pytest.mark.parametrize(("chunk_size", "expected"), [(None, 4), (16, 2)], ids=["quadratic", "flash"])
def test_a_compiled_gau_training_step_compiles_once_per_bucket_over_seven_lengths(
        chunk_size: int | None, expected: int, monkeypatch) -> None:
    """A GAU causal LM's training step (labels, the chunked loss) compiled over lengths 40 … 130: the first
    length's graph, then one per bucket. FLASH: one dynamic graph (it pads its chunks while compiling, so
    lengths that chunks divide, 64, take the same graph). Quadratic GAU in query blocks (1,024 scores each
    here): 2, 4, 4, 8, 8, 8, 8 blocks, one graph for 4 blocks and two for 8 (at 70 the scores per block set
    the count, from 90 the bound that keeps blocks non-empty). Before, 7 graphs each."""
    monkeypatch.setattr(gau_kernels, "ATTENTION_BLOCK_ELEMENTS", 1024)
    blocks = [len(gau_kernels._query_blocks(n, n, 0)) for n in (40, 50, 64, 70, 90, 100, 130)]
    assert blocks == [2, 4, 4, 8, 8, 8, 8]
    graphs = []

    def count_graphs(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    torch.compiler.reset()  # nothing cached from another test's model
    torch.manual_seed(0)
    config = GAUConfig(vocab_size=211, hidden_size=32, num_hidden_layers=2, attention_key_size=8,
                       attention_normalization="relu2", chunk_size=chunk_size, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    model = GAUForCausalLM(config).train()
    compiled = torch.compile(model, backend=count_graphs)
    for length in (40, 50, 64, 70, 90, 100, 130):
        ids = torch.randint(1, 211, (2, length), generator=torch.Generator().manual_seed(length))
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.testing.assert_close(loss, model(input_ids=ids, labels=ids).loss)
    assert len(graphs) == expected


def test_chunk_layout_covers_the_tokens_in_at_most_count_padded_slots() -> None:
    for chunk in (1, 3, 64):
        for tokens in range(1, 300):
            count, size = chunk_layout(tokens, chunk)
            assert count & (count - 1) == 0 and size <= chunk
            assert 0 <= count * size - tokens < count and (count == 1 or (count // 2) * chunk < tokens)
