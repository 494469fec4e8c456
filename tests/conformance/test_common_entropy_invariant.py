"""Transformers' common model tests (``ModelTesterMixin``) on every entropy-invariant class.

Three configurations run against all six classes: the default ``entropy_invariant`` scale (SDPA kernel,
RoPE, pre-norm) with the full upstream suite, and ``ssmax`` (a learnable per-head parameter that goes
through the init/save/load tests) with post-norm RMSNorm and learned absolute positions, which covers
the other code paths of the shared backbone. A third runs RoPE in layer 0 only (``no_rope_layers``) with
SSMax on the NoPE layer only (``attention_scale_layers="no_rope"``): one layer has the parameter, one none.
Its backbone is the default's, so it skips the upstream tests that never depend on the attention
component (``harness.ATTENTION_INDEPENDENT_TESTS``), as the Synthesizer's single components do. ``ssmax``
keeps them: its norms and positions are other code paths.
"""

from __future__ import annotations

from hf_attn_variants import FAMILIES, EntropyInvariantConfig

from .harness import attention_independent_skips, make_common_test_case

TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "base_length": 16,
    "entropy_min_length": 2,
}
ALL_CLASSES = tuple(FAMILIES["entropy_invariant"][1].values())

TestEntropyInvariantCommon = make_common_test_case(
    "TestEntropyInvariantCommon",
    config_class=EntropyInvariantConfig,
    config_kwargs={**TINY, "attention_scale": "entropy_invariant"},
    all_model_classes=ALL_CLASSES,
)

TestEntropyInvariantSSMaxCommon = make_common_test_case(
    "TestEntropyInvariantSSMaxCommon",
    config_class=EntropyInvariantConfig,
    config_kwargs={
        **TINY,
        "attention_scale": "ssmax",
        "norm_type": "rmsnorm",
        "norm_position": "post",
        "position_embedding_type": "absolute",
    },
    all_model_classes=ALL_CLASSES,
)

TestEntropyInvariantNoRopeLayersCommon = make_common_test_case(
    "TestEntropyInvariantNoRopeLayersCommon",
    config_class=EntropyInvariantConfig,
    config_kwargs={**TINY, "attention_scale": "ssmax", "no_rope_layers": [1, 0],
                   "attention_scale_layers": "no_rope"},
    all_model_classes=ALL_CLASSES,
    skip_tests=attention_independent_skips("TestEntropyInvariantCommon"),
)
