"""fused_triton's Triton kernels: a FlashAttention-2 forward and its backward (preprocess, dK/dV, dQ).

Definitions (shared by all four kernels):

* **Key ranges.** Every mask gives query row i a contiguous range of visible keys [lo(i), hi(i)):
  ``none`` [0, Sk); causal hi = i + 1 + offset (offset 0 top-left, Sk − Sq bottom-right); a sliding window
  of W keys lo = i + offset − W + 1 (always bottom-right); ``padding`` hi ≤ lengths[b]; documents
  lo ≥ doc_start(i), hi ≤ doc_end(i) (per-token tables). lo and hi never decrease down the rows, and the
  dual holds for keys: key j is seen by rows [rlo(j), rhi(j)) (``_key_ranges``), also non-decreasing.
* **Blocks.** A program's rows see the union [lo(first row), hi(last row)) and *every* row sees
  [lo(last row), hi(first row)). Blocks inside the latter run without any element mask; blocks in the
  union but outside it are masked element-wise; blocks outside the union are skipped, so causal does
  about half the work and a window's work is ∝ W, not S. The dK/dV kernel does the same over query
  blocks with the key-side ranges.
* **Scores**, in log2 units: s = q·kᵀ · scale · log2(e). Without a score modifier the scale is applied
  in one FMA with the row maximum (``exp2(qk·c − m)``). Softcap: s ← cap·tanh(s/cap) before the mask;
  ALiBi: s ← s − slope_h·|i + (Sk − Sq) − j|.
* **Forward** (online softmax): running row max m, denominator l, fp32 accumulator; writes O and the
  row log-sum-exp LSE = m + log2(l) (fp32, log2 units; +inf for a row that sees no key, whose O is 0).
* **Backward** (FlashAttention-2): Δ_i = Σ_d dO∘O (preprocess); P = exp2(s − LSE) recomputed per tile;
  dV = Pᵀ·dO, dS = P∘(dO·Vᵀ − Δ), dK = dSᵀ·Q·c, dQ = dS·K·c (c = scale, times 1 − tanh² under softcap).
  dK/dV: one program per (batch·kv head, key block) loops over the query heads of its GQA group and
  their query blocks, so the group's sum needs no atomics. dQ: one program per (batch·head, query block).
* **Memory.** Row and key offsets are 64-bit (``_offsets``): a strided (B, S, H, D) view passes 2^31
  elements at long S. Batch·heads is grid axis 0 (axis 1 is capped at 65535). The head dim is padded to
  BLOCK_D, a power of two ≥ 16, with loads masked on it only when ``EVEN_D`` is false.
* **Precision.** fp32 scores, statistics and accumulators; P and dS are cast to the inputs' dtype for
  the second matmuls. fp32 inputs use ``INPUT_PRECISION`` ("tf32x3" on CUDA, "ieee" in the interpreter).
  In the interpreter only, bf16 dot operands are upcast (its tl.dot mishandles bf16; triton#11584).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _offsets(index, stride):
    """index·stride in 64 bits."""
    return tl.cast(index, tl.int64) * stride


@triton.jit
def _dot(a, b, acc, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        result = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return result


@triton.jit
def _load(ptrs, first_ok, second_ok, MASK_FIRST: tl.constexpr, MASK_SECOND: tl.constexpr):
    """A tile load masked on neither, one or both of its (broadcast) axis masks; zeros where masked."""
    if MASK_FIRST and MASK_SECOND:
        return tl.load(ptrs, mask=first_ok & second_ok, other=0.0)
    elif MASK_FIRST:
        return tl.load(ptrs, mask=first_ok, other=0.0)
    elif MASK_SECOND:
        return tl.load(ptrs, mask=second_ok, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _row_ranges(rows, b, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr, PADDED: tl.constexpr, DOCS: tl.constexpr):  # fmt: skip
    """Keys [lo, hi) that query row(s) ``rows`` see (rows may be a scalar or a vector)."""
    lo = rows * 0
    hi = rows * 0 + seq_k
    if CAUSAL:
        hi = tl.minimum(hi, rows + 1 + causal_offset)
    if WINDOW:
        lo = tl.maximum(lo, rows + 1 + causal_offset - window)
    if PADDED:
        hi = tl.minimum(hi, length)
    if DOCS:
        at = _offsets(b, stride_doc) + rows
        lo = tl.maximum(lo, tl.load(DocStart + at))
        hi = tl.minimum(hi, tl.load(DocEnd + at))
    return lo, hi


@triton.jit
def _key_ranges(keys, b, seq_q, causal_offset, window, DocStart, DocEnd, stride_doc,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOCS: tl.constexpr):  # fmt: skip
    """Query rows [lo, hi) that see key(s) ``keys`` (below the padding length: callers clamp to it)."""
    lo = keys * 0
    hi = keys * 0 + seq_q
    if CAUSAL:
        lo = tl.maximum(lo, keys - causal_offset)
    if WINDOW:
        hi = tl.minimum(hi, keys - causal_offset + window)
    if DOCS:
        at = _offsets(b, stride_doc) + keys
        lo = tl.maximum(lo, tl.load(DocStart + at))
        hi = tl.minimum(hi, tl.load(DocEnd + at))
    return lo, hi


@triton.jit
def _block_bounds(lo_first, hi_first, lo_last, hi_last, whole, BLOCK: tl.constexpr):
    """(start, full_start, full_end, end) of the blocks to visit along one axis: masked blocks in
    [start, full_start) and [full_end, end), unmasked ones in [full_start, full_end). ``whole`` is false
    when the program's own block is partial (then every visited block is masked)."""
    start = (tl.maximum(lo_first, 0) // BLOCK) * BLOCK
    end = tl.maximum(hi_last, start)
    full_start = ((tl.maximum(lo_last, 0) + BLOCK - 1) // BLOCK) * BLOCK
    full_end = (hi_first // BLOCK) * BLOCK
    none_full = (full_end <= full_start) | (whole == 0)
    full_start = tl.where(none_full, start, full_start)
    full_end = tl.where(none_full, start, full_end)
    return start, full_start, full_end, end


@triton.jit
def _tanh(x):
    t = tl.math.exp2(tl.abs(x) * (-2.0 * LOG2E))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit
def _scores(qk, rows, keys, sm_scale, qk_scale, softcap, slope, alibi_offset,
            SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):  # fmt: skip
    """(s, c, dmod): the log2-unit scores are s·c; dmod = d(modified score)/d(scaled score) (softcap).
    One return at the end: the compiler wants a single return type per specialisation."""
    if SOFTCAP or ALIBI:
        s = qk * sm_scale
        dmod = 1.0
        if SOFTCAP:
            t = _tanh(s / softcap)
            s = softcap * t
            dmod = 1.0 - t * t
        if ALIBI:
            s = s - slope * tl.abs(rows + alibi_offset - keys).to(tl.float32)
        s = s * LOG2E
        c = 1.0
    else:
        s = qk
        c = qk_scale
        dmod = 1.0
    return s, c, dmod


@triton.jit
def _attend(acc, m_i, l_i, q, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, key_hi, d_ok,
            stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
            MASKED: tl.constexpr, EVEN_D: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
            INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """One block of keys into a forward tile's running (acc, m, l). Masked blocks load only keys in
    [key_lo, key_hi) (some row of the tile sees them) and hide keys outside each row's [lo, hi)."""
    keys = start_n + offs_n  # (BLOCK_N,)
    key_ok = (keys >= key_lo) & (keys < key_hi)
    k_t = _load(k_base + _offsets(start_n, stride_kn), d_ok[:, None], key_ok[None, :], not EVEN_D, MASKED)
    qk = _dot(q, k_t, None, INPUT_PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N)
    s, c, _ = _scores(qk, rows[:, None], keys[None, :], sm_scale, qk_scale, softcap, slope, alibi_offset,
                      SOFTCAP, ALIBI)  # fmt: skip
    if MASKED:
        s = tl.where((keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * c)
    m_use = m_new
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: avoid inf − inf
    p = tl.math.exp2(s * c - m_use[:, None])  # the scale and the max in one FMA
    alpha = tl.math.exp2(m_i - m_use)  # 0 on a row's first visible block (m_i = −inf)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load(v_base + _offsets(start_n, stride_vn), key_ok[:, None], d_ok[None, :], MASKED, not EVEN_D)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], INPUT_PRECISION, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _forward_kernel(
    Q, K, V, Out, Lse, Lengths, DocStart, DocEnd, Slopes, Visited,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od, stride_doc,
    sm_scale, qk_scale, softcap, heads, gqa_group, seq_q, seq_k, causal_offset, window,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr, PADDED: tl.constexpr, DOCS: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, STORE_LSE: tl.constexpr, COUNT_BLOCKS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    batch_head = tl.program_id(0)
    tile = tl.program_id(1)
    if CAUSAL:  # the last row tiles see the most keys: start them first, so the short ones fill the tail
        tile = tl.num_programs(1) - 1 - tile
    b = batch_head // heads
    h = batch_head % heads
    kv_h = h // gqa_group  # GQA: query head h reads kv head h // G
    start_m = tile * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = rows < seq_q
    length = seq_k
    if PADDED:
        length = tl.load(Lengths + b)
    slope = 0.0
    if ALIBI:
        slope = tl.load(Slopes + h)

    lo, hi = _row_ranges(tl.minimum(rows, seq_q - 1), b, seq_k, causal_offset, window, length, DocStart, DocEnd,
                         stride_doc, CAUSAL, WINDOW, PADDED, DOCS)  # fmt: skip
    lo_first, hi_first = _row_ranges(start_m, b, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc,
                                     CAUSAL, WINDOW, PADDED, DOCS)  # fmt: skip
    last_row = tl.minimum(start_m + BLOCK_M, seq_q) - 1
    lo_last, hi_last = _row_ranges(last_row, b, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc,
                                   CAUSAL, WINDOW, PADDED, DOCS)  # fmt: skip
    start, full_start, full_end, end = _block_bounds(lo_first, hi_first, lo_last, hi_last, 1, BLOCK_N)
    if COUNT_BLOCKS:  # (tests) the key blocks this tile visits, and how many of them are unmasked
        unmasked = tl.cdiv(full_end - full_start, BLOCK_N)
        visited = tl.cdiv(full_start - start, BLOCK_N) + unmasked + tl.cdiv(tl.maximum(end - full_end, 0), BLOCK_N)
        at = Visited + 2 * (_offsets(batch_head, tl.num_programs(1)) + tile)
        tl.store(at, visited)
        tl.store(at + 1, unmasked)

    q_ptrs = (Q + _offsets(b, stride_qb) + _offsets(h, stride_qh) + _offsets(rows, stride_qm)[:, None]
              + offs_d[None, :] * stride_qd)  # fmt: skip
    q = _load(q_ptrs, row_ok[:, None], d_ok[None, :], True, not EVEN_D)  # (BLOCK_M, BLOCK_D)
    k_base = (K + _offsets(b, stride_kb) + _offsets(kv_h, stride_kh) + _offsets(offs_n, stride_kn)[None, :]
              + offs_d[:, None] * stride_kd)  # fmt: skip
    v_base = (V + _offsets(b, stride_vb) + _offsets(kv_h, stride_vh) + _offsets(offs_n, stride_vn)[:, None]
              + offs_d[None, :] * stride_vd)  # fmt: skip

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    key_lo = tl.maximum(lo_first, 0)
    alibi_offset = seq_k - seq_q
    for start_n in range(start, full_start, BLOCK_N):  # leading boundary blocks (windows, documents)
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, hi_last, d_ok,
            stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
            True, EVEN_D, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
        )  # fmt: skip
    for start_n in range(full_start, full_end, BLOCK_N):  # blocks every row sees in full: no mask
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, hi_last, d_ok,
            stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
            False, EVEN_D, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
        )  # fmt: skip
    for start_n in range(full_end, end, BLOCK_N):  # trailing boundary blocks; blocks past `end` skipped
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, hi_last, d_ok,
            stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
            True, EVEN_D, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
        )  # fmt: skip

    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]  # rows that saw no key: acc = 0, so zeros
    o_ptrs = (Out + _offsets(b, stride_ob) + _offsets(h, stride_oh) + _offsets(rows, stride_om)[:, None]
              + offs_d[None, :] * stride_od)  # fmt: skip
    if EVEN_D:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if STORE_LSE:  # (B·H, Sq) fp32, log2 units; +inf where no key is seen, so that P = 2^(s − LSE) = 0
        lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("inf"))
        tl.store(Lse + _offsets(batch_head, seq_q) + rows, lse, mask=row_ok)


@triton.jit
def _preprocess_kernel(
    Out, DOut, Delta, stride_ob, stride_oh, stride_om, stride_od, stride_gb, stride_gh, stride_gm, stride_gd,
    heads, seq_q, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Δ_i = Σ_d dO[i, d]·O[i, d] in fp32, per (batch·head, row block)."""
    batch_head = tl.program_id(0)
    b, h = batch_head // heads, batch_head % heads
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows < seq_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(Out + _offsets(b, stride_ob) + _offsets(h, stride_oh) + _offsets(rows, stride_om)[:, None]
                + offs_d[None, :] * stride_od, mask=ok, other=0.0)  # fmt: skip
    do = tl.load(DOut + _offsets(b, stride_gb) + _offsets(h, stride_gh) + _offsets(rows, stride_gm)[:, None]
                 + offs_d[None, :] * stride_gd, mask=ok, other=0.0)  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + _offsets(batch_head, seq_q) + rows, delta, mask=rows < seq_q)


@triton.jit
def _dkdv_block(dk, dv, k, v, q_base, do_base, Lse, Delta, start_m, offs_m, keys, d_ok, b, seq_q, seq_k,
                causal_offset, window, length, DocStart, DocEnd, stride_doc, stride_qm, stride_gm,
                sm_scale, qk_scale, softcap, slope, alibi_offset,
                MASKED: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                PADDED: tl.constexpr, DOCS: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
                INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """One block of query rows into a key block's dK, dV (tiles transposed: keys × rows)."""
    rows = start_m + offs_m  # (BLOCK_M,)
    row_ok = rows < seq_q
    q_t = _load(q_base + _offsets(rows, stride_qm)[None, :], d_ok[:, None], row_ok[None, :], not EVEN_D, MASKED)
    do = _load(do_base + _offsets(rows, stride_gm)[:, None], row_ok[:, None], d_ok[None, :], MASKED, not EVEN_D)
    if MASKED:
        lse = tl.load(Lse + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(Delta + rows, mask=row_ok, other=0.0)
    else:
        lse = tl.load(Lse + rows)
        delta = tl.load(Delta + rows)
    qk_t = _dot(k, q_t, None, INPUT_PRECISION, UPCAST)  # (BLOCK_N, BLOCK_M)
    s_t, c, dmod = _scores(qk_t, rows[None, :], keys[:, None], sm_scale, qk_scale, softcap, slope, alibi_offset,
                           SOFTCAP, ALIBI)  # fmt: skip
    p_t = tl.math.exp2(s_t * c - lse[None, :])
    if MASKED:
        lo, hi = _row_ranges(tl.minimum(rows, seq_q - 1), b, seq_k, causal_offset, window, length, DocStart,
                             DocEnd, stride_doc, CAUSAL, WINDOW, PADDED, DOCS)  # fmt: skip
        visible = (keys[:, None] >= lo[None, :]) & (keys[:, None] < hi[None, :]) & row_ok[None, :]
        p_t = tl.where(visible, p_t, 0.0)
    dv = _dot(p_t.to(do.dtype), do, dv, INPUT_PRECISION, UPCAST)
    dp_t = _dot(v, tl.trans(do), None, INPUT_PRECISION, UPCAST)  # (BLOCK_N, BLOCK_M)
    ds_t = p_t * (dp_t - delta[None, :]) * dmod
    dk = _dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, INPUT_PRECISION, UPCAST)
    return dk, dv


@triton.jit
def _dkdv_kernel(
    Q, K, V, DOut, Lse, Delta, DK, DV, Lengths, DocStart, DocEnd, Slopes,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_gb, stride_gh, stride_gm, stride_gd,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd, stride_dvb, stride_dvh, stride_dvn, stride_dvd, stride_doc,
    sm_scale, qk_scale, softcap, heads, kv_heads, gqa_group, seq_q, seq_k, causal_offset, window,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr, PADDED: tl.constexpr, DOCS: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    batch_head = tl.program_id(0)  # batch · kv head
    b = batch_head // kv_heads
    kv_h = batch_head % kv_heads
    start_n = tl.program_id(1) * BLOCK_N
    keys = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    length = seq_k
    if PADDED:
        length = tl.load(Lengths + b)
    key_end = tl.minimum(length, seq_k)  # keys at or past it are seen by no row
    key_ok = keys < key_end

    last_key = tl.minimum(start_n + BLOCK_N, key_end) - 1
    lo_first, hi_first = _key_ranges(tl.minimum(start_n, seq_k - 1), b, seq_q, causal_offset, window, DocStart,
                                     DocEnd, stride_doc, CAUSAL, WINDOW, DOCS)  # fmt: skip
    lo_last, hi_last = _key_ranges(tl.maximum(last_key, 0), b, seq_q, causal_offset, window, DocStart, DocEnd,
                                   stride_doc, CAUSAL, WINDOW, DOCS)  # fmt: skip
    hi_last = tl.where(start_n < key_end, hi_last, 0)  # a block wholly past the length: nothing to visit
    whole = start_n + BLOCK_N <= key_end
    start, full_start, full_end, end = _block_bounds(lo_first, hi_first, lo_last, hi_last, whole, BLOCK_M)

    k_ptrs = (K + _offsets(b, stride_kb) + _offsets(kv_h, stride_kh) + _offsets(keys, stride_kn)[:, None]
              + offs_d[None, :] * stride_kd)  # fmt: skip
    v_ptrs = (V + _offsets(b, stride_vb) + _offsets(kv_h, stride_vh) + _offsets(keys, stride_vn)[:, None]
              + offs_d[None, :] * stride_vd)  # fmt: skip
    k = _load(k_ptrs, key_ok[:, None], d_ok[None, :], True, not EVEN_D)  # (BLOCK_N, BLOCK_D)
    v = _load(v_ptrs, key_ok[:, None], d_ok[None, :], True, not EVEN_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    alibi_offset = seq_k - seq_q
    for g in range(0, gqa_group):  # the query heads of this kv head: dK, dV summed over the group
        h = kv_h * gqa_group + g
        slope = 0.0
        if ALIBI:
            slope = tl.load(Slopes + h)
        q_base = Q + _offsets(b, stride_qb) + _offsets(h, stride_qh) + offs_d[:, None] * stride_qd
        do_base = DOut + _offsets(b, stride_gb) + _offsets(h, stride_gh) + offs_d[None, :] * stride_gd
        row_stats = _offsets(b * heads + h, seq_q)
        for start_m in range(start, full_start, BLOCK_M):
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_base, do_base, Lse + row_stats, Delta + row_stats, start_m, offs_m, keys, d_ok,
                b, seq_q, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc, stride_qm, stride_gm,
                sm_scale, qk_scale, softcap, slope, alibi_offset,
                True, EVEN_D, CAUSAL, WINDOW, PADDED, DOCS, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
            )  # fmt: skip
        for start_m in range(full_start, full_end, BLOCK_M):
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_base, do_base, Lse + row_stats, Delta + row_stats, start_m, offs_m, keys, d_ok,
                b, seq_q, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc, stride_qm, stride_gm,
                sm_scale, qk_scale, softcap, slope, alibi_offset,
                False, EVEN_D, CAUSAL, WINDOW, PADDED, DOCS, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
            )  # fmt: skip
        for start_m in range(full_end, end, BLOCK_M):
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_base, do_base, Lse + row_stats, Delta + row_stats, start_m, offs_m, keys, d_ok,
                b, seq_q, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc, stride_qm, stride_gm,
                sm_scale, qk_scale, softcap, slope, alibi_offset,
                True, EVEN_D, CAUSAL, WINDOW, PADDED, DOCS, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
            )  # fmt: skip

    store_ok = (keys < seq_k)[:, None] & d_ok[None, :]
    dk_ptrs = (DK + _offsets(b, stride_dkb) + _offsets(kv_h, stride_dkh) + _offsets(keys, stride_dkn)[:, None]
               + offs_d[None, :] * stride_dkd)  # fmt: skip
    dv_ptrs = (DV + _offsets(b, stride_dvb) + _offsets(kv_h, stride_dvh) + _offsets(keys, stride_dvn)[:, None]
               + offs_d[None, :] * stride_dvd)  # fmt: skip
    tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=store_ok)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=store_ok)


@triton.jit
def _dq_block(dq, q, do, lse, delta, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, key_hi, d_ok,
              stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
              MASKED: tl.constexpr, EVEN_D: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr,
              INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """One block of keys into a query tile's dQ."""
    keys = start_n + offs_n
    key_ok = (keys >= key_lo) & (keys < key_hi)
    k = _load(k_base + _offsets(start_n, stride_kn), key_ok[:, None], d_ok[None, :], MASKED, not EVEN_D)
    v_t = _load(v_base + _offsets(start_n, stride_vn), d_ok[:, None], key_ok[None, :], not EVEN_D, MASKED)
    qk = _dot(q, tl.trans(k), None, INPUT_PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N)
    s, c, dmod = _scores(qk, rows[:, None], keys[None, :], sm_scale, qk_scale, softcap, slope, alibi_offset,
                         SOFTCAP, ALIBI)  # fmt: skip
    p = tl.math.exp2(s * c - lse[:, None])
    if MASKED:
        p = tl.where((keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None]), p, 0.0)
    dp = _dot(do, v_t, None, INPUT_PRECISION, UPCAST)
    ds = p * (dp - delta[:, None]) * dmod
    return _dot(ds.to(k.dtype), k, dq, INPUT_PRECISION, UPCAST)


@triton.jit
def _dq_kernel(
    Q, K, V, DOut, Lse, Delta, DQ, Lengths, DocStart, DocEnd, Slopes,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_gb, stride_gh, stride_gm, stride_gd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd, stride_doc,
    sm_scale, qk_scale, softcap, heads, gqa_group, seq_q, seq_k, causal_offset, window,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr, PADDED: tl.constexpr, DOCS: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    batch_head = tl.program_id(0)
    tile = tl.program_id(1)
    if CAUSAL:
        tile = tl.num_programs(1) - 1 - tile
    b = batch_head // heads
    h = batch_head % heads
    kv_h = h // gqa_group
    start_m = tile * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = rows < seq_q
    length = seq_k
    if PADDED:
        length = tl.load(Lengths + b)
    slope = 0.0
    if ALIBI:
        slope = tl.load(Slopes + h)
    lo, hi = _row_ranges(tl.minimum(rows, seq_q - 1), b, seq_k, causal_offset, window, length, DocStart, DocEnd,
                         stride_doc, CAUSAL, WINDOW, PADDED, DOCS)  # fmt: skip
    lo_first, hi_first = _row_ranges(start_m, b, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc,
                                     CAUSAL, WINDOW, PADDED, DOCS)  # fmt: skip
    last_row = tl.minimum(start_m + BLOCK_M, seq_q) - 1
    lo_last, hi_last = _row_ranges(last_row, b, seq_k, causal_offset, window, length, DocStart, DocEnd, stride_doc,
                                   CAUSAL, WINDOW, PADDED, DOCS)  # fmt: skip
    start, full_start, full_end, end = _block_bounds(lo_first, hi_first, lo_last, hi_last, 1, BLOCK_N)

    q = _load(Q + _offsets(b, stride_qb) + _offsets(h, stride_qh) + _offsets(rows, stride_qm)[:, None]
              + offs_d[None, :] * stride_qd, row_ok[:, None], d_ok[None, :], True, not EVEN_D)  # fmt: skip
    do = _load(DOut + _offsets(b, stride_gb) + _offsets(h, stride_gh) + _offsets(rows, stride_gm)[:, None]
               + offs_d[None, :] * stride_gd, row_ok[:, None], d_ok[None, :], True, not EVEN_D)  # fmt: skip
    row_stats = _offsets(batch_head, seq_q) + rows
    lse = tl.load(Lse + row_stats, mask=row_ok, other=float("inf"))
    delta = tl.load(Delta + row_stats, mask=row_ok, other=0.0)
    k_base = (K + _offsets(b, stride_kb) + _offsets(kv_h, stride_kh) + _offsets(offs_n, stride_kn)[:, None]
              + offs_d[None, :] * stride_kd)  # fmt: skip
    v_base = (V + _offsets(b, stride_vb) + _offsets(kv_h, stride_vh) + _offsets(offs_n, stride_vn)[None, :]
              + offs_d[:, None] * stride_vd)  # fmt: skip
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    key_lo = tl.maximum(lo_first, 0)
    alibi_offset = seq_k - seq_q
    for start_n in range(start, full_start, BLOCK_N):
        dq = _dq_block(
            dq, q, do, lse, delta, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, hi_last, d_ok,
            stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
            True, EVEN_D, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
        )  # fmt: skip
    for start_n in range(full_start, full_end, BLOCK_N):
        dq = _dq_block(
            dq, q, do, lse, delta, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, hi_last, d_ok,
            stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
            False, EVEN_D, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
        )  # fmt: skip
    for start_n in range(full_end, end, BLOCK_N):
        dq = _dq_block(
            dq, q, do, lse, delta, k_base, v_base, start_n, offs_n, rows, lo, hi, key_lo, hi_last, d_ok,
            stride_kn, stride_vn, sm_scale, qk_scale, softcap, slope, alibi_offset,
            True, EVEN_D, SOFTCAP, ALIBI, INPUT_PRECISION, UPCAST,
        )  # fmt: skip
    dq_ptrs = (DQ + _offsets(b, stride_dqb) + _offsets(h, stride_dqh) + _offsets(rows, stride_dqm)[:, None]
               + offs_d[None, :] * stride_dqd)  # fmt: skip
    tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


__all__ = ["LOG2E", "_dkdv_kernel", "_dq_kernel", "_forward_kernel", "_offsets", "_preprocess_kernel"]
