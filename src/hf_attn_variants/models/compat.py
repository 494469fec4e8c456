"""One model code for every Transformers release from 5.0.0 on: the APIs that moved, resolved once at import.

- ``record_outputs``: the base model's ``forward`` decorator (``merge_with_config_defaults``
  ∘ ``capture_outputs`` since 5.5, ``check_model_inputs`` before).
- ``CACHE_FIELD`` and ``accepts_cache_alias``: 5.24 renamed ``past_key_values`` to ``cache``; forwards take
  both names, and outputs carry the cache under the installed release's name.
- ``ALL_ATTENTION_FUNCTIONS``: the kernel registry with one ``get_interface(name, default)`` on every release
  (the attention module calls it spelled exactly so: Transformers searches the source for it to allow
  ``set_attn_implementation``).

Importing it checks the installed version, so a too-old Transformers fails with one sentence.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import transformers

MIN_TRANSFORMERS_VERSION = "5.0.0"
"""Oldest Transformers the model code runs on (the package's tests run it, remote code included, there)."""


def version_tuple(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string: ``"5.10.4"`` → (5, 10, 4); ``"5.1.0.dev0"`` → (5, 1, 0).

    Args:
        version (str): a version string; a local part after ``+`` is ignored, missing parts count as 0.

    Returns:
        tuple[int, int, int]: the first three numbers of the version.
    """
    numbers = [int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))  # type: ignore[return-value]


def require_transformers(installed: str, minimum: str = MIN_TRANSFORMERS_VERSION) -> None:
    """Raise ``ImportError`` with one sentence naming ``minimum`` when ``installed`` is older.

    Args:
        installed (str): the installed Transformers version.
        minimum (str): the oldest version the model code supports.

    Raises:
        ImportError: ``installed`` is older than ``minimum``; the message says how to upgrade.
    """
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
        """Fill ``use_cache``/``output_*`` from the config, then record outputs (``_can_record_outputs``).

        Args:
            forward (Callable): a base model's ``forward``.

        Returns:
            Callable: the decorated ``forward``.
        """
        return merge_with_config_defaults(capture_outputs(forward))

except ImportError:  # transformers 5.0–5.4: one decorator did both
    from transformers.utils.generic import check_model_inputs as record_outputs

from transformers.modeling_outputs import BaseModelOutputWithPast  # noqa: E402 (after the version check)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as TRANSFORMERS_ATTENTION_FUNCTIONS  # noqa: E402


class AttentionFunctions:
    """Transformers' registry of attention kernels behind one lookup on every release.

    ``get_interface(name, default)`` is ``default`` for ``None`` and ``"eager"``, else the registry's own
    ``get_interface`` (≥ 5.5) or ``registry[name]`` (a plain mapping before). It reads the live registry, so
    kernels registered later (the stock log-n wrapper, vLLM's) are found.
    """

    def __init__(self, registry: Any) -> None:
        """Wrap ``registry``.

        Args:
            registry (Any): Transformers' ``ALL_ATTENTION_FUNCTIONS`` (an ``AttentionInterface`` or a
                mapping).
        """
        self.registry = registry
        self.lookup = getattr(registry, "get_interface", None)

    def get_interface(self, implementation: str | None, default: Callable[..., Any]) -> Callable[..., Any]:
        """The attention kernel registered under ``implementation``.

        Args:
            implementation (str | None): ``config._attn_implementation``; ``None`` and ``"eager"`` mean
                ``default``.
            default (Callable): the module's own eager kernel.

        Returns:
            Callable: the kernel to call.
        """
        if implementation in (None, "eager"):
            return default
        if self.lookup is not None:
            return self.lookup(implementation, default)
        return self.registry[implementation]


ALL_ATTENTION_FUNCTIONS = AttentionFunctions(TRANSFORMERS_ATTENTION_FUNCTIONS)

CACHE_FIELD = ("cache" if "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)}
               else "past_key_values")
"""The name under which the installed release's model outputs hold the cache (``generate`` reads it back).

``cache`` from 5.24 on, ``past_key_values`` before.
"""

LEGACY_CACHE_ARGUMENT = "past_key_values"


def accepts_cache_alias(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Let a ``forward`` that declares ``cache`` also be called with ``past_key_values=``.

    Transformers 5.24 renamed the argument; ``generate`` of 5.0–5.23 passes the old name. Both given →
    ``ValueError``. Where the installed release itself says ``cache``, the old name gets Transformers'
    ``FutureWarning``.

    Args:
        forward (Callable): a model's ``forward`` with a ``cache`` argument.

    Returns:
        Callable: ``forward`` that also accepts ``past_key_values=``.
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
                        f"`{LEGACY_CACHE_ARGUMENT}` is deprecated for `{type(self).__name__}.forward` "
                        "(Transformers renamed it in 5.24). Use `cache` instead.",
                        FutureWarning,
                        stacklevel=2,
                    )
                kwargs["cache"] = legacy
        return forward(self, *args, **kwargs)

    return forward_with_alias


def output_cache(outputs: Any) -> Any:
    """The cache a model output holds, under whichever name (``CACHE_FIELD``) the installed release uses.

    Args:
        outputs (Any): a model output (a ``ModelOutput``).

    Returns:
        Any: its cache, or ``None``.
    """
    return getattr(outputs, CACHE_FIELD, None)


__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "CACHE_FIELD",
    "MIN_TRANSFORMERS_VERSION",
    "AttentionFunctions",
    "accepts_cache_alias",
    "output_cache",
    "record_outputs",
    "require_transformers",
    "version_tuple",
]
