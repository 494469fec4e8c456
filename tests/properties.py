"""Model-agnostic property checks, reused by every family's tests.

Each function takes a model in eval mode (dropout off) and asserts one property that any correct
attention variant must have: padding invariance, no leakage from the future, incremental decoding
equal to a full forward pass, finite outputs for bf16 and for rows that are all padding.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from tests.utils import left_padded, random_ids, right_padded


def hidden(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor | None = None,
           **kwargs) -> torch.Tensor:
    """Last hidden state of the base model (or logits of a head) for ``ids``."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **kwargs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


def assert_padding_invariant(
    model: PreTrainedModel, *, length: int = 12, lengths: tuple[int, ...] = (12, 7, 4), left: bool = False,
    atol: float = 1e-5
) -> None:
    """A padded, masked batch gives, at its real positions, what each sequence gives alone unpadded."""
    vocab = model.config.vocab_size
    ids = random_ids(len(lengths), length, vocab=vocab, seed=1)
    pad = left_padded if left else right_padded
    padded_ids, mask = pad(ids, list(lengths), pad_id=model.config.pad_token_id or 0)
    batch_out = hidden(model, padded_ids, mask)
    for row, n in enumerate(lengths):
        alone = padded_ids[row : row + 1, length - n :] if left else padded_ids[row : row + 1, :n]
        single = hidden(model, alone)[0]
        got = batch_out[row, length - n :] if left else batch_out[row, :n]
        assert torch.allclose(got, single, atol=atol), (f"row {row} (n={n}): max diff "
                                                        f"{(got - single).abs().max():.3g}")


def assert_no_future_leakage(model: PreTrainedModel, *, length: int = 10, cut: int = 6) -> None:
    """Changing tokens after position ``cut`` leaves every output before it unchanged."""
    vocab = model.config.vocab_size
    ids = random_ids(2, length, vocab=vocab, seed=2)
    changed = ids.clone()
    changed[:, cut:] = random_ids(2, length - cut, vocab=vocab, seed=3)
    a, b = hidden(model, ids), hidden(model, changed)
    assert torch.allclose(a[:, :cut], b[:, :cut], atol=1e-6)
    assert not torch.allclose(a[:, cut:], b[:, cut:], atol=1e-4), "future tokens had no effect at all"


def assert_cache_matches_full_forward(
    model: PreTrainedModel, *, prompt: int = 5, steps: int = 6, padded: bool = True, atol: float = 1e-5
) -> None:
    """Prefill + one token at a time with a ``DynamicCache`` gives the logits of one full forward pass.

    With ``padded`` the batch is left-padded (as ``generate`` pads), so the cache path must also count
    and mask the padded keys the way the full pass does.
    """
    vocab = model.config.vocab_size
    total = prompt + steps
    ids = random_ids(2, total, vocab=vocab, seed=4)
    lengths = [total, total - 3] if padded else [total, total]
    ids, mask = left_padded(ids, lengths, pad_id=model.config.pad_token_id or 0)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
        cache = DynamicCache(config=model.config)
        out = model(
            input_ids=ids[:, :prompt],
            attention_mask=mask[:, :prompt],
            position_ids=position_ids[:, :prompt],
            past_key_values=cache,
            use_cache=True,
        )
        pieces = [out.logits]
        for t in range(prompt, total):
            out = model(
                input_ids=ids[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=position_ids[:, t : t + 1],
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            pieces.append(out.logits)
    incremental = torch.cat(pieces, dim=1)
    real = mask.bool()
    diff = (incremental - full).abs().amax(-1)[real]
    assert diff.max() < atol, f"cache vs full forward: max diff {diff.max():.3g}"


def assert_same_greedy_choices(
    expected: torch.Tensor, got: torch.Tensor, scores: list[torch.Tensor], *, atol: float = 1e-4
) -> None:
    """Two greedy continuations ``(batch, steps)`` agree, or each row first differs where ``scores[step]``
    (the reference's logits, ``(batch, vocab)``) ties the two tokens within ``atol``: another CPU's kernels
    may break a near tie the other way, which is no error; after that point the rows are not compared."""
    for row in range(expected.shape[0]):
        differ = (expected[row] != got[row]).nonzero()
        if differ.numel():
            step = int(differ[0])
            a, b = int(expected[row, step]), int(got[row, step])
            gap = float((scores[step][row, a] - scores[step][row, b]).abs())
            assert gap < atol, (f"row {row}, step {step}: tokens {a} vs {b} differ with a logit gap of "
                                f"{gap:.3g}")


def assert_generate_matches_greedy_full_forward(model: PreTrainedModel, *, prompt: int = 4,
                                                new: int = 5) -> None:
    """``generate`` (greedy, with cache) picks the argmax of full forward passes at every step."""
    ids = random_ids(1, prompt, vocab=model.config.vocab_size, seed=5)
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0)
        manual, scores = ids, []
        for _ in range(new):
            scores.append(model(input_ids=manual).logits[:, -1])
            manual = torch.cat([manual, scores[-1].argmax(-1, keepdim=True)], dim=1)
    assert_same_greedy_choices(manual[:, prompt:], generated[:, prompt:], scores)


def assert_finite_bf16_and_all_padding(model: PreTrainedModel, *, length: int = 9) -> None:
    """bf16 autocast and a batch row that is entirely padding both give finite outputs."""
    vocab = model.config.vocab_size
    ids = random_ids(2, length, vocab=vocab, seed=6)
    mask = torch.ones_like(ids)
    mask[1] = 0
    out = hidden(model, ids, mask)
    assert torch.isfinite(out).all(), "all-padding row produced non-finite values"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = hidden(model, ids, mask)
    assert torch.isfinite(out.float()).all(), "bf16 autocast produced non-finite values"
    bf16_model = type(model)(model.config).to(torch.bfloat16).eval()
    bf16_model.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    out = hidden(bf16_model, ids, mask)
    assert torch.isfinite(out.float()).all(), "bf16 weights produced non-finite values"
