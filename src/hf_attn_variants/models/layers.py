"""Building blocks shared by the three families.

Rotary position embeddings, the norms, masks, the per-row key count nᵢ, the entropy-invariant factor, a
softmax that never returns NaN, and pruned-head bookkeeping.

Computations that must not overflow in fp16/bf16 (norms, logits, softmax, RoPE angles) run in
``compute_dtype(x.dtype)``: at least float32, float64 stays float64.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

NORM_TYPES = ("layernorm", "rmsnorm", "scalenorm")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The compute dtype for inputs of ``dtype``: ``torch.promote_types(dtype, float32)`` (never lower).

    Args:
        dtype (torch.dtype): the inputs' dtype.

    Returns:
        torch.dtype: float32 for half precision and float32, float64 for float64.
    """
    return torch.promote_types(dtype, torch.float32)


def widest_dtype(device: torch.device) -> torch.dtype:
    """The widest float on ``device``, for sums that must not round.

    float64, or float32 on Apple's MPS, which has no float64 (a float64 tensor there raises ``TypeError``).

    Args:
        device (torch.device): where the sum is taken.

    Returns:
        torch.dtype: float64, or float32 on ``mps``.
    """
    return torch.float32 if device.type == "mps" else torch.float64


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in ``compute_dtype(tensor.dtype)``: fp16/bf16 → float32, float32/float64 unchanged.

    Args:
        tensor (torch.Tensor): any shape, a floating dtype.

    Returns:
        torch.Tensor: the same shape, in the compute dtype.
    """
    return tensor.to(compute_dtype(tensor.dtype))


# --------------------------------------------------------------------------------------------------
# Rotary position embedding
# --------------------------------------------------------------------------------------------------
class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021, "RoFormer", arXiv:2104.09864).

    Position p rotates the pair (x_j, x_{j+d/2}) by the angle p·θ_j with θ_j = base^(-2j/d), so that
    ⟨R_m q, R_n k⟩ depends on m − n only. The frequencies are recomputed on the fly (a d/2-vector),
    which keeps the module free of buffers that meta-device construction would leave uninitialised.

    Args:
        dim (int): d, the rotated width (even).
        base (float): the RoPE base (``rope_theta``).
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        """Check that ``dim`` is even and keep the base; see the class docstring for the arguments."""
        super().__init__()
        if dim % 2 != 0:
            raise ValueError(f"RotaryEmbedding needs an even dimension, got dim={dim}.")
        self.dim = dim
        self.base = float(base)

    def inv_freq(self, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """θ_j = base^(-2j/d) for j = 0 … d/2 − 1, in ``dtype``.

        Args:
            device (torch.device): where to build the frequencies.
            dtype (torch.dtype): their dtype.

        Returns:
            torch.Tensor: ``[d/2]``, ``dtype``.
        """
        exponent = torch.arange(0, self.dim, 2, device=device, dtype=dtype) / self.dim
        return 1.0 / (self.base**exponent)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(cos, sin)`` of the rotation angles of ``position_ids``.

        Angles are computed in ``compute_dtype(dtype)`` (float32 for half precision, float64 for float64).

        Args:
            position_ids (torch.Tensor): ``[B, T]`` integer positions.
            dtype (torch.dtype): the dtype of the returned tables (the model dtype).

        Returns:
            tuple[torch.Tensor, torch.Tensor]: ``cos`` and ``sin``, each ``[B, T, d]`` in ``dtype``.
        """
        angle_dtype = compute_dtype(dtype)
        freqs = position_ids.to(angle_dtype)[..., None] * self.inv_freq(position_ids.device, angle_dtype)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def extra_repr(self) -> str:
        """The module's line in ``print(model)``: its dimension and base."""
        return f"dim={self.dim}, base={self.base}"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x₁, x₂) ↦ (−x₂, x₁) on the two halves of the last dimension.

    Args:
        x (torch.Tensor): ``[..., d]`` with d even, any dtype.

    Returns:
        torch.Tensor: ``[..., d]``, the same dtype.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` by the angles whose ``cos``/``sin`` ``RotaryEmbedding`` returned.

    x ↦ x·cos + rotate_half(x)·sin (RoFormer, eq. 34, in the half-split layout Transformers uses).

    Args:
        x (torch.Tensor): ``[B, H, T, d]`` queries or keys (H = 1 for GAU's single head).
        cos (torch.Tensor): ``[B, T, d]``, x's dtype.
        sin (torch.Tensor): ``[B, T, d]``, x's dtype.

    Returns:
        torch.Tensor: ``[B, H, T, d]``, the rotated ``x``.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def default_position_ids(batch_size: int, seq_length: int, past_length: int | torch.Tensor,
                         device: torch.device) -> torch.Tensor:
    """Positions ``past_length … past_length + seq_length − 1`` for every row.

    Args:
        batch_size (int): B.
        seq_length (int): T, the new tokens.
        past_length (int | torch.Tensor): the tokens already cached (a scalar tensor while compiling).
        device (torch.device): where to build the positions.

    Returns:
        torch.Tensor: ``[B, T]`` int64 (an expanded view of one row).
    """
    positions = torch.arange(seq_length, device=device) + past_length
    return positions.unsqueeze(0).expand(batch_size, -1)


# --------------------------------------------------------------------------------------------------
# Norms
# --------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + ε) · g.

    With ``elementwise_affine=False`` there is no gain g (GAU-α's parameter-free RMSNorm).
    Computed in at least float32 and cast back, so fp16/bf16 inputs do not overflow in x².

    Args:
        hidden_size (int): d, the normalised width.
        eps (float): ε.
        elementwise_affine (bool): whether the gain g (``weight``, ``[d]``, initialised to 1) exists.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        """Create the gain; the arguments are described in the class docstring."""
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size)) if elementwise_affine else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension.

        Args:
            hidden_states (torch.Tensor): ``[..., d]``, the model dtype.

        Returns:
            torch.Tensor: ``[..., d]``, the input's dtype.
        """
        dtype = hidden_states.dtype
        x = upcast(hidden_states)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            x = x * self.weight.to(x.dtype)
        return x.to(dtype)

    def extra_repr(self) -> str:
        """The module's line in ``print(model)``: width, ε and whether it has a gain."""
        return f"{self.hidden_size}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears"): y = g · x / max(‖x‖, ε).

    The single gain is stored as ``weight`` (initialised to 1) and used as g = weight · √d, which is
    the paper's initialisation g = √d while keeping the stored parameter at the usual norm value 1.

    Args:
        hidden_size (int): d, the normalised width.
        eps (float): ε, the smallest norm divided by.
        elementwise_affine (bool): whether the gain (``weight``, ``[1]``) is learned; without it g = √d.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        """Create the gain; the arguments are described in the class docstring."""
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(1)) if elementwise_affine else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Scale the last dimension to norm g.

        Args:
            hidden_states (torch.Tensor): ``[..., d]``, the model dtype.

        Returns:
            torch.Tensor: ``[..., d]``, the input's dtype.
        """
        dtype = hidden_states.dtype
        x = upcast(hidden_states)
        norm = x.norm(dim=-1, keepdim=True).clamp(min=self.eps)
        gain = math.sqrt(self.hidden_size) * (self.weight.to(x.dtype) if self.weight is not None else 1.0)
        return (x * (gain / norm)).to(dtype)

    def extra_repr(self) -> str:
        """The module's line in ``print(model)``: width, ε and whether it has a gain."""
        return f"{self.hidden_size}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` (Ba et al. 2016) computed in at least float32 for fp16/bf16 inputs."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension.

        Args:
            hidden_states (torch.Tensor): ``[..., d]``, the model dtype.

        Returns:
            torch.Tensor: ``[..., d]``, the input's dtype.
        """
        dtype = hidden_states.dtype
        x = upcast(hidden_states)
        weight = self.weight.to(x.dtype) if self.weight is not None else None
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        out = F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)
        return out.to(dtype)


def build_norm(norm_type: str, hidden_size: int, eps: float, elementwise_affine: bool = True) -> nn.Module:
    """Return the norm named ``norm_type`` (one of ``NORM_TYPES``).

    Args:
        norm_type (str): ``"layernorm"``, ``"rmsnorm"`` or ``"scalenorm"``.
        hidden_size (int): d, the normalised width.
        eps (float): ε.
        elementwise_affine (bool): whether the norm has learned parameters.

    Returns:
        nn.Module: the norm.
    """
    if norm_type == "layernorm":
        return LayerNorm(hidden_size, eps=eps, elementwise_affine=elementwise_affine)
    if norm_type == "rmsnorm":
        return RMSNorm(hidden_size, eps=eps, elementwise_affine=elementwise_affine)
    if norm_type == "scalenorm":
        return ScaleNorm(hidden_size, eps=eps, elementwise_affine=elementwise_affine)
    raise ValueError(f"norm_type must be one of {NORM_TYPES}, got {norm_type!r}.")


# --------------------------------------------------------------------------------------------------
# Masks and the per-row key count nᵢ
# --------------------------------------------------------------------------------------------------
def _query_positions(query_length: int, query_offset: int | torch.Tensor,
                     device: torch.device) -> torch.Tensor:
    return torch.arange(query_length, device=device) + query_offset


def packed_document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """dₜ: the document of token t in rows packing several documents.

    A packing pipeline numbers every document from 0 without a mask: a document starts at column 0 and
    wherever the position does not increase, dₜ = Σ_{t′ ≤ t} [p_{t′} ≤ p_{t′−1}]. O(n).

    Args:
        position_ids (torch.Tensor): ``[B, T]`` integer positions p.

    Returns:
        torch.Tensor: ``[B, T]`` int64, the documents numbered from 0 in each row.
    """
    restarts = (position_ids[:, 1:] <= position_ids[:, :-1]).long()
    return F.pad(restarts.cumsum(-1), (1, 0))


def document_lengths(document_ids: torch.Tensor) -> torch.Tensor:
    """|d(t)|: the token count of token t's document, for ``packed_document_ids``'s dₜ.

    Counts per document with one ``scatter_add`` (document indices are < n), read back per token: O(n).

    Args:
        document_ids (torch.Tensor): ``[B, T]`` int64 dₜ.

    Returns:
        torch.Tensor: ``[B, T]`` int64.
    """
    sizes = torch.zeros_like(document_ids).scatter_add_(-1, document_ids, torch.ones_like(document_ids))
    return sizes.gather(-1, document_ids)


def leading_padding(keep: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64: each row's padding before its first token in a ``[B, T]`` mask (nonzero = token)."""
    return (keep.long().cumsum(-1) == 0).sum(-1)


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """Token t's index in its document, t − s(t) (s(t) = that document's first column).

    What the same token's column is when its document is run alone, whatever the positions say; O(n).

    Args:
        document_ids (torch.Tensor): ``[B, T]`` int64 dₜ.

    Returns:
        torch.Tensor: ``[B, T]`` int64.
    """
    columns = torch.arange(document_ids.shape[-1], device=document_ids.device)
    starts = F.pad(document_ids[:, 1:] != document_ids[:, :-1], (1, 0), value=True)
    return columns - torch.where(starts, columns, 0).cummax(-1).values


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """[d(i) = d(j)]: ``True`` where query i and key j share a document.

    The block-diagonal mask of packed rows (Transformers' ``packed_sequence_mask_function``, materialised).

    Args:
        document_ids (torch.Tensor): ``[B, T]`` int64 dₜ.

    Returns:
        torch.Tensor: ``[B, 1, T, T]`` bool.
    """
    return (document_ids[:, :, None] == document_ids[:, None, :]).unsqueeze(1)


def visible_keys(mask: torch.Tensor) -> torch.Tensor:
    """A prepared mask as booleans, ``True`` where a key is visible (boolean as is; additive: 0 = visible).

    Args:
        mask (torch.Tensor): ``[B, 1, T_q, T_k]`` (any shape), bool or an additive float mask.

    Returns:
        torch.Tensor: the same shape, bool.
    """
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def check_mask_rank(attention_mask: torch.Tensor | None) -> None:
    """``ValueError`` unless the caller's ``attention_mask`` is ``None``, 2D ``[B, T_k]`` or 4D."""
    if attention_mask is not None and attention_mask.dim() not in (2, 4):
        raise ValueError("attention_mask must be 2D (batch, key_length) or 4D (batch, heads, query_length, "
                         f"key_length), got shape {tuple(attention_mask.shape)}.")


def visible_key_counts(attention_mask: torch.Tensor | None, *, batch_size: int, query_length: int,
                       key_length: int, query_offset: int | torch.Tensor = 0, causal: bool,
                       device: torch.device, dtype: torch.dtype = torch.float32,
                       position_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """nᵢ: how many keys query i may attend to in its own row.

    A causal query at position p = ``query_offset`` + i sees the non-padded keys at positions ≤ p; the 2D case
    is O(batch · key_length), no n×n tensor. The mask decides where there is one: it is what the attention
    sees (caller's positions that restart in a masked row, or count from 0 over left padding, do not change
    which keys a query sees). Without a mask, ``position_ids`` (the caller's) decide causal rows: nᵢ =
    position + 1, all that a serving engine (packed tokens, no mask) provides.
    ``document_ids`` (packed rows): a bidirectional row sees its document (``document_lengths``), a causal row
    its document up to itself (``document_positions`` + 1).

    Args:
        attention_mask (torch.Tensor | None): a 2D ``[B, T_k]`` padding mask (1 = token, cache included), a
            prepared 4D ``[B, 1, T_q, T_k]`` mask (boolean, or additive with 0 = visible) or ``None``.
        batch_size (int): B.
        query_length (int): T_q, the new tokens.
        key_length (int): T_k, the keys (cache included).
        query_offset (int | torch.Tensor): the position of the first query (the cached tokens).
        causal (bool): whether queries see only earlier keys.
        device (torch.device): where to build the counts.
        dtype (torch.dtype): their dtype.
        position_ids (torch.Tensor | None): ``[B, T_q]`` or ``[1, T_q]`` integer positions (causal rows
            without ``attention_mask`` only).
        document_ids (torch.Tensor | None): ``[B, T_q]`` int64 dₜ of packed rows.

    Returns:
        torch.Tensor: ``[B, T_q]`` in ``dtype``.
    """
    if causal and position_ids is not None and attention_mask is None:
        counts = position_ids.to(device=device, dtype=dtype) + 1
        return counts.expand(batch_size, query_length) if counts.shape[0] == 1 else counts
    if document_ids is not None:
        counts = document_positions(document_ids) + 1 if causal else document_lengths(document_ids)
        return counts.to(device=device, dtype=dtype)
    if attention_mask is not None and attention_mask.dim() == 4:
        return visible_keys(attention_mask)[:, 0].sum(-1).to(dtype)
    check_mask_rank(attention_mask)
    if attention_mask is None:
        if not causal:
            return torch.full((batch_size, query_length), float(key_length), device=device, dtype=dtype)
        positions = _query_positions(query_length, query_offset, device)
        counts = (positions + 1).clamp(max=key_length).to(dtype)
        return counts.unsqueeze(0).expand(batch_size, -1)
    keep = attention_mask[:, -key_length:].to(device=device, dtype=torch.int32)
    if not causal:
        return keep.sum(-1, keepdim=True).to(dtype).expand(-1, query_length)
    cumulative = keep.cumsum(-1)
    positions = _query_positions(query_length, query_offset, device).clamp(max=key_length - 1)
    return cumulative[:, positions].to(dtype)


def log_key_counts(key_counts: torch.Tensor, min_length: int) -> torch.Tensor:
    """log(max(nᵢ, ``min_length``)), the clamp bert4keras uses since 2023 (rows with few keys stay stable).

    Args:
        key_counts (torch.Tensor): ``[B, T]`` nᵢ, a floating dtype.
        min_length (int): the clamp.

    Returns:
        torch.Tensor: ``[B, T]``, ``key_counts``' dtype.
    """
    return key_counts.clamp(min=float(min_length)).log()


ENTROPY_INVARIANT_SCOPES = ("all", "beyond")


def entropy_invariant_factor(
    key_counts: torch.Tensor, base_length: int, min_length: int, scope: str = "all"
) -> torch.Tensor:
    """Su's entropy-invariant logit factor log(max(nᵢ, min_length)) / log(base_length).

    Multiplying q·k/√d by it is softmax(κ log n / d · QKᵀ) with κ such that it is standard attention at nᵢ =
    ``base_length``. ``scope="beyond"``: max(1, log nᵢ / log base_length), scaling only rows past the training
    length (Qwen's ``use_logn_attn``). Both logarithms are taken in the same precision (the factor is 1 at
    nᵢ = base_length), with no host-to-GPU copy.

    Args:
        key_counts (torch.Tensor): ``[B, T]`` nᵢ, a floating dtype.
        base_length (int): the training length m at which the factor is 1.
        min_length (int): the lower clamp of nᵢ (scope ``"all"``).
        scope (str): ``"all"`` or ``"beyond"``.

    Returns:
        torch.Tensor: ``[B, T]``, ``key_counts``' dtype.
    """
    log_base = torch.full((), float(base_length), device=key_counts.device, dtype=key_counts.dtype).log()
    if scope == "beyond":
        return (key_counts.clamp(min=1.0).log() / log_base).clamp(min=1.0)
    return log_key_counts(key_counts, min_length) / log_base


def boolean_attention_mask(attention_mask: torch.Tensor | None, *, batch_size: int, query_length: int,
                           key_length: int, query_offset: int | torch.Tensor = 0, causal: bool,
                           device: torch.device, document_ids: torch.Tensor | None = None
                           ) -> torch.Tensor | None:
    """A boolean mask, ``True`` where query i may see key j.

    Combines the 2D padding mask (or takes a prepared 4D mask as is) with causality, and with ``document_ids``
    (packed rows: no mask, no cache, so queries are the keys) with ``document_mask``.

    Args:
        attention_mask (torch.Tensor | None): a 2D ``[B, T_k]`` padding mask (1 = token, cache included), a
            prepared 4D ``[B, 1, T_q, T_k]`` mask (boolean, or additive with 0 = visible) or ``None``.
        batch_size (int): B.
        query_length (int): T_q, the new tokens.
        key_length (int): T_k, the keys (cache included).
        query_offset (int | torch.Tensor): the position of the first query (the cached tokens).
        causal (bool): whether queries see only earlier keys.
        device (torch.device): where to build the mask.
        document_ids (torch.Tensor | None): ``[B, T]`` int64 dₜ of packed rows.

    Returns:
        torch.Tensor | None: ``[B, 1, T_q, T_k]`` bool, or ``None`` when every key is visible to every query
        (bidirectional, no padding, one document per row).
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        return visible_keys(attention_mask)
    mask = None
    if causal:
        keys = torch.arange(key_length, device=device)
        mask = keys[None, :] <= _query_positions(query_length, query_offset, device)[:, None]
        mask = mask[None, None].expand(batch_size, 1, query_length, key_length)
    if attention_mask is not None:
        keep = attention_mask[:, -key_length:].to(device=device, dtype=torch.bool)[:, None, None, :]
        mask = keep.expand(batch_size, 1, query_length, key_length) if mask is None else mask & keep
    if document_ids is not None:
        same = document_mask(document_ids.to(device))
        mask = same if mask is None else mask & same
    return mask


def update_cache(
    cache: Any, key: torch.Tensor, value: torch.Tensor, layer_idx: int, query_offset: int | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cache.update`` for new keys/values at positions ``query_offset`` … ``query_offset`` + seq − 1.

    The positions are passed as ``cache_position``: Transformers 5.0's static cache writes exactly there
    (without them it would overwrite the prompt); later releases count the length themselves and ignore them.

    Args:
        cache (Cache): the model's cache.
        key (torch.Tensor): ``[B, H, T, D_k]``, the new keys.
        value (torch.Tensor): ``[B, H, T, D_v]``, their values.
        layer_idx (int): the layer.
        query_offset (int | torch.Tensor): the position of the first new token.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: every cached key ``[B, H, T_k, D_k]`` and value
        ``[B, H, T_k, D_v]`` of the layer (a static cache: all of its slots).
    """
    positions = torch.arange(key.shape[-2], device=key.device) + query_offset
    return cache.update(key, value, layer_idx, {"cache_position": positions})


# --------------------------------------------------------------------------------------------------
# Attention kernels
# --------------------------------------------------------------------------------------------------
def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension in at least float32, where rows with no visible key give exact zeros.

    Args:
        scores (torch.Tensor): ``[B, H, T_q, T_k]`` logits, any floating dtype.
        mask (torch.Tensor | None): broadcastable to ``scores`` (``[B, 1, T_q, T_k]``), boolean (``True`` =
            visible) or additive float (0 = visible, very negative = hidden).

    Returns:
        torch.Tensor: ``[B, H, T_q, T_k]`` probabilities in ``compute_dtype(scores.dtype)``.
    """
    scores = upcast(scores)
    if mask is None:
        return scores.softmax(-1)
    visible = visible_keys(mask)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    else:
        scores = scores + mask.to(scores.dtype)
    probs = scores.softmax(-1)
    return probs * visible.any(-1, keepdim=True)


# --------------------------------------------------------------------------------------------------
# Pruned-head bookkeeping
# --------------------------------------------------------------------------------------------------
def check_head_indices(
    heads: Iterable[int], num_heads: int, *, what: str, layer: int | None = None
) -> list[int]:
    """``sorted(heads)`` as ints, after checking that each is an integer index (``is_index``) h, 0 ≤ h < n.

    n is ``num_heads``, and no h may repeat.

    Raises ``ValueError`` naming ``what`` (the argument the heads came from) and ``layer`` if given:
    "{what}: heads [..] (of layer l) are out of range [0, num_heads)." or
    "{what}(: layer l) lists a head twice: [..].".

    Args:
        heads (Iterable[int]): head indices.
        num_heads (int): the number of heads.
        what (str): the argument the heads came from, for the message.
        layer (int | None): the layer, for the message.

    Returns:
        list[int]: the heads, sorted.
    """
    where = "" if layer is None else f" of layer {layer}"
    heads = list(heads) if isinstance(heads, Iterable) and not isinstance(heads, str) else heads
    if not isinstance(heads, list) or not all(map(is_index, heads)):
        raise ValueError(f"{what}: the heads{where} must be a list of integer indices, got {heads!r}.")
    heads = [operator.index(h) for h in heads]
    bad = [h for h in heads if not 0 <= h < num_heads]
    if bad:
        raise ValueError(f"{what}: heads {bad}{where} are out of range [0, {num_heads}).")
    if len(set(heads)) != len(heads):
        subject = what if layer is None else f"{what}: layer {layer}"
        raise ValueError(f"{subject} lists a head twice: {heads}.")
    return sorted(heads)


def is_index(value: Any) -> bool:
    """Whether ``value`` is an integer index: an int, NumPy integer or one-element integer tensor; no bool."""
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def normalize_pruned_heads(
    pruned_heads: Mapping[int | str, Iterable[int]] | None, *, num_layers: int, num_heads: int
) -> dict[int, list[int]]:
    """Validate ``{layer: [original head indices removed]}`` and return it with int keys and sorted lists.

    JSON stores the layer keys as strings; they are converted back here. Raises ``ValueError``
    naming ``pruned_heads`` for a layer or head index out of range or a repeated head.

    Args:
        pruned_heads (Mapping | None): ``{layer: [heads]}`` (layer keys int or str), or ``None``.
        num_layers (int): the number of layers.
        num_heads (int): the heads per layer before pruning.

    Returns:
        dict[int, list[int]]: the layers with pruned heads, ascending, each with its heads sorted.
    """
    if pruned_heads is None:
        return {}
    if not isinstance(pruned_heads, Mapping):
        raise TypeError(f"pruned_heads must be a dict {{layer: [heads]}}, got {type(pruned_heads).__name__}.")
    result: dict[int, list[int]] = {}
    for layer_key, heads in pruned_heads.items():
        if not (is_index(layer_key) or isinstance(layer_key, str) and layer_key.isdigit()):
            raise ValueError(f"pruned_heads keys must be layer indices, got {layer_key!r}.")
        layer = int(layer_key)
        if not 0 <= layer < num_layers:
            raise ValueError(f"pruned_heads: layer {layer} is out of range [0, {num_layers}).")
        heads = check_head_indices(heads, num_heads, what="pruned_heads", layer=layer)
        if heads:
            result[layer] = heads
    return dict(sorted(result.items()))


def kept_heads(pruned_heads: Mapping[int, list[int]], layer_idx: int, num_heads: int) -> list[int]:
    """Original indices of the heads that layer ``layer_idx`` still has.

    Args:
        pruned_heads (Mapping[int, list[int]]): ``{layer: [removed heads]}``.
        layer_idx (int): the layer.
        num_heads (int): the heads per layer before pruning.

    Returns:
        list[int]: the kept heads, ascending.
    """
    removed = set(pruned_heads.get(layer_idx, ()))
    return [h for h in range(num_heads) if h not in removed]


def headless_attention_output(
    hidden_states: torch.Tensor,
    output_projection: nn.Module | None,
    cache: Any,
    layer_idx: int,
    query_offset: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, weights)`` of an attention layer whose heads were all pruned.

    With a ``cache``, a one-channel placeholder is stored as the layer's keys and values (caches derive their
    length from a layer's keys), at ``query_offset`` … when given (``update_cache``), else with a plain
    ``cache.update``.

    Args:
        hidden_states (torch.Tensor): ``[B, T, D]``, the model dtype.
        output_projection (nn.Module | None): the layer's output projection, or ``None``.
        cache (Cache | None): the model's cache.
        layer_idx (int): the layer.
        query_offset (int | torch.Tensor | None): the position of the first new token, or ``None``.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: output = ``output_projection`` of the empty ``[B, T, 0]`` context
        (its bias, ``[B, T, D]``), or that context when ``output_projection`` is ``None``; weights = an empty
        ``[B, 0, T, T_k]`` tensor (T_k = the cached keys with the new ones).
    """
    batch_size, seq_length = hidden_states.shape[:2]
    key_length = seq_length
    if cache is not None:
        placeholder = hidden_states.new_ones(batch_size, 1, seq_length, 1)
        if query_offset is None:
            keys = cache.update(placeholder, placeholder, layer_idx)[0]
        else:
            keys = update_cache(cache, placeholder, placeholder, layer_idx, query_offset)[0]
        key_length = keys.shape[2]
    context = hidden_states.new_zeros(batch_size, seq_length, 0)
    output = context if output_projection is None else output_projection(context)
    return output, hidden_states.new_zeros(batch_size, 0, seq_length, key_length)


__all__ = [
    "ENTROPY_INVARIANT_SCOPES",
    "NORM_TYPES",
    "LayerNorm",
    "RMSNorm",
    "RotaryEmbedding",
    "ScaleNorm",
    "apply_rotary",
    "boolean_attention_mask",
    "build_norm",
    "check_head_indices",
    "check_mask_rank",
    "compute_dtype",
    "default_position_ids",
    "document_lengths",
    "document_mask",
    "document_positions",
    "leading_padding",
    "entropy_invariant_factor",
    "headless_attention_output",
    "kept_heads",
    "log_key_counts",
    "masked_softmax",
    "normalize_pruned_heads",
    "packed_document_ids",
    "rotate_half",
    "upcast",
    "update_cache",
    "visible_key_counts",
    "visible_keys",
]
