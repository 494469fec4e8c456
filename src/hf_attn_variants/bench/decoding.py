"""Decoding speed: ``generate`` tokens per second of each family's causal LM against a stock Llama with the
same number of parameters, at batch 1 and 16 and contexts of 512 and 4096 tokens (issue 24,
docs/benchmarks.md).

``generate`` runs greedy with a ``StepClock`` logits processor, which Transformers calls once per generated
token, after the model's forward of that step: the time from the call to ``generate`` to the first call is the
prefill; the differences between later calls are the decoding steps (forward of one new token per sequence
with the cache, plus ``generate``'s own bookkeeping). A row's per-token cost is the median step, its tokens/s
batch ÷ that median.

Models (``DECODERS``), at the CPU benchmark's width (hidden 256, key size 128, e = 2·hidden), float32, dropout
off, SDPA where the family has it: stock ``LlamaForCausalLM`` (2 layers, 4 heads, SwiGLU 680); the
entropy-invariant decoder shaped like it (its two-matrix FFN 1.5× wider: same parameters); GAU with
``softmax_plus`` (quadratic) and FLASH (relu², chunks of 256) with twice as many layers (one GAU layer holds
about half an attention + FFN layer, as the FLASH paper compares them); the Synthesizer ``random+vanilla``
(its l×l patterns sized to context + new tokens; its learned l×l pattern R makes it far larger than the
others, which no size choice avoids). FLASH's cache is its open chunk and the summed state of closed chunks,
so its per-token cost should not grow with the context; the table's step growth is (median step at the longest
context) ÷ (at the shortest).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

from ..models.configuration_entropy_invariant import EntropyInvariantConfig
from ..models.configuration_gau import GAUConfig
from ..models.configuration_synthesizer import SynthesizerConfig
from ..models.modeling_entropy_invariant import EntropyInvariantForCausalLM
from ..models.modeling_gau import GAUForCausalLM
from ..models.modeling_synthesizer import SynthesizerForCausalLM


@dataclass(frozen=True)
class DecodingSize:
    """The shared model size of the decoding table."""

    vocab_size: int = 1000
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    llama_intermediate: int = 680
    gau_key_size: int = 128
    gau_chunk_size: int = 256

    def common(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "pad_token_id": 0,
                "bos_token_id": None, "eos_token_id": None}


def llama(size: DecodingSize, longest: int) -> torch.nn.Module:
    """Stock ``LlamaForCausalLM`` (SDPA, as many key/value heads as query heads, its head tied to the
    embedding as ours are): the baseline."""
    return LlamaForCausalLM(LlamaConfig(
        **size.common(), num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_heads, intermediate_size=size.llama_intermediate,
        max_position_embeddings=longest, tie_word_embeddings=True, attn_implementation="sdpa"))


def entropy_invariant(size: DecodingSize, longest: int) -> torch.nn.Module:
    """``EntropyInvariantForCausalLM`` shaped like the Llama (RoPE, RMSNorm, SiLU, no biases), FFN 1.5×
    wider."""
    return EntropyInvariantForCausalLM(EntropyInvariantConfig(
        **size.common(), num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
        intermediate_size=size.llama_intermediate * 3 // 2, max_position_embeddings=longest,
        norm_type="rmsnorm",
        use_bias=False, is_decoder=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa"))


def gau(size: DecodingSize, longest: int, chunk: bool) -> torch.nn.Module:
    """``GAUForCausalLM`` with twice the layers: ``softmax_plus`` (quadratic) or FLASH (relu², chunks)."""
    fields = ({"attention_normalization": "relu2", "chunk_size": size.gau_chunk_size} if chunk
              else {"attention_normalization": "softmax_plus"})
    return GAUForCausalLM(GAUConfig(
        **size.common(), num_hidden_layers=2 * size.num_layers, attention_key_size=size.gau_key_size,
        max_position_embeddings=longest, is_decoder=True, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **fields))


def synthesizer(size: DecodingSize, longest: int) -> torch.nn.Module:
    """``SynthesizerForCausalLM`` mixing ``random`` and ``vanilla``, its patterns sized to the longest
    sequence."""
    return SynthesizerForCausalLM(SynthesizerConfig(
        **size.common(), num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
        intermediate_size=size.llama_intermediate * 3 // 2, max_position_embeddings=longest, is_decoder=True,
        synthesizer_components=["random", "vanilla"], hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))


DECODERS: dict[str, tuple[str, Callable[[DecodingSize, int], torch.nn.Module]]] = {
    "llama": ("stock LlamaForCausalLM, SDPA (baseline)", llama),
    "entropy_invariant": ("EntropyInvariantForCausalLM, Llama-shaped, SDPA", entropy_invariant),
    "gau_softmax_plus": ("GAUForCausalLM softmax_plus, quadratic, 2× layers", lambda s, n: gau(s, n, False)),
    "gau_flash": ("GAUForCausalLM FLASH (relu², chunks of 256), 2× layers", lambda s, n: gau(s, n, True)),
    "synthesizer": ("SynthesizerForCausalLM random+vanilla", synthesizer),
}
"""name → (description, builder(size, longest sequence))."""


class StepClock(LogitsProcessor):
    """Records the time of every ``generate`` step (it is called once per new token, after that step's
    forward)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.is_cuda:  # the step's kernels have finished when it is timed
            torch.cuda.synchronize(scores.device)
        self.times.append(time.perf_counter())
        return scores


def generate(model: torch.nn.Module, batch: int, context: int, new_tokens: int, clock: StepClock,
             seed: int = 0, cache_implementation: str | None = None,
             sdpa_backends: Sequence[SDPBackend] | None = None) -> None:
    """Greedy ``generate`` of ``new_tokens`` (end of sequence never stops it) after a random prompt of
    ``context`` tokens per row, on the model's device, with ``cache_implementation`` (``None``: the default
    dynamic cache; ``"static"`` is compiled by Transformers on CUDA) and, when given, only ``sdpa_backends``
    for every ``scaled_dot_product_attention`` (``DECODING_SDPA_BACKENDS``)."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, model.config.vocab_size, (batch, context), generator=generator, device="cpu")
    prompt = prompt.to(next(model.parameters()).device)
    cache = {} if cache_implementation is None else {"cache_implementation": cache_implementation}
    backends = sdpa_kernel(list(sdpa_backends)) if sdpa_backends else contextlib.nullcontext()
    with torch.no_grad(), backends:
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False,
                       logits_processor=LogitsProcessorList([clock]),
                       pad_token_id=0, **cache)


def time_generate(model: torch.nn.Module, batch: int, context: int, new_tokens: int,
                  seed: int = 0, cache_implementation: str | None = None,
                  sdpa_backends: Sequence[SDPBackend] | None = None) -> dict[str, Any]:
    """``generate`` timed by a ``StepClock``: ``{prefill_s, step_ms (median), steps, tokens_per_s}``."""
    clock = StepClock()
    started = time.perf_counter()
    generate(model, batch, context, new_tokens, clock, seed, cache_implementation, sdpa_backends)
    steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    step = statistics.median(steps)
    return {"prefill_s": clock.times[0] - started, "step_ms": 1e3 * step, "steps": len(steps),
            "tokens_per_s": batch / step}


DECODING_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
"""The ``scaled_dot_product_attention`` kernels every decoding measurement allows, for every model alike.

Not cuDNN's: torch tries it first on sm90/sm100 when its cuDNN is 9.15 or newer (torch 2.11's wheels are), and
cuDNN builds an execution plan for each new shape, so with a dynamic cache at every decoding step (the key
length grows by one). That is a fixed host cost per step at any batch or context, the shape of the stock
Llama's 90 ms steps in the first GPU run (its entropy-invariant twin took 19–28 ms); the profiles that
``scripts/gpu_check.py decoding`` writes show which kernels each model ran."""

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpyAsync")
"""Runtime calls that make the host wait for the GPU (a device-to-host copy among them)."""
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def profile_generate(model: torch.nn.Module, batch: int, context: int, new_tokens: int, top: int = 8,
                     cache_implementation: str | None = None,
                     sdpa_backends: Sequence[SDPBackend] | None = None) -> dict[str, Any]:
    """What one greedy ``generate`` spends its decoding steps on, from ``torch.profiler`` (CPU, and CUDA
    where the model is): ``{steps, wall_ms_per_step, cpu_ops_per_step, kernels_per_step, launches_per_step,
    syncs_per_step, gpu_ms_per_step, top_cpu: [{name, calls, self_ms}], top_kernels: [{name, calls, ms}]}``,
    per step counts over the whole call (prefill included) ÷ the steps. A step far slower than its GPU time
    with few kernels is host-bound; many syncs per step point to a host read of a device value."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = next(model.parameters()).is_cuda
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_cuda else [])]
    clock = StepClock()
    with profile(activities=activities) as profiler:
        generate(model, batch, context, new_tokens, clock, cache_implementation=cache_implementation,
                 sdpa_backends=sdpa_backends)
    events = profiler.key_averages()
    steps = max(len(clock.times) - 1, 1)
    per_step = (clock.times[-1] - clock.times[0]) / steps if len(clock.times) > 1 else 0.0

    kernels = device_kernels(events)
    cpu_ops = [e for e in events if e.key.startswith("aten::")]
    calls = {e.key: e.count for e in events}
    return {
        "batch": batch, "context": context, "steps": steps, "cache": cache_implementation or "dynamic",
        "wall_ms_per_step": round(1e3 * per_step, 3),
        "cpu_ops_per_step": round(sum(e.count for e in cpu_ops) / steps, 1),
        "kernels_per_step": round(sum(e.count for e in kernels) / steps, 1),
        "launches_per_step": round(sum(calls.get(name, 0) for name in LAUNCH_CALLS) / steps, 1),
        "syncs_per_step": round(sum(calls.get(name, 0) for name in SYNC_CALLS) / steps, 2),
        "gpu_ms_per_step": round(sum(device_us(e) for e in kernels) / 1e3 / steps, 3),
        "top_cpu": [{"name": e.key, "calls": e.count, "self_ms": round(e.self_cpu_time_total / 1e3, 2)}
                    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]],
        "top_kernels": [{"name": e.key[:120], "calls": e.count, "ms": round(device_us(e) / 1e3, 3)}
                        for e in sorted(kernels, key=lambda e: -device_us(e))[:top]],
    }


def device_us(event: Any) -> float:
    """A profiler event's own time on the device, in µs (0 for host events)."""
    return float(getattr(event, "self_device_time_total", 0.0) or 0.0)


def device_kernels(events: Sequence[Any]) -> list[Any]:
    """The events of ``torch.profiler``'s ``key_averages()`` that are kernels run on the GPU, by their device
    (cuDNN's ``cudnn_…``, cuBLAS's and CUTLASS's included, which a filter by name dropped), not the host's
    ``cuda…`` runtime calls."""
    from torch.autograd import DeviceType

    return [e for e in events if e.device_type == DeviceType.CUDA and device_us(e) > 0]


def build_decoder(name: str, size: DecodingSize, longest: int, device: str = "cpu",
                  dtype: torch.dtype | None = None) -> torch.nn.Module:
    """``DECODERS[name]`` for sequences of up to ``longest`` tokens, in eval mode, its parameters created on
    ``device`` (seed 0) and cast to ``dtype`` when given."""
    torch.manual_seed(0)
    with torch.device(device):
        model = DECODERS[name][1](size, longest).eval()
    return model if dtype is None else model.to(dtype=dtype)


def measure_model(model: torch.nn.Module, name: str, batches: Sequence[int], contexts: Sequence[int],
                  new_tokens: int, log: Callable[[str], None] = print,
                  cache_implementation: str | None = None,
                  sdpa_backends: Sequence[SDPBackend] | None = None,
                  on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One row per batch × context (``time_generate``) after one short warm-up generation; rows carry the
    model's parameter count without embeddings and the cache (``"dynamic"`` for the default), and each is
    given to ``on_row`` as soon as it is measured (the GPU check writes it at once). A static
    cache's warm-up generates all ``new_tokens`` at the shortest context: Transformers sizes that cache for
    the longest generation so far, and a shorter warm-up made the timed one grow it and compile the model
    again (the GPU check's static rows take that one batch and context; a longer context still grows it)."""
    parameters = model.num_parameters(exclude_embeddings=True)
    cache = cache_implementation or "dynamic"
    time_generate(model, 1, min(contexts), new_tokens if cache == "static" else 4,
                  cache_implementation=cache_implementation, sdpa_backends=sdpa_backends)
    rows = []
    for batch in batches:
        for context in contexts:
            timing = time_generate(model, batch, context, new_tokens,
                                   cache_implementation=cache_implementation, sdpa_backends=sdpa_backends)
            row = {"model": name, "cache": cache, "batch": batch, "context": context,
                   "parameters": parameters, **timing}
            log(f"  {name:18s} {cache:7s} batch {batch:2d} context {context:5d}: prefill "
                f"{row['prefill_s']:.2f} s, step {row['step_ms']:.1f} ms, {row['tokens_per_s']:.0f} tokens/s")
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def measure(names: Sequence[str], batches: Sequence[int], contexts: Sequence[int], new_tokens: int,
            size: DecodingSize = DecodingSize(), log: Callable[[str], None] = print, device: str = "cpu",
            dtype: torch.dtype | None = None) -> list[dict[str, Any]]:
    """``measure_model`` of each model, built once for the longest sequence (``build_decoder``), with the
    default dynamic cache."""
    longest = max(contexts) + new_tokens
    return [row for name in names
            for row in measure_model(build_decoder(name, size, longest, device, dtype), name, batches,
                                     contexts, new_tokens, log)]


__all__ = ["DECODERS", "DECODING_SDPA_BACKENDS", "DecodingSize", "StepClock", "build_decoder",
           "device_kernels", "device_us", "generate", "measure", "measure_model", "profile_generate",
           "time_generate"]
