"""Every Synthesizer class loads through its Auto class in an environment without this package."""

from __future__ import annotations

import torch

from hf_attn_variants import FAMILIES
from tests.remote_code import assert_remote_code_matches, class_case
from tests.test_synthesizer import tiny_config
from tests.utils import left_padded, random_ids

# One configuration per class, so that every component (and the frozen-buffer path) crosses the export.
VARIANTS = (
    {"synthesizer_components": ["random", "vanilla"]},
    {"synthesizer_components": ["dense"]},
    {"synthesizer_components": ["factorized_dense", "vanilla"], "factorized_dense_shape": [2, 8]},
    {"synthesizer_components": ["factorized_random"], "random_trainable": False},
    {"synthesizer_components": ["random"], "random_trainable": False, "pruned_heads": {0: [1, 2]}},
    {"synthesizer_components": ["dense", "random", "factorized_dense", "factorized_random", "vanilla"]},
)


def test_all_classes_load_with_trust_remote_code_in_a_clean_environment(tmp_path) -> None:
    _, classes = FAMILIES["synthesizer"]
    # Left padding exercises the position shift of the synthesized patterns in the exported code too.
    ids, mask = left_padded(random_ids(2, 10), [10, 6])
    cases = []
    for index, ((suffix, model_class), variant) in enumerate(zip(classes.items(), VARIANTS, strict=True)):
        torch.manual_seed(index)
        model = model_class(tiny_config(num_labels=3, **variant))
        cases.append(class_case(suffix, model, {"input_ids": ids, "attention_mask": mask}))
    assert_remote_code_matches(cases, tmp_path)
