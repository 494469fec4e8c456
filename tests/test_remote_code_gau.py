"""Every GAU class loads through its Auto class in an environment without this package.

The six classes are spread over the normalisations and both FLASH directions, so the exported code
path of each (quadratic kernels, chunked kernel, chunk cache) runs in the clean environment.
"""

from __future__ import annotations

import torch

from hf_attn_variants import FAMILIES
from tests.remote_code import assert_remote_code_matches, class_case
from tests.test_gau import sharpen, tiny_config
from tests.utils import random_ids, right_padded

VARIANT_FOR_SUFFIX = {
    "Model": {"attention_normalization": "softmax_plus"},
    "ForMaskedLM": {"attention_normalization": "relu2", "relu2_length": "fixed"},
    "ForCausalLM": {"attention_normalization": "relu2", "chunk_size": 4},
    "ForSequenceClassification": {"attention_normalization": "relu2_normalized"},
    "ForTokenClassification": {
        "attention_normalization": "softmax",
        "norm_type": "rmsnorm",
        "norm_position": "post",
    },
    "ForQuestionAnswering": {"attention_normalization": "relu2", "chunk_size": 3},
}


def test_all_classes_load_with_trust_remote_code_in_a_clean_environment(tmp_path) -> None:
    _, classes = FAMILIES["gau"]
    assert set(classes) == set(VARIANT_FOR_SUFFIX)
    ids, mask = right_padded(random_ids(2, 10), [10, 6])
    cases = []
    for index, (suffix, model_class) in enumerate(classes.items()):
        torch.manual_seed(index)
        model = sharpen(model_class(tiny_config(num_labels=3, **VARIANT_FOR_SUFFIX[suffix])), seed=index)
        cases.append(class_case(suffix, model, {"input_ids": ids, "attention_mask": mask}))
    assert_remote_code_matches(cases, tmp_path)
