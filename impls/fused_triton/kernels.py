"""fused_triton's Triton kernels: a FlashAttention-2 forward, cascade attention's shared-prefix level before it
(``_prefix_kernel``) and the backward (preprocess, dK/dV, dQ).

Definitions (shared by all five kernels, and by decode_kernels.py's):

* **Key ranges.** Every mask gives query row i a contiguous range of visible keys [lo(i), hi(i)):
  ``none`` [0, Sk); causal hi = i + 1 + offset (offset 0 top-left, Sk − Sq bottom-right); a sliding window
  of W keys lo = i + offset − W + 1 (always bottom-right); ``padding`` hi ≤ lengths[b]; documents
  lo ≥ doc_start(i), hi ≤ doc_end(i) (per-token tables); ``RANGES``: any other mask — chunked, a mixed or
  ragged batch — as per-row tables lo(b, i), hi(b, i) (B, Sq) and their key-side duals (B, Sk), built once
  on the host (``flash.range_tables``). For every mask the rows that see a key j form one range
  [rlo(j), rhi(j)) (``_key_ranges``).
* **Blocks.** A program's rows see the union of their ranges and *every* row sees their intersection
  (``_bounds``: min/max reductions over the tile's rows, so ranges need not be monotone across rows — a
  ragged batch's padding rows see nothing). Blocks inside the intersection run without any element mask;
  blocks in the union but outside it are masked element-wise; blocks outside the union are skipped, so
  causal does about half the work and a window's work is ∝ W, not S. The dK/dV kernel does the same over
  query blocks with the key-side ranges.
* **Scores**, in log2 units: s = q·kᵀ · scale · log2(e). Without a score modifier the scale is applied
  in one FMA with the row maximum (``exp2(qk·c − m)``). Softcap: s ← cap·tanh(s/cap) before the mask;
  ALiBi: s ← s − slope_h·|i + offset_b − j| (offset_b = Sk − Sq, or the sequence's own kv_len − q_len).
* **Values** have their own head dim Dv (``HEAD_DIM_V``, padded to ``BLOCK_DV``): v, O, dO and dV are
  Dv wide, q, k, dQ and dK D wide. An MLA latent cache's values are a view of its keys' first Dv channels:
  V is k's pointer with k's strides, nothing copied; when the key tile is as wide as the value tile
  (``V_FROM_K``) the forward takes the values from the key tile it already loaded (channels ≥ Dv zeroed).
* **Wide heads** (``SPLIT_D``, forward): a head dim past 256 that is no power of two — MLA's 576 — is its
  power-of-two part (BLOCK_D, 512) and a tail tile (BLOCK_DT, 64): q·kᵀ is two dots, 576 channels loaded,
  not 1024.
* **A narrowed KV cache** (``KV_SCALED``, forward only): k and v are loaded in their stored type (bf16,
  fp8 e4m3 / e5m2) and converted to q's type in registers (exact: every fp8 and bf16 value is an fp16 /
  bf16 / fp32 value); an fp8 cache's float32 scales, one per block of ``scale_block`` positions (a
  sequence, or a page), are applied to the fp32 tiles right after the dots — the keys' to the score
  columns, the values' to the probability columns before P·V — which is q·(k·s_k)ᵀ and P·(v·s_v) without
  rounding the dequantized k or v to the dtype.
* **An fp8 forward** (``FP8``): q, k and v in e4m3, each with one float32 scale per (sequence, head), as
  FlashAttention-3 and cuDNN take them. Both dots run in fp8 (fp32 accumulators): q's and k's scales fold
  into the score scale, P is rounded to e4m3 for P·V (it lies in [0, 1]), v's scale multiplies the
  accumulator once at the end; the output in its own type (bf16). v comes keys-contiguous (``flash.forward``
  transposes it): Hopper's fp8 wgmma reads its B operand K-major only.
* **Forward** (online softmax): running row max m, denominator l, fp32 accumulator; writes O and the
  row log-sum-exp LSE = m + log2(l) (fp32, log2 units; +inf for a row that sees no key, whose O is 0).
  Learned sinks (``SINKS``): the head's logit joins the denominator at the end, l ← l + 2^(sink·log2 e − m)
  with m the max over keys and sink, and LSE includes it (a row that sees no key: O 0, LSE the sink).
* **Backward** (FlashAttention-2): Δ_i = Σ_d dO∘O (preprocess); P = exp2(s − LSE) recomputed per tile;
  dV = Pᵀ·dO, dS = P∘(dO·Vᵀ − Δ), dK = dSᵀ·Q·c, dQ = dS·K·c (c = scale, times 1 − tanh² under softcap).
  With sinks the same formulas hold (LSE includes the sink, which has no value) and the preprocess also
  sums dsink_h = −Σ_rows 2^(sink·log2 e − LSE)·Δ per (batch·head, row block); the host adds those partials.
  dK/dV: one program per (batch·kv head, key block) loops over the query heads of its GQA group and
  their query blocks, so the group's sum needs no atomics. dQ: one program per (batch·head, query block).
* **Memory.** Row and key offsets are 64-bit (``_offsets``): a strided (B, S, H, D) view passes 2^31
  elements at long S. Batch·heads is grid axis 0 (axis 1 is capped at 65535). Head dims are padded to
  BLOCK_D / BLOCK_DV, powers of two ≥ 16, with loads masked on them only when ``EVEN_D`` / ``EVEN_DV`` is false.
* **Precision.** fp32 scores, statistics and accumulators; P and dS are cast to q's dtype for the second
  matmuls. fp32 inputs use ``INPUT_PRECISION`` ("tf32x3" on CUDA, "ieee" in the interpreter).
  In the interpreter only, bf16 dot operands are upcast (its tl.dot mishandles bf16; triton#11584).
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnbench.impls.fused_triton.interpreter_compat import squeeze_scalar_index

# Triton 3.6's interpreter under NumPy 2.4: every loop bounded by a tensor failed (interpreter_compat says why)
squeeze_scalar_index()

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
def _tile_program(tiles, REVERSE: tl.constexpr):
    """This program's (batch·head, tile) in a 1-D grid of B·H·``tiles`` programs, tiles fastest: the programs
    resident at once are one head's tiles, which stream the same k and v (q and dO for dK/dV) and so share
    them in L2, instead of each resident program streaming another head's. ``REVERSE`` starts each head's
    last tile first (a causal mask's last row tiles see the most keys, so the short ones fill the tail)."""
    program = tl.program_id(0)
    tile = program % tiles
    if REVERSE:
        tile = tiles - 1 - tile
    return program // tiles, tile


@triton.jit
def _box(desc, b, h, start):
    """The (rows, width) box of a (B, H, S, width) tensor at sequence b, head h, position ``start``, read by its
    tensor descriptor (Hopper's tensor-memory accelerator); rows past S read as zeros."""
    box = desc.load([b, h, start, 0])
    return box.reshape(box.shape[2], box.shape[3])


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
def _row_ranges(
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
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    PADDED: tl.constexpr,
    DOCS: tl.constexpr,
    RANGES: tl.constexpr,
):
    """Keys [lo, hi) that query row(s) ``rows`` see (rows may be a scalar or a vector, below Sq)."""
    if RANGES:  # the per-row tables: they are the whole mask
        at = _offsets(b, stride_rows) + rows
        lo = tl.load(RowLo + at)
        hi = tl.load(RowHi + at)
    else:
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
def _key_ranges(
    keys,
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
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    DOCS: tl.constexpr,
    RANGES: tl.constexpr,
):
    """Query rows [lo, hi) that see key(s) ``keys`` (below Sk and the padding length: callers see to it)."""
    if RANGES:
        at = _offsets(b, stride_keys) + keys
        lo = tl.load(KeyLo + at)
        hi = tl.load(KeyHi + at)
    else:
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
def _bounds(lo, hi, ok, limit, BLOCK: tl.constexpr):
    """(start, full_start, full_end, end) of the blocks to visit along one axis, for a tile whose entries
    (rows, or keys for dK/dV) see [lo, hi) each; entries where ``ok`` is false (past the tensor) don't count.
    Masked blocks lie in [start, full_start) and [full_end, end), unmasked ones (inside every entry's range)
    in [full_start, full_end). An entry that sees nothing leaves no unmasked block; ``limit`` is the
    axis' length."""
    seen = ok & (lo < hi)
    union_lo = tl.min(tl.where(seen, lo, limit), 0)
    union_hi = tl.max(tl.where(seen, hi, 0), 0)
    common_lo = tl.max(tl.where(ok, lo, 0), 0)
    common_hi = tl.min(tl.where(ok, tl.where(seen, hi, 0), limit), 0)
    start = (tl.maximum(union_lo, 0) // BLOCK) * BLOCK
    end = tl.maximum(union_hi, start)
    full_start = ((tl.maximum(common_lo, 0) + BLOCK - 1) // BLOCK) * BLOCK
    full_end = (common_hi // BLOCK) * BLOCK
    none_full = full_end <= full_start
    full_start = tl.where(none_full, start, full_start)
    full_end = tl.where(none_full, start, full_end)
    return start, full_start, full_end, end, tl.maximum(union_lo, 0), union_hi


@triton.jit
def _tanh(x):
    t = tl.math.exp2(tl.abs(x) * (-2.0 * LOG2E))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit
def _scores(
    qk, rows, keys, sm_scale, qk_scale, softcap, slope, alibi_offset, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr
):
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
def _kv_scales(Scale, keys, key_ok, scale_block, MASKED: tl.constexpr):
    """(BLOCK_N,) fp32: each key's cache scale (its block's: the sequence's, or its page's)."""
    if MASKED:
        return tl.load(Scale + keys // scale_block, mask=key_ok, other=0.0)
    else:
        return tl.load(Scale + keys // scale_block)


@triton.jit
def _round_e4m3(p):
    """p ≥ 0 (probabilities) rounded to e4m3's grid, in fp32: 3 mantissa bits, subnormals 2^-9 apart (halves
    round up). For the interpreter, whose fp32 → e4m3 conversion drops the carry into the exponent (0.499 → 0.25);
    a GPU converts in hardware."""
    exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(p, 1e-30))), -6.0)
    ulp = tl.exp2(exponent - 3.0)
    return tl.floor(p / ulp + 0.5) * ulp


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


__all__ = ["LOG2E", "_dkdv_kernel", "_dq_kernel", "_forward_kernel", "_offsets", "_prefix_kernel", "_preprocess_kernel"]
