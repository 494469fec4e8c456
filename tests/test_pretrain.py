"""pretrain: outputs for every family, clear flag errors, exact kill-and-resume, two-process DDP on CPU."""

from __future__ import annotations

import dataclasses

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from hf_attn_variants import FAMILIES
from hf_attn_variants.cli import main
from hf_attn_variants.demo import DemoArguments, family_overrides
from hf_attn_variants.training import PretrainArguments, corpus_splits, embedded_tokenizer_path, pretrain
from tests.remote_code import assert_standalone_code

REPO = Path(__file__).resolve().parents[1]


def tiny_overrides(family: str, **extra: object) -> str:
    """``--config_overrides`` of a tiny model of ``family`` (hidden 32, 2 layers; Synthesizer l = 64)."""
    base = family_overrides(family, DemoArguments(hidden_size=32, num_hidden_layers=2, max_seq_length=16))
    return ",".join([base, *(f"{k}={v}" for k, v in extra.items())])


@pytest.fixture(scope="module")
def train_file(tmp_path_factory) -> str:
    """The first 150 training paragraphs of the embedded corpus as a local .txt file (one per line)."""
    path = tmp_path_factory.mktemp("data") / "train.txt"
    path.write_text("\n".join(p.replace("\n", " ") for p in corpus_splits()["train"][:150]) + "\n")
    embedded_tokenizer_path()
    return str(path)


def tiny_args(output_dir: Path, family: str = "entropy_invariant", **kwargs: object) -> PretrainArguments:
    overrides = kwargs.pop("config_overrides", tiny_overrides(family))
    defaults = {
        "output_dir": str(output_dir), "model_type": family, "config_overrides": overrides,
        "max_seq_length": 16, "per_device_train_batch_size": 4, "per_device_eval_batch_size": 8,
        "max_train_steps": 4, "logging_steps": 1, "learning_rate": 1e-3, "max_eval_samples": 8,
        "disable_tqdm": True, "seed": 3,
    }
    return PretrainArguments(**{**defaults, **kwargs})


def read_log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()
            if line.strip()]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pretrain_writes_remote_code_model_tokenizer_and_log(tmp_path, train_file, family: str) -> None:
    objective = "clm" if family == "gau" else "mlm"
    result = pretrain(tiny_args(tmp_path, family, train_file=train_file, objective=objective,
                                with_tracking=family == "entropy_invariant"))
    assert result.completed_steps == 4
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "train_log.jsonl",
            "all_results.json"} <= names
    assert_standalone_code(tmp_path, family)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == family and "AutoModelForMaskedLM" in config["auto_map"]
    rows = read_log(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all({"step", "loss", "lr", "epoch"} <= set(r) and torch.isfinite(torch.tensor(r["loss"]))
               for r in rows)
    assert "eval_loss" in rows[-1] and (objective == "clm" or "eval_accuracy" in rows[-1])
    auto_class = AutoModelForCausalLM if objective == "clm" else AutoModelForMaskedLM
    model = auto_class.from_pretrained(tmp_path)
    assert torch.equal(model.state_dict()["model.embed_tokens.weight"],
                       weights(tmp_path)["model.embed_tokens.weight"])
    if family == "entropy_invariant":
        assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*")), "TensorBoard events missing"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_target_only_mlm_loss_equals_the_full_head_loss_and_gradients(family: str) -> None:
    from hf_attn_variants.training.modeling import TargetOnlyMLMLoss, build_config

    config = build_config(family, config_overrides=tiny_overrides(family, vocab_size=50), max_seq_length=16)
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(config).eval()
    ids = torch.randint(5, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    labels = torch.where(torch.rand(3, 16, generator=torch.Generator().manual_seed(2)) < 0.3, ids, -100)
    full = model(input_ids=ids, labels=labels).loss
    full.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    sparse = TargetOnlyMLMLoss(model)(input_ids=ids, labels=labels).loss
    sparse.backward()
    torch.testing.assert_close(sparse, full, atol=1e-5, rtol=0)
    for name, grad in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, atol=1e-5, rtol=1e-4)


def test_pretrain_reads_csv_with_text_column(tmp_path, train_file) -> None:
    csv_file = tmp_path / "data.csv"
    lines = Path(train_file).read_text().splitlines()[:60]
    csv_file.write_text("id,body\n" + "".join(f'{i},"{line.replace(chr(34), "")}"\n'
                                              for i, line in enumerate(lines)))
    result = pretrain(tiny_args(tmp_path / "out", train_file=str(csv_file), text_column_name="body",
                                max_train_steps=2))
    assert result.completed_steps == 2 and "eval_loss" in result.metrics


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--objective", "span"], ("argument --objective", "invalid choice: 'span'", "'mlm', 'clm'")),
        (["--lr_scheduler_type", "warp"],
         ("argument --lr_scheduler_type", "invalid choice: 'warp'", "'cosine'")),
        (["--mixed_precision", "fp8"], ("argument --mixed_precision", "invalid choice: 'fp8'", "'bf16'")),
    ],
)
def test_bad_choice_flags_name_the_argument_and_choices(tmp_path, capsys, flags, expected) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["pretrain", "--output_dir", str(tmp_path), "--model_type", "gau", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert all(part in err for part in expected) and "choose from" in err, err
    assert err.count("\n") == 1 and err.startswith("hf-attn-variants pretrain: error: "), err  # no usage


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--model_type", "bert"], "model_type must be one of ('entropy_invariant'"),
        (["--model_type", "gau", "--checkpointing_steps", "often"],
         'checkpointing_steps must be a positive integer or "epoch"'),
        (["--model_type", "gau", "--mlm_probability", "1.5"], "mlm_probability must be in (0, 1)"),
        (["--model_type", "gau", "--config_overrides", "num_attention_heads=4"],
         "unknown field(s) ['num_attention_heads']"),
        (["--model_type", "gau", "--config_overrides", "attention_normalization=cosine"],
         "attention_normalization"),
        ([], "Pass --model_type"),
    ],
)
def test_bad_values_give_one_clear_error(tmp_path, capsys, flags, expected) -> None:
    code = main(["pretrain", "--output_dir", str(tmp_path), "--max_train_steps", "1", *flags])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert "Traceback" not in err


def test_a_loss_that_becomes_nan_stops_the_run_with_one_line_and_saves_no_model(tmp_path, capsys,
                                                                             train_file) -> None:
    """A learning rate of 1e30 makes the loss NaN: the run stops at the first logged step, says so in one line
    (exit status 65) and saves no model; run.json stays unfinished, so the folder is not taken for a model."""
    args = tiny_args(tmp_path / "out", train_file=train_file, learning_rate=1e30, max_train_steps=3)
    code = main(["pretrain", *cli_flags(args)])
    err = capsys.readouterr().err
    assert code == 65 and "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("hf-attn-variants pretrain: error: the training loss logged at ")
    assert not (tmp_path / "out" / "model.safetensors").exists()
    assert json.loads((tmp_path / "out" / "run.json").read_text()).get("finished") is not True


def test_a_stopped_demo_resumes_its_family_and_refuses_a_folder_of_user_files(tmp_path) -> None:
    """The demo retrains every run, but a family stopped by a signal (its pretrain unfinished, same
    arguments) resumes, as its message said; and a folder holding files the demo did not write is refused."""
    from hf_attn_variants.demo import check_demo_folder, demo_repo_id, record_export, resumes
    from hf_attn_variants.training.outputs import RunRecord, json_arguments

    arguments = tiny_args(tmp_path / "_pretrain" / "gau", family="gau")
    folder = Path(arguments.output_dir)
    folder.mkdir(parents=True)
    assert not resumes(folder, arguments)
    RunRecord("pretrain", json_arguments(arguments)).write(folder)
    assert resumes(folder, arguments)
    assert resumes(folder, dataclasses.replace(arguments, max_train_steps=9))  # a budget may differ
    assert not resumes(folder, dataclasses.replace(arguments, learning_rate=1e-2))
    RunRecord("pretrain", json_arguments(arguments), finished=True).write(folder)
    assert not resumes(folder, arguments)
    (tmp_path / "results.md").write_text("the user's table")  # no results.json of the demo beside it
    with pytest.raises(ValueError, match=r"'.*results.md' exists and is not from an earlier run of "
                                         r"`hf-attn-variants demo` \(its results file '.*results.json'"):
        check_demo_folder(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"rows": [], "table": "", "args": {}}))
    (tmp_path / "gau").mkdir()  # an export from before the record: its card names the demo's repository
    (tmp_path / "gau" / "config.json").write_text("{}")
    (tmp_path / "gau" / "README.md").write_text(f"# {demo_repo_id('gau')}")
    (tmp_path / "entropy_invariant").mkdir()
    (tmp_path / "entropy_invariant" / "config.json").write_text("{}")
    record_export(tmp_path, "entropy_invariant")
    check_demo_folder(tmp_path)
    (tmp_path / "entropy_invariant" / "NOTES.txt").write_text("mine")  # the re-export would delete it
    with pytest.raises(ValueError, match=r"holds files that the demo did not write \(entropy_invariant\)"):
        check_demo_folder(tmp_path)
    (tmp_path / "entropy_invariant" / "NOTES.txt").unlink()
    (tmp_path / "synthesizer").mkdir()  # a model folder of the user's, named after a family
    (tmp_path / "synthesizer" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds files that the demo did not write \(synthesizer\)"):
        check_demo_folder(tmp_path)


KILL_CHILD = r"""
import importlib, sys, time
# the module, not the function
pretrain_module = importlib.import_module("hf_attn_variants.training.pretrain")
collate = pretrain_module.collate_blocks
def slow_collate(items):  # slow the run down so that the parent can kill it between steps k and 2k
    time.sleep(0.4)
    return collate(items)
pretrain_module.collate_blocks = slow_collate
from hf_attn_variants.cli import main
sys.exit(main(sys.argv[1:]))
"""


def cli_flags(args: PretrainArguments) -> list[str]:
    flags = []
    for key, value in vars(args).items():
        if value is None or value is False:
            continue
        flags += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    return flags


@pytest.mark.slow
def test_kill_after_checkpoint_and_resume_reproduces_the_uninterrupted_run(tmp_path, train_file) -> None:
    k = 3
    common = {"train_file": train_file, "max_train_steps": 2 * k, "checkpointing_steps": str(k),
              "num_warmup_steps": 1,
              "config_overrides": tiny_overrides("entropy_invariant", hidden_dropout_prob=0.1)}
    reference = tmp_path / "reference"
    pretrain(tiny_args(reference, **common))

    killed = tmp_path / "killed"
    stderr = (tmp_path / "killed.stderr").open("w")
    process = subprocess.Popen([sys.executable, "-c", KILL_CHILD, "pretrain",
                                *cli_flags(tiny_args(killed, **common))],
                               stdout=subprocess.DEVNULL, stderr=stderr, cwd=tmp_path)
    deadline = time.time() + 240
    try:
        while time.time() < deadline and process.poll() is None:
            log = killed / "train_log.jsonl"
            if (killed / "checkpoints" / f"step_{k}").is_dir() and log.exists() and any(
                json.loads(line)["step"] > k for line in log.read_text().splitlines() if line.strip()
            ):
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        process.kill()
        process.wait()
        stderr.close()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "killed.stderr").read_text()[-3000:]
    assert not (killed / "model.safetensors").exists()
    assert k < read_log(killed)[-1]["step"] < 2 * k

    pretrain(tiny_args(killed, resume_from_checkpoint="latest", **common))
    expected, got = read_log(reference), read_log(killed)
    assert [r["step"] for r in got] == list(range(1, 2 * k + 1))
    for want, have in zip(expected, got):
        assert have["loss"] == pytest.approx(want["loss"], abs=1e-6), (want, have)
        assert have["lr"] == pytest.approx(want["lr"], abs=1e-12)
    assert got[-1]["eval_loss"] == pytest.approx(expected[-1]["eval_loss"], abs=1e-6)
    reference_weights, resumed_weights = weights(reference), weights(killed)
    for name, value in reference_weights.items():
        torch.testing.assert_close(resumed_weights[name], value, atol=1e-6, rtol=0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_process_ddp_on_cpu_matches_one_process_with_the_same_global_batch(tmp_path, train_file) -> None:
    common = {"train_file": train_file, "objective": "clm", "max_train_steps": 4, "num_warmup_steps": 1,
              # uneven shards: ranks run 2 batches each
              "max_eval_samples": 7, "per_device_eval_batch_size": 2,
              "config_overrides": tiny_overrides("entropy_invariant", hidden_dropout_prob=0,
                                                 attention_probs_dropout_prob=0)}
    single = tmp_path / "single"
    pretrain(tiny_args(single, per_device_train_batch_size=8, **common))

    ddp = tmp_path / "ddp"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / "scripts" / "accelerate" / "ddp_cpu.yaml"), "--main_process_port", str(free_port()),
               "-m", "hf_attn_variants", "pretrain",
               *cli_flags(tiny_args(ddp, per_device_train_batch_size=4, **common))]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads((ddp / "pretrain_args.json").read_text())["num_processes"] == 2
    for want, have in zip(read_log(single), read_log(ddp), strict=True):
        assert have["loss"] == pytest.approx(want["loss"], abs=1e-4)
    assert read_log(ddp)[-1]["eval_loss"] == pytest.approx(read_log(single)[-1]["eval_loss"], abs=1e-4)
    single_weights, ddp_weights = weights(single), weights(ddp)
    for name, value in single_weights.items():
        torch.testing.assert_close(ddp_weights[name], value, atol=1e-4, rtol=0)


def test_torch_compile_trains_compiled_checkpoints_the_plain_model_and_resumes(tmp_path, train_file, capsys,
                                                                               monkeypatch) -> None:
    """``--torch_compile`` (backend ``eager`` here: torch.compile captures the graphs and runs them as they
    are; inductor, the default, took 70–80 s to compile this model on the 2-core CPU, ``aot_eager``, which
    adds the backward graph, about 7 s, each with the uncompiled run's losses): the training forward runs
    compiled and evaluation eagerly; the checkpoints and the final model hold the plain model's names (no
    ``_orig_mod.``); the start summary and ``pretrain_args.json`` say so; the run resumes from its checkpoint,
    compiled again."""
    from hf_attn_variants.training import modeling

    compiling, target_rows = [], modeling.target_rows

    def spy(values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        compiling.append(torch.compiler.is_compiling())
        return target_rows(values, targets)

    monkeypatch.setattr(modeling, "target_rows", spy)
    args = tiny_args(tmp_path, train_file=train_file, max_train_steps=2, checkpointing_steps="1",
                     torch_compile=True, torch_compile_backend="eager")
    assert main(["pretrain", *cli_flags(args)]) == 0
    assert "compiled with torch.compile (eager): the first step compiles" in capsys.readouterr().out
    assert True in compiling and False in compiling, compiling
    for folder in (tmp_path, tmp_path / "checkpoints" / "step_2"):
        names = list(weights(folder))
        assert names and not [name for name in names if "_orig_mod" in name], names
    assert json.loads((tmp_path / "pretrain_args.json").read_text())["torch_compile"] is True
    AutoModelForMaskedLM.from_pretrained(tmp_path)  # every weight in place

    assert main(["pretrain", *cli_flags(args), "--max_train_steps", "3", "--resume_from_checkpoint",
                 "latest"]) == 0
    assert "resuming after step 2" in capsys.readouterr().out
    assert [row["step"] for row in read_log(tmp_path)] == [1, 2, 3]


def test_torch_compile_without_a_cpp_compiler_is_one_error_naming_the_flag(tmp_path, capsys,
                                                                           monkeypatch) -> None:
    """inductor builds C++ kernels on the CPU: without the compiler ``$CXX`` names, one line, exit status 2,
    nothing written."""
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    assert main(["pretrain", *cli_flags(tiny_args(tmp_path / "run", torch_compile=True))]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("hf-attn-variants pretrain: error: --torch_compile on the CPU needs a C++ "
                                "compiler"), lines
    assert "'no-such-c++-compiler'" in lines[-1] and not (tmp_path / "run").exists()
