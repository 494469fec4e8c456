"""Tensor parallelism: the two parallel styles the families' plans need beyond Transformers' own.

Transformers (``transformers.distributed``, with ``DistributedConfig`` or ``tp_plan="auto"``) shards a model by
its plan: ``config.base_model_tp_plan`` plus each head's ``_tp_plan``, as Llama declares them (q/k/v colwise,
o rowwise, feed-forward colwise/rowwise, LM head gathered). Megatron-LM's split (Shoeybi et al. 2019, §3):
each rank owns whole heads, so attention itself needs no communication and one all-reduce follows the output
projection. Two things in this project's families have no built-in style:

- ``"local_shard"`` — a module that computes on its rank's share of heads (entropy-invariant and Synthesizer
  attention, the Synthesizer's dense branches) or of GAU's expansion width. The module declares
  ``tp_sharded_parameters`` (parameters whose first dimension is the head: SSMax's per-head scale, the
  Synthesizer's W₁/W₂/R…), sharded as ``Shard(0)``, and ``tp_replicated_parameters`` (one copy per rank, used
  on sharded activations: the Synthesizer's mixing logits, GAU's q/k scale and offset), whose gradient is the
  sum of the ranks' partial gradients, and ``tp_sharded_inputs``: submodules that compute their heads straight
  from the replicated input (the Synthesizer's dense branches), whose input gradient is summed likewise — what
  a colwise layer does for its input. The style asks the module to check that it divides
  (``check_tensor_parallel``: one sentence naming the layer otherwise) and tells it its rank
  (``set_tensor_parallel_rank``, for buffers that stay whole such as fixed random matrices, and GAU's slice).
- ``"colwise_gather_partial"`` — a colwise linear whose output is gathered and then used *differently on
  each rank* (GAU's fused ``in_proj`` = [u ‖ v ‖ z]: each rank keeps its slice of u and v and all of z). The
  gathered output's gradient is therefore partial and is reduce-scattered back to the shards.

Both exist only where Transformers ships ``transformers.distributed`` with these hooks (5.17 on; tested on
5.23); elsewhere ``register_parallel_styles`` does nothing and the plans are inert. Model code: imports only
``torch``, ``transformers`` and the standard library.
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
    ALL_PARALLEL_STYLES = None
    ColwiseParallel = TensorParallelLayer = object  # placeholders, so the classes below still define


def mesh_group(mesh: Any) -> Any:
    """The process group of a 1-D tensor-parallel mesh (or of the ``"tp"`` dimension of a larger one)."""
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

    At setup (on the meta device, before weights load): ``module.check_tensor_parallel(tp_size)`` raises when
    the module cannot be split evenly; ``module.set_tensor_parallel_rank(rank, tp_size)`` records the rank;
    the parameters named in ``module.tp_sharded_parameters`` (dotted names allowed, e.g. ``"dense.w1"``)
    become ``Shard(0)`` DTensors, so each rank reads only its heads from the checkpoint. During ``forward``
    those are the local shards, and those in ``module.tp_replicated_parameters`` pass through ``_SumGradients``,
    as does the input of each submodule in ``module.tp_sharded_inputs``.
    """

    def install_forward(self, module: nn.Module, mesh: Any) -> nn.Module:
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
    def context_around_forward(self, module: nn.Module, mesh: Any) -> Iterator[None]:
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

    def transform_output_post_forward(self, module: nn.Module, output: torch.Tensor, mesh: Any) -> torch.Tensor:
        if not isinstance(output, DTensor):
            shape = (*output.shape[:-1], module.out_features)
            stride = torch.empty(shape, device="meta").stride()
            output = DTensor.from_local(output, mesh, [Shard(output.dim() - 1)], run_check=False, shape=shape, stride=stride)
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

    def tp_units(self) -> tuple[int, str]:
        """(count, name) of what tensor parallelism splits across ranks, e.g. ``(8, "attention heads")``."""
        raise NotImplementedError

    def check_tensor_parallel(self, tp_size: int) -> None:
        """Raise one ``ValueError`` sentence when ``tp_size`` does not divide ``tp_units()``."""
        count, what = self.tp_units()
        if count % tp_size:
            raise ValueError(
                f"Tensor parallelism splits {what} evenly across ranks, but layer {self.layer_idx} has {count} "
                f"{what}, which tp_size={tp_size} does not divide; use a tp_size that divides every layer's count "
                f"(prune heads with `--uniform` for a tensor-parallel model), or tp_size=1 with FSDP."
            )

    def set_tensor_parallel_rank(self, rank: int, size: int) -> None:
        """Record this module's tensor-parallel rank and the number of ranks."""
        self.tp_rank, self.tp_size = rank, size

    def tp_slice(self, count: int) -> slice:
        """The rank's share of ``count`` units: [rank·count/size, (rank+1)·count/size)."""
        share = count // self.tp_size
        return slice(self.tp_rank * share, (self.tp_rank + 1) * share)


def register_parallel_styles() -> None:
    """Add ``"local_shard"`` and ``"colwise_gather_partial"`` to Transformers' registry of parallel styles."""
    if ALL_PARALLEL_STYLES is None:
        return
    ALL_PARALLEL_STYLES.register("local_shard", LocalShardParallel())
    ALL_PARALLEL_STYLES.register(
        "colwise_gather_partial", GatheredPartialColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    )


__all__ = [
    "GatheredPartialColwiseParallel",
    "LocalShardParallel",
    "ShardedUnits",
    "register_parallel_styles",
]
