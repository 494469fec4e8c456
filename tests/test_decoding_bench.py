"""The decoding benchmark (``bench/decoding.py``, ``scripts/decoding_bench.py``) at tiny sizes: what it times
and how its table reads."""

from __future__ import annotations

import torch

from hf_attn_variants.bench.decoding import DECODERS, DecodingSize, StepClock, measure, time_generate
from tools.docs_results import decoding

TINY = DecodingSize(hidden_size=64, num_heads=2, llama_intermediate=168, gau_key_size=32, gau_chunk_size=8)


def test_the_step_clock_ticks_once_per_generated_token() -> None:
    model = DECODERS["gau_flash"][1](TINY, 64).eval()
    clock = StepClock()
    prompt = torch.randint(1, TINY.vocab_size, (2, 20))
    from transformers import LogitsProcessorList

    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=7, min_new_tokens=7, do_sample=False, pad_token_id=0,
                             logits_processor=LogitsProcessorList([clock]))
    assert out.shape == (2, 27) and len(clock.times) == 7
    assert all(b > a for a, b in zip(clock.times, clock.times[1:]))
    timing = time_generate(model, 2, 20, 7)
    assert timing["steps"] == 6 and timing["tokens_per_s"] == 2 / (timing["step_ms"] / 1e3)
    assert timing["prefill_s"] > 0


def test_every_family_decodes_and_the_llama_has_the_entropy_invariant_decoders_parameters() -> None:
    rows = measure(list(DECODERS), [1], [12, 24], 4, TINY, log=lambda _: None)
    assert [(r["model"], r["context"]) for r in rows] == [(m, c) for m in DECODERS for c in (12, 24)]
    assert all(r["tokens_per_s"] > 0 and r["step_ms"] > 0 and r["steps"] == 3 for r in rows)
    parameters = {r["model"]: r["parameters"] for r in rows}
    assert parameters["llama"] == parameters["entropy_invariant"]
    # 2× GAU layers ≈ one attention + FFN
    assert abs(parameters["gau_flash"] / parameters["llama"] - 1) < 0.15


def test_the_table_gives_tokens_per_second_ratios_and_growth() -> None:
    rows = [{"model": m, "batch": b, "context": c, "parameters": 1_000_000, "prefill_s": 1.0,
             "step_ms": step, "steps": 31, "tokens_per_s": b / (step / 1e3)}
            for m, b, c, step in [("llama", 1, 512, 10.0), ("llama", 1, 4096, 20.0),
                                  ("gau_flash", 1, 512, 8.0), ("gau_flash", 1, 4096, 8.8)]]
    data = {"kind": "decoding", "command": "scripts/decoding_bench.py", "machine": "m", "versions": {},
            "date": "2026-11-25", "models": {"llama": "L", "gau_flash": "F"},
            "settings": {"batches": [1], "contexts": [512, 4096], "new_tokens": 32, "threads": 1},
            "rows": rows}
    text = decoding.table(data)
    assert "| `gau_flash`: F | 1.00M | 125 tok/s (1.25×), 8.0 ms | 114 tok/s (2.27×), 8.8 ms | 1.10× |" \
        in text
    assert "| `llama`: L | 1.00M | 100 tok/s, 10.0 ms | 50 tok/s, 20.0 ms | 2.00× |" in text


def test_a_static_caches_warm_up_generates_as_many_tokens_as_the_timed_run(monkeypatch) -> None:
    """Transformers sizes a static cache for the longest generation so far: a 4-token warm-up made the timed
    32-token run grow it and compile the model a second time, inside the stage's budget."""
    from hf_attn_variants.bench import decoding as decoding_module

    calls = []

    def fake(model, batch, context, new_tokens, **kwargs):
        calls.append((batch, context, new_tokens, kwargs.get("cache_implementation")))
        return {"prefill_s": 0.1, "step_ms": 1.0, "steps": new_tokens - 1, "tokens_per_s": 1e3}

    monkeypatch.setattr(decoding_module, "time_generate", fake)
    model = DECODERS["llama"][1](TINY, 64).eval()
    decoding_module.measure_model(model, "llama", [1], [12], 32, log=lambda _: None,
                                  cache_implementation="static")
    decoding_module.measure_model(model, "llama", [1], [12], 32, log=lambda _: None)
    assert calls == [(1, 12, 32, "static"), (1, 12, 32, "static"), (1, 12, 4, None), (1, 12, 32, None)]


def test_the_profile_counts_every_kernel_on_the_device_by_its_device() -> None:
    """cuDNN's attention kernels (``cudnn_generated_…``) were dropped by a filter on names starting "cu"."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from hf_attn_variants.bench.decoding import device_kernels

    def event(key: str, device: DeviceType, us: float) -> SimpleNamespace:
        return SimpleNamespace(key=key, device_type=device, self_device_time_total=us)

    events = [event("aten::mm", DeviceType.CPU, 0.0), event("cudaLaunchKernel", DeviceType.CPU, 0.0),
              event("cudnn_generated_fort_native_sdpa_sm90", DeviceType.CUDA, 12.0),
              event("cutlass_80_tensorop_bf16_gemm", DeviceType.CUDA, 30.0),
              event("triton_poi_fused_mul_0", DeviceType.CUDA, 2.0), event("idle", DeviceType.CUDA, 0.0)]
    assert [e.key for e in device_kernels(events)] == [
        "cudnn_generated_fort_native_sdpa_sm90", "cutlass_80_tensorop_bf16_gemm", "triton_poi_fused_mul_0"]
