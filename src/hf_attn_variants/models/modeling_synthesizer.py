"""Synthesizer attention: attention weights synthesized per head instead of (or besides) q·kᵀ.

Tay, Bahri, Metzler, Juan, Zhao & Zheng (2021), "Synthesizer: Rethinking Self-Attention in Transformer
Models" (ICML, arXiv:2005.00743). Each layer computes, per head, the logits Sᵢ(X) of its components
(dense, random, factorized dense, factorized random, vanilla q·kᵀ/√d), mixes them as
Y = softmax(Σᵢ αᵢ Sᵢ(X)) G(X) with α = softmax(mixing logits of the layer) (Σα = 1), G(X) the value
projection, and applies the output projection ``o_proj``; a feed-forward block follows as in a
standard Transformer.

Positions. The synthesized components index their l×l pattern (l = ``max_position_embeddings``) by
the position of a token *within its sequence*: position = index − (number of leading padding tokens
of the row), which is what ``cumsum(attention_mask) − 1`` (the convention of ``generate``) gives for
left-padded batches. Without leading padding this is the absolute index, as in the official
mesh-tensorflow code (R[:Lq, :Lk]; during incremental decoding the current row is gathered). So
left padding does not shift the synthesized pattern, and incremental decoding (the 2D mask covers
past + current tokens) gathers exactly the row the full forward pass uses. ``position_ids`` only
drive RoPE / absolute position embeddings — except that positions restarting inside a row without a mask mark
packed documents (``AttnVariantBackbone._packed_documents``): then each token's position is its index within
its document, and the mask keeps each document to itself, so every document gets the block of R (and of
dense(X)) that it gets alone.

Cost. ``dense``, ``factorized_dense``, ``random`` and ``factorized_random`` never compute q·kᵀ and
have no q/k projections; only ``vanilla`` does. Parameters per layer, with hidden d, H heads of size d_h,
dense width e, l = ``max_position_embeddings``, rank k and factorized widths [a, b] (biases on): value and
output projections (H·d_h·d + H·d_h) + (H·d_h·d + d) always; ``vanilla`` 2·(d·H·d_h + H·d_h); ``dense``
H·(d·e + e + e·l + l); ``factorized_dense`` H·(2·(d·e + e) + e·(a + b) + a + b); ``random`` H·l² (none
trainable when frozen); ``factorized_random`` 2·H·l·k; plus C mixing logits for C > 1 components.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, StaticCache
from transformers import GenerationMixin
from transformers.utils.import_utils import is_torchdynamo_compiling

from .configuration_synthesizer import SynthesizerConfig
from .layers import (
    apply_rotary,
    document_positions,
    headless_attention_output,
    leading_padding,
    masked_softmax,
    upcast,
    update_cache,
    visible_keys,
)
from .modeling_common import (
    AttentionGeometry,
    AttentionMLPLayer,
    AttnVariantBackbone,
    AttnVariantPreTrainedModel,
    CausalLMHeadMixin,
    MaskedLMHeadMixin,
    QuestionAnsweringHeadMixin,
    SequenceClassificationHeadMixin,
    TokenClassificationHeadMixin,
)
from .tensor_parallel import ShardedUnits

Positions = tuple[torch.Tensor, torch.Tensor]
"""(query positions ``[B, T]``, key positions ``[B, T_k]``) within each sequence, int64."""


class SynthesizerDenseBranch(nn.Module):
    """Per-head two-layer synthesizer F(x) = relu(x W₁ + b₁) W₂ + b₂ (Tay et al. 2021, eq. 1).

    Parameters carry the head as their first dimension: ``w1`` [H, D, e], ``b1`` [H, e], ``w2`` [H, e, width],
    ``b2`` [H, width].

    Args:
        num_heads (int): H, the layer's heads.
        hidden_size (int): d.
        inner_size (int): e, the hidden layer's width per head.
        width (int): the scores per query (l, or a / b of ``factorized_dense``).
    """

    def __init__(self, num_heads: int, hidden_size: int, inner_size: int, width: int) -> None:
        """Create the (uninitialised) parameters; the arguments are described in the class docstring."""
        super().__init__()
        self.width = width
        self.w1 = nn.Parameter(torch.empty(num_heads, hidden_size, inner_size))
        self.b1 = nn.Parameter(torch.empty(num_heads, inner_size))
        self.w2 = nn.Parameter(torch.empty(num_heads, inner_size, width))
        self.b2 = nn.Parameter(torch.empty(num_heads, width))

    def forward(self, hidden_states: torch.Tensor, columns: int | None = None) -> torch.Tensor:
        """The synthesized scores of every query.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            columns (int | None): compute only the first ``columns`` scores (cheaper when the sequence is
                shorter than l); ``None``: all ``width``.

        Returns:
            torch.Tensor: ``[B, H, T, width]`` (or ``[B, H, T, columns]``), the model dtype.
        """
        inner = torch.relu(torch.einsum("bnd,hde->bhne", hidden_states, self.w1) + self.b1[None, :, None, :])
        w2, b2 = (self.w2, self.b2) if columns is None else (self.w2[..., :columns], self.b2[..., :columns])
        return torch.matmul(inner, w2.unsqueeze(0)) + b2[None, :, None, :]

    def extra_repr(self) -> str:
        """The module's line in ``print(model)``: heads, widths."""
        heads, hidden, inner = self.w1.shape
        return f"heads={heads}, hidden={hidden}, inner={inner}, width={self.width}"


class SynthesizerAttention(ShardedUnits, nn.Module):
    """Multi-head Synthesizer attention with a learnable mixture of components.

    Logits per head h, query position i, key position j (positions as in the module docstring):

    - dense: ``dense(X)[i, j]`` — row i synthesized from Xᵢ alone (W₂ has l outputs, sliced to the keys).
    - random: ``R[h, i, j]`` (learned, or a frozen buffer with ``random_trainable=False``).
    - factorized_dense: ``A(Xᵢ)[j // b] · B(Xᵢ)[j mod b]`` = vec(A ⊗ B)[j]: branch A of width a is
      repeated element-wise b times and branch B of width b is tiled a times (the paper's tiling
      functions H_A, H_B). Tiling *both* would make the row periodic in j with period lcm(a, b).
    - factorized_random: ``(R₁ R₂ᵀ)[h, i, j]`` with R₁, R₂ of shape (l, k) per head.
    - vanilla: ``q_i · k_j / √d`` (RoPE on q and k with ``position_embedding_type="rope"``).

    mixed = Σ αᵢ Sᵢ with α = softmax(``mixing_logits``); probs = masked_softmax(mixed, padding ∧ causal);
    output = o_proj(concat_h(probs_h v_h)). Projections are named q/k/v/o_proj; q_proj and k_proj exist
    only when ``"vanilla"`` is a component. Every per-head tensor has the head as its first dimension,
    and ``prune_heads_`` removes heads in place. Tensor parallelism gives each rank whole heads with all of
    their tensors (``tp_sharded_parameters``; a fixed random buffer stays whole and is sliced per rank).

    Args:
        config (SynthesizerConfig): the model's config.
        layer_idx (int): the layer's index (its kept heads and cache layer).
    """

    # Present only for the components that use them (else None); the component table calls them.
    q_proj: Any
    k_proj: Any
    dense: Any
    factor_a: Any
    factor_b: Any
    random_matrix: Any
    random_left: Any
    random_right: Any

    def __init__(self, config: SynthesizerConfig, layer_idx: int) -> None:
        """Build the projections and the components' tensors; the arguments are in the class docstring."""
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.components = tuple(config.synthesizer_components)
        self.num_heads = len(config.layer_heads(layer_idx))
        self.head_dim = config.head_dim
        self.max_length = config.max_position_embeddings
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob  # read once: see GatedAttentionUnit
        self.is_causal = config.is_decoder
        hidden, inner, heads, length = (
            config.hidden_size,
            self.num_heads * self.head_dim,
            self.num_heads,
            self.max_length,
        )
        bias = config.use_bias
        vanilla = "vanilla" in self.components
        self.q_proj = nn.Linear(hidden, inner, bias=bias) if vanilla else None
        self.k_proj = nn.Linear(hidden, inner, bias=bias) if vanilla else None
        self.v_proj = nn.Linear(hidden, inner, bias=bias)
        self.o_proj = nn.Linear(inner, hidden, bias=bias)
        dense_inner = config.resolved_dense_hidden_size
        self.dense = (
            SynthesizerDenseBranch(heads, hidden, dense_inner, length) if "dense" in self.components else None
        )
        self.factor_a = self.factor_b = None
        if "factorized_dense" in self.components:
            a, b = config.resolved_factorized_dense_shape
            self.factor_a = SynthesizerDenseBranch(heads, hidden, dense_inner, a)
            self.factor_b = SynthesizerDenseBranch(heads, hidden, dense_inner, b)
        rank = config.factorized_random_rank
        self._register_random("random_matrix", (heads, length, length), "random" in self.components)
        self._register_random("random_left", (heads, length, rank), "factorized_random" in self.components)
        self._register_random("random_right", (heads, length, rank), "factorized_random" in self.components)
        self.mixing_logits = (
            nn.Parameter(torch.zeros(len(self.components))) if len(self.components) > 1 else None
        )
        branches = [name for name in ("dense", "factor_a", "factor_b") if getattr(self, name) is not None]
        self.tp_sharded_parameters = (
            *(f"{branch}.{name}" for branch in branches for name in ("w1", "b1", "w2", "b2")),
            *(name for name in ("random_matrix", "random_left", "random_right")
              if self._parameters.get(name) is not None),
        )
        self.tp_replicated_parameters = ("mixing_logits",) if self.mixing_logits is not None else ()
        self.tp_sharded_inputs = tuple(branches)

    def tp_units(self) -> tuple[int, str]:
        """Tensor parallelism splits the heads.

        Returns:
            tuple[int, str]: the layer's heads and their name.
        """
        return self.num_heads, "attention heads"

    def _register_random(self, name: str, shape: tuple[int, ...], used: bool) -> None:
        if not used:
            setattr(self, name, None)
        elif self.config.random_trainable:
            setattr(self, name, nn.Parameter(torch.empty(shape)))
        else:  # Fixed Random: a persistent buffer — saved with the weights, invisible to optimizers.
            self.register_buffer(name, torch.empty(shape), persistent=True)

    # ------------------------------------------------------------------------------------------ mixing
    def mixing_weights(self) -> torch.Tensor:
        """α = softmax(mixing logits), one weight per component in ``self.components`` order (Σα = 1).

        Returns:
            torch.Tensor: ``[C]``, at least float32 (``[1]`` of ones for a single component).
        """
        if self.mixing_logits is None:
            return torch.ones(1)
        return upcast(self.mixing_logits).softmax(-1)

    # ------------------------------------------------------------------------------------------ components
    @staticmethod
    def _gather_columns(scores: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Scores ``[B, H, T, l]`` → ``[B, H, T, T_k]`` at the key positions ``[B, T_k]`` of each row."""
        index = key_positions[:, None, None, :].expand(*scores.shape[:3], key_positions.shape[-1])
        return scores.gather(-1, index)

    def _dense_logits(
        self, hidden_states: torch.Tensor, query_offset: Any, key_length: int, positions: Positions | None
    ) -> torch.Tensor:
        if positions is None:
            return self.dense(hidden_states, columns=key_length)
        return self._gather_columns(self.dense(hidden_states), positions[1])

    def _factorized_dense_logits(
        self, hidden_states: torch.Tensor, query_offset: Any, key_length: int, positions: Positions | None
    ) -> torch.Tensor:
        width_b = self.factor_b.width
        if positions is None:
            # Keys 0 … key_length−1 need the first ⌈key_length/b⌉ entries of A: outer product, flatten, slice.
            a_scores = self.factor_a(hidden_states, columns=-(-key_length // width_b))
            outer = a_scores[..., :, None] * self.factor_b(hidden_states)[..., None, :]
            return outer.flatten(-2)[..., :key_length]
        keys = positions[1]
        a_scores, b_scores = self.factor_a(hidden_states), self.factor_b(hidden_states)
        return (self._gather_columns(a_scores, keys // width_b)
                * self._gather_columns(b_scores, keys % width_b))

    def _head_tensor(self, name: str) -> torch.Tensor:
        """Random tensor ``name`` for this module's heads.

        Under tensor parallelism a parameter already is the rank's shard, while a fixed (buffer) one is whole
        on every rank and sliced to its heads here.
        """
        tensor = getattr(self, name)
        return tensor[self.tp_slice(tensor.shape[0])] if name in self._buffers else tensor

    def _random_logits(
        self, hidden_states: torch.Tensor, query_offset: Any, key_length: int, positions: Positions | None
    ) -> torch.Tensor:
        matrix = self._head_tensor("random_matrix")
        if positions is None:
            return matrix[:, query_offset : query_offset + hidden_states.shape[1], :key_length].unsqueeze(0)
        queries, keys = positions
        return matrix[:, queries[:, :, None], keys[:, None, :]].transpose(0, 1)

    def _factorized_random_logits(
        self, hidden_states: torch.Tensor, query_offset: Any, key_length: int, positions: Positions | None
    ) -> torch.Tensor:
        left, right = self._head_tensor("random_left"), self._head_tensor("random_right")
        if positions is None:
            rows = left[:, query_offset : query_offset + hidden_states.shape[1]]
            return torch.matmul(rows, right[:, :key_length].transpose(-1, -2)).unsqueeze(0)
        queries, keys = positions
        return torch.matmul(left[:, queries], right[:, keys].transpose(-1, -2)).transpose(0, 1)

    def _keys_and_values(
        self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        cache: Cache | None, query_offset: int | torch.Tensor,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(vanilla logits q·kᵀ/√d or None, values)`` after the cache (if any) stored the new tokens.

        Without ``vanilla`` no key exists: the cache keeps a one-channel placeholder as keys (it derives its
        length from them; Transformers 5.0's static cache counts the non-zero ones) next to the values.
        """
        shape = (*hidden_states.shape[:2], -1, self.head_dim)  # -1: the rank's heads under tensor parallelism
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if self.q_proj is None:
            if cache is not None:
                placeholder = value.new_ones(*value.shape[:3], 1)
                value = update_cache(cache, placeholder, value, self.layer_idx, query_offset)[1]
            return None, value
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        if position_embeddings is not None:
            query, key = apply_rotary(query, *position_embeddings), apply_rotary(key, *position_embeddings)
        if cache is not None:
            key, value = update_cache(cache, key, value, self.layer_idx, query_offset)
        return torch.matmul(query, key.transpose(-1, -2)) * self.scaling, value

    def forward(self, hidden_states: torch.Tensor, geometry: AttentionGeometry,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None, synthesizer_positions: Positions | None = None,
                cache: Cache | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Mix the components' logits, softmax over the visible keys, attend to the values, project back.

        Args:
            hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
            geometry (AttentionGeometry): the call's geometry (query offset, causal mask).
            position_embeddings (tuple | None): RoPE's ``(cos, sin)``, each ``[B, T, D_h]`` (``vanilla``), or
                ``None``.
            attention_mask (torch.Tensor | None): ``[B, 1, T, T_k]`` bool (``True`` = visible, causality
                included), or ``None``.
            synthesizer_positions (Positions | None): rows ``[B, T]`` and columns ``[B, T_k]`` of the l×l
                patterns (``SynthesizerModel._positions``), or ``None`` to slice them from ``query_offset``.
            cache (Cache | None): the model's cache (new values, and keys or a placeholder, are added to it).
            **kwargs: the other layer inputs, ignored.

        Returns:
            tuple[torch.Tensor, torch.Tensor | None]: the output ``[B, T, D]`` and the probabilities
            ``[B, H, T, T_k]``, both in the model dtype.
        """
        batch_size, seq_length = hidden_states.shape[:2]
        query_offset = geometry.query_offset
        if self.num_heads == 0:
            return headless_attention_output(hidden_states, self.o_proj, cache, self.layer_idx, query_offset)
        vanilla, value = self._keys_and_values(hidden_states, position_embeddings, cache, query_offset)
        key_length = value.shape[2]
        if key_length > self.max_length:
            raise ValueError(
                f"The StaticCache's max_cache_len={key_length} exceeds max_position_embeddings="
                f"{self.max_length}, the size l of the synthesized attention matrices: build it with "
                f"max_cache_len <= {self.max_length} (generate: a prompt and max_new_tokens that fit in l)."
                if isinstance(cache, StaticCache) else
                f"Sequence length {key_length} exceeds max_position_embeddings={self.max_length}, the size l "
                "of the synthesized attention matrices."
            )
        logits = {name: SYNTHESIZED_LOGITS[name](self, hidden_states, query_offset, key_length,
                                                 synthesizer_positions)
                  for name in self.components if name != "vanilla"}
        if vanilla is not None:
            logits["vanilla"] = vanilla
        if self.mixing_logits is None:  # one component: its logits as they are
            mixed = upcast(logits[self.components[0]])
        else:
            alpha = self.mixing_weights()
            mixed = sum(alpha[i] * upcast(logits[name])  # type: ignore[assignment]
                        for i, name in enumerate(self.components))
        if attention_mask is None:
            attention_mask = geometry.causal_mask(key_length)
        probs = masked_softmax(mixed.expand(batch_size, -1, -1, -1), attention_mask).to(value.dtype)
        probs = F.dropout(probs, p=self.attention_dropout, training=self.training)
        output = torch.matmul(probs, value).transpose(1, 2).reshape(batch_size, seq_length, -1)
        return self.o_proj(output), probs

    def extra_repr(self) -> str:
        """The module's line in ``print(model)``: components, heads, head size and l."""
        return (f"components={self.components}, heads={self.num_heads}, head_dim={self.head_dim}, "
                f"l={self.max_length}")


SYNTHESIZED_LOGITS = {
    "dense": SynthesizerAttention._dense_logits,
    "random": SynthesizerAttention._random_logits,
    "factorized_dense": SynthesizerAttention._factorized_dense_logits,
    "factorized_random": SynthesizerAttention._factorized_random_logits,
}
"""Synthesized component → its logits method.

``(self, hidden_states, query_offset, key_length, positions)`` → ``[B or 1, H, T, T_k]``; ``vanilla``
(q·kᵀ/√d) comes with the keys (``_keys_and_values``).
"""


class SynthesizerLayer(AttentionMLPLayer):
    """Synthesizer attention + feed-forward block with pre- or post-norm residuals."""

    attention_class = SynthesizerAttention


class SynthesizerPreTrainedModel(AttnVariantPreTrainedModel):
    """Base class of the Synthesizer family: initialisation, output recording, mixing-weight inspection."""

    config_class = SynthesizerConfig
    config: SynthesizerConfig
    layer_class = SynthesizerLayer
    serving_limitation = (
        "the Synthesizer's attention weights are synthesized from each query token alone (dense) or learned "
        "per absolute position (random), not computed from query-key dot products over cached keys, so a "
        "paged softmax kernel cannot produce them, and vLLM has no other way to run it. Generate with "
        "Transformers instead (model.generate with its cache)."
    )
    _supports_sdpa = False

    def _init_family_weights(self, module: nn.Module) -> None:
        """Dense branches ~ N(0, initializer_range) with zero biases; R ~ N(0, σ_R); R₁, R₂ ~ N(0, √(σ_R/√k)).

        σ_R = ``random_init_std``; the factor std makes each entry of R₁R₂ᵀ (a sum of k products) have
        std σ_R, like R. Mixing logits start at 0 (α uniform, as the official two-way mixture's σ(0)).
        ``transformers.initialization`` skips tensors loaded from a checkpoint, so a frozen R is never
        re-drawn by ``from_pretrained``.
        """
        std = self.config.initializer_range
        if isinstance(module, SynthesizerDenseBranch):
            init.normal_(module.w1, mean=0.0, std=std)
            init.zeros_(module.b1)
            init.normal_(module.w2, mean=0.0, std=std)
            init.zeros_(module.b2)
        elif isinstance(module, SynthesizerAttention):
            random_std = self.config.resolved_random_init_std
            if module.random_matrix is not None:
                init.normal_(module.random_matrix, mean=0.0, std=random_std)
            if module.random_left is not None:
                factor_std = math.sqrt(random_std / math.sqrt(self.config.factorized_random_rank))
                init.normal_(module.random_left, mean=0.0, std=factor_std)
                init.normal_(module.random_right, mean=0.0, std=factor_std)
            if module.mixing_logits is not None:
                init.zeros_(module.mixing_logits)

    def mixing_weights(self) -> torch.Tensor:
        """Current α per layer, in ``config.synthesizer_components`` order; each row sums to 1.

        Returns:
            torch.Tensor: ``[num_layers, num_components]``, detached, on the CPU, at least float32.
        """
        rows = [
            m.mixing_weights().detach().cpu() for m in self.modules() if isinstance(m, SynthesizerAttention)
        ]
        if not rows:
            return torch.zeros(0, len(self.config.synthesizer_components))
        return torch.stack(rows)


class SynthesizerModel(AttnVariantBackbone, SynthesizerPreTrainedModel):
    """The bare Synthesizer encoder (bidirectional) or decoder (``config.is_decoder``)."""

    def __init__(self, config: SynthesizerConfig) -> None:
        """Build the stack, and read the patterns' length l once.

        Read here, not in forward: dynamo below torch 2.11 installs no guard on a config's attributes, so a
        model compiled after another would keep the first one's value.
        """
        super().__init__(config)
        self.max_length = config.max_position_embeddings

    def _check_inputs(
        self, input_ids: torch.Tensor | None, total_length: int, attention_mask: torch.Tensor | None
    ) -> None:
        # A static cache's counter is a tensor: traced, its slots (at most l: the attention checks) bound it.
        traced_counter = isinstance(total_length, torch.Tensor) and is_torchdynamo_compiling()
        if not traced_counter and total_length > self.max_length:
            raise ValueError(
                f"Sequence length {total_length} (past + new tokens) exceeds "
                f"max_position_embeddings={self.max_length}: the Synthesizer's l×l "
                f"attention patterns cover at most {self.max_length} positions."
            )
        super()._check_inputs(input_ids, total_length, attention_mask)

    def _attention_inputs(
        self, geometry: AttentionGeometry, hidden_states: torch.Tensor, cache: Cache | None
    ) -> dict[str, Any]:
        """The boolean mask and the positions that index the synthesized patterns.

        The mask is padding ∧ causality (∧ same document for packed rows). A packed document's tokens take
        the rows and columns of their index within the document (``document_positions``), which is where a
        lone run of the document slices R[:n, :n] and dense(X)[:, :n].
        """
        positions: Positions | None = None
        if geometry.document_ids is not None:
            within = document_positions(geometry.document_ids.to(geometry.device))
            positions = (within, within)
        else:
            positions = self._positions(geometry.attention_mask, geometry.query_offset, geometry.query_length,
                                        geometry.key_length)
        return {"attention_mask": geometry.boolean_mask(), "synthesizer_positions": positions}

    @staticmethod
    def _positions(
        attention_mask: torch.Tensor | None, query_offset: Any, query_length: int, key_length: Any
    ) -> Positions | None:
        """Positions within each sequence (index − leading padding), or None when no row has leading padding.

        ``None`` lets the components slice their matrices (row offset = ``query_offset``) instead of
        gathering. The leading padding comes from the 2D mask, or from a prepared 4D mask (what ``generate``
        passes with a static cache) as the keys hidden before the first key the last query sees; a 4D mask
        also sets the number of key slots. Traced (torch.export / ONNX, torch.compile), there is no
        data-dependent branch: gathering at offset 0 equals slicing.
        """
        if attention_mask is None:
            return None
        if attention_mask.dim() == 4:
            last_row = attention_mask[:, 0, -1, :]
            keep = visible_keys(last_row)
            key_length = keep.shape[-1]
        else:
            keep = attention_mask[:, -key_length:] != 0
        leading = leading_padding(keep)[:, None]
        if not is_torchdynamo_compiling() and not bool(leading.any()):
            return None
        keys = (torch.arange(key_length, device=keep.device)[None, :] - leading).clamp(min=0)
        if isinstance(query_offset, torch.Tensor):  # a static cache's counter: no host read to slice by it
            rows = query_offset.to(keep.device) + torch.arange(query_length, device=keep.device)
            return keys.index_select(1, rows), keys
        return keys[:, query_offset : query_offset + query_length], keys


class SynthesizerForMaskedLM(MaskedLMHeadMixin, SynthesizerPreTrainedModel):
    """``SynthesizerModel`` with a masked language-modelling head (``MaskedLMHeadMixin``)."""

    base_model_class = SynthesizerModel


class SynthesizerForCausalLM(CausalLMHeadMixin, SynthesizerPreTrainedModel, GenerationMixin):
    """``SynthesizerModel`` with a causal language-modelling head, a cache and ``generate``.

    The head is ``CausalLMHeadMixin``.
    """

    base_model_class = SynthesizerModel


class SynthesizerForSequenceClassification(SequenceClassificationHeadMixin, SynthesizerPreTrainedModel):
    """``SynthesizerModel`` with a sequence classification or regression head.

    The head is ``SequenceClassificationHeadMixin``.
    """

    base_model_class = SynthesizerModel


class SynthesizerForTokenClassification(TokenClassificationHeadMixin, SynthesizerPreTrainedModel):
    """``SynthesizerModel`` with a token classification head (``TokenClassificationHeadMixin``)."""

    base_model_class = SynthesizerModel


class SynthesizerForQuestionAnswering(QuestionAnsweringHeadMixin, SynthesizerPreTrainedModel):
    """``SynthesizerModel`` with an extractive question-answering head (``QuestionAnsweringHeadMixin``)."""

    base_model_class = SynthesizerModel


__all__ = [
    "SynthesizerAttention",
    "SynthesizerDenseBranch",
    "SynthesizerForCausalLM",
    "SynthesizerForMaskedLM",
    "SynthesizerForQuestionAnswering",
    "SynthesizerForSequenceClassification",
    "SynthesizerForTokenClassification",
    "SynthesizerLayer",
    "SynthesizerModel",
    "SynthesizerPreTrainedModel",
]
