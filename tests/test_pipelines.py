"""transformers pipelines load every family from a saved folder with trust_remote_code=True."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    pipeline,
)

from hf_attn_variants import FAMILIES
from hf_attn_variants.training import build_config, embedded_tokenizer
from hf_attn_variants.training.corpus import causal_tokenizer
from tests.test_pretrain import tiny_overrides

HEADS = {
    "fill-mask": AutoModelForMaskedLM,
    "text-generation": AutoModelForCausalLM,
    "text-classification": AutoModelForSequenceClassification,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[tuple[str, str], str]:
    """One saved folder (model + tokenizer + remote code) per (family, pipeline task)."""
    tokenizer = embedded_tokenizer()
    out = {}
    for family in FAMILIES:
        config = build_config(family, config_overrides=tiny_overrides(family), tokenizer=tokenizer,
                              max_seq_length=16)
        config.id2label, config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
        for task, auto_class in HEADS.items():
            torch.manual_seed(0)
            model = auto_class.from_config(config)
            folder = tmp_path_factory.mktemp(f"{family}-{task}")
            model.save_pretrained(folder)
            (causal_tokenizer(tokenizer) if task == "text-generation" else tokenizer).save_pretrained(folder)
            out[family, task] = str(folder)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fill_mask_pipeline(folders, family: str) -> None:
    fill = pipeline("fill-mask", model=folders[family, "fill-mask"], trust_remote_code=True, device="cpu")
    predictions = fill("the [MASK] statement raises an exception.", top_k=3)
    assert len(predictions) == 3
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    assert all("[MASK]" not in p["sequence"] for p in predictions)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_text_generation_pipeline(folders, family: str) -> None:
    generate = pipeline("text-generation", model=folders[family, "text-generation"], trust_remote_code=True,
                        device="cpu")
    prompt = "the assert statement"
    # the prompt stays open
    assert generate.tokenizer(prompt)["input_ids"][-1] != generate.tokenizer.eos_token_id
    out = generate(prompt, max_new_tokens=5, do_sample=False, return_full_text=False)
    assert isinstance(out[0]["generated_text"], str)
    again = generate(prompt, max_new_tokens=5, do_sample=False, return_full_text=False)
    assert again == out  # greedy decoding is deterministic


@pytest.mark.parametrize("family", list(FAMILIES))
def test_text_classification_pipeline(folders, family: str) -> None:
    classify = pipeline("text-classification", model=folders[family, "text-classification"],
                        trust_remote_code=True, device="cpu")
    out = classify(["a good value", "the function returns nothing"])
    assert [row["label"] in ("neg", "pos") for row in out] == [True, True]
    assert all(0.0 <= row["score"] <= 1.0 for row in out)
