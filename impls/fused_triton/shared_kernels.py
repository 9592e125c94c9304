"""What fused_triton's Triton kernels share: the definitions below and the ``@triton.jit`` pieces that implement
them (offsets, dots, loads, key ranges, block bounds, scores, scales). The kernels are in a file a family:
``forward_kernels`` (the FlashAttention-2 forward and cascade attention's shared-prefix level before it),
``backward_kernels`` (preprocess, dK/dV, dQ), ``decode_kernels`` (split-KV decode and its merge) and
``layout_kernels``.

Definitions (shared by the forward, prefix and backward kernels, and by decode_kernels.py's):

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
