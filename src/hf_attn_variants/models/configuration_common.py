"""Configuration fields shared by the three families, with validation that names the bad field.

Field names follow BERT/Llama. Every family config subclasses ``AttnVariantConfig``; the two multi-head
families (entropy-invariant, Synthesizer) subclass ``MultiHeadAttnVariantConfig``, which adds heads, the
feed-forward width and the per-layer pruned heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .compat import MIN_TRANSFORMERS_VERSION
from .layers import NORM_TYPES, kept_heads, normalize_pruned_heads
from .standalone import RemoteCodeSavingMixin

POSITION_EMBEDDING_TYPES = ("rope", "absolute", "none")
NORM_POSITIONS = ("pre", "post")


def check_choice(field: str, value: Any, allowed: Sequence[Any]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``.

    Args:
        field (str): the field's name, for the message.
        value (Any): its value.
        allowed (Sequence): the values it may take.
    """
    if value not in allowed:
        raise ValueError(f"{field} must be one of {tuple(allowed)}, got {value!r}.")


def check_int(field: str, value: Any, minimum: int | None = None, allow_none: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is an int (not bool), ``ValueError`` if below ``minimum``.

    Args:
        field (str): the field's name, for the message.
        value (Any): its value.
        minimum (int | None): the smallest value allowed; ``None`` = no bound.
        allow_none (bool): whether ``None`` passes.
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an int, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value}.")


def check_float(field: str, value: Any, low: float, high: float | None = None,
                allow_none: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a real number, ``ValueError`` unless finite in [low, high].

    Args:
        field (str): the field's name, for the message.
        value (Any): its value.
        low (float): the smallest value allowed.
        high (float | None): the largest value allowed; ``None`` = no bound.
        allow_none (bool): whether ``None`` passes.
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{field} must be a number, got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{field} must be a finite number {bound}, got {value}.")


def check_bool(field: str, value: Any) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool.

    Args:
        field (str): the field's name, for the message.
        value (Any): its value.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{field} must be a bool, got {value!r} ({type(value).__name__}).")


def renamed_field(kwargs: dict[str, Any], old: str, new: str, value: Any, default: Any) -> Any:
    """``value`` of field ``new``, or the value a config saved before the rename stored under ``old``.

    Pops ``old`` from ``kwargs``; ``default`` when neither is given; ``ValueError`` when both are.

    Args:
        kwargs (dict[str, Any]): the config's remaining keyword arguments (``old`` is popped from them).
        old (str): the field's former name.
        new (str): its current name, for the message.
        value (Any): the value passed as ``new`` (``None`` = not given).
        default (Any): the value when neither name is given.

    Returns:
        Any: the field's value.
    """
    legacy = kwargs.pop(old, None)
    if legacy is not None and value is not None:
        raise ValueError(f"{old} is the former name of {new}; pass {new} only.")
    if legacy is not None:
        return legacy
    return default if value is None else value


def config_equal(config: PreTrainedConfig, other: Any) -> bool:
    """Two configs are equal when every attribute is (what ``PreTrainedConfig.__eq__`` means).

    Args:
        config (PreTrainedConfig): one config.
        other (Any): the object compared with it.

    Returns:
        bool: whether ``other`` is a config with the same attributes.
    """
    return isinstance(other, PreTrainedConfig) and config.__dict__ == other.__dict__


class AttnVariantConfig(RemoteCodeSavingMixin, PreTrainedConfig):
    """Fields common to the ``gau``, ``synthesizer`` and ``entropy_invariant`` families.

    The config has an explicit ``__init__``: the form every 5.x release accepts.
    ``min_transformers_version`` (read-only, in ``config.json``) is the oldest Transformers the code supports.

    Args:
        vocab_size (int): vocabulary size.
        hidden_size (int): model width d.
        num_hidden_layers (int): depth.
        hidden_act (str): activation of the feed-forward / gating units (a key of ``ACT2FN``).
        max_position_embeddings (int): longest sequence for learned absolute positions (and the
            Synthesizer's l).
        hidden_dropout_prob (float): dropout on residual branches.
        attention_probs_dropout_prob (float): dropout on attention weights.
        initializer_range (float): std of the normal initialisation of weight matrices.
        layer_norm_eps (float): epsilon of the norms.
        norm_type (str): ``"layernorm"``, ``"rmsnorm"`` or ``"scalenorm"``.
        norm_position (str): ``"pre"``, or ``"post"`` as BERT and GAU-α.
        norm_elementwise_affine (bool): learned scale (and shift) in the norms.
        position_embedding_type (str): ``"rope"`` (default), ``"absolute"`` (learned) or ``"none"``.
        rope_theta (float): RoPE base.
        use_bias (bool): biases in the projections.
        classifier_dropout (float | None): dropout of classification heads (``None`` = hidden dropout).
        is_decoder (bool): causal attention (``*ForCausalLM`` sets it).
        use_cache (bool): as in Transformers.
        pad_token_id (int | None): as in Transformers.
        bos_token_id (int | None): as in Transformers.
        eos_token_id (int | list[int] | None): as in Transformers.
        tie_word_embeddings (bool): as in Transformers.
        **kwargs: passed to ``PreTrainedConfig``; a field of ``not_applicable`` raises ``ValueError``.
    """

    # Pipeline parallelism (Transformers' DistributedConfig(pp_size=…)): stages split ``layers``; the first
    # embeds, the last applies the final norm (+ the head's ``_pp_plan``). Tensor-parallel plans: per family.
    base_model_pp_plan: ClassVar[dict[str, Any]] = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }
    # FSDP2: each layer its own group; the embeddings and the LM head stay in the root group together, so a
    # tied pair is one parameter of one group (see ``_HeadMixin._tie_before_fsdp``).
    base_model_fsdp_plan: ClassVar[dict[str, str]] = {"layers.*": "free_full_weight",
                                                      "norm": "keep_full_weight"}
    # Fields of other families that this one has no use for, each with why: given, they raise ValueError
    # instead of being kept and ignored. Per-layer RoPE is the entropy-invariant family's only.
    not_applicable: ClassVar[dict[str, str]] = {
        "no_rope_layers": "position_embedding_type gives every layer RoPE or none (no_rope_layers is "
                          "EntropyInvariantConfig's)."}

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
        """Set the fields and check them; the arguments are described in the class docstring."""
        for field in sorted(self.not_applicable.keys() & kwargs.keys()):
            value = kwargs[field]  # None or empty asks for nothing: taken, as generic code may pass it
            if value is not None and not (isinstance(value, (dict, list, tuple)) and not value):
                raise ValueError(f"{field} does not apply to {type(self).__name__}: "
                                 f"{self.not_applicable[field]} (Earlier versions kept and ignored it: "
                                 "delete the key from a config.json saved with it.)")
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
        """Give every subclass ``config_equal`` as ``__eq__``.

        Transformers >= 5.5 turns every config subclass into a dataclass, whose generated ``__eq__`` would
        compare only the base class's dataclass fields (so configs of different sizes would be "equal").

        Args:
            **kwargs: passed to ``PreTrainedConfig.__init_subclass__``.
        """
        super().__init_subclass__(**kwargs)
        cls.__eq__ = config_equal  # type: ignore[method-assign, assignment]

    __eq__ = config_equal

    def check_fields(self) -> None:
        """Check every field; raises ``ValueError``/``TypeError`` naming the field. Families extend it."""
        check_int("vocab_size", self.vocab_size, 1)
        check_int("hidden_size", self.hidden_size, 1)
        check_int("num_hidden_layers", self.num_hidden_layers, 1)
        check_int("max_position_embeddings", self.max_position_embeddings, 1)
        check_choice("hidden_act", self.hidden_act, sorted(ACT2FN.keys()))
        check_float("hidden_dropout_prob", self.hidden_dropout_prob, 0.0, 1.0)
        check_float("attention_probs_dropout_prob", self.attention_probs_dropout_prob, 0.0, 1.0)
        check_float("classifier_dropout", self.classifier_dropout, 0.0, 1.0, allow_none=True)
        check_float("initializer_range", self.initializer_range, 0.0)
        check_float("layer_norm_eps", self.layer_norm_eps, 0.0)
        if self.layer_norm_eps == 0:  # a zero row (the padding embedding) would normalise to 0/0 = NaN
            raise ValueError("layer_norm_eps must be > 0, got 0: a norm of a zero vector (the padding "
                             "embedding) divides 0 by 0.")
        check_float("rope_theta", self.rope_theta, 1.0)
        check_choice("norm_type", self.norm_type, NORM_TYPES)
        check_choice("norm_position", self.norm_position, NORM_POSITIONS)
        check_choice("position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES)
        for field in ("norm_elementwise_affine", "use_bias", "is_decoder", "use_cache",
                      "tie_word_embeddings"):
            check_bool(field, getattr(self, field))
        for field in ("pad_token_id", "bos_token_id"):
            check_int(field, getattr(self, field), 0, allow_none=True)
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:  # the padding_idx
            raise ValueError(f"pad_token_id must be < vocab_size={self.vocab_size}, got {self.pad_token_id}.")
        eos = self.eos_token_id  # one id or several, as generate takes them
        for value in eos if isinstance(eos, (list, tuple)) else [eos]:
            check_int("eos_token_id", value, 0, allow_none=not isinstance(eos, (list, tuple)))


class MultiHeadAttnVariantConfig(AttnVariantConfig):
    """Adds multi-head attention and a feed-forward block to ``AttnVariantConfig``.

    Args:
        num_attention_heads (int): heads per layer before pruning.
        intermediate_size (int): the feed-forward width.
        pruned_heads (dict | None): ``{layer: [original head indices removed]}``: ``from_pretrained`` rebuilds
            the shapes.
        head_dim (int | None): size of one head (Llama's field); ``None`` = hidden_size / num_attention_heads.
            Written to ``config.json`` only when set (a uniformly pruned model keeps its original
            ``head_dim``).
        **kwargs: the fields of ``AttnVariantConfig``.
    """

    # Tensor parallelism (Megatron-LM's split): each rank owns whole heads — their q/k/v rows, o columns and
    # every per-head tensor (SSMax's scale; the Synthesizer's dense W₁/W₂, R, R₁/R₂) through "local_shard"
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
        """Set the fields; the arguments are described in the class docstring."""
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.pruned_heads = pruned_heads
        self.head_dim = head_dim
        super().__init__(**kwargs)

    def check_fields(self) -> None:
        """Check the shared fields, the heads and the feed-forward; normalise ``pruned_heads``."""
        super().check_fields()
        check_int("num_attention_heads", self.num_attention_heads, 1)
        check_int("intermediate_size", self.intermediate_size, 1)
        check_int("head_dim", self.explicit_head_dim, 1, allow_none=True)
        if self.explicit_head_dim is None and self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}), or head_dim must be given."
            )
        if self.position_embedding_type == "rope" and self.head_dim % 2:  # RoPE rotates pairs
            raise ValueError(f"head_dim must be even with position_embedding_type='rope', got "
                             f"{self.head_dim} (hidden_size / num_attention_heads unless head_dim is given).")
        self.pruned_heads = normalize_pruned_heads(
            self.pruned_heads, num_layers=self.num_hidden_layers, num_heads=self.num_attention_heads
        )

    @property
    def explicit_head_dim(self) -> int | None:
        """The ``head_dim`` field as given (``None`` = derived from hidden_size / num_attention_heads)."""
        return self.__dict__.get("head_dim")

    @property
    def head_dim(self) -> int:
        """Head size: field ``head_dim``, else hidden_size / num_attention_heads (unchanged by pruning)."""
        explicit = self.explicit_head_dim
        return self.hidden_size // self.num_attention_heads if explicit is None else explicit

    @head_dim.setter
    def head_dim(self, value: int | None) -> None:
        self.__dict__["head_dim"] = value

    def to_dict(self) -> dict[str, Any]:
        """As ``PreTrainedConfig.to_dict``, without ``head_dim`` when it is derived (not set explicitly).

        Returns:
            dict[str, Any]: the config's fields, as ``config.json`` stores them.
        """
        output = super().to_dict()
        if output.get("head_dim", 0) is None:
            del output["head_dim"]
        return output

    def layer_heads(self, layer_idx: int) -> list[int]:
        """Original indices of the heads layer ``layer_idx`` keeps after pruning.

        Args:
            layer_idx (int): the layer.

        Returns:
            list[int]: the kept heads' original indices, ascending.
        """
        return kept_heads(self.pruned_heads or {}, layer_idx, self.num_attention_heads)


__all__ = [
    "AttnVariantConfig",
    "MultiHeadAttnVariantConfig",
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "config_equal",
    "renamed_field",
]
