"""Inputs every family's forward meets from a tokenizer, a pipeline or a typo: left padding under the
sequence classifier, ``token_type_ids`` of a sentence pair, masks, positions and embeddings of the wrong
shape, and config values that would give NaN or an oversized model."""

from __future__ import annotations

import logging

import pytest
import torch

from hf_attn_variants import (
    EntropyInvariantConfig,
    EntropyInvariantForSequenceClassification,
    EntropyInvariantModel,
    GAUConfig,
    GAUForSequenceClassification,
    GAUModel,
    SynthesizerConfig,
    SynthesizerForSequenceClassification,
    SynthesizerModel,
)

from .utils import left_padded, random_ids, right_padded

SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, max_position_embeddings=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
FAMILIES = {
    "gau": (GAUConfig, dict(attention_key_size=16), GAUModel, GAUForSequenceClassification),
    "flash": (GAUConfig, dict(attention_key_size=16, attention_normalization="relu2", chunk_size=8), GAUModel,
              GAUForSequenceClassification),
    "synthesizer": (SynthesizerConfig, dict(num_attention_heads=4, intermediate_size=64), SynthesizerModel,
                    SynthesizerForSequenceClassification),
    "entropy_invariant": (EntropyInvariantConfig, dict(num_attention_heads=4, intermediate_size=64),
                          EntropyInvariantModel, EntropyInvariantForSequenceClassification),
}


def build(family: str, head: bool = False, **overrides):
    config_class, fields, model_class, head_class = FAMILIES[family]
    torch.manual_seed(0)
    config = config_class(**{**SIZES, **fields, **overrides}, num_labels=3)
    return (head_class if head else model_class)(config).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_classifier_pools_each_rows_first_token_after_left_padding(family: str) -> None:
    """The pooled token is the row's first real one: left- and right-padded batches classify each text as it
    is classified alone (before, left padding pooled a [PAD] query, 0.01–0.025 away)."""
    model = build(family, head=True)
    ids = random_ids(2, 12, vocab=100).clamp(min=1)
    lengths = [12, 7]
    for padded in (left_padded, right_padded):
        batch, mask = padded(ids, lengths)
        with torch.no_grad():
            logits = model(batch, attention_mask=mask).logits
            alone = torch.cat([model(row[keep.bool()][None]).logits for row, keep in zip(batch, mask)])
        torch.testing.assert_close(logits, alone, atol=1e-5, rtol=1e-5, msg=padded.__name__)


@pytest.mark.parametrize("family", FAMILIES)
def test_token_type_ids_of_a_second_segment_are_ignored_with_a_warning(family: str, monkeypatch) -> None:
    """No segment embeddings: a pair's second segment is read as the first, as in training (a Trainer drops
    the column), so its output is that of no token types, and the model says so once; all-zero token types
    (sentence-transformers passes them) say nothing."""
    from hf_attn_variants.models import modeling_common

    warned: list[str] = []
    monkeypatch.setattr(modeling_common.logger, "warning_once", warned.append)
    model = build(family)
    ids = random_ids(2, 10, vocab=100)
    plain = model(ids).last_hidden_state
    torch.testing.assert_close(model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state, plain,
                               atol=0, rtol=0)
    assert not warned
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    torch.testing.assert_close(model(ids, token_type_ids=types).last_hidden_state, plain, atol=0, rtol=0)
    assert len(warned) == 1 and warned[0].startswith("token_type_ids are ignored"), warned


@pytest.mark.parametrize("family", FAMILIES)
def test_masks_positions_and_embeddings_of_the_wrong_shape_are_named(family: str) -> None:
    model = build(family)
    ids = random_ids(2, 10, vocab=100)
    with pytest.raises(ValueError, match="attention_mask has 3 rows but the batch has 2"):
        model(ids, attention_mask=torch.ones(3, 10, dtype=torch.long))
    with pytest.raises(ValueError, match=r"position_ids must be \[2, 10\] or \[1, 10\]"):
        model(ids, position_ids=torch.arange(9)[None])
    with pytest.raises(ValueError, match=r"position_ids must be \[2, 10\] or \[1, 10\]"):
        model(ids, position_ids=torch.arange(10).repeat(3, 1))
    with pytest.raises(ValueError, match="inputs_embeds must be floating point"):
        model(inputs_embeds=torch.randn(2, 10, 31))
    with pytest.raises(ValueError, match="input_ids must be integer token ids"):
        model(ids.float())


@pytest.mark.parametrize("family", FAMILIES)
def test_one_mask_row_serves_the_whole_batch(family: str) -> None:
    """A ``[1, T]`` mask is broadcast over the batch in every family (FLASH refused it, naming
    ``key_mask``)."""
    model = build(family)
    ids = random_ids(2, 10, vocab=100)
    mask = torch.ones(1, 10, dtype=torch.long)
    mask[:, 8:] = 0
    expected = model(ids, attention_mask=mask.expand(2, -1)).last_hidden_state
    torch.testing.assert_close(model(ids, attention_mask=mask).last_hidden_state, expected, atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_norm_eps_zero_is_refused(family: str) -> None:
    """ε = 0 normalised the zero padding embedding to 0/0 and spread NaN to the real tokens."""
    config_class, fields = FAMILIES[family][:2]
    with pytest.raises(ValueError, match="layer_norm_eps must be > 0"):
        config_class(**{**SIZES, **fields}, layer_norm_eps=0.0)


@pytest.mark.parametrize("config_class", [EntropyInvariantConfig, SynthesizerConfig])
def test_an_odd_head_size_under_rope_is_refused_by_the_config(config_class: type) -> None:
    """RoPE rotates pairs: an odd head_dim raised only when the model was built (lengthgen left a run.json
    behind the traceback); without RoPE it is fine."""
    with pytest.raises(ValueError, match="head_dim must be even with position_embedding_type='rope', got 15"):
        config_class(hidden_size=30, num_attention_heads=2)
    assert config_class(hidden_size=30, num_attention_heads=2, position_embedding_type="none").head_dim == 15


def test_synthesizer_warns_when_its_random_patterns_are_huge(caplog) -> None:
    """l copied from a Llama config (32,768) makes the random component H·l² a layer: the config says so
    and names the factorised component; a factorised-only config does not warn."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            SynthesizerConfig(**{**SIZES, "max_position_embeddings": 32768}, num_attention_heads=4,
                              intermediate_size=64)
            assert "the random component stores H·l²" in caplog.text
            caplog.clear()
            SynthesizerConfig(**{**SIZES, "max_position_embeddings": 32768}, num_attention_heads=4,
                              intermediate_size=64, synthesizer_components=["factorized_random", "vanilla"])
            assert "random component" not in caplog.text
    finally:
        hf_logging.disable_propagation()
