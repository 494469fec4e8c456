"""The ``vllm.general_plugins`` entry point of this package (``hf_attn_variants``), which vLLM loads in every
process at start-up when this package is installed in its environment.

It does two things (docs/serving.md):

- log-n scaling for stock models served through vLLM's Transformers backend (``stock.vllm_plugin``);
- GAU's causal LM architecture (``GAUForCausalLM``, what our causal GAU folders declare) in vLLM's
  ``ModelRegistry``, as the native model ``vllm_gau.GAUVllmForCausalLM``: FLASH and softmax GAU then serve
  with ``vllm serve FOLDER``, without ``--model-impl transformers``. The class is named by its import path, so
  vLLM imports it only where a GAU folder is served.
"""

from __future__ import annotations

from ..stock.vllm_plugin import register as register_log_n

GAU_ARCHITECTURE = "GAUForCausalLM"
GAU_MODEL = "hf_attn_variants.serving.vllm_gau:GAUVllmForCausalLM"


def register() -> None:
    """Register both (vLLM may call this more than once)."""
    from vllm import ModelRegistry

    register_log_n()
    if GAU_ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(GAU_ARCHITECTURE, GAU_MODEL)


__all__ = ["GAU_ARCHITECTURE", "GAU_MODEL", "register"]
