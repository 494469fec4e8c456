"""Configuration fields shared by the three families, with validation that names the bad field.

Field names follow BERT/Llama. Every family config subclasses ``AttnVariantConfig``; the
two multi-head families (entropy-invariant, Synthesizer) subclass ``MultiHeadAttnVariantConfig``,
which adds heads, the feed-forward width and the per-layer pruned heads.

Model code: imports only torch, transformers and the standard library (see ``hf_attn_variants.models.standalone``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .compat import MIN_TRANSFORMERS_VERSION
from .layers import NORM_TYPES, kept_heads, normalize_pruned_heads

POSITION_EMBEDDING_TYPES = ("rope", "absolute", "none")
HUB_ARGUMENTS = ("repo_id", "commit_message", "commit_description", "private", "token", "create_pr", "revision")
"""Keyword arguments of ``save_pretrained(..., push_to_hub=True)`` that belong to the upload."""
NORM_POSITIONS = ("pre", "post")


def check_choice(field: str, value: Any, allowed: Sequence[Any]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{field} must be one of {tuple(allowed)}, got {value!r}.")


def check_int(field: str, value: Any, minimum: int | None = None, allow_none: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is an int (not bool), ``ValueError`` if below ``minimum``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an int, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value}.")


def check_float(field: str, value: Any, low: float, high: float | None = None, allow_none: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a real number, ``ValueError`` outside [low, high]."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{field} must be a number, got {value!r} ({type(value).__name__}).")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{field} must be in {bound}, got {value}.")


def check_bool(field: str, value: Any) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise TypeError(f"{field} must be a bool, got {value!r} ({type(value).__name__}).")


def renamed_field(kwargs: dict[str, Any], old: str, new: str, value: Any, default: Any) -> Any:
    """``value`` of field ``new``, or the value a config saved before the rename stored under ``old``.

    Pops ``old`` from ``kwargs``; ``default`` when neither is given; ``ValueError`` when both are.
    """
    legacy = kwargs.pop(old, None)
    if legacy is not None and value is not None:
        raise ValueError(f"{old} is the former name of {new}; pass {new} only.")
    if legacy is not None:
        return legacy
    return default if value is None else value


def config_equal(config: PreTrainedConfig, other: Any) -> bool:
    """Two configs are equal when every attribute is (what ``PreTrainedConfig.__eq__`` means)."""
    return isinstance(other, PreTrainedConfig) and config.__dict__ == other.__dict__


class StandaloneCodeMixin:
    """``save_pretrained`` that writes standalone remote code (config and model classes share it).

    Transformers copies a class's module and every sibling module it imports; the package then replaces
    them by one self-contained ``configuration_<family>.py`` (and ``modeling_<family>.py``) through
    ``standalone_code_writer``, which ``import hf_attn_variants`` sets (``hf_attn_variants.models.standalone``).
    In exported code it stays ``None``: those files are already standalone and are copied as they are.
    """

    standalone_code_writer = None

    @classmethod
    def code_class(cls) -> type:
        """The class whose module holds this object's code: ``cls`` itself, or for a subclass made at run time
        (FSDP2's ``fully_shard`` turns a model's class into one defined in torch) its first base from this
        package."""
        package = StandaloneCodeMixin.__module__.rpartition(".")[0]
        return next(base for base in cls.__mro__ if base.__module__.rpartition(".")[0] == package)

    def save_pretrained(self, save_directory: Any, *args: Any, push_to_hub: bool = False, **kwargs: Any) -> Any:
        writer = type(self).standalone_code_writer
        if writer is None or self._auto_class is None:
            return super().save_pretrained(save_directory, *args, push_to_hub=push_to_hub, **kwargs)
        hub = {name: kwargs.pop(name) for name in HUB_ARGUMENTS if name in kwargs}
        run_time_class = type(self) is not self.code_class()
        if run_time_class:  # Transformers would copy torch's module as the code; the writer alone writes ours
            type(self)._auto_class = None
        try:
            result = super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            if run_time_class:
                del type(self)._auto_class
        writer(save_directory, self)
        if push_to_hub:  # upload only after the code was rewritten
            self.push_to_hub(hub.pop("repo_id", os.path.basename(os.path.normpath(save_directory))), **hub)
        return result


class AttnVariantConfig(StandaloneCodeMixin, PreTrainedConfig):
    r"""Fields common to the ``gau``, ``synthesizer`` and ``entropy_invariant`` families.

    Written with an explicit ``__init__`` (not as dataclass fields) because Transformers 5.0–5.4 configs are
    plain classes: this is the form every 5.x release accepts, so exported model code runs on all of them.

    Args:
        vocab_size: vocabulary size of ``embed_tokens`` and ``lm_head``.
        hidden_size: model width d.
        num_hidden_layers: number of layers.
        hidden_act: activation of the feed-forward / gating units (a key of ``transformers.activations.ACT2FN``).
        max_position_embeddings: longest sequence for learned absolute positions (and the Synthesizer's l).
        hidden_dropout_prob: dropout on embeddings and residual branches.
        attention_probs_dropout_prob: dropout on attention probabilities.
        initializer_range: std of the normal initialisation of weight matrices.
        layer_norm_eps: ε of the norms.
        norm_type: ``"layernorm"``, ``"rmsnorm"`` or ``"scalenorm"``.
        norm_position: ``"pre"`` (norm inside the residual branch, final norm at the end) or ``"post"``
            (norm after each residual sum, as BERT and GAU-α).
        norm_elementwise_affine: whether the norms have a learned gain (and bias for LayerNorm).
        position_embedding_type: ``"rope"`` (default), ``"absolute"`` (learned) or ``"none"``.
        rope_theta: RoPE base.
        use_bias: biases in the projections.
        classifier_dropout: dropout of classification heads (``None`` = ``hidden_dropout_prob``).
        is_decoder: causal attention in the base model (``*ForCausalLM`` sets it).
        use_cache: return a ``Cache`` from causal forward passes.
        pad_token_id, bos_token_id, eos_token_id: special token ids.
        tie_word_embeddings: tie ``lm_head`` to ``embed_tokens``.

    ``min_transformers_version`` (read-only, written to ``config.json``) is the oldest Transformers release
    the model code supports.
    """

    # Pipeline parallelism (Transformers' DistributedConfig(pp_size=…)): stages split ``layers``; the first embeds,
    # the last applies the final norm (and the head's ``_pp_plan``). Tensor-parallel plans are per family.
    base_model_pp_plan: ClassVar[dict[str, tuple[list[str], list[str]]]] = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }
    # FSDP2: each layer its own group; the embeddings and the LM head stay in the root group together, so a tied
    # pair is one parameter of one group (see ``_HeadMixin._tie_before_fsdp``).
    base_model_fsdp_plan: ClassVar[dict[str, str]] = {"layers.*": "free_full_weight", "norm": "keep_full_weight"}

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        hidden_act: str = "gelu",
        max_position_embeddings: int = 512,
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-6,
        norm_type: str = "layernorm",
        norm_position: str = "pre",
        norm_elementwise_affine: bool = True,
        position_embedding_type: str = "rope",
        rope_theta: float = 10000.0,
        use_bias: bool = True,
        classifier_dropout: float | None = None,
        is_decoder: bool = False,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.norm_type = norm_type
        self.norm_position = norm_position
        self.norm_elementwise_affine = norm_elementwise_affine
        self.position_embedding_type = position_embedding_type
        self.rope_theta = rope_theta
        self.use_bias = use_bias
        self.classifier_dropout = classifier_dropout
        self.is_decoder = is_decoder
        self.use_cache = use_cache
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.tie_word_embeddings = tie_word_embeddings
        kwargs.pop("min_transformers_version", None)
        self.min_transformers_version = MIN_TRANSFORMERS_VERSION
        # Every subclass sets its fields before calling up to here, so all of them are checked before
        # PreTrainedConfig's own validators (which read e.g. the head size) run.
        self.check_fields()
        super().__init__(**kwargs)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Transformers >= 5.5 turns every config subclass into a dataclass, whose generated __eq__ would compare
        # only the base class's dataclass fields (so configs of different sizes would be "equal").
        cls.__eq__ = config_equal  # type: ignore[method-assign]

    __eq__ = config_equal

    def check_fields(self) -> None:
        """Check every field; raises ``ValueError``/``TypeError`` naming the field. Families extend it."""
        check_int("vocab_size", self.vocab_size, 1)
        check_int("hidden_size", self.hidden_size, 1)
        check_int("num_hidden_layers", self.num_hidden_layers, 0)
        check_int("max_position_embeddings", self.max_position_embeddings, 1)
        check_choice("hidden_act", self.hidden_act, sorted(ACT2FN.keys()))
        check_float("hidden_dropout_prob", self.hidden_dropout_prob, 0.0, 1.0)
        check_float("attention_probs_dropout_prob", self.attention_probs_dropout_prob, 0.0, 1.0)
        check_float("classifier_dropout", self.classifier_dropout, 0.0, 1.0, allow_none=True)
        check_float("initializer_range", self.initializer_range, 0.0)
        check_float("layer_norm_eps", self.layer_norm_eps, 0.0)
        check_float("rope_theta", self.rope_theta, 1.0)
        check_choice("norm_type", self.norm_type, NORM_TYPES)
        check_choice("norm_position", self.norm_position, NORM_POSITIONS)
        check_choice("position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES)
        for field in ("norm_elementwise_affine", "use_bias", "is_decoder", "use_cache", "tie_word_embeddings"):
            check_bool(field, getattr(self, field))
        for field in ("pad_token_id", "bos_token_id"):
            check_int(field, getattr(self, field), 0, allow_none=True)


class MultiHeadAttnVariantConfig(AttnVariantConfig):
    r"""Adds multi-head attention and a feed-forward block to ``AttnVariantConfig``.

    Args:
        num_attention_heads: heads per layer before pruning; head size = ``head_dim``.
        intermediate_size: width of the feed-forward block.
        pruned_heads: ``{layer: [original head indices removed]}``, written by
            ``hf_attn_variants.pruning.prune_heads`` so that ``from_pretrained`` rebuilds the pruned shapes.
        head_dim: size of one head, as Llama's field; ``None`` (the default) = hidden_size /
            num_attention_heads, which must then divide evenly. Set explicitly by
            ``hf_attn_variants.pruning.restate_uniform_heads``: a model pruned to the same k heads in every
            layer is restated as ``num_attention_heads=k`` with the original ``head_dim`` (what vLLM reads).
            Written to ``config.json`` only when set.
    """

    # Tensor parallelism (Megatron-LM's split): each rank owns whole heads — their q/k/v rows, o columns and every
    # per-head tensor (SSMax's scale; the Synthesizer's dense W₁/W₂, R, R₁/R₂) through "local_shard"
    # (hf_attn_variants.models.tensor_parallel) — and a slice of the feed-forward.
    base_model_tp_plan: ClassVar[dict[str, str]] = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.self_attn": "local_shard",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        pruned_heads: dict | None = None,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.pruned_heads = pruned_heads
        self.head_dim = head_dim
        super().__init__(**kwargs)

    def check_fields(self) -> None:
        super().check_fields()
        check_int("num_attention_heads", self.num_attention_heads, 1)
        check_int("intermediate_size", self.intermediate_size, 1)
        check_int("head_dim", self.explicit_head_dim, 1, allow_none=True)
        if self.explicit_head_dim is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}), or head_dim must be given."
            )
        self.pruned_heads = normalize_pruned_heads(
            self.pruned_heads, num_layers=self.num_hidden_layers, num_heads=self.num_attention_heads
        )

    @property
    def explicit_head_dim(self) -> int | None:
        """The ``head_dim`` field as given (``None`` = derived from hidden_size / num_attention_heads)."""
        return self.__dict__.get("head_dim")

    @property
    def head_dim(self) -> int:
        """Size of one head: the ``head_dim`` field, else hidden_size / num_attention_heads (unchanged by pruning)."""
        explicit = self.explicit_head_dim
        return self.hidden_size // self.num_attention_heads if explicit is None else explicit

    @head_dim.setter
    def head_dim(self, value: int | None) -> None:
        self.__dict__["head_dim"] = value

    def to_dict(self) -> dict[str, Any]:
        """As ``PreTrainedConfig.to_dict``, without ``head_dim`` when it is derived (not set explicitly)."""
        output = super().to_dict()
        if output.get("head_dim", 0) is None:
            del output["head_dim"]
        return output

    def layer_heads(self, layer_idx: int) -> list[int]:
        """Original indices of the heads layer ``layer_idx`` keeps after pruning."""
        return kept_heads(self.pruned_heads or {}, layer_idx, self.num_attention_heads)


__all__ = [
    "AttnVariantConfig",
    "MultiHeadAttnVariantConfig",
    "StandaloneCodeMixin",
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "config_equal",
    "renamed_field",
]
