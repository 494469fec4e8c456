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

Uniform pruning (the same number k of heads left in every layer, ``iterative_head_pruning(uniform=True)``):
``restate_uniform_heads`` rewrites the config as an *unpruned* one with ``num_attention_heads = k`` and an
explicit ``head_dim`` (and ``num_key_value_heads`` for Llama-style decoders), so the checkpoint loads
like any unpruned model — plain ``from_pretrained``, ``trust_remote_code``, serving engines such as vLLM,
which need one head count for all layers and read ``num_attention_heads``/``head_dim`` from ``config.json``.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Mapping
from typing import Any

import torch
import transformers
from transformers import AutoConfig, PreTrainedConfig, PreTrainedModel

from ..models import FAMILIES
from ..models.configuration_common import MultiHeadAttnVariantConfig
from ..models.layers import check_head_indices
from .adapters import AttnVariantAdapter, DecoderAdapter, GatherHeads, HeadAdapter, get_adapter


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
        layer_heads = check_head_indices(layer_heads, adapter.num_heads, what="heads", layer=layer)
        gone = sorted(set(layer_heads) & set(already.get(layer, ())))
        if gone:
            raise ValueError(f"heads: heads {gone} of layer {layer} were already pruned.")
        if layer_heads:
            result[layer] = layer_heads
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
    adapter.check_removable()
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


def _uniform_fields(adapter: HeadAdapter, heads: int) -> dict[str, Any] | None:
    """Config fields that state ``heads`` heads in every layer for ``adapter``'s model, or None if its config
    cannot (BERT-style configs have no ``head_dim``; a Llama-style decoder needs the same key/value head count
    in every layer and equal groups, i.e. no per-query gather). A decoder config without a ``head_dim`` field
    gets one as an attribute (Qwen2's attention reads it when set); ``restate_uniform_heads`` then checks that
    the class rebuilds the pruned shapes from it."""
    if isinstance(adapter, AttnVariantAdapter):
        return {"num_attention_heads": heads, "head_dim": adapter.head_dim}
    if not isinstance(adapter, DecoderAdapter):
        return None
    kv_counts = set()
    for attention in adapter.attentions:
        hooks = itertools.chain(attention.k_proj._forward_hooks.values(),
                                attention.v_proj._forward_hooks.values())
        if any(isinstance(hook, GatherHeads) for hook in hooks):
            return None
        kv_counts.add(attention.k_proj.out_features // adapter.head_dim)
    if len(kv_counts) != 1 or heads % next(iter(kv_counts)):
        return None
    return {"num_attention_heads": heads, "num_key_value_heads": kv_counts.pop(),
            "head_dim": adapter.head_dim}


def _restated_config(config: PreTrainedConfig, fields: Mapping[str, Any]) -> PreTrainedConfig:
    """A copy of ``config`` with ``fields`` set and no pruning recorded (``pruned_heads`` empty for this
    package's configs, absent from stock ones, whose classes have no such field)."""
    restated = copy.deepcopy(config)
    for name, value in fields.items():
        setattr(restated, name, value)
    if isinstance(restated, MultiHeadAttnVariantConfig):
        restated.pruned_heads = {}
        restated.check_fields()
    else:
        restated.__dict__.pop("pruned_heads", None)
    return restated


PRIMITIVES = (int, float, bool, str, type(None))


def _structure(model: torch.nn.Module) -> dict[str, Any]:
    """What the shapes of a forward pass depend on: the shape of every parameter and buffer, and every public
    plain-valued attribute of every submodule (``in_features``, ``num_heads``, ``head_dim``, a rotary
    embedding's ``dim`` …; not ``training``)."""
    structure: dict[str, Any] = {}
    # Tied weights listed under each name: Transformers 5.0 builds a model on the meta device untied.
    for name, tensor in itertools.chain(model.named_parameters(remove_duplicate=False),
                                        model.named_buffers(remove_duplicate=False)):
        structure[name] = tuple(tensor.shape)
    for name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or attribute == "training":
                continue
            plain = isinstance(value, PRIMITIVES) or (
                isinstance(value, tuple) and all(isinstance(v, PRIMITIVES) for v in value)
            )
            if plain:
                structure[f"{name}:{attribute}"] = value
    return structure


def _rebuilds_same_structure(model: PreTrainedModel, config: PreTrainedConfig) -> bool:
    """Whether ``type(model)(config)``, built on the meta device (no memory), has ``model``'s structure: the
    restated config must rebuild exactly the pruned model (e.g. a model class that derived the head size from
    hidden_size / num_attention_heads instead of ``config.head_dim`` would not)."""
    with torch.device("meta"):
        fresh = type(model)(config)
    return _structure(fresh) == _structure(model)


def restate_uniform_heads(model: PreTrainedModel) -> bool:
    """If every layer of a pruned ``model`` keeps the same number k ≥ 1 of heads, restate its config as an
    unpruned model with k heads per layer; returns whether it did.

    The rewritten config has ``num_attention_heads = k``, an explicit ``head_dim`` (the unchanged head size)
    and no recorded pruning, so ``save_pretrained`` writes a checkpoint that loads like an unpruned one: plain
    ``from_pretrained``, ``trust_remote_code=True``, and serving engines that need one head count for all
    layers (vLLM reads ``num_attention_heads`` and ``head_dim`` from ``config.json``). This is what
    Torch-Pruning's uniform mode (``global_pruning=False``) aims at. The weights are already sliced, so only
    the bookkeeping changes: the heads are renumbered 0..k-1 (the original numbers are lost from the config;
    keep ``config.pruned_heads`` before calling if you need them) and further pruning uses the new numbers.

    Supported: this package's multi-head families (``entropy_invariant``, ``synthesizer``), and
    Llama/Qwen2/Mistral-style decoders whose attention reads ``config.head_dim`` when the key/value head
    count is the same in every layer and every kept key/value head serves the same number of queries (no
    per-query gather; always the case without grouped-query attention) — then ``num_key_value_heads`` is
    restated too. Not restated (returns False, the model and ``config.pruned_heads`` untouched — reload with
    ``load_pruned`` as before): nothing pruned, unequal head counts, layers without heads (k = 0),
    BERT-style encoders (their config has no ``head_dim``), grouped-query layouts the config cannot state,
    and any model that, built from the restated config, would not have exactly the current parameter and
    buffer shapes and layer sizes (checked on the meta device, so a checkpoint that would not rebuild the
    pruned model is never written).
    """
    adapter = get_adapter(model)
    if not adapter.pruned_heads():
        return False
    counts = {len(adapter.kept_heads(layer)) for layer in range(adapter.num_layers)}
    if len(counts) != 1 or 0 in counts:
        return False
    fields = _uniform_fields(adapter, counts.pop())
    if fields is None:
        return False
    configs: dict[int, PreTrainedConfig] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PreTrainedConfig) and id(config) not in configs:
            configs[id(config)] = _restated_config(config, fields)
    if not _rebuilds_same_structure(model, configs[id(model.config)]):
        return False
    for module in model.modules():  # private copies, as HeadAdapter.record: other models may share a config
        config = getattr(module, "config", None)
        if isinstance(config, PreTrainedConfig):
            module.config = configs[id(config)]
    return True


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
        "Cannot tell which model class to load (config.architectures = "
        f"{getattr(config, 'architectures', None)}); pass model_class=..."
    )


def _with_recorded_pruning(model_class: type[PreTrainedModel]) -> type[PreTrainedModel]:
    """A subclass of ``model_class`` whose constructor applies ``config.pruned_heads`` before weights load."""

    class RecordedPruning(model_class):  # type: ignore[misc,valid-type]  # a base known at run time
        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, *args, **kwargs)
            get_adapter(self).apply_recorded_pruning()

    # Its name, qualified name and module are model_class's, so whatever reads the class while it loads
    # (from_pretrained's messages, the config's ``architectures``) sees model_class.
    RecordedPruning.__name__ = RecordedPruning.__qualname__ = model_class.__name__
    RecordedPruning.__module__ = model_class.__module__
    return RecordedPruning


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
    config_kwargs = {k: from_pretrained_kwargs[k] for k in ("trust_remote_code", "revision")
                     if k in from_pretrained_kwargs}
    config = from_pretrained_kwargs.get("config") or AutoConfig.from_pretrained(path, **config_kwargs)
    model_class = _resolve_class(config, model_class)
    if not getattr(config, "pruned_heads", None) or isinstance(config, MultiHeadAttnVariantConfig):
        return model_class.from_pretrained(path, **from_pretrained_kwargs)
    model = _with_recorded_pruning(model_class).from_pretrained(path, **from_pretrained_kwargs)
    model.__class__ = model_class
    return model


__all__ = ["check_heads_to_prune", "count_heads", "load_pruned", "prune_heads", "restate_uniform_heads"]
