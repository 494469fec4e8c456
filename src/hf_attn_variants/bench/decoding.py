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

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
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


def time_generate(model: torch.nn.Module, batch: int, context: int, new_tokens: int,
                  seed: int = 0) -> dict[str, Any]:
    """Greedy ``generate`` of ``new_tokens`` (end of sequence never stops it) after a random prompt of
    ``context`` tokens per row (on the model's device): ``{prefill_s, step_ms (median), steps,
    tokens_per_s}``."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, model.config.vocab_size, (batch, context), generator=generator, device="cpu")
    prompt = prompt.to(next(model.parameters()).device)
    clock = StepClock()
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False,
                       logits_processor=LogitsProcessorList([clock]),
                       pad_token_id=0)
    steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    step = statistics.median(steps)
    return {"prefill_s": clock.times[0] - started, "step_ms": 1e3 * step, "steps": len(steps),
            "tokens_per_s": batch / step}


def measure(names: Sequence[str], batches: Sequence[int], contexts: Sequence[int], new_tokens: int,
            size: DecodingSize = DecodingSize(), log: Callable[[str], None] = print, device: str = "cpu",
            dtype: torch.dtype | None = None) -> list[dict[str, Any]]:
    """One row per model × batch × context (``time_generate``), each model built once for the longest sequence
    (on ``device``, its weights cast to ``dtype`` when given), after one short warm-up generation; rows carry
    the model's parameter count without embeddings."""
    rows = []
    longest = max(contexts) + new_tokens
    for name in names:
        torch.manual_seed(0)
        with torch.device(device):
            model = DECODERS[name][1](size, longest).eval()
        if dtype is not None:
            model = model.to(dtype=dtype)
        parameters = model.num_parameters(exclude_embeddings=True)
        time_generate(model, 1, min(contexts), 4)
        for batch in batches:
            for context in contexts:
                row = {"model": name, "batch": batch, "context": context, "parameters": parameters,
                       **time_generate(model, batch, context, new_tokens)}
                log(f"  {name:18s} batch {batch:2d} context {context:5d}: prefill {row['prefill_s']:.2f} s, "
                    f"step {row['step_ms']:.1f} ms, {row['tokens_per_s']:.0f} tokens/s")
                rows.append(row)
    return rows


__all__ = ["DECODERS", "DecodingSize", "StepClock", "measure", "time_generate"]
