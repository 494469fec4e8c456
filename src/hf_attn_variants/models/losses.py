"""The causal-LM loss without the logits of the whole batch: a chunked ("fused linear") cross-entropy.

A causal LM's loss is L = (1/D) Σₜ [logsumexp(zₜ) − zₜ,yₜ] with logits zₜ = W hₜ (+ b) over the vocabulary V,
summed over the tokens t whose label yₜ is not ``ignore_index``; D is their number, or ``num_items_in_batch``
when given (Transformers' ``ForCausalLMLoss``: labels shifted left by one, logits upcast to float32). Computed
as written, training keeps float32 logits of every token for the backward pass: 4·V bytes a token, 8.4 GB at
65,536 tokens and V = 32,000. Here the tokens go through in chunks: a chunk's logits in the weight's dtype, a
float32 log-sum-exp per token, and at once the chunk's gradients

  ∂L/∂zₜ = (softmax(zₜ) − onehot(yₜ)) / D, ∂L/∂hₜ = (∂L/∂zₜ) W,  ∂L/∂W = Σₜ (∂L/∂zₜ)ᵀ hₜ,  ∂L/∂b = Σₜ ∂L/∂zₜ

after which the chunk's logits are freed. Backward only scales the saved gradients by the incoming one.

Why gradients in the forward pass (as Liger-Kernel's fused linear cross-entropy) rather than recomputing each
chunk's logits in backward: it does the LM head's three matrix products (zₜ, ∂L/∂hₜ, ∂L/∂W) once each, where
recomputation adds a fourth, and for small models the head is about half of a step's products (hidden 512,
V = 32,000). What stays saved for backward is ∂L/∂h, the size of the final hidden states (which the stock
head saves anyway), and ∂L/∂W, the size of the head's weight, which backward creates in any case; nothing of
size V per token. The price: a forward pass with gradients enabled computes the gradients even if backward
never runs.
"""

from __future__ import annotations

import torch
from torch import nn

IGNORE_INDEX = -100
"""Label of a token that is not scored (Transformers' and ``torch.nn.functional.cross_entropy``'s default)."""

CHUNK_ELEMENTS = 2**25
"""Logits per chunk when ``chunk_tokens`` is not given: chunk_tokens = CHUNK_ELEMENTS // V.

That is 1,048 tokens at V = 32,000: 67 MB of bf16 logits and 134 MB of float32 ones at a time.
"""


def default_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk for a vocabulary of ``vocab_size``: ``CHUNK_ELEMENTS // vocab_size``, at least 1.

    Args:
        vocab_size (int): V.

    Returns:
        int: the tokens per chunk.
    """
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


def chunk_layout(tokens: int, chunk: int) -> tuple[int, int]:
    """How ``tokens`` tokens split into chunks of at most ``chunk``: ``(count, size)``.

    count is the least power of two with count · chunk ≥ tokens, size = ⌈tokens / count⌉ ≤ chunk: the chunks
    are [i · size, (i + 1) · size) for i < count, the last ones shorter or empty. While compiling, the tokens
    are padded with fewer than ``count`` unscored ones (a copy) so that every chunk has the symbolic ``size``
    and adds no guard on its own. Why not ``range(0, tokens, chunk)``: under ``torch.compile`` that loop fixes
    the token count, so every new batch × length compiled the step again; here one graph holds for all token
    counts with the same ``count``: up to ``tokens``, ⌈log₂(tokens / chunk)⌉ + 1 such graphs, after the
    first, static one.

    Args:
        tokens (int): T, the tokens (an int, or a symbolic size while compiling).
        chunk (int): the most tokens per chunk, ≥ 1.

    Returns:
        tuple[int, int]: the chunk count and the chunk size.
    """
    count = 1
    while count * chunk < tokens:
        count *= 2
    return count, (tokens + count - 1) // count


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Loss and gradients chunk by chunk in forward (see the module docstring).

    Backward scales the saved gradients. Inputs: ``hidden`` [T, d], ``weight`` [V, d], ``bias`` [V] or
    ``None``, ``targets`` [T] int64, ``denominator`` a float32 scalar tensor.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, targets: torch.Tensor, denominator: torch.Tensor,
                chunk: int, ignore_index: int, with_grads: bool) -> torch.Tensor:
        need_h, need_w, need_b = (with_grads and ctx.needs_input_grad[i] for i in range(3))
        tokens = hidden.shape[0]
        count, size = chunk_layout(tokens, chunk)
        if torch.compiler.is_compiling():  # chunks of one symbolic size; eager slices views, copying nothing
            hidden = nn.functional.pad(hidden, (0, 0, 0, count * size - tokens))
            targets = nn.functional.pad(targets, (0, count * size - tokens), value=ignore_index)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = (torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
                  if need_b and bias is not None else None)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for index in range(count):  # eager: the last chunks may be shorter, or empty
            rows = slice(index * size, (index + 1) * size)
            h, t = hidden[rows], targets[rows]
            z = nn.functional.linear(h, weight, bias).float()  # (≤ size, V), the weight's dtype upcast
            lse = torch.logsumexp(z, dim=-1)
            valid = t != ignore_index
            safe = torch.where(valid, t, torch.zeros_like(t))
            total += torch.where(valid, lse - z.gather(1, safe[:, None]).squeeze(1), 0.0).sum()
            if not (need_h or need_w or need_b):
                continue
            dz = z.sub_(lse[:, None]).exp_()  # softmax, in place of the chunk's float32 logits
            dz[torch.arange(t.shape[0], device=t.device), safe] -= 1.0
            dz.mul_(torch.where(valid, 1.0 / denominator, 0.0)[:, None])  # no 0 / 0 where none is scored
            if grad_b is not None:
                grad_b += dz.sum(0)
            dz_low = dz.to(hidden.dtype)
            del z, dz
            if grad_h is not None:
                grad_h[rows] = dz_low @ weight
            if grad_w is not None:
                grad_w += (dz_low.t() @ h).float()
        if grad_h is not None:
            grad_h = grad_h[:tokens]
        ctx.save_for_backward(grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                              None if grad_b is None or bias is None else grad_b.to(bias.dtype))
        return total / denominator

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        scaled = [None if g is None else g * grad_output.to(g.dtype) for g in ctx.saved_tensors]
        return (*scaled, None, None, None, None, None)


def _targets(labels: torch.Tensor, shift: bool, ignore_index: int) -> torch.Tensor:
    """Labels [..., n] → per-token targets [T].

    With ``shift``, shifted left by one with ``ignore_index`` at each row's end (position t predicts token
    t + 1), as ``ForCausalLMLoss``.
    """
    if shift:
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return labels.reshape(-1).long()


def _check_inputs(hidden_states: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                  bias: torch.Tensor | None, chunk_tokens: int | None) -> None:
    """One ``ValueError`` / ``TypeError`` naming the argument whose shape or type does not fit."""
    if hidden_states.dim() < 2:
        raise ValueError(f"hidden_states: expected (..., hidden_size), got shape "
                         f"{tuple(hidden_states.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden_states.shape[-1]:
        raise ValueError(f"weight: expected (vocab_size, {hidden_states.shape[-1]}) for hidden states of "
                         f"width {hidden_states.shape[-1]}, got shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias: expected ({weight.shape[0]},), got shape {tuple(bias.shape)}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise TypeError(f"labels: expected integer token ids, got dtype {labels.dtype}")
    if tuple(labels.shape) != tuple(hidden_states.shape[:-1]):
        raise ValueError(f"labels: expected shape {tuple(hidden_states.shape[:-1])} (the hidden states' "
                         f"without the last dimension), got {tuple(labels.shape)}")
    if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens < 1):
        raise ValueError(f"chunk_tokens: expected a positive int or None, got {chunk_tokens!r}")


def _check_label_range(targets: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
    """``ValueError`` naming ``labels`` when a scored label is outside [0, V).

    Only for CPU tensors (elsewhere the check would make the host wait for the device at every training step)
    and not while compiling.
    """
    if torch.compiler.is_compiling() or targets.device.type != "cpu":
        return
    scored = targets[targets != ignore_index]
    if scored.numel() and bool(((scored < 0) | (scored >= vocab_size)).any()):
        raise ValueError(f"labels: token ids must be in [0, {vocab_size}) or ignore_index={ignore_index}, "
                         f"got values from {int(scored.min())} to {int(scored.max())}")


def chunked_cross_entropy(hidden_states: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                          bias: torch.Tensor | None = None, shift: bool = True,
                          ignore_index: int = IGNORE_INDEX,
                          num_items_in_batch: torch.Tensor | int | None = None,
                          chunk_tokens: int | None = None) -> torch.Tensor:
    """Causal-LM cross-entropy of the logits ``hidden_states @ weightᵀ + bias``, chunk by chunk.

    Never holds the logits of more than ``chunk_tokens`` tokens: L = (1/D) Σₜ [logsumexp(zₜ) − zₜ,yₜ] over the
    tokens whose label is not ``ignore_index``, D = their number or ``num_items_in_batch``. Equals
    Transformers' ``ForCausalLMLoss`` on the full logits (float32 log-softmax of logits in the weight's
    dtype), gradients included. Saved for backward: ∂L/∂h ``[T, d]`` in the hidden states' dtype and ∂L/∂W,
    ∂L/∂b in the weight's, computed here when gradients are enabled (module docstring).

    Args:
        hidden_states (torch.Tensor): ``[B, T, d]`` (or ``[T, d]`` with ``shift=False``), the final hidden
            states (the LM head's input), float32 / bf16 / fp16; under ``torch.autocast`` cast to its dtype,
            as the head is.
        weight (torch.Tensor): ``[V, d]``, the LM head's weight (tied to the input embedding or not), the
            hidden states' dtype.
        labels (torch.Tensor): ``[B, T]`` integer token ids, the hidden states' shape without ``d``; with
            ``shift`` (the default) the input ids, position t predicting token t + 1; with ``shift=False``
            already shifted (Transformers' ``shift_labels``).
        bias (torch.Tensor | None): ``[V]``, the weight's dtype, or ``None``.
        shift (bool): shift ``labels`` left by one inside (``ignore_index`` at the end of each row).
        ignore_index (int): label of tokens that are not scored (padding, prompts).
        num_items_in_batch (torch.Tensor | int | None): the denominator D instead of the number of scored
            tokens (Trainer's gradient accumulation); a tensor or an int.
        chunk_tokens (int | None): tokens whose logits exist at once (default ``default_chunk_tokens(V)``,
            ≈ 2²⁵ logits).

    Returns:
        torch.Tensor: a float32 scalar (NaN when no token is scored and ``num_items_in_batch`` is not given,
        as Transformers' loss).
    """
    _check_inputs(hidden_states, weight, labels, bias, chunk_tokens)
    device_type = hidden_states.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden_states, weight = hidden_states.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    if weight.dtype != hidden_states.dtype:
        raise ValueError(f"weight: dtype {weight.dtype} differs from the hidden states' "
                         f"{hidden_states.dtype} (cast one, or run under torch.autocast)")
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    targets = _targets(labels, shift, ignore_index).to(hidden.device)
    _check_label_range(targets, weight.shape[0], ignore_index)
    if num_items_in_batch is None:
        denominator = (targets != ignore_index).sum().float()
    else:
        denominator = torch.as_tensor(num_items_in_batch, device=hidden.device).float()
    chunk = chunk_tokens or default_chunk_tokens(weight.shape[0])
    with_grads = torch.is_grad_enabled()
    return _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, denominator, chunk, ignore_index,
                                      with_grads)


__all__ = ["CHUNK_ELEMENTS", "IGNORE_INDEX", "chunk_layout", "chunked_cross_entropy", "default_chunk_tokens"]
