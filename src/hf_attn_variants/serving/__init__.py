"""This package inside vLLM: its ``vllm.general_plugins`` entry point (``vllm_plugin.register``) and GAU as a
native vLLM model (``vllm_gau``). Only vLLM imports these modules; the rest of the package never does."""
