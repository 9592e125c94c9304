"""fused_triton's backward kernels (FlashAttention-2): the preprocess (``_preprocess_kernel``), dK/dV
(``_dkdv_kernel``, a key block in ``_dkdv_block``) and dQ (``_dq_kernel``, ``_dq_block``). Key ranges, blocks,
scores, values, memory and precision as ``shared_kernels`` defines them.

* **Backward** (FlashAttention-2): Δ_i = Σ_d dO∘O (preprocess); P = exp2(s − LSE) recomputed per tile;
  dV = Pᵀ·dO, dS = P∘(dO·Vᵀ − Δ), dK = dSᵀ·Q·c, dQ = dS·K·c (c = scale, times 1 − tanh² under softcap).
  With sinks the same formulas hold (LSE includes the sink, which has no value) and the preprocess also
  sums dsink_h = −Σ_rows 2^(sink·log2 e − LSE)·Δ per (batch·head, row block); the host adds those partials.
  dK/dV: one program per (batch·kv head, key block) loops over the query heads of its GQA group and
  their query blocks, so the group's sum needs no atomics. dQ: one program per (batch·head, query block).
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnbench.impls.fused_triton.shared_kernels import (
    LOG2E,
    _bounds,
    _box,
    _dot,
    _key_ranges,
    _load,
    _offsets,
    _row_ranges,
    _scores,
    _tile_program,
)


@triton.jit
def _preprocess_kernel(
    Out,
    DOut,
    Delta,
    Lse,
    Sinks,
    DSinks,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_gb,
    stride_gh,
    stride_gm,
    stride_gd,
    heads,
    seq_q,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SINKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Δ_i = Σ_d dO[i, d]·O[i, d] in fp32, per (batch·head, row block) (HEAD_DIM: the values' Dv). With
    sinks, also this block's part of the sink logit's gradient, −Σ_i 2^(sink·log2 e − LSE_i)·Δ_i, into
    DSinks[batch·head, row block] (fp32; the host sums the partials)."""
    batch_head = tl.program_id(0)
    b, h = batch_head // heads, batch_head % heads
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < seq_q
    ok = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(
        Out
        + _offsets(b, stride_ob)
        + _offsets(h, stride_oh)
        + _offsets(rows, stride_om)[:, None]
        + offs_d[None, :] * stride_od,
        mask=ok,
        other=0.0,
    )
    do = tl.load(
        DOut
        + _offsets(b, stride_gb)
        + _offsets(h, stride_gh)
        + _offsets(rows, stride_gm)[:, None]
        + offs_d[None, :] * stride_gd,
        mask=ok,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + _offsets(batch_head, seq_q) + rows, delta, mask=row_ok)
    if SINKS:  # the sink's probability 2^(sink − LSE) times (0 − Δ): it has no value
        sink = tl.load(Sinks + h).to(tl.float32) * LOG2E
        lse = tl.load(Lse + _offsets(batch_head, seq_q) + rows, mask=row_ok, other=float("inf"))
        part = -tl.sum(tl.where(row_ok, tl.math.exp2(sink - lse) * delta, 0.0), 0)
        tl.store(DSinks + _offsets(batch_head, tl.num_programs(1)) + tl.program_id(1), part)


@triton.jit
def _dkdv_block(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    q_desc,
    do_desc,
    desc_b,
    desc_h,
    Lse,
    Delta,
    start_m,
    offs_m,
    keys,
    d_ok,
    dv_ok,
    b,
    seq_q,
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
    stride_qm,
    stride_gm,
    sm_scale,
    qk_scale,
    softcap,
    slope,
    alibi_offset,
    MASKED: tl.constexpr,
    EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    PADDED: tl.constexpr,
    DOCS: tl.constexpr,
    RANGES: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr,
):
    """One block of query rows into a key block's dK, dV (tiles transposed: keys × rows). With ``TMA``, q and dO
    come in boxes through their tensor descriptors (rows past Sq read as zeros)."""
    rows = start_m + offs_m  # (BLOCK_M,)
    row_ok = rows < seq_q
    if TMA:
        q_t = tl.trans(_box(q_desc, desc_b, desc_h, start_m))
        do = _box(do_desc, desc_b, desc_h, start_m)
    else:
        q_t = _load(q_base + _offsets(rows, stride_qm)[None, :], d_ok[:, None], row_ok[None, :], not EVEN_D, MASKED)
        do = _load(do_base + _offsets(rows, stride_gm)[:, None], row_ok[:, None], dv_ok[None, :], MASKED, not EVEN_DV)
    if MASKED:
        lse = tl.load(Lse + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(Delta + rows, mask=row_ok, other=0.0)
    else:
        lse = tl.load(Lse + rows)
        delta = tl.load(Delta + rows)
    qk_t = _dot(k, q_t, None, INPUT_PRECISION, UPCAST)  # (BLOCK_N, BLOCK_M)
    s_t, c, dmod = _scores(
        qk_t, rows[None, :], keys[:, None], sm_scale, qk_scale, softcap, slope, alibi_offset, SOFTCAP, ALIBI
    )
    p_t = tl.math.exp2(s_t * c - lse[None, :])
    if MASKED:
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
        visible = (keys[:, None] >= lo[None, :]) & (keys[:, None] < hi[None, :]) & row_ok[None, :]
        p_t = tl.where(visible, p_t, 0.0)
    dv = _dot(p_t.to(do.dtype), do, dv, INPUT_PRECISION, UPCAST)
    dp_t = _dot(v, tl.trans(do), None, INPUT_PRECISION, UPCAST)  # (BLOCK_N, BLOCK_M)
    ds_t = p_t * (dp_t - delta[None, :]) * dmod
    dk = _dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, INPUT_PRECISION, UPCAST)
    return dk, dv


@triton.jit
def _dkdv_kernel(
    Q,
    K,
    V,
    DOut,
    QDesc,
    DODesc,
    Lse,
    Delta,
    DK,
    DV,
    Lengths,
    DocStart,
    DocEnd,
    Slopes,
    RowLo,
    RowHi,
    KeyLo,
    KeyHi,
    SeqOffsets,
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
    stride_gb,
    stride_gh,
    stride_gm,
    stride_gd,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    stride_dvd,
    stride_doc,
    stride_rows,
    stride_keys,
    sm_scale,
    qk_scale,
    softcap,
    heads,
    kv_heads,
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
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    batch_head, key_tile = _tile_program(tl.cdiv(seq_k, BLOCK_N), False)  # batch · kv head
    b = batch_head // kv_heads
    kv_h = batch_head % kv_heads
    start_n = key_tile * BLOCK_N
    keys = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V
    length = seq_k
    if PADDED:
        length = tl.load(Lengths + b)
    key_end = tl.minimum(length, seq_k)  # keys at or past it are seen by no row
    key_ok = keys < key_end
    alibi_offset = seq_k - seq_q
    if RANGES:
        alibi_offset = tl.load(SeqOffsets + b)

    # rows that see each key; a key past the length (or the tensor) is seen by none, so a block holding one
    # has no unmasked row block
    row_lo, row_hi = _key_ranges(
        tl.minimum(keys, seq_k - 1),
        b,
        seq_q,
        causal_offset,
        window,
        DocStart,
        DocEnd,
        stride_doc,
        KeyLo,
        KeyHi,
        stride_keys,
        CAUSAL,
        WINDOW,
        DOCS,
        RANGES,
    )
    row_hi = tl.where(key_ok, row_hi, row_lo)
    start, full_start, full_end, end, _, _ = _bounds(row_lo, row_hi, keys >= 0, seq_q, BLOCK_M)

    k_ptrs = (
        K
        + _offsets(b, stride_kb)
        + _offsets(kv_h, stride_kh)
        + _offsets(keys, stride_kn)[:, None]
        + offs_d[None, :] * stride_kd
    )
    v_ptrs = (
        V
        + _offsets(b, stride_vb)
        + _offsets(kv_h, stride_vh)
        + _offsets(keys, stride_vn)[:, None]
        + offs_dv[None, :] * stride_vd
    )
    k = _load(k_ptrs, key_ok[:, None], d_ok[None, :], True, not EVEN_D)  # (BLOCK_N, BLOCK_D)
    v = _load(v_ptrs, key_ok[:, None], dv_ok[None, :], True, not EVEN_DV)  # (BLOCK_N, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for g in range(0, gqa_group):  # the query heads of this kv head: dK, dV summed over the group
        h = kv_h * gqa_group + g
        slope = 0.0
        if ALIBI:
            slope = tl.load(Slopes + h)
        q_base = Q + _offsets(b, stride_qb) + _offsets(h, stride_qh) + offs_d[:, None] * stride_qd
        do_base = DOut + _offsets(b, stride_gb) + _offsets(h, stride_gh) + offs_dv[None, :] * stride_gd
        row_stats = _offsets(b * heads + h, seq_q)
        for start_m in range(start, full_start, BLOCK_M):
            dk, dv = _dkdv_block(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                QDesc,
                DODesc,
                b,
                h,
                Lse + row_stats,
                Delta + row_stats,
                start_m,
                offs_m,
                keys,
                d_ok,
                dv_ok,
                b,
                seq_q,
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
                stride_qm,
                stride_gm,
                sm_scale,
                qk_scale,
                softcap,
                slope,
                alibi_offset,
                True,
                EVEN_D,
                EVEN_DV,
                CAUSAL,
                WINDOW,
                PADDED,
                DOCS,
                RANGES,
                SOFTCAP,
                ALIBI,
                INPUT_PRECISION,
                UPCAST,
                TMA,
            )
        for start_m in range(full_start, full_end, BLOCK_M):
            dk, dv = _dkdv_block(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                QDesc,
                DODesc,
                b,
                h,
                Lse + row_stats,
                Delta + row_stats,
                start_m,
                offs_m,
                keys,
                d_ok,
                dv_ok,
                b,
                seq_q,
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
                stride_qm,
                stride_gm,
                sm_scale,
                qk_scale,
                softcap,
                slope,
                alibi_offset,
                False,
                EVEN_D,
                EVEN_DV,
                CAUSAL,
                WINDOW,
                PADDED,
                DOCS,
                RANGES,
                SOFTCAP,
                ALIBI,
                INPUT_PRECISION,
                UPCAST,
                TMA,
            )
        for start_m in range(full_end, end, BLOCK_M):
            dk, dv = _dkdv_block(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                QDesc,
                DODesc,
                b,
                h,
                Lse + row_stats,
                Delta + row_stats,
                start_m,
                offs_m,
                keys,
                d_ok,
                dv_ok,
                b,
                seq_q,
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
                stride_qm,
                stride_gm,
                sm_scale,
                qk_scale,
                softcap,
                slope,
                alibi_offset,
                True,
                EVEN_D,
                EVEN_DV,
                CAUSAL,
                WINDOW,
                PADDED,
                DOCS,
                RANGES,
                SOFTCAP,
                ALIBI,
                INPUT_PRECISION,
                UPCAST,
                TMA,
            )

    in_range = keys < seq_k
    dk_ptrs = (
        DK
        + _offsets(b, stride_dkb)
        + _offsets(kv_h, stride_dkh)
        + _offsets(keys, stride_dkn)[:, None]
        + offs_d[None, :] * stride_dkd
    )
    dv_ptrs = (
        DV
        + _offsets(b, stride_dvb)
        + _offsets(kv_h, stride_dvh)
        + _offsets(keys, stride_dvn)[:, None]
        + offs_dv[None, :] * stride_dvd
    )
    tl.store(dk_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=in_range[:, None] & d_ok[None, :])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=in_range[:, None] & dv_ok[None, :])


@triton.jit
def _dq_block(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    k_desc,
    v_desc,
    desc_b,
    desc_h,
    start_n,
    offs_n,
    rows,
    lo,
    hi,
    key_lo,
    key_hi,
    d_ok,
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
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr,
):
    """One block of keys into a query tile's dQ. With ``TMA``, k and v come in boxes through their tensor
    descriptors; a masked block zeroes the keys it must not read (they may hold anything: NaN)."""
    keys = start_n + offs_n
    key_ok = (keys >= key_lo) & (keys < key_hi)
    if TMA:
        k = _box(k_desc, desc_b, desc_h, start_n)
        v = _box(v_desc, desc_b, desc_h, start_n)
        if MASKED:
            k = tl.where(key_ok[:, None], k, tl.zeros_like(k))
            v = tl.where(key_ok[:, None], v, tl.zeros_like(v))
        v_t = tl.trans(v)
    else:
        k = _load(k_base + _offsets(start_n, stride_kn), key_ok[:, None], d_ok[None, :], MASKED, not EVEN_D)
        v_t = _load(v_base + _offsets(start_n, stride_vn), dv_ok[:, None], key_ok[None, :], not EVEN_DV, MASKED)
    qk = _dot(q, tl.trans(k), None, INPUT_PRECISION, UPCAST)  # (BLOCK_M, BLOCK_N)
    s, c, dmod = _scores(
        qk, rows[:, None], keys[None, :], sm_scale, qk_scale, softcap, slope, alibi_offset, SOFTCAP, ALIBI
    )
    p = tl.math.exp2(s * c - lse[:, None])
    if MASKED:
        p = tl.where((keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None]), p, 0.0)
    dp = _dot(do, v_t, None, INPUT_PRECISION, UPCAST)
    ds = p * (dp - delta[:, None]) * dmod
    return _dot(ds.to(k.dtype), k, dq, INPUT_PRECISION, UPCAST)


@triton.jit
def _dq_kernel(
    Q,
    K,
    V,
    KDesc,
    VDesc,
    DOut,
    Lse,
    Delta,
    DQ,
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
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_gb,
    stride_gh,
    stride_gm,
    stride_gd,
    stride_dqb,
    stride_dqh,
    stride_dqm,
    stride_dqd,
    stride_doc,
    stride_rows,
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
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    batch_head, tile = _tile_program(tl.cdiv(seq_q, BLOCK_M), CAUSAL)
    b = batch_head // heads
    h = batch_head % heads
    kv_h = h // gqa_group
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
        alibi_offset = tl.load(SeqOffsets + b)
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
    start, full_start, full_end, end, key_lo, key_hi = _bounds(lo, hi, row_ok, seq_k, BLOCK_N)

    q = _load(
        Q
        + _offsets(b, stride_qb)
        + _offsets(h, stride_qh)
        + _offsets(rows, stride_qm)[:, None]
        + offs_d[None, :] * stride_qd,
        row_ok[:, None],
        d_ok[None, :],
        True,
        not EVEN_D,
    )
    do = _load(
        DOut
        + _offsets(b, stride_gb)
        + _offsets(h, stride_gh)
        + _offsets(rows, stride_gm)[:, None]
        + offs_dv[None, :] * stride_gd,
        row_ok[:, None],
        dv_ok[None, :],
        True,
        not EVEN_DV,
    )
    row_stats = _offsets(batch_head, seq_q) + rows
    lse = tl.load(Lse + row_stats, mask=row_ok, other=float("inf"))
    delta = tl.load(Delta + row_stats, mask=row_ok, other=0.0)
    k_base = (
        K
        + _offsets(b, stride_kb)
        + _offsets(kv_h, stride_kh)
        + _offsets(offs_n, stride_kn)[:, None]
        + offs_d[None, :] * stride_kd
    )
    v_base = (
        V
        + _offsets(b, stride_vb)
        + _offsets(kv_h, stride_vh)
        + _offsets(offs_n, stride_vn)[None, :]
        + offs_dv[:, None] * stride_vd
    )
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(start, full_start, BLOCK_N):
        dq = _dq_block(
            dq,
            q,
            do,
            lse,
            delta,
            k_base,
            v_base,
            KDesc,
            VDesc,
            b,
            kv_h,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
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
            SOFTCAP,
            ALIBI,
            INPUT_PRECISION,
            UPCAST,
            TMA,
        )
    for start_n in range(full_start, full_end, BLOCK_N):
        dq = _dq_block(
            dq,
            q,
            do,
            lse,
            delta,
            k_base,
            v_base,
            KDesc,
            VDesc,
            b,
            kv_h,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
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
            SOFTCAP,
            ALIBI,
            INPUT_PRECISION,
            UPCAST,
            TMA,
        )
    for start_n in range(full_end, end, BLOCK_N):
        dq = _dq_block(
            dq,
            q,
            do,
            lse,
            delta,
            k_base,
            v_base,
            KDesc,
            VDesc,
            b,
            kv_h,
            start_n,
            offs_n,
            rows,
            lo,
            hi,
            key_lo,
            key_hi,
            d_ok,
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
            SOFTCAP,
            ALIBI,
            INPUT_PRECISION,
            UPCAST,
            TMA,
        )
    dq_ptrs = (
        DQ
        + _offsets(b, stride_dqb)
        + _offsets(h, stride_dqh)
        + _offsets(rows, stride_dqm)[:, None]
        + offs_d[None, :] * stride_dqd
    )
    tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
