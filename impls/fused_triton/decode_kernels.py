"""fused_triton's decode kernels: split-KV attention for few query rows (flash-decoding), and the merge.

A decode step (Sq 1, or 2–8 for speculative decoding) has too few query rows to fill a GPU by rows, and
per query head it would read the whole cache once per head of a GQA group. These kernels:

* **Group rows in one tile.** One program takes the G·Sq query rows of a kv head (G = Hq / Hkv; MLA's 128
  heads over its one latent cache: ``BLOCK_M`` of them per program), row r being query head kv_h·G + r // Sq
  at position r % Sq. Each k and v byte of a split is read once per program, not once per query head.
* **Split the keys.** Grid axis 1 splits the keys into ``keys_per_split`` runs (a multiple of ``BLOCK_N``),
  sized on the host to fill every SM (``decode.split_count``). Each program writes its rows' normalised
  partial output (fp32) and log-sum-exp (log2 units, −inf for a row that saw none of the split's keys).
* **Masks** are per-row key ranges, ``RowLo``/``RowHi`` (B or 1, Sq) int32 built once per plan: every
  attnbench mask and a ragged batch's lengths, cut to the program's split of [key_start, key_end). Blocks
  every row sees in full run without an element mask, the others masked, blocks no row sees skipped
  (``shared_kernels._bounds``).
* **Paged caches read in place** (``PAGED``): k and v are the pool (N, Hkv, PAGE_SIZE, D); key j of
  sequence b is slot j % PAGE_SIZE of pool page ``PageTable[b, j // PAGE_SIZE]``, looked up per key, so
  any page size and a partial last page work and nothing is gathered.
* **Narrow caches** (``KV_SCALED``): k and v loaded as stored (bf16, fp8 e4m3 / e5m2) and converted to
  q's type in registers; the float32 scales — per block of ``scale_block`` positions of a (sequence, kv
  head), or per pool page of a paged cache — multiply the score columns and the probability columns, as
  in the forward kernel (``forward_kernels._attend``).
* **MLA** (``SPLIT_D``, ``V_FROM_K``): the 576-wide product as 512 + 64 and the values taken from the key
  tile's first 512 channels: the latent cache is read once per split.
* **Value halves** (``VALUE_PARTS`` 2, a tile's ``parts``): MLA's 64 × 512 fp32 output is 256 registers a thread
  over one warp group, so each of two programs keeps half the value channels (128 a thread at 4 warps), computing
  the scores over all 576 channels itself (the q·kᵀ products twice, the key tile read by both from L2): a
  64-row tile in one warp group, the products on wgmma with 32–64 keys a block, no 16-key slices per group.
* **A shared prefix** (``PREFIX``): the same kernel over the prefix's one copy, a program's rows taken
  from every sequence (the kv head's B·G·Sq rows, ``BLOCK_M`` at a time), the prefix's keys split across
  the SMs like any other; each sequence's own keys after it are a second launch. Both write partials.
* **Merge** (``_decode_merge_kernel``): per query row, every split's partial — the prefix's splits and the
  suffix's alike — weighted by 2^(lse_s − m), m the largest log-sum-exp (and the sink's logit); the learned
  sink joins the denominator once.
* **fp8 under a bf16 q** (``FP16_DOTS``): the dots run in fp16 — every e4m3 / e5m2 value is exact in
  fp16 and converts in one instruction, where bf16 takes two; q is rounded to fp16 once (exact for
  |q| in fp16's normal range, 2^-14 … 65504), P is kept in fp16 (finer than bf16). One scale per
  (sequence, kv head) (``SCALE_ONCE``) is read once and applied to the scores and the output, not per key.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnbench.impls.fused_triton.shared_kernels import LOG2E, _bounds, _dot, _kv_scales, _load, _offsets, _scores


@triton.jit
def _key_pointers(
    K,
    b,
    kv_h,
    keys,
    key_ok,
    PageTable,
    stride_table,
    stride_kb,
    stride_kh,
    stride_kn,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """(BLOCK_N,) pointers to the first channel of each key's row, and (paged) each key's pool page."""
    if PAGED:
        if MASKED:
            page = tl.load(PageTable + _offsets(b, stride_table) + keys // PAGE_SIZE, mask=key_ok, other=0)
        else:
            page = tl.load(PageTable + _offsets(b, stride_table) + keys // PAGE_SIZE)
        rows = K + _offsets(page, stride_kb) + _offsets(kv_h, stride_kh) + _offsets(keys % PAGE_SIZE, stride_kn)
    else:
        page = keys
        rows = K + _offsets(b, stride_kb) + _offsets(kv_h, stride_kh) + _offsets(keys, stride_kn)
    return rows, page


@triton.jit
def _scale_columns(Scale, page, key_ok, scale_block, stride_page, PAGED: tl.constexpr, MASKED: tl.constexpr):
    """(BLOCK_N,) fp32: each key's cache scale: its pool page's (``Scale`` already at the kv head, pages
    ``stride_page`` apart), or its block's of the sequence (``page`` is then the key: ``shared_kernels._kv_scales``)."""
    if not PAGED:
        return _kv_scales(Scale, page, key_ok, scale_block, MASKED)
    elif MASKED:
        return tl.load(Scale + _offsets(page, stride_page), mask=key_ok, other=0.0)
    else:
        return tl.load(Scale + _offsets(page, stride_page))


@triton.jit
def _by_key(x, KEYS_MAJOR: tl.constexpr):
    """A vector over the block's keys laid along the score tile's key axis: its rows keys-major, else its
    columns (the value tile is the other way round: its channels lie along this axis)."""
    if KEYS_MAJOR:
        return x[:, None]
    else:
        return x[None, :]


@triton.jit
def _by_row(x, KEYS_MAJOR: tl.constexpr):
    """A vector over the tile's query rows laid along the score tile's row axis (``_by_key``'s other one)."""
    if KEYS_MAJOR:
        return x[None, :]
    else:
        return x[:, None]


@triton.jit
def _keys_tile(
    rows,
    channels,
    stride,
    key_ok,
    channel_ok,
    MASK_KEYS: tl.constexpr,
    MASK_CHANNELS: tl.constexpr,
    KEYS_FIRST: tl.constexpr,
):
    """A (keys × channels) tile of k or v from each key's row pointer, or its transpose (``KEYS_FIRST``
    False); masked on the keys and on the channels as asked, zeros there."""
    if KEYS_FIRST:
        ptrs = rows[:, None] + channels[None, :] * stride
        return _load(ptrs, key_ok[:, None], channel_ok[None, :], MASK_KEYS, MASK_CHANNELS)
    else:
        ptrs = rows[None, :] + channels[:, None] * stride
        return _load(ptrs, channel_ok[:, None], key_ok[None, :], MASK_CHANNELS, MASK_KEYS)


@triton.jit
def _score_dot(q, k, acc, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, KEYS_MAJOR: tl.constexpr):
    """acc + q·kᵀ (k (D, BLOCK_N) as loaded), or keys-major its transpose k·qᵀ (k (BLOCK_N, D), q (D, rows))."""
    if KEYS_MAJOR:
        return _dot(k.to(q.dtype), q, acc, INPUT_PRECISION, UPCAST)
    else:
        return _dot(q, k.to(q.dtype), acc, INPUT_PRECISION, UPCAST)


@triton.jit
def _value_dot(p, v, acc, alpha, dtype, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, KEYS_MAJOR: tl.constexpr):
    """The output rescaled by ``alpha`` plus P·V, or keys-major its transpose Oᵀ·α + vᵀ·Pᵀ."""
    if KEYS_MAJOR:
        return _dot(v.to(dtype), p.to(dtype), acc * alpha[None, :], INPUT_PRECISION, UPCAST)
    else:
        return _dot(p.to(dtype), v.to(dtype), acc * alpha[:, None], INPUT_PRECISION, UPCAST)


@triton.jit
def _decode_block(
    acc,
    m_i,
    l_i,
    q,
    q_tail,
    q_other,
    K,
    V,
    b,
    kv_h,
    start_n,
    offs_n,
    offs_d,
    offs_t,
    offs_o,
    offs_dv,
    d_ok,
    t_ok,
    o_ok,
    dv_ok,
    positions,
    lo,
    hi,
    key_lo,
    key_hi,
    PageTable,
    stride_table,
    k_scale,
    v_scale,
    scale_block,
    stride_ksb,
    stride_vsb,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    sm_scale,
    qk_scale,
    softcap,
    slope,
    alibi_offset,
    k_mul,
    MASKED: tl.constexpr,
    EVEN_D: tl.constexpr,
    EVEN_DV: tl.constexpr,
    SPLIT_D: tl.constexpr,
    V_FROM_K: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    KV_SCALED: tl.constexpr,
    SCALE_ONCE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    KEYS_MAJOR: tl.constexpr,
    VALUE_PARTS: tl.constexpr,
):
    """One block of keys into the tile's running (acc, m, l), as ``forward_kernels._attend`` with the keys' rows
    found through the page table when paged. Rows-major the products are S = q·kᵀ (rows × keys) and
    O += P·V; ``KEYS_MAJOR`` makes the keys the products' rows: Sᵀ = k·qᵀ and Oᵀ += vᵀ·Pᵀ, with ``acc``
    (BLOCK_DV, BLOCK_M) and ``q`` (BLOCK_D, BLOCK_M) transposed by the caller. Keys-major is taken for MLA's
    latent cache (``decode.decode_forward`` says why and what ab measured): Oᵀ's rows are the 512 value
    channels, wgmma's shape, and the tile holds fewer live registers; both ways handle every feature here
    (pages, scales, masks) and are checked against float64 in the interpreter. With ``VALUE_PARTS`` 2 the head
    dim's first BLOCK_D channels come in two halves, this program's own (``offs_d``: its values' channels too,
    ``offs_dv``) and the other's (``offs_o``, with ``q_other``): the scores over all of them, the output over its
    own half only."""
    keys = start_n + offs_n
    key_ok = (keys >= key_lo) & (keys < key_hi)
    k_rows, page = _key_pointers(
        K, b, kv_h, keys, key_ok, PageTable, stride_table, stride_kb, stride_kh, stride_kn, PAGED, PAGE_SIZE, MASKED
    )
    k = _keys_tile(k_rows, offs_d, stride_kd, key_ok, d_ok, MASKED, not EVEN_D, KEYS_MAJOR)
    qk = _score_dot(q, k, None, INPUT_PRECISION, UPCAST, KEYS_MAJOR)  # rows × keys, or keys × rows
    if VALUE_PARTS == 2:  # the other program's half of the channels: scores only
        k_other = _keys_tile(k_rows, offs_o, stride_kd, key_ok, o_ok, MASKED, not EVEN_D, KEYS_MAJOR)
        qk = _score_dot(q_other, k_other, qk, INPUT_PRECISION, UPCAST, KEYS_MAJOR)
    if SPLIT_D:  # the head dim's tail channels (MLA's 64 rope channels after its 512)
        k_tail = _keys_tile(k_rows, offs_t, stride_kd, key_ok, t_ok, MASKED, True, KEYS_MAJOR)
        qk = _score_dot(q_tail, k_tail, qk, INPUT_PRECISION, UPCAST, KEYS_MAJOR)
    if SCALE_ONCE:  # one scale for the sequence's keys: q·(k·s_k)ᵀ = (q·kᵀ)·s_k
        qk = qk * k_mul
    elif KV_SCALED:
        qk = qk * _by_key(_scale_columns(k_scale, page, key_ok, scale_block, stride_ksb, PAGED, MASKED), KEYS_MAJOR)
    s, c, _ = _scores(
        qk,
        _by_row(positions, KEYS_MAJOR),
        _by_key(keys, KEYS_MAJOR),
        sm_scale,
        qk_scale,
        softcap,
        _by_row(slope, KEYS_MAJOR),
        _by_row(alibi_offset, KEYS_MAJOR),
        SOFTCAP,
        ALIBI,
    )
    if MASKED:
        in_range = (_by_key(keys, KEYS_MAJOR) >= _by_row(lo, KEYS_MAJOR)) & (
            _by_key(keys, KEYS_MAJOR) < _by_row(hi, KEYS_MAJOR)
        )
        s = tl.where(in_range, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0 if KEYS_MAJOR else 1) * c)
    m_use = m_new
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s * c - _by_row(m_use, KEYS_MAJOR))
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 0 if KEYS_MAJOR else 1)
    if V_FROM_K:  # a latent cache: the values are the key tile's first Dv channels
        v = tl.trans(k)
        if not EVEN_DV:
            v = tl.where(_by_key(dv_ok, KEYS_MAJOR), v, tl.zeros_like(v))  # value channels: on the key axis
    else:
        v_rows, _ = _key_pointers(
            V, b, kv_h, keys, key_ok, PageTable, stride_table, stride_vb, stride_vh, stride_vn, PAGED, PAGE_SIZE, MASKED
        )
        v = _keys_tile(v_rows, offs_dv, stride_vd, key_ok, dv_ok, MASKED, not EVEN_DV, not KEYS_MAJOR)
    if KV_SCALED and not SCALE_ONCE:  # one scale for the sequence's values: applied to the output at the end
        p = p * _by_key(_scale_columns(v_scale, page, key_ok, scale_block, stride_vsb, PAGED, MASKED), KEYS_MAJOR)
    acc = _value_dot(p, v, acc, alpha, q.dtype, INPUT_PRECISION, UPCAST, KEYS_MAJOR)
    return acc, m_new, l_i


@triton.jit
def _decode_split_kernel(
    Q,
    K,
    V,
    PartOut,
    PartLse,
    RowLo,
    RowHi,
    SeqOffsets,
    Slopes,
    PageTable,
    KScale,
    VScale,
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
    stride_rows,
    stride_table,
    stride_ksb,
    stride_ksh,
    stride_vsb,
    stride_vsh,
    scale_block,
    sm_scale,
    qk_scale,
    softcap,
    heads,
    kv_heads,
    head_blocks,
    seq_q,
    rows,
    key_start,
    key_end,
    keys_per_split,
    split_base,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EVEN_D: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    EVEN_DV: tl.constexpr,
    SPLIT_D: tl.constexpr,
    BLOCK_DT: tl.constexpr,
    V_FROM_K: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    KV_SCALED: tl.constexpr,
    SCALE_ONCE: tl.constexpr,
    FP16_DOTS: tl.constexpr,
    PREFIX: tl.constexpr,
    KEYS_MAJOR: tl.constexpr,
    VALUE_PARTS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Keys [key_start, key_end) of each (sequence, kv head), split ``keys_per_split`` a program: partial
    outputs and log-sum-exps at split index ``split_base`` + the program's split. ``PREFIX``: the keys are a
    shared prefix's one copy (K, V of one sequence) and a program's rows come from every sequence.
    ``VALUE_PARTS`` 2 (a head dim split past 256, values in its first BLOCK_D channels: MLA's): two programs a
    block of rows and split, each the scores over every channel and the output over its half of the values."""
    program = tl.program_id(0) // VALUE_PARTS  # (key sequence, kv head, block of rows)
    part = tl.program_id(0) % VALUE_PARTS  # which half of the value channels (VALUE_PARTS 2)
    split = tl.program_id(1)
    block = program % head_blocks
    seq = program // head_blocks // kv_heads  # the keys' sequence (the prefix's one copy: 0)
    kv_h = program // head_blocks % kv_heads
    gqa_group = heads // kv_heads
    group_rows = gqa_group * seq_q  # a kv head's query rows in one sequence
    index = block * BLOCK_M + tl.arange(0, BLOCK_M)
    if PREFIX:  # the kv head's rows of every sequence
        all_rows = rows // heads * group_rows
        row_ok = index < all_rows
        index = tl.minimum(index, all_rows - 1)
        b = index // group_rows
        local = index % group_rows
    else:
        row_ok = index < group_rows
        local = tl.minimum(index, group_rows - 1)
        b = seq + local * 0
    h = kv_h * gqa_group + local // seq_q  # the query head
    positions = local % seq_q  # the query position
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = part * (BLOCK_D // VALUE_PARTS) + tl.arange(0, BLOCK_D // VALUE_PARTS)
    offs_o = (1 - part) * (BLOCK_D // VALUE_PARTS) + tl.arange(0, BLOCK_D // VALUE_PARTS)  # the other half's
    offs_dv = part * (BLOCK_DV // VALUE_PARTS) + tl.arange(0, BLOCK_DV // VALUE_PARTS)
    offs_t = BLOCK_D + tl.arange(0, BLOCK_DT)
    d_ok = offs_d < HEAD_DIM
    o_ok = offs_o < HEAD_DIM
    t_ok = offs_t < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V

    at = _offsets(b, stride_rows) + positions
    split_lo = key_start + split * keys_per_split
    split_hi = tl.minimum(split_lo + keys_per_split, key_end)
    lo = tl.maximum(tl.load(RowLo + at), split_lo)
    hi = tl.minimum(tl.load(RowHi + at), split_hi)
    start, full_start, full_end, end, key_lo, key_hi = _bounds(lo, hi, row_ok, key_end, BLOCK_N)
    slope = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ALIBI:
        slope = tl.load(Slopes + h)
    alibi_offset = tl.load(SeqOffsets + b)

    q_rows = (Q + _offsets(b, stride_qb) + _offsets(h, stride_qh) + _offsets(positions, stride_qm))[:, None]
    q = tl.load(q_rows + offs_d[None, :] * stride_qd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q_tail = q
    q_other = q
    if SPLIT_D:
        q_tail = tl.load(q_rows + offs_t[None, :] * stride_qd, mask=row_ok[:, None] & t_ok[None, :], other=0.0)
    if VALUE_PARTS == 2:
        q_other = tl.load(q_rows + offs_o[None, :] * stride_qd, mask=row_ok[:, None] & o_ok[None, :], other=0.0)
    if FP16_DOTS:  # an fp8 cache under a bf16 q: fp8 converts to fp16 in one instruction, exactly
        q = q.to(tl.float16)
        q_tail = q_tail.to(tl.float16)
        q_other = q_other.to(tl.float16)
    if KEYS_MAJOR:  # the products' second operand: (BLOCK_D, BLOCK_M)
        q = tl.trans(q)
        q_tail = tl.trans(q_tail)
        q_other = tl.trans(q_other)
    k_scale = KScale
    v_scale = VScale
    k_mul = 1.0
    v_mul = 1.0
    if KV_SCALED:
        if PAGED:  # one scale per pool page: the page's row, this kv head
            k_scale = KScale + _offsets(kv_h, stride_ksh)
            v_scale = VScale + _offsets(kv_h, stride_vsh)
        else:
            k_scale = KScale + _offsets(seq, stride_ksb) + _offsets(kv_h, stride_ksh)
            v_scale = VScale + _offsets(seq, stride_vsb) + _offsets(kv_h, stride_vsh)
        if SCALE_ONCE:  # one scale per (sequence, kv head): read once
            k_mul = tl.load(k_scale)
            v_mul = tl.load(v_scale)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if KEYS_MAJOR:
        acc = tl.zeros([BLOCK_DV // VALUE_PARTS, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_DV // VALUE_PARTS], dtype=tl.float32)
    for start_n in range(start, full_start, BLOCK_N):
        acc, m_i, l_i = _decode_block(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            q_other,
            K,
            V,
            seq,
            kv_h,
            start_n,
            offs_n,
            offs_d,
            offs_t,
            offs_o,
            offs_dv,
            d_ok,
            t_ok,
            o_ok,
            dv_ok,
            positions,
            lo,
            hi,
            key_lo,
            key_hi,
            PageTable,
            stride_table,
            k_scale,
            v_scale,
            scale_block,
            stride_ksb,
            stride_vsb,
            stride_kb,
            stride_kh,
            stride_kn,
            stride_kd,
            stride_vb,
            stride_vh,
            stride_vn,
            stride_vd,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            k_mul,
            True,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            PAGED,
            PAGE_SIZE,
            SOFTCAP,
            ALIBI,
            KV_SCALED,
            SCALE_ONCE,
            INPUT_PRECISION,
            UPCAST,
            KEYS_MAJOR,
            VALUE_PARTS,
        )
    for start_n in range(full_start, full_end, BLOCK_N):
        acc, m_i, l_i = _decode_block(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            q_other,
            K,
            V,
            seq,
            kv_h,
            start_n,
            offs_n,
            offs_d,
            offs_t,
            offs_o,
            offs_dv,
            d_ok,
            t_ok,
            o_ok,
            dv_ok,
            positions,
            lo,
            hi,
            key_lo,
            key_hi,
            PageTable,
            stride_table,
            k_scale,
            v_scale,
            scale_block,
            stride_ksb,
            stride_vsb,
            stride_kb,
            stride_kh,
            stride_kn,
            stride_kd,
            stride_vb,
            stride_vh,
            stride_vn,
            stride_vd,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            k_mul,
            False,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            PAGED,
            PAGE_SIZE,
            SOFTCAP,
            ALIBI,
            KV_SCALED,
            SCALE_ONCE,
            INPUT_PRECISION,
            UPCAST,
            KEYS_MAJOR,
            VALUE_PARTS,
        )
    for start_n in range(full_end, end, BLOCK_N):
        acc, m_i, l_i = _decode_block(
            acc,
            m_i,
            l_i,
            q,
            q_tail,
            q_other,
            K,
            V,
            seq,
            kv_h,
            start_n,
            offs_n,
            offs_d,
            offs_t,
            offs_o,
            offs_dv,
            d_ok,
            t_ok,
            o_ok,
            dv_ok,
            positions,
            lo,
            hi,
            key_lo,
            key_hi,
            PageTable,
            stride_table,
            k_scale,
            v_scale,
            scale_block,
            stride_ksb,
            stride_vsb,
            stride_kb,
            stride_kh,
            stride_kn,
            stride_kd,
            stride_vb,
            stride_vh,
            stride_vn,
            stride_vd,
            sm_scale,
            qk_scale,
            softcap,
            slope,
            alibi_offset,
            k_mul,
            True,
            EVEN_D,
            EVEN_DV,
            SPLIT_D,
            V_FROM_K,
            PAGED,
            PAGE_SIZE,
            SOFTCAP,
            ALIBI,
            KV_SCALED,
            SCALE_ONCE,
            INPUT_PRECISION,
            UPCAST,
            KEYS_MAJOR,
            VALUE_PARTS,
        )

    seen = l_i > 0.0
    norm = v_mul / tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    row = _offsets(split_base + split, rows) + (b * heads + h) * seq_q + positions  # (split, b, h, i)
    if part == 0:  # both halves' (up to rounding): the first's
        tl.store(PartLse + row, lse, mask=row_ok)
    if KEYS_MAJOR:
        out_ptrs = PartOut + (row * HEAD_DIM_V)[None, :] + offs_dv[:, None]
        tl.store(out_ptrs, acc * norm[None, :], mask=row_ok[None, :] & dv_ok[:, None])
    else:
        out_ptrs = PartOut + (row * HEAD_DIM_V)[:, None] + offs_dv[None, :]
        tl.store(out_ptrs, acc * norm[:, None], mask=row_ok[:, None] & dv_ok[None, :])


@triton.jit
def _decode_merge_kernel(
    PartOut,
    PartLse,
    Sinks,
    Out,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    heads,
    seq_q,
    splits,
    rows,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SINKS: tl.constexpr,
):
    """One program per query row (b, h, i): O = Σ_s 2^(lse_s − m)·O_s / (Σ_s 2^(lse_s − m) [+ 2^(sink − m)])
    over the splits (a shared prefix's among them), m the largest of their log-sum-exps and the sink."""
    row = tl.program_id(0)  # b·Hq·Sq + h·Sq + i
    i = row % seq_q
    h = row // seq_q % heads
    b = row // seq_q // heads
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < HEAD_DIM_V
    s_ok = offs_s < splits
    lse = tl.load(PartLse + _offsets(offs_s, rows) + row, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    sink = float("-inf")
    if SINKS:
        sink = tl.load(Sinks + h).to(tl.float32) * LOG2E
        m = tl.maximum(m, sink)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    weights = tl.math.exp2(lse - m_use)  # 0 for splits that saw no key
    parts = tl.load(
        PartOut + (_offsets(offs_s, rows) + row)[:, None] * HEAD_DIM_V + offs_dv[None, :],
        mask=s_ok[:, None] & dv_ok[None, :],
        other=0.0,
    )
    acc = tl.sum(parts * weights[:, None], 0)
    total = tl.sum(weights, 0)
    if SINKS:
        total += tl.math.exp2(sink - m_use)
    out = acc / tl.where(total > 0.0, total, 1.0)
    o_ptrs = Out + _offsets(b, stride_ob) + _offsets(h, stride_oh) + _offsets(i, stride_om) + offs_dv * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=dv_ok)
