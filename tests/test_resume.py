"""Nothing lost (issue 27): a rerun resumes or refuses, a preempted run checkpoints, a broken checkpoint is
named.

The pretrain runs here are in-process (6 optimizer steps of a tiny model with dropout, a checkpoint every
step, ``--save_total_limit 2``), so that a resumed run can be compared with an uninterrupted one bit for bit
(|Δw| = 0: same process, same threads, same kernels). SIGTERM is a real signal: the test's own process sends
it to itself right after the optimizer step of step 3, exactly as a scheduler's signal would arrive during a
step. ``test_sigterm_with_two_processes_*`` does the same under ``torchrun`` with two gloo processes
(accelerate DDP), the signal sent to one worker only. ``test_kill_9_*`` kills a ``pretrain`` process for real
(SIGKILL, nothing caught) right after a checkpoint and runs the same command again (two launches, about
10-20 s). ``finetune`` gets the same checks through ``Trainer``; ``prune`` and ``lengthgen`` the folder rule
(``training/outputs.py``), through their command lines. About 20 s without the two slow tests; the two-process
one takes about 25-45 s (three launches of two processes).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_attn_variants.cli import main
from hf_attn_variants.training import PREEMPTED_EXIT_CODE, PretrainArguments, pretrain
from hf_attn_variants.training.outputs import RunRecord
from hf_attn_variants.training.preemption import StopSignals
from tests.test_finetune import base_models, data
from tests.test_pretrain import (
    KILL_CHILD,
    cli_flags,
    read_log,
    tiny_args,
    tiny_overrides,
    train_file,
    weights,
)

# module-scoped fixtures of test_pretrain.py, test_finetune.py
__all__ = ["base_models", "data", "train_file"]

pretrain_module = importlib.import_module("hf_attn_variants.training.pretrain")
STEPS, STOP_AT = 6, 3


def run_args(folder: Path, train_file: str, **kwargs: object) -> PretrainArguments:
    """6 steps of a tiny entropy-invariant MLM with dropout, a checkpoint every step, the newest 2 kept."""
    defaults = {"train_file": train_file, "max_train_steps": STEPS, "checkpointing_steps": "1",
                "save_total_limit": 2, "num_warmup_steps": 1,
                "config_overrides": tiny_overrides("entropy_invariant", hidden_dropout_prob=0.1)}
    return tiny_args(folder, **{**defaults, **kwargs})


def pretrain_cli(args: PretrainArguments, *extra: str) -> int:
    """``hf-attn-variants pretrain`` in this process with the flags of ``args``; its exit status."""
    return main(["pretrain", *cli_flags(args), *extra])


def sigterm_after_step(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Send this process SIGTERM right after the ``step``-th optimizer step of the next run."""
    optimizer_step, calls = pretrain_module.optimizer_step, []

    def step_then_signal(run: object) -> object:
        norm = optimizer_step(run)
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return norm

    monkeypatch.setattr(pretrain_module, "optimizer_step", step_then_signal)


def checkpoint_names(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "checkpoints").iterdir())


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def max_weight_difference(a: Path, b: Path) -> float:
    first, second = weights(a), weights(b)
    assert sorted(first) == sorted(second)
    return max((first[k] - second[k]).abs().max().item() for k in first)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, train_file: str) -> dict[str, Path]:
    """``reference``: the uninterrupted run; ``preempted``: the same run stopped by SIGTERM after step 3
    (``code``: its exit status, ``stderr``: what it printed)."""
    root = tmp_path_factory.mktemp("resume")
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    stderr = io.StringIO()
    try:
        pretrain(run_args(root / "reference", train_file))
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(stderr):
            sigterm_after_step(patch, STOP_AT)
            code = pretrain_cli(run_args(root / "preempted", train_file))
    finally:
        torch.set_num_threads(torch_threads)
    return {"reference": root / "reference", "preempted": root / "preempted", "code": code,
            "stderr": stderr.getvalue()}


def copy_of(runs: dict[str, Path], tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(runs["preempted"], folder)
    return folder


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sigterm_checkpoints_the_current_step_and_exits_with_the_documented_code(runs) -> None:
    folder = runs["preempted"]
    assert runs["code"] == PREEMPTED_EXIT_CODE == 75
    line = f"hf-attn-variants pretrain: preempted: stopped by SIGTERM after step 3 and wrote the " \
           f"checkpoint '{folder / 'checkpoints' / 'step_3'}'; run the same command again to resume " \
           f"(exit status 75)."
    assert runs["stderr"].strip().splitlines() == [line], runs["stderr"]
    assert checkpoint_names(folder) == ["step_2", "step_3"]  # --save_total_limit 2
    assert not (folder / "model.safetensors").exists()
    assert [row["step"] for row in read_log(folder)] == [1, 2, 3]
    record = RunRecord.read(folder)
    assert record is not None and record.command == "pretrain" and not record.finished
    state = json.loads((folder / "checkpoints" / "step_3" / "training_state.json").read_text())
    assert state["completed_steps"] == 3 and "model.safetensors" in state["files"]
    # what a resume on another number of processes is checked against (check_checkpoint_kind)
    assert state["global_batch_size"] == 4 and state["gradient_accumulation_steps"] == 1
    assert len(state["files"]["model.safetensors"]["sha256"]) == 64


def test_a_rerun_with_other_arguments_is_refused_and_the_same_command_resumes(
    runs, train_file, tmp_path, capsys, caplog, one_thread
) -> None:
    folder = copy_of(runs, tmp_path)
    before = snapshot(folder)
    assert pretrain_cli(run_args(folder, train_file, seed=4, learning_rate=2e-3)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "--seed 3 there, 4 here" in err and "--learning_rate 0.001 there, 0.002 here" in err, err
    assert "--overwrite_output_dir" in err
    assert snapshot(folder) == before, "a refused run wrote into the folder"

    with caplog.at_level(logging.INFO, logger="hf_attn_variants"):
        assert pretrain_cli(run_args(folder, train_file)) == 0
    resumed = [r.getMessage() for r in caplog.records if "resuming from" in r.getMessage()]
    assert len(resumed) == 1 and str(folder / "checkpoints" / "step_3") in resumed[0], resumed
    assert max_weight_difference(folder, runs["reference"]) == 0.0
    assert [r["loss"] for r in read_log(folder)] == [r["loss"] for r in read_log(runs["reference"])]
    assert checkpoint_names(folder) == ["step_3", "step_5", "step_6"]  # the newest 2 and the one resumed from
    assert RunRecord.read(folder).finished

    capsys.readouterr()
    assert pretrain_cli(run_args(folder, train_file)) == 2  # finished: refused
    assert "holds the finished model of this same pretrain run" in capsys.readouterr().err


def test_overwrite_output_dir_clears_the_folder_first(runs, train_file, tmp_path, capsys) -> None:
    folder = copy_of(runs, tmp_path)
    (folder / "notes.txt").write_text("from the earlier run\n")
    assert pretrain_cli(run_args(folder, train_file, seed=4, max_train_steps=2, checkpointing_steps=None),
                        "--overwrite_output_dir") == 0
    assert not (folder / "checkpoints").exists() and not (folder / "notes.txt").exists()
    assert [r["step"] for r in read_log(folder)] == [1, 2]
    assert RunRecord.read(folder).arguments["seed"] == 4

    inside = folder / "data.txt"
    shutil.copy(train_file, inside)
    assert pretrain_cli(run_args(folder, str(inside)), "--overwrite_output_dir") == 2
    assert "--overwrite_output_dir would clear" in capsys.readouterr().err and inside.exists()


def test_a_truncated_checkpoint_is_named_and_automatic_resume_skips_it(runs, train_file, tmp_path, capsys,
                                                                       caplog, one_thread) -> None:
    folder = copy_of(runs, tmp_path)
    broken = folder / "checkpoints" / "step_3" / "model.safetensors"
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])  # a copy that stopped half-way
    staging = folder / "checkpoints" / ".step_4.tmp"  # what kill -9 leaves when it hits a save: never resumed
    shutil.copytree(folder / "checkpoints" / "step_2", staging)
    (staging / "training_state.json").unlink()
    (folder / "checkpoints" / ".step_9.tmp").mkdir()  # a second Ctrl-C during a save: the next one removes it

    assert pretrain_cli(run_args(folder, train_file), "--resume_from_checkpoint", str(broken.parent)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert (str(broken) in err and "recorded at save" in err
            and str(folder / "checkpoints" / "step_2") in err), err
    assert main(["export", "--model_name_or_path", str(broken.parent), "--output_dir",
                 str(tmp_path / "hub")]) == 2  # exporting it names the same file, writes nothing
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(broken) in err and "step_2" in err, err
    assert not (tmp_path / "hub").exists()

    with caplog.at_level(logging.INFO, logger="hf_attn_variants"):
        assert pretrain_cli(run_args(folder, train_file)) == 0
    messages = [r.getMessage() for r in caplog.records]
    skipped = [m for m in messages if "skipping the broken checkpoint" in m]
    assert len(skipped) == 1 and str(broken) in skipped[0], messages
    assert any("resuming from" in m
               and m.split("resuming from ")[1].startswith(str(folder / "checkpoints" / "step_2"))
               for m in messages), messages
    assert max_weight_difference(folder, runs["reference"]) == 0.0
    assert not list((folder / "checkpoints").glob(".*.tmp"))


def test_a_truncated_training_state_is_named_and_automatic_resume_skips_it(runs, train_file, tmp_path, capsys,
                                                                          caplog, one_thread) -> None:
    """``training_state.json`` cut to 20 bytes: named explicitly, one sentence naming that file and the newest
    complete checkpoint before it; ``latest`` and the automatic resume of a rerun warn and use that one."""
    folder = copy_of(runs, tmp_path)
    state_file = folder / "checkpoints" / "step_3" / "training_state.json"
    state_file.write_bytes(state_file.read_bytes()[:20])
    latest = tmp_path / "latest"
    shutil.copytree(folder, latest)
    before = snapshot(folder)

    assert pretrain_cli(run_args(folder, train_file), "--resume_from_checkpoint", str(state_file.parent)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{state_file} is not valid JSON (20 bytes; cut short?)" in err, err
    assert f"the newest complete checkpoint before it is '{folder / 'checkpoints' / 'step_2'}'" in err, err
    assert "not a checkpoint folder" not in err
    assert snapshot(folder) == before

    for output_dir, extra in ((folder, ()), (latest, ("--resume_from_checkpoint", "latest"))):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hf_attn_variants"):
            assert pretrain_cli(run_args(output_dir, train_file), *extra) == 0
        messages = [r.getMessage() for r in caplog.records]
        skipped = [m for m in messages if "skipping the broken checkpoint" in m]
        broken_state = output_dir / "checkpoints" / "step_3" / "training_state.json"
        assert len(skipped) == 1 and f"{broken_state} is not valid JSON" in skipped[0], messages
        resumed = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO
                   and "esum" in r.getMessage()]
        assert (len(resumed) == 1
                and f"resuming from {output_dir / 'checkpoints' / 'step_2'} (step 2)" in resumed[0])
        assert max_weight_difference(output_dir, runs["reference"]) == 0.0


KILL_WAIT_S = 180


def one_process_environment() -> dict[str, str]:
    """This environment for a single-process ``pretrain`` child: one thread (as ``runs``), no launcher
    variables."""
    launcher = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")
    return {**{k: v for k, v in os.environ.items() if k not in launcher}, "OMP_NUM_THREADS": "1"}


def kill_9_after_checkpoint(command: list[str], folder: Path, step: int, cwd: Path) -> None:
    """Start ``command``; as soon as ``checkpoints/step_<step>/training_state.json`` is there, SIGKILL it."""
    written = folder / "checkpoints" / f"step_{step}" / "training_state.json"
    with (cwd / "killed.stderr").open("w") as stderr:
        process = subprocess.Popen(command, env=one_process_environment(), cwd=cwd, stdout=subprocess.DEVNULL,
                                   stderr=stderr)
        deadline = time.time() + KILL_WAIT_S
        try:
            while time.time() < deadline and process.poll() is None and not written.exists():
                time.sleep(0.01)
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL, (cwd / "killed.stderr").read_text()[-3000:]


@pytest.mark.slow
def test_kill_9_after_a_checkpoint_and_the_same_command_resumes_exactly(runs, train_file, tmp_path) -> None:
    """A real ``kill -9`` (nothing caught, nothing flushed) right after step 2's checkpoint; the same command
    again, without ``--resume_from_checkpoint``: one line names the newest complete checkpoint, and the final
    weights are the uninterrupted run's (``runs["reference"]``, one thread as here) exactly."""
    folder = tmp_path / "run"
    command = [sys.executable, "-c", KILL_CHILD, "pretrain", *cli_flags(run_args(folder, train_file))]
    kill_9_after_checkpoint(command, folder, 2, tmp_path)
    assert not (folder / "model.safetensors").exists()
    complete = [p for p in (folder / "checkpoints").glob("step_*") if (p / "training_state.json").exists()]
    newest = max(complete, key=lambda p: int(p.name.removeprefix("step_")))
    step = int(newest.name.removeprefix("step_"))
    assert 2 <= step < STEPS

    rerun = subprocess.run(command, env=one_process_environment(), cwd=tmp_path, capture_output=True,
                           text=True, timeout=KILL_WAIT_S, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    said = [line for line in rerun.stderr.splitlines() if " INFO " in line and "esum" in line]  # [Rr]esum…
    assert len(said) == 1, rerun.stderr[-3000:]
    assert f"pretrain: resuming from {newest} (step {step}), the newest complete checkpoint" in said[0], said
    assert max_weight_difference(folder, runs["reference"]) == 0.0
    assert [r["loss"] for r in read_log(folder)] == [r["loss"] for r in read_log(runs["reference"])]


def test_a_checkpoint_without_a_manifest_is_probed(runs, tmp_path) -> None:
    """Checkpoints written before manifests: a truncated safetensors file is still named, not a traceback."""
    from hf_attn_variants.training.checkpoints import read_pretrain_checkpoint

    folder = copy_of(runs, tmp_path) / "checkpoints" / "step_3"
    state = json.loads((folder / "training_state.json").read_text())
    del state["files"]
    (folder / "training_state.json").write_text(json.dumps(state))
    checkpoint = read_pretrain_checkpoint(folder)
    assert checkpoint.problem() is None
    weights_file = folder / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:-100])
    assert str(weights_file) in checkpoint.problem()


# ---------------------------------------------------------------- finetune
hooks_module = importlib.import_module("hf_attn_variants.training.trainer_hooks")


def finetune_cli(folder: Path, data: dict[str, str], base: str, *extra: str) -> int:
    """``hf-attn-variants finetune`` in this process: 6 steps of sequence classification, no periodic
    checkpoint."""
    return main(["finetune", "--model_name_or_path", base, "--train_file", data["train"], "--validation_file",
                 data["dev"], "--max_seq_length", "16", "--output_dir", str(folder), "--max_steps",
                 str(STEPS), "--per_device_train_batch_size", "16", "--learning_rate", "3e-3",
                 "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--seed", "0",
                 "--use_cpu", "true", *extra])


def test_finetune_sigterm_checkpoints_refuses_other_arguments_and_resumes(
    data, base_models, tmp_path, capsys, caplog, monkeypatch, one_thread
) -> None:
    base = base_models["entropy_invariant"]
    reference, folder = tmp_path / "reference", tmp_path / "run"
    assert finetune_cli(reference, data, base) == 0

    on_step_end = hooks_module.CheckpointGuard.on_step_end

    def signal_at_step_3(self, args, state, control, **kwargs):
        if state.global_step == STOP_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return on_step_end(self, args, state, control, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(hooks_module.CheckpointGuard, "on_step_end", signal_at_step_3)
        capsys.readouterr()
        assert finetune_cli(folder, data, base) == PREEMPTED_EXIT_CODE
    err = capsys.readouterr().err
    assert f"stopped by SIGTERM after step 3 and wrote the checkpoint '{folder / 'checkpoint-3'}'" in err, err
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-3"]
    assert "model.safetensors" in json.loads(
        (folder / "checkpoint-3" / "checkpoint_manifest.json").read_text())["files"]
    assert not (folder / "model.safetensors").exists()

    before = snapshot(folder)
    assert finetune_cli(folder, data, base, "--learning_rate", "1e-3") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--learning_rate 0.003 there, 0.001 here" in err, err
    assert snapshot(folder) == before

    # Written by two processes: Trainer would count the data position in other batches. Refused, naming both.
    manifest = folder / "checkpoint-3" / "checkpoint_manifest.json"
    recorded = ("processes", "examples_per_batch", "gradient_accumulation_steps", "batch_per_process",
                "train_sampling_strategy")
    assert {key: json.loads(manifest.read_text())[key] for key in recorded} == {
        "processes": 1, "examples_per_batch": 16, "gradient_accumulation_steps": 1, "batch_per_process": 16,
        "train_sampling_strategy": "random"}
    for name, changed, words in (
            ("two-processes", {"processes": 2, "examples_per_batch": 32},
             "trained on 32 examples a batch over 2 process(es), this launch takes 16 "
             "(per_device_train_batch_size 16 × 1 process(es))"),
            ("before-examples-were-recorded", {"processes": 2, "examples_per_batch": None},
             "16 × 2 process(es) = 32 examples a batch, this launch has 16 × 1 = 16")):
        other = tmp_path / name
        shutil.copytree(folder, other)
        record = {key: value for key, value in {**json.loads(manifest.read_text()), **changed}.items()
                  if value is not None}
        (other / "checkpoint-3" / "checkpoint_manifest.json").write_text(json.dumps(record))
        written = snapshot(other)
        assert finetune_cli(other, data, base) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "error: --resume_from_checkpoint: " in err, err
        assert words in err, err
        assert snapshot(other) == written

    with caplog.at_level(logging.INFO, logger="hf_attn_variants"):
        assert finetune_cli(folder, data, base) == 0
    assert any("resuming from" in r.getMessage() and str(folder / "checkpoint-3") in r.getMessage()
               for r in caplog.records)
    assert max_weight_difference(folder, reference) == 0.0
    assert finetune_cli(folder, data, base) == 2
    assert "holds the finished model of this same finetune run" in capsys.readouterr().err


def test_finetune_names_a_broken_checkpoint_file_and_automatic_resume_skips_it(
    data, base_models, tmp_path, capsys, caplog, monkeypatch, one_thread
) -> None:
    """``checkpoint-2`` (``--save_steps 2``) and ``checkpoint-3`` (SIGTERM after step 3). A truncated file of
    ``checkpoint-3``, or its manifest cut short, named explicitly: one sentence naming that file and
    ``checkpoint-2``; the automatic resume of the same command warns and continues from ``checkpoint-2``."""
    base = base_models["entropy_invariant"]
    saves = ("--save_strategy", "steps", "--save_steps", "2")
    reference, folder = tmp_path / "reference", tmp_path / "run"
    assert finetune_cli(reference, data, base, *saves) == 0

    on_step_end = hooks_module.CheckpointGuard.on_step_end

    def signal_at_step_3(self, args, state, control, **kwargs):
        if state.global_step == STOP_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        return on_step_end(self, args, state, control, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(hooks_module.CheckpointGuard, "on_step_end", signal_at_step_3)
        assert finetune_cli(folder, data, base, *saves) == PREEMPTED_EXIT_CODE
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    manifest_cut = tmp_path / "manifest-cut"
    shutil.copytree(folder, manifest_cut)
    broken = folder / "checkpoint-3" / "model.safetensors"
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
    manifest = manifest_cut / "checkpoint-3" / "checkpoint_manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:20])

    for output_dir, bad_file, problem in ((folder, broken, "recorded at save"),
                                          (manifest_cut, manifest,
                                           "is not valid JSON (20 bytes; cut short?)")):
        capsys.readouterr()
        before = snapshot(output_dir)
        assert finetune_cli(output_dir, data, base, *saves, "--resume_from_checkpoint",
                            str(output_dir / "checkpoint-3")) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert str(bad_file) in err and problem in err, err
        assert f"the newest complete checkpoint before it is '{output_dir / 'checkpoint-2'}'" in err, err
        assert snapshot(output_dir) == before
        hub = tmp_path / f"hub-{output_dir.name}"
        assert main(["export", "--model_name_or_path", str(output_dir / "checkpoint-3"), "--output_dir",
                     str(hub)]) == 2  # export checks the manifest too
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(bad_file) in err and "checkpoint-2" in err, err
        assert not hub.exists()

    unfinished = tmp_path / "unfinished"  # a second Ctrl-C during the save: no manifest was written
    shutil.copytree(manifest_cut, unfinished)
    (unfinished / "checkpoint-3" / "checkpoint_manifest.json").unlink()
    assert main(["export", "--model_name_or_path", str(unfinished / "checkpoint-3"), "--output_dir",
                 str(tmp_path / "hub-unfinished")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checkpoint_manifest.json" in err and "checkpoint-2" in err, err
    assert main(["export", "--model_name_or_path", str(unfinished / "checkpoint-2"), "--output_dir",
                 str(tmp_path / "hub-complete")]) == 0
    card = (tmp_path / "hub-complete" / "README.md").read_text()
    assert "the checkpoint saved after training step 2 of the run's" in card, card
    assert f"(sequence_classification) on `{data['train']}`" in card, card
    capsys.readouterr()

    with caplog.at_level(logging.INFO, logger="hf_attn_variants"):
        assert finetune_cli(folder, data, base, *saves) == 0
    messages = [r.getMessage() for r in caplog.records]
    skipped = [m for m in messages if "skipping the broken checkpoint" in m]
    assert len(skipped) == 1 and str(broken) in skipped[0], messages
    resumed = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO
               and "resuming from" in r.getMessage()]
    assert len(resumed) == 1 and f"resuming from {folder / 'checkpoint-2'} (step 2)" in resumed[0], messages
    assert max_weight_difference(folder, reference) == 0.0


# ---------------------------------------------------------------- signals in other processes
SECOND_SIGNAL_CHILD = r"""
import os, signal, time
from hf_attn_variants.training.preemption import REPEAT_WINDOW_S, StopSignals
with StopSignals() as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    # the same notice twice (a scheduler and torchrun's agent): one request
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    print("requested" if stop.requested else "missed", flush=True)
    time.sleep(REPEAT_WINDOW_S + 0.1)
    os.kill(os.getpid(), signal.SIGUSR1)  # a second request: the process ends at once
    time.sleep(60)
    print("still running", flush=True)
"""


def test_a_second_signal_ends_the_process_at_once() -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", SECOND_SIGNAL_CHILD], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == -signal.SIGUSR1, result.stderr[-2000:]
    assert result.stdout.split() == ["requested"]
    assert time.monotonic() - started < 50


WORKER_PID_AND_SLOW_STEPS = r"""
import importlib, os, pathlib, sys, time
pathlib.Path(os.environ["PID_DIR"], os.environ["RANK"] + ".pid").write_text(str(os.getpid()))
pretrain_module = importlib.import_module("hf_attn_variants.training.pretrain")
collate = pretrain_module.collate_blocks
def slow_collate(items):  # about 0.3 s per step: the test signals one worker in the middle of a step
    time.sleep(0.3)
    return collate(items)
pretrain_module.collate_blocks = slow_collate
from hf_attn_variants.cli import main
sys.exit(main(sys.argv[1:]))
"""


def torchrun(args: PretrainArguments, cwd: Path, script: Path | None = None, **env: str) -> subprocess.Popen:
    """Start ``torchrun --standalone --nproc_per_node 2`` of ``pretrain`` (accelerate DDP on gloo) with
    ``args``."""
    target = [str(script)] if script else ["-m", "hf_attn_variants"]
    environ = {k: v for k, v in os.environ.items()
               if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    environ.update(OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", **env)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               *target, "pretrain", *cli_flags(args)]
    return subprocess.Popen(command, env=environ, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        _, err = process.communicate(timeout=timeout)
    finally:
        process.kill()
    return process.returncode, err


@pytest.mark.slow
def test_sigterm_with_two_processes_stops_both_at_one_step_and_the_rerun_resumes_exactly(train_file,
                                                                                         tmp_path) -> None:
    """torchrun, 2 gloo processes (DDP): SIGTERM reaches rank 1 only, in the middle of a step; both ranks
    finish that step, write its checkpoint and exit 75; the same command then resumes to the uninterrupted
    run's weights."""
    common = {"max_train_steps": STEPS, "checkpointing_steps": None, "save_total_limit": None}
    reference, folder = tmp_path / "reference", tmp_path / "run"
    code, err = finish(torchrun(run_args(reference, train_file, **common), tmp_path))
    assert code == 0, err[-4000:]

    script, pid_dir = tmp_path / "slow_pretrain.py", tmp_path / "pids"
    script.write_text(WORKER_PID_AND_SLOW_STEPS)
    pid_dir.mkdir()
    process = torchrun(run_args(folder, train_file, **common), tmp_path, script, PID_DIR=str(pid_dir))
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        log = folder / "train_log.jsonl"
        if log.exists() and len(log.read_text().splitlines()) >= 2 and (pid_dir / "1.pid").exists():
            time.sleep(0.1)  # into the next step
            os.kill(int((pid_dir / "1.pid").read_text()), signal.SIGTERM)
            break
        time.sleep(0.02)
    code, err = finish(process)
    assert code != 0 and "exitcode  : 75" in err and "exitcode  : -" not in err, err[-4000:]
    stopped = [line for line in err.splitlines() if "preempted: stopped by SIGTERM" in line]
    assert len(stopped) == 1, err[:6000]  # one line, from the main process
    names = [p.name for p in (folder / "checkpoints").iterdir()]
    assert len(names) == 1 and names[0].startswith("step_"), names
    step = int(names[0].removeprefix("step_"))
    assert 2 <= step < STEPS and read_log(folder)[-1]["step"] == step
    assert {"rng_state_0.json",
            "rng_state_1.json"} <= {p.name for p in (folder / "checkpoints" / names[0]).iterdir()}

    code, err = finish(torchrun(run_args(folder, train_file, **common), tmp_path))
    assert code == 0, err[-4000:]
    assert f"resuming from {folder / 'checkpoints' / names[0]} (step {step})" in err
    assert max_weight_difference(folder, reference) == 0.0


# ---------------------------------------------------------------- the rule for prune and lengthgen
def test_lengthgen_extends_a_study_with_more_runs_and_refuses_other_settings(tmp_path) -> None:
    from hf_attn_variants.cli_utils import FlagError
    from hf_attn_variants.lengthgen.arguments import LengthGenArguments
    from hf_attn_variants.lengthgen.cli import LENGTHGEN_RULE
    from hf_attn_variants.training.outputs import check_output_folder, finish_run, json_arguments, start_run

    def arguments(**kwargs: object) -> dict:
        return json_arguments(LengthGenArguments(output_dir=str(tmp_path), quick=True, **kwargs))

    first = arguments(seeds=[0])
    start_run(LENGTHGEN_RULE, check_output_folder(LENGTHGEN_RULE, tmp_path, first), first)
    finish_run(tmp_path)
    assert check_output_folder(LENGTHGEN_RULE, tmp_path, first).same_run  # a finished study is reused
    more = arguments(seeds=[0, 1], variants=["ei_standard", "gau_softmax"], finetune=True)
    assert check_output_folder(LENGTHGEN_RULE, tmp_path, more).same_run
    with pytest.raises(FlagError, match=r"--learning_rate 0\.002 there, 0\.01 here") as refused:
        check_output_folder(LENGTHGEN_RULE, tmp_path, arguments(seeds=[0], learning_rate=0.01))
    assert refused.value.flag == "output_dir" and "--overwrite_output_dir" in str(refused.value)


def assert_refused_in_one_line(code: int, err: str, flag_text: str) -> None:
    """Exit status 2 and one line naming the differing flag and ``--overwrite_output_dir``, no traceback."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert flag_text in lines[0] and "--overwrite_output_dir" in lines[0], err


def test_lengthgen_command_refuses_a_study_folder_with_other_arguments_and_writes_nothing(
    tmp_path, capsys, one_thread
) -> None:
    """A real ``lengthgen --quick`` study (one variant, seconds), then the same command with another
    ``--learning_rate``: refused before anything is written, every byte of the folder as it was."""
    out = tmp_path / "study"
    argv = ["lengthgen", "--quick", "--output_dir", str(out), "--num_threads", "1", "--disable_tqdm",
            "--no_plot", "--variants", "synthesizer_random_vanilla"]
    assert main(argv) == 0
    before = snapshot(out)
    capsys.readouterr()
    code = main([*argv, "--learning_rate", "0.01"])
    recorded = RunRecord.read(out).arguments["learning_rate"]
    assert_refused_in_one_line(code, capsys.readouterr().err,
                               f"--learning_rate {json.dumps(recorded)} there, 0.01 here")
    assert snapshot(out) == before


def test_prune_command_refuses_a_folder_with_other_arguments_and_writes_nothing(tmp_path, capsys,
                                                                                one_thread) -> None:
    """A real ``prune`` run of a tiny classifier, then the same command with another ``--fraction``: refused
    before anything is written, every byte of the folder as it was."""
    from tests.test_pruning_cli import make_model, sentences, write_csv
    from tests.test_pruning_cli import tokenizer as word_tokenizer

    model_dir, out, train = tmp_path / "model", tmp_path / "out", tmp_path / "train.csv"
    make_model("entropy_invariant").save_pretrained(model_dir)
    word_tokenizer().save_pretrained(model_dir)
    write_csv(train, sentences(24))
    argv = ["prune", "--model_name_or_path", str(model_dir), "--train_file", str(train), "--output_dir",
            str(out), "--threshold", "none", "--max_heads_pruned", "0.5", "--batch_size", "8",
            "--num_importance_examples", "8"]
    assert main([*argv, "--fraction", "0.25"]) == 0
    before = snapshot(out)
    capsys.readouterr()
    code = main([*argv, "--fraction", "0.5"])
    assert_refused_in_one_line(code, capsys.readouterr().err, "--fraction 0.25 there, 0.5 here")
    assert snapshot(out) == before


def test_prune_refuses_its_own_finished_run_and_redoes_an_unfinished_one(tmp_path) -> None:
    from hf_attn_variants.cli_utils import FlagError
    from hf_attn_variants.pruning.cli import PRUNE_RULE
    from hf_attn_variants.training.outputs import check_output_folder, finish_run, start_run

    arguments = {"model_name_or_path": "runs/clf", "fraction": 0.1, "output_dir": str(tmp_path)}
    start_run(PRUNE_RULE, check_output_folder(PRUNE_RULE, tmp_path, arguments), arguments)
    (tmp_path / "curve.json").write_text("{}")
    assert check_output_folder(PRUNE_RULE, tmp_path, arguments).same_run  # crashed before the end: redone
    finish_run(tmp_path)
    with pytest.raises(FlagError, match="holds the finished model of this same prune run"):
        check_output_folder(PRUNE_RULE, tmp_path, arguments)
    with pytest.raises(FlagError, match="--fraction 0.1 there, 0.2 here"):
        check_output_folder(PRUNE_RULE, tmp_path, {**arguments, "fraction": 0.2})
    assert check_output_folder(PRUNE_RULE, tmp_path, arguments, overwrite=True).clear


def test_overwrite_refuses_to_clear_the_working_directory(tmp_path, monkeypatch) -> None:
    from hf_attn_variants.cli_utils import FlagError
    from hf_attn_variants.training.outputs import OutputRule, check_output_folder

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("mine\n")
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(FlagError, match="holds the working directory") as refused:
        check_output_folder(OutputRule("pretrain"), tmp_path, {}, overwrite=True)
    assert refused.value.flag == "overwrite_output_dir"


def test_overwrite_refuses_to_clear_the_checkpoint_it_would_resume_from(runs, train_file, tmp_path,
                                                                        capsys) -> None:
    """--overwrite_output_dir with --resume_from_checkpoint latest would delete the checkpoint before loading
    it: refused in one sentence, every byte of the folder as it was."""
    folder = copy_of(runs, tmp_path)
    before = snapshot(folder)
    assert pretrain_cli(run_args(folder, train_file), "--overwrite_output_dir", "--resume_from_checkpoint",
                        "latest") == 2
    assert "--overwrite_output_dir would clear" in capsys.readouterr().err
    assert snapshot(folder) == before


def test_rotation_keeps_the_checkpoint_just_saved_and_leaves_later_leftovers(tmp_path) -> None:
    """Resumed from step_2 after a broken step_4 was skipped: saving step_3 with a limit of 1 keeps step_3
    (and step_2, resumed from); the broken step_4, a leftover of the interrupted attempt, is neither counted
    nor deleted."""
    from hf_attn_variants.training.checkpoints import Checkpoint, rotate

    folders = {step: tmp_path / f"step_{step}" for step in (1, 2, 3, 4)}
    for path in folders.values():
        path.mkdir()
    checkpoints = [Checkpoint(path, step, {}) for step, path in folders.items()]
    deleted = rotate(checkpoints, 1, keep=(folders[2],), saved=folders[3])
    assert deleted == [folders[1]]
    assert all(folders[step].exists() for step in (2, 3, 4)) and not folders[1].exists()


def test_a_finetune_checkpoint_resumes_only_with_the_batches_it_was_trained_with(tmp_path) -> None:
    """``finetune.check_batches``: the same per-device batch × processes and accumulation resume; another
    product or accumulation is one ``FlagError`` naming ``resume_from_checkpoint``; a checkpoint from before
    the manifest recorded its processes is taken as it is."""
    from types import SimpleNamespace

    from hf_attn_variants.cli_utils import FlagError
    from hf_attn_variants.training.finetune import check_batches

    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    (checkpoint / "training_args.json").write_text(
        json.dumps({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}))
    launch = SimpleNamespace(per_device_train_batch_size=4, world_size=2, gradient_accumulation_steps=2)
    assert check_batches(str(checkpoint), launch) == str(checkpoint)  # no processes recorded: as before
    (checkpoint / "checkpoint_manifest.json").write_text(json.dumps({"step": 3, "processes": 1, "files": {}}))
    assert check_batches(str(checkpoint), launch) == str(checkpoint)  # 8 × 1 = 4 × 2
    for changed, words in (({"world_size": 4}, "= 8 examples a batch, this launch has 4 × 4 = 16"),
                           ({"gradient_accumulation_steps": 1},
                            "gradient_accumulation_steps=2, this launch has 1")):
        with pytest.raises(FlagError, match="resume_from_checkpoint") as error:
            check_batches(str(checkpoint), SimpleNamespace(**{**vars(launch), **changed}))
        assert words in str(error.value)


def test_a_checkpoint_saved_after_a_resume_records_this_runs_batch(tmp_path) -> None:
    """``CheckpointGuard.on_save``: Trainer keeps a resumed checkpoint's ``state.train_batch_size`` (8 from a
    run of 8 × 2 processes, resumed on 16 × 1); the manifest records this run's batch (16), and the batch
    ``auto_find_batch_size`` settled on only where Trainer restores it."""
    from types import SimpleNamespace

    folder = tmp_path / "checkpoint-6"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    state = SimpleNamespace(global_step=6, train_batch_size=8, is_world_process_zero=True)
    for auto_find, expected in ((False, 16), (True, 8)):
        args = SimpleNamespace(output_dir=str(tmp_path), world_size=1, train_batch_size=16,
                               auto_find_batch_size=auto_find, gradient_accumulation_steps=1,
                               accelerator_config=SimpleNamespace(split_batches=False),
                               train_sampling_strategy="group_by_length")
        hooks_module.CheckpointGuard(StopSignals()).on_save(args, state, SimpleNamespace())
        manifest = json.loads((folder / "checkpoint_manifest.json").read_text())
        assert (manifest["processes"], manifest["examples_per_batch"], manifest["batch_per_process"],
                manifest["train_sampling_strategy"]) == (1, expected, expected, "group_by_length"), auto_find

def test_a_finetune_checkpoint_resumes_only_with_the_batch_trainer_derives(tmp_path) -> None:
    """``finetune.check_batches`` with a manifest that records ``examples_per_batch``: compared with the batch
    ``Trainer`` derives over all processes (DataParallel GPUs, ``split_batches``, ``auto_find_batch_size``'s
    batch restored from ``trainer_state.json``), not with the flags."""
    from types import SimpleNamespace

    from hf_attn_variants.cli_utils import FlagError
    from hf_attn_variants.training.finetune import check_batches

    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    (checkpoint / "training_args.json").write_text(
        json.dumps({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}))
    (checkpoint / "checkpoint_manifest.json").write_text(
        json.dumps({"step": 3, "processes": 2, "examples_per_batch": 16, "files": {}}))
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 3, "train_batch_size": 4}))

    def launch(**changed):
        fields = {"per_device_train_batch_size": 8, "n_gpu": 1, "world_size": 2,
                  "gradient_accumulation_steps": 1, "auto_find_batch_size": False,
                  "accelerator_config": SimpleNamespace(split_batches=False)}
        fields.update(changed)
        per_process = fields["per_device_train_batch_size"] * fields["n_gpu"]  # TrainingArguments' property
        return SimpleNamespace(**fields, train_batch_size=per_process)

    for same in ({}, {"per_device_train_batch_size": 4, "world_size": 4},
                 {"per_device_train_batch_size": 4, "n_gpu": 2, "world_size": 2},  # 4 × 2 GPUs × 2 processes
                 {"per_device_train_batch_size": 16, "world_size": 4,
                  "accelerator_config": SimpleNamespace(split_batches=True)},  # one batch of 16 split over 4
                 {"per_device_train_batch_size": 2, "world_size": 4, "auto_find_batch_size": True}):  # 4 × 4
        assert check_batches(str(checkpoint), launch(**same)) == str(checkpoint), same
    for changed, words in (
            ({"n_gpu": 2},
             "takes 32 (per_device_train_batch_size 8 × 2 GPUs of one process × 2 process(es))"),
            ({"accelerator_config": SimpleNamespace(split_batches=True)},
             "takes 8 (per_device_train_batch_size 8, split over 2 process(es))"),
            ({"auto_find_batch_size": True},
             "takes 8 (auto_find_batch_size's 4 of the checkpoint × 2 process(es))")):
        with pytest.raises(FlagError, match="resume_from_checkpoint") as error:
            check_batches(str(checkpoint), launch(**changed))
        trained = "was trained on 16 examples a batch over 2 process(es), this launch "
        assert trained + words in str(error.value)

    # Trainer's FSDP sharded-state route writes no training arguments: the manifest alone is compared
    (checkpoint / "training_args.json").unlink()
    (checkpoint / "checkpoint_manifest.json").write_text(json.dumps(
        {"step": 3, "processes": 2, "examples_per_batch": 16, "gradient_accumulation_steps": 2, "files": {}}))
    assert check_batches(str(checkpoint), launch(gradient_accumulation_steps=2)) == str(checkpoint)
    for changed, words in (({"gradient_accumulation_steps": 1},
                            "gradient_accumulation_steps=2, this launch has 1"),
                           ({"gradient_accumulation_steps": 2, "world_size": 1}, "this launch takes 8")):
        with pytest.raises(FlagError, match="resume_from_checkpoint") as error:
            check_batches(str(checkpoint), launch(**changed))
        assert words in str(error.value)


def test_a_finetune_checkpoint_resumes_only_with_the_sampler_order_it_was_trained_with(tmp_path) -> None:
    """``finetune.check_sampler`` (through ``check_batches``): another ``train_sampling_strategy`` is refused;
    ``group_by_length`` also needs the same per-process batch (its megabatches), ``batch_rebalance`` the same
    per-process batch and processes; ``random`` takes any split of the same batch. A manifest from before
    the sampler was recorded passes."""
    from types import SimpleNamespace

    from hf_attn_variants.cli_utils import FlagError
    from hf_attn_variants.training.finetune import check_batches

    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    manifest = {"step": 3, "processes": 2, "examples_per_batch": 16, "gradient_accumulation_steps": 1,
                "batch_per_process": 8, "files": {}}

    def launch(strategy: str, per_device: int, processes: int) -> SimpleNamespace:
        return SimpleNamespace(per_device_train_batch_size=per_device, train_batch_size=per_device, n_gpu=1,
                               world_size=processes, gradient_accumulation_steps=1,
                               auto_find_batch_size=False, train_sampling_strategy=strategy,
                               accelerator_config=SimpleNamespace(split_batches=False))

    def check(recorded: str | None, *shape) -> str:
        record = {**manifest, **({"train_sampling_strategy": recorded} if recorded else {})}
        (checkpoint / "checkpoint_manifest.json").write_text(json.dumps(record))
        try:
            check_batches(str(checkpoint), launch(*shape))
        except FlagError as error:
            return str(error)
        return "resumes"

    assert check("random", "random", 4, 4) == "resumes"
    assert check(None, "group_by_length", 4, 4) == "resumes"  # recorded before the sampler was
    assert check("group_by_length", "group_by_length", 8, 2) == "resumes"
    assert check("batch_rebalance", "batch_rebalance", 8, 2) == "resumes"
    assert "train_sampling_strategy='random', this launch has 'sequential'" in check(
        "random", "sequential", 8, 2)
    refused = check("group_by_length", "group_by_length", 4, 4)
    assert ("group_by_length, which orders the examples by the batch: 8 examples a batch per process then, "
            "4 examples a batch per process in this launch") in refused
    assert "8 examples a batch per process × 2 process(es) then, 4 examples a batch per process × 4" in check(
        "batch_rebalance", "batch_rebalance", 4, 4)
