"""Where a model's attention heads live, and how to remove them physically — one adapter per architecture
kind.

Every tool of ``hf_attn_variants.pruning`` talks to a model through a ``HeadAdapter``:

- ``AttnVariantAdapter`` — this project's multi-head families (``entropy_invariant``, ``synthesizer``):
  ``model.<base>.layers[i].self_attn`` with ``o_proj`` (sliced by ``prune_attention_heads``); the layers are
  built with ``config.layer_heads(i)``, so a pruned checkpoint reloads with plain ``from_pretrained``.
- ``EncoderAdapter`` — BERT/RoBERTa-style encoders (``<base>.encoder.layer[i].attention.self`` with
  ``query``/``key``/``value``, output projection ``attention.output.dense``).
- ``DecoderAdapter`` — Llama/Qwen2/Mistral-style decoders (``<base>.layers[i].self_attn`` with
  ``q/k/v/o_proj``), grouped-query attention included.

The single source of truth for what has been pruned is ``config.pruned_heads`` (``{layer: [original head
indices removed]}``); every adapter reads the kept heads from it, in their original order, which is also
the order of the head blocks in the projections.

Grouped-query attention after pruning. Query head h uses key/value head ⌊h / r⌋ (r = heads per group).
Removing query heads can leave groups of unequal size, which ``repeat_kv`` (one repeat count per layer)
cannot express. The adapter removes key/value heads left with no query, then:
- if every kept key/value head still serves the same number c of kept queries, it sets the layer's
  ``num_key_value_groups = c`` and the stock forward runs unchanged;
- otherwise it registers a forward hook on ``k_proj`` and ``v_proj`` that gathers, for each kept query
  head, the block of its key/value head (an index list, no parameters) and sets ``num_key_value_groups = 1``.
  The projections stay compact (parameters and matmul cost drop exactly), and every attention kernel,
  RoPE, q/k norms and caches see an ordinary multi-head layout. The price is a key/value cache as wide as
  the kept queries in such layers (not narrower); layers with equal groups keep the compact cache.
A layer without heads gets a forward that returns the output projection's bias (and, in a decoder, keeps
a one-channel placeholder in the cache so the cache's length bookkeeping stays right).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from ..models.configuration_common import MultiHeadAttnVariantConfig
from ..models.layers import check_head_indices, headless_attention_output, kept_heads, normalize_pruned_heads


def head_rows(heads: Iterable[int], head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Rows h·d, h·d + 1 … h·d + d − 1 (d = ``head_dim``) of every head h in ``heads``, in that order.

    The features of those heads in a head-major projection (one block of d per head), as a long tensor
    of length len(heads)·d: rows of q/k/v projections, columns of the output projection.
    """
    index = torch.tensor([int(h) for h in heads], dtype=torch.long, device=device)
    return (index[:, None] * head_dim + torch.arange(head_dim, device=device)).reshape(-1)

def slice_head_tensor(module: nn.Module, name: str, index: torch.Tensor, dim: int = 0) -> None:
    """Replace parameter or buffer ``name`` of ``module`` by a copy of ``tensor.index_select(dim, index)``.

    A parameter stays a parameter with its ``requires_grad``; a buffer is registered again as a persistent
    buffer; ``None`` (an optional tensor the module does not use) is left alone. Works on meta tensors.
    """
    tensor = getattr(module, name)
    if tensor is None:
        return
    data = tensor.data.index_select(dim, index.to(tensor.device)).clone()
    if isinstance(tensor, nn.Parameter):
        setattr(module, name, nn.Parameter(data, requires_grad=tensor.requires_grad))
    else:
        module.register_buffer(name, data, persistent=True)

def slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> None:
    """Keep output features ``index`` (``dim=0``: rows of W and entries of b) or input features ``index``
    (``dim=1``: columns of W) of ``linear``, in place; ``out_features`` / ``in_features`` = len(index)."""
    slice_head_tensor(linear, "weight", index, dim)
    if dim == 0:
        slice_head_tensor(linear, "bias", index, 0)
        linear.out_features = index.numel()
    else:
        linear.in_features = index.numel()


def prune_attention_heads(attention: nn.Module, keep: list[int]) -> None:
    """Keep only heads ``keep`` (indices into the current heads) of one of this package's multi-head attention
    modules, in place: the rows of q/k/v_proj and the columns of o_proj (head-major blocks of ``head_dim``),
    and the first dimension of every other tensor of the module (SSMax's per-head scale; the Synthesizer's
    dense branches and random matrices, a fixed one a buffer) but its ``tp_replicated_parameters`` (mixing
    logits). Keeping no head is allowed: the layer then outputs o_proj's bias. The caller records the change
    in ``config.pruned_heads``, which ``from_pretrained`` reads back."""
    keep = check_head_indices(keep, attention.num_heads, what="prune_attention_heads(keep)")
    device = attention.o_proj.weight.device
    rows = head_rows(keep, attention.head_dim, device)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    for name in projections:
        projection = getattr(attention, name, None)
        if projection is not None:
            slice_linear(projection, rows, dim=1 if name == "o_proj" else 0)
    index = torch.tensor(keep, dtype=torch.long, device=device)
    for prefix, module in attention.named_modules():
        if prefix.split(".")[0] in projections:
            continue
        for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if f"{prefix}.{name}".lstrip(".") not in attention.tp_replicated_parameters:
                slice_head_tensor(module, name, index)
    attention.num_heads = len(keep)



NO_HEAD_MODEL_TYPES = ("gau",)


class NoAttentionHeadsError(ValueError):
    """Raised for a model type whose attention has no heads to score or prune (e.g. GAU)."""


class GatherHeads:
    """Forward hook on a key/value projection: output block j ← input block ``index[j]`` (blocks of
    ``head_dim``).

    Turns the compact key/value heads of a pruned GQA layer with unequal groups into one key/value head
    per kept query head. A plain picklable object (no parameters, no buffers).
    """

    def __init__(self, index: list[int], head_dim: int) -> None:
        self.index = list(index)
        self.head_dim = head_dim

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        blocks = output.unflatten(-1, (-1, self.head_dim))
        index = torch.tensor(self.index, dtype=torch.long, device=output.device)
        return blocks.index_select(-2, index).flatten(-2)


def _given_cache(kwargs: dict[str, Any]) -> Any:
    """The cache a stock layer passed its attention: ``cache=`` from Transformers 5.24 on,
    ``past_key_values=`` before."""
    cache = kwargs.get("cache")
    return cache if cache is not None else kwargs.get("past_key_values")


def _headless_self_attention(module: nn.Module, hidden_states: torch.Tensor, *args: Any,
                             **kwargs: Any) -> tuple:
    """Forward of a BERT-style self-attention without heads: ``headless_attention_output`` without projection
    (the output dense, another module, adds its bias) on the self-attention half of an encoder-decoder cache.

    Returns the empty ``(batch, seq, 0)`` context and an empty ``(batch, 0, q, k)`` attention map.
    """
    cache = _given_cache(kwargs)
    cache = getattr(cache, "self_attention_cache", cache)
    return headless_attention_output(hidden_states, None, cache, module.layer_idx)


def _headless_decoder_attention(module: nn.Module, hidden_states: torch.Tensor, *args: Any,
                                **kwargs: Any) -> tuple:
    """Forward of a Llama-style attention without heads: ``headless_attention_output`` with ``o_proj``.

    Returns o_proj's bias (or zeros) and an empty ``(batch, 0, q, k)`` attention map; a cache gets its
    placeholder through a plain ``cache.update`` (a stock layer passes no query offset).
    """
    cache = _given_cache(kwargs)
    return headless_attention_output(hidden_states, module.o_proj, cache, module.layer_idx)


class HeadAdapter:
    """Base class: the heads of one model (original numbering), their output projections, and physical
    removal.

    Subclasses implement ``attention_modules``, ``output_projection``, ``head_dim``, ``current_head_count``
    and ``remove_heads``. ``kind`` names the architecture kind in messages.
    """

    kind: ClassVar[str] = "generic"

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.base = model.base_model
        self.num_heads = int(self.config.num_attention_heads)
        self.attentions = self.attention_modules()
        self.num_layers = len(self.attentions)

    @property
    def config(self) -> PreTrainedConfig:
        """The model's current config (read each time: ``prune_heads`` gives the model a private copy)."""
        return self.model.config

    # ---------------------------------------------------------------------------------------- layout
    @classmethod
    def matches(cls, model: PreTrainedModel) -> bool:
        """Whether this adapter understands ``model``'s structure."""
        raise NotImplementedError

    def attention_modules(self) -> list[nn.Module]:
        """The attention module of every layer, in layer order."""
        raise NotImplementedError

    def output_projection(self, layer: int) -> nn.Linear:
        """The linear layer whose input is the concatenation of layer ``layer``'s head outputs."""
        raise NotImplementedError

    @property
    def head_dim(self) -> int:
        """Size of one head's output block in the output projection's input."""
        raise NotImplementedError

    def current_head_count(self, layer: int) -> int:
        """Number of heads the module of layer ``layer`` has now (checked against the record)."""
        raise NotImplementedError

    def remove_heads(self, layer: int, keep_positions: list[int], old_kept: list[int],
                     new_kept: list[int]) -> None:
        """Physically keep only heads ``keep_positions`` (indices into the current heads) of layer ``layer``.

        ``old_kept``/``new_kept`` are the original indices of the heads kept before and after.
        """
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- record
    def pruned_heads(self) -> dict[int, list[int]]:
        """``config.pruned_heads`` validated, with int layer keys (JSON stores them as strings)."""
        return normalize_pruned_heads(
            getattr(self.config, "pruned_heads", None), num_layers=self.num_layers, num_heads=self.num_heads
        )

    def kept_heads(self, layer: int) -> list[int]:
        """Original indices of the heads layer ``layer`` still has, in the order of their blocks."""
        kept = kept_heads(self.pruned_heads(), layer, self.num_heads)
        actual = self.current_head_count(layer)
        if actual != len(kept):
            raise RuntimeError(
                f"Layer {layer} has {actual} heads but config.pruned_heads says {len(kept)}; the config and "
                "the weights are out of sync (load pruned checkpoints with "
                "hf_attn_variants.pruning.load_pruned)."
            )
        return kept

    def alive(self) -> torch.Tensor:
        """Boolean ``(num_layers, num_heads)``: True where a head still exists."""
        alive = torch.ones(self.num_layers, self.num_heads, dtype=torch.bool)
        for layer, heads in self.pruned_heads().items():
            alive[layer, heads] = False
        return alive

    def record(self, pruned: Mapping[int, list[int]]) -> None:
        """Write ``pruned`` to the model's config objects, each replaced by a private copy first.

        Models built from one config object share it; recording in place would make the others claim a
        pruning their weights do not have. So every distinct config found on the model's modules (heads
        may hold a copy of the base's) is deep-copied once, re-pointed everywhere it was used, and updated.
        """
        value = {int(layer): sorted(int(h) for h in heads) for layer, heads in sorted(pruned.items())
                 if heads}
        copies: dict[int, PreTrainedConfig] = {}
        for module in self.model.modules():
            config = getattr(module, "config", None)
            if isinstance(config, PreTrainedConfig):
                if id(config) not in copies:
                    copies[id(config)] = copy.deepcopy(config)
                    copies[id(config)].pruned_heads = {layer: list(heads) for layer, heads in value.items()}
                module.config = copies[id(config)]

    def check_removable(self) -> None:
        """``TypeError`` when removing heads would leave the model wrong; every adapter but the decoder's
        slices all a head has."""

    def apply_recorded_pruning(self) -> None:
        """Give a freshly built (unpruned) model the shapes recorded in ``config.pruned_heads``.

        Used by ``load_pruned`` before the weights are loaded; no-op for this project's families, which
        build pruned shapes themselves.
        """
        pruned = self.pruned_heads()
        if pruned:
            self.check_removable()
        for layer, removed in pruned.items():
            new_kept = [h for h in range(self.num_heads) if h not in set(removed)]
            self.remove_heads(layer, list(new_kept), list(range(self.num_heads)), new_kept)
        for module in self.model.modules():  # JSON gave string layer keys; store ints as prune_heads does
            config = getattr(module, "config", None)
            if isinstance(config, PreTrainedConfig):
                config.pruned_heads = {layer: list(heads) for layer, heads in pruned.items()}


class SelfAttnLayersAdapter(HeadAdapter):
    """Models whose layers are ``base.layers[i].self_attn`` with an output projection ``o_proj`` (this
    project's families and Llama-style decoders)."""

    def attention_modules(self) -> list[nn.Module]:
        return [layer.self_attn for layer in self.base.layers]

    def output_projection(self, layer: int) -> nn.Linear:
        return self.attentions[layer].o_proj


class AttnVariantAdapter(SelfAttnLayersAdapter):
    """This project's multi-head families: ``prune_attention_heads`` does the slicing."""

    kind = "hf_attn_variants multi-head family"

    @classmethod
    def matches(cls, model: PreTrainedModel) -> bool:
        return isinstance(model.config, MultiHeadAttnVariantConfig)

    @property
    def head_dim(self) -> int:
        return int(self.config.head_dim)

    def current_head_count(self, layer: int) -> int:
        return int(self.attentions[layer].num_heads)

    def remove_heads(self, layer: int, keep_positions: list[int], old_kept: list[int],
                     new_kept: list[int]) -> None:
        prune_attention_heads(self.attentions[layer], keep_positions)

    def apply_recorded_pruning(self) -> None:
        """Nothing to do: the layers were built with ``config.layer_heads(i)``."""


def _encoder_attention(attention: Any) -> bool:
    """Whether ``attention`` is a BERT-style block: ``self.{query,key,value}`` and ``output.dense``."""
    self_attention = getattr(attention, "self", None)
    return all(hasattr(self_attention, name) for name in ("query", "key", "value")) and hasattr(
        getattr(attention, "output", None), "dense"
    )


class EncoderAdapter(HeadAdapter):
    """BERT/RoBERTa-style encoders: ``encoder.layer[i].attention.{self.query,key,value; output.dense}``."""

    kind = "BERT-style encoder"

    @classmethod
    def matches(cls, model: PreTrainedModel) -> bool:
        layers = getattr(getattr(model.base_model, "encoder", None), "layer", None)
        if not layers:
            return False
        return all(_encoder_attention(getattr(layer, "attention", None)) for layer in layers)

    def attention_modules(self) -> list[nn.Module]:
        return [layer.attention for layer in self.base.encoder.layer]

    def output_projection(self, layer: int) -> nn.Linear:
        return self.attentions[layer].output.dense

    @property
    def head_dim(self) -> int:
        return int(self.attentions[0].self.attention_head_size)

    def current_head_count(self, layer: int) -> int:
        return int(self.attentions[layer].self.num_attention_heads)

    def remove_heads(self, layer: int, keep_positions: list[int], old_kept: list[int],
                     new_kept: list[int]) -> None:
        attention = self.attentions[layer]
        self_attention = attention.self
        rows = head_rows(keep_positions, self.head_dim, self_attention.query.weight.device)
        for projection in (self_attention.query, self_attention.key, self_attention.value):
            slice_linear(projection, rows, dim=0)
        slice_linear(attention.output.dense, rows, dim=1)
        self_attention.num_attention_heads = len(keep_positions)
        self_attention.all_head_size = len(keep_positions) * self.head_dim
        if not keep_positions:
            self_attention.forward = functools.partial(_headless_self_attention, self_attention)


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The decoder attention's projections, which ``DecoderAdapter.remove_heads`` slices."""


def unsliced_tensors(attention: nn.Module, num_heads: int, num_key_value_heads: int) -> list[str]:
    """The saved tensors of a decoder's ``attention`` outside its projections that hold one slice per head,
    which removing heads would leave wrong, as ``"name (shape)"``: a dimension of a head count or of the
    heads' features (Olmo2's q/k norms over every head's features, Cohere's per-head norms, GPT-OSS's
    attention sinks), or a place in a list of per-head modules (StableLM's per-head norms). A ``(head_dim,)``
    tensor of a direct child is shared by every head (Qwen3's and Gemma 3's ``q_norm``/``k_norm``), and
    buffers that are not saved (a rotary embedding's ``inv_freq``) are left alone."""
    head_dim = int(attention.head_dim)
    sizes = {num_heads, num_key_value_heads, num_heads * head_dim, num_key_value_heads * head_dim}
    lists = [f"{name}." for name, module in attention.named_modules()
             if isinstance(module, nn.ModuleList) and len(module) in (num_heads, num_key_value_heads)]
    found = []
    for name, tensor in attention.state_dict().items():
        if name.split(".")[0] in PROJECTIONS or (tuple(tensor.shape) == (head_dim,) and name.count(".") == 1):
            continue
        if any(size in sizes for size in tensor.shape) or any(name.startswith(prefix) for prefix in lists):
            found.append(f"{name} {tuple(tensor.shape)}")
    return found


class DecoderAdapter(SelfAttnLayersAdapter):
    """Llama/Qwen2/Mistral-style decoders with (grouped-query) attention
    ``layers[i].self_attn.{q,k,v,o}_proj``."""

    kind = "Llama-style decoder"

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        self.num_key_value_heads = int(getattr(self.config, "num_key_value_heads", None) or self.num_heads)
        if self.num_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads})."
            )
        self.group_size = self.num_heads // self.num_key_value_heads

    @classmethod
    def matches(cls, model: PreTrainedModel) -> bool:
        layers = getattr(model.base_model, "layers", None)
        if not layers:
            return False
        # every layer: a hybrid (MiniMax's linear-attention layers) has layers without the projections
        names = (*PROJECTIONS, "head_dim")
        attentions = [getattr(layer, "self_attn", None) for layer in layers]
        return all(hasattr(attention, name) for attention in attentions for name in names)

    def check_removable(self) -> None:
        """``TypeError`` naming the per-head tensors beside the projections that removing heads would leave
        wrong (``unsliced_tensors``); masking and scoring heads gate ``o_proj``'s input and still apply."""
        unsliced = list(dict.fromkeys(name for attention in self.attentions  # each name once, every layer's
                                      for name in unsliced_tensors(attention, self.num_heads,
                                                                   self.num_key_value_heads)))
        if unsliced:
            more = f", … ({len(unsliced)} in all)" if len(unsliced) > 4 else ""
            listed = ", ".join(unsliced[:4]) + more
            raise TypeError(
                f"Heads cannot be removed from {type(self.model).__name__}: its attention has per-head "
                f"tensors beside q/k/v/o_proj that pruning would leave wrong ({listed}). head_mask and "
                "compute_head_importance still apply."
            )

    @property
    def head_dim(self) -> int:
        return int(self.attentions[0].head_dim)

    def current_head_count(self, layer: int) -> int:
        return self.attentions[layer].q_proj.out_features // self.head_dim

    def kv_heads(self, query_heads: list[int]) -> list[int]:
        """Original key/value heads still used by the original query heads ``query_heads``."""
        return sorted({h // self.group_size for h in query_heads})

    def remove_heads(self, layer: int, keep_positions: list[int], old_kept: list[int],
                     new_kept: list[int]) -> None:
        attention = self.attentions[layer]
        old_kv, new_kv = self.kv_heads(old_kept), self.kv_heads(new_kept)
        kv_positions = [old_kv.index(g) for g in new_kv]
        device = attention.q_proj.weight.device
        rows = head_rows(keep_positions, self.head_dim, device)
        kv_rows = head_rows(kv_positions, self.head_dim, device)
        slice_linear(attention.q_proj, rows, dim=0)
        slice_linear(attention.k_proj, kv_rows, dim=0)
        slice_linear(attention.v_proj, kv_rows, dim=0)
        slice_linear(attention.o_proj, rows, dim=1)
        for projection in (attention.k_proj, attention.v_proj):
            for key, hook in list(projection._forward_hooks.items()):
                if isinstance(hook, GatherHeads):
                    del projection._forward_hooks[key]
        if not new_kept:
            attention.forward = functools.partial(_headless_decoder_attention, attention)
            attention.num_key_value_groups = 1
            return
        sizes = {sum(1 for h in new_kept if h // self.group_size == g) for g in new_kv}
        if len(sizes) == 1:
            attention.num_key_value_groups = sizes.pop()
            return
        index = [new_kv.index(h // self.group_size) for h in new_kept]
        for projection in (attention.k_proj, attention.v_proj):
            projection.register_forward_hook(GatherHeads(index, self.head_dim))
        attention.num_key_value_groups = 1


ADAPTERS: tuple[type[HeadAdapter], ...] = (AttnVariantAdapter, EncoderAdapter, DecoderAdapter)
"""Tried in order by ``get_adapter``."""


def get_adapter(model: Any) -> HeadAdapter:
    """The ``HeadAdapter`` for ``model``.

    Raises ``NoAttentionHeadsError`` (a ``ValueError``) for GAU models, which have one attention unit per
    layer, and ``TypeError`` for anything that is not a supported ``PreTrainedModel``.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}.")
    model_type = getattr(model.config, "model_type", None)
    if model_type in NO_HEAD_MODEL_TYPES:
        raise NoAttentionHeadsError(
            f"{type(model).__name__} (model_type {model_type!r}) has a single gated attention unit per layer "
            "and no attention heads, so head importance and head pruning do not apply to it."
        )
    for adapter_class in ADAPTERS:
        if adapter_class.matches(model):
            return adapter_class(model)
    raise TypeError(
        f"Head pruning does not know the architecture of {type(model).__name__} (model_type {model_type!r}). "
        "Supported: this package's multi-head families (entropy_invariant, synthesizer), BERT/RoBERTa-style "
        "encoders (encoder.layer[i].attention.self.query/key/value) and Llama/Qwen2/Mistral-style decoders "
        "(layers[i].self_attn.q_proj/k_proj/v_proj/o_proj)."
    )


__all__ = [
    "ADAPTERS",
    "AttnVariantAdapter",
    "DecoderAdapter",
    "EncoderAdapter",
    "GatherHeads",
    "HeadAdapter",
    "NoAttentionHeadsError",
    "get_adapter",
    "prune_attention_heads",
]
