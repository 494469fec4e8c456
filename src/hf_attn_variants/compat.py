"""One model code for every Transformers release from 5.0.0 on.

Transformers moved a few APIs between 5.0 and today; the model modules import them from here, where
each is resolved once at import:

- ``record_outputs``: the decorator of a base model's ``forward`` that fills ``use_cache``/``output_*``
  from the config and collects ``hidden_states``/``attentions`` through ``_can_record_outputs``. It is
  ``merge_with_config_defaults`` ∘ ``capture_outputs`` since 5.5 and ``check_model_inputs`` before.
- ``prepare_attention_mask``: ``create_causal_mask`` / ``create_bidirectional_mask`` took
  ``input_embeds`` and a mandatory ``cache_position`` in 5.0, ``inputs_embeds`` and no cache position
  later.
- ``ATTENTION_LOOKUP_BY_KEY``: whether attention kernels are looked up as ``ALL_ATTENTION_FUNCTIONS[name]``
  (5.0, a plain mapping) instead of ``ALL_ATTENTION_FUNCTIONS.get_interface(name, default)``. Transformers
  decides whether a model may switch kernels by searching its module's source for exactly that spelling,
  so the attention module spells out both.

This module also checks the installed version: exported model code starts with it (see
``hf_attn_variants.standalone``), so a too-old Transformers fails with one sentence naming the
version it needs instead of an ``ImportError`` deep inside the model code. Imports only ``torch``,
``transformers`` and the standard library.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch
import transformers

MIN_TRANSFORMERS_VERSION = "5.0.0"
"""Oldest Transformers release the model code runs on (tests/test_transformers_floor.py, tests/remote_code.py)."""


def version_tuple(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string: ``"5.10.4"`` → (5, 10, 4); ``"5.1.0.dev0"`` → (5, 1, 0)."""
    numbers = [int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))  # type: ignore[return-value]


def require_transformers(installed: str, minimum: str = MIN_TRANSFORMERS_VERSION) -> None:
    """Raise ``ImportError`` with one sentence naming ``minimum`` when ``installed`` is older."""
    if version_tuple(installed) < version_tuple(minimum):
        raise ImportError(
            f"This model's code needs transformers>={minimum}, but transformers {installed} is installed; "
            f"upgrade with: pip install -U 'transformers>={minimum}'"
        )


require_transformers(transformers.__version__)

try:  # transformers >= 5.5
    from transformers.utils.generic import merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    def record_outputs(forward: Callable[..., Any]) -> Callable[..., Any]:
        """Fill ``use_cache``/``output_*`` from the config, then record outputs (``_can_record_outputs``)."""
        return merge_with_config_defaults(capture_outputs(forward))

except ImportError:  # transformers 5.0–5.4: one decorator did both
    from transformers.utils.generic import check_model_inputs as record_outputs

from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ATTENTION_LOOKUP_BY_KEY = not hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface")

_MASK_PARAMETERS = {
    True: frozenset(inspect.signature(create_causal_mask).parameters),
    False: frozenset(inspect.signature(create_bidirectional_mask).parameters),
}


def prepare_attention_mask(
    *,
    causal: bool,
    config: Any,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    past_key_values: Any,
    position_ids: torch.Tensor,
    past_length: int,
) -> Any:
    """The mask ``config._attn_implementation`` expects, from Transformers' masking utilities.

    ``create_causal_mask`` when ``causal``, else ``create_bidirectional_mask``, called with the
    arguments the installed release accepts (``input_embeds``/``inputs_embeds``; the cache positions
    past_length … past_length + seq − 1 where 5.0 requires them).
    """
    parameters = _MASK_PARAMETERS[causal]
    values: dict[str, Any] = {
        "config": config,
        "attention_mask": attention_mask,
        "past_key_values": past_key_values,
        "position_ids": position_ids,
        "inputs_embeds" if "inputs_embeds" in parameters else "input_embeds": inputs_embeds,
    }
    if "cache_position" in parameters:
        length = inputs_embeds.shape[1]
        values["cache_position"] = torch.arange(past_length, past_length + length, device=inputs_embeds.device)
    make_mask = create_causal_mask if causal else create_bidirectional_mask
    return make_mask(**{name: value for name, value in values.items() if name in parameters})


__all__ = [
    "ATTENTION_LOOKUP_BY_KEY",
    "MIN_TRANSFORMERS_VERSION",
    "prepare_attention_mask",
    "record_outputs",
    "require_transformers",
    "version_tuple",
]
