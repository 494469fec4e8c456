"""Tests of the length study's retrieval tasks (``lengthgen --task passkey|mqar``): the generators, the
metric, the flags, the claim verdicts and a ``--quick`` run of each task (seconds)."""

from __future__ import annotations

import json

import pytest
import torch

from hf_attn_variants.cli import main
from hf_attn_variants.cli_utils import FlagError
from hf_attn_variants.lengthgen.arguments import LengthGenArguments
from hf_attn_variants.lengthgen import retrieval
from hf_attn_variants.lengthgen.retrieval import eval_batch_size, study_variants, task_config
from hf_attn_variants.lengthgen.tasks import (
    BOS,
    COPY,
    IGNORE_INDEX,
    KEY,
    QUERY,
    TaskSpec,
    answer_hits,
    make_batch,
    score,
)
from hf_attn_variants.lengthgen.variants import get_variant
from tools.docs_results import load_results, render_markdown
from tools.docs_results.publish import publish_replication, publish_retrieval
from tools.docs_results.retrieval import elimination, verdict
from tools.publish_study import main as publish_study


def test_passkey_layout_labels_and_determinism():
    spec = TaskSpec("passkey", vocab_size=32, digits=3)
    batch = make_batch(spec, 20, seed=5, start=0, count=16)
    ids, labels, positions = batch["input_ids"], batch["labels"], batch["answer_positions"]
    assert ids.shape == (16, 20) and positions.tolist() == [[17, 18, 19]] * 16
    for row, label in zip(ids, labels):
        assert row[0] == BOS and (row == KEY).sum() == 1 and row[16] == QUERY and (row == QUERY).sum() == 1
        at = int((row == KEY).nonzero())
        assert row[at + 1: at + 4].tolist() == row[17:].tolist()  # the answer is the passkey
        assert all(4 <= d < 14 for d in row[17:].tolist())  # digits
        filler = [t for i, t in enumerate(row.tolist())
                  if i not in (0, at, at + 1, at + 2, at + 3, 16, 17, 18, 19)]
        assert all(14 <= t < 32 for t in filler)
        assert label[:17].eq(IGNORE_INDEX).all() and label[17:].tolist() == row[17:].tolist()
    key_positions = {int((row == KEY).nonzero()) for row in ids}
    assert len(key_positions) > 3  # the KEY block moves
    again = make_batch(spec, 20, seed=5, start=4, count=2)["input_ids"]
    assert torch.equal(again, ids[4:6])  # example i depends on (seed, i) only
    assert not torch.equal(make_batch(spec, 20, seed=6, start=4, count=2)["input_ids"], again)
    assert make_batch(spec, 9, 0, 0, 1)["input_ids"].shape == (1, 9)  # no filler at all
    with pytest.raises(ValueError, match="length 8 is shorter than one passkey example"):
        make_batch(spec, 8, 0, 0, 1)


def test_mqar_keys_are_distinct_and_answers_are_their_values():
    spec = TaskSpec("mqar", vocab_size=64, num_kv_pairs=4)
    vocab = spec.vocab
    batch = make_batch(spec, 40, seed=1, start=0, count=32)
    for row, label, answers in zip(batch["input_ids"], batch["labels"], batch["answer_positions"]):
        tokens = row.tolist()
        assert len(tokens) == 40 and tokens[0] == BOS and tokens[31] == QUERY
        assert answers.tolist() == [33, 35, 37, 39]
        queries = tokens[32::2]
        assert len(set(queries)) == 4 and all(vocab.keys[0] <= k < vocab.keys[1] for k in queries)
        context = tokens[1:31]
        start = next(i for i, t in enumerate(context) if vocab.keys[0] <= t < vocab.keys[1])
        pairs = dict(zip(context[start:start + 8:2], context[start + 1:start + 8:2]))
        assert sorted(pairs) == sorted(queries)  # the queries are the context's keys, in another order
        assert [pairs[k] for k in queries] == tokens[33::2]  # each answer is its key's value
        assert all(vocab.answers[0] <= v < vocab.answers[1] for v in pairs.values())
        rest = context[:start] + context[start + 8:]
        assert all(vocab.filler[0] <= t < vocab.filler[1] for t in rest)
        assert [i for i, x in enumerate(label.tolist()) if x != IGNORE_INDEX] == [33, 35, 37, 39]


def test_copy_warmup_repeats_an_earlier_span():
    spec = TaskSpec("mqar", vocab_size=64, num_kv_pairs=2)
    batch = make_batch(spec, 31, seed=3, start=0, count=32, example=COPY)
    ids, labels = batch["input_ids"], batch["labels"]
    # a span of 10; its first token cannot be known, the other 9 are the answers
    assert batch["answer_positions"].tolist() == [list(range(22, 31))] * 32
    offsets = set()
    for row, label in zip(ids.tolist(), labels.tolist()):
        assert row[0] == BOS and all(4 <= t < 64 for t in row[1:])
        copy = row[21:]
        at = next(i for i in range(1, 12) if row[i: i + 10] == copy)  # an earlier span, before the copy
        offsets.add(at)
        assert [i for i, x in enumerate(label) if x != IGNORE_INDEX] == list(range(22, 31))
        assert label[22:] == copy[1:]
    assert len(offsets) > 3  # the span moves
    again = make_batch(spec, 31, seed=3, start=5, count=2, example=COPY)["input_ids"]
    assert torch.equal(again, ids[5:7])
    assert not torch.equal(make_batch(spec, 31, seed=3, start=5, count=2)["input_ids"], again)  # MQAR's own
    no_bos = TaskSpec("mqar", 64, num_kv_pairs=1, bos=False)
    for row in make_batch(no_bos, 6, 0, 0, 8, example=COPY)["input_ids"].tolist():  # spans of 2, no BOS
        assert BOS not in row and row[4:] in (row[0:2], row[1:3], row[2:4])
    with pytest.raises(ValueError, match="length 6 is shorter than one copy example"):
        make_batch(spec, 6, 0, 0, 1, example=COPY)


def test_copy_warmup_trains_first_then_the_task(monkeypatch):
    seen = []

    def recording(spec, length, seed, start, count, example=None):
        seen.append((example, start))
        return make_batch(spec, length, seed, start, count, example)

    monkeypatch.setattr(retrieval, "make_batch", recording)
    args = LengthGenArguments(task="mqar", quick=True, copy_warmup_steps=2, output_dir="unused")  # 3 steps
    plan = retrieval.plan_task_run(study_variants(args)[0], 0, args)
    spec = retrieval.task_spec(args)
    summary = retrieval.train_task_model(retrieval.build_model(plan, spec), plan, spec, args)
    assert seen == [(COPY, 0), (COPY, 4), ("mqar", 8)]  # batches of 4: examples 0…3, 4…7, then MQAR's
    assert summary["copy_warmup_steps"] == 2 and summary["steps"] == 3
    without = LengthGenArguments(task="mqar", quick=True, copy_warmup_steps=0, output_dir="unused")
    assert retrieval.plan_task_run(study_variants(without)[0], 0, without).fingerprint != plan.fingerprint


def test_metric_from_hand_made_logits():
    ids = torch.tensor([[1, 9, 9, 3, 5, 6, 7], [1, 9, 9, 3, 5, 6, 7]])
    positions = torch.tensor([[4, 5, 6], [4, 5, 6]])
    logits = torch.zeros(2, 7, 16)
    for answer in (4, 5, 6):  # the logits at position p − 1 predict the token at p
        logits[:, answer - 1, ids[0, answer]] = 5.0
    logits[1, 4, 12] = 9.0  # sequence 1 gets its second digit wrong
    hits = answer_hits(logits, ids, positions)
    assert hits.tolist() == [[True, True, True], [True, False, True]]
    passkey = score("passkey", hits)
    assert passkey["accuracy"] == 0.5 and passkey["exact_match"] == 0.5
    assert passkey["answer_accuracy"] == pytest.approx(5 / 6) and passkey["answers"] == 6
    mqar = score("mqar", hits)  # per query
    assert mqar["accuracy"] == pytest.approx(5 / 6) and mqar["exact_match"] == 0.5


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"task": "mqar", "num_kv_pairs": 0}, "num_kv_pairs"),
    ({"task": "passkey", "train_length": 16, "passkey_digits": 7}, "passkey_digits"),
    ({"task": "mqar", "train_length": 16, "num_kv_pairs": 4}, "num_kv_pairs"),
    ({"task": "mqar", "num_kv_pairs": 40}, "task_vocab_size"),
    ({"task": "passkey", "position_embedding_types": ["alibi"]}, "position_embedding_types"),
    ({"task": "lm", "position_embedding_types": ["none"]}, "position_embedding_types"),
    ({"task": "passkey", "mixed_length": True}, "mixed_length"),
    ({"task": "passkey", "finetune": True}, "finetune"),
    ({"task": "passkey", "eval_samples": 0}, "eval_samples"),
    ({"task": "passkey", "eval_lengths": [4, 64]}, "eval_lengths"),
    ({"task": "sorting"}, "task"),
    ({"task": "mqar", "max_train_steps": 100, "copy_warmup_steps": 100}, "copy_warmup_steps"),
    ({"task": "mqar", "copy_warmup_steps": -1}, "copy_warmup_steps"),
    ({"task": "mqar", "train_length": 6, "num_kv_pairs": 1, "copy_warmup_steps": 1, "eval_lengths": [6],
      "mixed_length_splits": [1, 2]}, "copy_warmup_steps"),
])
def test_bad_task_flags_name_the_flag(kwargs, flag):
    with pytest.raises(FlagError) as caught:
        LengthGenArguments(**kwargs)
    assert caught.value.flag == flag


def test_task_defaults_and_axes():
    lm = LengthGenArguments()
    assert (lm.train_length, lm.max_train_steps, lm.hidden_dropout_prob, lm.position_embedding_types) == (
        64, 400, 0.1, ["rope"])
    assert "gau_flash" not in lm.variants and lm.eval_lengths == [16, 32, 64, 128, 256, 512]
    task = LengthGenArguments(task="passkey")
    assert task.eval_lengths == [task.train_length * r for r in (1, 2, 4, 8, 16, 32, 64)]
    assert task.hidden_dropout_prob == 0.0 and task.position_embedding_types == ["rope", "none"]
    names = [v.name for v in study_variants(task)]
    assert {"gau_flash", "gau_flash+nope", "llama"} <= set(names) and "llama+nope" not in names
    assert len(names) == 2 * len(task.variants) - 1
    # an explicit value stays
    assert LengthGenArguments(task="passkey", max_train_steps=7).max_train_steps == 7
    # the copy warm-up: MQAR's default (at most half the steps), none for passkey, an explicit value stays
    mqar = LengthGenArguments(task="mqar")
    assert (mqar.max_train_steps, mqar.copy_warmup_steps) == (1500, 750)
    assert LengthGenArguments(task="mqar", max_train_steps=100).copy_warmup_steps == 50
    assert LengthGenArguments(task="mqar", copy_warmup_steps=0).copy_warmup_steps == 0
    assert task.copy_warmup_steps == 0 and lm.copy_warmup_steps is None
    config = task_config(get_variant("gau_flash"), {"chunk_size": 16, "attention_normalization": "relu2"}, 64)
    assert config.chunk_size == 16 and config.vocab_size == 64
    with pytest.raises(FlagError, match="stock Llama"):
        from hf_attn_variants.lengthgen.variants import with_position

        with_position(get_variant("llama"), "none")


def test_eval_batches_fit_the_memory_budget():
    class Config:
        model_type, num_attention_heads, hidden_size = "entropy_invariant", 4, 64

    class Model:
        config = Config()

    assert eval_batch_size(64, Model(), 24, 64) == 64
    big = eval_batch_size(4096, Model(), 24, 1000)
    attention = 4 * 3 * 4 * 4096**2  # bytes: float32 × 3 live copies × 4 heads × n²
    assert attention * big <= 24 * 2**30 and 24 <= big <= 32
    assert eval_batch_size(1 << 16, Model(), 1, 64) == 1


def _task(accuracies: dict[str, list[list[float]]]) -> dict:
    """A task entry of the results file with per-seed accuracies at L, 2L, 4L (L = 8)."""
    series = {name: {"points": [{"length": n, "status": "ok", "seeds": seeds,
                                 "accuracy": [sum(seeds) / len(seeds), 0.0]}
                                 for n, seeds in zip((8, 16, 32), rows)]}
              for name, rows in accuracies.items()}
    return {"settings": {"train_length": 8}, "series": series}


def test_claim_verdicts():
    learned = [[1.0, 0.9]]
    task = _task({"a": learned + [[0.5, 0.4], [0.2, 0.1]], "b": learned + [[0.1, 0.1], [0.0, 0.0]],
                  "f": learned + [[0.1, 0.3], [0.0, 0.1]],
                  "c": learned + [[0.0, 0.5], [0.0, 0.1]], "d": [[0.2, 0.3], [0.0, 0.0], [0.0, 0.0]]})
    result, diffs, at_l = verdict(task, "a", "b")
    assert result == "**holds**" and diffs == pytest.approx([0.3, 0.2]) and at_l == (0.95, 0.95)
    assert verdict(task, "b", "a")[0] == "**fails**"
    assert verdict(task, "c", "b")[0] == "not resolved (sign differs between seeds)"
    assert verdict(task, "b", "b")[0] == "not resolved (mean difference below 0.05)"
    assert verdict(task, "d", "b")[0] == "not resolved (not learned at L)"
    assert verdict(task, "f", "b")[0] == "**holds** (1 of 2 seeds; equal in the other)"
    # MQAR with 2 pairs: answering by elimination (no key bound to its value) scores 0.75; learned means
    # halfway from there to 1, 0.875
    assert elimination(2) == 0.75 and elimination(4) == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    task["settings"].update(task="mqar", num_kv_pairs=2)
    task["series"]["e"] = _task({"e": [[0.85, 0.85], [0.0, 0.0], [0.0, 0.0]]})["series"]["e"]
    assert verdict(task, "a", "b")[0] == "**holds**"
    assert verdict(task, "e", "b")[0] == "not resolved (not learned at L)"


@pytest.mark.parametrize("task", ["passkey", "mqar"])
def test_quick_task_study_writes_results_and_plot(tmp_path, task):
    out = tmp_path / task
    argv = ["lengthgen", "--task", task, "--quick", "--output_dir", str(out), "--num_threads", "1",
            "--disable_tqdm"]
    assert main(argv) == 0
    report = json.loads((out / "results.json").read_text())
    assert report["args"]["eval_lengths"] == [16, 32, 64]
    summary = {(r["series"], r["length"]): r for r in report["summary"]}
    assert {s for s, _ in summary} == {"ei_entropy_invariant", "synthesizer_random_vanilla",
                                        "ei_entropy_invariant+nope", "synthesizer_random_vanilla+nope"}
    assert summary[("synthesizer_random_vanilla", 64)]["status"] == "n/a (> max_position_embeddings = 32)"
    for row in summary.values():
        if row["status"] == "ok":
            assert 0.0 <= row["accuracy_mean"] <= 1.0 and row["sequences"] == 4 and row["n_seeds"] == 1
    assert json.loads((out / "runs/ei_entropy_invariant+nope/seed_0/result.json").read_text())[
        "config_fields"]["position_embedding_type"] == "none"
    assert (out / "lengthgen_" f"{task}.png").stat().st_size > 10_000
    markdown = (out / "results.md").read_text()
    assert markdown.count("\n| `") == 4
    assert markdown.startswith("# passkey: exact-match accuracy" if task == "passkey" else
                               "# mqar: accuracy per query")
    assert ("3 steps (the first 1 on the copy warm-up) × batch 4" in markdown) == (task == "mqar")
    assert main(argv) == 0  # rerun: every run reused
    assert json.loads((out / "results.json").read_text())["skipped_runs"] == 4
    if task == "passkey":  # what scripts/run_retrieval_study.sh runs: the repository's tools/publish_study.py
        assert publish_study(["retrieval", "retrieval-test", str(out / "results.json"), "--command", "test",
                              "--root", str(tmp_path), "--plot", str(tmp_path / "plot.png")]) == 0
        path = tmp_path / "docs" / "results" / "retrieval-test.json"
    else:
        path = publish_retrieval([out / "results.json"], "retrieval-test", root=tmp_path, command="test",
                                 plot=tmp_path / "plot.png")
    data = load_results(tmp_path, "retrieval-test")
    assert path.is_file() and data["kind"] == "retrieval" and (tmp_path / "plot.png").stat().st_size > 10_000
    text = render_markdown(tmp_path, f"<!-- results: retrieval-test {task} -->\n<!-- /results -->\n"
                                     "<!-- results: retrieval-test claims -->\n<!-- /results -->\n")
    assert "`ei_entropy_invariant+nope`" in text and "| claim | task |" in text
    if task == "passkey":  # the author's table beside a re-run (here: this quick study, L = 16)
        publish_replication(out / "results.json", "retrieval-test", root=tmp_path, command="quick")
        text = render_markdown(tmp_path, "<!-- results: retrieval-test replication -->\n<!-- /results -->\n")
        row = next(line for line in text.splitlines() if "`ei_entropy_invariant+nope`" in line)
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        point = summary[("ei_entropy_invariant+nope", 16)]
        assert cells[1] == f"0.83 / {point['accuracy_mean']:.2f} ± {point['accuracy_std']:.2f}"
        assert cells[3:] == ["0.78 / –", "0.78 / –"]  # 16× and 64× (256, 1024 tokens) were not run
        assert "| L (training length) | 16 |" in text and "| steps × batch | 3 × 4 |" in text


def test_llama_modes_rescale_the_same_weights():
    """The stock Llama is trained once and evaluated three ways on the same weights: scope ``beyond`` equals
    SDPA up to L and differs beyond it; scope ``all`` differs already at L (rows that see fewer than L
    keys)."""
    from hf_attn_variants.lengthgen.retrieval import build_model, load_mode, plan_task_run, task_spec
    from hf_attn_variants.lengthgen.variants import LLAMA_EVAL_MODES

    args = LengthGenArguments(task="passkey", output_dir="unused", train_length=32, hidden_size=32,
                              num_attention_heads=2, num_hidden_layers=1)
    plan = plan_task_run(get_variant("llama"), 0, args)
    model = build_model(plan, task_spec(args)).eval()
    logits = {}
    for mode in LLAMA_EVAL_MODES:
        model = load_mode(model, plan, mode)
        with torch.no_grad():
            for n in (32, 128):
                logits[mode.name,
                       n] = model(input_ids=make_batch(task_spec(args), n, 0, 0, 2)["input_ids"]).logits
    assert torch.equal(logits["entropy_invariant_beyond_L", 32], logits["sdpa", 32])
    assert not torch.allclose(logits["entropy_invariant_beyond_L", 128], logits["sdpa", 128])
    assert not torch.allclose(logits["entropy_invariant_all", 32], logits["sdpa", 32])


def test_sequences_without_bos_start_with_filler_or_the_key_block():
    spec = TaskSpec("passkey", vocab_size=54, digits=3, bos=False)
    batch = make_batch(spec, 8, seed=0, start=0, count=64)  # one token shorter than with BOS
    ids = batch["input_ids"]
    assert (ids != BOS).all() and (ids[:, 0] == KEY).all()  # no filler fits: the KEY block opens every row
    longer = make_batch(spec, 40, seed=0, start=0, count=64)["input_ids"]
    assert (longer != BOS).all() and (longer[:, 0] >= spec.vocab.filler[0]).any()
    assert longer[:, 0].eq(KEY).any()  # the KEY block may start the sequence
    for row in longer:
        at = int((row == KEY).nonzero())
        assert row[at + 1: at + 4].tolist() == row[-3:].tolist()


def test_nope_every_4_position_scheme_and_its_variants():
    from hf_attn_variants.lengthgen.variants import ModelSize, config_fields, with_position

    variants = ["ei_standard", "ei_entropy_invariant_nope_layers", "gau_softmax", "llama"]
    args = LengthGenArguments(task="passkey", num_hidden_layers=8, variants=variants,
                              position_embedding_types=["rope", "none", "nope_every_4"])
    names = [v.name for v in study_variants(args)]
    assert names == ["ei_standard", "gau_softmax", "llama", "ei_standard+nope", "gau_softmax+nope",
                     "ei_standard+nope_every_4", "ei_entropy_invariant_nope_layers+nope_every_4"]
    hybrid = with_position(get_variant("ei_entropy_invariant_nope_layers"), "nope_every_4")
    fields = config_fields(hybrid, ModelSize(num_hidden_layers=8), 32)
    assert fields["no_rope_layers"] == [1, 1, 1, 0, 1, 1, 1, 0] and "no_rope_interval" not in fields
    config = task_config(hybrid, fields, 64)
    assert config.attention_scale_layers == "no_rope"
    assert config.layer_attention_scale(3) == "entropy_invariant"
    assert config.layer_attention_scale(0) == "standard" and hybrid.position == "nope_every_4"


@pytest.mark.parametrize(("kwargs", "flag", "message"), [
    ({"position_embedding_types": ["nope_every_4"]}, "num_hidden_layers", "needs at least 4 layers"),
    ({"variants": ["ei_entropy_invariant_nope_layers"], "position_embedding_types": ["rope", "none"]},
     "variants", "runs with none of"),
    ({"variants": ["gau_softmax"], "position_embedding_types": ["nope_every_4"], "num_hidden_layers": 4},
     "variants", "runs with none of"),
    ({"weight_decay": -0.1}, "weight_decay", "weight_decay"),
])
def test_bad_hybrid_flags_name_the_flag(kwargs, flag, message):
    with pytest.raises(FlagError, match=message) as caught:
        LengthGenArguments(task="passkey", **kwargs)
    assert caught.value.flag == flag


@pytest.mark.parametrize("flag", [{"task_bos": False}, {"weight_decay": 0.0}, {"copy_warmup_steps": 0},
                                  {"save_models": True}])
def test_task_only_flags_are_refused_for_the_language_model_study(flag):
    with pytest.raises(FlagError) as caught:
        LengthGenArguments(task="lm", **flag)
    assert caught.value.flag == next(iter(flag))


def test_quick_hybrid_study_keeps_its_models_and_entropy_measures_them(tmp_path):
    """The hybrid study's ``--quick`` run (what scripts/run_hybrid_study.sh runs at full size), its models
    kept for ``hf-attn-variants entropy``; a run whose model is missing is redone."""
    out = tmp_path / "hybrid"
    argv = ["lengthgen", "--task", "passkey", "--quick", "--output_dir", str(out), "--variants",
            "ei_standard", "ei_entropy_invariant", "ei_entropy_invariant_nope_layers",
            "--position_embedding_types", "rope", "none", "nope_every_4", "--save_models", "--task_bos",
            "false", "--weight_decay", "0", "--num_threads", "1", "--disable_tqdm", "--no_plot"]
    assert main(argv) == 0
    report = json.loads((out / "results.json").read_text())
    series = list(dict.fromkeys(r["series"] for r in report["summary"]))
    assert series == ["ei_standard", "ei_entropy_invariant", "ei_standard+nope", "ei_entropy_invariant+nope",
                      "ei_standard+nope_every_4", "ei_entropy_invariant+nope_every_4",
                      "ei_entropy_invariant_nope_layers+nope_every_4"]
    positions = {r["series"]: r["position_embedding_type"] for r in report["summary"]}
    assert positions["ei_entropy_invariant_nope_layers+nope_every_4"] == "nope_every_4"
    models = [out / "runs" / name / "seed_0" / "model" for name in series]
    config = json.loads((models[-1] / "config.json").read_text())
    assert config["no_rope_layers"] == [1, 1, 1, 0] and config["attention_scale_layers"] == "no_rope"
    output = tmp_path / "entropy.json"
    assert main(["entropy", "--models", *map(str, models), "--names", *series, "--task", "passkey",
                 "--train_length", "16", "--lengths", "16", "32", "64", "--samples", "2",
                 "--output", str(output)]) == 0
    entropy = json.loads(output.read_text())
    assert [entry["name"] for entry in entropy["series"]] == series
    # what scripts/run_hybrid_study.sh and run_entropy_study.sh publish, and the views the docs render
    assert publish_study(["hybrid", "hybrid-test", str(out / "results.json"), "--entropy", str(output),
                          "--command", "test", "--root", str(tmp_path)]) == 0
    data = load_results(tmp_path, "hybrid-test")
    assert data["kind"] == "hybrid" and data["entropy"]["passkey"]["ei_standard"] == [
        round(entropy["series"][0]["slope"], 4)]
    text = render_markdown(tmp_path, "".join(f"<!-- results: hybrid-test {view} -->\n<!-- /results -->\n"
                                             for view in ("setup", "passkey", "claims", "slopes")))
    assert "`ei_entropy_invariant_nope_layers+nope_every_4` − `ei_standard+nope_every_4`" in text
    assert "| passkey | `ei_standard+nope_every_4` |" in text
    assert publish_study(["entropy", str(output), "entropy-test", "--study", str(out / "results.json"),
                          "--command", "test", "--root", str(tmp_path)]) == 0
    text = render_markdown(tmp_path, "<!-- results: entropy-test slopes -->\n<!-- /results -->\n")
    assert "| `ei_entropy_invariant+nope` | entropy_invariant scale, no position embedding | 1 |" in text
    assert "RoPE 1 1 1 0, scaled on NoPE layers only | 1 |" in text and "accuracy beyond L" in text
    assert publish_study(["retrieval", "probe-test", str(out / "results.json"), "--command", "test",
                          "--root", str(tmp_path)]) == 0
    assert publish_study(["replication", str(out / "results.json"), "probe-test", "--key", "probe",
                          "--command", "probe", "--root", str(tmp_path)]) == 0
    text = render_markdown(tmp_path, "<!-- results: probe-test probe -->\n<!-- /results -->\n")
    assert "| AdamW weight decay | 0.0 |" in text and "BOS: no" in text
    assert publish_study(["calibration", "cal-test", str(out / "results.json"), "--command", "calibrate",
                          "--root", str(tmp_path)]) == 0
    text = render_markdown(tmp_path, "<!-- results: cal-test table -->\n<!-- /results -->\n")
    assert "| 2 | 16 | 64 | 4 | 32 | 2 | 3 | 0 | 4 | 0.003 | `ei_standard` |" in text and "| 0.75 |" in text
    import shutil

    shutil.rmtree(models[0])
    assert main(argv) == 0
    rerun = json.loads((out / "results.json").read_text())
    assert rerun["skipped_runs"] == len(series) - 1 and (models[0] / "config.json").is_file()


def test_ctrl_c_during_a_task_run_stops_the_study_before_the_next(tmp_path, monkeypatch, capsys) -> None:
    """Ctrl-C that arrives while a task run evaluates (after its training checked the signal) was swallowed:
    the study went on. Now it stops before the next run: exit 130, one line, the study not marked
    finished; the same command goes on from the finished run."""
    import os
    import signal

    from hf_attn_variants.lengthgen import retrieval_study

    original, calls = retrieval_study.run_task, []

    def interrupted(plan, args, stop):
        calls.append(plan.seed)
        result = original(plan, args, stop)
        if len(calls) == 1:  # once: a second Ctrl-C would end the process at once
            os.kill(os.getpid(), signal.SIGINT)  # as if during its evaluation, after the training loop
        return result

    monkeypatch.setattr(retrieval_study, "run_task", interrupted)
    out = tmp_path / "passkey"
    argv = ["lengthgen", "--task", "passkey", "--quick", "--output_dir", str(out), "--num_threads", "1",
            "--disable_tqdm", "--no_plot", "--variants", "ei_standard", "--position_embedding_types", "rope",
            "--seeds", "0", "1"]
    assert main(argv) == 130
    assert calls == [0]
    assert "interrupted: stopped by SIGINT (Ctrl-C) after run [1/2]" in capsys.readouterr().err
    assert json.loads((out / "run.json").read_text())["finished"] is False
    monkeypatch.undo()
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["skipped_runs"] == 1


def test_a_task_study_refuses_changed_evaluation_flags_rather_than_retraining(tmp_path, capsys) -> None:
    """A lm study re-evaluates its stored models when only an evaluation flag changed (``EVALUATION_ONLY``);
    task runs fingerprint those flags with the training (no model is kept unless ``--save_models``), so the
    same acceptance would retrain every run without a word. Their folder keeps refusing the change."""
    out = tmp_path / "passkey"
    argv = ["lengthgen", "--task", "passkey", "--quick", "--output_dir", str(out), "--num_threads", "1",
            "--disable_tqdm", "--no_plot", "--variants", "ei_standard", "--position_embedding_types", "rope"]
    assert main(argv) == 0
    before = (out / "results.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main([*argv, "--eval_lengths", "16", "32"]) == 2
    error = capsys.readouterr().err
    assert "--eval_lengths" in error and "--overwrite_output_dir" in error, error
    assert (out / "results.json").stat().st_mtime_ns == before
