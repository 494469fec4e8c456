"""``hf-attn-variants prune`` end to end on local files: curve CSV/JSON, two PNGs and a reloadable pruned
model (``--uniform``: a plain config with the heads per layer as ``num_attention_heads``)."""

from __future__ import annotations

import csv
import json
import logging
import random

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForSequenceClassification
from hf_attn_variants.cli import main
from hf_attn_variants.pruning import count_heads, load_pruned, prune_heads
from tests.utils import one_thread  # noqa: F401 (autouse fixture)

WORDS = [f"w{i}" for i in range(20)]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", eos_token="[SEP]",
    )


def sentences(n: int) -> list[tuple[str, int]]:
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 10))]
        rows.append((" ".join(words), int("w0" in words)))
    return rows


def make_model(kind: str):
    torch.manual_seed(0)
    if kind == "entropy_invariant":
        config = EntropyInvariantConfig(
            vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, num_labels=2, max_position_embeddings=32,
        )
        return EntropyInvariantForSequenceClassification(config)
    config = LlamaConfig(
        vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32, pad_token_id=0,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("kind", ["entropy_invariant", "llama"])
def test_prune_command_writes_curve_plots_and_model(kind: str, tmp_path, caplog) -> None:
    model_dir, out = tmp_path / "model", tmp_path / "out"
    make_model(kind).save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    rows = sentences(40)
    if kind == "entropy_invariant":
        data = tmp_path / "train.csv"
        with open(data, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
    else:
        data = tmp_path / "train.txt"
        data.write_text("\n".join(text for text, _ in rows) + "\n")
    with caplog.at_level(logging.INFO, logger="hf_attn_variants"):
        code = main([
            "prune", "--model_name_or_path", str(model_dir), "--train_file", str(data), "--output_dir",
            str(out), "--threshold", "none", "--max_heads_pruned", "0.5", "--fraction", "0.25",
            "--batch_size", "8", "--num_importance_examples", "8",
        ])
    assert code == 0
    said = [r.getMessage().removeprefix("prune: ") for r in caplog.records
            if r.getMessage().startswith("prune: ")]
    assert said[-3].startswith("pruned 4 of 8 heads (4 left); ") and " unpruned (" in said[-3], said
    model_out = out / "model"
    assert said[-2].startswith(f"wrote the pruned model and its tokenizer to {model_out}, the curve"), said
    next_step = (f"hf-attn-variants export --model_name_or_path {model_out} --output_dir {out}-hub"
                 if kind == "entropy_invariant" else f'hf_attn_variants.pruning.load_pruned("{model_out}")')
    assert said[-1] == f"next: {next_step}", said
    for name in ("curve.csv", "curve.json", "pruning_curve.png", "head_importance.png"):
        assert (out / name).stat().st_size > 0, name
    for name in ("pruning_curve.png", "head_importance.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "curve.csv") as handle:
        table = list(csv.DictReader(handle))
    assert [int(row["heads_pruned"]) for row in table] == [0, 2, 4]
    payload = json.loads((out / "curve.json").read_text())
    meta = payload["metadata"]
    assert meta["metric"] == ("accuracy" if kind == "entropy_invariant" else "perplexity")
    assert meta["heads_after"] == 4 and len(meta["importance"]) == 2 and len(payload["curve"]) == 3
    pruned = load_pruned(out / "model")
    assert {str(k): v for k, v in pruned.config.pruned_heads.items()} == meta["pruned_heads"]
    assert sum(len(v) for v in pruned.config.pruned_heads.values()) == 4
    assert (out / "model" / "tokenizer.json").exists()


def test_prune_command_is_listed_and_rejects_bad_files(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["prune", "--help"])
    assert "--max_heads_pruned" in capsys.readouterr().out
    model_dir = tmp_path / "model"
    make_model("entropy_invariant").save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    (tmp_path / "data.parquetx").write_text("x")
    code = main(["prune", "--model_name_or_path", str(model_dir), "--train_file",
                 str(tmp_path / "data.parquetx"), "--output_dir", str(tmp_path / "out")])
    assert code == 2 and "--train_file: data files must end in one of" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def write_csv(path, rows) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(rows)


def uniform_model_dir(tmp_path, pruned: dict[int, list[int]] | None = None):
    """A tiny entropy-invariant classifier (absolute positions, 2 layers × 4 heads) and its tokenizer on
    disk."""
    torch.manual_seed(0)
    config = EntropyInvariantConfig(
        vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=2, max_position_embeddings=32, position_embedding_type="absolute",
    )
    model = EntropyInvariantForSequenceClassification(config)
    if pruned:
        prune_heads(model, pruned)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    return model_dir


def test_prune_command_uniform_writes_a_plain_config(tmp_path) -> None:
    model_dir, out, data = uniform_model_dir(tmp_path), tmp_path / "out", tmp_path / "train.csv"
    write_csv(data, sentences(40))
    code = main([
        "prune", "--model_name_or_path", str(model_dir), "--train_file", str(data), "--output_dir", str(out),
        "--threshold", "none", "--max_heads_pruned", "0.5", "--fraction", "0.25", "--batch_size", "8",
        "--num_importance_examples", "8", "--uniform",
    ])
    assert code == 0
    payload = json.loads((out / "curve.json").read_text())
    meta = payload["metadata"]
    assert meta["settings"]["uniform"] is True
    assert [row["heads_pruned"] for row in payload["curve"]] == [0, 2, 4]  # one head per layer and step
    assert all(sorted(len(h) for h in row["newly_pruned"].values()) == [1, 1] for row in payload["curve"][1:])
    assert sorted(len(h) for h in meta["pruned_heads"].values()) == [2, 2]  # original numbers, in the curve
    assert meta["restated_config"] == {"num_attention_heads": 2, "head_dim": 8}
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["num_attention_heads"] == 2 and saved["head_dim"] == 8 and not saved.get("pruned_heads")
    reloaded = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert count_heads(reloaded) == (4, 4)


def test_prune_command_uniform_rejects_bad_combinations(tmp_path, capsys) -> None:
    data = tmp_path / "train.csv"
    write_csv(data, sentences(20))

    def run(model_dir, *flags: str) -> str:
        capsys.readouterr()  # the progress bars of saving the model
        code = main(["prune", "--model_name_or_path", str(model_dir), "--train_file", str(data),
                     "--output_dir", str(tmp_path / "out"), "--uniform", *flags])
        assert code == 2 and not (tmp_path / "out").exists()
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        return err

    with pytest.raises(SystemExit):
        main(["prune", "--help"])
    assert "--uniform" in capsys.readouterr().out
    model_dir = uniform_model_dir(tmp_path / "plain")
    assert "error: --uniform removes at least one head from each of the 2 layers" in run(
        model_dir, "--max_heads_pruned", "1")
    assert ("--min_heads_per_layer must be below the model's 4 heads"
            in run(model_dir, "--min_heads_per_layer", "4"))
    model_dir = uniform_model_dir(tmp_path / "uneven", {0: [1]})
    assert "error: --uniform needs the same number of heads in every layer" in run(model_dir)
    model_dir = uniform_model_dir(tmp_path / "halved", {0: [0, 1], 1: [2, 3]})
    assert "--min_heads_per_layer must be below the 2 heads each layer has now" in run(
        model_dir, "--min_heads_per_layer", "2")


def test_masked_lm_masking_gives_every_row_with_a_word_a_target() -> None:
    """A short row could draw no target at 15 %: its loss was 0/0 and prune --task masked-lm stopped with a
    traceback. Every row with a non-special token now has one (its smallest draw); rows with targets
    already keep exactly the draw they had."""
    from hf_attn_variants.pruning.data import mask_for_mlm
    from hf_attn_variants.training import embedded_tokenizer

    tokenizer = embedded_tokenizer()
    batch = tokenizer(["def", "the return statement", "x", "a b c d e f g h i j k l m n o p"] * 16,
                      padding=True, return_tensors="pt")
    _, labels = mask_for_mlm(batch, tokenizer, 0.15, torch.Generator().manual_seed(0))
    assert ((labels != -100).sum(dim=1) >= 1).all()
    _, few = mask_for_mlm(batch, tokenizer, 0.0, torch.Generator().manual_seed(0))
    assert ((few != -100).sum(dim=1) == 1).all()  # probability 0: exactly the one forced target per row


def test_causal_rows_of_one_token_are_skipped_and_a_data_error_writes_no_run(tmp_path, capsys) -> None:
    """A one-word line of a causal LM's ``.txt`` has nothing to predict: it is skipped, not a "loss is not
    finite" error; data with nothing to predict at all is one ``--train_file`` error that leaves no
    ``run.json`` behind (it blocked the corrected rerun into the same folder)."""
    model_dir = tmp_path / "model"
    make_model("llama").save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    common = ["--threshold", "none", "--max_heads_pruned", "0.25", "--fraction", "0.25", "--batch_size", "4",
              "--num_importance_examples", "4"]
    words = tmp_path / "words.txt"
    words.write_text("w1\nw2\nw3\nw4\nw5\n")
    out = tmp_path / "out"
    code = main(["prune", "--model_name_or_path", str(model_dir), "--train_file", str(words),
                 "--output_dir", str(out), *common])
    assert code == 2 and "--train_file's evaluation rows hold no token to predict" in capsys.readouterr().err
    assert not out.exists()
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("w1\n" + "\n".join(text for text, _ in sentences(12)) + "\n")
    code = main(["prune", "--model_name_or_path", str(model_dir), "--train_file", str(mixed),
                 "--output_dir", str(out), *common])
    assert code == 0, capsys.readouterr().err
    assert (out / "curve.json").exists()


def _classifier_folder(tmp_path, model) -> str:
    folder = tmp_path / type(model).__name__
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def test_a_stock_model_that_prunes_nothing_writes_its_run(tmp_path, capsys) -> None:
    """A BERT whose first step falls below the threshold (or ``--max_heads_pruned 0``) kept no head pruned,
    and the command read ``config.pruned_heads``, which a Transformers 5 config has only after a pruning: an
    ``AttributeError`` after ``run.json`` and the importance plot were written."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, num_labels=2))
    folder, data = _classifier_folder(tmp_path, model), tmp_path / "train.csv"
    write_csv(data, sentences(40))
    for name, flags in (("above", ["--threshold", "1.5"]), ("none", ["--max_heads_pruned", "0"])):
        out = tmp_path / name
        code = main(["prune", "--model_name_or_path", folder, "--train_file", str(data), "--output_dir",
                     str(out), "--num_importance_examples", "8", *flags])
        assert code == 0, capsys.readouterr().err
        metadata = json.loads((out / "curve.json").read_text())["metadata"]
        assert metadata["pruned_heads"] == {} and metadata["heads_after"] == 8


def test_a_llama_classifier_without_a_pad_token_id_prunes_on_padded_batches(tmp_path, capsys) -> None:
    """Llama-style classifiers find a row's last token through ``config.pad_token_id``; without one the first
    padded evaluation batch raised after the run had started writing. The command gives the config the
    tokenizer's pad token, and a model that cannot evaluate a padded batch is refused before anything is
    written."""
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32, num_labels=2))
    assert model.config.pad_token_id is None
    folder, data = _classifier_folder(tmp_path, model), tmp_path / "train.csv"
    write_csv(data, sentences(40))
    out = tmp_path / "out"
    code = main(["prune", "--model_name_or_path", folder, "--train_file", str(data), "--output_dir", str(out),
                 "--num_importance_examples", "8", "--max_heads_pruned", "2"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "model" / "config.json").read_text())["pad_token_id"] == tokenizer().pad_token_id


def test_string_labels_map_to_one_id_in_every_split(tmp_path) -> None:
    """Names were numbered per split in sorted order: a file sorted by label held out only 'c' rows, which
    then read as class 0 for the evaluation and class 2 for the importance."""
    import argparse

    from hf_attn_variants.pruning.cli import add_arguments, prepare

    folder = _classifier_folder(tmp_path, EntropyInvariantForSequenceClassification(EntropyInvariantConfig(
        vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3, max_position_embeddings=32)))
    data = tmp_path / "sorted.csv"
    names = ["a"] * 14 + ["b"] * 13 + ["c"] * 13
    write_csv(data, [(text, name) for (text, _), name in zip(sentences(40), names)])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    inputs = prepare(parser.parse_args(["--model_name_or_path", folder, "--train_file", str(data),
                                        "--output_dir", str(tmp_path / "out"),
                                        "--validation_split_percentage", "20"]))
    assert {int(label) for batch in inputs.eval_batches for label in batch["labels"]} == {2}
    assert {int(label) for batch in inputs.importance_batches for label in batch["labels"]} == {0, 1, 2}


def test_evaluation_rows_with_nothing_to_predict_are_refused(tmp_path, capsys) -> None:
    """A causal validation file of one-token rows has no perplexity: it read as 1.0 at every step (exp(0/1)),
    and every head was pruned."""
    model_dir = tmp_path / "model"
    make_model("llama").save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text("\n".join(text for text, _ in sentences(12)) + "\n")
    dev.write_text("w1\nw2\nw3\n")
    out = tmp_path / "out"
    code = main(["prune", "--model_name_or_path", str(model_dir), "--train_file", str(train),
                 "--validation_file", str(dev), "--output_dir", str(out), "--num_importance_examples", "4"])
    assert code == 2
    assert "--validation_file's evaluation rows hold no token to predict" in capsys.readouterr().err
    assert not out.exists()
    from hf_attn_variants.pruning.data import perplexity_metric

    with pytest.raises(ValueError, match="no token to predict"):
        perplexity_metric([{"input_ids": torch.tensor([[5]]), "labels": torch.tensor([[5]])}], True)(
            make_model("llama"))


def test_batches_are_padded_on_the_right_whatever_the_tokenizer_says() -> None:
    """A decoder takes its positions from the row's start: a left-padded row was scored and evaluated at
    shifted positions, so its results depended on the rows batched with it."""
    from datasets import Dataset

    from hf_attn_variants.pruning.data import build_batches

    left = tokenizer()
    left.padding_side = "left"
    rows = Dataset.from_dict({"text": ["w1 w2 w3 w4 w5", "w1"]})
    (batch,) = build_batches(rows, left, make_model("llama"), "causal-lm", batch_size=2)
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 0, 0, 0, 0]]
    assert batch["labels"][1].tolist() == [batch["input_ids"][1, 0].item()] + [-100] * 4
