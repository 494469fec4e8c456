"""``export --onnx``: an ONNX graph of the exported model, run by onnxruntime.

The graph comes from ``torch.export`` and ``torch.onnx.export(..., dynamo=True)`` (needs the ``onnx`` and
``onnxscript`` packages; ``pip install onnx onnxscript onnxruntime``). Inputs ``input_ids`` and
``attention_mask`` (int64, shape ``(batch, sequence)``, both axes dynamic; right or left padding through the
mask); outputs ``logits`` for a model with a head (``start_logits`` and ``end_logits`` for question
answering), ``last_hidden_state`` for the base model. A model whose shapes torch.export finds to depend on the
length is refused, never exported for some lengths only. FLASH (GAU with ``chunk_size``) is exported in its
reference form, the O(n²) matrix of the same attention: its chunked path splits the sequence by
``chunk_size``, which one graph for every length cannot state.

**Without cache**: the graph takes no past keys and returns none, so decoding with it re-runs the whole
sequence at every step; generation with a cache stays with Transformers' ``generate``.

This module imports nothing but torch and the standard library, so it also runs where only the exported
folder is (load the model with ``trust_remote_code=True``, then call ``export_onnx``; tests/clients_child.py
does that in an environment without this package).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ONNX_PATH = "onnx/model.onnx"
"""Where ``export --onnx`` writes the graph inside the exported folder (Optimum's layout)."""
INPUT_NAMES = ("input_ids", "attention_mask")


class _Outputs(torch.nn.Module):
    """The model as ``(input_ids, attention_mask) -> its output tensors``, without cache."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names
        is_decoder = getattr(model.config, "is_decoder", False)
        self.options: dict[str, Any] = {"use_cache": False} if is_decoder else {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, **self.options)
        return tuple(outputs[name] for name in self.names)


def output_names(model: torch.nn.Module) -> tuple[str, ...]:
    """``("last_hidden_state",)`` for a base model (no head), ``("start_logits", "end_logits")`` for question
    answering, else ``("logits",)``."""
    if getattr(model, "base_model", model) is model:
        return ("last_hidden_state",)
    if type(model).__name__.endswith("ForQuestionAnswering"):
        return ("start_logits", "end_logits")
    return ("logits",)


@contextlib.contextmanager
def exportable(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode and float32 for the exporter, the caller's model left as it was: a float32
    model is switched to eval and back, any other is copied; FLASH runs the reference kernel while inside
    (``gau_kernel="reference"`` in its units' ``settings``, and in the config, which code saved before the
    units kept settings reads in forward)."""
    copied = any(p.is_floating_point() and p.dtype != torch.float32 for p in model.parameters())
    target = copy.deepcopy(model).float() if copied else model
    modes = {module: module.training for module in model.modules()}
    units = {module: module.settings for module in target.modules() if flash_fields(module, "settings")}
    configs = {id(m.config): m.config for m in target.modules() if flash_fields(m, "config")}
    kernels = {key: config.gau_kernel for key, config in configs.items()}
    try:
        for unit, settings in units.items():
            unit.settings = dataclasses.replace(settings, gau_kernel="reference")
        for config in configs.values():
            config.gau_kernel = "reference"
        yield target.eval()
    finally:
        for unit, settings in units.items():
            unit.settings = settings
        for key, config in configs.items():
            config.gau_kernel = kernels[key]
        for module, training in modes.items():
            module.train(training)


def flash_fields(module: torch.nn.Module, name: str) -> bool:
    """Whether ``module``'s attribute ``name`` holds FLASH's fields (a ``chunk_size`` and a ``gau_kernel``;
    ``settings`` also a dataclass)."""
    fields = getattr(module, name, None)
    return (getattr(fields, "chunk_size", None) is not None and hasattr(fields, "gau_kernel")
            and (name != "settings" or dataclasses.is_dataclass(fields)))


def sequence_bound(model: torch.nn.Module) -> int:
    """The largest sequence the graph takes: ``max_position_embeddings`` (learned positions, the
    Synthesizer's l × l patterns), else 4096 for the exporter's range; ``ValueError`` below 3."""
    bound = getattr(model.config, "max_position_embeddings", None) or 4096
    if bound < 3:
        raise ValueError(f"max_position_embeddings={bound}: an ONNX graph with a dynamic sequence axis needs "
                         "at least 3 positions.")
    return bound


def exported_program(model: torch.nn.Module, *, example_length: int = 8) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` (in ``exportable`` form) as ``(input_ids, attention_mask) -> outputs``
    with dynamic batch and sequence axes, traced at batch 2 × ``example_length`` (≥ 2) tokens.

    ``ValueError`` for a model whose shapes depend on the length (torch.export's constraints): torch.onnx
    would narrow the axis to the lengths traced instead.
    """
    if isinstance(example_length, bool) or not isinstance(example_length, int) or example_length < 2:
        raise ValueError(f"example_length must be an int >= 2, got {example_length!r}.")
    max_length = sequence_bound(model)
    example_length = min(example_length, max_length)
    input_ids = torch.full((2, example_length), 5, dtype=torch.long) % model.config.vocab_size
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -2:] = 0
    batch = torch.export.Dim("batch", min=1, max=1024)
    sequence = torch.export.Dim("sequence", min=2, max=max_length)
    dynamic = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    with exportable(model) as target, torch.no_grad():
        try:
            return torch.export.export(_Outputs(target, output_names(model)), (input_ids, attention_mask),
                                       dynamic_shapes=dynamic, strict=False)
        except RuntimeError as error:  # torch's UserError
            if "Constraints violated" not in str(error):
                raise
            raise ValueError(f"{type(model).__name__} cannot be exported with a dynamic sequence axis: its "
                             "shapes depend on the length (torch.export's constraints).") from error


def export_onnx(model: torch.nn.Module, path: str | Path, *, example_length: int = 8) -> Path:
    """Write ``model`` (float32, eval mode; the caller's model is left as it was) as one self-contained ONNX
    file at ``path`` with dynamic batch and sequence axes (``exported_program``); returns the path. The
    sequence axis is bounded by ``max_position_embeddings`` (``sequence_bound``); nothing is written for a
    ``ValueError``."""
    if Path(path).is_dir():  # checked before the export, which takes a while
        raise ValueError(f"path must be the ONNX file to write, got the folder {str(path)!r}.")
    try:
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it)
    except ImportError as error:
        raise ImportError("export --onnx needs the onnx and onnxscript packages: pip install onnx onnxscript "
                          "onnxruntime") from error
    program = exported_program(model, example_length=example_length)
    with torch.no_grad():
        onnx_program = torch.onnx.export(program, input_names=list(INPUT_NAMES),
                                         output_names=list(output_names(model)), external_data=False,
                                         verbose=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx_program.save(str(path), external_data=False)
    return path


__all__ = ["INPUT_NAMES", "ONNX_PATH", "export_onnx", "exportable", "exported_program", "output_names",
           "sequence_bound"]
