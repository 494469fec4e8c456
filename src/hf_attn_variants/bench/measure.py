"""Timing, peak-memory and FLOP measurement of one training or inference step.

- Time: every step records wall-clock (``time.perf_counter``, after ``torch.cuda.synchronize`` on a GPU)
  *and* process CPU time (``time.process_time``). On a CPU shared with other jobs, wall-clock time
  measures the other jobs as much as the model; with one intra-op thread the process CPU time is what
  the step costs on a core of its own, so it is the default "primary" timer on CPU (``--timer``).
- Memory: the peak of live tensor memory *allocated during the step* (activations, gradients,
  temporaries; parameters excluded). GPU: ``torch.cuda.max_memory_allocated`` minus the allocation before
  the step. CPU: there is no allocator peak counter, so the step runs once under ``torch.profiler`` with
  ``profile_memory=True`` and every allocation/free event is replayed in time order (exact for tensors
  from the CPU allocator, inductor's buffers included; RSS would be far too noisy).
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one step (matmul-class ops; attention counted
  as full n² even when causal, the usual MFU convention). Transformers' CPU SDPA goes through
  ``aten._scaled_dot_product_flash_attention_for_cpu``, which the counter does not know; its formula is
  registered here (the same as for the GPU flash kernel).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

StepFn = Callable[[], None]


TRITON_INTERPRETER_INDEX_BUG = (
    "Triton's interpreter cannot run a loop over a range computed from kernel arguments with this Triton and "
    "numpy: it converts the bounds with int() on one-element arrays, which numpy ≥ 2.4 refuses "
    "(triton-lang/triton#9171; Triton 3.9, the lock's, has the fix). Reproducer, with TRITON_INTERPRET=1: "
    "@triton.jit def k(X, n): [tl.store(X + i, 1.0) for i in range(0, n)] → InterpreterError: "
    "TypeError('only 0-dimensional arrays can be converted to Python scalars')"
)
"""Why Triton kernels cannot run here in Triton's interpreter (see ``triton_skip_reason``)."""


@functools.cache
def triton_skip_reason() -> str | None:
    """Why GAU's Triton kernels cannot run in this environment, or ``None``: the reason a bench row or a test
    of them is skipped.

    Not installed; or, under ``TRITON_INTERPRET=1``, an interpreter that fails the minimal reproducer of
    triton-lang/triton#9171 (Triton 3.6 with numpy ≥ 2.4, as on the GPU image of 2026-11): found by running
    the reproducer, so only the affected versions skip. Compiled for a GPU, Triton 3.6 runs the kernels."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return None
    import triton
    import triton.language as tl

    @triton.jit
    def ranged_store(X, n):
        for i in range(0, n):
            tl.store(X + i, 1.0)

    out = torch.zeros(4)
    try:
        ranged_store[(1,)](out, 3)
    except Exception as error:  # noqa: BLE001 - any failure of the reproducer is the bug
        if "0-dimensional" in str(error):
            return TRITON_INTERPRETER_INDEX_BUG
        raise
    return None


@dataclass
class StepTime:
    """Seconds one step took by the wall clock and by this process's CPU clock."""

    wall: float
    cpu: float


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model: nn.Module, input_ids: torch.Tensor, train: bool,
              autocast_dtype: torch.dtype | None) -> StepFn:
    """A closure running one forward+backward (``train``) or one no-grad forward of ``model``.

    Loss for training: mean of the squared last hidden state (no LM head, so the vocabulary projection does
    not dilute the comparison). Gradients are dropped before each step (``set_to_none``), as an optimizer
    loop with ``zero_grad()`` would.
    """
    device = input_ids.device

    def autocast() -> contextlib.AbstractContextManager:
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=autocast_dtype)

    if train:

        def step() -> None:
            model.zero_grad(set_to_none=True)
            with autocast():
                hidden = model(input_ids=input_ids).last_hidden_state
                loss = hidden.float().square().mean()
            loss.backward()

    else:

        def step() -> None:
            with torch.no_grad(), autocast():
                model(input_ids=input_ids)

    return step


def time_step(step: StepFn, device: torch.device) -> StepTime:
    """Run ``step`` once and return its wall-clock and CPU time."""
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    synchronize(device)
    return StepTime(time.perf_counter() - wall, time.process_time() - cpu)


def _allocation_events(prof: object) -> list[tuple[int, int]] | None:
    """(time ns, ±bytes) of every allocation and free the profiler saw, from its raw event tree.

    Each allocation event carries its own timestamp, so the replay is exact even for memory freed in a
    different op than the one that allocated it (e.g. temporaries of an ``autograd.Function``), and it
    includes the buffers of inductor-generated code. Private profiler API: ``None`` if it is missing.
    """
    try:
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError:
        return None
    events: list[tuple[int, int]] = []
    stack = list(roots)
    while stack:
        event = stack.pop()
        fields = event.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            events.append((event.start_time_ns, int(fields.alloc_size)))
        stack.extend(event.children)
    return sorted(events)


def _replay_peak(prof: object) -> int:
    """Peak of the running sum of allocations (+) and frees (−) in time order, in bytes."""
    events = _allocation_events(prof)
    if events is None:  # fallback: per-op self memory in op start order (misses some transients)
        events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events())
    running = peak = 0
    for _, size in events:
        running += size
        peak = max(peak, running)
    return peak


def peak_step_memory(step: StepFn, device: torch.device) -> int:
    """Peak bytes of tensor memory allocated while ``step`` runs (above what was live before it)."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # this torch build logs two lines per profiler start/stop
        prof.start()
    try:
        step()
    finally:
        with _quiet_stderr():
            prof.stop()
    return _replay_peak(prof)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (C++ log lines) for the duration; Python exceptions still propagate."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w", encoding="utf-8") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


_FORMULAS_REGISTERED = False


def _register_cpu_flash_formulas() -> None:
    """Teach FlopCounterMode the FLOPs of the CPU flash-attention kernels (same formula as on GPU)."""
    global _FORMULAS_REGISTERED
    if _FORMULAS_REGISTERED:
        return
    from torch.utils import flop_counter

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None and forward not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(forward)
        def _cpu_flash_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    if backward is not None and backward not in flop_counter.flop_registry:

        @flop_counter.register_flop_formula(backward)
        def _cpu_flash_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                                **kwargs) -> int:
            return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    _FORMULAS_REGISTERED = True


def flash_flops(tokens: int, key_size: int, width: int, chunk_size: int) -> dict[str, int]:
    """FLOPs of the FLASH op's Triton kernels on ``tokens`` = B·T tokens (each ``[B, T, ·]``).

    The products the torch path's matmuls make for the same work, whole g×g blocks included as there, so that
    a step counts the same FLOPs on either path. Forward: k'ᵀv per chunk (``chunk_outer``, 2·BT·s·e), then
    q·kᵀ, W·v and q'·H_c (``forward``). Backward: twice each forward product, as autograd's matmuls (and
    torch's formula for flash attention) count it, less the two ``chunk_outer`` calls the backward makes and
    that count themselves (q'ᵀdO, and k'ᵀv for the states it recomputes, a cost of the kernels like
    FlashAttention's recomputed scores)."""
    quadratic, linear = 2 * tokens * chunk_size * (key_size + width), 2 * tokens * key_size * width
    return {"chunk_outer": linear, "forward": quadratic + linear, "backward": 2 * quadratic + 2 * linear}


def _register_triton_flash_formulas() -> None:
    """Teach the FLOP counter the FLASH op's Triton kernels (``torch.ops.hf_attn_variants.flash_*``), which it
    cannot see into (``flash_flops``); nothing without triton."""
    from torch.utils import flop_counter

    from ..models.gau_triton import TRITON_AVAILABLE

    if not TRITON_AVAILABLE or torch.ops.hf_attn_variants.flash_forward in flop_counter.flop_registry:
        return
    ops = torch.ops.hf_attn_variants

    def sizes(query_shape: Any, width: int, chunk_size: int) -> dict[str, int]:
        batch, length, key_size = query_shape
        return flash_flops(batch * length, key_size, width, min(chunk_size, length))

    @flop_counter.register_flop_formula(ops.flash_chunk_outer)
    def _outer(a_shape, x_shape, chunk_size, *args, out_shape=None, **kwargs) -> int:
        return sizes(a_shape, x_shape[-1], chunk_size)["chunk_outer"]

    @flop_counter.register_flop_formula(ops.flash_forward)
    def _forward(quad_q_shape, quad_k_shape, lin_q_shape, value_shape, states_shape, key_mask_shape,
                 chunk_size, *args, out_shape=None, **kwargs) -> int:
        return sizes(quad_q_shape, value_shape[-1], chunk_size)["forward"]

    @flop_counter.register_flop_formula(ops.flash_backward)
    def _backward(quad_q_shape, quad_k_shape, lin_q_shape, lin_k_shape, value_shape, *args, out_shape=None,
                  **kwargs) -> int:
        chunk_size = args[4]  # after states, grad_summaries, key_mask and grad_output
        return sizes(quad_q_shape, value_shape[-1], chunk_size)["backward"]


class _FlopCounter:
    """A minimal FLOP counter: ``torch.utils.flop_counter``'s formulas, without its module tracking.

    ``FlopCounterMode`` also attributes FLOPs to modules through hooks that keep tensors alive longer (it
    raised a Llama step's measured peak by 13 %) and cost ~0.1 s per step; only the total is needed here.
    """

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        _register_cpu_flash_formulas()
        _register_triton_flash_formulas()
        counter = self
        self.total = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                formula = flop_registry.get(func._overloadpacket)
                if formula is not None:
                    counter.total += int(formula(*args, **kwargs, out_val=out))
                return out

        self.mode = Mode()


def count_step_flops(step: StepFn) -> int:
    """FLOPs of one run of ``step`` (matmul-class ops and attention kernels)."""
    counter = _FlopCounter()
    with counter.mode:
        step()
    return counter.total


def warmup_with_memory_and_flops(step: StepFn, device: torch.device, count: bool) -> tuple[int, int | None]:
    """First (untimed) steps of an eager model: peak memory, then FLOPs when ``count`` (one more step)."""
    memory = peak_step_memory(step, device)
    return memory, (count_step_flops(step) if count else None)


def graph_breaks(model: nn.Module, input_ids: torch.Tensor) -> tuple[int, int, list[str]]:
    """``torch._dynamo.explain``: (graphs, graph breaks, first reasons) for a forward of ``model``."""
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(input_ids=input_ids)
    reasons = [str(getattr(b, "reason", b)).splitlines()[0][:160] for b in explanation.break_reasons[:3]]
    torch._dynamo.reset()
    return explanation.graph_count, explanation.graph_break_count, reasons


__all__ = [
    "StepTime",
    "count_step_flops",
    "graph_breaks",
    "make_step",
    "peak_step_memory",
    "synchronize",
    "time_step",
    "warmup_with_memory_and_flops",
]
