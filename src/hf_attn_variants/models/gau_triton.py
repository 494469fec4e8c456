"""Triton kernels of relu² GAU: quadratic attention and FLASH's attention inside chunks, forward and backward.

Both compute, for queries that already carry every positive factor (1/√s, and 1/√L for quadratic relu²),

    out_i = Σ_{j visible from i} relu(q_i·k_j)² v_j

in one pass over key blocks without keeping any n×n tensor (the backward recomputes the scores), where
"visible" combines: an optional dense mask ``(batch, q, k)`` (the quadratic path's padding ∧ causal mask, or
any prepared mask), an optional key mask ``(batch, k)`` (FLASH's padding), causality (key j ≤ query i +
offset; key blocks after a query block's last query are skipped) and, for FLASH, the chunk (⌊i/g⌋ = ⌊j/g⌋;
only the key blocks of the query block's chunks are visited). FLASH's linear attention across chunks stays in
``gau_kernels.flash_mixed_chunk_attention`` (``intra_chunk=False``): it is two small matmuls per chunk.

Gradients: with r = relu(q·kᵀ) on visible pairs and dP = dO·vᵀ, dV = (r²)ᵀ dO, dS = 2 r ⊙ dP, dQ = dS k,
dK = dSᵀ q — three kernels (over query blocks for dQ; over key blocks for dK and for dV).

``triton`` is optional (``pip install 'hf_attn_variants[gpu]'``). ``GAUConfig.gau_kernel`` selects these
kernels (``"auto"``: on CUDA when triton is installed). Under ``TRITON_INTERPRET=1`` Triton runs them on CPU
tensors, which is how ``make test`` checks them against the torch kernels (tests/test_gau_triton.py).
Products use ``input_precision="ieee"`` (no TF32), so results match the torch kernels to float32 rounding.
"""

from __future__ import annotations

from typing import Any

import torch

try:  # optional dependency
    import triton
    import triton.language as tl
except ImportError:
    triton = None

TRITON_AVAILABLE = triton is not None
"""Whether the ``triton`` package can be imported here."""

BLOCK_M, BLOCK_N, BLOCK_E = 32, 32, 64

if TRITON_AVAILABLE:

    @triton.jit
    def _load_tile(PTR, b, stride_b, stride_n, rows, cols, n_rows, n_cols):
        """The ``(rows, cols)`` tile of batch ``b`` of a ``(batch, n, width)`` tensor, 0 outside
        ``n_rows × n_cols``."""
        return tl.load(PTR + b * stride_b + rows[:, None] * stride_n + cols[None, :],
                       mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)

    @triton.jit
    def _store_tile(PTR, tile, b, stride_b, stride_n, rows, cols, n_rows, n_cols):
        """Write ``tile`` to the ``(rows, cols)`` tile of batch ``b``, inside ``n_rows × n_cols`` only."""
        tl.store(PTR + b * stride_b + rows[:, None] * stride_n + cols[None, :], tile,
                 mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))

    @triton.jit
    def _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, n_k, offset,
                      chunk, HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                      CHUNKED: tl.constexpr):
        """r = relu(q kᵀ) of a (query block, key block) tile in full float32 precision, 0 where the pair may
        not attend (so r² and dS = 2 r ⊙ dP vanish there)."""
        visible = _visible(offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, n_k, offset,
                           chunk, HAS_MASK, HAS_KEY_MASK, CAUSAL, CHUNKED)
        return tl.where(visible, tl.maximum(tl.dot(q, tl.trans(k), input_precision="ieee"), 0.0), 0.0)

    @triton.jit
    def _visible(offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, n_k, offset, chunk,
                 HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                 CHUNKED: tl.constexpr):
        """Which (query, key) pairs of a tile may attend: in range, causal, same chunk, not masked."""
        visible = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + offset)
        if CHUNKED:
            visible = visible & ((offs_n[None, :] // chunk) == (offs_m[:, None] // chunk))
        if HAS_MASK:
            dense = tl.load(M + b * stride_mb + offs_m[:, None] * stride_mq + offs_n[None, :], mask=visible,
                            other=0)
            visible = visible & (dense != 0)
        if HAS_KEY_MASK:
            keys = tl.load(KM + b * stride_kmb + offs_n, mask=offs_n < n_k, other=0)
            visible = visible & (keys[None, :] != 0)
        return visible

    @triton.jit
    def _key_range(m_start, m_end, n_k, offset, chunk, CAUSAL: tl.constexpr, CHUNKED: tl.constexpr):
        """[lo, hi) of the keys the queries [m_start, m_end) may see."""
        lo = 0
        hi = n_k
        if CHUNKED:
            lo = (m_start // chunk) * chunk
            hi = tl.minimum(hi, ((m_end - 1) // chunk + 1) * chunk)
        if CAUSAL:
            hi = tl.minimum(hi, m_end + offset)
        return lo, hi

    @triton.jit
    def _query_range(n_start, n_end, n_q, offset, chunk, CAUSAL: tl.constexpr, CHUNKED: tl.constexpr):
        """[lo, hi) of the queries that may see the keys [n_start, n_end)."""
        lo = 0
        hi = n_q
        if CHUNKED:
            lo = (n_start // chunk) * chunk
            hi = tl.minimum(hi, ((n_end - 1) // chunk + 1) * chunk)
        if CAUSAL:
            lo = tl.maximum(lo, n_start - offset)
        return lo, hi

    @triton.jit
    def _forward_kernel(Q, K, V, M, KM, OUT, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                        stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E, offset, chunk,
                        HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                        CHUNKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_m, pid_e, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_s = tl.arange(0, BLOCK_S)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, n_q, S)
        acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=Q.dtype.element_ty)
        lo, hi = _key_range(pid_m * BLOCK_M, tl.minimum((pid_m + 1) * BLOCK_M, n_q), n_k, offset, chunk,
                            CAUSAL, CHUNKED)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, hi,
                              offset, chunk, HAS_MASK, HAS_KEY_MASK, CAUSAL, CHUNKED)
            w = (r * r).to(V.dtype.element_ty)
            v = _load_tile(V, b, stride_vb, stride_vn, offs_n, offs_e, n_k, E)
            acc += tl.dot(w, v, input_precision="ieee")
        _store_tile(OUT, acc, b, stride_ob, stride_on, offs_m, offs_e, n_q, E)

    @triton.jit
    def _dp_tile(DO, V, b, offs_m, offs_n, stride_ob, stride_on, stride_vb, stride_vn, n_q, n_k, E,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
        """dP = dO vᵀ for one (query block, key block) tile, summed over every block of e."""
        dp = tl.zeros((BLOCK_M, BLOCK_N), dtype=DO.dtype.element_ty)
        for e0 in range(0, E, BLOCK_E):
            offs_e = e0 + tl.arange(0, BLOCK_E)
            do = _load_tile(DO, b, stride_ob, stride_on, offs_m, offs_e, n_q, E)
            v = _load_tile(V, b, stride_vb, stride_vn, offs_n, offs_e, n_k, E)
            dp += tl.dot(do, tl.trans(v), input_precision="ieee")
        return dp

    @triton.jit
    def _grad_query_kernel(Q, K, V, M, KM, DO, DQ, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                           stride_vn, stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E,
                           offset, chunk, HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
                           CAUSAL: tl.constexpr, CHUNKED: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_m, b = tl.program_id(0), tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_s = tl.arange(0, BLOCK_S)
        q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, n_q, S)
        dq = tl.zeros((BLOCK_M, BLOCK_S), dtype=Q.dtype.element_ty)
        lo, hi = _key_range(pid_m * BLOCK_M, tl.minimum((pid_m + 1) * BLOCK_M, n_q), n_k, offset, chunk,
                            CAUSAL, CHUNKED)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, hi,
                              offset, chunk, HAS_MASK, HAS_KEY_MASK, CAUSAL, CHUNKED)
            dp = _dp_tile(DO, V, b, offs_m, offs_n, stride_ob, stride_on, stride_vb, stride_vn, n_q, n_k, E,
                          BLOCK_M, BLOCK_N, BLOCK_E)
            ds = (2.0 * r * dp).to(K.dtype.element_ty)
            dq += tl.dot(ds, k, input_precision="ieee")
        _store_tile(DQ, dq, b, stride_qb, stride_qn, offs_m, offs_s, n_q, S)

    @triton.jit
    def _grad_key_kernel(Q, K, V, M, KM, DO, DK, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                         stride_vn, stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E,
                         offset, chunk, HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
                         CAUSAL: tl.constexpr, CHUNKED: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_n, b = tl.program_id(0), tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_s = tl.arange(0, BLOCK_S)
        k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
        dk = tl.zeros((BLOCK_N, BLOCK_S), dtype=K.dtype.element_ty)
        lo, hi = _query_range(pid_n * BLOCK_N, tl.minimum((pid_n + 1) * BLOCK_N, n_k), n_q, offset, chunk,
                              CAUSAL, CHUNKED)
        for start in range(lo, hi, BLOCK_M):
            offs_m = start + tl.arange(0, BLOCK_M)
            q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, hi, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, hi, n_k,
                              offset, chunk, HAS_MASK, HAS_KEY_MASK, CAUSAL, CHUNKED)
            dp = _dp_tile(DO, V, b, offs_m, offs_n, stride_ob, stride_on, stride_vb, stride_vn, hi, n_k, E,
                          BLOCK_M, BLOCK_N, BLOCK_E)
            ds = (2.0 * r * dp).to(Q.dtype.element_ty)
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
        _store_tile(DK, dk, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)

    @triton.jit
    def _grad_value_kernel(Q, K, M, KM, DO, DV, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                           stride_vn, stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E,
                           offset, chunk, HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
                           CAUSAL: tl.constexpr, CHUNKED: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_n, pid_e, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_s = tl.arange(0, BLOCK_S)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
        dv = tl.zeros((BLOCK_N, BLOCK_E), dtype=DO.dtype.element_ty)
        lo, hi = _query_range(pid_n * BLOCK_N, tl.minimum((pid_n + 1) * BLOCK_N, n_k), n_q, offset, chunk,
                              CAUSAL, CHUNKED)
        for start in range(lo, hi, BLOCK_M):
            offs_m = start + tl.arange(0, BLOCK_M)
            q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, hi, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, hi, n_k,
                              offset, chunk, HAS_MASK, HAS_KEY_MASK, CAUSAL, CHUNKED)
            w = (r * r).to(DO.dtype.element_ty)
            do = _load_tile(DO, b, stride_ob, stride_on, offs_m, offs_e, hi, E)
            dv += tl.dot(tl.trans(w), do, input_precision="ieee")
        _store_tile(DV, dv, b, stride_vb, stride_vn, offs_n, offs_e, n_k, E)


def _launch_arguments(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
    key_mask: torch.Tensor | None, causal_offset: int | None, chunk: int | None,
) -> tuple[list[Any], dict[str, Any]]:
    """The shape/stride arguments and the constexpr switches shared by the four kernels."""
    dense = mask if mask is not None else query.new_zeros(1, 1, dtype=torch.int8)
    keys = key_mask if key_mask is not None else query.new_zeros(1, 1, dtype=torch.int8)
    strides = [query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0),
               value.stride(1), dense.stride(0), dense.stride(1), keys.stride(0)]
    sizes = [query.shape[1], key.shape[1], query.shape[2], value.shape[2], int(causal_offset or 0),
             int(chunk or 1)]
    switches = {
        "HAS_MASK": mask is not None, "HAS_KEY_MASK": key_mask is not None,
        "CAUSAL": causal_offset is not None, "CHUNKED": chunk is not None, "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N, "BLOCK_S": max(16, triton.next_power_of_2(query.shape[2])), "BLOCK_E": BLOCK_E,
    }
    return [dense, keys, strides, sizes], switches


class TritonRelu2Attention(torch.autograd.Function):
    """Σⱼ relu(qᵢ·kⱼ)² vⱼ over the visible pairs with Triton kernels (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, key_mask: torch.Tensor | None, causal_offset: int | None,
                chunk: int | None) -> torch.Tensor:
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        mask = None if mask is None else mask.to(torch.int8).contiguous()
        key_mask = None if key_mask is None else key_mask.to(torch.int8).contiguous()
        (dense, keys, strides, sizes), switches = _launch_arguments(query, key, value, mask, key_mask,
                                                                    causal_offset, chunk)
        batch, n_q, width = query.shape[0], query.shape[1], value.shape[2]
        output = torch.empty(batch, n_q, width, device=query.device, dtype=value.dtype)
        grid = (triton.cdiv(n_q, BLOCK_M), triton.cdiv(width, BLOCK_E), batch)
        _forward_kernel[grid](query, key, value, dense, keys, output, *strides, output.stride(0),
                              output.stride(1), *sizes, **switches)
        ctx.save_for_backward(query, key, value, mask, key_mask)
        ctx.causal_offset, ctx.chunk = causal_offset, chunk
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, mask, key_mask = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        (dense, keys, strides, sizes), switches = _launch_arguments(
            query, key, value, mask, key_mask, ctx.causal_offset, ctx.chunk
        )
        batch, n_q, n_k, width = query.shape[0], query.shape[1], key.shape[1], value.shape[2]
        grad_query, grad_key, grad_value = (torch.empty_like(query), torch.empty_like(key),
                                            torch.empty_like(value))
        common = (*strides, grad_output.stride(0), grad_output.stride(1), *sizes)
        _grad_query_kernel[(triton.cdiv(n_q, BLOCK_M), batch)](
            query, key, value, dense, keys, grad_output, grad_query, *common, **switches)
        _grad_key_kernel[(triton.cdiv(n_k, BLOCK_N), batch)](
            query, key, value, dense, keys, grad_output, grad_key, *common, **switches)
        _grad_value_kernel[(triton.cdiv(n_k, BLOCK_N), triton.cdiv(width, BLOCK_E), batch)](
            query, key, dense, keys, grad_output, grad_value, *common, **switches)
        return grad_query, grad_key, grad_value, None, None, None, None


def triton_relu2_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
    causal_offset: int | None
) -> torch.Tensor:
    """Quadratic relu² GAU (``gau_kernels.relu2_attention`` with its factors already in ``query``) in Triton.

    ``query`` ``(batch, q, s)``, ``key`` ``(batch, k, s)``, ``value`` ``(batch, k, e)``, ``mask``
    ``(batch, q, k)`` bool (``True`` = visible) or ``None``; ``causal_offset``: queries are keys
    ``causal_offset …`` (causal), or ``None`` (bidirectional).
    """
    return TritonRelu2Attention.apply(query, key, value, mask, None, causal_offset, None)


def triton_flash_intra_chunk(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor | None,
    chunk_size: int,
    causal: bool,
) -> torch.Tensor:
    """FLASH's relu² attention inside chunks of ``chunk_size`` tokens (positions 0, g, 2g, …) in Triton.

    ``query`` (scaled) and ``key`` ``(batch, T, s)``, ``value`` ``(batch, T, e)``, ``key_mask`` ``(batch, T)``
    (``True`` = real token) or ``None``. Equals the intra-chunk part of
    ``gau_kernels.flash_mixed_chunk_attention``.
    """
    return TritonRelu2Attention.apply(query, key, value, None, key_mask, 0 if causal else None, chunk_size)


__all__ = ["TRITON_AVAILABLE", "TritonRelu2Attention", "triton_flash_intra_chunk", "triton_relu2_attention"]
