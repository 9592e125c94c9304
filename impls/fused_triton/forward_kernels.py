"""fused_triton's forward kernels: a FlashAttention-2 forward (``_forward_kernel``, its key loop in
``_attend``) and cascade attention's shared-prefix level before it (``_prefix_kernel``). Key ranges, blocks,
scores, values, wide heads, narrowed caches, memory and precision as ``shared_kernels`` defines them.

* **Forward** (online softmax): running row max m, denominator l, fp32 accumulator; writes O and the
  row log-sum-exp LSE = m + log2(l) (fp32, log2 units; +inf for a row that sees no key, whose O is 0).
  Learned sinks (``SINKS``): the head's logit joins the denominator at the end, l ← l + 2^(sink·log2 e − m)
  with m the max over keys and sink, and LSE includes it (a row that sees no key: O 0, LSE the sink).
* **An fp8 forward** (``FP8``): q, k and v in e4m3, each with one float32 scale per (sequence, head), as
  FlashAttention-3 and cuDNN take them. Both dots run in fp8 (fp32 accumulators): q's and k's scales fold
  into the score scale, P is rounded to e4m3 for P·V (it lies in [0, 1]), v's scale multiplies the
  accumulator once at the end; the output in its own type (bf16). v comes keys-contiguous (``flash.forward``
  transposes it): Hopper's fp8 wgmma reads its B operand K-major only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnbench.impls.fused_triton.shared_kernels import (
    LOG2E,
    _bounds,
    _box,
    _dot,
    _kv_scales,
    _load,
    _offsets,
    _round_e4m3,
    _row_ranges,
    _scores,
    _tile_program,
)


@triton.jit
def _attend(
    acc,
    m_i,
    l_i,
    q,
    q_tail,
    k_base,
    k_tail_base,
    v_base,
    k_desc,
    v_desc,
    desc_b,
    desc_h,
    k_scale,
    v_scale,
    scale_block,
    start_n,
    offs_n,
    rows,
    lo,
    hi,
    key_lo,
    key_hi,
    d_ok,
    t_ok,
    dv_ok,
    stride_kn,
    stride_vn,
    sm_scale,
    qk_scale,
    softcap,
    slope,
    alibi_offset,
    MASKED: tl.constexpr,
    EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr,
    SPLIT_D: tl.constexpr,
    V_FROM_K: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    KV_SCALED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr,
):
    """One block of keys into a forward tile's running (acc, m, l). Masked blocks load only keys in
    [key_lo, key_hi) (some row of the tile sees them) and hide keys outside each row's [lo, hi). With ``TMA``
    k and v come in whole boxes through their tensor descriptors (``k_desc``, ``v_desc`` at sequence
    ``desc_b``, kv head ``desc_h``); a masked block then zeroes the value rows of keys it must not read."""
    keys = start_n + offs_n  # (BLOCK_N,)
    key_ok = (keys >= key_lo) & (keys < key_hi)
    if TMA:
        k_t = tl.trans(_box(k_desc, desc_b, desc_h, start_n))
    else:
        k_t = _load(k_base + _offsets(start_n, stride_kn), d_ok[:, None], key_ok[None, :], not EVEN_D, MASKED)
    qk = _dot(q, k_t.to(q.dtype), None, INPUT_PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N); a narrowed cache: exact
    if SPLIT_D:  # the head dim's tail channels (MLA's 64 rope channels after its 512)
        k_tail = _load(k_tail_base + _offsets(start_n, stride_kn), t_ok[:, None], key_ok[None, :], True, MASKED)
        qk = _dot(q_tail, k_tail.to(q.dtype), qk, INPUT_PRECISION, UPCAST)
    if KV_SCALED:  # q·(k·s_k)ᵀ: each key's scale on its score column
        qk = qk * _kv_scales(k_scale, keys, key_ok, scale_block, MASKED)[None, :]
    s, c, _ = _scores(
        qk, rows[:, None], keys[None, :], sm_scale, qk_scale, softcap, slope, alibi_offset, SOFTCAP, ALIBI
    )
    if MASKED:
        s = tl.where((keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * c)
    m_use = m_new
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: avoid inf − inf
    p = tl.math.exp2(s * c - m_use[:, None])  # the scale and the max in one FMA
    alpha = tl.math.exp2(m_i - m_use)  # 0 on a row's first visible block (m_i = −inf)
    l_i = l_i * alpha + tl.sum(p, 1)
    if V_FROM_K:  # v is k's first Dv channels (a latent cache): the key tile already holds them
        v = tl.trans(k_t)
        if not EVEN_DV:
            v = tl.where(dv_ok[None, :], v, tl.zeros_like(v))
    elif TMA:
        v = _box(v_desc, desc_b, desc_h, start_n)
        if MASKED:  # a key outside [key_lo, key_hi) may hold anything (NaN): p = 0 there is not enough
            v = tl.where(key_ok[:, None], v, tl.zeros_like(v))
    else:
        v = _load(v_base + _offsets(start_n, stride_vn), key_ok[:, None], dv_ok[None, :], MASKED, not EVEN_DV)
    if KV_SCALED:  # P·(v·s_v): each key's scale on its probability column
        p = p * _kv_scales(v_scale, keys, key_ok, scale_block, MASKED)[None, :]
    p_in = p.to(q.dtype)
    if UPCAST and q.dtype.is_fp8():  # an fp8 forward in the interpreter, whose own rounding to e4m3 is wrong
        p_in = _round_e4m3(p)
    acc = _dot(p_in, v.to(q.dtype), acc * alpha[:, None], INPUT_PRECISION, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _forward_kernel(
    Q,
    K,
    V,
    KDesc,
    VDesc,
    Out,
    Lse,
    Lengths,
    DocStart,
    DocEnd,
    Slopes,
    RowLo,
    RowHi,
    SeqOffsets,
    Sinks,
    KScale,
    VScale,
    QScale,
    Visited,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_doc,
    stride_rows,
    stride_ksb,
    stride_ksh,
    stride_vsb,
    stride_vsh,
    stride_qsb,
    stride_qsh,
    scale_block,
    Prev,
    PrevLse,
    key_start,
    sm_scale,
    qk_scale,
    softcap,
    heads,
    gqa_group,
    seq_q,
    seq_k,
    causal_offset,
    window,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    EVEN_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    PADDED: tl.constexpr,
    DOCS: tl.constexpr,
    RANGES: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    SINKS: tl.constexpr,
    KV_SCALED: tl.constexpr,
    FP8: tl.constexpr,
    SPLIT_D: tl.constexpr,
    BLOCK_DT: tl.constexpr,
    V_FROM_K: tl.constexpr,
    MERGE: tl.constexpr,
    STORE_LSE: tl.constexpr,
    COUNT_BLOCKS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row_tiles = tl.cdiv(seq_q, BLOCK_M)
    batch_head, tile = _tile_program(row_tiles, CAUSAL)
    b = batch_head // heads
    h = batch_head % heads
    kv_h = h // gqa_group  # GQA: query head h reads kv head h // G
    start_m = tile * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V
    row_ok = rows < seq_q
    length = seq_k
    if PADDED:
        length = tl.load(Lengths + b)
    slope = 0.0
    if ALIBI:
        slope = tl.load(Slopes + h)
    alibi_offset = seq_k - seq_q
    if RANGES:
        alibi_offset = tl.load(SeqOffsets + b)  # the sequence's own diagonal

    lo, hi = _row_ranges(
        tl.minimum(rows, seq_q - 1),
        b,
        seq_k,
        causal_offset,
        window,
        length,
        DocStart,
        DocEnd,
        stride_doc,
        RowLo,
        RowHi,
        stride_rows,
        CAUSAL,
        WINDOW,
        PADDED,
        DOCS,
        RANGES,
    )
    if MERGE:  # the suffix level of a shared prefix: keys from key_start on (the prefix kernel did the others)
        lo = tl.maximum(lo, key_start)
    start, full_start, full_end, end, key_lo, key_hi = _bounds(lo, hi, row_ok, seq_k, BLOCK_N)
    if COUNT_BLOCKS:  # (tests) the key blocks this tile visits, and how many of them are unmasked
        unmasked = tl.cdiv(full_end - full_start, BLOCK_N)
        visited = tl.cdiv(full_start - start, BLOCK_N) + unmasked + tl.cdiv(tl.maximum(end - full_end, 0), BLOCK_N)
        at = Visited + 2 * (_offsets(batch_head, row_tiles) + tile)
        tl.store(at, visited)
        tl.store(at + 1, unmasked)

    q_rows = (Q + _offsets(b, stride_qb) + _offsets(h, stride_qh) + _offsets(rows, stride_qm))[:, None]
    q = _load(q_rows + offs_d[None, :] * stride_qd, row_ok[:, None], d_ok[None, :], True, not EVEN_D)
    k_keys = (K + _offsets(b, stride_kb) + _offsets(kv_h, stride_kh) + _offsets(offs_n, stride_kn))[None, :]
    k_base = k_keys + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N) pointers of the first key block
    q_tail = q
    k_tail_base = k_base
    t_ok = d_ok
    if SPLIT_D:  # channels BLOCK_D … HEAD_DIM − 1 in a second, narrower tile
        offs_t = BLOCK_D + tl.arange(0, BLOCK_DT)
        t_ok = offs_t < HEAD_DIM
        q_tail = _load(q_rows + offs_t[None, :] * stride_qd, row_ok[:, None], t_ok[None, :], True, True)
        k_tail_base = k_keys + offs_t[:, None] * stride_kd
    v_base = (
        V
        + _offsets(b, stride_vb)
        + _offsets(kv_h, stride_vh)
        + _offsets(offs_n, stride_vn)[:, None]
        + offs_dv[None, :] * stride_vd
    )
    k_scale = KScale
    v_scale = VScale
    if KV_SCALED:  # this (sequence, kv head)'s scales, one per block of scale_block positions
        k_scale = KScale + _offsets(b, stride_ksb) + _offsets(kv_h, stride_ksh)
        v_scale = VScale + _offsets(b, stride_vsb) + _offsets(kv_h, stride_vsh)
    if FP8:  # q, k, v in e4m3, a scale each per (sequence, head): q's and k's scale the scores (v's: the output)
        qk_s = tl.load(QScale + _offsets(b, stride_qsb) + _offsets(h, stride_qsh))
        qk_s = qk_s * tl.load(KScale + _offsets(b, stride_ksb) + _offsets(kv_h, stride_ksh))
        sm_scale = sm_scale * qk_s
        qk_scale = qk_scale * qk_s

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    if MERGE:  # start from the prefix's normalised state: max = its LSE, denominator 1 (0 if it saw no key)
        stats = _offsets(batch_head, seq_q) + rows
        m_i = tl.load(PrevLse + stats, mask=row_ok, other=float("-inf"))
        l_i = tl.where(m_i > float("-inf"), 1.0, 0.0)
        acc = tl.load(
            Prev + (stats * HEAD_DIM_V)[:, None] + offs_dv[None, :], mask=row_ok[:, None] & dv_ok[None, :], other=0.0
        )
    for start_n in range(start, full_start, BLOCK_N):  # leading boundary blocks (windows, documents, chunks)
        acc, m_i, l_i = _attend(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            k_base,
            k_tail_base,
            v_base,
            KDesc,
            VDesc,
            b,
            kv_h,
            k_scale,
            v_scale,
            scale_block,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
            t_ok,
            dv_ok,
            stride_kn,
            stride_vn,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            True,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            SOFTCAP,
            ALIBI,
            KV_SCALED,
            INPUT_PRECISION,
            UPCAST,
            TMA,
        )
    for start_n in range(full_start, full_end, BLOCK_N):  # blocks every row sees in full: no mask
        acc, m_i, l_i = _attend(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            k_base,
            k_tail_base,
            v_base,
            KDesc,
            VDesc,
            b,
            kv_h,
            k_scale,
            v_scale,
            scale_block,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
            t_ok,
            dv_ok,
            stride_kn,
            stride_vn,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            False,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            SOFTCAP,
            ALIBI,
            KV_SCALED,
            INPUT_PRECISION,
            UPCAST,
            TMA,
        )
    for start_n in range(full_end, end, BLOCK_N):  # trailing boundary blocks; blocks past `end` skipped
        acc, m_i, l_i = _attend(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            k_base,
            k_tail_base,
            v_base,
            KDesc,
            VDesc,
            b,
            kv_h,
            k_scale,
            v_scale,
            scale_block,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
            t_ok,
            dv_ok,
            stride_kn,
            stride_vn,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            True,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            SOFTCAP,
            ALIBI,
            KV_SCALED,
            INPUT_PRECISION,
            UPCAST,
            TMA,
        )

    seen = l_i > 0.0
    if FP8:  # P·(v·s_v) = (P·v)·s_v
        acc = acc * tl.load(VScale + _offsets(b, stride_vsb) + _offsets(kv_h, stride_vsh))
    if SINKS:  # the sink's logit joins the denominator: l·2^(m − m') + 2^(sink − m'), m' = max(m, sink)
        sink = tl.load(Sinks + h).to(tl.float32) * LOG2E
        m_all = tl.maximum(m_i, sink)
        alpha = tl.math.exp2(m_i - m_all)  # 0 for a row that saw no key (m_i = −inf)
        l_all = l_i * alpha + tl.math.exp2(sink - m_all)
        out = acc * (alpha / l_all)[:, None]  # rows that saw no key: acc = 0, so zeros
        lse = m_all + tl.math.log2(l_all)  # finite: the sink's share, also for a row that sees no key
    else:
        out = acc / tl.where(seen, l_i, 1.0)[:, None]  # rows that saw no key: acc = 0, so zeros
        # +inf where no key is seen, so that P = 2^(s − LSE) = 0 in the backward
        lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("inf"))
    o_ptrs = (
        Out
        + _offsets(b, stride_ob)
        + _offsets(h, stride_oh)
        + _offsets(rows, stride_om)[:, None]
        + offs_dv[None, :] * stride_od
    )
    if EVEN_DV:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    if STORE_LSE:  # (B·H, Sq) fp32, log2 units
        tl.store(Lse + _offsets(batch_head, seq_q) + rows, lse, mask=row_ok)


@triton.jit
def _prefix_kernel(
    Q,
    K,
    V,
    Prev,
    PrevLse,
    Lengths,
    DocStart,
    DocEnd,
    Slopes,
    RowLo,
    RowHi,
    SeqOffsets,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_doc,
    stride_rows,
    sm_scale,
    qk_scale,
    softcap,
    heads,
    gqa_group,
    batch,
    seq_q,
    seq_k,
    prefix,
    causal_offset,
    window,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    EVEN_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    PADDED: tl.constexpr,
    DOCS: tl.constexpr,
    RANGES: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    SPLIT_D: tl.constexpr,
    BLOCK_DT: tl.constexpr,
    V_FROM_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The first level of cascade attention over a shared prefix: one program per (kv head, block of rows)
    takes its rows from *every* sequence — the B·G·Sq query rows of the kv head's query heads, flattened
    as (b, g, i) — against the prefix's one copy (K, V: (Hkv, P, ·), sequence 0's first P positions), so
    the prefix is read for the whole batch at once, not per sequence. Each row's mask range is cut to
    [0, P). It writes each row's normalised output (fp32, (B, Hq, Sq, Dv) contiguous) and log-sum-exp (log2
    units, −inf for a row that sees no prefix key) for the forward kernel's ``MERGE`` to continue from."""
    total = batch * gqa_group * seq_q
    kv_h, tile = _tile_program(tl.cdiv(total, BLOCK_M), False)
    flat = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = flat < total
    flat = tl.minimum(flat, total - 1)
    rows = flat % seq_q  # each row's own (b, h, i)
    b = flat // (seq_q * gqa_group)
    h = kv_h * gqa_group + (flat // seq_q) % gqa_group
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V
    length = seq_k
    if PADDED:
        length = tl.load(Lengths + b)
    slope = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if ALIBI:
        slope = tl.load(Slopes + h)[:, None]
    alibi_offset = tl.zeros([BLOCK_M, 1], dtype=tl.int32) + (seq_k - seq_q)
    if RANGES:
        alibi_offset = tl.load(SeqOffsets + b)[:, None]
    lo, hi = _row_ranges(
        rows,
        b,
        seq_k,
        causal_offset,
        window,
        length,
        DocStart,
        DocEnd,
        stride_doc,
        RowLo,
        RowHi,
        stride_rows,
        CAUSAL,
        WINDOW,
        PADDED,
        DOCS,
        RANGES,
    )
    hi = tl.minimum(hi, prefix)
    start, full_start, full_end, end, key_lo, key_hi = _bounds(lo, hi, row_ok, prefix, BLOCK_N)

    q_rows = (Q + _offsets(b, stride_qb) + _offsets(h, stride_qh) + _offsets(rows, stride_qm))[:, None]
    q = _load(q_rows + offs_d[None, :] * stride_qd, row_ok[:, None], d_ok[None, :], True, not EVEN_D)
    k_keys = (K + _offsets(kv_h, stride_kh) + _offsets(offs_n, stride_kn))[None, :]
    k_base = k_keys + offs_d[:, None] * stride_kd
    v_base = V + _offsets(kv_h, stride_vh) + _offsets(offs_n, stride_vn)[:, None] + offs_dv[None, :] * stride_vd
    q_tail = q
    k_tail_base = k_base
    t_ok = d_ok
    if SPLIT_D:
        offs_t = BLOCK_D + tl.arange(0, BLOCK_DT)
        t_ok = offs_t < HEAD_DIM
        q_tail = _load(q_rows + offs_t[None, :] * stride_qd, row_ok[:, None], t_ok[None, :], True, True)
        k_tail_base = k_keys + offs_t[:, None] * stride_kd

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for start_n in range(start, full_start, BLOCK_N):
        acc, m_i, l_i = _attend(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            k_base,
            k_tail_base,
            v_base,
            K,
            V,
            0,
            0,
            K,
            V,
            1,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
            t_ok,
            dv_ok,
            stride_kn,
            stride_vn,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            True,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            SOFTCAP,
            ALIBI,
            False,
            INPUT_PRECISION,
            UPCAST,
            False,
        )
    for start_n in range(full_start, full_end, BLOCK_N):
        acc, m_i, l_i = _attend(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            k_base,
            k_tail_base,
            v_base,
            K,
            V,
            0,
            0,
            K,
            V,
            1,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
            t_ok,
            dv_ok,
            stride_kn,
            stride_vn,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            False,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            SOFTCAP,
            ALIBI,
            False,
            INPUT_PRECISION,
            UPCAST,
            False,
        )
    for start_n in range(full_end, end, BLOCK_N):
        acc, m_i, l_i = _attend(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            k_base,
            k_tail_base,
            v_base,
            K,
            V,
            0,
            0,
            K,
            V,
            1,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
            t_ok,
            dv_ok,
            stride_kn,
            stride_vn,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            True,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            SOFTCAP,
            ALIBI,
            False,
            INPUT_PRECISION,
            UPCAST,
            False,
        )

    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    stats = (_offsets(b, heads) + h) * seq_q + rows  # (B, Hq, Sq) contiguous
    tl.store(PrevLse + stats, lse, mask=row_ok)
    tl.store(Prev + (stats * HEAD_DIM_V)[:, None] + offs_dv[None, :], out, mask=row_ok[:, None] & dv_ok[None, :])
