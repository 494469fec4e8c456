"""Transformers' common model tests (``ModelTesterMixin``) on every Synthesizer class.

Six configurations, each run against all six model classes: the default mixture (``random`` +
``vanilla``, trainable R) with the full upstream suite, and each single component. The ``random``
configuration uses a frozen R (``random_trainable=False``, the paper's Fixed Random), so the
persistent-buffer path goes through the save/load/init tests too.

To keep ``make test`` within its budget on 2 CPU cores, the single-component configurations skip
the upstream tests that never depend on the attention component (embeddings, heads and losses,
tied weights, output containers, dtype keyword handling, torch.utils.checkpoint modes); they run
once, for the default mixture. Every test that runs a forward/backward pass through attention,
saves/loads/initialises its tensors or inspects attentions stays on for every component.
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

from .harness import make_common_test_case

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

_SAME_FOR_EVERY_COMPONENT = (
    "independent of the attention component; runs for the default mixture (TestSynthesizer_default_Common)"
)
COMPONENT_INDEPENDENT_TESTS = {
    name: _SAME_FOR_EVERY_COMPONENT
    for name in (
        "test_bc_torch_dtype",  # torch_dtype= vs dtype= keyword handling of from_pretrained
        "test_resize_tokens_embeddings",  # embed_tokens / lm_head
        "test_resize_embeddings_untied",
        "test_resize_embeddings_untied_no_reinit_on_post_init",
        "test_model_get_set_embeddings",
        "test_inputs_embeds",
        "test_inputs_embeds_matches_input_ids",
        "test_enable_input_require_grads_with_gradient_checkpointing",  # embedding hook
        # torch.utils.checkpoint modes; test_training_gradient_checkpointing stays on
        "test_training_gradient_checkpointing_use_reentrant_true",
        "test_training_gradient_checkpointing_use_reentrant_false",
        "test_problem_types",  # classification losses
        "test_causal_lm_loss_honors_shift_labels",
        "test_feed_forward_chunking",  # FeedForward block
        "test_model_outputs_equivalence",  # tuple vs ModelOutput containers
        "test_capture_outputs_decorator",  # output recording (test_attention_outputs stays on)
        "test_can_capture_specific_layers_hidden_states",
        "test_load_save_without_tied_weights",  # tied lm_head
        "test_model_weights_reload_no_missing_tied_weights",
        "test_tied_weights_keys",
        "test_base_model_prefix_loads_base_weights",  # head ↔ base-model prefix mapping
        "test_load_with_mismatched_shapes",  # classifier shapes
        "test_can_load_ignoring_mismatched_shapes",
    )
}

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
