"""Transformers' own common model tests (``ModelTesterMixin``) on all six GAU classes.

Three configurations: quadratic GAU with ``softmax_plus`` (GAU-α) and with ``relu2``, and FLASH
mixed-chunk attention (``chunk_size=3`` on 7-token inputs, so several chunks and a partial one).
Every skip below carries its reason.
"""

from __future__ import annotations

from hf_attn_variants import (
    GAUConfig,
    GAUForCausalLM,
    GAUForMaskedLM,
    GAUForQuestionAnswering,
    GAUForSequenceClassification,
    GAUForTokenClassification,
    GAUModel,
)

from .harness import make_common_test_case

TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "expansion_factor": 2,
    "attention_key_size": 16,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 64,
    "base_length": 8,
    "entropy_min_length": 2,
    "pad_token_id": 0,
}

VARIANTS = {
    "SoftmaxPlus": {"attention_normalization": "softmax_plus"},
    "Relu2": {"attention_normalization": "relu2", "relu2_length": "fixed"},
    "Chunked": {"attention_normalization": "relu2", "chunk_size": 3},
}

ALL_CLASSES = (
    GAUModel,
    GAUForMaskedLM,
    GAUForCausalLM,
    GAUForSequenceClassification,
    GAUForTokenClassification,
    GAUForQuestionAnswering,
)

# These upstream tests exercise plumbing that is the same for every attention_normalization and
# chunk_size (output containers, embedding resizing, dtype loading, task losses, hooks). They run for
# all six classes in TestGAUSoftmaxPlusCommon; repeating them per variant would only add minutes on
# the 2-core CI machine. Every test that runs attention (outputs, attentions, batching/padding,
# determinism, training, gradient checkpointing, save/load, init) runs in all three variants.
_SAME_IN_EVERY_VARIANT = (
    "independent of the attention variant ({}); runs for all six classes in TestGAUSoftmaxPlusCommon"
)
VARIANT_INDEPENDENT_SKIPS = {
    "test_model_outputs_equivalence": _SAME_IN_EVERY_VARIANT.format("tuple vs ModelOutput plumbing"),
    "test_enable_input_require_grads_with_gradient_checkpointing": _SAME_IN_EVERY_VARIANT.format(
        "embedding hooks"
    ),
    "test_resize_tokens_embeddings": _SAME_IN_EVERY_VARIANT.format("embedding resizing"),
    "test_resize_embeddings_untied": _SAME_IN_EVERY_VARIANT.format("embedding resizing"),
    "test_resize_embeddings_untied_no_reinit_on_post_init": _SAME_IN_EVERY_VARIANT.format(
        "embedding resizing"
    ),
    "test_bc_torch_dtype": _SAME_IN_EVERY_VARIANT.format("dtype argument of from_pretrained"),
    "test_problem_types": _SAME_IN_EVERY_VARIANT.format("classification losses of the heads"),
    "test_feed_forward_chunking": _SAME_IN_EVERY_VARIANT.format("chunk_size_feed_forward, unused by GAU"),
    "test_can_capture_specific_layers_hidden_states": _SAME_IN_EVERY_VARIANT.format(
        "hidden-state capture hooks"
    ),
}

for _variant, _overrides in VARIANTS.items():
    _name = f"TestGAU{_variant}Common"
    globals()[_name] = make_common_test_case(
        _name,
        config_class=GAUConfig,
        config_kwargs={**TINY, **_overrides},
        all_model_classes=ALL_CLASSES,
        # GAU has one attention unit per layer: attention maps are (batch, 1, q, k).
        model_tester_kwargs={"attrs": {"num_attention_heads": 1}},
        config_tester_kwargs={"common_properties": ["hidden_size", "num_hidden_layers", "vocab_size"]},
        skip_tests={} if _variant == "SoftmaxPlus" else VARIANT_INDEPENDENT_SKIPS,
    )
