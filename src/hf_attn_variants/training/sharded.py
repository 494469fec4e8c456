"""Sharded pretraining through Transformers' ``DistributedConfig``: FSDP2, tensor parallelism, HSDP — on CPU
too.

Launched with ``torchrun --nproc_per_node N -m hf_attn_variants pretrain ... --fsdp_size F [--tp_size T]
[--dp_replicate_size R]`` where ``R × F × T = N × nodes`` (the flags are ``DistributedConfig``'s fields).
accelerate cannot shard on CPU (``use_cpu`` gives DDP); this path is plain ``torch.distributed`` (gloo on CPU,
NCCL on GPUs) and Transformers' sharded loading, so it runs the same way on both.

- Mesh: Transformers lays the ranks out as (dp_replicate, fsdp, tp), tp fastest. The data-parallel ranks are
  ``rank // tp_size`` (``dp_size = dp_replicate_size × fsdp_size`` of them); each gets its own slice of every
  global batch (``data.DataParallelBatchSampler``), the ``tp_size`` ranks of one data-parallel group get the
  same batch. Global batch = ``per_device_train_batch_size × dp_size``: the run equals a single-process run
  with that batch size (exactly for CLM, whose micro-batches hold equal token counts on every rank; MLM's
  per-rank mean over a different number of masked tokens is a slightly different weighting, as under DDP).
- Model: rank 0 builds the model from the config with the run's seed (the same weights as a single-process
  run) and writes it to ``output_dir/checkpoints/.initial_model``; after a barrier every rank loads it with
  ``<family class>.from_pretrained(folder, distributed_config=DistributedConfig(...))``, which shards it
  while loading (each rank reads its shard). With ``--model_name_or_path`` that folder is loaded directly.
  ``output_dir`` must therefore be on a filesystem every node sees (DCP checkpoints need that too).
- Step: gradients reduce-scatter (FSDP) / all-reduce (HSDP replicas) inside backward; gradient accumulation
  defers that to a window's last micro-batch (``set_requires_gradient_sync``; under HSDP only the all-reduce
  across replicas is deferred, as ``Trainer`` does). Clipping: ``total_grad_norm`` groups the gradients by
  mesh and placements (tensor parallelism leaves some parameters plain or on the 1-D FSDP mesh and others
  on the tp or 2-D (fsdp, tp) mesh; ``torch.nn.utils.clip_grad_norm_`` works for FSDP2/HSDP alone, but under
  TP its foreach ops get plain tensors and DTensors mixed and fail), computes each group's norm with
  ``torch.nn.utils.get_total_norm``, all-reduces it (``DTensor.full_tensor``) and clips each group with
  ``torch.nn.utils.clip_grads_with_norm_``.
- Mixed precision: ``--mixed_precision bf16`` runs forward and loss under ``torch.autocast(bf16)`` with fp32
  master weights, all-gathers and gradient reductions — the same numerics as the accelerate path's bf16, and
  it works for tensor parallelism alone too. (``DistributedConfig(fsdp_mixed_precision=True)`` would instead
  all-gather bf16 parameters: half the traffic, less precise norms and softmax; not used.) fp16 needs a loss
  scaler and is refused with a ``FlagError``.
- Checkpoints (``save_state``/``load_state``): the pickle-free files of ``safe_state.py`` — model and
  optimizer states gathered from the shards (``get_state_dict(full_state_dict=True)``; rank 0 writes them,
  every rank reads them back into its own layout, so a different layout resumes too), ``scheduler.json``,
  ``rng_state_<rank>.json`` and (from ``pretrain``) ``training_state.json``. (``torch.distributed.checkpoint``
  would write each rank's shards in parallel, but its ``.metadata`` and non-tensor values are pickles that it
  loads unrestricted.)
- Final model (``save_model``): the sharded model's own ``save_pretrained(output_dir)``, called on every rank
  (a collective): Transformers gathers the full weights onto rank 0
  (``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` under FSDP2/HSDP, ``DTensor.full_tensor``
  under TP), rank 0 writes safetensors and config (``PreTrainedModel.should_save_on_this_rank``: rank 0 of the
  process group only), and this package's ``save_pretrained`` writes the standalone remote code of the model's
  own class (``code_class()``: FSDP2 swaps the class for a subclass defined in torch) and writes a tied weight
  once (the model's ``gather_sharded_state_dict_for_save`` re-ties the gathered names) — the same folder as a
  single-process run.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..cli_utils import FlagError
from .data import DataParallelBatchSampler
from .runtime import barrier_around
from .safe_state import load_training_state, save_training_state

SIZE_FLAGS = ("fsdp_size", "tp_size", "dp_replicate_size")
"""The sharding flags of ``pretrain`` (``DistributedConfig``'s field names), in the order an error names
them."""
INITIAL_MODEL_DIR = ".initial_model"


@dataclass(frozen=True)
class ParallelLayout:
    """The process mesh of a sharded run: ``dp_replicate_size × fsdp_size × tp_size`` ranks."""

    tp_size: int = 1
    fsdp_size: int = 1
    dp_replicate_size: int = 1

    @property
    def world_size(self) -> int:
        """Processes the layout needs."""
        return self.tp_size * self.fsdp_size * self.dp_replicate_size

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks (each sees a distinct batch)."""
        return self.fsdp_size * self.dp_replicate_size

    @property
    def sharded(self) -> bool:
        """Whether any size is above 1 (else ``pretrain`` takes the accelerate path)."""
        return self.world_size > 1

    def flag(self) -> str:
        """The flag an error about the layout names: the first of ``SIZE_FLAGS`` above 1."""
        return next((name for name in SIZE_FLAGS if getattr(self, name) > 1), SIZE_FLAGS[0])

    def kind(self) -> str:
        """``FSDP2``, ``HSDP``, ``TP`` or a combination such as ``FSDP2+TP`` (for ``pretrain_args.json``)."""
        parts = ["HSDP" if self.dp_replicate_size > 1 else "FSDP2"] if self.dp_size > 1 else []
        return "+".join(parts + (["TP"] if self.tp_size > 1 else []))

    def distributed_config(self) -> Any:
        """``transformers.distributed.DistributedConfig`` of this layout."""
        from transformers.distributed import DistributedConfig

        return DistributedConfig(tp_size=self.tp_size, fsdp_size=self.fsdp_size,
                                 dp_replicate_size=self.dp_replicate_size)


SHARDED_MIN_TORCH = "2.11.0"
"""The oldest torch an FSDP2 or HSDP run is allowed on: the lowest release its tests passed on (CPU, gloo).
On 2.8.0 FSDP2's logits and first step differ from one process's, and Transformers refuses FSDP2 on 2.7
itself; tensor parallelism alone passed on both, and 2.9 and 2.10 were not run (CONTRIBUTING.md, "Which
versions are tested where")."""


def fsdp2_torch_too_old(torch_version: str | None = None) -> bool:
    """Whether ``torch_version`` (default: the installed torch) is older than ``SHARDED_MIN_TORCH``."""
    from ..models.compat import version_tuple

    return version_tuple(torch_version or torch.__version__) < version_tuple(SHARDED_MIN_TORCH)


def check_layout(layout: ParallelLayout, environ: dict[str, str] | None = None,
                 torch_version: str | None = None) -> None:
    """``FlagError`` naming a size flag when the sizes do not multiply to the launch's ``WORLD_SIZE`` (a
    sharded run needs ``torchrun``), when the launch is also accelerate's FSDP, or when the layout shards
    data (FSDP2, HSDP) and ``torch_version`` (default: the installed torch) is older than
    ``SHARDED_MIN_TORCH``."""
    environ = os.environ if environ is None else environ
    flag = layout.flag()
    sizes = " × ".join(f"{name}={getattr(layout, name)}"
                       for name in ("dp_replicate_size", "fsdp_size", "tp_size"))
    if "WORLD_SIZE" not in environ:
        raise FlagError(flag, f"{flag}: {sizes} shards the model over {layout.world_size} processes; launch "
                              f"it with `torchrun --nproc_per_node {layout.world_size} -m hf_attn_variants "
                              "pretrain …` (scripts/accelerate/launch_sharded.sh).")
    world = int(environ["WORLD_SIZE"])
    if world != layout.world_size:
        raise FlagError(flag,
                        f"{flag}: {sizes} = {layout.world_size} processes, but this launch has WORLD_SIZE="
                        f"{world}; the sizes must multiply to the number of processes.")
    if environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes"):
        raise FlagError(flag,
                        f"{flag}: this is an accelerate FSDP launch, which shards the model itself; launch "
                        "the DistributedConfig sizes with torchrun (scripts/accelerate/launch_sharded.sh).")
    torch_version = torch_version or torch.__version__
    if layout.dp_size > 1 and fsdp2_torch_too_old(torch_version):
        flag = "fsdp_size" if layout.fsdp_size > 1 else "dp_replicate_size"
        raise FlagError(flag, f"{flag}: FSDP2 through Transformers' DistributedConfig needs torch>="
                              f"{SHARDED_MIN_TORCH} (older releases train other numbers than one process, or "
                              f"refuse FSDP2), and this is torch {torch_version}; upgrade torch, or train "
                              "without the size flags (data parallel with accelerate).")


def check_parallel_plans(model: Any, layout: ParallelLayout) -> None:
    """``FlagError`` naming the flag when ``model`` (a ``PreTrainedModel``, e.g. on the meta device) has no
    tensor-parallel plan for ``tp_size > 1`` or no FSDP plan for ``dp_size > 1``."""
    name = type(model).__name__
    if layout.tp_size > 1 and not model.tp_plan:
        raise FlagError("tp_size", f"tp_size={layout.tp_size}: {name} has no tensor-parallel plan "
                                   "(base_model_tp_plan); use --fsdp_size instead.")
    if layout.dp_size > 1 and not model.fsdp_plan:
        flag = "fsdp_size" if layout.fsdp_size > 1 else "dp_replicate_size"
        raise FlagError(flag, f"{flag}: {name} has no FSDP plan (base_model_fsdp_plan).")


def model_class_for(config: Any, auto_class: Any) -> tuple[type, Any]:
    """The concrete class ``auto_class.from_config(config)`` builds and such a model on the meta device (no
    memory, no initialisation): the class to load sharded, and the model for the plan checks."""
    with torch.device("meta"):
        model = auto_class.from_config(copy.deepcopy(config))
    return type(model), model


def load_sharded(model_class: type, config: Any, folder: str | Path, layout: ParallelLayout) -> Any:
    """``model_class.from_pretrained(folder, config, distributed_config=…)`` (every rank calls it): the model
    is sharded while it loads, each rank reading its shard."""
    return model_class.from_pretrained(str(folder), config=copy.deepcopy(config),
                                       distributed_config=layout.distributed_config())


def gradient_groups(parameters: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The parameters that have gradients, grouped by their gradient's kind: plain tensors, and DTensors of
    each (mesh, placements) — tensor parallelism leaves some parameters plain (or on the 1-D FSDP mesh) and
    others on the tp (or 2-D) mesh, and neither a norm nor a foreach op may mix them. Groups come in the
    order of first appearance (the model's parameter order: the same on every rank)."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[torch.Tensor]] = {}
    for parameter in parameters:
        grad = parameter.grad
        if grad is not None:
            key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
            groups.setdefault(key, []).append(parameter)
    return list(groups.values())


def total_grad_norm(groups: list[list[torch.Tensor]]) -> torch.Tensor:
    """The global 2-norm of the gradients of ``gradient_groups``: each group's norm with
    ``torch.nn.utils.get_total_norm``, made global with ``DTensor.full_tensor`` (an all-reduce), combined."""
    from torch.distributed.tensor import DTensor

    norms = []
    for group in groups:
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0)
        norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float())
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their global 2-norm is at most ``max_norm`` (one
    ``torch.nn.utils.clip_grads_with_norm_`` per gradient group); returns the norm before clipping."""
    groups = gradient_groups(parameters)
    norm = total_grad_norm(groups)
    for group in groups:
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm


def _device(local_rank: int) -> torch.device:
    """This process's device: its accelerator (``LOCAL_RANK``-th) when there is one, else the CPU."""
    if torch.accelerator.is_available():
        device_type = torch.accelerator.current_accelerator().type
        torch.accelerator.set_device_index(local_rank)
        return torch.device(device_type, local_rank)
    return torch.device("cpu")


class ShardedRuntime:
    """``TrainingRuntime`` on ``torch.distributed`` with a model sharded by ``DistributedConfig`` (see
    module)."""

    def __init__(self, layout: ParallelLayout, mixed_precision: str = "no",
                 tracking_dir: Path | None = None) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.layout = layout
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = _device(self.local_rank)
        self._owns_process_group = not dist.is_initialized()
        if self._owns_process_group:
            backend = "gloo" if self.device.type == "cpu" else f"cpu:gloo,{self.device.type}:nccl"
            dist.init_process_group(backend=backend,
                                    device_id=self.device if self.device.type == "cuda" else None)
        self.rank = dist.get_rank()
        mesh = init_device_mesh(self.device.type, (layout.dp_size, layout.tp_size),
                                mesh_dim_names=("dp", "tp"))
        self._dp_group = mesh.get_group("dp")
        self.process_index = mesh.get_local_rank("dp")
        self.num_processes = layout.dp_size
        self.is_main_process = self.rank == 0
        self.is_local_main_process = self.local_rank == 0
        self.mixed_precision = mixed_precision
        self._tracking_dir = tracking_dir
        self._writer: Any = None
        self._model: Any = None
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._data: tuple[Any, Any, int, Any] | None = None

    # ---------------------------------------------------------------- processes
    def wait_for_everyone(self) -> None:
        """Barrier over all ranks."""
        dist.barrier()

    def main_process_first(self) -> contextlib.AbstractContextManager:
        """Rank 0 runs the block first (data caches), then the others."""
        return barrier_around(self.is_main_process, self.wait_for_everyone)

    def autocast(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` in bf16 under ``--mixed_precision bf16``, else nothing."""
        if self.mixed_precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        """``tensor`` summed or averaged over the data-parallel ranks (tensor-parallel ranks hold copies)."""
        result = tensor.detach().clone()
        dist.all_reduce(result, group=self._dp_group)
        return result / self.num_processes if reduction == "mean" else result

    # ---------------------------------------------------------------- model and data
    def load_model(self, model_class: type, config: Any, folder: str | Path) -> torch.nn.Module:
        """``load_sharded`` of ``folder`` (every rank): the model is sharded while it loads."""
        return load_sharded(model_class, config, folder, self.layout)

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dataset: Any, sampler: Any,
                batch_size: int, collate_fn: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Keep model, optimizer and the data: the model is sharded already, batches are cut per rank."""
        self._model, self._optimizer = model, optimizer
        self._data = (dataset, sampler, batch_size, collate_fn)
        return model, optimizer

    def _batch_sampler(self, skip: int = 0) -> DataParallelBatchSampler:
        _, sampler, batch_size, _ = self._data
        return DataParallelBatchSampler(sampler, batch_size, self.process_index, self.num_processes, skip)

    def batches_per_epoch(self) -> int:
        """Micro-batches per epoch and rank."""
        return self._batch_sampler().global_batches()

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's micro-batches of ``epoch`` (its slice of each global batch; host tensors), the first
        ``skip`` left out."""
        from torch.utils.data import DataLoader

        dataset, sampler, _, collate_fn = self._data
        sampler.set_epoch(epoch)
        yield from DataLoader(dataset, batch_sampler=self._batch_sampler(skip), collate_fn=collate_fn)

    def register_for_checkpointing(self, scheduler: Any) -> None:
        """Save and restore ``scheduler`` with the checkpoints."""
        self._scheduler = scheduler

    # ---------------------------------------------------------------- step
    def forward_context(self) -> contextlib.AbstractContextManager:
        """The training forward's autocast (see ``autocast``)."""
        return self.autocast()

    @contextlib.contextmanager
    def accumulate(self, model: torch.nn.Module, sync: bool) -> Iterator[None]:
        """Defer the gradient reduction unless ``sync`` (the last micro-batch of an accumulation window):
        FSDP2 keeps unsharded gradients; under HSDP only the all-reduce across replicas waits."""
        from torch.distributed.fsdp import FSDPModule

        if sync or not isinstance(model, FSDPModule):
            yield
            return
        if self.layout.dp_replicate_size > 1:
            model.set_requires_all_reduce(False)
        else:
            model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` (FSDP2 reduces the gradients inside it)."""
        loss.backward()

    def clip_grad_norm_(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """``clip_grad_norm`` over the model's DTensor parameters; returns the global norm before clipping."""
        return clip_grad_norm(model.parameters(), max_norm)

    def optimizer_step_was_skipped(self) -> bool:
        """Never: there is no loss scaler (bf16 or fp32)."""
        return False

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model itself (sharding lives in its parameters, not in a wrapper)."""
        return model

    # ---------------------------------------------------------------- checkpoints and output
    def save_state(self, folder: Path) -> None:
        """The checkpoint files of ``safe_state``: model and optimizer gathered from every shard (rank 0
        writes), the scheduler, every rank's random states."""
        save_training_state(folder, self._model, self._optimizer, self._scheduler, rank=self.rank,
                            is_main_process=self.is_main_process)

    def load_state(self, folder: Path) -> None:
        """Restore a ``save_state`` folder into this layout (each rank keeps its shards of the full
        states)."""
        load_training_state(folder, self._model, self._optimizer, self._scheduler, rank=self.rank)

    def save_model(self, model: torch.nn.Module, output_dir: str) -> None:
        """``model.save_pretrained(output_dir)`` on every rank: Transformers gathers the full weights, rank 0
        writes them (with config and remote code; a tied weight once, as the model's own
        ``gather_sharded_state_dict_for_save`` re-ties them); the barrier after it lets no rank go on before
        the folder is complete."""
        model.save_pretrained(str(output_dir))
        self.wait_for_everyone()

    def init_trackers(self, hparams: dict[str, Any]) -> None:
        """TensorBoard under ``tracking_dir`` on rank 0, with ``hparams``."""
        if self.is_main_process and self._tracking_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self._tracking_dir))
            self._writer.add_hparams(hparams, metric_dict={}, run_name=".")

    def log(self, values: dict[str, Any], step: int) -> None:
        """Scalars of ``values`` to TensorBoard at ``step`` (rank 0)."""
        if self._writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(key, value, global_step=step)
            self._writer.flush()

    def describe(self) -> dict[str, Any]:
        """Process layout for ``pretrain_args.json``."""
        return {"num_processes": dist.get_world_size(), "distributed_type": self.layout.kind(),
                "distributed_config": asdict(self.layout), "mixed_precision": self.mixed_precision}

    def end_training(self) -> None:
        """Close TensorBoard."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        """Destroy the process group if this runtime created it."""
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()


__all__ = [
    "INITIAL_MODEL_DIR",
    "SIZE_FLAGS",
    "ParallelLayout",
    "ShardedRuntime",
    "check_layout",
    "check_parallel_plans",
    "clip_grad_norm",
    "gradient_groups",
    "load_sharded",
    "model_class_for",
    "total_grad_norm",
]
