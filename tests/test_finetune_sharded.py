"""finetune (Trainer) on a model sharded by Transformers' ``DistributedConfig`` (FSDP2) under ``torchrun``.

One launch of ``python -m torch.distributed.run --standalone --nproc_per_node 2 -m hf_attn_variants finetune
... --fsdp_size 2`` (two gloo processes on CPU) against an in-process single-process run with twice the
per-device batch: parameters sharded as FSDP2 plans them (recorded by rank 0 right after loading:
tests/parallel_child.py ``record_sharded_loads``), equal evaluation metrics, training loss and final weights
(1e-4), an output folder that reloads with plain ``from_pretrained``, and model-only Trainer checkpoints
(``--save_strategy steps --save_only_model true``) written by the sharded model's own ``save_pretrained``
(gathered weights, config, standalone remote code). Both runs keep Transformers' default
``--average_tokens_across_devices true``: the classification heads pass ``num_items_in_batch`` on to their
loss, so the two-process loss is the global mean.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

from hf_attn_variants.cli import main
from hf_attn_variants.cli_utils import FlagError
from hf_attn_variants.training import build_config, embedded_tokenizer
from hf_attn_variants.training.finetune import FinetuneArguments, check_sharded_finetune, finetune
from tests.parallel_child import placement_recording_env, recorded_placements
from tests.remote_code import assert_standalone_code
from tests.test_finetune import training_args, write_sentiment
from tests.test_parallelism import assert_sharded_as_planned
from tests.test_pretrain import tiny_overrides
from tests.utils import needs_fsdp2_torch

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Sentiment train/dev files and a tiny entropy-invariant MLM folder without dropout."""
    folder = tmp_path_factory.mktemp("sharded-finetune")
    tokenizer = embedded_tokenizer()
    config = build_config("entropy_invariant", tokenizer=tokenizer, max_seq_length=16,
                          config_overrides=tiny_overrides("entropy_invariant", hidden_dropout_prob=0,
                                                          attention_probs_dropout_prob=0))
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(config).save_pretrained(folder / "base")
    tokenizer.save_pretrained(folder / "base")
    return {"train": write_sentiment(folder, 64, 0), "dev": write_sentiment(folder, 16, 1),
            "base": str(folder / "base")}


COMMON = {"max_steps": 4, "learning_rate": 3e-3, "per_device_eval_batch_size": 8, "do_train": True,
          "do_eval": True, "logging_steps": 1}
"""``logging_steps=1``: Trainer's final ``train_loss`` adds the losses since the last log of rank 0 only (not
gathered), so it is the global mean only when every step is logged. ``per_device_eval_batch_size=8``: the 16
dev rows split into equal batches on both ranks (Trainer's ``eval_loss`` is a mean of batch means)."""


def cli(inputs: dict[str, str], output_dir: str, **extra: object) -> list[str]:
    flags = {"model_name_or_path": inputs["base"], "train_file": inputs["train"],
             "validation_file": inputs["dev"], "max_seq_length": 16, "output_dir": output_dir,
             "save_strategy": "no", "report_to": "none", "disable_tqdm": True, "seed": 0, "use_cpu": True,
             **COMMON, **extra}
    return [part for key, value in flags.items() for part in (f"--{key}", str(value))]


@pytest.mark.slow
@needs_fsdp2_torch()
def test_fsdp2_finetune_equals_one_process_with_the_same_global_batch(tmp_path, inputs) -> None:
    single, sharded = tmp_path / "single", tmp_path / "fsdp"
    args = FinetuneArguments(model_name_or_path=inputs["base"], train_file=inputs["train"],
                             validation_file=inputs["dev"], max_seq_length=16)
    finetune(args, training_args(single, per_device_train_batch_size=16, **COMMON))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "hf_attn_variants", "finetune",
               *cli(inputs, str(sharded), per_device_train_batch_size=8, fsdp_size=2, save_strategy="steps",
                    save_steps=2, save_only_model=True)]
    env = {**{k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")},
           "OMP_NUM_THREADS": "1", **placement_recording_env(tmp_path)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            check=False)
    assert result.returncode == 0, result.stderr[-6000:]
    one_process = AutoModelForSequenceClassification.from_pretrained(single).eval()
    placements = recorded_placements(tmp_path)
    assert_sharded_as_planned(placements, dict(one_process.named_parameters()), fsdp_size=2)

    want, have = (json.loads((folder / "all_results.json").read_text()) for folder in (single, sharded))
    for key in ("eval_accuracy", "eval_f1"):
        assert have[key] == want[key], (key, want[key], have[key])
    for key in ("eval_loss", "train_loss"):
        assert have[key] == pytest.approx(want[key], abs=TOLERANCE), key
    a, b = load_file(str(single / "model.safetensors")), load_file(str(sharded / "model.safetensors"))
    assert sorted(a) == sorted(b)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= TOLERANCE
    assert not (sharded / ".initial_model").exists()
    ids = torch.randint(5, 4000, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForSequenceClassification.from_pretrained(sharded).eval()(ids).logits,
                                   one_process(ids).logits,
                                   atol=TOLERANCE, rtol=0)

    # model-only checkpoints at steps 2 and 4, each a complete model folder; the last holds the final weights
    assert sorted(p.name for p in sharded.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    for checkpoint in sharded.glob("checkpoint-*"):
        assert_standalone_code(checkpoint, "entropy_invariant")
        config = json.loads((checkpoint / "config.json").read_text())
        assert config["architectures"] == ["EntropyInvariantForSequenceClassification"]
        assert config["auto_map"]["AutoModelForSequenceClassification"].startswith(
            "modeling_entropy_invariant.")
        assert not list(checkpoint.glob("optimizer*")), "save_only_model: no optimizer state"
    last = load_file(str(sharded / "checkpoint-4" / "model.safetensors"))
    assert all(torch.equal(last[k], b[k]) for k in b)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"fsdp_size": 2}, "--fsdp_size: dp_replicate_size=1 × fsdp_size=2 × tp_size=1 shards the model"),
        ({"fsdp_size": 2, "lora_r": 4},
         ("--lora_r: LoRA is not supported on a sharded model (fsdp_size=2): peft's "
          "modules_to_save copies the sharded classifier head")),
    ],
    ids=["without-torchrun", "lora"],
)
def test_bad_sharding_flags_give_one_clear_error(tmp_path, capsys, monkeypatch, inputs, flags,
                                                 expected) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "out"
    code = main(["finetune", *cli(inputs, str(out), **flags)])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@needs_fsdp2_torch()  # the checks after check_layout's, which refuses FSDP2 on older torch
@pytest.mark.parametrize(
    ("sizes", "trainer_flags", "extra", "flag", "expected"),
    [
        ({"fsdp_size": 2}, {"save_strategy": "steps"}, {}, "save_strategy",
         ("Trainer refuses optimizer-state checkpoints of a model sharded at load time (fsdp_size=2): "
          "\"Resuming is not supported")),
        ({"fsdp_size": 2}, {"eval_strategy": "steps", "save_strategy": "steps", "save_only_model": True,
                            "load_best_model_at_end": True}, {}, "load_best_model_at_end",
         "load_state_dict of the full weights fails with \"aten.copy_.default got mixed torch.Tensor and "
         "DTensor"),
        ({"fsdp_size": 2}, {"eval_strategy": "steps", "save_strategy": "steps", "save_only_model": True,
                            "load_best_model_at_end": True}, {"early_stopping_patience": 1},
         "early_stopping_patience", "Trainer cannot load the best checkpoint back into a model sharded"),
        ({"fsdp_size": 2}, {"save_strategy": "no", "resume_from_checkpoint": "x"}, {},
         "resume_from_checkpoint", "Trainer cannot resume a model sharded at load time (fsdp_size=2)"),
        ({"tp_size": 2}, {"save_strategy": "no"}, {}, "tp_size",
         "accelerate's ParallelismConfig, which refuses CPU"),
    ],
    ids=["save_strategy-with-optimizer", "load_best_model_at_end", "early_stopping", "resume_from_checkpoint",
         "tp_on_cpu"],
)
def test_what_trainer_cannot_do_sharded_is_refused_naming_the_flag(tmp_path, monkeypatch, inputs, sizes,
                                                                   trainer_flags, extra, flag,
                                                                   expected) -> None:
    """Under torchrun (``WORLD_SIZE`` set) ``TrainingArguments`` joins the process group, so these run on the
    check itself: ``finetune`` calls it before it writes anything."""
    args = FinetuneArguments(model_name_or_path=inputs["base"], train_file=inputs["train"], **sizes, **extra)
    trainer_args = training_args(tmp_path, **trainer_flags)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(FlagError, match=re.escape(expected)) as error:
        check_sharded_finetune(args, trainer_args)
    assert error.value.flag == flag


@needs_fsdp2_torch()
def test_model_only_checkpoints_pass_the_sharded_check(tmp_path, monkeypatch, inputs) -> None:
    args = FinetuneArguments(model_name_or_path=inputs["base"], train_file=inputs["train"], fsdp_size=2)
    trainer_args = [training_args(tmp_path, save_strategy=strategy, save_only_model=True)
                    for strategy in ("no", "steps", "epoch")]
    monkeypatch.setenv("WORLD_SIZE", "2")
    for each in trainer_args:
        check_sharded_finetune(args, each)
