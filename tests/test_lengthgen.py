"""Tests of ``hf_attn_variants.lengthgen`` (the length-generalisation study tool).

One end-to-end quick study (two variants, a few steps, plus the finetune experiment) checks the files it
writes and that a rerun skips the finished runs; everything else is unit-sized (no training).
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from hf_attn_variants.cli import main
from hf_attn_variants.cli_utils import FlagError
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


# ---------------------------------------------------------------- the audit of lengthgen (tiny studies)
TINY = ("--train_length", "16", "--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads",
        "2", "--per_device_train_batch_size", "4", "--num_threads", "1", "--disable_tqdm", "--no_plot",
        "--max_train_steps", "2", "--num_warmup_steps", "0")
"""The shared tiny settings of the audit's studies (a run trains and evaluates in about a second)."""


def _tiny_study(out, *extra: str) -> list[str]:
    """The argv of a one-variant tiny study in ``out`` (``extra`` appended: argparse keeps the last value)."""
    return ["lengthgen", "--output_dir", str(out), "--variants", "ei_standard", "--eval_lengths", "16", "32",
            *TINY, *extra]


def _corpus_file(path, paragraphs: int = 200):
    """A text file of the embedded corpus's first training paragraphs, one per line."""
    from hf_attn_variants.training import corpus_splits

    path.write_text("\n".join(p.replace("\n", " ") for p in corpus_splits()["train"][:paragraphs]) + "\n")
    return path


def test_fingerprints_cover_the_data_contents_not_only_the_paths(tmp_path, monkeypatch) -> None:
    """Audit 1: an edited validation file changed nothing in the fingerprints (path only), so a rerun with
    more seeds averaged a seed scored on the old text with one scored on the new. Now its sha256 is in the
    evaluation fingerprint, the train file's in the training one, and the embedded corpus's and tokenizer's
    in both."""
    import os

    from hf_attn_variants.lengthgen import study

    train, valid = _corpus_file(tmp_path / "train.txt", 20), tmp_path / "valid.txt"
    valid.write_text("first validation text\n")
    args = LengthGenArguments(output_dir=str(tmp_path / "out"), variants=["ei_standard"], train_length=16,
                              train_file=str(train), validation_file=str(valid))
    before = plan_run(get_variant("ei_standard"), 0, args)
    valid.write_text("another, longer validation text\n")
    os.utime(valid, ns=(1, 1))  # a new modification time whatever the clock's resolution
    edited = plan_run(get_variant("ei_standard"), 0, args)
    assert edited.train_fingerprint == before.train_fingerprint  # only the evaluation is stale
    assert edited.eval_fingerprint != before.eval_fingerprint
    with train.open("a") as stream:
        stream.write("one more paragraph\n")
    assert plan_run(get_variant("ei_standard"), 0, args).train_fingerprint != before.train_fingerprint
    corpus = LengthGenArguments(output_dir=str(tmp_path / "out"), variants=["ei_standard"], train_length=16)
    stock = plan_run(get_variant("ei_standard"), 0, corpus)
    digests = study.embedded_digests()
    for changed in ({"corpus": "other"}, {"tokenizer": "other"}):
        monkeypatch.setattr(study, "embedded_digests", lambda c=changed: {**digests, **c})
        assert plan_run(get_variant("ei_standard"), 0, corpus).train_fingerprint != stock.train_fingerprint


def test_a_train_file_study_evaluates_on_its_held_out_part_and_checks_it_first(tmp_path, capsys) -> None:
    """Audit 2 and 6: with --train_file and no --validation_file the study evaluated on the embedded
    corpus's validation split; now on the 5 % of the file that pretraining holds out (the same rows), and an
    evaluation length that text cannot hold, or an empty --validation_file, is refused naming the flag
    before anything is written (it failed after training, with a traceback)."""
    from hf_attn_variants.lengthgen.evaluation import token_stream, validation_datasets
    from hf_attn_variants.training import embedded_tokenizer

    train = _corpus_file(tmp_path / "train.txt")
    lines = train.read_text().splitlines()
    held_out = validation_datasets(str(train), None)["validation"]["text"]
    assert list(held_out) == lines[len(lines) * 95 // 100:]  # pretrain's split: the last 5 % of the rows
    tokens = len(token_stream(held_out, embedded_tokenizer()))
    out = tmp_path / "study"
    assert main(_tiny_study(out, "--train_file", str(train))) == 0
    rows = json.loads((out / "runs/ei_standard/seed_0/result.json").read_text())["rows"]
    assert {r["length"]: r["blocks"] for r in rows} == {16: tokens // 16, 32: tokens // 32}
    assert main(_tiny_study(tmp_path / "long", "--train_file", str(train), "--eval_lengths", "16",
                            str(tokens + 1))) == 2
    assert f"eval_lengths: {tokens + 1} is longer than the validation text" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert main(_tiny_study(tmp_path / "empty", "--train_file", str(train), "--validation_file",
                            str(empty))) == 2
    assert "validation_file: the validation text (validation_file) holds 0 tokens" in capsys.readouterr().err
    assert not (tmp_path / "long").exists() and not (tmp_path / "empty").exists()


def test_quick_keeps_the_values_given_explicitly() -> None:
    """Audit 3: --quick overwrote flags given with it (--max_train_steps 50 trained 3 steps at L = 16,
    --num_kv_pairs 40 used 2). Its settings now fill only flags left at their default."""
    args = LengthGenArguments(quick=True, max_train_steps=50, train_length=32)
    assert (args.max_train_steps, args.train_length, args.hidden_size) == (50, 32, 32)
    assert args.eval_lengths == [16, 32, 64, 128] and args.max_eval_tokens == 512
    assert LengthGenArguments(quick=True, eval_lengths=[8, 2048]).max_eval_tokens == 2048  # one block fits
    assert LengthGenArguments(task="mqar", quick=True, num_kv_pairs=3).num_kv_pairs == 3
    with pytest.raises(FlagError, match="num_kv_pairs: one mqar example needs 22 tokens") as error:
        LengthGenArguments(task="mqar", quick=True, num_kv_pairs=5)  # refused at L = 16, not replaced by 2
    assert error.value.flag == "num_kv_pairs"
    plain = LengthGenArguments(quick=True)
    assert (plain.max_train_steps, plain.train_length, plain.max_eval_tokens) == (3, 16, 512)


@pytest.mark.parametrize(("kwargs", "flag", "message"), [
    ({"eval_lengths": [16, 64], "max_eval_tokens": 32}, "max_eval_tokens",
     "max_eval_tokens=32 is fewer than the longest of eval_lengths (64)"),
    ({"objective": "clm", "finetune": True}, "finetune", "finetune needs --objective mlm"),
])
def test_evaluation_flags_that_would_be_ignored_are_refused(kwargs, flag, message) -> None:
    """Audit 8 and 10: --max_eval_tokens below an evaluation length was raised silently, and --finetune
    after --objective clm finetuned causally pretrained models bidirectionally; both are refused."""
    with pytest.raises(FlagError, match=re.escape(message)) as error:
        LengthGenArguments(train_length=16, **kwargs)
    assert error.value.flag == flag


def test_checkpoints_of_other_settings_are_not_resumed(tmp_path, tokenizer) -> None:
    """Audit 4: an interrupted run resumed its checkpoint after the training fingerprint changed (a changed
    flag or library default) and stamped the new fingerprint on the mix. A checkpoint is now resumed only
    under the fingerprint it was written with; others are deleted."""
    from hf_attn_variants.lengthgen.study import CHECKPOINT_STAMP, _pretrain_arguments

    args = LengthGenArguments(output_dir=str(tmp_path), variants=["ei_standard"], train_length=16,
                              hidden_size=32, num_attention_heads=2)
    plan = plan_run(get_variant("ei_standard"), 0, args)
    step = plan.model_dir / "checkpoints" / "step_5"
    step.mkdir(parents=True)
    (step / "training_state.json").write_text("{}")
    (plan.run_dir / CHECKPOINT_STAMP).write_text(json.dumps({"fingerprint": plan.train_fingerprint}))
    resumed = _pretrain_arguments(plan, args, tokenizer)
    assert resumed.resume_from_checkpoint == "latest" and not resumed.overwrite_output_dir
    (plan.run_dir / CHECKPOINT_STAMP).write_text(json.dumps({"fingerprint": "other settings"}))
    restarted = _pretrain_arguments(plan, args, tokenizer)
    assert restarted.resume_from_checkpoint is None and restarted.overwrite_output_dir
    assert not step.exists()
    assert read_json(plan.run_dir / CHECKPOINT_STAMP)["fingerprint"] == plan.train_fingerprint


def test_changed_evaluation_settings_reevaluate_without_retraining(tmp_path) -> None:
    """Audit 5: a rerun with another --eval_seed (or eval_lengths, eval_mask_repeats, max_eval_tokens) was
    refused, and only --overwrite_output_dir (deleting the trained models) let it run. Now it re-evaluates the
    stored model."""
    out = tmp_path / "study"
    assert main(_tiny_study(out)) == 0
    run = out / "runs" / "ei_standard" / "seed_0"
    trained = [(run / name).stat().st_mtime_ns for name in ("train.json", "model/model.safetensors")]
    first = read_json(run / "result.json")
    assert main(_tiny_study(out, "--eval_seed", "7", "--eval_lengths", "16", "32", "64")) == 0
    again = read_json(run / "result.json")
    assert [(run / name).stat().st_mtime_ns for name in ("train.json", "model/model.safetensors")] == trained
    assert again["fingerprint"] != first["fingerprint"]
    assert [r["length"] for r in again["rows"]] == [16, 32, 64]
    assert json.loads((out / "run.json").read_text())["arguments"]["eval_seed"] == 7


def _signal_during(monkeypatch, module, name: str) -> list[int]:
    """Make ``module.name``'s first call send this process SIGINT (Ctrl-C) before doing its work; returns the
    list of calls made (for the test to count)."""
    import os

    calls: list[int] = []
    original = getattr(module, name)

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # once: a second Ctrl-C would end the process at once
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted)
    return calls


def test_ctrl_c_during_an_evaluation_stops_the_study_before_the_next_run(tmp_path, monkeypatch, capsys):
    """Audit 7: Ctrl-C during an evaluation was swallowed (the study finished with exit 0, or the next run
    trained a step before exiting 130). Now the study stops after that evaluation: exit 130, one line, the
    finished run kept, the study not marked finished; the same command goes on."""
    from hf_attn_variants.lengthgen import study

    out = tmp_path / "study"
    calls = _signal_during(monkeypatch, study, "evaluate_run")
    assert main(_tiny_study(out, "--seeds", "0", "1")) == 130
    assert len(calls) == 1 and not (out / "runs" / "ei_standard" / "seed_1").exists()
    assert "interrupted: stopped by SIGINT (Ctrl-C) after run [1/2]" in capsys.readouterr().err
    assert (out / "runs" / "ei_standard" / "seed_0" / "result.json").is_file()
    assert json.loads((out / "run.json").read_text())["finished"] is False
    monkeypatch.undo()
    assert main(_tiny_study(out, "--seeds", "0", "1")) == 0
    assert json.loads((out / "results.json").read_text())["skipped_runs"] == 1


def test_ctrl_c_during_the_finetune_phase_stops_the_study(tmp_path, monkeypatch, capsys) -> None:
    """Audit 7: Ctrl-C during the finetune experiment was swallowed (everything ran, exit 0). Now the
    experiment stops before its next finetuning: exit 130, the study not marked finished."""
    from hf_attn_variants.lengthgen import finetune_lengths

    def fake_finetune(args, task, condition, variant_name, overrides, seed, *rest):
        import os

        calls.append(condition)
        if len(calls) == 1:  # once: a second Ctrl-C would end the process at once
            os.kill(os.getpid(), signal.SIGINT)
        return {"task": task["level"], "condition": condition, "pretrained_variant": variant_name,
                "seed": seed, "accuracy": 0.5, "f1": 0.5}

    calls: list[str] = []
    monkeypatch.setattr(finetune_lengths, "finetune_one", fake_finetune)
    out = tmp_path / "study"
    argv = ["lengthgen", "--output_dir", str(out), "--variants", "gau_softmax", "--eval_lengths", "16", *TINY,
            "--finetune", "--finetune_tasks", "sequence"]
    assert main(argv) == 130
    assert calls == ["softmax"]  # the from-scratch condition after it did not start
    assert "interrupted: stopped by SIGINT (Ctrl-C) before finetuning" in capsys.readouterr().err
    assert json.loads((out / "run.json").read_text())["finished"] is False


def test_ctrl_c_inside_a_finetuning_stops_the_study_without_promising_a_resume(tmp_path, monkeypatch,
                                                                             capsys) -> None:
    """A stop inside a finetuning ends it with Trainer's checkpoint written, and pretrain's line promised to
    resume from it; the study redoes that finetuning (``overwrite_output_dir``), so it now says so."""
    from hf_attn_variants.lengthgen import finetune_lengths
    from hf_attn_variants.training.preemption import TrainingPreempted

    def stopped_inside(args, task, condition, variant_name, overrides, seed, run_dir, *rest):
        raise TrainingPreempted("finetune", "SIGINT", 1, run_dir / "model" / "checkpoint-1")

    monkeypatch.setattr(finetune_lengths, "finetune_one", stopped_inside)
    out = tmp_path / "study"
    argv = ["lengthgen", "--output_dir", str(out), "--variants", "gau_softmax", "--eval_lengths", "16", *TINY,
            "--finetune", "--finetune_tasks", "sequence"]
    assert main(argv) == 130
    error = capsys.readouterr().err
    assert "while finetuning softmax seed 0 (sequence), which the next run of the command redoes" in error
    assert "resume" not in error, error
    assert json.loads((out / "run.json").read_text())["finished"] is False


def test_a_diverged_run_is_named_and_marked(tmp_path, capsys, caplog) -> None:
    """Audit 9: a run whose loss became NaN showed only "–" cells and exit 0 with nothing naming it (and a
    training loss that became NaN ended the study in a traceback). Both are now named in a warning and in
    results.md, and the study goes on."""
    out = tmp_path / "study"
    argv = ["lengthgen", "--output_dir", str(out), "--variants", "gau_softmax", "ei_standard",
            "--eval_lengths", "16", "32", *TINY, "--max_train_steps", "3", "--num_warmup_steps", "30",
            "--learning_rate", "1e6"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "gau_softmax seed 0 (in training), ei_standard seed 0 (at lengths [16, 32])" in printed.out
    assert "ei_standard seed 0: diverged" in caplog.text and "gau_softmax seed 0: diverged" in caplog.text
    markdown = (out / "results.md").read_text()
    assert "**Diverged**" in markdown and "`ei_standard` seed 0 (at lengths [16, 32])" in markdown
    assert "diverged in training (loss nan at step" in markdown  # gau_softmax's cells
    assert read_json(out / "runs" / "ei_standard" / "seed_0" / "result.json")["diverged"] == [16, 32]


def test_a_resumed_run_reports_the_seconds_of_every_segment(tmp_path, tokenizer, monkeypatch) -> None:
    """A run stopped by a signal and resumed reported only the resumed segment's training seconds; the
    stopped segment's time now waits in the checkpoint stamp and is added."""
    import hf_attn_variants.training as training
    from hf_attn_variants.lengthgen.study import CHECKPOINT_STAMP, train_run
    from hf_attn_variants.training.preemption import TrainingPreempted
    from hf_attn_variants.training.pretrain import PretrainResult

    args = LengthGenArguments(output_dir=str(tmp_path), variants=["ei_standard"], train_length=16,
                              hidden_size=32, num_attention_heads=2)
    plan = plan_run(get_variant("ei_standard"), 0, args)
    checkpoint = plan.model_dir / "checkpoints" / "step_1"

    def stopped(pretrain_args, stop):
        checkpoint.mkdir(parents=True)
        (checkpoint / "training_state.json").write_text("{}")
        time.sleep(0.3)
        raise TrainingPreempted("pretrain", "SIGTERM", 1, checkpoint)

    monkeypatch.setattr(training, "pretrain", stopped)
    with pytest.raises(TrainingPreempted):
        train_run(plan, args, tokenizer)
    assert read_json(plan.run_dir / CHECKPOINT_STAMP)["seconds"] >= 0.3
    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"step": 2, "loss": 1.0}) + "\n")

    def resumed(pretrain_args, stop):
        assert pretrain_args.resume_from_checkpoint == "latest"
        return PretrainResult(str(plan.model_dir), 2, {}, str(log))

    monkeypatch.setattr(training, "pretrain", resumed)
    assert train_run(plan, args, tokenizer)["seconds"] >= 0.3
    assert not (plan.run_dir / CHECKPOINT_STAMP).exists()
