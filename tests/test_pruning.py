"""hf_attn_variants.pruning: masking, physical pruning, reloading, importance, iterative pruning, CLI.

Every property is checked on a tiny model of each supported kind: this package's ``entropy_invariant``
and ``synthesizer`` families, a stock BERT encoder and a stock Llama decoder with grouped-query attention
(4 query heads sharing 2 key/value heads), all built locally from configs.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from hf_attn_variants import FAMILIES
from hf_attn_variants.pruning import (
    NoAttentionHeadsError,
    compute_head_importance,
    count_heads,
    get_adapter,
    head_mask,
    iterative_head_pruning,
    load_pruned,
    prune_heads,
    restate_uniform_heads,
    write_curve,
)
from tests.properties import assert_cache_matches_full_forward, assert_generate_matches_greedy_full_forward
from tests.remote_code import RemoteCase, assert_remote_code_matches
from tests.utils import one_thread, random_ids, right_padded  # noqa: F401 (one_thread: autouse fixture)

HIDDEN, HEADS, LAYERS, HEAD_DIM, VOCAB, LENGTH = 32, 4, 3, 8, 97, 16
KINDS = ["entropy_invariant", "synthesizer", "bert", "llama"]
# Two rounds: layer 0 loses every head; Llama's layer 1 is left with unequal groups after round one
# (kv head 0 serves query 0, kv head 1 serves 2 and 3) and equal ones after round two; round two removes
# a whole key/value group of layer 2.
ROUNDS = [{0: [0, 1, 2, 3], 1: [1]}, {1: [3], 2: [0, 1]}]

# torch warns when v5's initialisation touches the zero-size weights of a layer without heads.
pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")


def our_config(family: str, **overrides):
    config_class, _ = FAMILIES[family]
    values = {
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": LENGTH, "num_labels": 3,
    }
    if family == "entropy_invariant":
        values.update(attention_scale="ssmax", base_length=8, entropy_min_length=2)
    else:
        values.update(synthesizer_components=["random", "vanilla"])
    values.update(overrides)
    return config_class(**values)


def build(kind: str, seed: int = 0, suffix: str = "ForSequenceClassification"):
    """A tiny model of ``kind`` in eval mode (sequence classifiers for encoders, a causal LM for Llama)."""
    torch.manual_seed(seed)
    if kind in ("entropy_invariant", "synthesizer"):
        _, classes = FAMILIES[kind]
        config = our_config(kind, is_decoder=suffix == "ForCausalLM")
        return classes[suffix](config).eval()
    if kind == "bert":
        config = BertConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            max_position_embeddings=LENGTH, num_labels=3,
        )
        return BertForSequenceClassification(config).eval()
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=LENGTH, pad_token_id=0,
        attention_bias=True,
    )
    return LlamaForCausalLM(config).eval()


def inputs() -> dict[str, torch.Tensor]:
    ids, mask = right_padded(random_ids(2, 10), [10, 7])
    return {"input_ids": ids, "attention_mask": mask}


def outputs(model, batch=None) -> torch.Tensor:
    with torch.no_grad():
        return model(**(batch or inputs())).logits


def mask_for(pruned: dict[int, list[int]]) -> torch.Tensor:
    mask = torch.ones(LAYERS, HEADS)
    for layer, heads in pruned.items():
        mask[layer, heads] = 0.0
    return mask


def merged(*rounds: dict[int, list[int]]) -> dict[int, list[int]]:
    result: dict[int, list[int]] = {}
    for heads in rounds:
        for layer, layer_heads in heads.items():
            result[layer] = sorted(set(result.get(layer, [])) | set(layer_heads))
    return result


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------ pruned = masked
@pytest.mark.parametrize("kind", KINDS)
def test_pruned_outputs_equal_masked_outputs(kind: str) -> None:
    model = build(kind)
    reference = copy.deepcopy(model)
    done: dict[int, list[int]] = {}
    for heads in ROUNDS:
        prune_heads(model, heads)
        done = merged(done, heads)
        with head_mask(reference, mask_for(done)):
            expected = outputs(reference)
        torch.testing.assert_close(outputs(model), expected, atol=1e-5, rtol=1e-5)
        assert model.config.pruned_heads == done
    assert count_heads(model) == (LAYERS * HEADS - sum(map(len, done.values())), LAYERS * HEADS)
    # the heads that are left are the ones the record says, in order, and masking them again still works
    adapter = get_adapter(model)
    assert [adapter.kept_heads(i) for i in range(LAYERS)] == [[], [0, 2], [2, 3]]
    extra = mask_for(done)
    extra[1, 2] = 0.5
    with head_mask(model, extra):
        pruned_half = outputs(model)
    with head_mask(reference, extra):
        torch.testing.assert_close(pruned_half, outputs(reference), atol=1e-5, rtol=1e-5)


def test_head_mask_of_ones_is_identity_and_zero_changes_output() -> None:
    model = build("entropy_invariant")
    plain = outputs(model)
    with head_mask(model, torch.ones(LAYERS, HEADS)):
        torch.testing.assert_close(outputs(model), plain)
    with head_mask(model, mask_for({1: [2]})):
        assert not torch.allclose(outputs(model), plain)
    torch.testing.assert_close(outputs(model), plain)  # hooks gone


def test_llama_grouped_query_layout_after_pruning() -> None:
    model = build("llama")
    prune_heads(model, ROUNDS[0])
    layers = model.model.layers
    assert layers[1].self_attn.num_key_value_groups == 1  # unequal groups → per-query gather
    assert layers[1].self_attn.k_proj.out_features == 2 * HEAD_DIM  # both kv heads still used, compact
    prune_heads(model, ROUNDS[1])
    assert layers[1].self_attn.num_key_value_groups == 1 and not layers[1].self_attn.k_proj._forward_hooks
    assert (layers[2].self_attn.num_key_value_groups == 2
            and layers[2].self_attn.k_proj.out_features == HEAD_DIM)
    assert layers[0].self_attn.q_proj.out_features == 0 and layers[0].self_attn.k_proj.out_features == 0


# ------------------------------------------------------------------------------- parameter accounting
def removed_parameters(kind: str, heads: dict[int, list[int]]) -> int:
    """Exact number of weights of the removed heads (q/k/v rows + biases, output-projection columns …)."""
    d, h = HEAD_DIM, HIDDEN
    qkv_o = 3 * (h * d + d) + h * d  # q/k/v rows with biases, o_proj columns
    if kind == "entropy_invariant":
        per_head = qkv_o + 1  # ssmax_scale
    elif kind == "synthesizer":
        per_head = qkv_o + LENGTH * LENGTH  # each head's random l×l matrix
    elif kind == "bert":
        per_head = qkv_o
    else:
        total = 0
        for layer_heads in heads.values():
            total += len(layer_heads) * (h * d + d + h * d)  # q rows + bias, o columns
            groups = {g for g in range(2) if all(q in layer_heads for q in (2 * g, 2 * g + 1))}
            total += len(groups) * 2 * (h * d + d)  # k and v rows + biases of kv heads with no query left
        return total
    return per_head * sum(len(v) for v in heads.values())


@pytest.mark.parametrize("kind", KINDS)
def test_parameter_count_drops_by_exactly_the_removed_heads(kind: str) -> None:
    model = build(kind)
    before = n_params(model)
    heads = merged(*ROUNDS)
    prune_heads(model, heads)
    assert before - n_params(model) == removed_parameters(kind, heads)


# ------------------------------------------------------------------------------------------- reload
@pytest.mark.parametrize("kind", KINDS)
def test_save_and_reload_gives_the_same_outputs(kind: str, tmp_path) -> None:
    model = build(kind)
    for heads in ROUNDS:
        prune_heads(model, heads)
    model.save_pretrained(tmp_path)
    expected = outputs(model)
    reloaded = load_pruned(tmp_path).eval()
    assert type(reloaded) is type(model)
    assert reloaded.config.pruned_heads == model.config.pruned_heads
    torch.testing.assert_close(outputs(reloaded), expected)
    if kind in ("entropy_invariant", "synthesizer"):
        plain = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
        torch.testing.assert_close(outputs(plain), expected)
    # pruning continues after a reload and the record keeps merging
    prune_heads(reloaded, {2: [2]})
    assert reloaded.config.pruned_heads[2] == [0, 1, 2]


def test_load_pruned_passes_from_pretrained_kwargs(tmp_path) -> None:
    model = build("llama")
    prune_heads(model, ROUNDS[0])
    model.save_pretrained(tmp_path)
    reloaded = load_pruned(tmp_path, dtype=torch.float64, attn_implementation="eager")
    assert reloaded.dtype == torch.float64 and reloaded.config._attn_implementation == "eager"
    batch = inputs()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits.float(), outputs(model, batch), atol=1e-5,
                                   rtol=1e-4)


def test_pruned_checkpoints_of_our_families_load_with_remote_code_in_a_clean_environment(tmp_path) -> None:
    cases = []
    for kind in ("entropy_invariant", "synthesizer"):
        model = build(kind)
        for heads in ROUNDS:
            prune_heads(model, heads)
        cases.append(RemoteCase(kind, model, "AutoModelForSequenceClassification", inputs()))
        # uniformly pruned and restated (num_attention_heads=2, explicit head_dim, no pruned_heads): the
        # exported configuration code reads head_dim on every supported Transformers release
        _, classes = FAMILIES[kind]
        torch.manual_seed(0)
        uniform = classes["ForCausalLM"](our_config(kind, is_decoder=True)).eval()
        prune_heads(uniform, {0: [0, 1], 1: [1, 3], 2: [0, 2]})
        assert restate_uniform_heads(uniform) and uniform.config.num_attention_heads == 2
        batch = {"input_ids": inputs()["input_ids"]}
        cases.append(RemoteCase(f"{kind}-uniform", uniform, "AutoModelForCausalLM", batch))
    assert_remote_code_matches(cases, tmp_path)


# --------------------------------------------------------------------------------- decoding after pruning
@pytest.mark.parametrize("kind", ["entropy_invariant", "synthesizer", "llama"])
def test_cached_decoding_matches_full_forward_after_pruning(kind: str) -> None:
    model = build(kind, suffix="ForCausalLM")
    prune_heads(model, ROUNDS[0])  # layer 0 (whose cache gives the length) has no head left
    assert_cache_matches_full_forward(model, prompt=4, steps=4)
    assert_generate_matches_greedy_full_forward(model, prompt=3, new=4)


@pytest.mark.parametrize("kind", KINDS)
def test_output_attentions_keep_one_entry_per_layer_after_pruning(kind: str) -> None:
    model = build(kind)
    model.set_attn_implementation("eager")
    prune_heads(model, ROUNDS[0])
    with torch.no_grad():
        attentions = model(**inputs(), output_attentions=True).attentions
    assert [tuple(a.shape[:2]) for a in attentions] == [(2, 0), (2, 3), (2, 4)]


# ------------------------------------------------------------------------------------------ importance
def labelled(model, n: int, seed: int) -> dict[str, torch.Tensor]:
    ids, mask = right_padded(random_ids(n, 9, seed=seed), [9, 6, 8, 5][:n] + [9] * max(0, n - 4))
    if type(model).__name__.endswith("ForCausalLM"):
        labels = ids.masked_fill(mask == 0, -100)
    else:
        labels = torch.arange(n) % 3
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("kind", KINDS)
def test_importance_is_per_example(kind: str) -> None:
    model = build(kind)
    batch = labelled(model, 2, seed=3)
    singles = [{k: v[i : i + 1] for k, v in batch.items()} for i in range(2)]
    together = compute_head_importance(model, [batch], normalize_per_layer=False)
    apart = compute_head_importance(model, singles, normalize_per_layer=False)
    torch.testing.assert_close(together, apart, rtol=1e-5, atol=1e-9)
    assert together.shape == (LAYERS, HEADS) and (together > 0).all()


def test_importance_sums_absolute_per_example_gradients() -> None:
    """Iₕ = Σₓ |∂Lₓ/∂ξₕ|, checked against gradients taken by hand; ≥ the batch-sum variant |Σₓ ∂Lₓ/∂ξₕ|."""
    model = build("entropy_invariant")
    batch = labelled(model, 4, seed=5)
    grads = []
    for i in range(4):
        gate = torch.ones(LAYERS, HEADS, requires_grad=True)
        with head_mask(model, gate):
            loss = model(**{k: v[i : i + 1] for k, v in batch.items()}).loss
        grads.append(torch.autograd.grad(loss, gate)[0])
    grads = torch.stack(grads)
    importance = compute_head_importance(model, [batch], normalize_per_layer=False)
    torch.testing.assert_close(importance, grads.abs().sum(0), rtol=1e-5, atol=1e-9)
    assert (importance >= grads.sum(0).abs() - 1e-9).all()
    assert (importance > grads.sum(0).abs() + 1e-7).any(), "opposite-signed examples should not cancel"


def test_importance_normalisation_and_pruned_heads_are_nan() -> None:
    model = build("bert")
    prune_heads(model, {0: [0, 1, 2, 3], 1: [1]})
    data = [labelled(model, 2, seed=1)]
    model.train()
    raw = compute_head_importance(model, data, normalize_per_layer=False)
    assert model.training  # mode restored
    assert torch.isnan(raw[0]).all() and torch.isnan(raw[1, 1]) and torch.isfinite(raw[2]).all()
    per_layer = compute_head_importance(model, data)
    norms = per_layer.nan_to_num(0.0).pow(2).sum(-1).sqrt()
    torch.testing.assert_close(norms[1:], torch.ones(2))
    scaled = compute_head_importance(model, data, normalize_global=True)
    finite = scaled[~torch.isnan(scaled)]
    assert finite.min() == 0 and finite.max() == 1
    assert all(p.grad is None for p in model.parameters())  # no parameter gradients accumulated


def test_importance_needs_labels_and_examples() -> None:
    model = build("entropy_invariant")
    batch = labelled(model, 2, seed=1)
    with pytest.raises(ValueError, match="labels"):
        compute_head_importance(model, [{k: v for k, v in batch.items() if k != "labels"}])
    with pytest.raises(ValueError, match="no example with a token to predict"):
        compute_head_importance(model, [])
    with pytest.raises(TypeError, match="dict"):
        compute_head_importance(model, [batch["input_ids"]])


@pytest.mark.parametrize(("dataloader", "kwargs", "message"), [
    (None, {}, "dataloader must be an iterable of dict batches .*got NoneType"),
    ("one batch", {}, "dataloader must be an iterable of dict batches, got one dict batch: wrap it in a"),
    ("labels list", {}, r"batch\['labels'\] must be a tensor, got list"),
    ("batches", {"normalize_per_layer": "no"}, "normalize_per_layer must be a bool, got 'no'"),
    ("batches", {"normalize_global": 1}, "normalize_global must be a bool, got 1"),
])
def test_bad_importance_arguments_are_named(dataloader, kwargs, message) -> None:
    """Each gave an error that did not name the argument (iterating None, a dict's keys read as batches, a
    list of labels deep in the loss) or was read as true (``"no"``)."""
    model = build("entropy_invariant")
    batch = labelled(model, 2, seed=1)
    data = {"one batch": batch, "labels list": [{**batch, "labels": batch["labels"].tolist()}],
            "batches": [batch]}.get(dataloader)
    with pytest.raises(TypeError, match=message):
        compute_head_importance(model, data, **kwargs)


@pytest.mark.parametrize("kind", ["llama", "entropy_invariant"])
def test_examples_with_nothing_to_predict_are_skipped(kind: str) -> None:
    """A causal row of one token (the model shifts the labels) or an MLM row with nothing masked has no loss:
    the scores are those of the other examples (they raised "loss is not finite" and stopped the CLI)."""
    if kind == "llama":
        model = build(kind)
        batch = labelled(model, 2, seed=3)
        first = batch["input_ids"][:1]
        empty = {"input_ids": first, "attention_mask": torch.zeros_like(first),
                 "labels": torch.full_like(first, -100)}
        empty["attention_mask"][0, 0], empty["labels"][0, 0] = 1, batch["input_ids"][0, 0]
    else:
        model = build(kind, suffix="ForMaskedLM")
        ids = random_ids(2, 9, seed=3)
        batch = {"input_ids": ids, "labels": ids.masked_fill(torch.rand(ids.shape) > 0.3, -100)}
        batch["labels"][:, 0] = ids[:, 0]
        empty = {"input_ids": ids[:1], "labels": torch.full_like(ids[:1], -100)}
    expected = compute_head_importance(model, [batch], normalize_per_layer=False)
    torch.testing.assert_close(compute_head_importance(model, [batch, empty], normalize_per_layer=False),
                               expected)
    with pytest.raises(ValueError, match="no example with a token to predict"):
        compute_head_importance(model, [empty])


# ------------------------------------------------------- first-order importance vs true ablation (trained)
def count_task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Label = whether token 3 occurs more often than token 4 (position 0 is a [CLS]-like token 1)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 16, (n, 12), generator=generator)
    ids[:, 0] = 1
    return ids, ((ids == 3).sum(1) > (ids == 4).sum(1)).long()


@pytest.fixture(scope="module")
def trained_classifier():
    """A 2-layer, 4-head entropy-invariant classifier trained for 150 steps (a few seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        config = our_config(
            "entropy_invariant", vocab_size=16, num_hidden_layers=2, num_labels=2,
            attention_scale="entropy_invariant", base_length=12, max_position_embeddings=12,
        )
        model = FAMILIES["entropy_invariant"][1]["ForSequenceClassification"](config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(150):
            ids, labels = count_task(32, 1000 + step)
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation (no ties expected in continuous scores)."""
    ranks = [torch.empty(len(x), dtype=torch.float64)
             .index_copy_(0, x.argsort(), torch.arange(len(x), dtype=torch.float64))
             for x in (a.flatten(), b.flatten())]
    ra, rb = (r - r.mean() for r in ranks)
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def test_first_order_importance_ranks_heads_like_true_ablation(trained_classifier) -> None:
    model = trained_classifier
    ids, labels = count_task(64, 7)
    with torch.no_grad():
        accuracy = (model(input_ids=ids).logits.argmax(-1) == labels).float().mean()
    assert accuracy > 0.8

    def losses(mask: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), head_mask(model, mask):
            return torch.nn.functional.cross_entropy(model(input_ids=ids).logits, labels, reduction="none")

    base = losses(torch.ones(2, HEADS))
    true_change = torch.zeros(2, HEADS)
    for layer in range(2):
        for head in range(HEADS):
            mask = torch.ones(2, HEADS)
            mask[layer, head] = 0.0
            true_change[layer, head] = (losses(mask) - base).abs().sum()
    batches = [{"input_ids": ids[i : i + 16], "labels": labels[i : i + 16]} for i in range(0, 64, 16)]
    importance = compute_head_importance(model, batches, normalize_per_layer=False)
    assert spearman(importance, true_change) >= 0.5


# --------------------------------------------------------------------------------------- iterative loop
def test_iterative_pruning_curve_with_threshold_and_budget(trained_classifier) -> None:
    ids, labels = count_task(128, 11)
    data = [{"input_ids": ids[i : i + 8], "labels": labels[i : i + 8]} for i in range(0, 16, 8)]

    def accuracy(model) -> float:
        with torch.no_grad():
            return float((model(input_ids=ids[64:]).logits.argmax(-1) == labels[64:]).float().mean())

    model = copy.deepcopy(trained_classifier)
    curve = iterative_head_pruning(model, data, accuracy, fraction=0.25, threshold=None, max_heads_pruned=0.5)
    assert curve[0].step == 0 and curve[0].heads_pruned == 0 and curve[0].relative_metric == 1.0
    # round(25% of 8) = 2, round(25% of 6) = 2, budget 4
    assert [row.heads_pruned for row in curve] == [0, 2, 4]
    assert all(row.accepted for row in curve)
    assert count_heads(model) == (4, 8)
    assert sum(len(v) for v in model.config.pruned_heads.values()) == 4
    assert curve[-1].metric == pytest.approx(accuracy(model))  # evaluated under mask = the pruned model

    model = copy.deepcopy(trained_classifier)
    strict = iterative_head_pruning(model, data, accuracy, fraction=0.25, threshold=0.999, rescore=True)
    assert not strict[-1].accepted and all(row.accepted for row in strict[:-1])
    last = strict[-2]
    assert count_heads(model)[0] == 8 - last.heads_pruned  # the rejected step was not applied
    assert strict[-1].relative_metric < 0.999
    fractions = [row.fraction for row in strict]
    assert fractions == sorted(fractions)


def test_iterative_pruning_to_the_end_and_random_order() -> None:
    model = build("bert")
    data = [labelled(model, 2, seed=1)]
    curve = iterative_head_pruning(model, data, lambda m: 1.0, fraction=0.5, threshold=None)
    assert [row.heads_pruned for row in curve] == [0, 6, 9, 11, 12]  # half of the remaining, at least one
    assert curve[-1].heads_remaining == 0 and count_heads(model) == (0, LAYERS * HEADS)
    assert torch.isfinite(outputs(model)).all()  # every layer without heads still runs
    model = build("llama")
    order = torch.arange(LAYERS * HEADS, dtype=torch.float32).reshape(LAYERS, HEADS)
    curve = iterative_head_pruning(model, None, lambda m: 1.0, fraction=0.1, threshold=None, importance=order,
                                   max_heads_pruned=3, min_heads_per_layer=1)
    assert model.config.pruned_heads == {0: [0, 1, 2]}
    with pytest.raises(ValueError, match="fraction"):
        iterative_head_pruning(model, None, lambda m: 1.0, fraction=0.0, importance=order)
    with pytest.raises(TypeError, match="re-iterable"):
        iterative_head_pruning(model, iter([]), lambda m: 1.0, rescore=True)


def test_a_stop_keeps_the_steps_measured_before_it(tmp_path) -> None:
    """``on_step`` sees the curve after every row; ``prune`` writes curve.csv from it, so a Ctrl-C in the
    third measurement leaves the two rows before it there (the whole curve was written only at the end)."""
    model = build("bert")
    calls = []

    def metric(_: object) -> float:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return 1.0

    with pytest.raises(KeyboardInterrupt):
        iterative_head_pruning(model, [labelled(model, 2, seed=1)], metric, fraction=0.5, threshold=None,
                               on_step=lambda rows: write_curve(rows, tmp_path / "curve.csv"))
    rows = (tmp_path / "curve.csv").read_text().splitlines()
    assert rows[0].startswith("step,") and [row.split(",")[0] for row in rows[1:]] == ["0", "1"]


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"importance": torch.rand(3, 3)}, ValueError,
     rf"importance must have shape \(num_layers, num_heads\) = \({LAYERS}, {HEADS}\), got \(3, 3\)"),
    ({"importance": [[1.0]]}, TypeError, "importance must be a tensor"),
    ({"importance": torch.full((LAYERS, HEADS), float("nan"))}, ValueError,
     rf"importance has a score that is not finite for {LAYERS * HEADS} head\(s\) still in the model, the "
     "first layer 0 head 0"),
    ({"fraction": "0.1"}, TypeError, "fraction must be a number, got '0.1'"),
    ({"threshold": "x"}, TypeError, "threshold must be a number"),
    ({"min_heads_per_layer": -1}, ValueError, "min_heads_per_layer must be an integer >= 0, got -1"),
    ({"min_heads_per_layer": "2"}, ValueError, "min_heads_per_layer must be an integer"),
    ({"higher_is_better": "no"}, TypeError, "higher_is_better must be a bool, got 'no'"),
    ({"rescore": "no"}, TypeError, "rescore must be a bool"),
    ({"metric": 3}, TypeError, "metric must be a callable metric\\(model\\) -> float, got int"),
    ({"metric": lambda m: None}, TypeError, "metric must return a real number, got NoneType None"),
    ({"metric": lambda m: "0.5"}, TypeError, "metric must return a real number, got str '0.5'"),
    ({"metric": lambda m: float("nan")}, ValueError, "metric returned nan for the model before pruning"),
])
def test_bad_pruning_arguments_are_named_before_any_step(kwargs, error, message) -> None:
    """Each once gave a deep ``IndexError``/``TypeError`` or was silently read otherwise (a NaN score is
    "already pruned": all-NaN importance pruned nothing and said nothing; a NaN metric was the baseline of
    every step, and with no threshold every head went)."""
    model = build("llama")
    arguments = {"importance": torch.rand(LAYERS, HEADS), "metric": lambda m: 1.0, **kwargs}
    with pytest.raises(error, match=message):
        iterative_head_pruning(model, [labelled(model, 2, seed=1)], **arguments)
    assert count_heads(model) == (LAYERS * HEADS, LAYERS * HEADS)  # nothing pruned


# ------------------------------------------------------------------------------------------- bad input
def test_bad_head_indices_raise_clear_errors() -> None:
    model = build("entropy_invariant")
    state = copy.deepcopy(model.state_dict())
    for heads, error, message in [
        ({5: [0]}, ValueError, r"layer 5 is out of range \[0, 3\)"),
        ({0: [4]}, ValueError, r"heads \[4\] of layer 0 are out of range \[0, 4\)"),
        ({0: [-1]}, ValueError, "out of range"),
        ({0: [1, 1]}, ValueError, "twice"),
        ({0: [0], 1: [9]}, ValueError, "out of range"),  # nothing is changed when any entry is bad
        ([0, 1], TypeError, "dict"),
        ({"0": [1]}, TypeError, "ints"),
        ({0: 1}, TypeError, "list"),
    ]:
        with pytest.raises(error, match=message):
            prune_heads(model, heads)
    assert not model.config.pruned_heads
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    prune_heads(model, {0: [1]})
    with pytest.raises(ValueError, match="already pruned"):
        prune_heads(model, {0: [1, 2]})
    with pytest.raises(ValueError, match="shape"), head_mask(model, torch.ones(2, 2)):
        pass
    with (pytest.raises(ValueError, match="finite"),
          head_mask(model, torch.full((LAYERS, HEADS), float("nan")))):
        pass


def test_head_mask_removes_its_hooks_on_exceptions() -> None:
    model = build("llama")
    projection = model.model.layers[0].self_attn.o_proj
    with pytest.raises(RuntimeError, match="boom"), head_mask(model, torch.zeros(LAYERS, HEADS)):
        assert projection._forward_pre_hooks
        raise RuntimeError("boom")
    assert not projection._forward_pre_hooks


def test_gau_has_no_heads_to_prune() -> None:
    config_class, classes = FAMILIES["gau"]
    model = classes["ForSequenceClassification"](
        config_class(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, attention_key_size=16,
                     num_labels=2)
    )
    for call in (
        lambda: prune_heads(model, {0: [0]}),
        lambda: compute_head_importance(model, [labelled(model, 2, seed=0)]),
        lambda: head_mask(model, torch.ones(2, 1)).__enter__(),
    ):
        with pytest.raises(NoAttentionHeadsError, match="single gated attention unit per layer"):
            call()
    assert issubclass(NoAttentionHeadsError, ValueError)


def test_unsupported_architectures_raise_type_error() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=VOCAB))
    with pytest.raises(TypeError, match="does not know the architecture of GPT2LMHeadModel"):
        prune_heads(gpt2, {0: [0]})
    with pytest.raises(TypeError, match="PreTrainedModel"):
        prune_heads(torch.nn.Linear(2, 2), {0: [0]})


def test_a_hybrid_decoder_with_layers_of_another_attention_is_unsupported() -> None:
    """A decoder whose first layer is Llama-style but a later one another attention (MiniMax's linear layers)
    matched the decoder adapter on layer 0 and failed at the first later layer with an ``AttributeError``."""

    class LinearAttention(torch.nn.Module):  # no q/k/v/o projections, as MiniMax's lightning attention
        def forward(self, hidden_states, **kwargs):
            return hidden_states, None

    model = build("llama")
    model.model.layers[1].self_attn = LinearAttention()
    with pytest.raises(TypeError, match="does not know the architecture of LlamaForCausalLM"):
        compute_head_importance(model, [labelled(model, 2, seed=1)])


def _tiny_decoder(name: str, **extra):
    import transformers

    config = getattr(transformers, f"{name}Config")(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=2, num_attention_heads=4, **extra)
    return getattr(transformers, f"{name}ForCausalLM")(config).eval()


@pytest.mark.parametrize(("name", "extra", "tensors"), [
    ("Olmo2", {}, "q_norm.weight (32,), k_norm.weight (32,)"),  # a norm over every head's features
    ("Cohere", {"use_qk_norm": True}, "q_norm.weight (4, 8), k_norm.weight (4, 8)"),  # a norm per head
    ("StableLm", {"qk_layernorm": True, "num_key_value_heads": 4, "pad_token_id": 0},  # 5.0 has no default
     "q_layernorm.norms.0.weight (8,), "),  # a module per head
    ("GptOss", {"num_local_experts": 2, "num_experts_per_tok": 1, "num_key_value_heads": 4},
     "sinks (4,)"),  # a logit per head
])
def test_decoders_with_per_head_tensors_beside_the_projections_are_refused(name, extra, tensors) -> None:
    """Decoders laid out like Llama whose attention holds per-head tensors that removing heads would leave
    wrong: ``prune_heads`` took them, recorded the pruning, and every later forward failed in Transformers
    with a size mismatch. Now one TypeError names those tensors, and the model is untouched; masking heads
    (which gates o_proj's input) still works, as before."""
    model = _tiny_decoder(name, **extra)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(TypeError, match=rf"Heads cannot be removed from {name}ForCausalLM: .*\("
                                        rf"{re.escape(tensors)}"):
        prune_heads(model, {0: [1]})
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())
    assert not getattr(model.config, "pruned_heads", None)
    ids = torch.randint(0, VOCAB, (1, 6))
    with head_mask(model, torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])), torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_a_rotary_embedding_inside_the_attention_does_not_stop_pruning() -> None:
    """The v4-style layout (a rotary embedding with unsaved inv_freq buffers inside self_attn, as in remote
    code of InternLM or MiniCPM) has nothing per head beside the projections: it still prunes, and pruned
    equals masked."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = _tiny_decoder("Llama", num_key_value_heads=2)
    for layer in model.model.layers:
        layer.self_attn.rotary_emb = LlamaRotaryEmbedding(model.config)
    ids = torch.randint(0, VOCAB, (1, 7))
    with head_mask(model, torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])), torch.no_grad():
        masked = model(input_ids=ids).logits
    prune_heads(model, {0: [2, 3]})
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, masked, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("name", "extra"), [
    ("Qwen3", {"num_key_value_heads": 2, "head_dim": 8}),  # q_norm and k_norm over head_dim, shared by heads
    ("Gemma3Text", {"num_key_value_heads": 2, "head_dim": 8}),
    ("Gemma2", {"num_key_value_heads": 2, "head_dim": 8}),
    ("Mixtral", {"num_key_value_heads": 2, "num_local_experts": 2}),
    ("Granite", {"num_key_value_heads": 2}),
])
def test_other_llama_style_decoders_prune_as_their_head_mask_says(name, extra) -> None:
    """Pruned equals masked for the Llama-style decoders docs/pruning.md lists beyond Llama, Qwen2 and
    Mistral, norms of head_dim features shared by every head included (Qwen3, Gemma 3)."""
    import transformers

    config = getattr(transformers, f"{name}Config")(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=2, num_attention_heads=4, **extra)
    model = getattr(transformers, f"{name.removesuffix('Text')}ForCausalLM")(config).eval()
    ids = torch.randint(0, VOCAB, (1, 7))
    with head_mask(model, torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])), torch.no_grad():
        masked = model(input_ids=ids).logits
    prune_heads(model, {0: [1]})
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, masked, atol=1e-5, rtol=1e-5)

