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
