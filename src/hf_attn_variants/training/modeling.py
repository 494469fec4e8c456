"""Building tokenizers, configs and models for any family, shared by pretrain, finetune, demo and studies.

Everything is generic over ``hf_attn_variants.FAMILIES``: configs come from
``AutoConfig.for_model(model_type, **overrides)`` (so each family's own ``__post_init__`` validates the
values and names the bad field) and models from the Auto classes the package registers on import.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..cli_utils import (
    FlagError,
    error_reason,
    check_config_source,
    check_folder,
    check_int,
    check_model_source,
    hub_unreachable,
    is_hub_id,
    names_in_message,
    offline_hub_message,
)
from ..models import FAMILIES
from .corpus import embedded_tokenizer

logger = logging.getLogger(__name__)

OBJECTIVES = ("mlm", "clm")
LM_AUTO_CLASSES = {"mlm": AutoModelForMaskedLM, "clm": AutoModelForCausalLM}


def check_model_type(model_type: str) -> None:
    """Raise ``FlagError`` (a ``ValueError``) unless ``model_type`` is one of this package's families."""
    if model_type not in FAMILIES:
        raise FlagError("model_type", f"model_type must be one of {tuple(FAMILIES)}, got {model_type!r}.")


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
    if not isinstance(overrides, str):
        raise FlagError("config_overrides", "config_overrides must be a string \"k=v,k=v\" or a dict, got "
                                            f"{type(overrides).__name__}.")
    result: dict[str, Any] = {}
    for item in _split_top_level(overrides):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise FlagError("config_overrides",
                            f"config_overrides must look like 'key=value,key=value', got the item {item!r}.")
        result[key.strip()] = _parse_value(value)
    return result


def config_field_names(config_class: type) -> set[str]:
    """The fields a config of ``config_class`` has: its dataclass fields (configs declared as dataclass
    fields) and the keys of a default instance's ``to_dict`` (configs that set them in ``__init__``)."""
    names = ({f.name for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class)
             else set())
    return names | set(config_class().to_dict())


def _check_override_keys(config_class: type, overrides: dict[str, Any], model_type: str) -> None:
    allowed = config_field_names(config_class)
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise FlagError(
            "config_overrides",
            f"config_overrides: unknown field(s) {unknown} for model_type {model_type!r}; "
            f"allowed fields: {sorted(allowed - {'transformers_version', 'architectures', 'dtype'})}."
        )


def _value_kind(value: Any) -> str:
    """How a config override's type is named in an error: ``"an int"``, ``"a number"``, ``"a bool"`` …"""
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an int"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a dict" if isinstance(value, dict) else "other"


NUMBER_KINDS = ("an int", "a number")


def _check_override_types(defaults: PreTrainedConfig, overrides: dict[str, Any]) -> None:
    """``FlagError`` for an override whose kind cannot be its field's: a number for a numeric field (the
    config class tells ints from floats itself), a bool for a boolean one, text for a text one, a list for a
    list one. Fields that default to ``None`` take anything; the config class checks the value."""
    for key, value in overrides.items():
        default = getattr(defaults, key, None)
        expected, got = _value_kind(default), _value_kind(value)
        if default is None or value is None or expected == "other" or got == expected:
            continue
        if expected in NUMBER_KINDS and got in NUMBER_KINDS:
            continue
        raise FlagError("config_overrides", f"config_overrides: {key} must be {expected}, got {value!r}.")


def load_tokenizer(tokenizer_name: str | None = None,
                   flag: str = "tokenizer_name") -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(tokenizer_name)`` (a local folder or a Hub id), or the embedded
    tokenizer.

    A folder that does not exist or holds no tokenizer raises ``FlagError`` naming ``flag`` (the flag the
    folder came from: ``tokenizer_name``, or ``model_name_or_path`` when the model's tokenizer is used).
    """
    if tokenizer_name in (None, "", "embedded"):
        return embedded_tokenizer()
    hub = is_hub_id(str(tokenizer_name))
    if hub:
        check_model_source(flag, tokenizer_name)
    else:
        check_folder(flag, tokenizer_name, what="tokenizer folder")
    try:
        return AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=False)
    except (OSError, ValueError) as error:
        if hub and hub_unreachable(error):
            raise FlagError(flag, offline_hub_message(flag, str(tokenizer_name))) from error
        hint = "pass --tokenizer_name with a tokenizer folder" if flag != "tokenizer_name" else (
            "pass a tokenizer folder, or leave --tokenizer_name out for the embedded one")
        reason = error_reason(error)
        raise FlagError(flag,
                        f"no tokenizer could be loaded from {tokenizer_name!r} ({hint}): {reason}") from error


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
    tokenizer unless overridden; an overridden ``hidden_size`` scales the widths that follow from it unless
    they are overridden too (``follow_hidden_size``); ``max_position_embeddings`` is raised to
    ``max_seq_length`` when smaller, and a family's ``base_length`` (the training length m of the
    entropy-invariant factor log n / log m, DESIGN §2.1–2.2) is set to ``max_seq_length`` unless given. With
    ``model_name_or_path`` the pretrained config is kept; only the explicit overrides change it. Overrides are
    validated by the family config.

    Every bad input raises ``FlagError`` naming its argument: a malformed or unknown override, a value the
    config class rejects, a config source that is not a local config, a ``model_type`` that differs from
    the pretrained config's, a tokenizer larger than the vocabulary.
    """
    overrides = parse_config_overrides(config_overrides)
    if max_seq_length is not None:
        check_int("max_seq_length", max_seq_length, 1)
    source = config_name or model_name_or_path
    source_flag = "config_name" if config_name else "model_name_or_path"
    if source is None and model_type is None:
        raise FlagError("model_type",
                        f"Pass model_type (one of {tuple(FAMILIES)}), config_name or model_name_or_path.")
    if source is not None:
        base = _load_config(source_flag, source)
        if model_type is not None and model_type != base.model_type:
            raise FlagError("model_type", f"model_type {model_type!r} differs from the model_type "
                                          f"{base.model_type!r} of {source_flag} {source!r}; leave "
                                          "--model_type out.")
        model_type = base.model_type
        values = {k: v for k, v in base.to_dict().items() if k not in ("model_type", "transformers_version")}
    else:
        check_model_type(model_type)
        values = {}
    config_class = FAMILIES[model_type][0] if source is None else type(base)
    _check_override_keys(config_class, overrides, model_type)
    from_scratch = model_name_or_path is None
    if from_scratch and tokenizer is not None:
        values.update(tokenizer_values(tokenizer))
    if "model_type" in overrides:
        raise FlagError("config_overrides", "config_overrides: model_type is not a field to override; pass "
                                            "--model_type instead.")
    values.update(overrides)
    defaults = config_class() if source is None else base
    _check_override_types(defaults, overrides)
    if from_scratch:
        values.update(follow_hidden_size(defaults, overrides))
    from_length = length_fields(defaults, values, overrides, max_seq_length) if from_scratch else []
    values.update(dict.fromkeys(from_length, max_seq_length))
    try:
        config = (AutoConfig.for_model(model_type, **values) if source is None
                  else config_class.from_dict(values))
    except CONFIG_ERRORS as error:  # the family config's validation (or PreTrainedConfig's), naming the field
        if isinstance(error, FlagError):
            raise
        if names_in_message(str(error), from_length) and not names_in_message(str(error), list(overrides)):
            raise FlagError("max_seq_length", f"max_seq_length={max_seq_length} (which sets "
                                              f"{' and '.join(from_length)}): {error}") from error
        flag = _config_error_flag(str(error), overrides, source_flag if source is not None else None)
        raise FlagError(flag, f"{flag}: {error}") from error
    _check_token_ids(config, TOKEN_ID_FIELDS if source is None or "vocab_size" in overrides
                     else [name for name in TOKEN_ID_FIELDS if name in overrides])
    if tokenizer is not None and len(tokenizer) > config.vocab_size:
        raise FlagError(
            "config_overrides" if "vocab_size" in overrides else "tokenizer_name",
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}; "
            "pass a matching --tokenizer_name or override vocab_size.",
        )
    return config


WIDTHS_OF_HIDDEN_SIZE = ("intermediate_size", "attention_key_size")
"""Config fields whose default is a width in proportion to ``hidden_size`` (the feed-forward width, GAU's key
size s): an override of ``hidden_size`` alone scales them by the same ratio (``follow_hidden_size``)."""


def follow_hidden_size(defaults: PreTrainedConfig, overrides: dict[str, Any]) -> dict[str, int]:
    """The sizes that follow from an overridden ``hidden_size``, unless overridden too: the widths of
    ``WIDTHS_OF_HIDDEN_SIZE`` keep their ratio to it, rounded to an even number (BERT-base's 3072 / 768 = 4:
    ``hidden_size=32`` gives ``intermediate_size=128``, not 3072), and ``num_attention_heads`` becomes the
    largest divisor of the new width at most its old count scaled by the ratio (head width kept: 12 heads of
    64 → ``hidden_size=256``: 4) when the old count does not divide it. One log line names what changed."""
    new = overrides.get("hidden_size")
    old = getattr(defaults, "hidden_size", None)
    if not isinstance(new, int) or isinstance(new, bool) or new < 1 or not old or new == old:
        return {}
    ratio = new / old
    scaled: dict[str, int] = {}
    for name in WIDTHS_OF_HIDDEN_SIZE:
        value = getattr(defaults, name, None)
        if name not in overrides and isinstance(value, int) and not isinstance(value, bool):
            scaled[name] = max(2, 2 * round(value * ratio / 2))  # even: RoPE rotates pairs of GAU's s
    heads = getattr(defaults, "num_attention_heads", None)
    if "num_attention_heads" not in overrides and isinstance(heads, int) and heads > 0 and new % heads:
        target = max(1, round(heads * ratio))
        scaled["num_attention_heads"] = max(d for d in range(1, target + 1) if new % d == 0)
    changed = {name: value for name, value in scaled.items() if value != getattr(defaults, name)}
    if changed:
        logger.info("config_overrides: hidden_size=%d (default %d) also sets %s; override them to choose",
                    new, old, ", ".join(f"{name}={value} (default {getattr(defaults, name)})"
                                        for name, value in changed.items()))
    return changed


CONFIG_ERRORS = (ValueError, TypeError, StrictDataclassFieldValidationError,
                 StrictDataclassClassValidationError)
"""What constructing a config raises for a bad value: the families' checks (``ValueError``/``TypeError``
naming the field) and ``PreTrainedConfig``'s strict-dataclass validators."""


def tokenizer_values(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The config fields a new model takes from its tokenizer: ``vocab_size`` and the pad, BOS (else CLS) and
    EOS (else SEP) ids."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": bos if bos is not None else tokenizer.cls_token_id,
            "eos_token_id": eos if eos is not None else tokenizer.sep_token_id}


def length_fields(defaults: PreTrainedConfig, values: dict[str, Any], overrides: dict[str, Any],
                  max_seq_length: int | None) -> list[str]:
    """The fields a new model sets to ``max_seq_length``: ``max_position_embeddings`` when smaller, and a
    family's ``base_length``, each unless overridden."""
    if max_seq_length is None:
        return []
    fields = []
    current = values.get("max_position_embeddings", defaults.max_position_embeddings)
    if "max_position_embeddings" not in overrides and current < max_seq_length:
        fields.append("max_position_embeddings")
    if hasattr(defaults, "base_length") and "base_length" not in overrides:
        fields.append("base_length")
    return fields


TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def _check_token_ids(config: PreTrainedConfig, names: Sequence[str]) -> None:
    """``FlagError`` naming ``config_overrides`` when one of the ids ``names`` (of a new config, or
    overridden) is outside the vocabulary: Transformers only warns, and the embedding then fails on its
    padding index. A pretrained config's own ids are left as they are (some hold a sentinel such as -1)."""
    for name in names:
        value = getattr(config, name, None)
        ids = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(i, int) and not 0 <= i < config.vocab_size for i in ids):
            raise FlagError("config_overrides", f"config_overrides: {name}={value} is not a token id of the "
                                                f"vocabulary of {config.vocab_size} (0 to "
                                                f"{config.vocab_size - 1}).")


def _config_error_flag(message: str, overrides: dict[str, Any], source_flag: str | None) -> str:
    """The flag a config error is about: ``config_overrides`` when an override is named (or the config is
    built from scratch with overrides), else the flag of the config's source, else ``model_type``."""
    if overrides and (names_in_message(message, list(overrides)) or source_flag is None):
        return "config_overrides"
    return source_flag or "model_type"


def _load_config(flag: str, source: str) -> PreTrainedConfig:
    """``AutoConfig.from_pretrained(source)`` of a local config file or folder, or of a Hub repository id;
    ``FlagError`` naming ``flag`` (offline, for a Hub id: one sentence saying so)."""
    if is_hub_id(str(source)):
        check_model_source(flag, source)
    else:
        check_config_source(flag, source)
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as error:  # bad JSON, unknown model_type
        if is_hub_id(str(source)) and hub_unreachable(error):
            raise FlagError(flag, offline_hub_message(flag, str(source))) from error
        reason = error_reason(error)
        raise FlagError(flag, f"{flag}: {source!r} holds no usable config: {reason}") from error


def build_lm_model(
    config: PreTrainedConfig, objective: str, model_name_or_path: str | None = None
) -> PreTrainedModel:
    """``AutoModelForMaskedLM`` (``objective="mlm"``) or ``AutoModelForCausalLM`` (``"clm"``), new or
    pretrained."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}.")
    auto_class = LM_AUTO_CLASSES[objective]
    if model_name_or_path:
        return load_pretrained(auto_class, model_name_or_path, config=config)
    return auto_class.from_config(config)


def load_pretrained(auto_class: Any, model_name_or_path: str, flag: str = "model_name_or_path",
                    **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(model_name_or_path, **kwargs)`` of a local model folder or a Hub
    repository id; a folder that is not a model (no config, no weights), or a Hub id that cannot be fetched
    (offline: one sentence saying so), raises ``FlagError`` naming ``flag``."""
    check_model_source(flag, model_name_or_path, weights=True)
    try:
        return auto_class.from_pretrained(model_name_or_path, **{"trust_remote_code": False, **kwargs})
    except (OSError, ValueError, KeyError) as error:
        if is_hub_id(str(model_name_or_path)) and hub_unreachable(error):
            raise FlagError(flag, offline_hub_message(flag, str(model_name_or_path))) from error
        reason = error_reason(error)
        raise FlagError(flag,
                        f"{flag}: {model_name_or_path!r} could not be loaded as a model: {reason}") from error
    except RuntimeError as error:  # Transformers' refusal of weights whose shapes differ from the config's
        if "mismatched" not in str(error):
            raise
        raise FlagError(flag, f"{flag}: the weights of {model_name_or_path!r} do not have the config's "
                              "shapes (Transformers' load report lists them): a --config_overrides of a "
                              "width or a count, or a classification head for another number of labels "
                              "(start from a model without that head, such as a pretrain output).") from error


def has_target_only_mlm_head(model: torch.nn.Module) -> bool:
    """Whether ``model`` is one of this package's ``*ForMaskedLM`` (base ``model.model`` →
    ``model.lm_head``)."""
    from ..models.modeling_common import MaskedLMHeadMixin

    return isinstance(model, MaskedLMHeadMixin)


def target_rows(values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The rows of ``values`` ``(batch, seq, …)`` at ``targets``: a boolean mask ``(batch, seq)``, or the flat
    positions of its true entries (``(num_targets,)`` integers, e.g. found on the host: then the number of
    rows is known without reading the device, and nothing waits for it)."""
    if targets.dtype == torch.bool:
        return values[targets]
    return values.flatten(0, 1).index_select(0, targets)


def masked_lm_target_logits(model: torch.nn.Module, input_ids: torch.Tensor, targets: torch.Tensor,
                            position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """MLM logits at the ``targets`` positions only, ``(num_targets, vocab)`` (``targets``: a boolean mask or
    flat positions, as ``target_rows`` takes them; ``position_ids``: packed documents').

    For this package's MLM heads logits = lm_head(h) position-wise, so the head (hidden × vocab per token, the
    bulk of a small model's compute) is applied to the ~15% target rows instead of every position; the loss
    and its gradients are the same as from the full logits. Other models, and models sharded at load time
    (``DistributedConfig``: FSDP2 gathers parameters in the root module's forward, which calling
    ``model.lm_head`` alone would skip): the full forward, then selected.
    """
    if has_target_only_mlm_head(model) and not getattr(model, "is_distributed_loading_by_transformers",
                                                       False):
        hidden = model.model(input_ids=input_ids, position_ids=position_ids).last_hidden_state
        return model.lm_head(target_rows(hidden, targets))
    return target_rows(model(input_ids=input_ids, position_ids=position_ids).logits, targets)


class TargetOnlyMLMLoss(torch.nn.Module):
    """Training wrapper of an MLM: ``forward(input_ids, labels)`` →
    ``MaskedLMOutput(loss=CE over labels != -100)`` computed with ``masked_lm_target_logits`` (2–3× faster for
    the demo-size models than the full head). ``target_index``, the flat positions of the targets
    (``pretrain`` finds them on the host), selects the same rows without a boolean mask, whose count the host
    would have to wait for.

    The wrapped model is ``self.model`` (so checkpoints hold ``model.*`` keys); ``_no_split_modules`` is
    forwarded for FSDP's wrap policy.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self._no_split_modules = getattr(model, "_no_split_modules", None)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None = None,
                target_index: torch.Tensor | None = None) -> Any:
        from transformers.modeling_outputs import MaskedLMOutput

        targets = labels != -100 if target_index is None else target_index
        logits = masked_lm_target_logits(self.model, input_ids, targets, position_ids)
        return MaskedLMOutput(loss=torch.nn.functional.cross_entropy(logits.float(),
                                                                     target_rows(labels, targets)))


__all__ = [
    "LM_AUTO_CLASSES",
    "OBJECTIVES",
    "TargetOnlyMLMLoss",
    "build_config",
    "build_lm_model",
    "check_model_type",
    "config_field_names",
    "follow_hidden_size",
    "has_target_only_mlm_head",
    "load_pretrained",
    "load_tokenizer",
    "masked_lm_target_logits",
    "parse_config_overrides",
    "target_rows",
]
