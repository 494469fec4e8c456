"""Physical head removal (``prune_heads``) and reloading of pruned checkpoints (``load_pruned``).

Removing head h deletes its rows of the query/key/value projections and its columns of the output
projection (Michel et al. 2019 keep exactly those shapes; Transformers v4 did the same before v5 removed
``prune_heads``). A pruned model's outputs equal the unpruned model's under ``head_mask`` with those heads
zeroed. The removed heads are recorded, by original index and merged with earlier pruning, in
``config.pruned_heads``; ``save_pretrained`` writes it to ``config.json``.

Reloading: this project's families build every layer with ``config.layer_heads(i)``, so plain
``from_pretrained`` (and ``trust_remote_code=True`` without this package) rebuilds the pruned shapes. Stock
Transformers configs have no per-layer head counts, so ``load_pruned`` builds the model class with the
recorded pruning applied before the checkpoint's weights are loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import transformers
from transformers import AutoConfig, PreTrainedModel

from .. import FAMILIES
from ..configuration_common import MultiHeadAttnVariantConfig
from .adapters import HeadAdapter, get_adapter


def check_heads_to_prune(adapter: HeadAdapter, heads: Any) -> dict[int, list[int]]:
    """Validate ``{layer: [original head indices]}`` against the model; returns int keys and sorted lists.

    Raises ``TypeError`` for a non-dict / non-int entries and ``ValueError`` naming ``heads`` for a layer
    or head out of range, a head listed twice, or a head that was already pruned.
    """
    if not isinstance(heads, Mapping):
        raise TypeError(f"heads must be a dict {{layer: [head indices]}}, got {type(heads).__name__}.")
    already = adapter.pruned_heads()
    result: dict[int, list[int]] = {}
    for layer, layer_heads in heads.items():
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"heads: layer keys must be ints, got {layer!r}.")
        if not 0 <= layer < adapter.num_layers:
            raise ValueError(f"heads: layer {layer} is out of range [0, {adapter.num_layers}).")
        if isinstance(layer_heads, (str, bytes)) or not hasattr(layer_heads, "__iter__"):
            raise TypeError(f"heads[{layer}] must be a list of head indices, got {layer_heads!r}.")
        layer_heads = list(layer_heads)
        for head in layer_heads:
            if isinstance(head, bool) or not isinstance(head, int):
                raise TypeError(f"heads[{layer}] must contain ints, got {head!r}.")
        bad = [h for h in layer_heads if not 0 <= h < adapter.num_heads]
        if bad:
            raise ValueError(f"heads: heads {bad} of layer {layer} are out of range [0, {adapter.num_heads}).")
        if len(set(layer_heads)) != len(layer_heads):
            raise ValueError(f"heads: layer {layer} lists a head twice: {layer_heads}.")
        gone = sorted(set(layer_heads) & set(already.get(layer, ())))
        if gone:
            raise ValueError(f"heads: heads {gone} of layer {layer} were already pruned.")
        if layer_heads:
            result[layer] = sorted(layer_heads)
    return result


def prune_heads(model: PreTrainedModel, heads: Mapping[int, list[int]]) -> PreTrainedModel:
    """Remove heads ``{layer: [original head indices]}`` from ``model`` in place and return it.

    Slices q/k/v rows and output-projection columns (for grouped-query attention: the query heads, plus
    the key/value heads no kept query uses; see ``adapters`` for unequal groups), updates the layers'
    head counts and records the merged removal in ``config.pruned_heads``. A layer may lose all its heads
    (its attention then outputs the output projection's bias). Everything is validated before anything
    changes. Parameters are replaced by new tensors: rebuild optimizers after pruning.
    """
    adapter = get_adapter(model)
    heads = check_heads_to_prune(adapter, heads)
    before = adapter.pruned_heads()
    merged = {layer: list(removed) for layer, removed in before.items()}
    for layer, removed in heads.items():
        old_kept = adapter.kept_heads(layer)
        new_kept = [h for h in old_kept if h not in set(removed)]
        keep_positions = [old_kept.index(h) for h in new_kept]
        adapter.remove_heads(layer, keep_positions, old_kept, new_kept)
        merged[layer] = sorted(set(merged.get(layer, [])) | set(removed))
    adapter.record(merged)
    return model


def count_heads(model: PreTrainedModel) -> tuple[int, int]:
    """(heads the model still has, heads it had before any pruning)."""
    adapter = get_adapter(model)
    return int(adapter.alive().sum()), adapter.num_layers * adapter.num_heads


def _resolve_class(config: Any, model_class: type[PreTrainedModel] | None) -> type[PreTrainedModel]:
    """The class to load: ``model_class`` or the first of ``config.architectures`` (ours or transformers')."""
    if model_class is not None:
        return model_class
    for name in getattr(config, "architectures", None) or ():
        for _, classes in FAMILIES.values():
            for candidate in classes.values():
                if candidate.__name__ == name:
                    return candidate
        candidate = getattr(transformers, name, None)
        if isinstance(candidate, type) and issubclass(candidate, PreTrainedModel):
            return candidate
    raise ValueError(
        f"Cannot tell which model class to load (config.architectures = {getattr(config, 'architectures', None)}); "
        "pass model_class=..."
    )


def _with_recorded_pruning(model_class: type[PreTrainedModel]) -> type[PreTrainedModel]:
    """A subclass of ``model_class`` whose constructor applies ``config.pruned_heads`` before weights load."""

    def __init__(self: PreTrainedModel, config: Any, *args: Any, **kwargs: Any) -> None:
        model_class.__init__(self, config, *args, **kwargs)
        get_adapter(self).apply_recorded_pruning()

    return type(model_class.__name__, (model_class,), {"__init__": __init__, "__module__": model_class.__module__})


def load_pruned(
    path: str | os.PathLike,
    *,
    model_class: type[PreTrainedModel] | None = None,
    **from_pretrained_kwargs: Any,
) -> PreTrainedModel:
    """Load any checkpoint saved after ``prune_heads`` (stock or ours) with its pruned shapes.

    ``model_class`` defaults to ``config.architectures[0]`` (a class of this package or of transformers);
    the other keyword arguments go to ``from_pretrained`` (``dtype``, ``device_map``,
    ``attn_implementation`` …). Unpruned checkpoints load as usual. The returned model is an instance of
    ``model_class`` itself.
    """
    config_kwargs = {k: from_pretrained_kwargs[k] for k in ("trust_remote_code", "revision") if k in from_pretrained_kwargs}
    config = from_pretrained_kwargs.get("config") or AutoConfig.from_pretrained(path, **config_kwargs)
    model_class = _resolve_class(config, model_class)
    if not getattr(config, "pruned_heads", None) or isinstance(config, MultiHeadAttnVariantConfig):
        return model_class.from_pretrained(path, **from_pretrained_kwargs)
    model = _with_recorded_pruning(model_class).from_pretrained(path, **from_pretrained_kwargs)
    model.__class__ = model_class
    return model


__all__ = ["check_heads_to_prune", "count_heads", "load_pruned", "prune_heads"]
