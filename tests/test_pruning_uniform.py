"""Uniform head pruning (the same number of heads from every layer) and restating the pruned config.

``select_heads(uniform=True)`` / ``iterative_head_pruning(uniform=True)`` follow Torch-Pruning's uniform mode
(``global_pruning=False``); ``restate_uniform_heads`` turns a model with k heads in every layer into one whose
config states ``num_attention_heads = k`` and ``head_dim``, so it reloads with plain ``from_pretrained`` (and
serves in vLLM) like an unpruned model. Tiny models, CPU, one thread.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
)

import hf_attn_variants  # noqa: F401  (registers the Auto classes)
from hf_attn_variants import FAMILIES, EntropyInvariantConfig
from hf_attn_variants.pruning import (
    count_heads,
    get_adapter,
    iterative_head_pruning,
    load_pruned,
    prune_heads,
    restate_uniform_heads,
)
from hf_attn_variants.pruning.iterative import select_heads, uniform_step_size
from tests.properties import assert_cache_matches_full_forward
from tests.utils import one_thread  # noqa: F401 (autouse fixture)

HIDDEN, HEADS, LAYERS, HEAD_DIM, VOCAB, LENGTH = 32, 4, 3, 8, 97, 16

pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")


def ours(family: str = "entropy_invariant", suffix: str = "ForCausalLM", position: str = "absolute",
         seed: int = 0):
    """A tiny model of this package (a decoder for ``ForCausalLM``) in eval mode."""
    torch.manual_seed(seed)
    config_class, classes = FAMILIES[family]
    values = {
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": LENGTH, "num_labels": 3, "is_decoder": suffix == "ForCausalLM",
        "position_embedding_type": position,
    }
    if family == "entropy_invariant":
        values.update(attention_scale="ssmax", base_length=8, entropy_min_length=2)
    else:
        values.update(synthesizer_components=["random", "vanilla"])
    return classes[suffix](config_class(**values)).eval()


def llama(kv_heads: int = HEADS, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=kv_heads, intermediate_size=64, max_position_embeddings=LENGTH, pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(seed))


def logits(model, input_ids: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids() if input_ids is None else input_ids).logits


def counts(model) -> list[int]:
    """Heads per layer now."""
    return get_adapter(model).alive().sum(-1).tolist()


SCORES = torch.tensor([
    [0.9, 0.1, 0.5, 0.2],
    [0.05, 0.06, 0.07, 0.08],  # globally the least important layer: global pruning takes it first
    [0.3, 0.3, 0.8, 0.3],  # ties: the lower head index goes first
])


# ----------------------------------------------------------------------------------------------- selection
def test_uniform_selection_takes_the_lowest_heads_within_each_layer() -> None:
    assert select_heads(SCORES, 3) == {1: [0, 1, 2]}  # global ranking (the default) is unchanged
    assert select_heads(SCORES, 1, uniform=True) == {0: [1], 1: [0], 2: [0]}
    assert select_heads(SCORES, 2, uniform=True) == {0: [1, 3], 1: [0, 1], 2: [0, 1]}
    assert select_heads(SCORES, 3, uniform=True) == {0: [1, 2, 3], 1: [0, 1, 2], 2: [0, 1, 3]}
    pruned = SCORES.clone()
    pruned[0, 1] = pruned[1, 0] = pruned[2, 0] = float("nan")  # one head gone from each layer
    assert select_heads(pruned, 1, uniform=True) == {0: [3], 1: [1], 2: [1]}
    # never non-uniform: a layer would go below min_heads_per_layer → nothing is chosen
    assert select_heads(SCORES, 3, min_heads_per_layer=2, uniform=True) == {}
    assert select_heads(SCORES, 2, min_heads_per_layer=2, uniform=True) == {0: [1, 3], 1: [0, 1], 2: [0, 1]}
    uneven = SCORES.clone()
    uneven[1, 3] = float("nan")
    with pytest.raises(ValueError,
                       match=r"uniform=True needs the same number of heads in every layer.*\[4, 3, 4\]"):
        select_heads(uneven, 1, uniform=True)


def test_uniform_step_size() -> None:
    assert uniform_step_size(8, 0.1, 32, 4, 0) == 1  # max(1, round(0.8))
    assert uniform_step_size(8, 0.5, 32, 4, 0) == 4
    assert uniform_step_size(8, 0.5, 32, 4, 6) == 2  # min_heads_per_layer caps it
    assert uniform_step_size(8, 0.5, 9, 4, 0) == 2  # the budget caps it: 9 heads = 2 per layer
    assert uniform_step_size(8, 0.5, 3, 4, 0) == 0  # not one head per layer fits: stop


# --------------------------------------------------------------------------------------------- iteration
def test_uniform_iterative_pruning_keeps_equal_counts_at_every_step() -> None:
    model = ours(suffix="ForSequenceClassification")
    seen: list[list[int]] = []

    def metric(m) -> float:
        seen.append(counts(m))  # physical counts before each (masked) evaluation
        return 1.0

    curve = iterative_head_pruning(model, None, metric, fraction=0.25, threshold=None, importance=SCORES,
                                   uniform=True)
    assert [row.heads_pruned for row in curve] == [0, 3, 6, 9, 12]  # k = max(1, round(25% of 4..1)) = 1
    for row in curve[1:]:
        assert sorted(row.newly_pruned) == [0, 1, 2] and {len(h) for h in row.newly_pruned.values()} == {1}
    assert all(len(set(c)) == 1 for c in seen) and seen[1:] == [[4] * 3, [3] * 3, [2] * 3, [1] * 3]
    assert curve[1].newly_pruned == {0: [1], 1: [0], 2: [0]}  # the per-layer argmin of SCORES
    assert count_heads(model) == (0, 12)

    # budget and min_heads_per_layer cap k; when not one head per layer fits, it stops (never non-uniform)
    model = ours(suffix="ForSequenceClassification")
    curve = iterative_head_pruning(model, None, lambda m: 1.0, fraction=0.5, threshold=None,
                                   importance=SCORES, uniform=True, max_heads_pruned=8)
    assert [row.heads_pruned for row in curve] == [0, 6] and counts(model) == [2, 2, 2]  # 2 more < 3 layers
    model = ours(suffix="ForSequenceClassification")
    curve = iterative_head_pruning(model, None, lambda m: 1.0, fraction=0.5, threshold=None,
                                   importance=SCORES, uniform=True, min_heads_per_layer=1)
    assert [row.heads_pruned for row in curve] == [0, 6, 9] and counts(model) == [1, 1, 1]
    assert model.config.pruned_heads == {0: [1, 2, 3], 1: [0, 1, 2], 2: [0, 1, 3]}


def test_uniform_pruning_with_threshold_and_rescoring() -> None:
    model = ours(suffix="ForSequenceClassification")
    values = iter([1.0, 0.95, 0.5])
    curve = iterative_head_pruning(model, None, lambda m: next(values), fraction=0.25, threshold=0.9,
                                   importance=SCORES, uniform=True)
    assert [(row.heads_pruned, row.accepted) for row in curve] == [(0, True), (3, True), (6, False)]
    assert counts(model) == [3, 3, 3]  # the rejected step was not applied
    model = ours(suffix="ForSequenceClassification")
    batch = [{"input_ids": ids(), "labels": torch.tensor([0, 2])}]
    curve = iterative_head_pruning(model, batch, lambda m: 1.0, fraction=0.5, threshold=None, rescore=True,
                                   uniform=True)
    assert [row.heads_pruned for row in curve] == [0, 6, 9, 12]


def test_uniform_pruning_rejects_non_uniform_models_and_bad_values() -> None:
    model = ours(suffix="ForSequenceClassification")
    prune_heads(model, {1: [2]})
    with pytest.raises(ValueError,
                       match=r"uniform=True needs the same number of heads in every layer.*\[4, 3, 4\]"):
        iterative_head_pruning(model, None, lambda m: 1.0, importance=SCORES, uniform=True)
    assert counts(model) == [4, 3, 4]
    with pytest.raises(TypeError, match="uniform must be a bool"):
        iterative_head_pruning(model, None, lambda m: 1.0, importance=SCORES, uniform="yes")


# ----------------------------------------------------------------------------------- restating the config
def uniformly_pruned(model, heads_per_layer: int = 2):
    """``model`` pruned by ``iterative_head_pruning(uniform=True)`` to ``heads_per_layer`` heads per layer."""
    scores = torch.rand(LAYERS, HEADS, generator=torch.Generator().manual_seed(1))
    iterative_head_pruning(model, None, lambda m: 1.0, fraction=0.25, threshold=None, importance=scores,
                           uniform=True, max_heads_pruned=LAYERS * (HEADS - heads_per_layer))
    assert counts(model) == [heads_per_layer] * LAYERS
    return model


@pytest.mark.parametrize("position", ["rope", "absolute"])  # RoPE rotates vectors of config.head_dim
@pytest.mark.parametrize("family", ["entropy_invariant", "synthesizer"])
def test_uniformly_pruned_decoder_reloads_as_a_plain_model(family: str, position: str, tmp_path) -> None:
    model = uniformly_pruned(ours(family, position=position))
    expected = logits(model)
    assert restate_uniform_heads(model)
    assert model.config.num_attention_heads == 2 and model.config.head_dim == HEAD_DIM
    assert not model.config.pruned_heads and model.config.hidden_size == HIDDEN
    torch.testing.assert_close(logits(model), expected)  # only the bookkeeping changed
    assert get_adapter(model).kept_heads(0) == [0, 1]  # renumbered 0..k-1
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["num_attention_heads"] == 2 and saved["head_dim"] == HEAD_DIM
            and not saved.get("pruned_heads"))
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(plain) is type(model) and plain.config.head_dim == HEAD_DIM
    torch.testing.assert_close(logits(plain), expected, atol=1e-5, rtol=1e-5)
    assert_cache_matches_full_forward(plain, prompt=4, steps=3)
    # trust_remote_code without this package: tests/test_pruning.py's clean-environment test has this case


def test_restating_never_writes_a_config_that_would_not_rebuild_the_model(monkeypatch) -> None:
    """The restated config is checked by building the model from it on the meta device: a model class that
    derives a size from hidden_size // num_attention_heads (here RoPE's) is left with its pruned_heads."""
    model = uniformly_pruned(ours(position="rope"))
    monkeypatch.setattr(type(model.model), "_rotary_dim",
                        lambda self, config: config.hidden_size // config.num_attention_heads)
    before = copy.deepcopy(model.config)
    assert not restate_uniform_heads(model)
    assert model.config == before and model.config.pruned_heads


def test_stock_llama_without_gqa_reloads_as_a_plain_llama(tmp_path) -> None:
    model = uniformly_pruned(llama())
    expected = logits(model)
    assert restate_uniform_heads(model)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["num_attention_heads"], saved["num_key_value_heads"], saved["head_dim"]) == (2, 2, HEAD_DIM)
    assert "pruned_heads" not in saved
    plain = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(plain), expected, atol=1e-5, rtol=1e-5)


def test_stock_llama_with_gqa_is_restated_only_when_the_config_can_state_it(tmp_path) -> None:
    # whole key/value groups removed in every layer: 2 queries sharing 1 kv head → restated
    model = llama(kv_heads=2)
    prune_heads(model, {0: [0, 1], 1: [2, 3], 2: [0, 1]})
    expected = logits(model)
    assert restate_uniform_heads(model)
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (2, 1)
    model.save_pretrained(tmp_path / "groups")
    torch.testing.assert_close(logits(LlamaForCausalLM.from_pretrained(tmp_path / "groups")), expected,
                               atol=1e-5, rtol=1e-5)
    # one query per kv head in some layers, two in others: one num_key_value_heads cannot say that
    model = llama(kv_heads=2)
    prune_heads(model, {0: [0, 1], 1: [0, 2], 2: [1, 3]})
    assert not restate_uniform_heads(model)
    # unequal groups inside a layer (a per-query gather): not restated either; load_pruned as before
    model = llama(kv_heads=2)
    prune_heads(model, {0: [0], 1: [1], 2: [3]})
    expected = logits(model)
    assert not restate_uniform_heads(model) and model.config.pruned_heads == {0: [0], 1: [1], 2: [3]}
    model.save_pretrained(tmp_path / "gather")
    torch.testing.assert_close(logits(load_pruned(tmp_path / "gather")), expected, atol=1e-5, rtol=1e-5)


def test_a_qwen2_whose_config_has_no_head_dim_field_is_restated_too(tmp_path) -> None:
    """Qwen2Config has no ``head_dim`` field, but Qwen2's attention reads one when it is set: the restated
    config carries it, and plain ``from_pretrained`` rebuilds the pruned model (it was never restated)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    model.eval()
    prune_heads(model, {0: [0, 1], 1: [2, 3]})
    expected = logits(model)
    assert restate_uniform_heads(model)
    model.save_pretrained(tmp_path / "qwen2")
    saved = json.loads((tmp_path / "qwen2" / "config.json").read_text())
    stated = (saved["num_attention_heads"], saved["num_key_value_heads"], saved["head_dim"])
    assert stated == (2, 1, HIDDEN // 4)
    torch.testing.assert_close(logits(Qwen2ForCausalLM.from_pretrained(tmp_path / "qwen2")), expected,
                               atol=1e-5, rtol=1e-5)


def test_restating_leaves_what_it_cannot_state_untouched() -> None:
    bert = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        intermediate_size=64, max_position_embeddings=LENGTH,
    ))
    prune_heads(bert, {0: [0], 1: [1], 2: [2]})
    assert not restate_uniform_heads(bert)  # BertConfig has no head_dim: pruned_heads stays
    assert bert.config.pruned_heads == {0: [0], 1: [1], 2: [2]}
    model = ours()
    assert not restate_uniform_heads(model)  # nothing pruned
    prune_heads(model, {0: [0], 1: [1]})
    assert not restate_uniform_heads(model) and model.config.pruned_heads == {0: [0], 1: [1]}  # unequal
    prune_heads(model, {0: [1, 2, 3], 1: [0, 2, 3], 2: [0, 1, 2, 3]})
    # no heads: no num_attention_heads=0
    assert not restate_uniform_heads(model) and counts(model) == [0, 0, 0]


def test_restated_config_is_private_to_the_model() -> None:
    model = uniformly_pruned(ours())
    shared = model.config
    assert restate_uniform_heads(model)
    assert shared.num_attention_heads == HEADS and shared.pruned_heads  # the old object is untouched
    assert all(m.config is model.config for m in model.modules() if hasattr(m, "config"))


# ------------------------------------------------------------------------------------------- head_dim field
def test_head_dim_config_field(tmp_path) -> None:
    config = EntropyInvariantConfig(hidden_size=HIDDEN, num_attention_heads=HEADS)
    assert config.head_dim == HIDDEN // HEADS and config.explicit_head_dim is None
    config.save_pretrained(tmp_path / "derived")
    assert "head_dim" not in json.loads((tmp_path / "derived" / "config.json").read_text())  # only when set
    config = EntropyInvariantConfig(hidden_size=HIDDEN, num_attention_heads=3, head_dim=HEAD_DIM)
    assert config.head_dim == HEAD_DIM  # 32 is no multiple of 3: fine with an explicit head size
    config.save_pretrained(tmp_path / "explicit")
    assert json.loads((tmp_path / "explicit" / "config.json").read_text())["head_dim"] == HEAD_DIM
    assert EntropyInvariantConfig.from_pretrained(tmp_path / "explicit").head_dim == HEAD_DIM
    for value, error in [(0, ValueError), (-8, ValueError), ("8", TypeError), (8.0, TypeError),
                         (True, TypeError)]:
        message = "head_dim must be >= 1" if error is ValueError else "head_dim must be an int"
        with pytest.raises(error, match=message):
            EntropyInvariantConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, head_dim=value)
    with pytest.raises(ValueError, match="multiple of num_attention_heads .3., or head_dim must be given"):
        EntropyInvariantConfig(hidden_size=HIDDEN, num_attention_heads=3)
