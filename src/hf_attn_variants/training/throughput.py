"""Training throughput: tokens per second, and model FLOPs utilisation where the device's peak is known.

- tokens/s: the tokens of every data-parallel rank's micro-batches (``batch × block``) trained in a logging
  window, over the window's wall-clock time (evaluation and checkpoint time excluded).
- model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B): 6·N for the weight matrices (forward and
  backward; N = the parameters outside the input embeddings, the LM head's matrix counted also when it is tied
  to them: its product runs every step either way) plus 12·L·d·n for attention scores and values over a
  block of n tokens (L layers of width d). Our families' attention costs are of the same order (GAU: one head
  of width s = 128 over e = 2d values; FLASH's chunked form less), so the figure is the standard-attention
  one.
- MFU = tokens/s × FLOPs per token / (peak FLOP/s × devices). Peaks: the dense bf16/fp16 tensor-core figures
  of NVIDIA's data sheets (``PEAK_FLOPS``), for runs under ``--mixed_precision bf16``/``fp16`` on such a GPU.
  Anywhere else (CPU, fp32, another GPU) there is no peak to divide by and ``mfu`` is absent.
"""

from __future__ import annotations

from typing import Any

import torch

PEAK_FLOPS = {
    "H200": 989.4e12,
    "H100 SXM": 989.4e12,
    "H100 NVL": 835.6e12,
    "H100 PCIe": 756.0e12,
    "H100": 989.4e12,
    "A100": 312.0e12,
}
"""Dense bf16/fp16 tensor-core peak FLOP/s per GPU by name (first match in this order; NVIDIA data sheets)."""


def model_flops_per_token(model: torch.nn.Module, config: Any, block_size: int) -> float:
    """6·N + 12·L·d·n (PaLM's appendix B): N the parameters outside the input embeddings plus a head tied to
    them (a tied and an untied head cost the same), L layers, d the hidden size, n the block length."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    embedding_ids = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    parameters = sum(p.numel() for p in model.parameters() if id(p) not in embedding_ids)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and id(head.weight) in embedding_ids:
        parameters += head.weight.numel()
    return 6.0 * parameters + 12.0 * config.num_hidden_layers * config.hidden_size * block_size


def device_peak_flops(device: torch.device, mixed_precision: str) -> float | None:
    """The dense bf16/fp16 peak of ``device`` (``PEAK_FLOPS``) under ``mixed_precision`` bf16/fp16, else
    ``None``."""
    if device.type != "cuda" or mixed_precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float | None,
        devices: int) -> float | None:
    """Model FLOPs utilisation tokens/s × FLOPs per token / (peak × devices), or ``None`` without a peak."""
    if peak_flops is None:
        return None
    return tokens_per_second * flops_per_token / (peak_flops * devices)


__all__ = ["PEAK_FLOPS", "device_peak_flops", "mfu", "model_flops_per_token"]
