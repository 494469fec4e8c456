"""finetune: metrics, sequence/token classification from local files, early stopping, LoRA save/reload."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, TrainingArguments

from hf_attn_variants import FAMILIES
from hf_attn_variants.cli import main
from hf_attn_variants.training import build_config, embedded_tokenizer
from hf_attn_variants.training.finetune import LORA_TARGETS, FinetuneArguments, finetune, load_finetuned
from hf_attn_variants.training.metrics import accuracy, entity_scores, get_entities, macro_f1
from tests.test_pretrain import tiny_overrides

POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "wrong"]
FILLER = ["the", "a", "value", "of", "function", "class", "list", "string", "object", "module", "is",
          "returns", "this", "that"]


# ------------------------------------------------------------------ metrics
def test_entities_follow_conlleval_rules() -> None:
    assert get_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    # IOB1: I- after O starts
    assert get_entities(["I-PER", "I-PER", "B-PER"]) == [("PER", 0, 1), ("PER", 2, 2)]
    assert get_entities(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]  # a type change splits chunks
    assert get_entities(["S-LOC", "B-ORG", "E-ORG", "O"]) == [("LOC", 0, 0), ("ORG", 1, 2)]  # BIOES


def test_entity_scores_precision_recall_f1() -> None:
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["O", "B-LOC"]]  # 1 correct of 2 predicted; 3 gold
    scores = entity_scores(pred, gold, per_type=True)
    assert scores["precision"] == pytest.approx(0.5) and scores["recall"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    assert (scores["accuracy"] == pytest.approx(4 / 6) and scores["PER_f1"] == 1.0
            and scores["ORG_number"] == 1)
    assert entity_scores([["O"]], [["O"]])["f1"] == 0.0  # undefined → 0, never NaN


def test_accuracy_and_macro_f1() -> None:
    assert accuracy([1, 0, 1, 1], [1, 0, 0, 1]) == 0.75
    assert macro_f1([1, 1, 1, 1], [1, 0, 1, 0]) == pytest.approx((2 / 3 + 0) / 2)
    with pytest.raises(ValueError, match="differ in length"):
        accuracy([1], [1, 2])


# ------------------------------------------------------------------ data
def write_sentiment(folder: Path, rows: int, seed: int) -> str:
    """A keyword task: the label is positive iff the sentence holds a positive word."""
    rng = random.Random(seed)
    path = folder / f"sentiment-{seed}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence", "label"])
        for _ in range(rows):
            label = rng.randint(0, 1)
            words = rng.sample(FILLER, 5)
            words.insert(rng.randint(0, 5), rng.choice(POSITIVE if label else NEGATIVE))
            writer.writerow([" ".join(words), ["negative", "positive"][label]])
    return str(path)


def write_ner(folder: Path, rows: int, seed: int) -> str:
    rng = random.Random(seed)
    entities = [("paris", "LOC"), ("london", "LOC"), ("alice", "PER"), ("bob", "PER")]
    path = folder / f"ner-{seed}.json"
    with path.open("w") as handle:
        for _ in range(rows):
            words, tags = rng.sample(FILLER, 4), ["O"] * 4
            word, kind = rng.choice(entities)
            at = rng.randint(0, 4)
            words.insert(at, word)
            tags.insert(at, f"B-{kind}")
            handle.write(json.dumps({"tokens": words, "ner_tags": tags}) + "\n")
    return str(path)


def training_args(output_dir: Path, **kwargs: object) -> TrainingArguments:
    defaults = {"output_dir": str(output_dir), "per_device_train_batch_size": 16,
                "per_device_eval_batch_size": 32, "learning_rate": 3e-3, "num_train_epochs": 3,
                "save_strategy": "no", "report_to": "none", "disable_tqdm": True, "logging_steps": 50,
                "seed": 0, "use_cpu": True}
    return TrainingArguments(**{**defaults, **kwargs})


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("finetune-data")
    return {"train": write_sentiment(folder, 128, 0), "dev": write_sentiment(folder, 48, 1),
            "ner_train": write_ner(folder, 96, 2), "ner_dev": write_ner(folder, 32, 3)}


@pytest.fixture(scope="module")
def base_models(tmp_path_factory) -> dict[str, str]:
    """A tiny (untrained) MLM folder per family, standing in for a pretrain output."""
    tokenizer = embedded_tokenizer()
    out = {}
    for family in FAMILIES:
        torch.manual_seed(0)
        config = build_config(family, config_overrides=tiny_overrides(family), tokenizer=tokenizer,
                              max_seq_length=16)
        folder = tmp_path_factory.mktemp(f"base-{family}")
        AutoModelForMaskedLM.from_config(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        out[family] = str(folder)
    return out


# ------------------------------------------------------------------ finetune
@pytest.mark.parametrize("family", list(FAMILIES))
def test_sequence_classification_beats_chance_and_writes_run_glue_results(tmp_path, data, base_models,
                                                                          family) -> None:
    args = FinetuneArguments(model_name_or_path=base_models[family], train_file=data["train"],
                             validation_file=data["dev"], max_seq_length=16)
    result = finetune(args, training_args(tmp_path))
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert {"eval_accuracy", "eval_f1", "eval_loss", "epoch"} <= set(results)
    assert results["eval_accuracy"] >= 0.75, results  # chance is ~0.5
    assert json.loads((tmp_path / "task_config.json").read_text())["label_list"] == ["negative", "positive"]
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert reloaded.config.id2label == {0: "negative", 1: "positive"}
    assert result.metrics["eval_accuracy"] == results["eval_accuracy"]


def test_token_classification_writes_entity_metrics(tmp_path, data, base_models) -> None:
    args = FinetuneArguments(task="token_classification", model_name_or_path=base_models["entropy_invariant"],
                             train_file=data["ner_train"], validation_file=data["ner_dev"], max_seq_length=16,
                             return_entity_level_metrics=True)
    finetune(args, training_args(tmp_path, num_train_epochs=4))
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert {"eval_precision", "eval_recall", "eval_f1", "eval_accuracy", "eval_LOC_f1",
            "eval_PER_f1"} <= set(results)
    assert results["eval_accuracy"] > 0.8 and results["eval_f1"] > 0.0, results  # 80% of tags are O


def test_early_stopping_stops_before_the_last_epoch(tmp_path, data, base_models) -> None:
    args = FinetuneArguments(model_name_or_path=base_models["entropy_invariant"], train_file=data["train"],
                             validation_file=data["dev"], max_seq_length=16, early_stopping_patience=1,
                             max_train_samples=32, max_eval_samples=16,
                             early_stopping_threshold=2.0)  # no improvement can reach 2.0 → stop at epoch 2
    result = finetune(args, training_args(tmp_path, num_train_epochs=6, save_total_limit=1))
    state = result.trainer.state
    assert state.epoch == pytest.approx(2.0) and state.best_metric is not None


def test_an_eval_strategy_trains_and_do_eval_alone_only_evaluates(tmp_path, data, base_models) -> None:
    """``--eval_strategy epoch`` makes ``TrainingArguments`` set ``do_eval`` by itself: the run still trains
    (docs/training.md's command once only evaluated, and saved no model); ``--do_eval`` alone evaluates the
    model as it is."""
    args = FinetuneArguments(model_name_or_path=base_models["entropy_invariant"], train_file=data["train"],
                             validation_file=data["dev"], max_seq_length=16, max_train_samples=32,
                             max_eval_samples=16)
    during = finetune(args, training_args(tmp_path / "during", eval_strategy="epoch", num_train_epochs=1))
    assert during.trainer.state.global_step == 2 and (tmp_path / "during" / "model.safetensors").is_file()
    assert (tmp_path / "during" / "train_results.json").is_file()
    alone = finetune(args, training_args(tmp_path / "alone", do_eval=True))
    assert alone.trainer.state.global_step == 0 and "eval_accuracy" in alone.metrics
    assert not (tmp_path / "alone" / "model.safetensors").exists()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_lora_adapter_saves_and_reloads_with_identical_logits(tmp_path, data, base_models, family) -> None:
    from peft import PeftModel

    args = FinetuneArguments(model_name_or_path=base_models[family], train_file=data["train"],
                             validation_file=data["dev"], max_seq_length=16, lora_r=4, lora_alpha=8)
    result = finetune(args, training_args(tmp_path, num_train_epochs=1, max_steps=3))
    trainable = [n for n, p in result.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable)
    assert any(target in n for n in trainable for target in LORA_TARGETS[family])
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in tmp_path.iterdir()}
    assert not (tmp_path / "model.safetensors").exists()

    labels = {"num_labels": 2, "id2label": {0: "negative", 1: "positive"},
              "label2id": {"negative": 0, "positive": 1}}
    base = AutoModelForSequenceClassification.from_pretrained(base_models[family], **labels)
    reloaded = PeftModel.from_pretrained(base, tmp_path).eval()
    tokenizer = embedded_tokenizer()
    batch = tokenizer(["a good value", "the bad function returns this"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = result.model.eval()(**batch).logits
        torch.testing.assert_close(reloaded(**batch).logits, expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(load_finetuned(str(tmp_path)).eval()(**batch).logits, expected, atol=1e-6,
                                   rtol=0)


def test_finetune_cli_rejects_unknown_task(tmp_path, capsys, data) -> None:
    with pytest.raises(SystemExit):
        main(["finetune", "--task", "summarization", "--train_file", data["train"], "--output_dir",
              str(tmp_path)])
    err = capsys.readouterr().err
    assert "argument --task" in err and "'sequence_classification', 'token_classification'" in err


def finetune_cli(output_dir: Path, data: dict[str, str], base: str, *extra: str) -> int:
    return main(["finetune", "--model_name_or_path", base, "--train_file", data["train"],
                 "--validation_file", data["dev"], "--max_seq_length", "16", "--output_dir", str(output_dir),
                 "--report_to", "none",
                 "--use_cpu", "true", "--disable_tqdm", "true", "--per_device_train_batch_size", "16",
                 "--max_train_samples", "40", "--max_eval_samples", "16", *extra])


def summary_lines(out: str) -> list[str]:
    return [line.removeprefix("finetune: ") for line in out.splitlines() if line.startswith("finetune: ")]


def test_finetune_says_what_it_will_do_and_what_it_did(tmp_path, capsys, data, base_models) -> None:
    """The command prints, before training, the task, model, parameters, examples and the steps ahead (the
    count ``Trainer`` then trains), and at the end the steps, the validation metrics, the folder and the next
    command; under LoRA the trainable share and how to load the adapter; evaluation alone says so."""
    base = base_models["entropy_invariant"]
    folder = tmp_path / "full"
    assert finetune_cli(folder, data, base, "--num_train_epochs", "2", "--eval_strategy", "epoch",
                        "--save_strategy", "epoch") == 0
    out = capsys.readouterr().out
    lines = summary_lines(out)
    # --disable_tqdm: Trainer's logs as lines, not its PrinterCallback's dicts
    logged = [line for line in out.splitlines() if line.startswith("finetune step ")]
    assert "{'" not in out and logged, out
    assert any(line.startswith("finetune step 3 of 6 (epoch 1.00): eval_loss ") for line in logged), logged
    assert "finetune step 6 of 6 (epoch 2.00): train_loss " in "\n".join(logged), logged
    steps = json.loads((folder / "trainer_state.json").read_text())["global_step"]
    assert steps == 6  # 40 examples in batches of 16: 3 steps per epoch
    assert lines[0].startswith(f"sequence_classification with entropy_invariant from {base}: ") and (
        "2 labels; on cpu, 1 process" in lines[0]), lines
    assert lines[1] == ("40 training examples, 16 validation examples; 6 steps of 16 examples; evaluates "
                        "every epoch, checkpoints every epoch and every 10 min"), lines
    accuracy = json.loads((folder / "eval_results.json").read_text())["eval_accuracy"]
    assert lines[2].startswith("trained 6 steps in ") and "; mean train loss " in lines[2], lines
    assert f"eval_accuracy {accuracy:.4g}" in lines[3], lines
    assert lines[4] == ("wrote the model, its tokenizer, task_config.json and the results "
                        f"(all_results.json) to {folder}")
    assert lines[5] == (f"next: hf-attn-variants export --model_name_or_path {folder} --output_dir "
                        f"{folder}-hub")
    assert len(lines) == 6, lines

    lora = tmp_path / "lora"
    assert finetune_cli(lora, data, base, "--max_steps", "2", "--lora_r", "4", "--save_strategy", "no") == 0
    lines = summary_lines(capsys.readouterr().out)
    assert "of them trained (LoRA r=4)" in lines[0] and "2 steps of 16 examples" in lines[1], lines
    assert lines[1].endswith("evaluates at the end, checkpoints only when stopped"), lines
    assert lines[-1].startswith(f'next: hf_attn_variants.training.finetune.load_finetuned("{lora}")'), lines

    alone = tmp_path / "alone"
    assert finetune_cli(alone, data, base, "--do_eval") == 0
    lines = summary_lines(capsys.readouterr().out)
    assert lines[1] == "evaluates the model as it is on 16 validation examples; no training", lines
    assert lines[-1] == f"wrote eval_results.json to {alone}" and "eval_accuracy" in lines[-2], lines


def test_the_cadence_reads_steps_below_one_as_a_share(tmp_path, data) -> None:
    from hf_attn_variants.training.finetune import cadence

    args = FinetuneArguments(model_type="gau", train_file=data["train"], checkpointing_minutes=0)
    text = cadence(args, training_args(tmp_path, eval_strategy="steps", eval_steps=0.1, save_strategy="steps",
                                       save_steps=50))
    assert text == "evaluates every 10% of the training steps, checkpoints every 50 steps", text


def test_trainers_logs_are_lines_under_disable_tqdm(capsys) -> None:
    from types import SimpleNamespace

    from hf_attn_variants.training.trainer_hooks import LogLines

    state = SimpleNamespace(is_local_process_zero=True, global_step=20, max_steps=60)
    lines = LogLines()
    lines.on_log(None, state, None, logs={"loss": 0.69314, "grad_norm": 1.2345, "learning_rate": 4e-05,
                                          "epoch": 1.0})
    lines.on_log(None, state, None, logs={"train_runtime": 3.2, "train_samples_per_second": 9.9,
                                          "total_flos": 1.0, "train_loss": 0.7, "epoch": 1.0})
    lines.on_log(None, state, None, logs={"train_runtime": 3.2})  # nothing left to show
    lines.on_log(None, SimpleNamespace(is_local_process_zero=False, global_step=20, max_steps=60), None,
                 logs={"loss": 0.5})
    assert capsys.readouterr().out.splitlines() == [
        "finetune step 20 of 60 (epoch 1.00): loss 0.6931, grad_norm 1.234, learning_rate 4e-05",
        "finetune step 20 of 60 (epoch 1.00): train_loss 0.7"]
