"""Triton kernels of relu² GAU, forward and backward: quadratic attention, and the whole FLASH op.

**Quadratic relu²** (``triton_relu2_attention``), for queries that carry every positive factor (1/√s, 1/√L):
out_i = Σ_{j visible from i} relu(q_i·k_j)² v_j in one pass over key blocks without any n×n tensor, where
"visible" combines an optional dense mask ``(batch, q, k)`` and causality (key j ≤ query i + offset; key
blocks after a query block's last query are skipped). Gradients: with r = relu(q·kᵀ) on visible pairs and
dP = dO·vᵀ, dV = (r²)ᵀ dO, dS = 2 r ⊙ dP, dQ = dS k, dK = dSᵀ q — three kernels (over query blocks for dQ;
over key blocks for dK and for dV).

**FLASH** (Hua et al. 2022, §3.2), the ``triton`` implementation of
``gau_kernels.flash_mixed_chunk_attention`` (``gau_kernels.flash_mixed_chunk_triton`` is its autograd):
out_i = Σ_{j same chunk, visible} relu(q_i·k_j)² v_j + q'_i·H_c(i), with the states H_c from the per-chunk
summaries S_c = k'_cᵀ v_c by a prefix sum over chunks.

- ``_chunk_outer_kernel``: S_c (and, in backward, q'_cᵀ dO_c) for every chunk at once, float32;
- ``_flash_forward_kernel``: one program per (value tile, token block, row);
- ``_flash_backward_query_kernel``: dq, dq' (each value tile's share added atomically in float32);
- ``_flash_backward_key_kernel``: dv, and each value tile's share of dk, dk' (with the gradient of S_c).

The backward recomputes scores, summaries and states. The FLASH kernels are ``torch.library`` custom ops
(``torch.ops.hf_attn_variants.flash_chunk_outer`` / ``flash_forward`` / ``flash_backward``) with shapes for
tracing, so ``torch.compile(fullgraph=True)`` traces through them; ``flash_triton_grids`` gives their grids.

bf16/fp16 inputs multiply on the tensor cores with float32 accumulators (float16 divides a state tile past
2¹⁵ by a power of two before its cast, ``state_scales``); float32 inputs use
``input_precision="ieee"`` (``precision``), so they match the torch kernels to float32 rounding, with smaller
tiles (``FLASH_LAUNCH_FLOAT32``). ``triton`` is optional (``pip install triton``, or the ``gpu`` extra);
``GAUConfig.gau_kernel`` selects these kernels (``"auto"``: on CUDA when triton is installed, for bf16/fp16
inputs). Under ``TRITON_INTERPRET=1`` Triton runs them on CPU
tensors, which is how the package's CPU tests check them (the interpreter's bf16 products are wrong, so bf16
is checked on a GPU).

Shapes: B batch, T tokens (T_q queries, T_k keys), S = s the key size, E = e the expansion width (values),
C = ⌈T/g⌉ chunks of g tokens. GAU has one head, so no head dimension. Every kernel offsets its row in int64
(the row's program id cast), as does the dense mask's query row: B·T_q·T_k passes 2³¹ at B = 8, T = 16k.
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
RELU2_LAUNCH = {"num_warps": 4, "num_stages": 3}
"""Warps and pipeline stages of the quadratic relu² kernels."""

if TRITON_AVAILABLE:

    @triton.jit
    def _load_tile(PTR, b, stride_b, stride_n, rows, cols, n_rows, n_cols):
        """Tile ``(rows, cols)`` of batch ``b`` of a ``[B, n, width]`` tensor; 0 outside n_rows × n_cols."""
        return tl.load(PTR + b * stride_b + rows[:, None] * stride_n + cols[None, :],
                       mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)

    @triton.jit
    def _store_tile(PTR, tile, b, stride_b, stride_n, rows, cols, n_rows, n_cols):
        """Write ``tile`` to the ``(rows, cols)`` tile of batch ``b``, inside ``n_rows × n_cols`` only."""
        tl.store(PTR + b * stride_b + rows[:, None] * stride_n + cols[None, :], tile,
                 mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))

    @triton.jit
    def _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, n_k, offset,
                      HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                      PRECISION: tl.constexpr):
        """The tile r = relu(q kᵀ) of a (query block, key block) in full float32 precision.

        It is 0 where the pair may not attend (so r² and dS = 2 r ⊙ dP vanish there).
        """
        visible = _visible(offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, n_k, offset,
                           HAS_MASK, HAS_KEY_MASK, CAUSAL)
        return tl.where(visible, tl.maximum(tl.dot(q, tl.trans(k), input_precision=PRECISION), 0.0), 0.0)

    @triton.jit
    def _visible(offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, n_k, offset,
                 HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr):
        """Which (query, key) pairs of a tile may attend: in range, causal, not masked."""
        visible = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + offset)
        if HAS_MASK:
            rows = offs_m[:, None].to(tl.int64) * stride_mq  # T_q·T_k passes 2³¹ from T ≈ 46k
            dense = tl.load(M + b * stride_mb + rows + offs_n[None, :], mask=visible, other=0)
            visible = visible & (dense != 0)
        if HAS_KEY_MASK:
            keys = tl.load(KM + b * stride_kmb + offs_n, mask=offs_n < n_k, other=0)
            visible = visible & (keys[None, :] != 0)
        return visible

    @triton.jit
    def _key_range(m_end, n_k, offset, CAUSAL: tl.constexpr):
        """[0, hi) of the keys the queries before ``m_end`` may see."""
        hi = n_k
        if CAUSAL:
            hi = tl.minimum(hi, m_end + offset)
        return 0, hi

    @triton.jit
    def _query_range(n_start, n_q, offset, CAUSAL: tl.constexpr):
        """[lo, n_q) of the queries that may see the keys from ``n_start`` on."""
        lo = 0
        if CAUSAL:
            lo = tl.maximum(lo, n_start - offset)
        return lo, n_q

    @triton.jit
    def _forward_kernel(Q, K, V, M, KM, OUT, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                        stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E, offset,
                        HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                        PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_m, pid_e, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_s = tl.arange(0, BLOCK_S)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, n_q, S)
        acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
        lo, hi = _key_range(tl.minimum((pid_m + 1) * BLOCK_M, n_q), n_k, offset, CAUSAL)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, hi,
                              offset, HAS_MASK, HAS_KEY_MASK, CAUSAL, PRECISION)
            w = (r * r).to(V.dtype.element_ty)
            v = _load_tile(V, b, stride_vb, stride_vn, offs_n, offs_e, n_k, E)
            acc += tl.dot(w, v, input_precision=PRECISION)
        _store_tile(OUT, acc.to(OUT.dtype.element_ty), b, stride_ob, stride_on, offs_m, offs_e, n_q, E)

    @triton.jit
    def _dp_tile(DO, V, b, offs_m, offs_n, stride_ob, stride_on, stride_vb, stride_vn, n_q, n_k, E,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr,
                 PRECISION: tl.constexpr):
        """The tile dP = dO vᵀ for one (query block, key block), summed over every block of e."""
        dp = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for e0 in range(0, E, BLOCK_E):
            offs_e = e0 + tl.arange(0, BLOCK_E)
            do = _load_tile(DO, b, stride_ob, stride_on, offs_m, offs_e, n_q, E)
            v = _load_tile(V, b, stride_vb, stride_vn, offs_n, offs_e, n_k, E)
            dp += tl.dot(do, tl.trans(v), input_precision=PRECISION)
        return dp

    @triton.jit
    def _grad_query_kernel(Q, K, V, M, KM, DO, DQ, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                           stride_vn, stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E,
                           offset, HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
                           CAUSAL: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_m, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_s = tl.arange(0, BLOCK_S)
        q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, n_q, S)
        dq = tl.zeros((BLOCK_M, BLOCK_S), dtype=tl.float32)
        lo, hi = _key_range(tl.minimum((pid_m + 1) * BLOCK_M, n_q), n_k, offset, CAUSAL)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, n_q, hi,
                              offset, HAS_MASK, HAS_KEY_MASK, CAUSAL, PRECISION)
            dp = _dp_tile(DO, V, b, offs_m, offs_n, stride_ob, stride_on, stride_vb, stride_vn, n_q, n_k, E,
                          BLOCK_M, BLOCK_N, BLOCK_E, PRECISION)
            ds = (2.0 * r * dp).to(K.dtype.element_ty)
            dq += tl.dot(ds, k, input_precision=PRECISION)
        _store_tile(DQ, dq.to(DQ.dtype.element_ty), b, stride_qb, stride_qn, offs_m, offs_s, n_q, S)

    @triton.jit
    def _grad_key_kernel(Q, K, V, M, KM, DO, DK, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                         stride_vn, stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E,
                         offset, HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
                         CAUSAL: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_n, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_s = tl.arange(0, BLOCK_S)
        k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
        dk = tl.zeros((BLOCK_N, BLOCK_S), dtype=tl.float32)
        lo, hi = _query_range(pid_n * BLOCK_N, n_q, offset, CAUSAL)
        for start in range(lo, hi, BLOCK_M):
            offs_m = start + tl.arange(0, BLOCK_M)
            q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, hi, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, hi, n_k,
                              offset, HAS_MASK, HAS_KEY_MASK, CAUSAL, PRECISION)
            dp = _dp_tile(DO, V, b, offs_m, offs_n, stride_ob, stride_on, stride_vb, stride_vn, hi, n_k, E,
                          BLOCK_M, BLOCK_N, BLOCK_E, PRECISION)
            ds = (2.0 * r * dp).to(Q.dtype.element_ty)
            dk += tl.dot(tl.trans(ds), q, input_precision=PRECISION)
        _store_tile(DK, dk.to(DK.dtype.element_ty), b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)

    @triton.jit
    def _grad_value_kernel(Q, K, M, KM, DO, DV, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                           stride_vn, stride_mb, stride_mq, stride_kmb, stride_ob, stride_on, n_q, n_k, S, E,
                           offset, HAS_MASK: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
                           CAUSAL: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        pid_n, pid_e, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_s = tl.arange(0, BLOCK_S)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        k = _load_tile(K, b, stride_kb, stride_kn, offs_n, offs_s, n_k, S)
        dv = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
        lo, hi = _query_range(pid_n * BLOCK_N, n_q, offset, CAUSAL)
        for start in range(lo, hi, BLOCK_M):
            offs_m = start + tl.arange(0, BLOCK_M)
            q = _load_tile(Q, b, stride_qb, stride_qn, offs_m, offs_s, hi, S)
            r = _visible_relu(q, k, offs_m, offs_n, b, M, KM, stride_mb, stride_mq, stride_kmb, hi, n_k,
                              offset, HAS_MASK, HAS_KEY_MASK, CAUSAL, PRECISION)
            w = (r * r).to(DO.dtype.element_ty)
            do = _load_tile(DO, b, stride_ob, stride_on, offs_m, offs_e, hi, E)
            dv += tl.dot(tl.trans(w), do, input_precision=PRECISION)
        _store_tile(DV, dv.to(DV.dtype.element_ty), b, stride_vb, stride_vn, offs_n, offs_e, n_k, E)


# ------------------------------------------------------------------------------------------------------------
# FLASH mixed-chunk attention: the whole op (inside and across chunks), tensor-core tiles, fp32 accumulators
# ------------------------------------------------------------------------------------------------------------
INTERPRETED = TRITON_AVAILABLE and type(_forward_kernel).__name__ == "InterpretedFunction"
"""Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when they were defined), the only
way they take CPU tensors."""

FLASH_STATE_BLOCK = 64
"""Key-size rows and value columns per program of the per-chunk outer products k'ᵀv and q'ᵀdO."""
FLASH_LAUNCH: dict[str, dict[str, int]] = {
    "chunk_outer": {"BLOCK": 64, "BLOCK_E": FLASH_STATE_BLOCK, "num_warps": 4, "num_stages": 3},
    "forward": {"BLOCK": 64, "BLOCK_E": 128, "num_warps": 8, "num_stages": 2},
    "backward_query": {"BLOCK": 64, "BLOCK_E": 128, "num_warps": 8, "num_stages": 2},
    "backward_key": {"BLOCK": 64, "BLOCK_E": 64, "num_warps": 8, "num_stages": 1},
}
"""Each FLASH kernel's launch for bf16/fp16 inputs: token rows per program at most (``BLOCK``, see
``flash_block``), value columns per program (the grid's first axis; ``chunk_outer``: key-size rows and value
columns, ``FLASH_STATE_BLOCK``), warps and pipeline stages.

Chosen by compiling each kernel for sm_90 and sm_80 without a GPU (Triton's compiler for a ``GPUTarget``) and
reading its registers, spills and shared memory: at key size 128 in bf16 none spills a register and each fits
an A100's shared memory. With 4 warps the three token-block kernels spilled; so did the key kernel's second
pipeline stage on sm_80.
"""
FLASH_LAUNCH_FLOAT32: dict[str, dict[str, int]] = {
    "chunk_outer": FLASH_LAUNCH["chunk_outer"],
    **dict.fromkeys(("forward", "backward_query", "backward_key"),
                    {"BLOCK": 32, "BLOCK_E": 32, "num_warps": 4, "num_stages": 1}),
}
"""The same for float32 inputs (IEEE products, no tensor cores: the CUDA tests, and ``gau_kernel="triton"`` on
a float32 model). Smaller tiles: at the bf16 launch the float32 kernels spill kilobytes per thread and take
ptxas much longer to compile, which the GPU check's test stage pays once per specialisation.
"""

if TRITON_AVAILABLE:

    @triton.jit
    def _tile(PTR, base, rows, cols, n_rows, n_cols, width):
        """The ``(rows, cols)`` tile at ``PTR + base`` of a row-major ``[·, width]`` matrix.

        It is 0 outside ``n_rows × n_cols``.
        """
        return tl.load(PTR + base + rows[:, None] * width + cols[None, :],
                       mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)

    @triton.jit
    def _relu_scores(q, k, offs_m, offs_n, KM, km_base, n_rows, n_keys, chunk, PRECISION: tl.constexpr,
                     HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr):
        """The tile r = relu(q kᵀ) of a (query block, key block) (fp32 accumulation).

        It is 0 wherever the pair is not in one chunk, is acausal, or the key is padding.
        """
        visible = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_keys)
        visible = visible & ((offs_n[None, :] // chunk) == (offs_m[:, None] // chunk))
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        if HAS_KEY_MASK:
            keep = tl.load(KM + km_base + offs_n, mask=offs_n < n_keys, other=0)
            visible = visible & (keep[None, :] != 0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        return tl.where(visible, tl.maximum(scores, 0.0), 0.0)

    @triton.jit
    def _relu_scores_by_key(k, q, offs_n, offs_m, KM, km_base, n_rows, n_keys, chunk, PRECISION: tl.constexpr,
                            HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr):
        """``_relu_scores`` transposed: rᵀ = relu(k qᵀ), ``(key block, query block)``, from tiles as loaded.

        The backward's key kernel multiplies rᵀ on the left, so no computed tile is transposed in registers.
        """
        visible = (offs_m[None, :] < n_rows) & (offs_n[:, None] < n_keys)
        visible = visible & ((offs_n[:, None] // chunk) == (offs_m[None, :] // chunk))
        if CAUSAL:
            visible = visible & (offs_n[:, None] <= offs_m[None, :])
        if HAS_KEY_MASK:
            keep = tl.load(KM + km_base + offs_n, mask=offs_n < n_keys, other=0)
            visible = visible & (keep[:, None] != 0)
        scores = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        return tl.where(visible, tl.maximum(scores, 0.0), 0.0)

    @triton.jit
    def _chunk_outer_kernel(A, X, OUT, T, S, E, chunk, n_chunks, PRECISION: tl.constexpr,
                            BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
        """OUT[b, c] = A[b, chunk c]ᵀ X[b, chunk c] for ``A`` ``[B, T, S]`` and ``X`` ``[B, T, E]``.

        One ``(BLOCK_S, BLOCK_E)`` tile of one chunk per program, fp32.
        """
        pid_se, c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        n_e = tl.cdiv(E, BLOCK_E)
        offs_s = (pid_se // n_e) * BLOCK_S + tl.arange(0, BLOCK_S)
        offs_e = (pid_se % n_e) * BLOCK_E + tl.arange(0, BLOCK_E)
        acc = tl.zeros((BLOCK_S, BLOCK_E), dtype=tl.float32)
        start = c * chunk
        stop = tl.minimum(start + chunk, T)
        for t0 in range(start, stop, BLOCK_T):
            offs_t = t0 + tl.arange(0, BLOCK_T)
            a = _tile(A, b * T * S, offs_t, offs_s, stop, S, S)
            x = _tile(X, b * T * E, offs_t, offs_e, stop, E, E)
            acc += tl.dot(tl.trans(a), x, input_precision=PRECISION)
        out = OUT + (b * n_chunks + c) * S * E
        tl.store(out + offs_s[:, None] * E + offs_e[None, :], acc,
                 mask=(offs_s[:, None] < S) & (offs_e[None, :] < E))

    @triton.jit
    def _rows_of_chunk(x, offs, chunk, c, WHOLE: tl.constexpr):
        """The rows of the tile ``x`` (token rows ``offs``) that lie in chunk ``c``, the others 0.

        ``WHOLE``: the chunk is a multiple of the block, so every row of a block lies in one chunk.
        """
        if WHOLE:
            return x
        return tl.where((offs // chunk == c)[:, None], x, 0.0).to(x.dtype)

    @triton.jit
    def _state_scale(h):
        """``state_scales`` for one float32 state tile: 2^⌈log₂(max|h| / 2¹⁵)⌉, and 1 where max|h| ≤ 2¹⁵."""
        peak = tl.max(tl.max(tl.abs(h), axis=1), axis=0)
        return tl.exp2(tl.maximum(tl.ceil(tl.log2(peak * (1.0 / 32768.0))), 0.0))

    @triton.jit
    def _query_block_keys(m0, T, chunk, CAUSAL: tl.constexpr, BLOCK: tl.constexpr):
        """The first and last chunk of the queries [m0, m0 + BLOCK), and the end of the keys they see."""
        first = m0 // chunk
        last = (tl.minimum(m0 + BLOCK, T) - 1) // chunk
        hi = tl.minimum((last + 1) * chunk, T)
        if CAUSAL:
            hi = tl.minimum(hi, m0 + BLOCK)
        return first, last, hi

    @triton.jit
    def _flash_forward_kernel(Q, K, QL, V, H, KM, OUT, T, S, E, chunk, n_chunks, PRECISION: tl.constexpr,
                              HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                              BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr, WHOLE: tl.constexpr,
                              SCALED: tl.constexpr):
        """The output Σ_{same chunk, visible} relu(q·k)² v + q'·H_c for one (value tile, token block, row).

        ``SCALED`` (float16): q'·H_c is σ · (q'·(H_c / σ)) with σ the state tile's ``_state_scale``.
        """
        pid_e, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        m0 = pid_m * BLOCK
        offs_m = m0 + tl.arange(0, BLOCK)
        offs_s = tl.arange(0, BLOCK_S)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        first, last, hi = _query_block_keys(m0, T, chunk, CAUSAL, BLOCK)
        q = _tile(Q, b * T * S, offs_m, offs_s, T, S, S)
        acc = tl.zeros((BLOCK, BLOCK_E), dtype=tl.float32)
        for n0 in range(first * chunk, hi, BLOCK):
            offs_n = n0 + tl.arange(0, BLOCK)
            k = _tile(K, b * T * S, offs_n, offs_s, hi, S, S)
            r = _relu_scores(q, k, offs_m, offs_n, KM, b * T, T, hi, chunk, PRECISION, HAS_KEY_MASK, CAUSAL)
            v = _tile(V, b * T * E, offs_n, offs_e, hi, E, E)
            acc += tl.dot((r * r).to(v.dtype), v, input_precision=PRECISION)
        ql = _tile(QL, b * T * S, offs_m, offs_s, T, S, S)
        for c in range(first, last + 1):  # one chunk unless the chunk is not a multiple of BLOCK
            h = _tile(H, (b * n_chunks + c) * S * E, offs_s, offs_e, S, E, E)
            rows = _rows_of_chunk(ql, offs_m, chunk, c, WHOLE)
            if SCALED:
                scale = _state_scale(h)
                acc += scale * tl.dot(rows, (h * (1.0 / scale)).to(ql.dtype), input_precision=PRECISION)
            else:
                acc += tl.dot(rows, h.to(ql.dtype), input_precision=PRECISION)
        tl.store(OUT + b * T * E + offs_m[:, None] * E + offs_e[None, :], acc.to(OUT.dtype.element_ty),
                 mask=(offs_m[:, None] < T) & (offs_e[None, :] < E))

    @triton.jit
    def _flash_backward_query_kernel(Q, K, V, H, KM, DO, DQ, DQL, T, S, E, chunk, n_chunks,
                                     PRECISION: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
                                     CAUSAL: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr,
                                     BLOCK_E: tl.constexpr, WHOLE: tl.constexpr, SCALED: tl.constexpr):
        """This value tile's share of dq = Σ_j 2 r ⊙ (dO vᵀ) k_j and of dq' = dO H_cᵀ.

        Both are added into the fp32 DQ and DQL; ``SCALED`` as in ``_flash_forward_kernel``.
        """
        pid_e, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        m0 = pid_m * BLOCK
        offs_m = m0 + tl.arange(0, BLOCK)
        offs_s = tl.arange(0, BLOCK_S)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        first, last, hi = _query_block_keys(m0, T, chunk, CAUSAL, BLOCK)
        q = _tile(Q, b * T * S, offs_m, offs_s, T, S, S)
        do = _tile(DO, b * T * E, offs_m, offs_e, T, E, E)
        dq = tl.zeros((BLOCK, BLOCK_S), dtype=tl.float32)
        for n0 in range(first * chunk, hi, BLOCK):
            offs_n = n0 + tl.arange(0, BLOCK)
            k = _tile(K, b * T * S, offs_n, offs_s, hi, S, S)
            r = _relu_scores(q, k, offs_m, offs_n, KM, b * T, T, hi, chunk, PRECISION, HAS_KEY_MASK, CAUSAL)
            v = _tile(V, b * T * E, offs_n, offs_e, hi, E, E)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            dq += tl.dot((2.0 * r * dp).to(k.dtype), k, input_precision=PRECISION)
        dql = tl.zeros((BLOCK, BLOCK_S), dtype=tl.float32)
        for c in range(first, last + 1):
            h = _tile(H, (b * n_chunks + c) * S * E, offs_s, offs_e, S, E, E)
            rows = _rows_of_chunk(do, offs_m, chunk, c, WHOLE)
            if SCALED:
                scale = _state_scale(h)
                dql += scale * tl.dot(rows, tl.trans((h * (1.0 / scale)).to(do.dtype)),
                                      input_precision=PRECISION)
            else:
                dql += tl.dot(rows, tl.trans(h.to(do.dtype)), input_precision=PRECISION)
        where = b * T * S + offs_m[:, None] * S + offs_s[None, :]
        inside = (offs_m[:, None] < T) & (offs_s[None, :] < S)
        tl.atomic_add(DQ + where, dq, mask=inside)
        tl.atomic_add(DQL + where, dql, mask=inside)

    @triton.jit
    def _flash_backward_key_kernel(Q, K, KL, V, DSUM, DSCALE, KM, DO, DK, DKL, DV, T, S, E, chunk, n_chunks,
                                   PRECISION: tl.constexpr, HAS_KEY_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                                   BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr,
                                   WHOLE: tl.constexpr, SCALED: tl.constexpr):
        """The whole dv of this value tile, and its share of dk and dk'.

        dv = Σ_i r²ᵀ dO_i + k'_j dSum_c; dk = Σ_i (2 r ⊙ dO vᵀ)ᵀ q_i and dk' = v_j dSum_cᵀ are added into the
        fp32 DK, DKL. ``SCALED`` (float16): dSum_c, a sum over the later chunks that grows with the length as
        H_c does, comes divided by σ_c (``state_scales``, in ``DSCALE``), which the products multiply back.
        """
        pid_e, pid_n, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        n0 = pid_n * BLOCK
        offs_n = n0 + tl.arange(0, BLOCK)
        offs_s = tl.arange(0, BLOCK_S)
        offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
        first = n0 // chunk
        last = (tl.minimum(n0 + BLOCK, T) - 1) // chunk
        hi = tl.minimum((last + 1) * chunk, T)
        lo = first * chunk
        if CAUSAL:
            lo = n0  # a query sees no later key
        v = _tile(V, b * T * E, offs_n, offs_e, T, E, E)
        where = b * T * S + offs_n[:, None] * S + offs_s[None, :]
        inside = (offs_n[:, None] < T) & (offs_s[None, :] < S)
        # The state part first: its tiles and dk' are dead before the loop's dk takes the registers.
        kl = _tile(KL, b * T * S, offs_n, offs_s, T, S, S)
        dv = tl.zeros((BLOCK, BLOCK_E), dtype=tl.float32)
        dkl = tl.zeros((BLOCK, BLOCK_S), dtype=tl.float32)
        for c in range(first, last + 1):
            dsum = _tile(DSUM, (b * n_chunks + c) * S * E, offs_s, offs_e, S, E, E).to(kl.dtype)
            if SCALED:
                scale = tl.load(DSCALE + b * n_chunks + c)
                dv += scale * tl.dot(_rows_of_chunk(kl, offs_n, chunk, c, WHOLE), dsum,
                                     input_precision=PRECISION)
                dkl += scale * tl.dot(_rows_of_chunk(v, offs_n, chunk, c, WHOLE), tl.trans(dsum),
                                      input_precision=PRECISION)
            else:
                dv += tl.dot(_rows_of_chunk(kl, offs_n, chunk, c, WHOLE), dsum, input_precision=PRECISION)
                dkl += tl.dot(_rows_of_chunk(v, offs_n, chunk, c, WHOLE), tl.trans(dsum),
                              input_precision=PRECISION)
        tl.atomic_add(DKL + where, dkl, mask=inside)
        k = _tile(K, b * T * S, offs_n, offs_s, T, S, S)
        dk = tl.zeros((BLOCK, BLOCK_S), dtype=tl.float32)
        for m0 in range(lo, hi, BLOCK):
            offs_m = m0 + tl.arange(0, BLOCK)
            q = _tile(Q, b * T * S, offs_m, offs_s, hi, S, S)
            do = _tile(DO, b * T * E, offs_m, offs_e, hi, E, E)
            rt = _relu_scores_by_key(k, q, offs_n, offs_m, KM, b * T, hi, T, chunk, PRECISION, HAS_KEY_MASK,
                                     CAUSAL)
            dv += tl.dot((rt * rt).to(do.dtype), do, input_precision=PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            dk += tl.dot((2.0 * rt * dpt).to(q.dtype), q, input_precision=PRECISION)
        tl.store(DV + b * T * E + offs_n[:, None] * E + offs_e[None, :], dv.to(DV.dtype.element_ty),
                 mask=(offs_n[:, None] < T) & (offs_e[None, :] < E))
        tl.atomic_add(DK + where, dk, mask=inside)


STATE_RANGE = 2.0**15
"""The largest |H_c| a float16 product reads as it is; a larger state is divided by a power of two first
(``state_scales``), so that it reads at most 2¹⁵ of float16's 65,504."""


def scales_states(dtype: torch.dtype) -> bool:
    """Whether q'·H_c in ``dtype`` divides the states by ``state_scales`` before casting them: float16 only.

    H_c = Σ k'ᵀv grows with the tokens summed and passes float16's 65,504 at long context (16k tokens of
    k'·v ≈ 9 give ±inf, then NaN). bf16 has float32's range; float32 and float64 states are not cast.

    Args:
        dtype (torch.dtype): the model's dtype, that of the products.

    Returns:
        bool: ``dtype`` is ``torch.float16``.
    """
    return dtype == torch.float16


def state_scales(states: torch.Tensor) -> torch.Tensor:
    """σ_c = 2^⌈log₂(max|H_c| / 2¹⁵)⌉ per row and chunk, from 1 to 2¹⁵ (``STATE_RANGE``).

    q'·H_c is then σ_c · (q'·(H_c / σ_c)) with |H_c / σ_c| ≤ 2¹⁵. σ_c is a power of two, so the division and
    the product are exact, and σ_c = 1 wherever max|H_c| ≤ 2¹⁵: a state float16 holds is read exactly as
    without scaling. At most 2¹⁵, σ_c is itself a float16. No gradient flows through σ_c (a constant of the
    product). The Triton kernels take the same rule per state tile (``_state_scale``) without the bound 2¹⁵,
    as they multiply σ back in float32: a state past 2³¹ is read there and is ±inf here.

    Args:
        states (torch.Tensor): ``[B, C, S, E]`` (or ``[B, 1, S, E]``) float32 H_c.

    Returns:
        torch.Tensor: ``[B, C]`` (or ``[B, 1]``) float32 σ_c.
    """
    peak = states.detach().abs().amax(dim=(-2, -1))
    # log₂ 2¹⁵ = 15 subtracted, not a division by STATE_RANGE: torch.compile(dynamic=True) makes a module's
    # float symbolic, which a custom backward (``Float16Summaries``) cannot take.
    return torch.exp2((torch.ceil(torch.log2(peak)) - 15).clamp(0.0, 15.0))


def precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s ``input_precision`` for inputs of ``dtype``.

    IEEE for float32 (the tests' exact products), else the tensor cores' own (bf16/fp16 products, fp32
    accumulators).

    Args:
        dtype (torch.dtype): the kernel inputs' dtype.

    Returns:
        str: ``"ieee"`` or ``"tf32"``.
    """
    return "ieee" if dtype in (torch.float32, torch.float64) else "tf32"


def _key_size_block(key_size: int) -> int:
    return max(16, triton.next_power_of_2(key_size))


def _launch_arguments(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
    key_mask: torch.Tensor | None, causal_offset: int | None,
) -> tuple[list[Any], dict[str, Any]]:
    """The shape/stride arguments and the constexpr switches shared by the four quadratic kernels."""
    dense = mask if mask is not None else query.new_zeros(1, 1, dtype=torch.int8)
    keys = key_mask if key_mask is not None else query.new_zeros(1, 1, dtype=torch.int8)
    strides = [query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0),
               value.stride(1), dense.stride(0), dense.stride(1), keys.stride(0)]
    sizes = [query.shape[1], key.shape[1], query.shape[2], value.shape[2], int(causal_offset or 0)]
    switches = relu2_launch_options(query.dtype, query.shape[2], has_mask=mask is not None,
                                    has_key_mask=key_mask is not None, causal=causal_offset is not None)
    return [dense, keys, strides, sizes], switches


def relu2_launch_options(dtype: torch.dtype, key_size: int, *, has_mask: bool, has_key_mask: bool,
                         causal: bool) -> dict[str, Any]:
    """The compile-time switches and launch options of the four quadratic relu² kernels.

    Args:
        dtype (torch.dtype): the inputs' dtype.
        key_size (int): s.
        has_mask (bool): a dense ``[B, T_q, T_k]`` mask is passed.
        has_key_mask (bool): a ``[B, T_k]`` key mask is passed.
        causal (bool): causal, with an offset.

    Returns:
        dict[str, Any]: the ``tl.constexpr`` arguments, ``num_warps`` and ``num_stages``.
    """
    return {"HAS_MASK": has_mask, "HAS_KEY_MASK": has_key_mask, "CAUSAL": causal,
            "PRECISION": precision(dtype), "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N,
            "BLOCK_S": _key_size_block(key_size), "BLOCK_E": BLOCK_E, **RELU2_LAUNCH}


class TritonRelu2Attention(torch.autograd.Function):
    """Σⱼ relu(qᵢ·kⱼ)² vⱼ over the visible pairs with Triton kernels (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None, causal_offset: int | None) -> torch.Tensor:
        """One pass of ``_forward_kernel`` over key blocks; arguments as ``triton_relu2_attention``.

        Args:
            ctx (Any): autograd's context.
            query (torch.Tensor): ``[B, T_q, S]``, every positive factor folded in.
            key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
            value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
            mask (torch.Tensor | None): bool (``True`` = visible) broadcastable to ``[B, T_q, T_k]``, or
                ``None``.
            causal_offset (int | None): the first query's position (causal), or ``None``.

        Returns:
            torch.Tensor: ``[B, T_q, E]``, the value's dtype.
        """
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        mask = None if mask is None else dense_mask(mask, query.shape[0], query.shape[1], key.shape[1])
        (dense, keys, strides, sizes), switches = _launch_arguments(query, key, value, mask, None,
                                                                    causal_offset)
        batch, n_q, width = query.shape[0], query.shape[1], value.shape[2]
        output = torch.empty(batch, n_q, width, device=query.device, dtype=value.dtype)
        grid = (triton.cdiv(n_q, BLOCK_M), triton.cdiv(width, BLOCK_E), batch)
        _forward_kernel[grid](query, key, value, dense, keys, output, *strides, output.stride(0),
                              output.stride(1), *sizes, **switches)
        ctx.save_for_backward(query, key, value, mask)
        ctx.causal_offset = causal_offset
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Three kernels: dQ over query blocks, dK and dV over key blocks.

        Args:
            ctx (Any): autograd's context.
            grad_output (torch.Tensor): ``[B, T_q, E]``, ∂L/∂out.

        Returns:
            tuple: ∂L/∂q ``[B, T_q, S]``, ∂L/∂k ``[B, T_k, S]``, ∂L/∂v ``[B, T_k, E]``, ``None``, ``None``.
        """
        query, key, value, mask = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        (dense, keys, strides, sizes), switches = _launch_arguments(query, key, value, mask, None,
                                                                    ctx.causal_offset)
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
        return grad_query, grad_key, grad_value, None, None


def dense_mask(mask: torch.Tensor, batch: int, n_q: int, n_k: int) -> torch.Tensor:
    """``mask`` as the int8 ``[B, T_q, T_k]`` the kernels read, its keys at unit stride.

    A mask broadcast over rows or queries (``[1, T_q, T_k]``, ``[T_q, T_k]``, ``[B, 1, T_k]``, as
    ``relu2_attention`` takes) keeps stride 0 there, so nothing is copied per row and no row reads past it.

    Args:
        mask (torch.Tensor): bool, broadcastable to ``[B, T_q, T_k]``.
        batch (int): B.
        n_q (int): T_q.
        n_k (int): T_k.

    Returns:
        torch.Tensor: ``[B, T_q, T_k]`` int8.
    """
    mask = mask.to(torch.int8)
    if mask.shape[-1] != n_k or mask.stride(-1) != 1:
        mask = mask.expand(*mask.shape[:-1], n_k).contiguous()
    return mask.expand(batch, n_q, n_k)


def triton_relu2_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
    causal_offset: int | None
) -> torch.Tensor:
    """Quadratic relu² GAU (``gau_kernels.relu2_attention`` with its factors already in ``query``) in Triton.

    Args:
        query (torch.Tensor): ``[B, T_q, S]``, every positive factor folded in; float32 or float64 (the unit
            upcasts), or bf16/fp16.
        key (torch.Tensor): ``[B, T_k, S]``, the query's dtype.
        value (torch.Tensor): ``[B, T_k, E]``, the query's dtype.
        mask (torch.Tensor | None): bool (``True`` = visible) broadcastable to ``[B, T_q, T_k]``, as for
            ``relu2_attention`` (a broadcast row or query dimension is read at stride 0), or ``None``.
        causal_offset (int | None): queries are keys ``causal_offset …`` (causal), or ``None``
            (bidirectional).

    Returns:
        torch.Tensor: ``[B, T_q, E]`` in ``value``'s dtype.
    """
    check_compilable(value)
    return TritonRelu2Attention.apply(query, key, value, mask, causal_offset)


def check_compilable(value: torch.Tensor) -> None:
    """``ValueError`` for what the kernels cannot run here.

    CPU tensors outside Triton's interpreter (Triton compiles for GPUs only), and float64 on a GPU, which
    Triton's compiler refuses (the accumulators are float32). Triton's interpreter (CPU tensors,
    ``TRITON_INTERPRET=1``) runs float64 in the quadratic kernels, as their gradient checks do; the FLASH
    kernels' summaries and states stay float32 there, so float64 FLASH is float32-accurate (the torch
    implementations are the float64 reference).

    Args:
        value (torch.Tensor): the kernels' values, in their inputs' dtype.
    """
    if value.device.type == "cpu" and not INTERPRETED:
        raise ValueError("gau_kernel='triton' runs on GPUs, and on CPU tensors only under Triton's "
                         "interpreter (TRITON_INTERPRET=1 before the import): use gau_kernel='auto' or "
                         "'torch' on a CPU.")
    if value.dtype == torch.float64 and value.device.type != "cpu":
        raise ValueError("gau_kernel='triton' takes float32, bfloat16 or float16 on a GPU, not float64 (the "
                         "kernels accumulate in float32): use gau_kernel='torch', or float32.")


# ------------------------------------------------------------------------------------------------ FLASH
def flash_launch_table(dtype: torch.dtype) -> dict[str, dict[str, int]]:
    """The FLASH kernels' launches for inputs of ``dtype``.

    ``FLASH_LAUNCH_FLOAT32`` for float32/float64, else ``FLASH_LAUNCH``.

    Args:
        dtype (torch.dtype): the inputs' dtype.

    Returns:
        dict[str, dict[str, int]]: each kernel's ``BLOCK``, ``BLOCK_E``, ``num_warps`` and ``num_stages``.
    """
    return FLASH_LAUNCH_FLOAT32 if dtype in (torch.float32, torch.float64) else FLASH_LAUNCH


def flash_block(chunk_size: int, largest: int = 64) -> int:
    """Token rows per program of a FLASH kernel.

    The largest of ``largest``, 32 and 16 that divides the chunk, else 16 (a block then straddles chunks,
    which the kernels mask).

    Args:
        chunk_size (int): g.
        largest (int): the kernel's ``BLOCK`` (``FLASH_LAUNCH``), 64 or 32.

    Returns:
        int: 64, 32 or 16.
    """
    for block in (64, 32):
        if block <= largest and chunk_size % block == 0:
            return block
    return 16


def _value_block(width: int, launch: dict[str, int]) -> int:
    """Columns per program: the launch's ``BLOCK_E``, or the power of two ≥ 16 that covers ``width``."""
    return min(launch["BLOCK_E"], max(16, 1 << (max(width, 1) - 1).bit_length()))


def flash_triton_grids(batch: int, length: int, key_size: int, width: int, chunk_size: int,
                       dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[int, int, int]]:
    """The launch grid of each FLASH kernel.

    ``chunk_outer`` (k'ᵀv per chunk, and q'ᵀdO in backward) runs over (s-tiles × e-tiles, chunks, rows);
    ``forward``, ``backward_query`` and ``backward_key`` over (e-tiles, token blocks, rows). Pure arithmetic:
    what a GPU launches shows on CPU.

    Args:
        batch (int): B, the rows.
        length (int): T, the tokens per row.
        key_size (int): s.
        width (int): e, the value width.
        chunk_size (int): g.
        dtype (torch.dtype): the inputs' dtype (``flash_launch_table``).

    Returns:
        dict[str, tuple[int, int, int]]: each kernel's grid.
    """
    chunks = -(-length // chunk_size)
    table = flash_launch_table(dtype)
    outer = table["chunk_outer"]
    tiles = -(-key_size // _value_block(key_size, outer)) * -(-width // _value_block(width, outer))
    grids = {"chunk_outer": (tiles, chunks, batch)}
    for kernel in ("forward", "backward_query", "backward_key"):
        launch = table[kernel]
        blocks = -(-length // flash_block(chunk_size, launch["BLOCK"]))
        grids[kernel] = (-(-width // _value_block(width, launch)), blocks, batch)
    return grids


def flash_launch_options(kernel: str, dtype: torch.dtype, key_size: int, width: int, chunk_size: int
                         ) -> dict[str, Any]:
    """The compile-time switches and launch options of one FLASH kernel, as its launch passes them.

    Args:
        kernel (str): ``"chunk_outer"``, ``"forward"``, ``"backward_query"`` or ``"backward_key"``.
        dtype (torch.dtype): the inputs' dtype (the model's).
        key_size (int): s.
        width (int): e, the value width.
        chunk_size (int): g.

    Returns:
        dict[str, Any]: the ``tl.constexpr`` arguments (``PRECISION``, the block sizes, ``WHOLE``, and for
        the kernels that read the states or their gradients ``SCALED``: ``scales_states``) and ``num_warps``,
        ``num_stages``; ``HAS_KEY_MASK`` and ``CAUSAL`` come from the call.
    """
    table = flash_launch_table(dtype)[kernel]
    launch = {option: table[option] for option in ("num_warps", "num_stages")}
    block = flash_block(chunk_size, table["BLOCK"])
    if kernel == "chunk_outer":
        return {"PRECISION": precision(dtype), "BLOCK_T": block, "BLOCK_S": _value_block(key_size, table),
                "BLOCK_E": _value_block(width, table), **launch}
    options = {"PRECISION": precision(dtype), "BLOCK": block, "BLOCK_S": _key_size_block(key_size),
               "BLOCK_E": _value_block(width, table), "WHOLE": chunk_size % block == 0, **launch}
    if kernel != "chunk_outer":  # the kernels that cast the states H_c or their gradients
        options["SCALED"] = scales_states(dtype)
    return options


if TRITON_AVAILABLE:

    @torch.library.custom_op("hf_attn_variants::flash_chunk_outer", mutates_args=())
    def flash_chunk_outer(a: torch.Tensor, x: torch.Tensor, chunk_size: int) -> torch.Tensor:
        """Per chunk c, ``a[:, c]ᵀ x[:, c]`` (the last chunk may be partial).

        Args:
            a (torch.Tensor): ``[B, T, S]`` contiguous (k' in forward, q' in backward), the model dtype.
            x (torch.Tensor): ``[B, T, E]`` contiguous (v in forward, dO in backward), ``a``'s dtype.
            chunk_size (int): g.

        Returns:
            torch.Tensor: ``[B, C, S, E]`` float32, C = ⌈T / g⌉.
        """
        batch, length, key_size = a.shape
        width = x.shape[-1]
        grid = flash_triton_grids(batch, length, key_size, width, chunk_size, a.dtype)["chunk_outer"]
        out = torch.empty(batch, grid[1], key_size, width, device=a.device, dtype=torch.float32)
        _chunk_outer_kernel[grid](a, x, out, length, key_size, width, chunk_size, grid[1],
                                  **flash_launch_options("chunk_outer", a.dtype, key_size, width, chunk_size))
        return out

    @torch.library.custom_op("hf_attn_variants::flash_forward", mutates_args=())
    def flash_forward(quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, value: torch.Tensor,
                      states: torch.Tensor, key_mask: torch.Tensor | None, chunk_size: int,
                      causal: bool) -> torch.Tensor:
        """FLASH's numerator from the states H_c each chunk's queries read (``flash_mixed_chunk_triton``).

        Args:
            quad_q (torch.Tensor): ``[B, T, S]`` contiguous quadratic queries (factors folded in), the model
                dtype.
            quad_k (torch.Tensor): ``[B, T, S]`` contiguous quadratic keys.
            lin_q (torch.Tensor): ``[B, T, S]`` contiguous linear queries (factors folded in).
            value (torch.Tensor): ``[B, T, E]`` contiguous.
            states (torch.Tensor): ``[B, C, S, E]`` float32 contiguous H_c (``per_chunk``).
            key_mask (torch.Tensor | None): ``[B, T]`` int8 (1 = real token), or ``None``.
            chunk_size (int): g.
            causal (bool): queries see earlier keys of their chunk only.

        Returns:
            torch.Tensor: ``[B, T, E]`` in ``value``'s dtype.
        """
        batch, length, key_size = quad_q.shape
        width = value.shape[-1]
        out = torch.empty_like(value)
        grid = flash_triton_grids(batch, length, key_size, width, chunk_size, quad_q.dtype)["forward"]
        _flash_forward_kernel[grid](
            quad_q, quad_k, lin_q, value, states, quad_q if key_mask is None else key_mask, out, length,
            key_size, width, chunk_size, states.shape[1], HAS_KEY_MASK=key_mask is not None, CAUSAL=causal,
            **flash_launch_options("forward", quad_q.dtype, key_size, width, chunk_size))
        return out

    @torch.library.custom_op("hf_attn_variants::flash_backward", mutates_args=())
    def flash_backward(quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, lin_k: torch.Tensor,
                       value: torch.Tensor, states: torch.Tensor, grad_summaries: torch.Tensor,
                       key_mask: torch.Tensor | None, grad_output: torch.Tensor, chunk_size: int,
                       causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                              torch.Tensor]:
        """Gradients ``(dq, dk, dq', dk', dv)`` of ``flash_forward`` plus the chunk summaries k'ᵀv.

        Args:
            quad_q (torch.Tensor): ``[B, T, S]`` contiguous quadratic queries, the model dtype.
            quad_k (torch.Tensor): ``[B, T, S]`` contiguous quadratic keys.
            lin_q (torch.Tensor): ``[B, T, S]`` contiguous linear queries.
            lin_k (torch.Tensor): ``[B, T, S]`` contiguous linear keys (zero at padding).
            value (torch.Tensor): ``[B, T, E]`` contiguous.
            states (torch.Tensor): ``[B, C, S, E]`` float32 H_c, recomputed.
            grad_summaries (torch.Tensor): ``[B, C, S, E]`` float32, the gradient of the summaries k'ᵀv.
            key_mask (torch.Tensor | None): ``[B, T]`` int8 (1 = real token), or ``None``.
            grad_output (torch.Tensor): ``[B, T, E]`` contiguous, ∂L/∂numerator.
            chunk_size (int): g.
            causal (bool): as for ``flash_forward``.

        Returns:
            tuple: dq, dk, dq', dk' ``[B, T, S]`` in the queries' dtype, and dv ``[B, T, E]`` in the value's.
        """
        batch, length, key_size = quad_q.shape
        width = value.shape[-1]
        grads = [torch.zeros(batch, length, key_size, device=quad_q.device, dtype=torch.float32)
                 for _ in range(4)]
        grad_value = torch.empty_like(value)
        grid = flash_triton_grids(batch, length, key_size, width, chunk_size, quad_q.dtype)
        mask = quad_q if key_mask is None else key_mask
        switches = {"HAS_KEY_MASK": key_mask is not None, "CAUSAL": causal}
        sizes = (length, key_size, width, chunk_size, states.shape[1])
        _flash_backward_query_kernel[grid["backward_query"]](
            quad_q, quad_k, value, states, mask, grad_output, grads[0], grads[2], *sizes, **switches,
            **flash_launch_options("backward_query", quad_q.dtype, key_size, width, chunk_size))
        summary_scales = grad_summaries  # read only when the launch is SCALED
        if scales_states(quad_q.dtype):  # float16: ∂L/∂S_c divided by σ_c as the states are
            summary_scales = state_scales(grad_summaries).contiguous()
            grad_summaries = (grad_summaries / summary_scales[..., None, None]).contiguous()
        _flash_backward_key_kernel[grid["backward_key"]](
            quad_q, quad_k, lin_k, value, grad_summaries, summary_scales, mask, grad_output, grads[1],
            grads[3], grad_value, *sizes, **switches,
            **flash_launch_options("backward_key", quad_q.dtype, key_size, width, chunk_size))
        dq, dk, dlq, dlk = (grad.to(quad_q.dtype) for grad in grads)
        return dq, dk, dlq, dlk, grad_value


    @flash_chunk_outer.register_fake
    def _(a: torch.Tensor, x: torch.Tensor, chunk_size: int) -> torch.Tensor:
        """Shapes for tracing (torch.compile, FakeTensor): the ops are opaque nodes of the graph."""
        chunks = -(-a.shape[1] // chunk_size)
        return a.new_empty(a.shape[0], chunks, a.shape[2], x.shape[2], dtype=torch.float32)

    @flash_forward.register_fake
    def _(quad_q: torch.Tensor, *args: Any) -> torch.Tensor:
        return torch.empty_like(args[2])  # value

    @flash_backward.register_fake
    def _(quad_q: torch.Tensor, quad_k: torch.Tensor, lin_q: torch.Tensor, lin_k: torch.Tensor,
          value: torch.Tensor, *args: Any) -> tuple[torch.Tensor, ...]:
        return (*(torch.empty_like(quad_q) for _ in range(4)), torch.empty_like(value))


__all__ = [
    "INTERPRETED",
    "FLASH_LAUNCH",
    "FLASH_LAUNCH_FLOAT32",
    "FLASH_STATE_BLOCK",
    "STATE_RANGE",
    "TRITON_AVAILABLE",
    "TritonRelu2Attention",
    "check_compilable",
    "flash_block",
    "flash_launch_options",
    "flash_launch_table",
    "flash_triton_grids",
    "precision",
    "relu2_launch_options",
    "scales_states",
    "state_scales",
    "triton_relu2_attention",
]
