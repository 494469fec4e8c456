"""Transformers' common model tests (``ModelTesterMixin``) on every Synthesizer class.

Six configurations, each run against all six model classes: the default mixture (``random`` +
``vanilla``, trainable R) with the full upstream suite, and each single component. The ``random``
configuration uses a frozen R (``random_trainable=False``, the paper's Fixed Random), so the
persistent-buffer path goes through the save/load/init tests too.

To keep ``make test`` within its budget on 2 CPU cores, the single-component configurations skip
the upstream tests that never depend on the attention component (``harness.ATTENTION_INDEPENDENT_TESTS``);
they run once, for the default mixture.
"""

from __future__ import annotations

from hf_attn_variants import (
    SynthesizerConfig,
    SynthesizerForCausalLM,
    SynthesizerForMaskedLM,
    SynthesizerForQuestionAnswering,
    SynthesizerForSequenceClassification,
    SynthesizerForTokenClassification,
    SynthesizerModel,
)
from hf_attn_variants.models.configuration_synthesizer import SYNTHESIZER_COMPONENTS

from .harness import attention_independent_skips, make_common_test_case

TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 16,
    "factorized_random_rank": 4,
    "pad_token_id": 0,
}

ALL_CLASSES = (
    SynthesizerModel,
    SynthesizerForMaskedLM,
    SynthesizerForCausalLM,
    SynthesizerForSequenceClassification,
    SynthesizerForTokenClassification,
    SynthesizerForQuestionAnswering,
)

CONFIGS = {
    "default": {"synthesizer_components": ["random", "vanilla"]},
    **{name: {"synthesizer_components": [name]} for name in SYNTHESIZER_COMPONENTS},
}
CONFIGS["random"].update(random_trainable=False, random_init_std=1.0)

COMPONENT_INDEPENDENT_TESTS = attention_independent_skips("TestSynthesizer_default_Common")

FIXED_RANDOM_SKIPS = {
    "test_init_weights_can_init_buffers": (
        "upstream assumes buffers are deterministic; the Fixed Random R is a random draw by design (its "
        "exact save/reload and no re-draw on load are tested in tests/test_synthesizer.py)"
    ),
    "test_retain_grad_hidden_states_attentions": (
        "with a frozen R as the only component the attention weights are a constant: no gradient can "
        "reach them"
    ),
}

for _variant, _overrides in CONFIGS.items():
    _name = f"TestSynthesizer_{_variant}_Common"
    globals()[_name] = make_common_test_case(
        _name,
        config_class=SynthesizerConfig,
        config_kwargs={**TINY, **_overrides},
        all_model_classes=ALL_CLASSES,
        skip_tests=(
            None
            if _variant == "default"
            else {**COMPONENT_INDEPENDENT_TESTS, **(FIXED_RANDOM_SKIPS if _variant == "random" else {})}
        ),
    )
del _variant, _overrides, _name
