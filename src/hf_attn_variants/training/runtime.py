"""The process side of ``pretrain``: who computes what, and how gradients, checkpoints and the final model
move.

``pretrain``'s loop (``pretrain.py``) talks to a ``TrainingRuntime`` only. Two implement it:

- ``AccelerateRuntime`` (this module): one process, or ``accelerate launch`` / ``torchrun`` with DDP or
  accelerate's FSDP — ``accelerator.prepare`` wraps model, optimizer and data loader; checkpoints are the
  pickle-free files of ``safe_state.py``. This is the path ``pretrain`` always had.
- ``ShardedRuntime`` (``sharded.py``): ``torchrun`` with ``--tp_size`` / ``--fsdp_size`` /
  ``--dp_replicate_size``; the model is sharded at load time by Transformers' ``DistributedConfig`` (FSDP2,
  tensor parallel, HSDP); its checkpoints are the same files, gathered from the shards, so they load into any
  layout of its launch.

``process_index`` / ``num_processes`` are the *data-parallel* rank and size (the ranks that see distinct
batches; tensor-parallel ranks of one data-parallel group share a batch and a rank). With ``device``,
``autocast()`` and ``reduce()`` they are what ``evaluation.evaluate_lm`` needs, so a runtime is passed to it
where an ``Accelerator`` would be.

accelerate's process-wide state. ``Accelerator`` keeps its state (device, process group, mixed precision) in
process-wide singletons: a second ``Accelerator`` in the same process must ask for the same mixed precision
as the first (an earlier in-process ``pretrain`` or ``Trainer``), else accelerate raises. Repeated in-process
``pretrain`` calls with the same ``--mixed_precision`` (the tests, the demo, the length study) work as they
are; a different one raises ``FlagError`` naming ``mixed_precision`` before anything is written, instead of
clearing accelerate's private singletons.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from ..cli_utils import FlagError
from .safe_state import load_training_state, save_training_state


class TrainingRuntime(Protocol):
    """What ``pretrain``'s loop needs from the processes it runs in (see the module docstring)."""

    process_index: int
    num_processes: int
    device: torch.device
    is_main_process: bool
    is_local_main_process: bool

    def wait_for_everyone(self) -> None: ...
    def main_process_first(self) -> contextlib.AbstractContextManager: ...
    def autocast(self) -> contextlib.AbstractContextManager: ...
    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor: ...
    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Any, sampler: Any,
                batch_size: int, collate_fn: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]: ...
    def batches_per_epoch(self) -> int: ...
    def epoch_batches(self, epoch: int, skip: int) -> Iterable[dict[str, torch.Tensor]]:
        """The micro-batches of ``epoch`` on this rank as host tensors (``pretrain`` makes the inputs on the
        host and moves them to ``device`` without waiting for it)."""
        ...

    def register_for_checkpointing(self, scheduler: Any) -> None: ...
    def forward_context(self) -> contextlib.AbstractContextManager: ...
    def accumulate(self, model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def clip_grad_norm_(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor: ...
    def optimizer_step_was_skipped(self) -> bool: ...
    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def save_state(self, folder: Path) -> None: ...
    def load_state(self, folder: Path) -> None: ...
    def save_model(self, model: torch.nn.Module, output_dir: str) -> None: ...
    def init_trackers(self, hparams: dict[str, Any]) -> None: ...
    def log(self, values: dict[str, Any], step: int) -> None: ...
    def describe(self) -> dict[str, Any]: ...
    def end_training(self) -> None: ...


def language_model(module: torch.nn.Module) -> torch.nn.Module:
    """The ``*ForMaskedLM``/``*ForCausalLM`` inside a training module (``TargetOnlyMLMLoss`` wraps one)."""
    from .modeling import TargetOnlyMLMLoss

    return module.model if isinstance(module, TargetOnlyMLMLoss) else module


def check_accelerate_precision(mixed_precision: str) -> None:
    """``FlagError`` naming ``mixed_precision`` when accelerate's process-wide state already holds another one
    (an earlier ``Accelerator`` in this process; accelerate cannot change it without a restart)."""
    from accelerate.state import AcceleratorState, is_initialized

    if not is_initialized():
        return
    current = AcceleratorState().mixed_precision
    if current != mixed_precision:
        raise FlagError("mixed_precision",
                        f"mixed_precision={mixed_precision!r}, but accelerate already runs with "
                        f"mixed_precision={current!r} in this process (its state is process-wide and fixed "
                        "by the first Accelerator); run this pretrain in a new process.")


def check_process_count(accelerator: Any) -> None:
    """``RuntimeError`` (before anything is written) when the launch started more processes (``WORLD_SIZE``)
    than accelerate runs together: ``accelerate launch`` with an FSDP or multi-GPU config on a machine without
    GPUs starts every process as a run of its own (``DistributedType.NO``), which would all write one
    folder."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and accelerator.num_processes != launched:
        raise RuntimeError(
            f"This launch started {launched} processes (WORLD_SIZE) but accelerate runs each of them alone "
            f"({accelerator.distributed_type}): accelerate's FSDP and multi-GPU configs need GPUs. On CPU "
            "use ACCELERATE_USE_CPU=1 (DDP: scripts/accelerate/ddp_cpu.yaml), or shard through torchrun with "
            "--fsdp_size/--tp_size (scripts/accelerate/launch_sharded.sh)."
        )


class AccelerateRuntime:
    """``TrainingRuntime`` on an ``accelerate.Accelerator`` (one process, DDP, accelerate's FSDP)."""

    def __init__(self, mixed_precision: str = "no", log_with: str | None = None,
                 project_dir: str | None = None) -> None:
        from accelerate import Accelerator

        check_accelerate_precision(mixed_precision)
        self.accelerator = Accelerator(mixed_precision=mixed_precision, log_with=log_with,
                                       project_dir=project_dir)
        check_process_count(self.accelerator)
        self.process_index = self.accelerator.process_index
        self.num_processes = self.accelerator.num_processes
        self.device = self.accelerator.device
        self.is_main_process = self.accelerator.is_main_process
        self.is_local_main_process = self.accelerator.is_local_main_process
        self._loader: Any = None
        self._sampler: Any = None
        self._model: Any = None
        self._optimizer: Any = None
        self._scheduler: Any = None

    # ---------------------------------------------------------------- processes
    def wait_for_everyone(self) -> None:
        """Barrier over all processes."""
        self.accelerator.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager:
        """The main process runs the block first (data caches), then the others."""
        return self.accelerator.main_process_first()

    def autocast(self) -> contextlib.AbstractContextManager:
        """accelerate's autocast for ``--mixed_precision`` (evaluation)."""
        return self.accelerator.autocast()

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        """``tensor`` summed (``"sum"``) or averaged (``"mean"``) over the processes."""
        return self.accelerator.reduce(tensor, reduction=reduction)

    # ---------------------------------------------------------------- model and data
    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Any, sampler: Any,
                batch_size: int, collate_fn: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """``accelerator.prepare`` of model, optimizer and a data loader over ``sampler``'s order (accelerate
        shards its batches across the processes, and leaves them on the host: ``epoch_batches``); of model and
        optimizer only when ``dataset`` is ``None``."""
        from torch.utils.data import DataLoader

        if dataset is None:  # a streamed run reads its own rank's part (streaming.TrainStream)
            self._model, self._optimizer = self.accelerator.prepare(model, optimizer)
            return self._model, self._optimizer
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn)
        self._model, self._optimizer, self._loader = self.accelerator.prepare(
            model, optimizer, loader, device_placement=[None, None, False])
        self._sampler = sampler
        return self._model, self._optimizer

    def batches_per_epoch(self) -> int:
        """Micro-batches per epoch and process."""
        return len(self._loader)

    def epoch_batches(self, epoch: int, skip: int) -> Iterable[dict[str, torch.Tensor]]:
        """The micro-batches of ``epoch`` on this process (host tensors), the first ``skip`` left out (after a
        resume)."""
        self._loader.set_epoch(epoch)
        self._sampler.set_epoch(epoch)
        return self.accelerator.skip_first_batches(self._loader, skip) if skip > 0 else self._loader

    def register_for_checkpointing(self, scheduler: Any) -> None:
        """Save and restore ``scheduler`` with ``save_state``/``load_state``."""
        self._scheduler = scheduler

    # ---------------------------------------------------------------- step
    def forward_context(self) -> contextlib.AbstractContextManager:
        """Nothing: a prepared model runs its forward in accelerate's autocast itself."""
        return contextlib.nullcontext()

    def accumulate(self, model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
        """DDP's gradient all-reduce only when ``sync`` (the last micro-batch of an accumulation window)."""
        return contextlib.nullcontext() if sync else self.accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        """``accelerator.backward`` (fp16 loss scaling)."""
        self.accelerator.backward(loss)

    def clip_grad_norm_(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the gradients to ``max_norm`` (unscaled first under fp16); returns the norm before
        clipping."""
        return self.accelerator.clip_grad_norm_(model.parameters(), max_norm)

    def optimizer_step_was_skipped(self) -> bool:
        """Whether fp16's loss scaler skipped the last optimizer step (inf/nan gradients)."""
        return self.accelerator.optimizer_step_was_skipped

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model without DDP/FSDP/compile wrappers."""
        return self.accelerator.unwrap_model(model)

    # ---------------------------------------------------------------- checkpoints and output
    def save_state(self, folder: Path) -> None:
        """The checkpoint files of ``safe_state`` (model safetensors, optimizer, scheduler, fp16 loss scaler,
        every process's random states; all processes call it)."""
        save_training_state(folder, self._model, self._optimizer.optimizer, self._scheduler,
                            rank=self.process_index, is_main_process=self.is_main_process,
                            scaler=self.accelerator.scaler)

    def load_state(self, folder: Path) -> None:
        """Restore ``save_state``'s files; a file that does not load safely is one ``FlagError`` naming it."""
        load_training_state(folder, self._model, self._optimizer.optimizer, self._scheduler,
                            rank=self.process_index, scaler=self.accelerator.scaler)

    def save_model(self, model: torch.nn.Module, output_dir: str) -> None:
        """``save_pretrained`` of the plain language model (gathered by accelerate under FSDP; the main
        process writes; ``TargetOnlyMLMLoss``'s ``model.`` key prefix removed)."""
        unwrapped = self.unwrap_model(model)
        inner = language_model(unwrapped)
        state_dict = self.accelerator.get_state_dict(model)
        if state_dict is not None and inner is not unwrapped:
            state_dict = {key.removeprefix("model."): value for key, value in state_dict.items()}
        inner.save_pretrained(output_dir, is_main_process=self.is_main_process,
                              save_function=self.accelerator.save, state_dict=state_dict)

    def init_trackers(self, hparams: dict[str, Any]) -> None:
        """TensorBoard under ``project_dir/tensorboard`` with ``hparams``."""
        self.accelerator.init_trackers("tensorboard", hparams)

    def log(self, values: dict[str, Any], step: int) -> None:
        """Log ``values`` to the trackers at ``step``."""
        self.accelerator.log(values, step=step)

    def describe(self) -> dict[str, Any]:
        """Process layout for ``pretrain_args.json``."""
        return {"num_processes": self.num_processes,
                "distributed_type": str(self.accelerator.distributed_type),
                "mixed_precision": self.accelerator.mixed_precision}

    def end_training(self) -> None:
        """Close the trackers."""
        self.accelerator.end_training()


@contextlib.contextmanager
def barrier_around(first: bool, wait: Any) -> Iterator[None]:
    """Run the block on the ``first`` process(es) before the others (``wait``: a barrier)."""
    if not first:
        wait()
    yield
    if first:
        wait()


__all__ = [
    "AccelerateRuntime",
    "TrainingRuntime",
    "barrier_around",
    "check_accelerate_precision",
    "check_process_count",
    "language_model",
]
