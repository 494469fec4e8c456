"""Nothing runs that a file carries; one run per folder; a full disk loses nothing (issue 40).

- Planted payloads: every file of a ``pretrain`` checkpoint and of a ``finetune`` checkpoint (full model, and
  a LoRA adapter) is replaced by a pickle whose loading would create a marker file; the manifest is fixed as
  an attacker would (size and sha256), and the run resumes from that checkpoint. The marker must never appear,
  and the command either resumes (exit 0) or ends in one line naming the file (exit 2) — never a traceback.
- Concurrency: a second ``pretrain`` into the folder of a live one is refused naming the first one's process
  id, and the folder ends holding one run; ``finetune`` and ``prune`` are refused likewise while another
  process holds the folder; a lock left by a killed process does not block.
- A save that fails (``OSError``, as a full disk raises it) half-way: one line with the space it needed and
  exit status 74; the earlier checkpoint stays complete and the rerun resumes from it.

The in-process runs are tiny (4 steps of a 2-layer model); the two concurrent ``pretrain`` processes take most
of the time (about a minute in all on 2 cores).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_attn_variants.cli import main
from hf_attn_variants.training.checkpoints import file_digest
from hf_attn_variants.training.runlock import OWNER_FILE
from hf_attn_variants.training.safe_state import SAVE_FAILED_EXIT_CODE
from tests.test_finetune import base_models, data
from tests.test_pretrain import cli_flags, read_log, tiny_args, train_file

# module-scoped fixtures of test_pretrain.py, test_finetune.py
__all__ = ["base_models", "data", "train_file"]

REPO = Path(__file__).resolve().parents[1]


class Payload:
    """Unpickling this runs ``touch <marker>`` (what a hostile checkpoint file does)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def plant(path: Path, marker: Path) -> None:
    """Replace ``path`` by a payload: Python code for a ``.py`` file (the model code a folder carries), a
    ``torch.save`` zip for the files torch loads, a bare pickle otherwise."""
    if path.suffix == ".py":
        path.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    elif path.suffix in (".pt", ".pth", ".bin"):
        torch.save(Payload(marker), path)
    else:
        path.write_bytes(pickle.dumps(Payload(marker)))


def fix_manifest(manifest_path: Path, folder: Path, name: str) -> None:
    """Record the planted file's size and sha256 in the checkpoint's manifest, as an attacker would."""
    if not manifest_path.exists() or manifest_path.name == name:
        return
    record = json.loads(manifest_path.read_text())
    record["files"][name] = {"size": (folder / name).stat().st_size, "sha256": file_digest(folder / name)}
    manifest_path.write_text(json.dumps(record))


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``hf-attn-variants ARGV`` in this process: exit status and stderr (an escaping exception fails the
    test)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(argv)
    return code, stderr.getvalue()


def check_outcome(code: int, err: str, marker: Path, planted: Path) -> None:
    """The payload did not run; resumed (0), or one error line naming the file (2)."""
    assert not marker.exists(), f"the payload in {planted.name} ran"
    assert "Traceback" not in err, err[-3000:]
    if code == 0:
        return
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and str(planted) in errors[0], (planted, err[-3000:])


def cases(folder: Path) -> list[str]:
    """Every file of a checkpoint folder, relative names."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------- pretrain
def pretrain_args(folder: Path, train_file: str, **kwargs: object) -> list[str]:
    return ["pretrain", *cli_flags(tiny_args(folder, train_file=train_file, **kwargs))]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, train_file) -> Path:
    """A finished 2-step run with its checkpoint ``step_2``."""
    folder = tmp_path_factory.mktemp("safety") / "run"
    code, err = run_cli(pretrain_args(folder, train_file, max_train_steps=2, checkpointing_steps="2"))
    assert code == 0, err
    return folder


@pytest.fixture(scope="module")
def streamed(tmp_path_factory, train_file) -> Path:
    """The same with ``--streaming``: its checkpoint also holds the stream position (``data_state/``)."""
    folder = tmp_path_factory.mktemp("safety-streamed") / "run"
    code, err = run_cli(pretrain_args(folder, train_file, max_train_steps=2, checkpointing_steps="2",
                                      streaming=True))
    assert code == 0, err
    return folder


def test_pretrain_checkpoints_hold_no_pickle(pretrained) -> None:
    from hf_attn_variants.training.safe_state import load_weights_only, read_tensors

    checkpoint = pretrained / "checkpoints" / "step_2"
    assert cases(checkpoint) == ["config.json", "model.safetensors", "optimizer.pt", "rng_state_0.json",
                                 "scheduler.json", "tokenizer.json", "tokenizer_config.json",
                                 "training_state.json"]  # config and tokenizer: for export (issue 51)
    assert read_tensors(checkpoint / "model.safetensors")
    assert set(load_weights_only(checkpoint / "optimizer.pt")) == {"state", "param_groups"}
    for name in ("rng_state_0.json", "scheduler.json", "training_state.json"):
        json.loads((checkpoint / name).read_text())


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng_state_0.json", "scheduler.json",
                                  "training_state.json"])
def test_a_payload_planted_in_a_pretrain_checkpoint_never_runs(pretrained, train_file, tmp_path,
                                                               name) -> None:
    folder = tmp_path / "run"
    shutil.copytree(pretrained, folder)
    checkpoint = folder / "checkpoints" / "step_2"
    marker = tmp_path / "PAYLOAD_RAN"
    plant(checkpoint / name, marker)
    fix_manifest(checkpoint / "training_state.json", checkpoint, name)
    code, err = run_cli([*pretrain_args(folder, train_file, max_train_steps=3, checkpointing_steps="2"),
                         "--resume_from_checkpoint", str(checkpoint)])
    check_outcome(code, err, marker, checkpoint / name)


def test_a_payload_planted_in_a_stream_position_never_runs(streamed, train_file, tmp_path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(streamed, folder)
    checkpoint = folder / "checkpoints" / "step_2"
    assert "data_state/rank_0.json" in cases(checkpoint)
    marker = tmp_path / "PAYLOAD_RAN"
    plant(checkpoint / "data_state" / "rank_0.json", marker)
    fix_manifest(checkpoint / "training_state.json", checkpoint, "data_state/rank_0.json")
    code, err = run_cli([*pretrain_args(folder, train_file, max_train_steps=3, checkpointing_steps="2",
                                        streaming=True), "--resume_from_checkpoint", str(checkpoint)])
    check_outcome(code, err, marker, checkpoint / "data_state" / "rank_0.json")


def test_a_checkpoint_of_an_earlier_release_gets_one_sentence(pretrained, train_file, tmp_path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(pretrained, folder)
    checkpoint = folder / "checkpoints" / "step_2"
    state = json.loads((checkpoint / "training_state.json").read_text())
    del state["checkpoint_format"]
    # accelerate's save_state files instead
    for name in ("optimizer.pt", "scheduler.json", "rng_state_0.json"):
        (checkpoint / name).unlink()
        del state["files"][name]
    for name in ("custom_checkpoint_0.pkl", "optimizer.bin", "random_states_0.pkl"):
        (checkpoint / name).write_bytes(pickle.dumps(Payload(tmp_path / "PAYLOAD_RAN")))
        state["files"][name] = {"size": (checkpoint / name).stat().st_size,
                                "sha256": file_digest(checkpoint / name)}
    (checkpoint / "training_state.json").write_text(json.dumps(state))
    code, err = run_cli([*pretrain_args(folder, train_file, max_train_steps=3, checkpointing_steps="2"),
                         "--resume_from_checkpoint", str(checkpoint)])
    assert code == 2 and not (tmp_path / "PAYLOAD_RAN").exists()
    expected = (f"hf-attn-variants pretrain: error: --resume_from_checkpoint: {checkpoint} is a checkpoint "
                "of an earlier hf_attn_variants release, which kept its training state in pickle files "
                "(custom_checkpoint_0.pkl, optimizer.bin, random_states_0.pkl); this release never unpickles "
                "a checkpoint, so it cannot continue that run: start it afresh with --overwrite_output_dir "
                "(or into another --output_dir), or finish it with the release that wrote it.")
    assert err.strip().splitlines() == [expected], err


def test_no_source_file_loads_with_weights_only_false() -> None:
    hits = [str(p) for p in (REPO / "src").rglob("*.py") if "weights_only=False" in p.read_text()]
    assert hits == []


# ---------------------------------------------------------------- finetune
def finetune_args(folder: Path, data: dict[str, str], base: str, *extra: str) -> list[str]:
    return ["finetune", "--model_name_or_path", base, "--train_file", data["train"], "--validation_file",
            data["dev"], "--max_seq_length", "16", "--output_dir", str(folder),
            "--per_device_train_batch_size", "16", "--learning_rate", "3e-3", "--report_to", "none",
            "--disable_tqdm", "true", "--seed", "0", "--use_cpu", "true", "--save_strategy", "steps",
            "--save_steps", "2", "--eval_strategy", "no", *extra]


@pytest.fixture(scope="module", params=["full", "lora"])
def finetuned(request, tmp_path_factory, data, base_models) -> tuple[Path, list[str]]:
    """A finished 2-step finetune (full model, or a LoRA adapter) with its ``checkpoint-2``, and its flags."""
    folder = tmp_path_factory.mktemp(f"finetune-{request.param}") / "run"
    extra = ["--lora_r", "4"] if request.param == "lora" else []
    code, err = run_cli(finetune_args(folder, data, base_models["entropy_invariant"], "--max_steps", "2",
                                      *extra))
    assert code == 0, err
    return folder, extra


def test_finetune_writes_no_pickle(finetuned) -> None:
    from hf_attn_variants.training.safe_state import probe_file

    folder, _ = finetuned
    for path in [*folder.glob("*"), *(folder / "checkpoint-2").glob("*")]:
        assert path.name != "training_args.bin", path
        if path.is_file():
            probe_file(path)  # safetensors, JSON, or torch.load(weights_only=True)
    assert json.loads((folder / "checkpoint-2" / "training_args.json").read_text())["save_steps"] == 2


def test_a_payload_planted_in_a_finetune_checkpoint_never_runs(finetuned, data, base_models,
                                                               tmp_path) -> None:
    source, extra = finetuned
    names = cases(source / "checkpoint-2")
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
            "training_args.json"} <= set(names)
    assert ("adapter_model.safetensors" if extra else "model.safetensors") in names
    for name in names:
        folder = tmp_path / name.replace("/", "_") / "run"
        shutil.copytree(source, folder)
        checkpoint = folder / "checkpoint-2"
        marker = tmp_path / f"PAYLOAD_RAN_{name}"
        plant(checkpoint / name, marker)
        fix_manifest(checkpoint / "checkpoint_manifest.json", checkpoint, name)
        code, err = run_cli([*finetune_args(folder, data, base_models["entropy_invariant"], "--max_steps",
                                            "3", *extra), "--resume_from_checkpoint", str(checkpoint)])
        check_outcome(code, err, marker, checkpoint / name)


# ---------------------------------------------------------------- one run per folder
HOLDER = r"""
import sys, time
from hf_attn_variants.training.runlock import run_lock
with run_lock("pretrain", sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


@contextlib.contextmanager
def held(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder``'s run lock (killed with SIGKILL afterwards, as a crash would)."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, cwd=REPO,
                               text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def test_every_command_is_refused_while_another_process_writes_the_folder(tmp_path, train_file, data,
                                                                           base_models) -> None:
    folder = tmp_path / "busy"
    commands = {
        "pretrain": pretrain_args(folder, train_file),
        "finetune": finetune_args(folder, data, base_models["entropy_invariant"], "--max_steps", "2"),
        "prune": ["prune", "--model_name_or_path", base_models["entropy_invariant"], "--train_file",
                  data["train"], "--output_dir", str(folder)],
    }
    with held(folder) as holder:
        for command, argv in commands.items():
            code, err = run_cli(argv)
            assert code == 2, err
            lines = err.strip().splitlines()
            assert len(lines) == 1 and f"process {holder.pid} (pretrain, started " in lines[0], lines
            assert lines[0].startswith(f"hf-attn-variants {command}: error: --output_dir "
                                       f"'{folder}' is being written by another run right now"), lines
    # the killed holder's
    assert sorted(p.name for p in folder.iterdir()) == [".hf_attn_variants.lock", OWNER_FILE]
    # a dead process's lock: no block
    code, err = run_cli(pretrain_args(folder, train_file, max_train_steps=1))
    assert code == 0, err
    assert {p.name for p in folder.iterdir()}.isdisjoint({".hf_attn_variants.lock", OWNER_FILE})


def test_two_pretrain_runs_started_at_once_into_one_folder(tmp_path, train_file) -> None:
    """The first run waits in its first step until the second has ended, so that the two overlap for sure."""
    folder, go = tmp_path / "run", tmp_path / "go"
    argv = pretrain_args(folder, train_file, max_train_steps=6, checkpointing_steps="3")
    waiting = ("import importlib, pathlib, sys, time\n"
               "m = importlib.import_module('hf_attn_variants.training.pretrain')\n"
               "step, go = m.optimizer_step, pathlib.Path(sys.argv.pop(1))\n"
               "def wait(deadline=time.time() + 300):\n"
               "    while not go.exists() and time.time() < deadline:\n"
               "        time.sleep(0.05)\n"
               "m.optimizer_step = lambda run: (wait(), step(run))[1]\n"
               "from hf_attn_variants.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    first = subprocess.Popen([sys.executable, "-c", waiting, str(go), *argv], stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    deadline = time.time() + 120
    while not (folder / OWNER_FILE).exists() and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    try:
        second = subprocess.run([sys.executable, "-m", "hf_attn_variants", *argv], capture_output=True,
                                text=True, cwd=tmp_path, timeout=300, check=False)
    finally:
        go.touch()
    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 2, second.stderr[-3000:]
    refusal = [line for line in second.stderr.splitlines() if "error:" in line]
    assert (len(refusal) == 1
            and f"process {first.pid} (pretrain, started" in refusal[0]), second.stderr[-3000:]
    assert [row["step"] for row in read_log(folder)] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_3", "step_6"]
    assert json.loads((folder / "run.json").read_text())["finished"] is True


# ---------------------------------------------------------------- a full disk
def fail_second_call(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
    """``module.name`` raises ``OSError(ENOSPC)`` from its second call on (the first save succeeds)."""
    original, calls = getattr(module, name), []

    def failing(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, failing)


def test_a_checkpoint_that_fails_to_save_keeps_the_previous_one_and_the_rerun_resumes(tmp_path, train_file,
                                                                                      monkeypatch) -> None:
    from hf_attn_variants.training import safe_state

    folder = tmp_path / "run"
    argv = pretrain_args(folder, train_file, max_train_steps=4, checkpointing_steps="2")
    with monkeypatch.context() as patch:
        fail_second_call(patch, safe_state, "write_tensors")
        code, err = run_cli(argv)
    assert code == SAVE_FAILED_EXIT_CODE == 74, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hf-attn-variants pretrain: error: writing "
                               f"{folder / 'checkpoints' / '.step_4.tmp'} failed (No space left on device); "
                               "the save needs about "), lines
    assert "MB is free there; the checkpoints written before it are intact." in lines[0], lines
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_2"]
    code, err = run_cli(argv)
    assert code == 0, err
    assert [row["step"] for row in read_log(folder)] == [1, 2, 3, 4]


def test_a_final_save_that_fails_keeps_the_checkpoints_and_the_rerun_finishes(tmp_path, train_file,
                                                                              monkeypatch) -> None:
    from hf_attn_variants.training.runtime import AccelerateRuntime

    folder = tmp_path / "run"
    argv = pretrain_args(folder, train_file, max_train_steps=2, checkpointing_steps="1")

    def full_disk(self: object, model: object, output_dir: str) -> None:
        (Path(output_dir) / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(AccelerateRuntime, "save_model", full_disk)
        code, err = run_cli(argv)
    assert code == SAVE_FAILED_EXIT_CODE, err
    assert "its checkpoints are intact" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_1", "step_2"]
    code, err = run_cli(argv)
    assert code == 0, err
    assert json.loads((folder / "run.json").read_text())["finished"] is True


def test_a_finetune_checkpoint_that_fails_to_save_keeps_the_previous_one(tmp_path, data, base_models,
                                                                         monkeypatch, caplog) -> None:
    from transformers import Trainer

    folder = tmp_path / "run"
    argv = finetune_args(folder, data, base_models["entropy_invariant"], "--max_steps", "4")
    with monkeypatch.context() as patch:
        fail_second_call(patch, Trainer, "save_model")
        code, err = run_cli(argv)
    assert code == SAVE_FAILED_EXIT_CODE, err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert (len(errors) == 1 and "No space left on device" in errors[0]
            and "the save needs about" in errors[0]), err
    assert (folder / "checkpoint-2" / "checkpoint_manifest.json").is_file()  # complete; checkpoint-4 failed
    with caplog.at_level(logging.INFO, logger="hf_attn_variants"):
        code, err = run_cli(argv)
    assert code == 0, err
    assert f"finetune: resuming from {folder / 'checkpoint-2'} (step 2)" in caplog.text, caplog.text[-3000:]


def test_a_gathered_tied_head_is_written_once(tmp_path) -> None:
    """The full state gathered from FSDP2's shards has a tensor per name, so a sharded checkpoint stored the
    tied LM head twice (36 tensors against a DDP checkpoint's 35 and an alias); re-tied, it is one tensor and
    an alias, read back as the same values."""
    from safetensors import safe_open

    from hf_attn_variants import EntropyInvariantConfig, EntropyInvariantForCausalLM
    from hf_attn_variants.training.safe_state import read_tensors, retied, write_tensors

    model = EntropyInvariantForCausalLM(EntropyInvariantConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, is_decoder=True))
    gathered = {name: tensor.clone() for name, tensor in model.state_dict().items()}  # what a gather returns
    write_tensors(tmp_path / "model.safetensors", retied(model, gathered))
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    back = read_tensors(tmp_path / "model.safetensors")
    torch.testing.assert_close(back["lm_head.weight"], model.lm_head.weight.detach())
