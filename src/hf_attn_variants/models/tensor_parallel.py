"""Tensor parallelism: the two parallel styles the families' plans need beyond Transformers' own.

Transformers shards a model by its plan (``base_model_tp_plan`` + each head's ``_tp_plan``), Megatron-LM's
split: each rank owns whole heads, and one all-reduce follows the output projection.

- ``"local_shard"``: a module computing on its rank's share of heads (or of GAU's width). It names
  ``tp_sharded_parameters`` (first dimension = head; ``Shard(0)``), ``tp_replicated_parameters`` (used on
  sharded activations: their gradient is summed over ranks) and ``tp_sharded_inputs`` (submodules reading the
  replicated input, whose input gradient is summed likewise).
- ``"colwise_gather_partial"``: a colwise linear whose gathered output each rank uses differently (GAU's
  ``in_proj``); the gradient is reduce-scattered back to the shards.

Both exist where Transformers ships ``transformers.distributed`` with these hooks (5.17 on); elsewhere
``register_parallel_styles`` does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

try:  # transformers >= 5.17 ships native tensor parallelism with per-module styles
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from transformers.distributed.tensor_parallel import (
        ALL_PARALLEL_STYLES,
        ColwiseParallel,
        TensorParallelLayer,
    )

    if not (hasattr(TensorParallelLayer, "install_forward") and hasattr(TensorParallelLayer, "shard_param")):
        raise ImportError("transformers.distributed.tensor_parallel lacks the per-module style hooks")
except ImportError:  # one statement, so the standalone export copies the fallback with the imports
    ALL_PARALLEL_STYLES = None  # type: ignore[assignment]
    ColwiseParallel = TensorParallelLayer = object  # type: ignore[assignment, misc]  # placeholders


def mesh_group(mesh: Any) -> Any:
    """The process group of a 1-D tensor-parallel mesh (or of the ``"tp"`` dimension of a larger one).

    Args:
        mesh (DeviceMesh): the tensor-parallel device mesh.

    Returns:
        ProcessGroup: its (``"tp"``) process group.
    """
    return mesh.get_group() if mesh.ndim == 1 else mesh.get_group("tp")


class _SumGradients(torch.autograd.Function):
    """Identity forward; backward all-reduces (sums) the gradient over ``group``.

    For a parameter replicated on every rank but used on the rank's shard of the activations: each rank's
    gradient covers only its shard, and the true gradient is their sum (Megatron-LM's "g" operator).
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class LocalShardParallel(TensorParallelLayer):
    """Style ``"local_shard"``: the module computes on its rank's shard of heads (or of GAU's width).

    At setup (meta device): ``check_tensor_parallel`` refuses an uneven split, ``set_tensor_parallel_rank``
    records the rank, ``tp_sharded_parameters`` become ``Shard(0)`` DTensors. In ``forward`` they are the
    local shards, and the replicated parameters and sharded inputs pass through ``_SumGradients``.
    """

    def install_forward(self, module: Any, mesh: Any) -> nn.Module:
        """Set the module up for its rank, on the meta device, before the weights load.

        Args:
            module (nn.Module): a ``ShardedUnits`` module.
            mesh (DeviceMesh): the tensor-parallel device mesh.

        Returns:
            nn.Module: the module, with its sharded parameters as ``Shard(0)`` DTensors.
        """
        size, rank, group = mesh.size(), mesh.get_local_rank(), mesh_group(mesh)
        module.check_tensor_parallel(size)
        module.set_tensor_parallel_rank(rank, size)

        def sum_input_gradients(submodule: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            if not torch.is_grad_enabled() or not args[0].requires_grad:
                return args
            return (_SumGradients.apply(args[0], group), *args[1:])

        for name in module.tp_sharded_inputs:
            module.get_submodule(name).register_forward_pre_hook(sum_input_gradients)
        for owner, name in _named_slots(module, module.tp_sharded_parameters):
            parameter = owner._parameters.get(name)
            if parameter is not None and not isinstance(parameter, DTensor):
                owner._parameters[name] = nn.Parameter(
                    distribute_tensor(parameter, mesh, [Shard(0)], src_data_rank=None),
                    requires_grad=parameter.requires_grad,
                )
        return super().install_forward(module, mesh)

    @contextlib.contextmanager
    def context_around_forward(self, module: Any, mesh: Any) -> Iterator[None]:
        """During ``forward``: local shards for the sharded parameters, summed gradients for the replicated.

        Args:
            module (nn.Module): a ``ShardedUnits`` module.
            mesh (DeviceMesh): the tensor-parallel device mesh.

        Yields:
            None: the module's parameters are restored afterwards.
        """
        group = mesh_group(mesh)
        originals: list[tuple[nn.Module, str, Any]] = []
        for owner, name in _named_slots(module, module.tp_sharded_parameters):
            parameter = owner._parameters.get(name)
            if isinstance(parameter, DTensor):
                originals.append((owner, name, parameter))
                owner._parameters[name] = parameter.to_local()
        for owner, name in _named_slots(module, module.tp_replicated_parameters):
            parameter = owner._parameters.get(name)
            if parameter is not None and parameter.requires_grad and torch.is_grad_enabled():
                originals.append((owner, name, parameter))
                local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
                owner._parameters[name] = _SumGradients.apply(local, group)
        try:
            yield
        finally:
            for owner, name, parameter in originals:
                owner._parameters[name] = parameter


def _named_slots(module: nn.Module, names: tuple[str, ...]) -> Iterator[tuple[nn.Module, str]]:
    """``(owner module, attribute)`` for each dotted parameter name of ``module``."""
    for dotted in names:
        path, _, name = dotted.rpartition(".")
        yield module.get_submodule(path), name


class GatheredPartialColwiseParallel(ColwiseParallel):
    """Style ``"colwise_gather_partial"``: colwise linear, output all-gathered, gradient reduce-scattered.

    Forward: each rank computes its ``Shard(0)`` rows of W·x, then all ranks gather the full output.
    Backward: each rank's gradient for that output covers only the part it used, so the gradients are summed
    (``Partial``) and scattered back to the row shards.
    """

    def transform_output_post_forward(self, module: nn.Linear, output: torch.Tensor,
                                      mesh: Any) -> torch.Tensor:
        """All-gather the rank's rows of the output; backward sums and scatters the gradient.

        Args:
            module (nn.Linear): the colwise linear.
            output (torch.Tensor): ``[..., out_features / tp_size]``, the rank's share (or a DTensor).
            mesh (DeviceMesh): the tensor-parallel device mesh.

        Returns:
            torch.Tensor: ``[..., out_features]``, the whole output on every rank.
        """
        if not isinstance(output, DTensor):
            shape = torch.Size((*output.shape[:-1], module.out_features))
            stride = torch.empty(shape, device="meta").stride()
            output = DTensor.from_local(output, mesh, [Shard(output.dim() - 1)], run_check=False, shape=shape,
                                        stride=stride)
        return output.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial()])


class ShardedUnits:
    """What the ``"local_shard"`` style asks of a module (mixin for ``nn.Module`` subclasses).

    A subclass says what it splits (``tp_units``) and names its per-unit and replicated parameters; under
    tensor parallelism ``tp_rank``/``tp_size`` become the module's rank and the number of ranks, and
    ``tp_slice(n)`` is the rank's contiguous n / tp_size share of n (all of it without parallelism).
    """

    tp_sharded_parameters: tuple[str, ...] = ()
    tp_replicated_parameters: tuple[str, ...] = ()
    tp_sharded_inputs: tuple[str, ...] = ()
    tp_rank: int = 0
    tp_size: int = 1
    layer_idx: int

    def tp_units(self) -> tuple[int, str]:
        """(count, name) of what tensor parallelism splits across ranks, e.g. ``(8, "attention heads")``.

        Returns:
            tuple[int, str]: the count and the name of the units.
        """
        raise NotImplementedError

    def check_tensor_parallel(self, tp_size: int) -> None:
        """Raise one ``ValueError`` sentence when ``tp_size`` does not divide ``tp_units()``.

        Args:
            tp_size (int): the number of tensor-parallel ranks.
        """
        count, what = self.tp_units()
        if count % tp_size:
            raise ValueError(
                f"Tensor parallelism splits {what} evenly across ranks, but layer {self.layer_idx} has "
                f"{count} {what}, which tp_size={tp_size} does not divide; use a tp_size that divides every "
                "layer's count (prune heads with `--uniform` for a tensor-parallel model), "
                "or tp_size=1 with FSDP."
            )

    def set_tensor_parallel_rank(self, rank: int, size: int) -> None:
        """Record this module's tensor-parallel rank and the number of ranks.

        Args:
            rank (int): this rank.
            size (int): the number of ranks.
        """
        self.tp_rank, self.tp_size = rank, size

    def tp_slice(self, count: int) -> slice:
        """The rank's share of ``count`` units: [rank·count/size, (rank+1)·count/size).

        Args:
            count (int): the number of units (divisible by the number of ranks).

        Returns:
            slice: the rank's units.
        """
        share = count // self.tp_size
        return slice(self.tp_rank * share, (self.tp_rank + 1) * share)


def register_parallel_styles() -> None:
    """Add ``"local_shard"`` and ``"colwise_gather_partial"`` to Transformers' registry of parallel styles."""
    if ALL_PARALLEL_STYLES is None:
        return
    ALL_PARALLEL_STYLES.register("local_shard", LocalShardParallel())  # type: ignore[arg-type]
    ALL_PARALLEL_STYLES.register(
        "colwise_gather_partial",
        GatheredPartialColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))  # type: ignore[arg-type]


__all__ = [
    "GatheredPartialColwiseParallel",
    "LocalShardParallel",
    "ShardedUnits",
    "register_parallel_styles",
]
