"""What ``finetune`` adds to ``Trainer``'s checkpoints: a manifest per checkpoint, a stop on SIGTERM/SIGUSR1.

``Trainer`` writes ``<output_dir>/checkpoint-<step>/`` (weights, optimizer, scheduler, RNG states,
``trainer_state.json``) without saying when a folder is whole. ``CheckpointGuard`` (a ``TrainerCallback``):

- ``on_save``: once every rank has saved, the main process replaces the pickled ``training_args.bin`` by
  ``training_args.json`` (``Trainer``'s other files load with ``weights_only=True``: no file of a finetune
  checkpoint needs pickle) and writes ``checkpoint_manifest.json`` (size and sha256 of every file, and the
  number of processes, the examples a batch took over them, the accumulation and the sampler, atomically,
  last); ``trainer_checkpoints`` reads a folder without one as a save that did not finish, and
  ``checkpoints.newest_complete`` checks the rest;
- ``on_step_end``: at the steps where the ranks agree (``preemption.Agreement``: every step in one process,
  about every second of training with several; one all-reduce) they settle whether a stop signal (or, from
  the command line, Ctrl-C) arrived anywhere; if so every rank asks ``Trainer`` to save this step's
  checkpoint and stop (``stopped_step``), unless this was the last step anyway. Otherwise, once
  ``checkpoint_minutes`` have passed since the last save on any rank (``--checkpointing_minutes``),
  ``Trainer`` saves this step's checkpoint, so that a kill loses at most that much training whatever
  ``--save_steps`` says. A sharded
  finetune (``DistributedConfig``) stops without a checkpoint: ``Trainer`` can
  neither checkpoint nor resume the optimizer of a model sharded at load time.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .checkpoints import Checkpoint, file_manifest, list_checkpoints, read_json_file
from .preemption import Agreement, StopSignals

MANIFEST_FILE = "checkpoint_manifest.json"
ARGUMENTS_FILE = "training_args.json"
CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def read_trainer_checkpoint(path: Path, *, require_manifest: bool = True) -> Checkpoint | None:
    """A ``Trainer`` checkpoint folder (``checkpoint-<step>``, or any folder with a ``trainer_state.json``) as
    a ``Checkpoint``; ``None`` for other folders. Without a manifest it counts as unfinished when
    ``require_manifest`` (a run that writes manifests), else it is probed (a checkpoint from before them)."""
    match = CHECKPOINT_NAME.fullmatch(path.name)
    trainer_state = read_json_file(path / "trainer_state.json") or {}
    if match is None and "global_step" not in trainer_state:
        return None
    step = int(match.group(1)) if match else int(trainer_state["global_step"])
    manifest = read_json_file(path / MANIFEST_FILE)
    files = manifest.get("files") if manifest else None
    return Checkpoint(path, step, files, MANIFEST_FILE if require_manifest else None)


def trainer_checkpoints(output_dir: str | Path) -> list[Checkpoint]:
    """The ``checkpoint-<step>`` folders of ``output_dir``."""
    return list_checkpoints(Path(output_dir), "checkpoint-*", read_trainer_checkpoint)


def write_manifest(folder: Path, step: int, processes: int = 1,
                   batching: dict[str, int] | None = None) -> None:
    """``checkpoint_manifest.json`` of ``folder`` (every other file's size and sha256, the ``processes`` that
    trained it and its ``batching``: ``examples_per_batch`` over them, ``gradient_accumulation_steps``,
    ``batch_per_process`` and ``train_sampling_strategy``, as ``Trainer`` counts the data position in batches
    and some samplers order the examples by them), written atomically."""
    staging = folder / f".{MANIFEST_FILE}.tmp"
    record: dict[str, Any] = {"step": step, "processes": processes, **(batching or {})}
    record["files"] = file_manifest(folder, exclude=(MANIFEST_FILE, staging.name))
    staging.write_text(json.dumps(record))
    os.replace(staging, folder / MANIFEST_FILE)


def splits_batches(args: Any) -> bool:
    """Whether accelerate splits each of ``Trainer``'s batches over the processes
    (``accelerator_config.split_batches``) instead of giving every process one."""
    return bool(getattr(getattr(args, "accelerator_config", None), "split_batches", False))


def sampling_strategy(args: Any) -> str:
    """``Trainer``'s training sampler: ``train_sampling_strategy`` (``"random"``, ``"sequential"``,
    ``"group_by_length"``, ``"batch_rebalance"``), or ``group_by_length`` in the Transformers releases before
    it."""
    strategy = getattr(args, "train_sampling_strategy", None)
    if strategy is None:
        strategy = "group_by_length" if getattr(args, "group_by_length", False) else "random"
    return str(getattr(strategy, "value", strategy))


BATCH_ORDERED_SAMPLERS = {"group_by_length": False, "batch_rebalance": True}
"""Samplers whose order of examples depends on the per-process batch (``LengthGroupedSampler``'s megabatches,
``BatchRebalanceSampler``'s effective batch), and whether it also depends on the processes (True)."""


def per_process_batch(args: Any, settled: int | None = None) -> int:
    """``Trainer``'s batch per process: ``args.train_batch_size`` (the per-device batch × the GPUs of a
    DataParallel process), or under ``auto_find_batch_size`` the batch it ``settled`` on, which it keeps in
    ``state.train_batch_size`` and restores from a checkpoint's. Without that flag a resumed run's state keeps
    the checkpoint's value, so it is not read."""
    return (settled if args.auto_find_batch_size else None) or args.train_batch_size


def examples_per_batch(args: Any, per_process: int) -> int:
    """The examples one batch of ``Trainer``'s training dataloader takes over all processes: ``per_process``
    (``Trainer``'s ``train_batch_size``: the per-device batch × the GPUs of a DataParallel process, or what
    ``auto_find_batch_size`` settled on) × ``args.world_size``, or × 1 under ``split_batches``. Not accounted
    for: tensor-, context- and sequence-parallel ranks, which share a batch."""
    return per_process * (1 if splits_batches(args) else args.world_size)


def arguments_as_json(folder: Path, args: Any) -> None:
    """Replace ``Trainer``'s pickled ``TrainingArguments`` (``training_args.bin``: a whole Python object,
    which only an unrestricted unpickler reads) in ``folder`` by their JSON (``training_args.json``), so that
    no file a finetune writes needs pickle."""
    from transformers.trainer import TRAINING_ARGS_NAME

    pickled = folder / TRAINING_ARGS_NAME
    if pickled.exists():
        (folder / ARGUMENTS_FILE).write_text(args.to_json_string())
        pickled.unlink()


def _barrier(args: Any) -> None:
    if args.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


class CheckpointGuard(TrainerCallback):
    """Manifests for ``Trainer``'s checkpoints and a stop at the same step on every rank (module
    docstring)."""

    def __init__(self, stop: StopSignals, *, can_checkpoint: bool = True,
                 checkpoint_minutes: float = 0.0) -> None:
        self.stop = stop
        self.can_checkpoint = can_checkpoint
        self.checkpoint_minutes = checkpoint_minutes if can_checkpoint else 0.0
        self.stopped_step: int | None = None
        self.last_save = time.perf_counter()
        self.agreement: Agreement | None = None
        """Made at the first step, on the launch's device."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Where the ranks agree (module docstring), stop (and checkpoint) after this step when any rank
        received a stop signal; else checkpoint when ``checkpoint_minutes`` have passed since the last save on
        any rank. Nothing at the last step, which ends the run anyway."""
        if state.global_step >= state.max_steps:
            return control
        if self.agreement is None:
            self.agreement = Agreement(args.device)
        if not self.agreement.due(state.global_step):
            return control
        minutes = self.checkpoint_minutes
        elapsed = bool(minutes) and time.perf_counter() - self.last_save >= 60.0 * minutes
        signal, timed = self.agreement.agree(state.global_step, [self.stop.number, int(elapsed)])
        if self.stop.settle(signal):
            control.should_save = self.can_checkpoint
            control.should_evaluate = False  # the time before the kill is short
            control.should_training_stop = True
            self.stopped_step = state.global_step
        elif timed:
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Write the arguments as JSON and the manifest of the checkpoint ``Trainer`` just saved (main
        process, after every rank saved)."""
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        _barrier(args)
        if state.is_world_process_zero and folder.is_dir():
            arguments_as_json(folder, args)
            per_process = per_process_batch(args, state.train_batch_size)
            batching = {"examples_per_batch": examples_per_batch(args, per_process),
                        "gradient_accumulation_steps": args.gradient_accumulation_steps,
                        "batch_per_process": per_process, "train_sampling_strategy": sampling_strategy(args)}
            write_manifest(folder, state.global_step, args.world_size, batching)
        _barrier(args)
        self.last_save = time.perf_counter()
        return control


class LogLines(TrainerCallback):
    """Under ``--disable_tqdm``, each of ``Trainer``'s logs as one line instead of a raw dict.

    ``finetune step 20 of 60 (epoch 1.00): loss 0.6931, grad_norm 1.234, learning_rate 4e-05`` replaces the
    ``PrinterCallback``'s dicts; timings and ``total_flos`` are left out (the end summary says how long it
    took)."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not state.is_local_process_zero or not logs:
            return
        shown = [f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                 for key, value in logs.items()
                 if key not in ("epoch", "total_flos") and not key.endswith(("_runtime", "_per_second"))]
        epoch = f" (epoch {logs['epoch']:.2f})" if isinstance(logs.get("epoch"), (int, float)) else ""
        if shown:
            print(f"finetune step {state.global_step:,} of {state.max_steps:,}{epoch}: {', '.join(shown)}",
                  flush=True)


__all__ = ["ARGUMENTS_FILE", "BATCH_ORDERED_SAMPLERS", "MANIFEST_FILE", "CheckpointGuard", "LogLines",
           "arguments_as_json", "examples_per_batch", "per_process_batch", "read_trainer_checkpoint",
           "sampling_strategy", "splits_batches", "trainer_checkpoints", "write_manifest"]
