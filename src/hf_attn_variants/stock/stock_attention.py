"""Entropy-invariant attention for stock Transformers models, as an attention implementation.

After ``import hf_attn_variants``::

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="entropy_invariant")

applies training-free log-n scaling to any model whose attention dispatches through
``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2, Mistral, BERT/RoBERTa, …): each query row's logits are
multiplied by a factor ≥ 1 on top of the model's own scaling. The factor is folded into q and the rest is
Transformers' own SDPA kernel, so GQA, dropout and the cache behave exactly as with ``"sdpa"``.

Config attributes it reads (all optional):

- ``entropy_invariant_formula``: ``"log_ratio"`` (default) = Su's log(max(nᵢ, ``entropy_min_length``)) /
  log(``base_length``), nᵢ = the keys row i sees; or ``"llama4"`` = Llama 4's attention temperature
  1 + ``attn_scale`` · log(1 + ⌊(p + 1) / ``floor_scale``⌋) for the query at position p (defaults 0.1 and
  8192, Llama 4's; its configs' own ``attn_scale``/``floor_scale`` are used when present).
- ``entropy_invariant_scope`` (``log_ratio``): ``"beyond"`` (default) = max(1, factor), so up to the
  training length the pretrained model is unchanged (Qwen's ``use_logn_attn``); ``"all"`` = every row,
  shorter ones sharpened less (what this package's own family is trained with).
- ``base_length``: the training length m; else the RoPE parameters' ``original_max_position_embeddings``,
  else ``max_position_embeddings``. ``entropy_min_length``: the clamp of nᵢ (default 16).

nᵢ comes from the mask the model built (padding, causality, sliding windows, packed sequences without a
cache; past cache included); where the model builds none (no padding), from causality as the kernel then
applies it (``unmasked_query_offset``: a prefill from position 0 sees keys 0…i, also in an empty static
cache whose key tensor is longer; one decoding query sees every key), as eager attention counts them. Only
a serving engine's own attention (vLLM's, which packs the tokens of many sequences and passes no mask;
``vllm_plugin``) takes nᵢ from the ``position_ids``: nᵢ = position + 1. Positions a caller passes to a
Transformers model do not change which keys a row sees (offset positions, or packed rows with a cache,
where Transformers builds no document mask), so they do not change nᵢ either. The Llama 4 formula always
follows the query positions.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from ..models.layers import (
    ENTROPY_INVARIANT_SCOPES,
    boolean_attention_mask,
    compute_dtype,
    entropy_invariant_factor,
    upcast,
    visible_key_counts,
)
from ..models.modeling_common import STOCK_LOG_N_ATTENTION
from ..models.modeling_entropy_invariant import eager_attention_forward

ENTROPY_INVARIANT, ENTROPY_INVARIANT_EAGER = STOCK_LOG_N_ATTENTION
DEFAULT_MIN_LENGTH = 16
DEFAULT_BASE_LENGTH = 512
FORMULAS = ("log_ratio", "llama4")
LLAMA4_ATTN_SCALE = 0.1
LLAMA4_FLOOR_SCALE = 8192
UNCOMPUTED = {"s_aux": "attention sinks (GPT-OSS's s_aux)", "sinks": "attention sinks (sinks)",
              "softcap": "attention logit soft-capping (Gemma 2's softcap)",
              "block_indices": "block-sparse attention (block_indices)"}
"""Arguments of a stock attention call that change its weights and that neither function here computes
(Transformers' SDPA function ignores ``s_aux``): given, they raise instead of being dropped."""
UNCOMPUTED_EAGER = {**UNCOMPUTED, "position_bias": "a relative position bias (T5's position_bias)"}
"""``UNCOMPUTED`` for the eager function, whose eager attention adds no ``position_bias`` (the SDPA one
does)."""


def check_computed(name: str, uncomputed: dict[str, str], kwargs: dict[str, Any]) -> None:
    """``ValueError`` when the model's attention passes an argument of ``uncomputed`` (not ``None``): the
    attention implementation ``name`` would compute other weights than the model's own attention."""
    for argument, what in uncomputed.items():
        if kwargs.get(argument) is not None:
            other = ("attn_implementation='entropy_invariant', which adds it" if argument == "position_bias"
                     else "the model's own attention (attn_implementation='eager'), without log-n scaling")
            raise ValueError(f"attn_implementation={name!r} does not compute {what}, which this model's "
                             f"attention uses: it would change the model; use {other}.")


def llama4_attention_temperature(
    query_positions: torch.Tensor, attn_scale: float = 0.1, floor_scale: int = 8192
) -> torch.Tensor:
    """Llama 4's attention temperature tuning: 1 + attn_scale · log(1 + ⌊(p + 1) / floor_scale⌋) for the query
    at position p (Meta, Llama 4, 2025; ``Llama4TextAttention`` with ``attn_temperature_tuning``). A step
    function of p that is exactly 1 below ``floor_scale`` − 1 and grows like log p beyond: ≥ 1 everywhere.
    """
    steps = torch.floor((query_positions + 1) / floor_scale)
    return 1.0 + attn_scale * torch.log1p(steps)


def resolve_base_length(config: PreTrainedConfig | None) -> int:
    """The training length m: ``base_length``, else RoPE's original context, else
    ``max_position_embeddings``; ``ValueError`` for a ``base_length`` that is not a whole number (``"abc"``,
    NaN, 2.7 would be read as 2)."""
    if config is None:
        return DEFAULT_BASE_LENGTH
    if getattr(config, "base_length", None) is not None:  # 0 is refused by the caller, not replaced
        value = config.base_length
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole:
            raise ValueError(f"base_length must be a whole number of tokens, got {value!r}.")
        return int(value)
    original = original_context(getattr(config, "rope_parameters", None))
    if original is not None:
        return original
    return int(getattr(config, "max_position_embeddings", None) or DEFAULT_BASE_LENGTH)


def original_context(rope_parameters: Any) -> int | None:
    """RoPE's ``original_max_position_embeddings`` (the context before YaRN or another extension), from the
    parameters of a model or, for models with one set per layer type (Gemma 3: ``{"full_attention": {…},
    "sliding_attention": {…}}``), of its full-attention layers (else the first set naming one)."""
    if not isinstance(rope_parameters, dict):
        return None
    if rope_parameters.get("original_max_position_embeddings"):
        return int(rope_parameters["original_max_position_embeddings"])
    nested = [value for value in rope_parameters.values() if isinstance(value, dict)]
    nested.sort(key=lambda value: value is not rope_parameters.get("full_attention"))
    return next((int(value["original_max_position_embeddings"]) for value in nested
                 if value.get("original_max_position_embeddings")), None)


def entropy_invariant_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention with the logits of row i multiplied by a factor ≥ 1 (see the module docstring).

    ``query`` is ``(batch, heads, q, d)``; ``attention_mask`` is the boolean 4D mask from ``sdpa_mask``
    or ``None`` (no padding: nᵢ follows from causality and the cache offset, no mask is built).
    """
    check_computed(ENTROPY_INVARIANT, UNCOMPUTED, kwargs)
    config = getattr(module, "config", None)
    factor = stock_logit_factor(config, query, key, attention_mask, kwargs.get("position_ids"),
                                causal=bool(getattr(module, "is_causal", False)))
    query = (upcast(query) * factor[:, None, :, None]).to(query.dtype)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def entropy_invariant_eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``entropy_invariant_attention_forward`` over eager attention (the entropy-invariant family's
    ``eager_attention_forward``), returning the probabilities ``(batch, heads, q, k)`` too
    (``output_attentions``; ``hf-attn-variants entropy``). Keys and values are repeated for grouped-query
    attention; ``attention_mask`` is the additive mask of ``eager_mask``, or ``None`` (causal rows then see
    the keys up to their own position)."""
    check_computed(ENTROPY_INVARIANT_EAGER, UNCOMPUTED_EAGER, kwargs)
    config = getattr(module, "config", None)
    causal = bool(getattr(module, "is_causal", False))
    factor = stock_logit_factor(config, query, key, attention_mask, kwargs.get("position_ids"), causal=causal)
    query = (upcast(query) * factor[:, None, :, None]).to(query.dtype)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    batch_size, _, query_length, _ = query.shape
    key_length = key.shape[2]
    if attention_mask is None:
        attention_mask = boolean_attention_mask(None, batch_size=batch_size, query_length=query_length,
                                                key_length=key_length,
                                                query_offset=unmasked_query_offset(query_length, key_length),
                                                causal=causal, device=query.device)
    else:
        attention_mask = attention_mask[..., :key_length]
    return eager_attention_forward(module, query, key, value, attention_mask,
                                   scaling=scaling or query.shape[-1] ** -0.5, dropout=dropout)


def stock_logit_factor(
    config: PreTrainedConfig | None,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    *,
    causal: bool,
    count_from_positions: bool = False,
) -> torch.Tensor:
    """The per-row factor ``(batch, q)`` of ``entropy_invariant_attention_forward`` for ``config``.

    ``count_from_positions``: without a mask, nᵢ = ``position_ids`` + 1 (a serving engine's packed tokens)
    instead of the keys causality and the cache offset leave visible (what the kernel attends to in a
    Transformers model). ``position_ids`` always drive the Llama 4 formula."""
    formula = getattr(config, "entropy_invariant_formula", None) or "log_ratio"
    if formula not in FORMULAS:
        raise ValueError(f"entropy_invariant_formula must be one of {FORMULAS}, got {formula!r}.")
    scope = getattr(config, "entropy_invariant_scope", None) or "beyond"
    if scope not in ENTROPY_INVARIANT_SCOPES:
        raise ValueError(f"entropy_invariant_scope must be one of {ENTROPY_INVARIANT_SCOPES}, got {scope!r}.")
    batch_size, _, query_length, _ = query.shape
    key_length = key.shape[2]
    dtype = compute_dtype(query.dtype)
    if not causal:
        position_ids = None  # a bidirectional row sees every real key, whatever its position
    if formula == "llama4":
        positions = position_ids
        if positions is None:
            positions = torch.arange(key_length - query_length, key_length, device=query.device)[None]
        positions = positions.to(device=query.device, dtype=dtype).expand(batch_size, query_length)
        attn_scale = config_number(config, "attn_scale", LLAMA4_ATTN_SCALE, minimum=0)
        floor_scale = int(config_number(config, "floor_scale", LLAMA4_FLOOR_SCALE, minimum=1, whole=True))
        return llama4_attention_temperature(positions, attn_scale, floor_scale)
    base_length = resolve_base_length(config)
    if base_length < 2:
        raise ValueError(f"base_length must be >= 2 for entropy-invariant attention, got {base_length}.")
    min_length = int(config_number(config, "entropy_min_length", DEFAULT_MIN_LENGTH, minimum=1, whole=True))
    counts = visible_key_counts(
        attention_mask,
        batch_size=batch_size,
        query_length=query_length,
        key_length=key_length,
        query_offset=(key_length - query_length if attention_mask is not None or count_from_positions
                      else unmasked_query_offset(query_length, key_length)),
        causal=causal,
        device=query.device,
        dtype=dtype,
        # Where the model built a mask the mask decides; without one the kernel attends causally over the key
        # tensor, except for a serving engine's packed tokens, whose positions restart per sequence.
        position_ids=position_ids if count_from_positions else None,
    )
    return entropy_invariant_factor(counts, base_length, min_length, scope)


def unmasked_query_offset(query_length: int, key_length: int) -> int:
    """Where a causal kernel given no mask puts the first query among the keys, as torch's SDPA with
    ``is_causal`` does (Transformers' ``sdpa_attention_forward``): several queries are aligned to the first
    keys (row i sees keys 0…i; Transformers leaves the mask out only for a prefill from position 0, also into
    an empty static cache, whose key tensor is longer), one query sees every key."""
    return 0 if query_length > 1 else key_length - 1


def config_number(config: PreTrainedConfig | None, name: str, default: float, *, minimum: float,
                  whole: bool = False) -> float:
    """``config.<name>``, or ``default`` when the config has none (``None``): a value it sets is used as it
    is, even 0 (``attn_scale=0.0`` turns Llama 4's temperature off; it was read as 0.1), and a value below
    ``minimum``, not finite or (``whole``) not a whole number raises ``ValueError`` naming the field."""
    import math

    value = getattr(config, name, None)
    if value is None:
        return default
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < minimum or (whole and float(value) != int(value)):
        kind = "a whole number" if whole else "a finite number"
        raise ValueError(f"{name} must be {kind} >= {minimum:g}, got {value!r}.")
    return value


def dispatches_attention(model: PreTrainedModel) -> bool:
    """Whether a module of ``model`` is defined where Transformers' ``ALL_ATTENTION_FUNCTIONS`` is used, the
    table an ``attn_implementation`` name is looked up in (Transformers' own test of a model's source).
    Bloom and DeBERTa-v2 compute their attention themselves: the name changes nothing there. A module whose
    source cannot be read (defined in a notebook or at the prompt, or shipped compiled) may dispatch: True."""
    sources: dict[str, bool] = {}
    for module in model.modules():
        name = type(module).__module__
        if name not in sources:
            try:
                sources[name] = "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(sys.modules[name])
            except (KeyError, OSError, TypeError):  # no source to read: not known not to dispatch
                sources[name] = True
        if sources[name]:
            return True
    return False


def configure_log_n(model: PreTrainedModel, *, base_length: int | None = None, formula: str | None = None,
                    scope: str | None = None, min_length: int | None = None) -> int:
    """Set the log-n fields (``base_length``, ``entropy_invariant_formula``, ``entropy_invariant_scope``,
    ``entropy_min_length``; ``None`` leaves one as it is) on every config of a stock ``model`` whose
    attention runs ``"entropy_invariant"`` (or ``"entropy_invariant_eager"``): ``model.config``, its
    sub-configs and each module's own ``config`` (T5's stacks hold copies; a vision-language model's text
    model reads ``text_config``, which may be the only one scaled), so that ``model.config.base_length = L``
    alone is not silently ignored there. A ``PeftModel`` is read through its base model. A compiled model
    recompiles when these fields change (torch 2.11 and later; below, dynamo does not guard them: call
    ``torch.compiler.reset()``): pass the module that was compiled, not ``torch.compile``'s wrapper.
    ``TypeError`` for a model none of whose configs runs those implementations, one whose submodels of the
    same config class were left on another (``check_submodels_follow``), or one whose attention does not
    dispatch through ``ALL_ATTENTION_FUNCTIONS``; ``ValueError`` naming a bad value. Returns how many configs
    were set."""
    if hasattr(model, "get_base_model") and not isinstance(model, PreTrainedModel):
        model = model.get_base_model()  # a PeftModel
    if not isinstance(model, PreTrainedModel):
        name = type(model).__name__
        compiled = (" (torch.compile's wrapper: pass the model you compiled, which recompiles when its "
                    "config changes)" if name == "OptimizedModule" else "")
        raise TypeError(f"model must be a transformers PreTrainedModel, got {name}{compiled}.")
    if not dispatches_attention(model):
        raise TypeError(f"{type(model).__name__} computes its attention itself, not through Transformers' "
                        "ALL_ATTENTION_FUNCTIONS, so log-n scaling cannot apply to it.")
    scaled = [config for config in model_configs(model)
              if getattr(config, "_attn_implementation", None) in STOCK_LOG_N_ATTENTION]
    if not scaled:
        raise TypeError(f"{type(model).__name__} was loaded with attn_implementation="
                        f"{getattr(model.config, '_attn_implementation', None)!r}: load it with "
                        f"attn_implementation={ENTROPY_INVARIANT!r} (or give it to the sub-configs to scale) "
                        "for log-n scaling.")
    check_submodels_follow(model)
    fields = {"base_length": base_length, "entropy_invariant_formula": formula,
              "entropy_invariant_scope": scope, "entropy_min_length": min_length}
    check_log_n_fields(fields)
    for config in scaled:
        for field, value in fields.items():
            if value is not None:
                setattr(config, field, value)
    return len(scaled)


def check_submodels_follow(model: PreTrainedModel) -> None:
    """``TypeError`` when ``model.config`` runs log-n attention but a submodel holding its own copy of a
    config of the same class (T5's encoder and decoder stacks) still runs another implementation: what
    ``set_attn_implementation`` leaves behind in Transformers 5.15-5.19, where T5 already dispatches through
    ``ALL_ATTENTION_FUNCTIONS`` but the method skips submodels whose config has the model config's class
    (fixed in 5.20). Log-n scaling would silently not apply there."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in STOCK_LOG_N_ATTENTION:
        return
    stale = {name: module.config._attn_implementation for name, module in model.named_modules()
             if _own_copy(module, model) and module.config._attn_implementation not in STOCK_LOG_N_ATTENTION}
    if stale:
        named = ", ".join(f"{name} ({value!r})" for name, value in stale.items())
        raise TypeError(f"{type(model).__name__} runs attn_implementation={implementation!r} but its "
                        f"submodels {named} still run another one (set_attn_implementation does not reach "
                        f"them in Transformers 5.15-5.19): load the model with attn_implementation="
                        f"{implementation!r}, or call set_attn_implementation on each of them, so that log-n "
                        "scaling applies everywhere.")


def _own_copy(module: torch.nn.Module, model: PreTrainedModel) -> bool:
    """Whether ``module`` is a submodel of ``model`` with its own config of ``model.config``'s class."""
    return (isinstance(module, PreTrainedModel) and module is not model and module.config is not model.config
            and type(module.config) is type(model.config))


def check_log_n_fields(fields: dict[str, Any]) -> None:
    """``ValueError`` naming a field of ``configure_log_n`` with a value it cannot take."""
    for field, least in (("base_length", 2), ("entropy_min_length", 1)):
        value = fields[field]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{field} must be a whole number of tokens >= {least}, got {value!r}.")
    for field, allowed in (("entropy_invariant_formula", FORMULAS),
                           ("entropy_invariant_scope", ENTROPY_INVARIANT_SCOPES)):
        if fields[field] is not None and fields[field] not in allowed:
            raise ValueError(f"{field} must be one of {allowed}, got {fields[field]!r}.")


def model_configs(model: PreTrainedModel) -> list[PreTrainedConfig]:
    """``model.config``, the configs nested in it, and every module's ``config`` attribute."""
    found: dict[int, PreTrainedConfig] = {}
    pending = [model.config, *(getattr(m, "config", None) for m in model.modules())]
    while pending:
        config = pending.pop()
        if isinstance(config, PreTrainedConfig) and id(config) not in found:
            found[id(config)] = config
            pending += [value for value in vars(config).values() if isinstance(value, PreTrainedConfig)]
    return list(found.values())


def register_stock_attention() -> None:
    """Register ``"entropy_invariant"`` (over SDPA) and ``"entropy_invariant_eager"`` (over eager attention,
    with the weights) with Transformers' attention and attention-mask interfaces."""
    AttentionInterface.register(ENTROPY_INVARIANT, entropy_invariant_attention_forward)
    AttentionMaskInterface.register(ENTROPY_INVARIANT, sdpa_mask)
    AttentionInterface.register(ENTROPY_INVARIANT_EAGER, entropy_invariant_eager_attention_forward)
    AttentionMaskInterface.register(ENTROPY_INVARIANT_EAGER, eager_mask)


__all__ = [
    "ENTROPY_INVARIANT",
    "ENTROPY_INVARIANT_EAGER",
    "configure_log_n",
    "dispatches_attention",
    "entropy_invariant_attention_forward",
    "entropy_invariant_eager_attention_forward",
    "register_stock_attention",
    "resolve_base_length",
    "stock_logit_factor",
]
