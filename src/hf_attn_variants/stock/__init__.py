"""Entropy-invariant (log-n) attention for *stock* Transformers models and for vLLM serving them.

``stock_attention`` registers the ``entropy_invariant`` attention function with Transformers'
``AttentionInterface``; ``vllm_plugin`` is the ``vllm.general_plugins`` entry point that does the same
inside a vLLM process. Neither is model code of this package's families (that lives in ``models/``).
"""
