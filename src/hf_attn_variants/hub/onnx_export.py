"""``export --onnx``: an ONNX graph of the exported model, run by onnxruntime.

The graph comes from ``torch.onnx.export(..., dynamo=True)`` (needs the ``onnx`` and ``onnxscript`` packages;
``pip install onnx onnxscript onnxruntime``). Inputs ``input_ids`` and ``attention_mask`` (int64, shape
``(batch, sequence)``, both axes dynamic; right or left padding through the mask), one output: ``logits`` for
a model with a head (``…ForMaskedLM``, ``…ForCausalLM``, …), ``last_hidden_state`` for the base model.

**Without cache**: the graph takes no past keys and returns none, so decoding with it re-runs the whole
sequence at every step; generation with a cache stays with Transformers' ``generate``.

This module imports nothing but torch and the standard library, so it also runs where only the exported
folder is (load the model with ``trust_remote_code=True``, then call ``export_onnx``; tests/clients_child.py
does that in an environment without this package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ONNX_PATH = "onnx/model.onnx"
"""Where ``export --onnx`` writes the graph inside the exported folder (Optimum's layout)."""
INPUT_NAMES = ("input_ids", "attention_mask")


class _SingleOutput(torch.nn.Module):
    """The model as ``(input_ids, attention_mask) -> one tensor``, without cache."""

    def __init__(self, model: torch.nn.Module, output_name: str) -> None:
        super().__init__()
        self.model = model
        self.output_name = output_name
        is_decoder = getattr(model.config, "is_decoder", False)
        self.options: dict[str, Any] = {"use_cache": False} if is_decoder else {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          **self.options)[self.output_name]


def output_name(model: torch.nn.Module) -> str:
    """``"last_hidden_state"`` for a base model (no head), else ``"logits"``."""
    return "last_hidden_state" if getattr(model, "base_model", model) is model else "logits"


def export_onnx(model: torch.nn.Module, path: str | Path, *, example_length: int = 8) -> Path:
    """Write ``model`` (eval mode, float32) as one self-contained ONNX file at ``path`` with dynamic batch and
    sequence axes; returns the path. The Synthesizer's sequence axis is bounded by
    ``max_position_embeddings``."""
    try:
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it)
    except ImportError as error:
        raise ImportError("export --onnx needs the onnx and onnxscript packages: pip install onnx onnxscript "
                          "onnxruntime") from error
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval().float()
    name = output_name(model)
    config = model.config
    max_length = getattr(config, "max_position_embeddings", None) or 4096
    example_length = min(example_length, max_length)
    input_ids = torch.full((2, example_length), 5, dtype=torch.long) % config.vocab_size
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -2:] = 0
    batch = torch.export.Dim("batch", min=1, max=1024)
    sequence = torch.export.Dim("sequence", min=2, max=max_length)
    dynamic = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    with torch.no_grad():
        program = torch.onnx.export(
            _SingleOutput(model, name).eval(), (input_ids, attention_mask), dynamo=True,
            input_names=list(INPUT_NAMES),
            output_names=[name], dynamic_shapes=dynamic, external_data=False, verbose=False,
        )
    program.save(str(path), external_data=False)
    return path


__all__ = ["INPUT_NAMES", "ONNX_PATH", "export_onnx", "output_name"]
