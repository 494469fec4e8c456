"""Config behaviour shared by the three families: the renamed nᵢ clamp, equality, the version floor."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from hf_attn_variants import EntropyInvariantConfig, GAUConfig, SynthesizerConfig
from hf_attn_variants.models.compat import MIN_TRANSFORMERS_VERSION, require_transformers, version_tuple
from tests.remote_code import TRANSFORMERS_RELEASES

TINY = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2}
HEADS = {"num_attention_heads": 4, "intermediate_size": 37}
CONFIGS = {
    EntropyInvariantConfig: {**TINY, **HEADS},
    GAUConfig: {**TINY, "attention_key_size": 16},
    SynthesizerConfig: {**TINY, **HEADS, "max_position_embeddings": 16},
}


@pytest.mark.parametrize("config_class", [EntropyInvariantConfig, GAUConfig])
def test_a_config_saved_with_the_former_min_length_name_loads(tmp_path, config_class) -> None:
    config = config_class(**CONFIGS[config_class], entropy_min_length=7)
    data = config.to_dict()
    data["min_length"] = data.pop("entropy_min_length")
    (tmp_path / "config.json").write_text(json.dumps(data))
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert type(reloaded) is config_class and reloaded.entropy_min_length == 7
    assert "min_length" not in reloaded.to_dict()


@pytest.mark.parametrize("config_class", [EntropyInvariantConfig, GAUConfig])
def test_both_names_of_the_clamp_at_once_is_an_error(config_class) -> None:
    with pytest.raises(ValueError, match="min_length is the former name of entropy_min_length"):
        config_class(**CONFIGS[config_class], min_length=3, entropy_min_length=4)
    assert config_class(**CONFIGS[config_class]).entropy_min_length == 16
    assert SynthesizerConfig(**CONFIGS[SynthesizerConfig]).synthesizer_components == ["random", "vanilla"]


@pytest.mark.parametrize("config_class", list(CONFIGS))
def test_configs_compare_by_every_field(config_class) -> None:
    # Transformers >= 5.5 makes config subclasses dataclasses whose generated __eq__ would only compare the
    # base class's fields; two configs of different widths must not be equal.
    kwargs = CONFIGS[config_class]
    assert config_class(**kwargs) == config_class(**kwargs)
    assert config_class(**kwargs) != config_class(**{**kwargs, "hidden_size": 64})


@pytest.mark.parametrize("config_class", list(CONFIGS))
def test_config_json_states_the_minimum_transformers_version(tmp_path, config_class) -> None:
    config_class(**CONFIGS[config_class]).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["min_transformers_version"] == MIN_TRANSFORMERS_VERSION
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert reloaded.min_transformers_version == MIN_TRANSFORMERS_VERSION


def test_the_oldest_tested_release_is_the_declared_minimum() -> None:
    assert TRANSFORMERS_RELEASES[0] == MIN_TRANSFORMERS_VERSION
    assert list(TRANSFORMERS_RELEASES) == sorted(TRANSFORMERS_RELEASES, key=version_tuple)


def test_a_too_old_transformers_gets_one_sentence_naming_the_version() -> None:
    with pytest.raises(ImportError,
                       match=r"needs transformers>=5\.0\.0, but transformers 4\.57\.1 is installed"):
        require_transformers("4.57.1")
    require_transformers("5.0.0")
    require_transformers("5.23.0.dev0")
    assert version_tuple("5.10.4") > version_tuple("5.9.0") and version_tuple("5.1.0rc1") == (5, 1, 0)


@pytest.mark.parametrize("config_class", list(CONFIGS))
def test_eos_token_id_is_checked_like_the_other_token_ids(config_class) -> None:
    """One id or a list of ids, each an int >= 0 (a string once passed and failed deep inside generate)."""
    for good in (None, 3, [1, 2], (1, 2)):
        assert config_class(**CONFIGS[config_class], eos_token_id=good).eos_token_id == good
    for bad, error, message in (("x", TypeError, "eos_token_id must be an int, got 'x'"),
                                (-5, ValueError, "eos_token_id must be >= 0, got -5"),
                                ([1, "a"], TypeError, "eos_token_id must be an int, got 'a'"),
                                ([None], TypeError, "eos_token_id must be an int, got None")):
        with pytest.raises(error, match=message):
            config_class(**CONFIGS[config_class], eos_token_id=bad)


@pytest.mark.parametrize("config_class", list(CONFIGS))
def test_a_pad_token_id_outside_the_vocabulary_is_refused_by_the_config(config_class) -> None:
    """The padding id is the embedding's ``padding_idx``: past the vocabulary every model failed to build in
    torch's ``AssertionError``, seven frames deep (Transformers' own configs only log a warning)."""
    vocab = CONFIGS[config_class]["vocab_size"]
    assert config_class(**CONFIGS[config_class], pad_token_id=vocab - 1).pad_token_id == vocab - 1
    with pytest.raises(ValueError, match=rf"pad_token_id must be < vocab_size={vocab}, got {vocab}\."):
        config_class(**CONFIGS[config_class], pad_token_id=vocab)


FAMILY_MODELS = {"entropy_invariant": "EntropyInvariant", "gau": "GAU", "synthesizer": "Synthesizer"}
FAMILY_CONFIGS = dict(zip(FAMILY_MODELS, CONFIGS.items(), strict=True))
"""family → (config class, tiny fields)."""


@pytest.mark.parametrize("family", list(FAMILY_MODELS))
def test_the_stock_log_n_attention_functions_are_refused_by_every_family(family: str) -> None:
    """Transformers accepts any registered attention name for any model. The entropy-invariant family
    scales by log n itself, so ``attn_implementation="entropy_invariant"`` squared the factor (1.1e-3 off
    the SDPA model at a tiny init); GAU and the Synthesizer ignored it. One ``ValueError`` at load and at
    ``set_attn_implementation``."""
    import hf_attn_variants

    config_class, fields = FAMILY_CONFIGS[family]
    model_class = getattr(hf_attn_variants, f"{FAMILY_MODELS[family]}ForCausalLM")
    why = "would scale the logits again" if family == "entropy_invariant" else "would change nothing"
    for name in ("entropy_invariant", "entropy_invariant_eager"):
        with pytest.raises(ValueError, match=rf"attn_implementation='{name}' is log-n scaling for .*{why}"):
            model_class._from_config(config_class(**fields), attn_implementation=name)
    model = model_class(config_class(**fields))
    with pytest.raises(ValueError, match="is log-n scaling for stock Transformers models"):
        model.set_attn_implementation("entropy_invariant")
    if family == "entropy_invariant":
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("family", list(FAMILY_MODELS))
def test_a_causal_config_in_a_bidirectional_head_is_said(family: str) -> None:
    """A causal LM's checkpoint loaded into a classification head attends in both directions and pools the
    first token: Transformers' logger says so once; a bidirectional config says nothing."""
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    import hf_attn_variants
    from hf_attn_variants.models import modeling_common

    config_class, fields = FAMILY_CONFIGS[family]
    model_class = getattr(hf_attn_variants, f"{FAMILY_MODELS[family]}ForSequenceClassification")
    logger = logging.get_logger(modeling_common.__name__)
    for is_decoder in (False, True):
        logger.warning_once.cache_clear()
        with CaptureLogger(logger) as captured:
            model = model_class(config_class(**fields, is_decoder=is_decoder))
        assert not model.config.is_decoder
        assert ("attends in both directions, but this config is causal" in captured.out) == is_decoder
