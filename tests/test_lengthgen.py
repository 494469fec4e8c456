"""Tests of ``hf_attn_variants.lengthgen`` (the length-generalisation study tool).

One end-to-end quick study (two variants, a few steps, plus the finetune experiment) checks the files it
writes and that a rerun skips the finished runs; everything else is unit-sized (no training).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest
import torch

from hf_attn_variants.cli import main
from hf_attn_variants.lengthgen import (
    LengthGenArguments,
    build_topic_task,
    config_fields,
    evaluate_at_lengths,
    get_variant,
    na_status,
    summarize,
)
from hf_attn_variants.lengthgen.evaluation import blocks_at
from hf_attn_variants.lengthgen.results import (
    add_deltas,
    atomic_write_json,
    format_cell,
    markdown_table,
    read_json,
)
from hf_attn_variants.lengthgen.runfolders import claim
from hf_attn_variants.lengthgen.study import load_for_eval, parameter_counts, plan_run
from hf_attn_variants.lengthgen.variants import LLAMA_EVAL_MODES, ModelSize
from hf_attn_variants.training import evaluate_lm
from tests.utils import NoFloat64


@pytest.fixture(scope="module")
def tokenizer():
    from hf_attn_variants.training import embedded_tokenizer

    return embedded_tokenizer()


def test_quick_study_writes_results_plot_and_resumes(tmp_path):
    """`lengthgen --quick` (two variants, 3 steps): JSON, CSV, markdown, plot, n/a points, finetune table;
    a second run reuses every finished run and rewrites nothing of theirs."""
    out = tmp_path / "study"
    argv = ["lengthgen", "--quick", "--output_dir", str(out), "--num_threads", "1", "--disable_tqdm",
            "--variants", "gau_relu2_dynamic+mixed", "synthesizer_random_vanilla", "--finetune"]
    started = time.perf_counter()
    assert main(argv) == 0
    first = time.perf_counter() - started
    for name in ("results.json", "results.csv", "summary.csv", "results.md", "lengthgen_mlm.png",
                 "finetune/sequence/finetune.json", "finetune/token/finetune.csv"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "lengthgen_clm.png").exists()  # no causal variant in this study
    report = json.loads((out / "results.json").read_text())
    assert report["args"]["train_length"] == 16 and report["args"]["eval_lengths"] == [8, 16, 32, 64]
    by_point = {(r["series"], r["length"]): r for r in report["summary"]}
    synth_na = by_point[("synthesizer_random_vanilla", 64)]
    assert synth_na["status"] == na_status(32) and synth_na["loss_mean"] is None
    assert by_point[("synthesizer_random_vanilla", 32)]["status"] == "ok"
    for row in by_point.values():
        if row["status"] == "ok":
            assert math.isfinite(row["loss_mean"]) and 0.0 <= row["accuracy_mean"] <= 1.0
            assert row["blocks"] >= 1 and row["tokens"] > 0
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("series,variant,model_type,mode,objective,seed,length")
    assert len(csv_lines) == 1 + 2 * 4
    assert "n/a (> max_position_embeddings = 32)" in (out / "results.md").read_text()
    variants = {v["variant"]: v for v in report["variants"]}
    assert variants["gau_relu2_dynamic+mixed"]["parameters"]["non_embedding"] > 0
    for level in ("sequence", "token"):
        finetune = report["finetune"][level]
        assert {r["condition"] for r in finetune["rows"]} == {
            "relu2/dynamic + mixed-length pretraining", "softmax_plus, no pretraining"}
        assert all(0.0 <= r["accuracy"] <= 1.0 and r["task"] == level for r in finetune["rows"])
        assert finetune["max_seq_length"] <= 16  # inputs never longer than L
    pretrain_args = json.loads(
        (out / "runs/gau_relu2_dynamic+mixed/seed_0/model/pretrain_args.json").read_text())
    assert pretrain_args["mixed_length_splits"] == [1, 2, 4]

    result_file = out / "runs" / "synthesizer_random_vanilla" / "seed_0" / "result.json"
    stamp = result_file.stat().st_mtime_ns
    started = time.perf_counter()
    assert main(argv) == 0
    second = time.perf_counter() - started
    report = json.loads((out / "results.json").read_text())
    assert report["skipped_runs"] == 2
    assert result_file.stat().st_mtime_ns == stamp
    assert second < first
    assert not list(out.rglob("*.tmp"))


def test_synthesizer_points_beyond_its_length_are_na(tokenizer):
    """Lengths above max_position_embeddings are reported, not run; summaries and tables keep the text."""
    from hf_attn_variants import SynthesizerConfig, SynthesizerForMaskedLM

    config = SynthesizerConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    model = SynthesizerForMaskedLM(config).eval()
    stream = list(range(5, 200))
    rows = evaluate_at_lengths(model, stream, [8, 16, 32], objective="mlm", tokenizer=tokenizer,
                               train_length=8, max_length=16, max_tokens=96)
    assert [r["status"] for r in rows] == ["ok", "ok", na_status(16)]
    assert rows[2]["blocks"] == 0 and "loss" not in rows[2]
    assert all(math.isfinite(r["loss"]) for r in rows[:2])
    summary = summarize([{**r, "series": "s", "variant": "s", "model_type": "synthesizer", "mode": "default",
                          "objective": "mlm", "seed": 0} for r in rows])
    assert summary[2]["status"] == na_status(16) and summary[2]["n_seeds"] == 0
    table = markdown_table(summary, "loss", [8, 16, 32], train_length=8)
    assert "| 8 (L) |" in table and "n/a (> max_position_embeddings = 16)" in table
    # the Synthesizer variant's limit is synthesizer_length_factor × L
    fields = config_fields(get_variant("synthesizer_random_vanilla"),
                           ModelSize(synthesizer_length_factor=2), 64)
    assert fields["max_position_embeddings"] == 128


def test_evaluation_and_entropy_sums_take_float32_where_float64_is_missing(monkeypatch) -> None:
    """On MPS (no float64) the evaluation's loss sums and the attention entropy are float32
    (``widest_dtype``): the same metrics within float32's rounding; the counts are int64 on every device
    (float32 counted exactly only to 2²⁴ = 16.8M tokens)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_attn_variants.entropy import measure
    from hf_attn_variants.training import evaluation

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(config)
    blocks = blocks_at(list(range(1, 49)) * 2, 24)
    attention = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    wide = (evaluate_lm(model, blocks, objective="clm", train_length=8), measure.row_entropy(attention))
    monkeypatch.setattr(evaluation, "widest_dtype", lambda device: torch.float32)
    monkeypatch.setattr(measure, "widest_dtype", lambda device: torch.float32)
    with NoFloat64():  # as on MPS
        narrow = (evaluate_lm(model, blocks, objective="clm", train_length=8), measure.row_entropy(attention))
        logits = torch.zeros(1, 3, 5)
        logits[0, 0, 1] = logits[0, 2, 0] = 5.0  # the first target right, the last wrong
        sums, counts = evaluation._target_sums(logits, torch.tensor([[1, -100, 2]]), 1)
    assert sums.dtype == torch.float32 and counts.dtype == torch.int64 and counts.tolist() == [1, 2, 1]
    assert narrow[1].dtype == torch.float32 and wide[1].dtype == torch.float64
    torch.testing.assert_close(narrow[1], wide[1].float())
    for key in ("loss", "accuracy", "loss_beyond_train"):
        assert math.isclose(narrow[0][key], wide[0][key], rel_tol=1e-6), key
    for key in ("tokens", "tokens_beyond_train"):
        assert narrow[0][key] == wide[0][key], key


def test_causal_evaluation_counts_predictions_beyond_training_length():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8)
    model = LlamaForCausalLM(config)
    blocks = blocks_at(list(range(1, 49)) * 2, 24)
    result = evaluate_lm(model, blocks, objective="clm", train_length=8)
    assert result["blocks"] == 4 and result["tokens"] == 4 * 23
    assert result["tokens_beyond_train"] == 4 * (23 - 8)
    assert math.isclose(result["perplexity"], math.exp(result["loss"]), rel_tol=1e-9)
    short = evaluate_lm(model, blocks_at(list(range(1, 49)), 8), objective="clm", train_length=8)
    assert short["tokens_beyond_train"] == 0 and short["loss_beyond_train"] is None
    # nothing to score is an error or NaN, never a perfect loss of 0 (perplexity 1)
    for bad, message in (({"batch_size": -1}, "batch_size must be an integer >= 1, got -1"),
                         ({"batch_size": 0}, "batch_size must be"),
                         ({"max_blocks": -1}, "max_blocks must be"),
                         ({"mask_repeats": 1.5}, "mask_repeats must be an integer >= 1, got 1.5")):
        with pytest.raises(ValueError, match=message):
            evaluate_lm(model, blocks, objective="clm", **bad)
    with pytest.raises(ValueError, match="blocks of 1 token give no next-token target"):
        evaluate_lm(model, torch.ones(3, 1, dtype=torch.long), objective="clm")
    from datasets import Dataset

    packed = evaluate_lm(model, Dataset.from_dict({"input_ids": [[1, 2]], "position_ids": [[0, 0]]}),
                         objective="clm")  # two one-token documents: no next token to predict
    assert packed["tokens"] == 0 and math.isnan(packed["loss"]) and math.isnan(packed["perplexity"])


def test_llama_variant_is_evaluated_with_three_attention_modes(tmp_path):
    """The same stock-Llama weights load as sdpa and as entropy_invariant with scope "all" and "beyond"
    (base_length = L): "all" changes rows within L, "beyond" is exactly sdpa up to L and sharpens beyond."""
    from transformers import LlamaConfig, LlamaForCausalLM

    args = LengthGenArguments(output_dir=str(tmp_path), variants=["llama"], train_length=8, hidden_size=16,
                              num_attention_heads=2)
    plan = plan_run(get_variant("llama"), 0, args)
    assert plan.objective == "clm" and [plan.variant.series(m) for m in plan.variant.eval_modes] == [
        "llama/sdpa", "llama/entropy_invariant_all", "llama/entropy_invariant_beyond_L"]
    assert plan.variant.eval_modes == LLAMA_EVAL_MODES
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=40, **plan.fields)).save_pretrained(plan.model_dir)
    sdpa, scaled, beyond = (load_for_eval(plan, mode) for mode in LLAMA_EVAL_MODES)
    assert sdpa.config._attn_implementation == "sdpa"
    assert scaled.config._attn_implementation == "entropy_invariant" and scaled.config.base_length == 8
    assert scaled.config.entropy_invariant_scope == "all"
    assert beyond.config._attn_implementation == "entropy_invariant" and beyond.config.base_length == 8
    assert beyond.config.entropy_invariant_scope == "beyond"
    ids = torch.randint(0, 40, (1, 32))
    with torch.no_grad():
        a, b, c = sdpa(ids).logits, scaled(ids).logits, beyond(ids).logits
    # scope "all": every row's factor is log max(n, 16) / log 8 > 1, so rows with >= 2 keys differ already
    # within L
    assert not torch.allclose(a[:, 1:8], b[:, 1:8], atol=1e-6)
    # scope "beyond" at L = 8: rows 0…7 see <= 8 keys (factor 1, exactly sdpa), later rows are sharpened
    torch.testing.assert_close(c[:, :8], a[:, :8], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(c[:, 8:], a[:, 8:], atol=1e-6)
    # the modes are part of the evaluation fingerprint, not of the training one
    other = LengthGenArguments(output_dir=str(tmp_path), variants=["llama"], train_length=8, hidden_size=16,
                               num_attention_heads=2, eval_lengths=[4, 8])
    changed = plan_run(get_variant("llama"), 0, other)
    assert changed.train_fingerprint == plan.train_fingerprint
    assert changed.eval_fingerprint != plan.eval_fingerprint
    # non-embedding parameters: Transformers' own count (the tied LM head counts with the embedding)
    counts = parameter_counts(sdpa)
    assert counts["total"] - counts["non_embedding"] == 40 * 16
    assert counts["non_embedding"] == sdpa.num_parameters(exclude_embeddings=True)


def test_arguments_validation_and_mixed_copies():
    args = LengthGenArguments(variants=["gau_relu2_dynamic", "ei_standard"], mixed_length=True,
                              train_length=64)
    assert args.variants == ["gau_relu2_dynamic", "ei_standard", "gau_relu2_dynamic+mixed",
                             "ei_standard+mixed"]
    assert args.eval_lengths == [16, 32, 64, 128, 256, 512]
    with pytest.raises(ValueError, match="variants"):
        LengthGenArguments(variants=["gau_relu3"])
    with pytest.raises(ValueError, match="eval_lengths"):
        LengthGenArguments(eval_lengths=[1, 64])
    with pytest.raises(ValueError, match="mixed_length_splits"):
        LengthGenArguments(train_length=64, mixed_length_splits=[3])
    with pytest.raises(ValueError, match="seeds"):
        LengthGenArguments(seeds=[0, 0])
    with pytest.raises(ValueError, match="hidden_size"):
        LengthGenArguments(hidden_size=30, num_attention_heads=4)
    assert main(["lengthgen", "--variants", "nope"]) == 2
    from hf_attn_variants.training import PretrainArguments

    with pytest.raises(ValueError, match="mixed_length_splits"):
        PretrainArguments(output_dir="x", model_type="gau", max_seq_length=64, mixed_length_splits=[3])


def test_variant_configs_are_comparable():
    """Same width everywhere; GAU gets 2× layers; base_length = L; the Llama's SwiGLU has ~2/3 of the FFN."""
    size = ModelSize(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    ei = config_fields(get_variant("ei_ssmax"), size, 64)
    gau = config_fields(get_variant("gau_relu2_fixed"), size, 64)
    llama = config_fields(get_variant("llama"), size, 64)
    assert ei["attention_scale"] == "ssmax" and ei["base_length"] == 64 and ei["intermediate_size"] == 256
    assert gau["num_hidden_layers"] == 4 and gau["relu2_length"] == "fixed" and gau["base_length"] == 64
    assert "num_attention_heads" not in gau
    assert llama["intermediate_size"] == 168 and llama["max_position_embeddings"] == 64
    assert "initializer_range" not in gau and "gau_init" not in gau  # the configs' defaults unless asked for
    assert config_fields(get_variant("gau_softmax"), ModelSize(initializer_range=0.1),
                         64)["initializer_range"] == 0.1
    with pytest.raises(ValueError, match="unknown variant"):
        get_variant("gau_relu2_dynamic+mixed+mixed")


def test_summaries_average_over_seeds_and_writes_are_atomic(tmp_path):
    rows = [{"series": "v", "variant": "v", "model_type": "gau", "mode": "default", "objective": "mlm",
             "seed": seed, "length": 64, "ratio": 1.0, "status": "ok", "loss": loss, "accuracy": 0.5}
            for seed, loss in ((0, 2.0), (1, 4.0))]
    (entry,) = summarize(rows)
    assert (entry["n_seeds"] == 2 and entry["loss_mean"] == 3.0
            and math.isclose(entry["loss_std"], math.sqrt(2)))
    assert entry["loss_min"] == 2.0 and entry["loss_max"] == 4.0
    assert format_cell(entry, "loss") == "3.000 ± 1.414" and entry["loss_n"] == 2
    # a seed whose loss is not finite is left out of the mean, and the cell says so (n_seeds counts it)
    (partial,) = summarize([*rows, {**rows[0], "seed": 2, "loss": float("nan")}])
    assert (partial["n_seeds"], partial["loss_n"], partial["accuracy_n"]) == (3, 2, 3)
    assert format_cell(partial, "loss") == "3.000 ± 1.414 (2 of 3 seeds)"
    assert format_cell(partial, "accuracy") == "0.500 ± 0.000"
    longer = [{**row, "length": 128, "loss": row["loss"] + 0.5 + row["seed"]} for row in rows]
    deltas = {(r["seed"], r["length"]): r["loss_delta"] for r in add_deltas(rows + longer, 64)}
    assert deltas == {(0, 64): 0.0, (1, 64): 0.0, (0, 128): 0.5, (1, 128): 1.5}
    atomic_write_json(tmp_path / "r.json", {"x": float("nan"), "y": [1.0]})
    assert read_json(tmp_path / "r.json") == {"x": None, "y": [1.0]}
    assert read_json(tmp_path / "missing.json") is None
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_topic_task_is_short_labelled_and_split_by_paragraph(tmp_path):
    task = build_topic_task(tmp_path, num_topics=4, words=12)
    assert len(task["topics"]) == 4 and task["train_samples"] > 100 and task["validation_samples"] > 30
    rows = {split: [json.loads(line) for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
            for split in ("train", "validation")}
    assert {r["label"] for r in rows["train"]} == set(task["topics"])
    assert all(6 <= len(r["text"].split()) <= 12 for r in rows["train"] + rows["validation"])
    assert 1 / 4 <= task["majority_baseline_accuracy"] < 1
    with pytest.raises(ValueError, match="finetune_topics"):
        build_topic_task(tmp_path, num_topics=1)
    token_task = build_topic_task(tmp_path / "token", num_topics=4, words=12, level="token")
    first = json.loads((tmp_path / "token" / "train.jsonl").read_text().splitlines()[0])
    topic = first["ner_tags"][0][2:]
    assert first["ner_tags"] == [f"B-{topic}"] + [f"I-{topic}"] * (len(first["tokens"]) - 1)
    assert token_task["train_samples"] == task["train_samples"]


def test_overrides_reach_training_as_a_dict(tmp_path, tokenizer, monkeypatch):
    """The family variants' config fields go to ``PretrainArguments`` as a dict (no k=v string round trip),
    and the fingerprint of a run covers the resolved config (library defaults included)."""
    from hf_attn_variants.lengthgen.study import _pretrain_arguments
    from hf_attn_variants.training import build_config

    args = LengthGenArguments(output_dir=str(tmp_path), variants=["synthesizer_random_vanilla"],
                              train_length=16, hidden_size=32, num_attention_heads=2)
    plan = plan_run(get_variant("synthesizer_random_vanilla"), 0, args)
    pretrain_args = _pretrain_arguments(plan, args, tokenizer)
    assert pretrain_args.config_overrides == plan.fields and isinstance(pretrain_args.config_overrides, dict)
    assert pretrain_args.config_overrides is not plan.fields  # a copy: the plan is not changed by training
    config = build_config("synthesizer", config_overrides=pretrain_args.config_overrides, tokenizer=tokenizer,
                          max_seq_length=16)
    assert config.synthesizer_components == ["random", "vanilla"] and config.max_position_embeddings == 32
    # a library default (here GAU's gau_init, not among the study's fields) changes the training fingerprint
    from hf_attn_variants import GAUConfig

    gau = plan_run(get_variant("gau_softmax"), 0, args)
    monkeypatch.setattr(GAUConfig.__init__, "__defaults__", tuple(
        "flash" if value == "gau_alpha" else value for value in GAUConfig.__init__.__defaults__))
    assert "gau_init" not in gau.fields
    assert plan_run(get_variant("gau_softmax"), 0, args).train_fingerprint != gau.train_fingerprint


HOLD_CLAIM = """
import sys, time
from hf_attn_variants.lengthgen.runfolders import claim
with claim(sys.argv[1]) as mine:
    print("held" if mine else "refused", flush=True)
    time.sleep(120)
"""


def _holder(folder):
    """A child process that claims ``folder`` and sleeps; returned once it holds the claim."""
    child = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(folder)], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_run_folders_are_claimed_by_one_process_and_released_on_crash(tmp_path):
    """Parallel workers: a folder held by another process (or by another claim of this one) is refused; a
    claim is released when its block ends, and when its process is killed (no stale claim)."""
    folder = tmp_path / "run"
    with claim(folder) as first:
        assert first and (folder / ".lock").exists()
        with claim(folder) as second:  # a second claim in the same process is refused too
            assert not second
    with claim(folder) as again:  # released at the end of the block
        assert again
    child = _holder(folder)
    try:
        with claim(folder) as mine:
            assert not mine
        with claim(tmp_path / "other") as other:  # other runs stay free
            assert other
    finally:
        child.send_signal(signal.SIGKILL)  # a crashed worker: its lock file stays, its claim does not
        child.wait(timeout=30)
    assert (folder / ".lock").exists()
    with claim(folder) as taken:
        assert taken


def test_ctrl_c_checkpoints_the_run_in_training_and_the_same_command_resumes(tmp_path) -> None:
    """Ctrl-C (SIGINT) during a run's training, as SIGTERM: one "interrupted:" line, exit status 130, the
    run's checkpoint; the same command resumes from it. It once ended in a KeyboardInterrupt traceback and
    lost the steps since the last timed checkpoint."""
    command = [sys.executable, "-m", "hf_attn_variants", "lengthgen", "--output_dir", str(tmp_path / "study"),
               "--variants", "gau_softmax", "--train_length", "16", "--eval_lengths", "16", "32",
               "--max_train_steps", "3000", "--hidden_size", "32", "--num_hidden_layers", "1",
               "--num_attention_heads", "2", "--disable_tqdm", "--no_plot"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "study" / "runs" / "gau_softmax" / "seed_0" / "model" / "train_log.jsonl"
    deadline = time.monotonic() + 240
    while not log.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # training has logged a step: the run's loop checks the signal
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=240)
    assert child.returncode == 130 and "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("hf-attn-variants lengthgen: interrupted: stopped by SIGINT (Ctrl-C) after"), line
    checkpoints = sorted(log.parent.glob("checkpoints/step_*"))
    assert len(checkpoints) == 1, checkpoints
    step = int(checkpoints[0].name.removeprefix("step_"))
    assert step < 3000
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoints[0]} (step {step})" in resumed.stderr
