"""One model code for every Transformers release from 5.0.0 on.

Transformers moved a few APIs between 5.0 and today; the model modules import them from here, where
each is resolved once at import:

- ``record_outputs``: the decorator of a base model's ``forward`` that fills ``use_cache``/``output_*``
  from the config and collects ``hidden_states``/``attentions`` through ``_can_record_outputs``. It is
  ``merge_with_config_defaults`` ∘ ``capture_outputs`` since 5.5 and ``check_model_inputs`` before.
- ``prepare_attention_mask``: ``create_causal_mask`` / ``create_bidirectional_mask`` took
  ``input_embeds`` and a mandatory ``cache_position`` in 5.0, ``inputs_embeds`` and no cache position
  later.
- ``CACHE_FIELD`` and ``accepts_cache_alias``: 5.24 renamed ``past_key_values`` to ``cache`` in model
  signatures, model outputs, masks and ``generate``. The model code calls it ``cache`` everywhere; its forwards
  also take ``past_key_values`` (as 5.24's own models do), and outputs carry the cache under the name the
  installed release's output classes declare, so ``generate`` finds it on every release.
- ``ALL_ATTENTION_FUNCTIONS``: the attention-kernel registry with one lookup on every release,
  ``get_interface(name, default)``. Releases before 5.5 have a plain mapping without that method. The attention
  module makes Llama's one call, spelled exactly so: Transformers decides whether a model may switch kernels
  (``set_attn_implementation``) by searching the model module's source for ``ALL_ATTENTION_FUNCTIONS.get_interface(``.

This module also checks the installed version: exported model code starts with it (see
``hf_attn_variants.models.standalone``), so a too-old Transformers fails with one sentence naming the
version it needs instead of an ``ImportError`` deep inside the model code. Imports only ``torch``,
``transformers`` and the standard library.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import warnings
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

from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    packed_sequence_mask_function,
)
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as TRANSFORMERS_ATTENTION_FUNCTIONS


class AttentionFunctions:
    """Transformers' registry of attention kernels (``AttentionInterface``) behind one lookup on every release.

    ``get_interface(name, default)`` is ``default`` for ``None`` and ``"eager"``; any other name goes to the
    registry's own ``get_interface`` where the release has it (≥ 5.5: its ``paged|`` handling and its error for an
    unknown name), else to ``registry[name]`` (5.0–5.4, a plain mapping). It reads the live registry, so kernels
    registered later (``register_stock_attention``, vLLM's) are found. ``None`` is answered here because
    Transformers warns on it, and a module built outside a model has it.
    """

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.lookup = getattr(registry, "get_interface", None)

    def get_interface(self, implementation: str | None, default: Callable[..., Any]) -> Callable[..., Any]:
        if implementation in (None, "eager"):
            return default
        if self.lookup is not None:
            return self.lookup(implementation, default)
        return self.registry[implementation]


ALL_ATTENTION_FUNCTIONS = AttentionFunctions(TRANSFORMERS_ATTENTION_FUNCTIONS)

CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)} else "past_key_values"
"""The name under which the installed release's model outputs hold the cache (and ``generate`` reads it back):
``cache`` from 5.24 on, ``past_key_values`` before."""

LEGACY_CACHE_ARGUMENT = "past_key_values"


def accepts_cache_alias(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Let a ``forward`` that declares ``cache`` also be called with ``past_key_values=``.

    Transformers 5.24 renamed the argument (``@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")`` on
    its own models); ``generate`` of 5.0–5.23 and user code still pass ``past_key_values``. One name inside:
    ``cache``. Both given → ``ValueError`` naming both. Where the installed release itself calls it ``cache``
    (``CACHE_FIELD``), the old name gets the ``FutureWarning`` Transformers' own models give (its common test
    ``test_bc_cache_name_forward`` expects it); on older releases, whose ``generate`` passes the old name, it is
    silent. ``functools.wraps`` keeps the signature that ``generate`` and ``Trainer`` inspect.
    """

    @functools.wraps(forward)
    def forward_with_alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        if LEGACY_CACHE_ARGUMENT in kwargs:
            legacy = kwargs.pop(LEGACY_CACHE_ARGUMENT)
            if kwargs.get("cache") is not None and legacy is not None:
                raise ValueError("Pass the cache as `cache` or as `past_key_values`, not both.")
            if legacy is not None:
                if CACHE_FIELD == "cache" and not torch.compiler.is_compiling():
                    warnings.warn(
                        f"`{LEGACY_CACHE_ARGUMENT}` is deprecated for `{type(self).__name__}.forward` (Transformers "
                        "renamed it in 5.24). Use `cache` instead.",
                        FutureWarning,
                        stacklevel=2,
                    )
                kwargs["cache"] = legacy
        return forward(self, *args, **kwargs)

    return forward_with_alias


def output_cache(outputs: Any) -> Any:
    """The cache a model output holds, under whichever name (``CACHE_FIELD``) the installed release uses."""
    return getattr(outputs, CACHE_FIELD, None)


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
    cache: Any,
    position_ids: torch.Tensor,
    past_length: int,
    document_ids: torch.Tensor | None = None,
) -> Any:
    """The mask ``config._attn_implementation`` expects, from Transformers' masking utilities.

    ``create_causal_mask`` when ``causal``, else ``create_bidirectional_mask``, called with the
    arguments the installed release declares (``input_embeds``/``inputs_embeds``; ``past_key_values``/``cache``;
    the cache positions past_length … past_length + seq − 1 where 5.0 requires them).

    Packed documents (``document_ids``, rows that pack several documents, no mask, no cache): the causal mask finds
    them itself from ``position_ids`` (Transformers' ``find_packed_sequence_indices``, 5.0 on); the bidirectional one
    reads no positions, so it gets Transformers' ``packed_sequence_mask_function`` of ``document_ids`` as its
    ``and_mask_function`` — block-diagonal in every kernel's format (a boolean or additive tensor, a flex BlockMask).
    """
    parameters = _MASK_PARAMETERS[causal]
    values: dict[str, Any] = {
        "config": config,
        "attention_mask": attention_mask,
        "cache" if "cache" in parameters else LEGACY_CACHE_ARGUMENT: cache,
        "position_ids": position_ids,
        "inputs_embeds" if "inputs_embeds" in parameters else "input_embeds": inputs_embeds,
    }
    if "cache_position" in parameters:
        length = inputs_embeds.shape[1]
        values["cache_position"] = torch.arange(past_length, past_length + length, device=inputs_embeds.device)
    if document_ids is not None and not causal:
        if "and_mask_function" not in parameters:  # never silently: every release from 5.0 to 5.24 has it
            raise NotImplementedError("This Transformers release's create_bidirectional_mask takes no "
                                      "and_mask_function, so packed documents cannot be kept apart.")
        values["and_mask_function"] = packed_sequence_mask_function(document_ids)
    make_mask = create_causal_mask if causal else create_bidirectional_mask
    return make_mask(**{name: value for name, value in values.items() if name in parameters})


__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "CACHE_FIELD",
    "MIN_TRANSFORMERS_VERSION",
    "AttentionFunctions",
    "accepts_cache_alias",
    "output_cache",
    "prepare_attention_mask",
    "record_outputs",
    "require_transformers",
    "version_tuple",
]
