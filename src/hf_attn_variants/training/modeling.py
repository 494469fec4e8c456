"""Building tokenizers, configs and models for any family, shared by pretrain, finetune, demo and studies.

Everything is generic over ``hf_attn_variants.FAMILIES``: configs come from
``AutoConfig.for_model(model_type, **overrides)`` (so each family's own ``__post_init__`` validates the
values and names the bad field) and models from the Auto classes the package registers on import.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .. import FAMILIES
from .corpus import embedded_tokenizer

logger = logging.getLogger(__name__)

OBJECTIVES = ("mlm", "clm")
LM_AUTO_CLASSES = {"mlm": AutoModelForMaskedLM, "clm": AutoModelForCausalLM}


def check_model_type(model_type: str) -> None:
    """Raise ``ValueError`` unless ``model_type`` is one of this package's families."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type must be one of {tuple(FAMILIES)}, got {model_type!r}.")


def _parse_value(text: str) -> Any:
    """``"3"`` → 3, ``"0.1"`` → 0.1, ``"true"``/``"True"`` → True, ``"none"``/``"null"`` → None,
    ``'["a","b"]'`` or ``"[a, b]"`` → list, anything else → the string itself."""
    text = text.strip()
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_parse_value(item) for item in _split_top_level(inner)] if inner else []
    return text


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets or quotes."""
    parts, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [part for part in (p.strip() for p in parts) if part]


def parse_config_overrides(overrides: str | dict[str, Any] | None) -> dict[str, Any]:
    """Parse ``--config_overrides "k=v,k=v"`` (as run_mlm) into a dict with typed values.

    Values: ints, floats, ``true``/``false``, ``none``, JSON, or lists in brackets
    (``synthesizer_components=[random,vanilla]``). A dict is returned as a copy.
    """
    if overrides is None:
        return {}
    if isinstance(overrides, dict):
        return dict(overrides)
    result: dict[str, Any] = {}
    for item in _split_top_level(overrides):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"config_overrides must look like 'key=value,key=value', got the item {item!r}.")
        result[key.strip()] = _parse_value(value)
    return result


def _check_override_keys(config_class: type, overrides: dict[str, Any], model_type: str) -> None:
    allowed = {f.name for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else None
    if allowed is None:
        return
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(
            f"config_overrides: unknown field(s) {unknown} for model_type {model_type!r}; "
            f"allowed fields: {sorted(allowed - {'transformers_version', 'architectures', 'dtype'})}."
        )


def load_tokenizer(tokenizer_name: str | None = None) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(tokenizer_name)`` (a local folder), or the embedded tokenizer."""
    if tokenizer_name in (None, "", "embedded"):
        return embedded_tokenizer()
    try:
        return AutoTokenizer.from_pretrained(tokenizer_name)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"No tokenizer could be loaded from {tokenizer_name!r} (pass --tokenizer_name with a tokenizer folder, "
            f"or leave it out for the embedded one): {str(error).splitlines()[0] if str(error) else error!r}"
        ) from error


def build_config(
    model_type: str | None = None,
    *,
    config_name: str | None = None,
    model_name_or_path: str | None = None,
    config_overrides: str | dict[str, Any] | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    max_seq_length: int | None = None,
) -> PreTrainedConfig:
    """The config of a new or pretrained model of any family.

    From scratch (``model_type`` or ``config_name``): ``vocab_size``, ``pad/bos/eos_token_id`` come from the
    tokenizer unless overridden; ``max_position_embeddings`` is raised to ``max_seq_length`` when smaller,
    and a family's ``base_length`` (the training length m of the entropy-invariant factor log n / log m,
    DESIGN §2.1–2.2) is set to ``max_seq_length`` unless given. With ``model_name_or_path`` the pretrained
    config is kept; only the explicit overrides change it. Overrides are validated by the family config.
    """
    overrides = parse_config_overrides(config_overrides)
    source = config_name or model_name_or_path
    if source is None and model_type is None:
        raise ValueError(f"Pass model_type (one of {tuple(FAMILIES)}), config_name or model_name_or_path.")
    if source is not None:
        base = AutoConfig.from_pretrained(source)
        model_type = base.model_type
        values = {k: v for k, v in base.to_dict().items() if k not in ("model_type", "transformers_version")}
    else:
        check_model_type(model_type)
        values = {}
    config_class = FAMILIES[model_type][0] if source is None else type(base)
    _check_override_keys(config_class, overrides, model_type)
    from_scratch = model_name_or_path is None
    if from_scratch and tokenizer is not None:
        values.update(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id,
            eos_token_id=tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id,
        )
    values.update(overrides)
    defaults = config_class() if source is None else base
    if from_scratch and max_seq_length is not None:
        current = values.get("max_position_embeddings", defaults.max_position_embeddings)
        if "max_position_embeddings" not in overrides and current < max_seq_length:
            values["max_position_embeddings"] = max_seq_length
        if hasattr(defaults, "base_length") and "base_length" not in overrides:
            values["base_length"] = max_seq_length
    config = AutoConfig.for_model(model_type, **values) if source is None else config_class.from_dict(values)
    if tokenizer is not None and len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}; "
            "pass a matching --tokenizer_name or override vocab_size."
        )
    return config


def build_lm_model(
    config: PreTrainedConfig, objective: str, model_name_or_path: str | None = None
) -> PreTrainedModel:
    """``AutoModelForMaskedLM`` (``objective="mlm"``) or ``AutoModelForCausalLM`` (``"clm"``), new or pretrained."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}.")
    auto_class = LM_AUTO_CLASSES[objective]
    if model_name_or_path:
        return auto_class.from_pretrained(model_name_or_path, config=config)
    return auto_class.from_config(config)


def has_target_only_mlm_head(model: torch.nn.Module) -> bool:
    """Whether ``model`` is one of this package's ``*ForMaskedLM`` (base ``model.model`` → ``model.lm_head``)."""
    from ..modeling_common import MaskedLMHeadMixin

    return isinstance(model, MaskedLMHeadMixin)


def masked_lm_target_logits(model: torch.nn.Module, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """MLM logits at the ``targets`` positions only, ``(num_targets, vocab)``.

    For this package's MLM heads logits = lm_head(h) position-wise, so the head (hidden × vocab per token, the
    bulk of a small model's compute) is applied to the ~15% target rows instead of every position; the loss
    and its gradients are the same as from the full logits. Other models: the full forward, then selected.
    """
    if has_target_only_mlm_head(model):
        hidden = model.model(input_ids=input_ids).last_hidden_state
        return model.lm_head(hidden[targets])
    return model(input_ids=input_ids).logits[targets]


class TargetOnlyMLMLoss(torch.nn.Module):
    """Training wrapper of an MLM: ``forward(input_ids, labels)`` → ``MaskedLMOutput(loss=CE over labels != -100)``
    computed with ``masked_lm_target_logits`` (2–3× faster for the demo-size models than the full head).

    The wrapped model is ``self.model`` (so checkpoints hold ``model.*`` keys); ``_no_split_modules`` is
    forwarded for FSDP's wrap policy.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self._no_split_modules = getattr(model, "_no_split_modules", None)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
        from transformers.modeling_outputs import MaskedLMOutput

        targets = labels != -100
        logits = masked_lm_target_logits(self.model, input_ids, targets)
        return MaskedLMOutput(loss=torch.nn.functional.cross_entropy(logits.float(), labels[targets]))


def family_of(config: PreTrainedConfig) -> str:
    """The config's ``model_type``, checked to be one of this package's families."""
    check_model_type(config.model_type)
    return config.model_type


__all__ = [
    "LM_AUTO_CLASSES",
    "OBJECTIVES",
    "TargetOnlyMLMLoss",
    "build_config",
    "build_lm_model",
    "check_model_type",
    "family_of",
    "has_target_only_mlm_head",
    "load_tokenizer",
    "masked_lm_target_logits",
    "parse_config_overrides",
]
