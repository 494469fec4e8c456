"""Training-free log-n attention scaling for stock models served by vLLM (a ``vllm.general_plugins`` plugin).

vLLM runs a Transformers model through its own attention (``attn_implementation="vllm"``), so the
``"entropy_invariant"`` implementation of ``stock_attention`` — like Qwen's ``use_logn_attn`` before it — has
no effect there. With this package installed in vLLM's environment, vLLM runs ``register`` at start-up
(through the package's entry point, ``serving.vllm_plugin.register``), and every model served through the
Transformers backend (``model_impl="transformers"``) whose config names ``entropy_invariant_formula`` gets
the same per-row factor as ``stock_attention`` on its queries before vLLM's paged kernel runs:

    factor(nᵢ) = max(1, log nᵢ / log base_length)   (``entropy_invariant_scope="beyond"``, the default)

with nᵢ = position + 1 of each packed token (vLLM passes positions, never a mask), or Llama 4's temperature
(``entropy_invariant_formula="llama4"``). Other models are untouched. To mark a checkpoint::

    config.entropy_invariant_formula = "log_ratio"; config.base_length = 4096; config.save_pretrained(path)

Models vLLM implements natively ignore it: pass ``model_impl="transformers"`` (``--model-impl transformers``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..models.layers import upcast
from .stock_attention import stock_logit_factor

VLLM_ATTENTION = "vllm"


def scales_log_n(module: nn.Module) -> bool:
    """Whether the attention ``module`` belongs to a model whose config asks for log-n scaling."""
    return bool(getattr(getattr(module, "config", None), "entropy_invariant_formula", None))


def log_n_attention(original: Any) -> Any:
    """Wrap vLLM's attention function ``original``: multiply q row-wise by ``stock_logit_factor`` (causal
    rows, nᵢ from ``position_ids``) for the models ``scales_log_n`` selects, then call ``original``."""

    def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        if scales_log_n(module):
            factor = stock_logit_factor(module.config, query, key, None, kwargs.get("position_ids"),
                                        causal=True, count_from_positions=True)
            query = (upcast(query) * factor[:, None, :, None]).to(query.dtype)
        return original(module, query, key, value, attention_mask, **kwargs)

    attention.log_n_wraps = original
    return attention


def register() -> None:
    """vLLM plugin entry point: wrap the ``"vllm"`` attention function once (vLLM may call this
    repeatedly)."""
    import vllm.model_executor.models.transformers  # noqa: F401 (registers the "vllm" attention function)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    current = ALL_ATTENTION_FUNCTIONS[VLLM_ATTENTION]
    if getattr(current, "log_n_wraps", None) is None:
        ALL_ATTENTION_FUNCTIONS.register(VLLM_ATTENTION, log_n_attention(current))


__all__ = ["log_n_attention", "register", "scales_log_n"]
