"""Self-check of the conformance harness: upstream's common tests must pass on stock models.

If the harness is right, tiny stock BERT (encoder) and Llama (decoder) models pass
``ModelTesterMixin`` with zero failures; every skip below is justified in its reason string.
A third case re-runs BERT under renamed subclasses with an unregistered ``model_type``, which is
the situation of a custom family: it checks the task/Auto registration done by the harness.
"""

from __future__ import annotations

import unittest

from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaModel,
)

from .harness import CommonModelTest, ModelTester, infer_task, make_common_test_case, upstream_load_error

BERT_TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 16,
    "initializer_range": 0.02,
}

LLAMA_TINY = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 37,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "initializer_range": 0.02,
    "pad_token_id": 0,
}

TestBertHarnessSelfCheck = make_common_test_case(
    "TestBertHarnessSelfCheck",
    config_class=BertConfig,
    config_kwargs=BERT_TINY,
    all_model_classes=(
        BertModel,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertForQuestionAnswering,
    ),
    model_tester_kwargs={"use_token_type_ids": True},
)

TestLlamaHarnessSelfCheck = make_common_test_case(
    "TestLlamaHarnessSelfCheck",
    config_class=LlamaConfig,
    config_kwargs=LLAMA_TINY,
    # LlamaForSequenceClassification is left out to save time: sequence classification is exercised by
    # the BERT cases, and the decoder path by these two classes.
    all_model_classes=(LlamaModel, LlamaForCausalLM),
)


# --- a "custom" family: stock BERT code under new names and an unregistered model_type -------------


class SelfCheckBertConfig(BertConfig):
    """BertConfig under a model_type unknown to transformers."""

    model_type = "hfav_selfcheck_bert"


class SelfCheckBertModel(BertModel):
    config_class = SelfCheckBertConfig


class SelfCheckBertForMaskedLM(BertForMaskedLM):
    config_class = SelfCheckBertConfig


class SelfCheckBertForSequenceClassification(BertForSequenceClassification):
    config_class = SelfCheckBertConfig


TestRenamedBertHarnessSelfCheck = make_common_test_case(
    "TestRenamedBertHarnessSelfCheck",
    config_class=SelfCheckBertConfig,
    config_kwargs=BERT_TINY,
    all_model_classes=(SelfCheckBertModel, SelfCheckBertForMaskedLM, SelfCheckBertForSequenceClassification),
    model_tester_kwargs={"use_token_type_ids": True},
    skip_tests={
        name: "registration-independent and identical to TestBertHarnessSelfCheck (same code); saves time"
        for name in (
            "test_eager_matches_sdpa_inference",
            "test_model_outputs_equivalence",
            "test_bc_torch_dtype",
        )
    },
)


class TestHarnessMechanics(unittest.TestCase):
    """Unit checks of the harness itself (no model runs)."""

    def setUp(self) -> None:
        error = upstream_load_error()
        if error is not None:
            self.fail(f"upstream tests unavailable: {error}")

    def test_infer_task(self) -> None:
        self.assertEqual(infer_task(BertModel), "base")
        self.assertEqual(infer_task(BertForMaskedLM), "masked-lm")
        self.assertEqual(infer_task(LlamaForCausalLM), "causal-lm")
        self.assertEqual(infer_task(LlamaForSequenceClassification), "sequence-classification")
        self.assertIsNone(infer_task(ModelTester))

    def test_renamed_classes_registered(self) -> None:
        from transformers import AutoModel, AutoModelForMaskedLM

        from .harness import _COMMON

        assert _COMMON is not None
        self.assertIn("SelfCheckBertModel", _COMMON.get_values(_COMMON.MODEL_MAPPING_NAMES))
        self.assertIn(
            "SelfCheckBertForMaskedLM", _COMMON.get_values(_COMMON.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
        )
        self.assertIs(AutoModel._model_mapping[SelfCheckBertConfig], SelfCheckBertModel)
        self.assertIs(AutoModelForMaskedLM._model_mapping[SelfCheckBertConfig], SelfCheckBertForMaskedLM)
        # transformers' own tables are untouched
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        self.assertNotIn("hfav_selfcheck_bert", MODEL_MAPPING_NAMES)

    def test_skip_declarations(self) -> None:
        case = make_common_test_case(
            "_SkipProbe",
            config_class=BertConfig,
            config_kwargs=BERT_TINY,
            all_model_classes=(BertModel,),
            skip_tests={"test_eager_matches_sdpa_inference": "probe", "test_training": "probe"},
        )

        def skip_reason(test_name: str) -> str | None:
            method = getattr(case, test_name)
            return method.__unittest_skip_why__ if getattr(method, "__unittest_skip__", False) else None

        self.assertEqual(skip_reason("test_training"), "probe")
        # every parameterized expansion is skipped; a test that merely shares the prefix is not
        self.assertEqual(
            skip_reason("test_eager_matches_sdpa_inference_08_fp32_pad_left_sdpa_kernels"), "probe"
        )
        self.assertIsNone(skip_reason("test_training_gradient_checkpointing"))
        self.assertIsNone(skip_reason("test_save_load"))
        with self.assertRaisesRegex(ValueError, "matches no test"):
            make_common_test_case(
                "_BadSkip",
                config_class=BertConfig,
                config_kwargs=BERT_TINY,
                all_model_classes=(BertModel,),
                skip_tests={"test_does_not_exist": "typo"},
            )
        with self.assertRaisesRegex(ValueError, "one-line reason"):
            make_common_test_case(
                "_EmptyReason",
                config_class=BertConfig,
                config_kwargs=BERT_TINY,
                all_model_classes=(BertModel,),
                skip_tests={"test_training": ""},
            )

    def test_unknown_suffix_needs_declaration(self) -> None:
        class SelfCheckBertEncoderOnly(BertModel):  # name ends neither in Model nor in a task suffix
            config_class = SelfCheckBertConfig

        SelfCheckBertEncoderOnly.__name__ = "SelfCheckBertEncoderThing"
        with self.assertRaisesRegex(ValueError, "cannot infer the task"):
            type(
                "_NoTask",
                (CommonModelTest, unittest.TestCase),
                {
                    "config_class": SelfCheckBertConfig,
                    "config_kwargs": BERT_TINY,
                    "all_model_classes": (SelfCheckBertEncoderOnly,),
                },
            )
