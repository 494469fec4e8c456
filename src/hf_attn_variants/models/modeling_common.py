"""Model pieces shared by the three families.

The attention geometry, the ``PreTrainedModel`` base, the backbone and the task heads. A family defines its
attention and layer, then composes:

```python
class FooPreTrainedModel(AttnVariantPreTrainedModel): ...  # config_class, layer_class = FooLayer
class FooModel(AttnVariantBackbone, FooPreTrainedModel): ...  # _attention_inputs()
class FooForCausalLM(CausalLMHeadMixin, FooPreTrainedModel, GenerationMixin):
    base_model_class = FooModel  # and so for the other four heads
```

The heads build the base model directly (not through ``AutoModel``, which remote code cannot rely on) and pool
the first token ([CLS]) for sequence classification.
"""

from __future__ import annotations

import copy
import itertools
import re
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import ModelOutput, can_return_tuple, logging
from transformers.utils.import_utils import is_torchdynamo_compiling

from .compat import CACHE_FIELD, accepts_cache_alias, output_cache, record_outputs
from .configuration_common import AttnVariantConfig
from .layers import (
    LayerNorm,
    RMSNorm,
    RotaryEmbedding,
    ScaleNorm,
    boolean_attention_mask,
    build_norm,
    check_mask_rank,
    default_position_ids,
    leading_padding,
    packed_document_ids,
    visible_key_counts,
)
from .losses import chunked_cross_entropy
from .standalone import RemoteCodeSavingMixin

logger = logging.get_logger(__name__)


if TYPE_CHECKING:  # the mixins below are combined with a PreTrainedModel subclass
    ModelMixinBase = PreTrainedModel
else:
    ModelMixinBase = object


def warn_on_second_segment(token_type_ids: torch.Tensor | None) -> None:
    """Warn once when ``token_type_ids`` holds a second segment: these models have no segment embeddings.

    A sentence pair's second segment is then read as the first, told apart by its separator only, as in
    training (a Trainer drops the column); a model converted from one with segment embeddings (GAU-α) differs
    there. One host read, only when a caller passes them (not while dynamo traces).
    """
    if token_type_ids is None or is_torchdynamo_compiling():
        return
    if bool(torch.as_tensor(token_type_ids).any()):
        logger.warning_once(
            "token_type_ids are ignored: these models have no token types (segment embeddings), so a second "
            "segment is read as the first, told apart by its separator only (as it was in training)."
        )


class AttentionGeometry(NamedTuple):
    """Where the queries of one forward pass sit among the keys; the backbone builds it once for every layer.

    Attributes:
        batch_size (int): B.
        query_length (int): T, the new tokens.
        query_offset (int | torch.Tensor): the cached tokens before the queries (a tensor with a static cache,
            whose updates advance it); the keys are the ``query_offset + query_length`` tokens.
        causal (bool): whether queries see only earlier keys.
        device (torch.device): the inputs' device.
        attention_mask (torch.Tensor | None): the caller's 2D ``[B, T_k]`` or prepared 4D ``[B, 1, T, T_k]``
            mask.
        position_ids (torch.Tensor | None): ``[B, T]``, the caller's positions, ``None`` when defaulted (only
            the caller's positions may decide nᵢ).
        document_ids (torch.Tensor | None): ``[B, T]`` int64, the document of each token of rows packing
            several documents (``packed_document_ids``), else ``None``.
    """

    batch_size: int
    query_length: int
    query_offset: int | torch.Tensor
    causal: bool
    device: torch.device
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    document_ids: torch.Tensor | None = None

    @property
    def key_length(self) -> int | torch.Tensor:
        """T_k = ``query_offset + query_length``, the keys with the cache."""
        return self.query_offset + self.query_length

    def positions(self) -> torch.Tensor:
        """Positions used: the caller's, else offset … offset + query_length − 1.

        Returns:
            torch.Tensor: ``[B, T]`` integer positions.
        """
        if self.position_ids is not None:
            return self.position_ids
        return default_position_ids(self.batch_size, self.query_length, self.query_offset, self.device)

    def _shape(self, key_length: int | torch.Tensor | None = None) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "query_length": self.query_length, "causal": self.causal,
                "key_length": self.key_length if key_length is None else key_length,
                "query_offset": self.query_offset, "device": self.device}

    def key_counts(self, dtype: torch.dtype) -> torch.Tensor:
        """nᵢ, the keys each query sees (``visible_key_counts``).

        Args:
            dtype (torch.dtype): the counts' dtype.

        Returns:
            torch.Tensor: ``[B, T]`` in ``dtype``.
        """
        return visible_key_counts(self.attention_mask, **self._shape(), dtype=dtype,
                                  position_ids=self.position_ids, document_ids=self.document_ids)

    def boolean_mask(self) -> torch.Tensor | None:
        """Padding ∧ causality (∧ same document) as a boolean mask (``boolean_attention_mask``).

        Returns:
            torch.Tensor | None: ``[B, 1, T, T_k]`` bool, or ``None`` when every key is visible.
        """
        return boolean_attention_mask(self.attention_mask, **self._shape(), document_ids=self.document_ids)

    def causal_mask(self, key_length: int) -> torch.Tensor | None:
        """Causality alone over ``key_length`` keys (a static cache's slots).

        The mask a kernel that needs one gets when the caller's mask was prepared as ``None`` (SDPA's
        ``is_causal``).

        Args:
            key_length (int): the keys (a static cache: all of its slots).

        Returns:
            torch.Tensor | None: ``[B, 1, T, key_length]`` bool, or ``None`` for a bidirectional pass.
        """
        return boolean_attention_mask(None, **self._shape(key_length)) if self.causal else None


class FeedForward(nn.Module):
    """Position-wise feed-forward block: down_proj(act(up_proj(x))) (Vaswani et al. 2017, arXiv:1706.03762).

    Args:
        config (AttnVariantConfig): ``hidden_size``, ``intermediate_size``, ``hidden_act`` and ``use_bias``.
    """

    def __init__(self, config: AttnVariantConfig) -> None:
        """Build the two projections; the argument is described in the class docstring."""
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """down_proj(act(up_proj(x))).

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.

        Returns:
            torch.Tensor: ``[B, T, D]``, the model dtype.
        """
        return self.down_proj(self.act_fn(self.up_proj(hidden_states)))


def config_norm(config: AttnVariantConfig) -> nn.Module:
    """The norm the config names (``norm_type``, ``layer_norm_eps``, ``norm_elementwise_affine``).

    Args:
        config (AttnVariantConfig): the model's config.

    Returns:
        nn.Module: a norm over ``hidden_size``.
    """
    return build_norm(config.norm_type, config.hidden_size, config.layer_norm_eps,
                      config.norm_elementwise_affine)


def residual_block(
    hidden_states: torch.Tensor, sublayer: Any, norm: nn.Module, dropout: nn.Module, norm_position: str
) -> torch.Tensor:
    """Pre-norm x + drop(f(norm(x))) or post-norm norm(x + drop(f(x))) for the callable ``sublayer`` f.

    Args:
        hidden_states (torch.Tensor): ``[B, T, D]`` x, the model dtype.
        sublayer (Callable): f, ``[B, T, D]`` → ``[B, T, D]``.
        norm (nn.Module): the block's norm.
        dropout (nn.Module): the residual branch's dropout.
        norm_position (str): ``"pre"`` or ``"post"``.

    Returns:
        torch.Tensor: ``[B, T, D]``, the model dtype.
    """
    if norm_position == "pre":
        return hidden_states + dropout(sublayer(norm(hidden_states)))
    return norm(hidden_states + dropout(sublayer(hidden_states)))


class AttentionMLPLayer(GradientCheckpointingLayer):
    """Attention, then the feed-forward network, each inside ``residual_block``.

    A family names its ``attention_class`` (taking ``(config, layer_idx)``), given the layer's keyword
    arguments unchanged.

    Args:
        config (AttnVariantConfig): the model's config.
        layer_idx (int): the layer's index.
    """

    attention_class: ClassVar[type[nn.Module]]

    def __init__(self, config: AttnVariantConfig, layer_idx: int) -> None:
        """Build the attention, the feed-forward block, their norms and dropout; see the class docstring."""
        super().__init__()
        self.norm_position = config.norm_position
        self.self_attn = self.attention_class(config, layer_idx)
        self.mlp = FeedForward(config)
        self.attention_norm = config_norm(config)
        self.mlp_norm = config_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, **attention_kwargs: Any) -> torch.Tensor:
        """Attention block, then feed-forward block.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            **attention_kwargs: the attention's keyword inputs (geometry, RoPE tables, masks, nᵢ, cache),
                passed through unchanged.

        Returns:
            torch.Tensor: ``[B, T, D]``, the model dtype.
        """

        def attend(x: torch.Tensor) -> torch.Tensor:
            return self.self_attn(x, **attention_kwargs)[0]

        hidden_states = residual_block(hidden_states, attend, self.attention_norm, self.dropout,
                                       self.norm_position)
        return residual_block(hidden_states, self.mlp, self.mlp_norm, self.dropout, self.norm_position)


SERVING_ENGINE_ATTENTION = "vllm"
"""The attention implementation vLLM's Transformers backend writes on a config before it builds the model."""
STOCK_LOG_N_ATTENTION = ("entropy_invariant", "entropy_invariant_eager")
"""The log-n attention functions the package registers for stock Transformers models
(``hf_attn_variants.stock``). Transformers accepts any registered name for any model; these families refuse
them."""


class AttnVariantPreTrainedModel(RemoteCodeSavingMixin, PreTrainedModel):
    """Base of every model class of the three families.

    ``_init_weights`` covers every parameter (v5 builds models on the meta device, then initialises): linear
    and embedding weights ~ N(0, ``initializer_range``), biases 0, norm gains 1; a family initialises its own
    parameters in ``_init_family_weights``.
    """

    config_class: Any = AttnVariantConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = ["cache", "past_key_values"]  # the names of 5.24+ and of 5.0–5.23
    serving_limitation: ClassVar[str | None] = None
    """Why vLLM's paged softmax attention cannot compute this family; ``None`` where it can."""
    layer_class: ClassVar[type[nn.Module]]
    """The family's layer, taking ``(config, layer_idx)``; its ``attention_class`` is the attention module.
    Both name the modules FSDP/``device_map`` keep whole and the outputs ``output_*`` records."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Derive ``_no_split_modules`` and ``_can_record_outputs`` from a subclass's ``layer_class``.

        Args:
            **kwargs: passed to ``PreTrainedModel.__init_subclass__``.
        """
        super().__init_subclass__(**kwargs)
        layer = cls.__dict__.get("layer_class")
        if layer is not None:
            cls._no_split_modules = [layer.__name__]
            cls._can_record_outputs = {"hidden_states": layer, "attentions": layer.attention_class}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, (LayerNorm, RMSNorm, ScaleNorm)):
            if module.weight is not None:
                init.ones_(module.weight)
            bias = getattr(module, "bias", None)
            if bias is not None:
                init.zeros_(bias)
        self._init_family_weights(module)

    def _init_family_weights(self, module: nn.Module) -> None:
        """Initialise parameters and buffers specific to a family (override in the family)."""

    def __init__(self, config: AttnVariantConfig, *args: Any, **kwargs: Any) -> None:
        """Refuse vLLM's attention where it cannot compute this model, then build as ``PreTrainedModel``.

        vLLM goes on past ``is_backend_compatible() == False`` and builds the model under its own attention.

        Args:
            config (AttnVariantConfig): the model's config.
            *args: passed to ``PreTrainedModel``.
            **kwargs: passed to ``PreTrainedModel``.
        """
        if getattr(config, "_attn_implementation", None) == SERVING_ENGINE_ATTENTION:
            refusal = self.serving_refusal(config)
            if refusal is not None:
                raise ValueError(refusal)
        super().__init__(config, *args, **kwargs)

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False
                                        ) -> str:
        """Transformers' check of ``attn_implementation``, refusing the stock models' log-n functions.

        Transformers accepts every registered name for every model. The entropy-invariant family scales its
        logits itself (``attention_scale``), so these functions would apply log n a second time; GAU and the
        Synthesizer compute their attention themselves, so they would change nothing.

        Args:
            requested_attention (str | None): the name asked for.
            is_init_check (bool): whether the model is being built (Transformers' argument).

        Returns:
            str: the implementation to use.
        """
        if requested_attention in STOCK_LOG_N_ATTENTION:
            if self._supports_attention_backend:
                why = ("sets its log-n scaling with config.attention_scale ('entropy_invariant' or 'ssmax'), "
                       "and this function would scale the logits again: use attn_implementation='sdpa', "
                       "'eager' or 'flex_attention'")
            else:
                why = "computes its attention itself, so this function would change nothing: leave it unset"
            raise ValueError(f"attn_implementation={requested_attention!r} is log-n scaling for stock "
                             f"Transformers models; {type(self).__name__} {why}.")
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    def init_continuous_batching(self, *args: Any, **kwargs: Any) -> Any:
        """Refuse Transformers' continuous batching (``generate_batch``, ``init_continuous_batching``).

        Its requests would fail one by one inside the manager's thread, each with a logged traceback (the
        layers do not read Transformers' paged cache, and GAU has no heads to page).

        Args:
            *args: ``init_continuous_batching``'s arguments.
            **kwargs: its keyword arguments.

        Returns:
            Any: nothing; it raises ``ValueError``.
        """
        raise ValueError(f"{type(self).__name__} does not run under Transformers' continuous batching "
                         "(generate_batch, init_continuous_batching, cache_implementation='paged'): its "
                         "attention does not read the paged cache. Call generate with a batch of prompts and "
                         "the default cache instead.")

    @classmethod
    def serving_refusal(cls, config: AttnVariantConfig | None = None) -> str | None:
        """Why vLLM's Transformers backend cannot serve this family or model, and what to use instead.

        One sentence, for the family, or given ``config`` for this model (heads pruned per layer).

        Args:
            config (AttnVariantConfig | None): the model's config, or ``None`` for the family alone.

        Returns:
            str | None: the sentence, or ``None`` if vLLM can serve it.
        """
        if cls.serving_limitation is not None:
            family = cls.config_class.__name__.removesuffix("Config")
            return (f"{family} models cannot be served by vLLM's Transformers backend (paged softmax "
                    f"attention): {cls.serving_limitation}")
        if config is not None and getattr(config, "pruned_heads", None):
            return ("A model with pruned_heads (heads removed per layer) cannot be served by vLLM, whose "
                    "attention takes num_attention_heads heads in every layer: where every layer keeps the "
                    "same number, restate_uniform_heads(model) (or prune --uniform) makes it servable; else "
                    "generate with Transformers (model.generate with its cache).")
        return None

    def init_parallel_plans(self) -> None:
        """Transformers' parallel plans, less the tensor-parallel rules that name nothing of this model.

        A rule is dropped when it names no module or parameter of this configuration (the Synthesizer's q/k
        projections exist only with ``vanilla``).
        """
        super().init_parallel_plans()
        names = {
            re.sub(r"\.\d+(\.|$)", r".*\1", name)  # layer numbers as wildcards, as the plans write them
            for name, _ in itertools.chain(self.named_modules(), self.named_parameters())
        }
        self._tp_plan = {rule: style for rule, style in (self._tp_plan or {}).items() if rule in names}

    def gather_sharded_state_dict_for_save(self, model_to_save: Any, state_dict: dict, *args: Any,
                                           **kwargs: Any) -> dict:
        """Transformers' gather of a sharded model's weights, each tied name pointing at its source again.

        The gather returns a tensor per name, and the tie removal before writing finds ties by storage.

        Args:
            model_to_save (Any): the model being saved.
            state_dict (dict): its sharded state dict.
            *args: passed to Transformers' gather.
            **kwargs: passed to Transformers' gather.

        Returns:
            dict: the gathered state dict.
        """
        gathered = super().gather_sharded_state_dict_for_save(model_to_save, state_dict, *args, **kwargs)
        for target, source in (getattr(model_to_save, "all_tied_weights_keys", None) or {}).items():
            if target in gathered and source in gathered:
                gathered[target] = gathered[source]
        return gathered


class AttnVariantBackbone(ModelMixinBase):
    """Embeddings → layer stack → final norm, shared by the three base models (mixin).

    A family implements ``_attention_inputs``; its ``PreTrainedModel`` names the ``layer_class``. Every layer
    gets the ``AttentionGeometry`` (``geometry``), the RoPE tables, the cache and the family's inputs.
    Post-norm stacks (BERT, GAU-α) normalise the embeddings; pre-norm stacks normalise at the end.

    Args:
        config (AttnVariantConfig): the model's config.
    """

    def __init__(self, config: AttnVariantConfig) -> None:
        """Build the embeddings, RoPE, the norms and the layers; the argument is in the class docstring."""
        super().__init__(config)
        self.is_causal = config.is_decoder
        self.embed_tokens: nn.Module = nn.Embedding(config.vocab_size, config.hidden_size,
                                                    config.pad_token_id)
        absolute = config.position_embedding_type == "absolute"
        rope = config.position_embedding_type == "rope"
        self.embed_positions = (nn.Embedding(config.max_position_embeddings, config.hidden_size) if absolute
                                else None)
        self.rotary_emb = RotaryEmbedding(self._rotary_dim(config), config.rope_theta) if rope else None
        post = config.norm_position == "post"
        self.embed_norm = config_norm(config) if post else nn.Identity()
        self.norm = nn.Identity() if post else config_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        layers = [self.layer_class(config, i) for i in range(config.num_hidden_layers)]  # type: ignore[operator]
        self.layers = nn.ModuleList(layers)
        self.gradient_checkpointing = False
        self.post_init()

    def _rotary_dim(self, config: Any) -> int:
        """Size of the vectors RoPE rotates (the head size ``config.head_dim``; GAU uses its key size)."""
        return config.head_dim

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding ``embed_tokens``.

        Returns:
            nn.Module: the embedding.
        """
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replace the token embedding.

        Args:
            value (nn.Module): the new embedding (``vocab_size`` × ``hidden_size``).
        """
        self.embed_tokens = value

    def _attention_inputs(
        self, geometry: AttentionGeometry, hidden_states: torch.Tensor, cache: Cache | None
    ) -> dict[str, Any]:
        """The family's keyword arguments for every layer (masks in its format, key counts …), built once."""
        raise NotImplementedError

    def layer_inputs(
        self, geometry: AttentionGeometry, hidden_states: torch.Tensor, cache: Cache | None = None
    ) -> dict[str, Any]:
        """Every layer keyword argument but the RoPE tables: the geometry, the cache, the family's inputs.

        Args:
            geometry (AttentionGeometry): the call's geometry.
            hidden_states (torch.Tensor): ``[B, T, D]`` embeddings (for their dtype), the model dtype.
            cache (Cache | None): the model's cache.

        Returns:
            dict[str, Any]: the layers' keyword arguments.
        """
        return {"geometry": geometry, "cache": cache,
                **self._attention_inputs(geometry, hidden_states, cache)}

    @staticmethod
    def _packed_documents(
        position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, cache: Cache | None
    ) -> torch.Tensor | None:
        """dₜ of ``packed_document_ids`` when the rows pack several documents, else ``None``.

        Packed rows are the caller's ``position_ids`` restarting inside a row without an ``attention_mask`` (a
        packing data pipeline's format, as Transformers' ``find_packed_sequence_indices`` reads it). Every
        family then keeps attention inside each document and counts nᵢ per document. While compiling, data
        cannot decide a branch: rows with positions and no cache count as packed (one document gives the
        ordinary result).
        """
        if attention_mask is not None or position_ids is None or position_ids.shape[-1] < 2:
            return None
        document_ids = packed_document_ids(position_ids)
        if is_torchdynamo_compiling():
            return document_ids if cache is None else None
        if not bool(document_ids[:, -1].any()):
            return None
        if cache is not None:
            raise ValueError(
                "position_ids restart inside a row without an attention_mask (packed documents), but a cache "
                "was passed: a cache continues one sequence per row. Score packed documents without a cache "
                "(use_cache=False), or decode one document per row."
            )
        return document_ids

    def _check_inputs(self, input_ids: torch.Tensor | None, total_length: int,
                      attention_mask: torch.Tensor | None) -> None:
        """Clear errors for inputs that would fail deep inside torch (ids: on CPU, or outside training)."""
        if (input_ids is not None and input_ids.numel() > 0 and not is_torchdynamo_compiling()
                and (input_ids.device.type == "cpu" or not self.training)):
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(
                    f"input_ids must be in [0, vocab_size={self.config.vocab_size}), got values in "
                    f"[{low}, {high}]."
                )
        # The table's size, not the config's: dynamo < 2.11 does not guard a config's attributes.
        if self.embed_positions is not None and total_length > self.embed_positions.num_embeddings:
            raise ValueError(
                f"Sequence length {total_length} exceeds max_position_embeddings="
                f"{self.embed_positions.num_embeddings} of the learned absolute positions."
            )
        check_mask_rank(attention_mask)
        if (attention_mask is not None and attention_mask.dim() == 2
                and attention_mask.shape[-1] != total_length):
            raise ValueError(
                f"attention_mask has {attention_mask.shape[-1]} columns but the keys (past + current) number "
                f"{total_length}."
            )

    def _check_shapes(self, given: torch.Tensor, attention_mask: torch.Tensor | None,
                      position_ids: torch.Tensor | None) -> None:
        """Clear errors for embeddings, a mask or positions that do not fit the input.

        Each would fail deep inside a layer. In eager only: while dynamo traces, the sizes may be symbolic,
        and a comparison of them once raised on the right shapes (a compiled static-cache decoding step).
        """
        if is_torchdynamo_compiling():
            return
        batch_size, seq_length = given.shape[:2]
        if given.dim() == 3 and (not given.is_floating_point() or given.shape[-1] != self.config.hidden_size):
            raise ValueError(f"inputs_embeds must be floating point [batch, seq, hidden_size="
                             f"{self.config.hidden_size}], got {given.dtype} {tuple(given.shape)}.")
        if given.dim() == 2 and given.is_floating_point():
            raise ValueError(f"input_ids must be integer token ids, got {given.dtype}.")
        if (attention_mask is not None and attention_mask.dim() in (2, 4)
                and attention_mask.shape[0] not in (batch_size, 1)):
            raise ValueError(f"attention_mask has {attention_mask.shape[0]} rows but the batch has "
                             f"{batch_size}.")
        if position_ids is not None and (position_ids.shape[-1] != seq_length
                                         or position_ids.numel() // seq_length not in (batch_size, 1)):
            raise ValueError(f"position_ids must be [{batch_size}, {seq_length}] or [1, {seq_length}] for "
                             f"this input, got {tuple(position_ids.shape)}.")

    def _check_positions(self, position_ids: torch.Tensor | None) -> None:
        """A clear error for given ``position_ids`` outside the learned table.

        They would fail deep inside torch. Checked on CPU only: reading them on a GPU would sync every step
        (``generate`` passes them).
        """
        if (position_ids is None or self.embed_positions is None or position_ids.numel() == 0
                or is_torchdynamo_compiling() or position_ids.device.type != "cpu"):
            return
        low, high = int(position_ids.min()), int(position_ids.max())
        if low < 0 or high >= self.config.max_position_embeddings:
            raise ValueError(
                f"position_ids must be in [0, max_position_embeddings={self.config.max_position_embeddings}) "
                f"for the learned absolute positions, got values in [{low}, {high}]."
            )

    @staticmethod
    def _input(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """The one input given; ``ValueError`` for none or both, a wrong rank or an empty one."""
        given = inputs_embeds if input_ids is None else input_ids
        if given is None or (input_ids is not None and inputs_embeds is not None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        name, shape, rank = (("input_ids", "(batch, seq)", 2) if input_ids is not None
                             else ("inputs_embeds", "(batch, seq, hidden)", 3))
        if given.dim() != rank:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(given.shape)}.")
        if 0 in given.shape[:2]:
            raise ValueError(f"Empty input: batch size {given.shape[0]}, sequence length {given.shape[1]}.")
        return given

    def _embed(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
               positions: torch.Tensor) -> torch.Tensor:
        """Token (+ learned position) embeddings, embedding norm and dropout.

        A later stage of Transformers' pipeline parallelism (layer 0 replaced by a ``PipelineIdentityLayer``)
        gets the previous stage's hidden states as ``inputs_embeds``, which are not embedded again.
        """
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if type(self.layers[0]).__name__ == "PipelineIdentityLayer":
            return hidden_states
        if self.embed_positions is not None:
            hidden_states = hidden_states + self.embed_positions(positions)
        return self.dropout(self.embed_norm(hidden_states))

    @accepts_cache_alias
    @record_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """Run the stack: embeddings, every layer, the final norm.

        Args:
            input_ids (torch.LongTensor | None): ``[B, T]`` token ids (or ``inputs_embeds``).
            attention_mask (torch.Tensor | None): 2D ``[B, past + T]``, 1 = token, or a prepared 4D
                ``[B, 1, T, T_k]`` mask (or generate's dict of masks per layer type).
            position_ids (torch.Tensor | None): ``[B, T]`` or ``[1, T]`` positions; restarting inside a row
                without a mask, they mark packed documents.
            cache (Cache | None): the cache of earlier tokens (causal models; also accepted as
                ``past_key_values``).
            inputs_embeds (torch.Tensor | None): ``[B, T, D]`` embeddings in the model dtype, instead of
                ``input_ids``.
            use_cache (bool | None): return a cache (a new ``DynamicCache`` when none is given).
            **kwargs: Transformers' output switches and attention keyword arguments, passed to the layers.

        Returns:
            BaseModelOutputWithPast: ``last_hidden_state`` ``[B, T, D]`` in the model dtype and the cache.
        """
        given = self._input(input_ids, inputs_embeds)
        batch_size, seq_length = given.shape[:2]
        if isinstance(attention_mask, dict):  # generate's masks per layer type, for configs with layer_types
            attention_mask = attention_mask["full_attention"]
        self._check_shapes(given, attention_mask, position_ids)
        warn_on_second_segment(kwargs.pop("token_type_ids", None))
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[0] != batch_size:
            attention_mask = attention_mask.expand(batch_size, -1)  # one row for all, as SDPA broadcasts
        if position_ids is not None:
            position_ids = position_ids.view(-1, position_ids.shape[-1]).expand(batch_size, -1)
        if not self.is_causal or (self.gradient_checkpointing and self.training and torch.is_grad_enabled()):
            # Under gradient checkpointing the backward replay would update a cache twice.
            use_cache, cache = False, None
        document_ids = self._packed_documents(position_ids, attention_mask, cache)
        if use_cache and cache is None:  # training and packed documents build none (config.use_cache is on)
            if self.training or document_ids is not None:
                use_cache = False
            else:
                cache = DynamicCache(config=self.config)
        past_length = cache.get_seq_length() if cache is not None else 0
        if isinstance(past_length, torch.Tensor):  # a static cache's counter; each layer's update advances it
            past_length = past_length.clone()
        self._check_inputs(input_ids, past_length + seq_length, attention_mask)
        self._check_positions(position_ids)

        geometry = AttentionGeometry(batch_size, seq_length, past_length, self.is_causal, given.device,
                                     attention_mask, position_ids, document_ids)
        positions = geometry.positions()
        hidden_states = self._embed(input_ids, inputs_embeds, positions)
        position_embeddings = (self.rotary_emb(positions, hidden_states.dtype) if self.rotary_emb is not None
                               else None)
        layer_inputs = self.layer_inputs(geometry, hidden_states, cache)
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings=position_embeddings, **layer_inputs,
                                  **kwargs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states,
                                       **{CACHE_FIELD: cache if use_cache else None})  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------------
class _HeadMixin(ModelMixinBase):
    """Builds ``self.model`` from ``base_model_class`` with the head's attention direction."""

    base_model_class: ClassVar[type[PreTrainedModel]]
    is_decoder_head: ClassVar[bool] = False
    model: Any
    lm_head: nn.Linear

    def _build_base(self, config: AttnVariantConfig) -> AttnVariantConfig:
        if config.is_decoder != self.is_decoder_head:  # a copy: the caller's config stays as it was
            if config.is_decoder:
                logger.warning_once(
                    f"{type(self).__name__} attends in both directions, but this config is causal "
                    "(is_decoder=True, as a causal LM saves it): the model is not the one such a checkpoint "
                    "was trained as."
                )
            config = copy.deepcopy(config)
            config.is_decoder = self.is_decoder_head
        pipeline = getattr(getattr(config, "distributed_config", None), "pp_size", None) or 1
        if not self.is_decoder_head and pipeline > 1:
            # Transformers would split the layers anyway, and its last stage would fail while the others wait.
            raise ValueError(
                f"pp_size={pipeline}: Transformers' pipeline parallelism runs causal language models only "
                f"(it returns their outputs), not {type(self).__name__}; use tp_size or fsdp_size instead."
            )
        super().__init__(config)
        self.model = self.base_model_class(config)
        return config

    def _tie_before_fsdp(self, config: AttnVariantConfig) -> None:
        """Tie ``lm_head`` to ``embed_tokens`` at construction when FSDP2 will shard the model.

        Transformers ties them only after ``fully_shard``, when FSDP2 manages them as two parameters, and the
        head would keep its initial weights (an upstream problem of Transformers' ties under FSDP2). Tensor
        parallelism ties correctly afterwards; with FSDP too, refused.
        """
        distributed = getattr(config, "distributed_config", None)
        tensor_parallel = getattr(distributed, "tp_size", None) or 1
        data_parallel = ((getattr(distributed, "fsdp_size", None) or 1)
                         * (getattr(distributed, "dp_replicate_size", None) or 1))
        if not config.tie_word_embeddings or data_parallel == 1:
            return
        if tensor_parallel > 1:
            raise ValueError(
                "tie_word_embeddings=True cannot be trained with tensor parallelism and FSDP together "
                f"(tp_size={tensor_parallel}, fsdp × replicas = {data_parallel}): Transformers ties the LM "
                "head after sharding, and FSDP then keeps it at its initial weights; use one of the two, or "
                "tie_word_embeddings=False."
            )
        self.lm_head.weight = self.model.embed_tokens.weight

    def _encode(self, input_ids: Any, attention_mask: Any, position_ids: Any, inputs_embeds: Any,
                kwargs: dict[str, Any]) -> BaseModelOutputWithPast:
        return self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, **kwargs)

    def _dropout(self, config: AttnVariantConfig) -> nn.Dropout:
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        return nn.Dropout(p)


class _SingleOutputHead(_HeadMixin):
    """A head whose forward is encode → ``_logits`` → ``_loss`` (with ``labels``) → ``output_class``."""

    output_class: ClassVar[type[ModelOutput]]

    def _logits(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    @can_return_tuple
    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, inputs_embeds: torch.Tensor | None = None,
                labels: torch.LongTensor | None = None, **kwargs: Any) -> ModelOutput:
        """Encode, then the head's logits and, with ``labels``, its loss.

        Args:
            input_ids (torch.LongTensor | None): ``[B, T]`` token ids (or ``inputs_embeds``).
            attention_mask (torch.Tensor | None): ``[B, T]`` padding mask (1 = token), or a prepared 4D mask.
            position_ids (torch.LongTensor | None): ``[B, T]`` positions, or ``None``.
            inputs_embeds (torch.Tensor | None): ``[B, T, D]`` embeddings in the model dtype.
            labels (torch.LongTensor | None): as the head's class docstring says.
            **kwargs: passed to the base model and the loss.

        Returns:
            ModelOutput: the head's output (``loss``, ``logits``, ``hidden_states``, ``attentions``).
        """
        outputs = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        logits = self._logits(outputs.last_hidden_state, attention_mask)  # type: ignore[arg-type]
        loss = None if labels is None else self._loss(logits, labels, kwargs)
        return self.output_class(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                 attentions=outputs.attentions)


class _LanguageModelHead(_HeadMixin):
    """``lm_head`` over the vocabulary, tied to ``embed_tokens`` by default (``tie_word_embeddings``)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: AttnVariantConfig) -> None:
        """Build the base model and ``lm_head``, tied before FSDP2 where needed.

        Args:
            config (AttnVariantConfig): the model's config.
        """
        config = self._build_base(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._tie_before_fsdp(config)
        self.post_init()


class MaskedLMHeadMixin(_LanguageModelHead, _SingleOutputHead):
    """Masked language modelling: logits = lm_head(h).

    ``labels``: ``[B, T]`` token ids at masked positions, -100 elsewhere. ``logits``: ``[B, T, V]``.
    """

    output_class = MaskedLMOutput

    def _logits(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        return self.loss_function(logits, labels, vocab_size=logits.shape[-1], **kwargs)


class CausalLMHeadMixin(_LanguageModelHead):
    """Causal language modelling with a ``Cache`` and ``generate``.

    ``labels``: ``[B, T]``, the input ids (shifted inside the loss).

    Training (gradients enabled) with ``labels`` computes the loss with ``chunked_cross_entropy`` from the
    final hidden states and the ``lm_head`` weight, the vocabulary's logits chunk by chunk, and returns
    ``logits=None``: no float32 logits of the whole batch are kept for backward
    (``hf_attn_variants.models.losses``). In eval mode, without ``labels``, with ``logits_to_keep``, with
    ``chunked_lm_loss = False`` (on the class or the model), or when ``lm_head`` is not a plain ``nn.Linear``
    (a tensor-parallel shard, an adapter, hooks), the logits are computed and the loss is
    ``self.loss_function`` of them, as Transformers' heads do; both give the same loss and gradients.
    """

    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}  # type: ignore[dict-item]
    is_decoder_head = True
    chunked_lm_loss: bool = True

    def _chunked_loss_applies(self, labels: torch.Tensor | None, logits_to_keep: int | torch.Tensor) -> bool:
        """Whether the loss goes through ``chunked_cross_entropy``.

        It does when training with ``labels``, every position kept, no pipeline stages (their schedule passes
        the logits on), and an ``lm_head`` that is a plain ``nn.Linear`` on an ordinary tensor (no hooks, no
        replaced forward as tensor parallelism installs, no DTensor).
        """
        head = self.lm_head
        stages = getattr(getattr(self.config, "distributed_config", None), "pp_size", None) or 1
        return (labels is not None and self.training and self.chunked_lm_loss and torch.is_grad_enabled()
                and isinstance(logits_to_keep, int) and logits_to_keep == 0 and stages == 1
                and type(head) is nn.Linear and "forward" not in head.__dict__  # not vars(): dynamo 2.7
                and not head._forward_hooks and not head._forward_pre_hooks
                and type(head.weight) in (nn.Parameter, torch.Tensor))

    @accepts_cache_alias
    @can_return_tuple
    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs: Any) -> CausalLMOutputWithPast:
        """Encode, then the logits (or the chunked loss in training with ``labels``).

        Args:
            input_ids (torch.LongTensor | None): ``[B, T]`` token ids (or ``inputs_embeds``).
            attention_mask (torch.Tensor | None): ``[B, past + T]`` padding mask (1 = token), or a prepared 4D
                mask.
            position_ids (torch.LongTensor | None): ``[B, T]`` positions, or ``None``.
            cache (Cache | None): the cache of earlier tokens (also accepted as ``past_key_values``).
            inputs_embeds (torch.Tensor | None): ``[B, T, D]`` embeddings in the model dtype.
            labels (torch.LongTensor | None): ``[B, T]``, the input ids (shifted inside the loss).
            use_cache (bool | None): return the cache.
            logits_to_keep (int | torch.Tensor): the last positions whose logits are computed; 0 = all, or
                the indices to keep.
            **kwargs: passed to the base model and the loss (``num_items_in_batch``, ``shift_labels``).

        Returns:
            CausalLMOutputWithPast: ``loss`` (float32 scalar), ``logits`` ``[B, T', V]`` (``None`` with the
            chunked loss), the cache, ``hidden_states`` and ``attentions``.
        """
        outputs = self._encode(input_ids, attention_mask, position_ids, inputs_embeds,
                               {"cache": cache, "use_cache": use_cache, **kwargs})
        logits: torch.Tensor | None = None
        loss: torch.Tensor | None
        if self._chunked_loss_applies(labels, logits_to_keep):
            loss = self._chunked_loss(outputs.last_hidden_state, labels, kwargs)  # type: ignore[arg-type]
        else:
            keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            logits = self.lm_head(outputs.last_hidden_state[:, keep, :])  # type: ignore[index]
            loss = None if labels is None else self.loss_function(
                logits=logits, labels=labels, vocab_size=logits.shape[-1], **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: output_cache(outputs)},
                                      hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    def _chunked_loss(self, hidden_states: torch.Tensor, labels: torch.Tensor,
                      kwargs: dict[str, Any]) -> torch.Tensor:
        """``ForCausalLMLoss`` of ``lm_head(hidden_states)`` by ``chunked_cross_entropy``.

        Transformers' ``shift_labels`` and ``num_items_in_batch`` come from ``kwargs``.
        """
        shifted = kwargs.get("shift_labels")
        return chunked_cross_entropy(hidden_states, self.lm_head.weight,
                                     labels if shifted is None else shifted, bias=self.lm_head.bias,
                                     shift=shifted is None,
                                     num_items_in_batch=kwargs.get("num_items_in_batch"))


class ClassificationHead(nn.Module):
    """Sentence-level head on each row's first token: out_proj(drop(tanh(dense(drop(h_f))))).

    The BERT/RoBERTa pooler; f is the row's first unpadded column (0 with right padding).

    Args:
        config (AttnVariantConfig): ``hidden_size`` and ``num_labels``.
        dropout (nn.Dropout): the classifier dropout.
    """

    def __init__(self, config: AttnVariantConfig, dropout: nn.Dropout) -> None:
        """Build the pooler and the output projection; the arguments are described in the class docstring."""
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = dropout
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)  # type: ignore[arg-type]

    def forward(self, hidden_states: torch.Tensor, first: torch.Tensor | None = None) -> torch.Tensor:
        """Pool each row's first token and classify it.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            first (torch.Tensor | None): ``[B]`` int64, each row's first token's column; ``None`` = 0.

        Returns:
            torch.Tensor: ``[B, num_labels]`` logits, the model dtype.
        """
        token = (hidden_states[:, 0] if first is None
                 else hidden_states[torch.arange(hidden_states.shape[0], device=first.device), first])
        pooled = torch.tanh(self.dense(self.dropout(token)))
        return self.out_proj(self.dropout(pooled))


class SequenceClassificationHeadMixin(_SingleOutputHead):
    """Sequence classification / regression from each row's first token; loss by ``config.problem_type``.

    The first token is the first after any left padding.

    ``labels``: class ids ``[B]``, floats for regression, or multi-hot ``[B, num_labels]`` for multi-label.
    ``logits``: ``[B, num_labels]``.
    """

    output_class = SequenceClassifierOutput

    def __init__(self, config: AttnVariantConfig) -> None:
        """Build the base model and the classification head.

        Args:
            config (AttnVariantConfig): the model's config (``num_labels``).
        """
        config = self._build_base(config)
        self.num_labels = config.num_labels
        self.classifier = ClassificationHead(config, self._dropout(config))
        self.post_init()

    def _logits(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        first = None  # a prepared 4D mask: the first column
        if attention_mask is not None and attention_mask.dim() == 2:
            first = leading_padding(attention_mask).clamp(max=hidden_states.shape[1] - 1)
        return self.classifier(hidden_states, first)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        return self.loss_function(labels=labels, pooled_logits=logits, config=self.config, **kwargs)


class TokenClassificationHeadMixin(_SingleOutputHead):
    """Per-token classification (NER, POS): classifier(drop(h)).

    ``labels``: ``[B, T]``, a label id per token, -100 where no loss is wanted. ``logits``:
    ``[B, T, num_labels]``.
    """

    output_class = TokenClassifierOutput

    def __init__(self, config: AttnVariantConfig) -> None:
        """Build the base model and the per-token classifier.

        Args:
            config (AttnVariantConfig): the model's config (``num_labels``).
        """
        config = self._build_base(config)
        self.num_labels = config.num_labels
        self.dropout = self._dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)  # type: ignore[arg-type]
        self.post_init()

    def _logits(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.classifier(self.dropout(hidden_states))

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        return self.loss_function(logits, labels, self.config, **kwargs)


class QuestionAnsweringHeadMixin(_HeadMixin):
    """Extractive QA: start and end logits from qa_outputs(h) (SQuAD-style span prediction)."""

    def __init__(self, config: AttnVariantConfig) -> None:
        """Build the base model and the span head.

        Args:
            config (AttnVariantConfig): the model's config.
        """
        config = self._build_base(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, inputs_embeds: torch.Tensor | None = None,
                start_positions: torch.LongTensor | None = None,
                end_positions: torch.LongTensor | None = None,
                **kwargs: Any) -> QuestionAnsweringModelOutput:
        """Encode, then start and end logits and, with both positions, the span loss.

        Args:
            input_ids (torch.LongTensor | None): ``[B, T]`` token ids (or ``inputs_embeds``).
            attention_mask (torch.Tensor | None): ``[B, T]`` padding mask (1 = token), or a prepared 4D mask.
            position_ids (torch.LongTensor | None): ``[B, T]`` positions, or ``None``.
            inputs_embeds (torch.Tensor | None): ``[B, T, D]`` embeddings in the model dtype.
            start_positions (torch.LongTensor | None): ``[B]``, the answer spans' first token indices.
            end_positions (torch.LongTensor | None): ``[B]``, their last token indices.
            **kwargs: passed to the base model and the loss.

        Returns:
            QuestionAnsweringModelOutput: ``start_logits`` and ``end_logits`` ``[B, T]`` (the model dtype),
            ``loss``, ``hidden_states`` and ``attentions``.
        """
        outputs = self._encode(input_ids, attention_mask, position_ids, inputs_embeds, kwargs)
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=outputs.hidden_states,
                                            attentions=outputs.attentions)


__all__ = [
    "AttentionGeometry",
    "AttentionMLPLayer",
    "AttnVariantBackbone",
    "AttnVariantPreTrainedModel",
    "CausalLMHeadMixin",
    "ClassificationHead",
    "FeedForward",
    "MaskedLMHeadMixin",
    "QuestionAnsweringHeadMixin",
    "SequenceClassificationHeadMixin",
    "TokenClassificationHeadMixin",
    "config_norm",
    "residual_block",
]
