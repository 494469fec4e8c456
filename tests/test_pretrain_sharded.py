"""pretrain sharded by Transformers' ``DistributedConfig`` under ``torchrun`` (two gloo processes on CPU).

Each launch is ``python -m torch.distributed.run --standalone --nproc_per_node 2 -m hf_attn_variants pretrain
... --fsdp_size 2`` (or ``--tp_size 2``), with CLM (every rank's micro-batch holds the same number of target
tokens, so the mean over ranks is the global mean) and dropout 0, and is compared with an in-process
single-process run with ``per_device_train_batch_size × dp_size`` — every logged loss and the final weights
within 1e-4 — after checking that the workers' model really is sharded as its plans declare (each parameter
the planned DTensor, recorded by rank 0 right after loading: tests/parallel_child.py
``record_sharded_loads``). The kill-and-resume test compares a resumed FSDP2 run with an uninterrupted one. A
launch costs about 20 s on a 2-core machine, mostly the imports of two Python processes; each test bundles its
checks per launch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_attn_variants import FAMILIES
from hf_attn_variants.cli import main
from hf_attn_variants.cli_utils import FlagError
from hf_attn_variants.training import PretrainArguments, build_config, pretrain
from hf_attn_variants.training.pretrain import STATE_FILE, check_checkpoint_kind
from hf_attn_variants.training.sharded import ParallelLayout, check_parallel_plans, model_class_for
from tests.parallel_child import placement_recording_env, recorded_placements
from tests.remote_code import assert_standalone_code, clean_python
from tests.test_parallelism import assert_sharded_as_planned
from tests.test_pretrain import (
    KILL_CHILD,
    REPO,
    cli_flags,
    read_log,
    tiny_args,
    tiny_overrides,
    train_file,
    weights,
)
from tests.utils import needs_fsdp2_torch

__all__ = ["train_file"]  # the module-scoped fixture, shared with test_pretrain.py

TOLERANCE = 1e-4
LAUNCH_TIMEOUT = 300


def no_dropout(family: str) -> str:
    return tiny_overrides(family, hidden_dropout_prob=0, attention_probs_dropout_prob=0)


def clm_args(folder: Path, family: str, train_file: str, **kwargs: object) -> PretrainArguments:
    """6 CLM steps of a tiny ``family`` model (warm-up 1, uneven evaluation shards: 7 blocks, batch 2)."""
    defaults = {"train_file": train_file, "objective": "clm", "max_train_steps": 6, "num_warmup_steps": 1,
                "max_eval_samples": 7, "per_device_eval_batch_size": 2,
                "config_overrides": no_dropout(family)}
    return tiny_args(folder, family, **{**defaults, **kwargs})


def torchrun_command(args: PretrainArguments, script: Path | None = None) -> list[str]:
    """``torchrun --standalone --nproc_per_node <layout>`` of ``hf-attn-variants pretrain`` (or
    ``script``)."""
    target = [str(script)] if script else ["-m", "hf_attn_variants"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            str(args.layout.world_size), *target, "pretrain", *cli_flags(args)]


def launch_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1"}


def launch_failure(stderr: str) -> str:
    """What a failed launch says: the last error lines of every rank other than 0 (a rank that aborts first
    leaves rank 0 only a "Connection reset by peer"), then the tail of the whole log."""
    others = [line for line in stderr.splitlines()
              if line.startswith("[rank") and not line.startswith("[rank0]") or "terminate called" in line]
    return "\n".join(others[-40:]) + "\n…\n" + stderr[-4000:]


def launch_script_command(args: PretrainArguments) -> list[str]:
    """The same launch through ``scripts/accelerate/launch_sharded.sh`` (with this interpreter)."""
    return ["bash", str(REPO / "scripts" / "accelerate" / "launch_sharded.sh"), str(args.layout.world_size),
            *cli_flags(args)]


def torchrun(args: PretrainArguments, cwd: Path, *,
             through_script: bool = False) -> dict[str, dict[str, str] | None]:
    """Run the launch; return the placements of the parameters of the model its workers loaded sharded (rank
    0's, right after loading: ``tests.parallel_child.placements``)."""
    command = launch_script_command(args) if through_script else torchrun_command(args)
    env = {**launch_env(), "PYTHON": sys.executable, **placement_recording_env(cwd)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, cwd=cwd,
                            check=False)
    assert result.returncode == 0, launch_failure(result.stderr)
    return recorded_placements(cwd)


def assert_sharded_like(placements: dict[str, dict[str, str] | None], single: Path, **sizes: int) -> None:
    """``placements`` (of ``torchrun``) are what the plans make of the parameters of the model in
    ``single``."""
    names = dict(AutoModelForCausalLM.from_pretrained(single).named_parameters())
    assert_sharded_as_planned(placements, names, **sizes)


def max_differences(expected: Path, got: Path) -> tuple[float, float]:
    """(largest |Δ loss| over the log rows and the final eval_loss, largest |Δ weight|) of two run folders."""
    want, have = read_log(expected), read_log(got)
    assert [r["step"] for r in have] == [r["step"] for r in want]
    losses = [abs(a["loss"] - b["loss"]) for a, b in zip(want, have)]
    losses.append(abs(want[-1]["eval_loss"] - have[-1]["eval_loss"]))
    a, b = weights(expected), weights(got)
    assert sorted(a) == sorted(b)
    return max(losses), max((a[k] - b[k]).abs().max().item() for k in a)


def logits(folder: Path, **kwargs: object) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()
    ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids).logits


def assert_same_folder_kind(single: Path, sharded: Path, family: str) -> None:
    """The sharded folder holds what the single-process one holds (no sharding leftovers), its code is the
    standalone remote code, and it reloads with plain ``from_pretrained`` into the same logits."""
    # no checkpoints/.initial_model
    assert {p.name for p in single.iterdir()} == {p.name for p in sharded.iterdir()}
    assert_standalone_code(sharded, family)
    config_single, config_sharded = (json.loads((f / "config.json").read_text()) for f in (single, sharded))
    assert config_sharded["auto_map"] == config_single["auto_map"]
    assert config_sharded["architectures"] == config_single["architectures"]
    torch.testing.assert_close(logits(sharded), logits(single), atol=TOLERANCE, rtol=0)


REMOTE_CHILD = r"""
import importlib.util, sys, torch, transformers
assert importlib.util.find_spec("hf_attn_variants") is None
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert not type(model).__module__.startswith("hf_attn_variants"), type(model).__module__
ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    torch.save(model(input_ids=ids).logits, sys.argv[2])
"""


def assert_loads_with_remote_code_only(folder: Path, tmp_path: Path) -> None:
    """``trust_remote_code=True`` in a clean environment (installed Transformers, no hf_attn_variants)."""
    (tmp_path / "remote_child.py").write_text(REMOTE_CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "hf_modules"),
               TRANSFORMERS_VERBOSITY="error")
    out = tmp_path / "remote_logits.pt"
    result = subprocess.run([str(clean_python()), str(tmp_path / "remote_child.py"), str(folder), str(out)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    torch.testing.assert_close(torch.load(out), logits(folder), atol=1e-5, rtol=0)


def has_tp_plan(family: str) -> bool:
    config = build_config(family, config_overrides=no_dropout(family), max_seq_length=16)
    return bool(model_class_for(config, AutoModelForCausalLM)[1].tp_plan)


# ---------------------------------------------------------------- equality with one process
@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
@needs_fsdp2_torch()
def test_fsdp2_pretrain_equals_one_process_with_the_same_global_batch(tmp_path, train_file,
                                                                      family: str) -> None:
    single, sharded = tmp_path / "single", tmp_path / "fsdp"
    pretrain(clm_args(single, family, train_file, per_device_train_batch_size=8))
    placements = torchrun(clm_args(sharded, family, train_file, per_device_train_batch_size=4, fsdp_size=2),
                          tmp_path, through_script=family == "gau")
    assert_sharded_like(placements, single, fsdp_size=2)

    info = json.loads((sharded / "pretrain_args.json").read_text())
    assert (info["num_processes"], info["distributed_type"], info["fsdp_size"]) == (2, "FSDP2", 2)
    loss, weight = max_differences(single, sharded)
    assert loss <= TOLERANCE and weight <= TOLERANCE, (loss, weight)
    assert_same_folder_kind(single, sharded, family)
    if family == "gau":
        assert_loads_with_remote_code_only(sharded, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tensor_parallel_pretrain_equals_one_process(tmp_path, train_file, family: str) -> None:
    if not has_tp_plan(family):
        pytest.fail(f"{family} has no tensor-parallel plan (base_model_tp_plan); every family must have one")
    single, sharded = tmp_path / "single", tmp_path / "tp"
    pretrain(clm_args(single, family, train_file, per_device_train_batch_size=4))
    placements = torchrun(clm_args(sharded, family, train_file, per_device_train_batch_size=4, tp_size=2),
                          tmp_path)
    assert_sharded_like(placements, single, tp_size=2)

    info = json.loads((sharded / "pretrain_args.json").read_text())
    assert (info["num_processes"], info["distributed_type"], info["tp_size"]) == (2, "TP", 2)
    loss, weight = max_differences(single, sharded)
    assert loss <= TOLERANCE and weight <= TOLERANCE, (loss, weight)
    assert_same_folder_kind(single, sharded, family)


@pytest.mark.slow
@needs_fsdp2_torch()
def test_tensor_parallel_times_fsdp2_pretrain_on_four_processes_equals_one_process(tmp_path,
                                                                                   train_file) -> None:
    """TP 2 × FSDP2 2 (the smallest layout with both): GAU, whose TP split is its own style, with an untied LM
    head (a tied one is refused under TP × FSDP2: docs/scaling.md)."""
    overrides = tiny_overrides("gau", hidden_dropout_prob=0, attention_probs_dropout_prob=0,
                               tie_word_embeddings=False)
    single, sharded = tmp_path / "single", tmp_path / "tp_fsdp"
    pretrain(clm_args(single, "gau", train_file, per_device_train_batch_size=8, config_overrides=overrides))
    placements = torchrun(clm_args(sharded, "gau", train_file, per_device_train_batch_size=4, fsdp_size=2,
                                   tp_size=2, config_overrides=overrides), tmp_path)
    assert_sharded_like(placements, single, tp_size=2, fsdp_size=2)

    info = json.loads((sharded / "pretrain_args.json").read_text())
    assert (info["num_processes"], info["distributed_type"]) == (4, "FSDP2+TP")
    loss, weight = max_differences(single, sharded)
    assert loss <= TOLERANCE and weight <= TOLERANCE, (loss, weight)
    assert_same_folder_kind(single, sharded, "gau")


# ---------------------------------------------------------------- kill and resume
def kill_job(process: subprocess.Popen, pid_dir: Path) -> None:
    """SIGKILL the torchrun agent and its workers (torchrun starts each worker in a session of its own, so the
    agent's process group does not hold them; the workers write their pids to ``pid_dir``)."""
    process.send_signal(signal.SIGKILL)
    for pid_file in pid_dir.glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


WORKER_PID = ("import os, pathlib; pathlib.Path(os.environ['PID_DIR'], os.environ['RANK'] + '.pid')"
              ".write_text(str(os.getpid()))\n")


@pytest.mark.slow
@needs_fsdp2_torch()
def test_fsdp2_kill_after_checkpoint_and_resume_reproduces_the_uninterrupted_run(tmp_path,
                                                                                 train_file) -> None:
    k = 3
    common = {"checkpointing_steps": str(k), "per_device_train_batch_size": 4, "fsdp_size": 2,
              "config_overrides": tiny_overrides("entropy_invariant", hidden_dropout_prob=0.1)}
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    torchrun(clm_args(reference, "entropy_invariant", train_file, **common), tmp_path)

    script, pid_dir = tmp_path / "slow_pretrain.py", tmp_path / "pids"
    script.write_text(WORKER_PID + KILL_CHILD)  # KILL_CHILD: 0.4 s per batch, then hf_attn_variants.cli.main
    pid_dir.mkdir()
    stderr = (tmp_path / "killed.stderr").open("w")
    process = subprocess.Popen(torchrun_command(clm_args(killed, "entropy_invariant", train_file, **common),
                                                script),
                               env={**launch_env(), "PID_DIR": str(pid_dir)}, stdout=subprocess.DEVNULL,
                               stderr=stderr, cwd=tmp_path)
    deadline = time.time() + LAUNCH_TIMEOUT
    try:
        while time.time() < deadline and process.poll() is None:
            log = killed / "train_log.jsonl"
            if (killed / "checkpoints" / f"step_{k}").is_dir() and log.exists() and any(
                json.loads(line)["step"] > k + 1 for line in log.read_text().splitlines() if line.strip()
            ):
                kill_job(process, pid_dir)
                break
            time.sleep(0.02)
    finally:
        kill_job(process, pid_dir)
        process.wait()
        stderr.close()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "killed.stderr").read_text()[-3000:]
    assert not (killed / "model.safetensors").exists()
    assert k + 1 < read_log(killed)[-1]["step"] < 2 * k  # steps k+1, k+2 ran: the optimizer state matters
    before_kill = {r["step"]: r for r in read_log(killed)}

    torchrun(clm_args(killed, "entropy_invariant", train_file, resume_from_checkpoint="latest", **common),
             tmp_path)
    expected, got = read_log(reference), read_log(killed)
    assert [r["step"] for r in got] == list(range(1, 2 * k + 1))
    for want, have in zip(expected, got):
        assert have["loss"] == pytest.approx(want["loss"], abs=1e-6), (want, have)
        assert have["lr"] == pytest.approx(want["lr"], abs=1e-12)
        if have["step"] in before_kill:  # the killed run's own rows after the checkpoint, too
            assert have["loss"] == pytest.approx(before_kill[have["step"]]["loss"], abs=1e-6)
    assert got[-1]["eval_loss"] == pytest.approx(expected[-1]["eval_loss"], abs=1e-6)
    loss, weight = max_differences(reference, killed)
    assert loss <= 1e-6 and weight <= 1e-6, (loss, weight)

    # issue 51: export takes a sharded run's checkpoint too (its full state, config.json and tokenizer)
    from safetensors.torch import load_file

    from hf_attn_variants.cli import main
    from hf_attn_variants.training.safe_state import read_tensors

    checkpoint, hub = reference / "checkpoints" / f"step_{k}", tmp_path / "hub"
    assert main(["export", "--model_name_or_path", str(checkpoint), "--output_dir", str(hub)]) == 0
    stored, exported = read_tensors(checkpoint / "model.safetensors"), load_file(hub / "model.safetensors")
    assert exported and all(torch.equal(value, stored[name]) for name, value in exported.items())


# ---------------------------------------------------------------- accelerate's FSDP2 config on CPU
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks what accelerate's FSDP config does without GPUs")
def test_accelerate_fsdp2_config_without_gpus_is_refused_before_writing(tmp_path, train_file) -> None:
    """Without GPUs, ``accelerate launch --config_file fsdp2.yaml`` starts every process as a run of its own
    (``DistributedType.NO``); ``pretrain`` refuses that instead of letting two runs write one folder."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / "scripts" / "accelerate" / "fsdp2.yaml"), "--num_processes", "2",
               "--mixed_precision", "no", "-m", "hf_attn_variants", "pretrain",
               *cli_flags(clm_args(out, "gau", train_file))]
    result = subprocess.run(command, env=launch_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
                            cwd=tmp_path, check=False)
    assert result.returncode != 0
    assert "accelerate runs each of them alone" in result.stderr and "launch_sharded.sh" in result.stderr
    assert not out.exists()


# ---------------------------------------------------------------- bad flags (no launch)
@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (["--fsdp_size", "0"], {}, "--fsdp_size must be a positive integer, got 0"),
        (["--tp_size", "-1"], {}, "--tp_size must be a positive integer"),
        (["--fsdp_size", "2"], {},
         ("--fsdp_size: dp_replicate_size=1 × fsdp_size=2 × tp_size=1 shards the model "
          "over 2 processes; launch it with `torchrun --nproc_per_node 2")),
        (["--fsdp_size", "4"], {"WORLD_SIZE": "2"},
         ("--fsdp_size: dp_replicate_size=1 × fsdp_size=4 × tp_size=1 "
          "= 4 processes, but this launch has WORLD_SIZE=2")),
        (["--dp_replicate_size", "2", "--fsdp_size", "2"], {"WORLD_SIZE": "2"}, "WORLD_SIZE=2"),
        (["--tp_size", "2"], {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"},
         "--tp_size: this is an accelerate FSDP"),
        (["--fsdp_size", "2", "--mixed_precision", "fp16"], {"WORLD_SIZE": "2"},
         "--mixed_precision='fp16' needs a"),
    ],
    ids=["fsdp-zero", "tp-negative", "without-torchrun", "sizes-not-world", "hsdp-not-world",
         "accelerate-fsdp-launch", "fp16"],
)
def test_bad_sharding_flags_give_one_clear_error(tmp_path, capsys, monkeypatch, flags, env, expected) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if "WORLD_SIZE" not in env:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "out"
    code = main(["pretrain", "--output_dir", str(out), "--model_type", "gau", "--max_train_steps", "1",
                 *flags])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_model_without_a_plan_is_refused_naming_the_flag() -> None:
    class NoPlans:
        def __init__(self) -> None:
            self.tp_plan: dict[str, str] = {}
            self.fsdp_plan: dict[str, str] = {}

    with pytest.raises(FlagError, match="tp_size=2: NoPlans has no tensor-parallel plan") as error:
        check_parallel_plans(NoPlans(), ParallelLayout(tp_size=2))
    assert error.value.flag == "tp_size"
    with pytest.raises(FlagError, match="dp_replicate_size: NoPlans has no FSDP plan"):
        check_parallel_plans(NoPlans(), ParallelLayout(dp_replicate_size=2))


def test_resuming_across_kinds_of_launch_or_global_batches_is_refused(tmp_path) -> None:
    """A checkpoint of the other kind of launch, or of another global batch (per device × data-parallel
    processes: a DDP checkpoint resumed on fewer processes trained on its blocks again and moved its epoch
    back, silently) or gradient accumulation, is refused naming --resume_from_checkpoint; a checkpoint
    without the record (accelerate runs before it) is taken."""
    folder = tmp_path / "checkpoints" / "step_2"
    folder.mkdir(parents=True)
    # an accelerate checkpoint
    (folder / STATE_FILE).write_text(json.dumps({"completed_steps": 2, "epoch": 0}))
    with pytest.raises(FlagError, match="written by an accelerate run"):
        check_checkpoint_kind(folder, tiny_args(tmp_path, fsdp_size=2), 2)
    check_checkpoint_kind(folder, tiny_args(tmp_path), 1)
    (folder / STATE_FILE).write_text(json.dumps({"completed_steps": 2, "epoch": 0, "global_batch_size": 8,
                                                 "gradient_accumulation_steps": 1}))
    with pytest.raises(FlagError, match=r"global batch of 8 blocks, this run has per_device_train_batch_size "
                                        r"× 1 data-parallel process\(es\) = 4"):
        check_checkpoint_kind(folder, tiny_args(tmp_path, per_device_train_batch_size=4), 1)
    check_checkpoint_kind(folder, tiny_args(tmp_path, per_device_train_batch_size=4), 2)
    with pytest.raises(FlagError, match="gradient_accumulation_steps=1, this run has 2"):
        check_checkpoint_kind(folder, tiny_args(tmp_path, per_device_train_batch_size=4,
                                                gradient_accumulation_steps=2), 2)
    (folder / STATE_FILE).write_text(json.dumps({"completed_steps": 2, "epoch": 0, "sharded": True,
                                                 "global_batch_size": 8}))
    with pytest.raises(FlagError, match="written by a sharded"):
        check_checkpoint_kind(folder, tiny_args(tmp_path), 1)
    with pytest.raises(FlagError, match="global batch of 8 blocks"):
        check_checkpoint_kind(folder, tiny_args(tmp_path, per_device_train_batch_size=2, fsdp_size=2), 2)
    check_checkpoint_kind(folder, tiny_args(tmp_path, per_device_train_batch_size=4, fsdp_size=2), 2)


def test_tensor_parallel_ranks_count_as_devices_in_the_plan_and_mfu() -> None:
    """Under ``--tp_size 2`` on 2 processes the start line said "1 process" and MFU divided by 1 device
    (``runtime.num_processes`` counts the data-parallel ranks): the devices are every rank of the mesh."""
    from types import SimpleNamespace

    from hf_attn_variants.training.pretrain import device_count

    def run(layout: ParallelLayout, data_ranks: int) -> SimpleNamespace:
        return SimpleNamespace(args=SimpleNamespace(layout=layout),
                               runtime=SimpleNamespace(num_processes=data_ranks))

    assert device_count(run(ParallelLayout(tp_size=2), 1)) == 2
    assert device_count(run(ParallelLayout(tp_size=2, fsdp_size=2), 2)) == 4
    assert device_count(run(ParallelLayout(), 3)) == 3  # accelerate: every process is a data rank
