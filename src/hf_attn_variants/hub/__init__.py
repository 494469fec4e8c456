"""Publishing: ``export`` writes the exact folder that would be uploaded (safetensors, remote code,
tokenizer, model card from ``model_cards/``); ``push`` uploads it with ``huggingface_hub``."""

from __future__ import annotations

from .card import render_model_card
from .export import ExportArguments, check_export, export
from .push import PushArguments, PushError, push

__all__ = ["ExportArguments", "PushArguments", "PushError", "check_export", "export", "push",
           "render_model_card"]
