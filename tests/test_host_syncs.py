"""pretrain's training steps read nothing back from the device between the steps that log (issue 47).

On a GPU, reading a value of a device tensor on the host (``.item()``, ``float(t)``, ``bool(t)``,
``.tolist()``, ``.cpu()``) or an operation whose output shape depends on the data (``nonzero``, boolean-mask
indexing, ``unique``) makes the host wait until the device has run everything queued before it: the kernels of
the next step are not queued in time, and a fixed cost lands on every step. ``HostSyncs`` records every such
call while ``pretrain`` trains on the CPU (where the same calls are made), with the step it happened in and
the package frame that made it. The batches are made on the host (the loader and ``micro_batch_inputs``: their
tensors are host tensors on a GPU too) and are left out of the count; every other call of a step that neither
logs, evaluates nor checkpoints must read nothing.
"""

from __future__ import annotations

import importlib
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hf_attn_variants.training.preemption import Agreement
from hf_attn_variants.training.runtime import AccelerateRuntime
from tests.test_pretrain import read_log, tiny_args, tiny_overrides, train_file  # noqa: F401 - train_file: a fixture

pretrain_module = importlib.import_module("hf_attn_variants.training.pretrain")
aten = torch.ops.aten
SYNCING_OPS = {
    aten._local_scalar_dense.default,  # .item(), float(t), int(t), bool(t)
    aten.is_nonzero.default, aten.equal.default,
    aten.nonzero.default, aten.masked_select.default,  # the output's shape depends on the data
    aten.unique_consecutive.default, aten.unique_dim.default, aten._unique2.default, aten._unique.default,
    aten.repeat_interleave.Tensor,
}
SYNCING_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}
"""Reads that do not go through an aten operator on the CPU (on a GPU they copy to the host and wait)."""
KNOWN = {("models/modeling_common.py", "_check_inputs"), ("models/losses.py", "_check_label_range")}
"""Reads that happen here only because this test runs on CPU tensors. ``_check_inputs`` (``input_ids``' min
and max) and ``_check_label_range`` (the scored labels' range) give their one-sentence errors for
out-of-range ids on CPU tensors, and on an accelerator outside training only; in training on a GPU they are
skipped, which the GPU test below (torch's sync debug mode) checks."""
PACKAGE = Path(pretrain_module.__file__).resolve().parents[1]


def boolean_index(func: Any, args: tuple) -> bool:
    """``aten.index``/``index_put`` with a boolean mask among the indices (a ``nonzero`` inside)."""
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
        return False
    return any(isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
               for index in args[1] if index is not None)


def calling_site() -> tuple[str, str, int]:
    """``(file relative to the package, function, line)`` of the innermost package frame, or of the caller."""
    frames = traceback.extract_stack()[:-1]
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(PACKAGE):
            return str(path.relative_to(PACKAGE)), frame.name, frame.lineno or 0
    frame = frames[-1]
    return frame.filename, frame.name, frame.lineno or 0


class HostSyncs(TorchDispatchMode):
    """Records ``(step, site, call)`` of every syncing operator (``SYNCING_OPS``, boolean indexing) while
    ``counting``; ``step`` is the optimizer step in progress (0: before the first batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self.counting = True
        self.calls: list[tuple[int, tuple[str, str, int], str]] = []

    def record(self, name: str) -> None:
        if self.counting:
            self.calls.append((self.step, calling_site(), name))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in SYNCING_OPS or boolean_index(func, args):
            self.record(str(func))
        return func(*args, **(kwargs or {}))


class HostReads(TorchFunctionMode):
    """Sends ``SYNCING_METHODS`` calls to ``syncs.record``."""

    def __init__(self, syncs: HostSyncs) -> None:
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in SYNCING_METHODS:
            self.syncs.record(func.__name__)
        return func(*args, **(kwargs or {}))


def count_host_syncs(monkeypatch: pytest.MonkeyPatch, args: Any) -> HostSyncs:
    """Train ``args`` with every syncing call recorded by step, the host-side batch making left out."""
    syncs = HostSyncs()
    make_inputs, after_update = pretrain_module.micro_batch_inputs, pretrain_module.after_update
    epoch_batches = AccelerateRuntime.epoch_batches

    def on_host(*call_args: Any) -> Any:
        syncs.counting = False
        try:
            return make_inputs(*call_args)
        finally:
            syncs.counting = True

    def host_batches(runtime: AccelerateRuntime, epoch: int, skip: int) -> Iterator[dict[str, torch.Tensor]]:
        batches = iter(epoch_batches(runtime, epoch, skip))
        while True:
            syncs.counting = False
            try:
                batch = next(batches, None)
            finally:
                syncs.counting = True
            if batch is None:
                return
            syncs.step = max(syncs.step, 1)
            yield batch

    def counted_update(run: Any, state: Any, *rest: Any) -> None:
        after_update(run, state, *rest)
        syncs.step = state.completed + 1

    monkeypatch.setattr(pretrain_module, "micro_batch_inputs", on_host)
    monkeypatch.setattr(pretrain_module, "after_update", counted_update)
    monkeypatch.setattr(AccelerateRuntime, "epoch_batches", host_batches)
    with syncs, HostReads(syncs):
        pretrain_module.pretrain(args)
    return syncs


@pytest.mark.parametrize(("family", "objective", "extra"), [
    ("entropy_invariant", "mlm", {}),  # the MLM head on the targets only (TargetOnlyMLMLoss)
    ("entropy_invariant", "clm", {}),  # the model's own loss
    ("gau", "clm", {"chunk_size": 8, "attention_normalization": "relu2"}),  # FLASH
])
def test_steps_between_logging_steps_read_nothing_from_the_device(tmp_path, train_file, monkeypatch,  # noqa: F811
                                                                  family: str, objective: str,
                                                                  extra: dict[str, object]) -> None:
    """5 steps, a row every 4: steps 1 to 3 make no syncing call outside the host's batch making; step 4 (a
    row: the mean loss and the gradient norm are read) shows that the count sees them."""
    args = tiny_args(tmp_path, family, train_file=train_file, objective=objective, max_train_steps=5,
                     logging_steps=4, config_overrides=tiny_overrides(family, **extra))
    syncs = count_host_syncs(monkeypatch, args)
    unexpected = [(step, f"{site[0]}:{site[2]} {site[1]}", call) for step, site, call in syncs.calls
                  if step in (1, 2, 3) and site[:2] not in KNOWN]
    assert unexpected == [], unexpected
    logged = [site for step, site, _ in syncs.calls if step == 4]
    assert any(site[:2] == ("training/pretrain.py", "log_row") for site in logged), syncs.calls


PACKED_READS = {("models/modeling_common.py", "_packed_documents"),
                ("models/modeling_entropy_invariant.py", "prepare_attention_mask"),
                ("models/gau_kernels.py", "build")}
"""The reads of ``--packing documents`` (docs/training.md): whether the rows pack documents (ours, and
Transformers' own check inside ``create_causal_mask``) and the size of FLASH's chunk-aligned layout; each is
skipped under ``torch.compile``, where rows with positions count as packed and FLASH takes
``flash_windows``."""


@pytest.mark.parametrize(("family", "objective", "extra"), [
    ("entropy_invariant", "clm", {}),
    ("gau", "clm", {"chunk_size": 8, "attention_normalization": "relu2"}),
    ("synthesizer", "clm", {}),
])
def test_packed_documents_read_once_per_step_and_only_what_the_docs_list(
        tmp_path, train_file, monkeypatch,  # noqa: F811
        family: str, objective: str, extra: dict[str, object]) -> None:
    """``--packing documents``: the steps between logging steps read only ``PACKED_READS``, once each per
    forward, and nothing per layer."""
    args = tiny_args(tmp_path, family, train_file=train_file, objective=objective, max_train_steps=4,
                     logging_steps=4, packing="documents", config_overrides=tiny_overrides(family, **extra))
    syncs = count_host_syncs(monkeypatch, args)
    reads = [site[:2] for step, site, _ in syncs.calls if step in (1, 2, 3) and site[:2] not in KNOWN]
    assert reads and set(reads) <= PACKED_READS, reads
    assert all(reads.count(site) == 3 for site in set(reads)), reads  # once in each of the three steps


@pytest.mark.parametrize("lengths", [(8, 4, 12), (5, 11, 8)], ids=["whole-chunks", "uneven"])
def test_the_packed_flash_layout_reads_the_host_once(lengths: tuple[int, ...]) -> None:
    """``DocumentChunks.build``: one read for the slot count and whether the documents fill whole chunks (the
    second case read twice before)."""
    from hf_attn_variants.models.gau_kernels import DocumentChunks
    from hf_attn_variants.models.layers import packed_document_ids

    positions = torch.cat([torch.arange(n) for n in lengths])[None].expand(2, -1)
    syncs = HostSyncs()
    with syncs, HostReads(syncs):
        layout = DocumentChunks.build(packed_document_ids(positions), 4)
    assert len(syncs.calls) == 1, syncs.calls
    assert (layout.valid is None) == (lengths == (8, 4, 12))


def blocks_without_datasets(args: Any, tokenizer: Any, runtime: Any) -> dict[str, Any]:
    """``pretrain``'s training blocks made without ``datasets``, which the GPU image lacks: the lines of
    ``--train_file`` tokenized and cut into blocks of ``--max_seq_length`` ids; no validation blocks. The test
    below is about the steps, not the data."""
    lines = Path(args.train_file).read_text().splitlines()
    ids = [i for row in tokenizer(lines, add_special_tokens=False)["input_ids"] for i in row]
    size = args.max_seq_length
    return {"train": [ids[start:start + size] for start in range(0, len(ids) - size + 1, size)],
            "validation": None}


def test_the_gpu_test_trains_without_datasets(tmp_path, train_file, monkeypatch) -> None:  # noqa: F811
    """The GPU test below runs where ``datasets`` is not installed (the GPU image): with its blocks, 5 steps
    train and log without importing ``datasets``."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # any import of it raises ImportError
    monkeypatch.setattr(pretrain_module, "_training_blocks", blocks_without_datasets)
    result = pretrain_module.pretrain(tiny_args(tmp_path, train_file=train_file, max_train_steps=5,
                                                logging_steps=4))
    assert result.completed_steps == 5
    assert [row["step"] for row in read_log(tmp_path)] == [4, 5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch's sync debug mode)")
def test_on_a_gpu_the_steps_between_logging_steps_make_no_synchronising_call(tmp_path, train_file,  # noqa: F811
                                                                             monkeypatch) -> None:
    """On a GPU torch itself reports every synchronising CUDA call (``torch.cuda.set_sync_debug_mode``), the
    copies of the batch to the GPU included: steps 2 and 3 make none (step 1 allocates the optimizer state and
    warms the caches), step 4 (a row) does. The blocks are made without ``datasets``
    (``blocks_without_datasets``)."""
    sites: list[tuple[int, tuple[str, str, int]]] = []
    step = [0]
    after_update = pretrain_module.after_update

    def counted_update(run: Any, state: Any, *rest: Any) -> None:
        after_update(run, state, *rest)
        step[0] = state.completed + 1

    def show(message: Any, category: type, *rest: Any, **kwargs: Any) -> None:
        if "synchronizing CUDA operation" in str(message):
            sites.append((step[0], calling_site()))

    monkeypatch.setattr(pretrain_module, "after_update", counted_update)
    monkeypatch.setattr(pretrain_module, "_training_blocks", blocks_without_datasets)
    monkeypatch.setattr(warnings, "showwarning", show)
    args = tiny_args(tmp_path, train_file=train_file, max_train_steps=5, logging_steps=4)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            pretrain_module.pretrain(args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    unexpected = [(at, site) for at, site in sites if at in (2, 3) and site[:2] not in KNOWN]
    assert unexpected == [], unexpected
    assert any(at == 4 for at, _ in sites), sites


@pytest.mark.parametrize(("seconds_per_step", "expected"),
                         [(0.1, [1, 2, 12, 22, 32]), (2.5, list(range(1, 40)))])
def test_several_processes_agree_about_once_a_second(seconds_per_step: float, expected: list[int]) -> None:
    """With several processes the ranks agree (stop signals, a due timed checkpoint: one all-reduce) after
    the first step, then about once every ``AGREEMENT_SECONDS`` (1 s) of training, at steps every rank works
    out alike; here one process stands in (its all-reduce returns the values as they are)."""
    now = [0.0]
    agreement = Agreement(several=True, clock=lambda: now[0])
    agreed = []
    for step in range(1, 40):
        now[0] += seconds_per_step
        if agreement.due(step):
            assert agreement.agree(step, [15, 0]) == [15, 0]
            agreed.append(step)
    assert agreed == expected
    alone = Agreement(several=False)
    assert all(alone.due(step) for step in range(1, 40))  # one process: after every step, for free
