"""Every entropy-invariant class loads through its Auto class in an environment without this package."""

from __future__ import annotations

import torch

from hf_attn_variants import FAMILIES
from tests.remote_code import assert_remote_code_matches, class_case
from tests.test_entropy_invariant import tiny_config
from tests.utils import random_ids, right_padded


def test_all_classes_load_with_trust_remote_code_in_a_clean_environment(tmp_path) -> None:
    _, classes = FAMILIES["entropy_invariant"]
    ids, mask = right_padded(random_ids(2, 10), [10, 6])
    cases = []
    for index, (suffix, model_class) in enumerate(classes.items()):
        torch.manual_seed(index)
        scale = ("standard", "entropy_invariant", "ssmax")[index % 3]
        layers = {"no_rope_layers": [1, 0], "attention_scale_layers": "no_rope"} if index % 2 else {}
        model = model_class(tiny_config(attention_scale=scale, num_labels=3, **layers))
        cases.append(class_case(suffix, model, {"input_ids": ids, "attention_mask": mask}))
    assert_remote_code_matches(cases, tmp_path)
