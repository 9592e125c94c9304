"""A FlashAttention-2 forward kernel in Triton, and its launcher :func:`flash_forward`.

One program computes one (BLOCK_M query rows, query head, batch) tile of the output, streaming the keys
and values of its kv head in BLOCK_N blocks with the online-softmax recurrence: a running row maximum
``m``, a running denominator ``l`` and an unnormalised fp32 accumulator, rescaled by ``exp2(m_old − m_new)``
whenever the maximum grows. The softmax scale is folded together with log2(e) so that ``exp2`` replaces
``exp``; the (Sq, Sk) score matrix never exists in memory.

Design points:

* **Masks as key prefixes.** Every mask attnbench knows leaves each query row a prefix of the keys
  visible: row i of batch b sees keys j < limit(b, i), with limit = Sk for ``none``, min(Sk, i + 1 + offset)
  for the causal masks (offset 0 top-left, Sk − Sq bottom-right) and min(Sk, lengths[b]) for ``padding``.
  A tile's rows therefore share the keys below its *first* row's limit (processed without any masking)
  and need nothing past its *last* row's limit: key blocks beyond it are skipped, so causal does about
  half the work, and only the boundary blocks in between pay for the element-wise mask. With a causal mask
  the row tiles are launched last-first, so the longest ones don't run alone at the end.
* **Empty rows.** A row whose limit is 0 (bottom-right causal with Sq > Sk) keeps m = −inf and l = 0;
  the recurrence substitutes 0 for an infinite maximum so that no ``inf − inf`` appears, and the final
  division writes zeros for such rows, as torch SDPA does.
* **GQA.** Query head h reads kv head h // G (G = Hq / Hkv) by index: k and v are never expanded.
* **Head dims that are not powers of two.** ``tl.arange`` needs a power of two, so the head dimension is
  padded to BLOCK_D = next_power_of_2(D) (at least 16, the smallest ``tl.dot`` tile); loads fill the
  padding with zeros (adding nothing to q·kᵀ) and stores leave it out. The sequence axes are masked the
  same way, so any Sq and Sk work.
* **Any strides.** Strides are kernel arguments, so q, k and v are read where they lie (no copies);
  batch and head offsets are 64-bit so large tensors don't overflow.
* **Precision.** Scores, softmax statistics and the accumulator are fp32; p is cast to v's dtype for the
  second matmul (as FlashAttention does). fp32 inputs use ``input_precision="ieee"``: TF32 would miss
  attnbench's fp32 tolerance. (In the interpreter only, bfloat16 operands go to ``tl.dot`` as fp32, whose
  bfloat16 support is missing there; see ``_dot``.)
* **Autotuning.** Block sizes, warps and pipeline stages are tuned per (Sq, Sk, D, mask, dtype) on CUDA;
  the first call of a new shape carries the tuning (attnbench reports it as ``first_call_ms``). Under
  ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, for correctness checks) one small configuration is
  used, because tuning there would take minutes; BLOCK_M ≠ BLOCK_N there on purpose, so the tests
  exercise tiles whose row and key blocks don't line up.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

from attnbench.workload import MASKS

LOG2_E = 1.4426950408889634


def _interpreting() -> bool:
    """Whether ``triton.jit`` (at this module's import) made interpreted functions: Triton's own switch."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in {"1", "true", "on", "yes"}


INTERPRETED = _interpreting()

# (BLOCK_M, BLOCK_N, num_warps, num_stages): the usual FlashAttention-2 tiles on Ampere/Hopper.
_CUDA_TILES = [
    (128, 128, 8, 2),
    (128, 64, 8, 3),
    (128, 64, 4, 3),
    (128, 32, 4, 4),
    (64, 128, 4, 2),
    (64, 64, 4, 3),
    (64, 32, 4, 4),
    (32, 32, 2, 4),
    # single-stage tiles for the widest rows (fp32 at head dim 256), where the pipelined ones don't fit
    (64, 32, 4, 1),
    (32, 16, 2, 1),
]
# Shared memory one program may use: under an A100's 164 KiB (an H100 has 227 KiB).
SHARED_MEMORY_BYTES = 160 * 1024
INTERPRETER_BLOCKS = (32, 16)  # (BLOCK_M, BLOCK_N) under TRITON_INTERPRET=1
CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)
    for m, n, warps, stages in ([(*INTERPRETER_BLOCKS, 1, 1)] if INTERPRETED else _CUDA_TILES)
]


def shared_bytes(block_m: int, block_n: int, stages: int, block_d: int, itemsize: int) -> int:
    """Shared memory a tile needs, roughly: the q tile once, a k and a v tile per pipeline stage."""
    return itemsize * block_d * (block_m + 2 * block_n * max(1, stages))


def _prune_configs(configs: list[Any], named_args: dict[str, Any], **kwargs: Any) -> list[Any]:
    """Drop tiles that can't win (or can't run) before timing them: row blocks far taller than the query
    sequence (only masked-out rows), 128-wide key blocks at head dims over 128 (registers spill), and
    tiles whose k/v pipeline would not fit in shared memory."""
    q = named_args["Q"]
    seq_q, head_dim = named_args["seq_q"], q.shape[-1]  # (older Tritons pass no kwargs)
    block_d, itemsize = max(16, triton.next_power_of_2(head_dim)), q.element_size()
    rows = max(32, triton.next_power_of_2(seq_q))

    def fits(c: Any) -> bool:
        m, n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        return (
            m <= rows
            and not (head_dim > 128 and n > 64)
            and shared_bytes(m, n, c.num_stages, block_d, itemsize) <= SHARED_MEMORY_BYTES
        )

    kept = [c for c in configs if fits(c)]
    return kept or [min(configs, key=lambda c: shared_bytes(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages,
                                                            block_d, itemsize))]  # fmt: skip


@triton.jit
def _dot(a, b, acc, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a·b (+ acc) in fp32. ``UPCAST`` (interpreter and bfloat16 only) converts the operands to fp32 first:
    the interpreter's tl.dot multiplies bfloat16 bit patterns as integers (triton-lang/triton#11584), while
    fp32 products of bfloat16 values are exactly what the tensor cores compute."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)


@triton.jit
def _attend_block(
    acc, m_i, l_i, q, k_block_ptrs, v_block_ptrs, start_n, offs_n, d_ok, row_limit, key_limit, qk_scale,
    stride_kn, stride_vn,
    MASKED: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One BLOCK_N block of keys into the running (acc, m, l) of a tile. ``MASKED`` blocks load only keys
    below ``key_limit`` and hide keys at or past each row's ``row_limit``; unmasked blocks lie wholly
    below every row's limit."""
    keys = start_n + offs_n  # (BLOCK_N,)
    k_ptrs = k_block_ptrs + start_n * stride_kn
    v_ptrs = v_block_ptrs + start_n * stride_vn
    if MASKED:
        k_t = tl.load(k_ptrs, mask=d_ok[:, None] & (keys[None, :] < key_limit), other=0.0)  # (BLOCK_D, BLOCK_N)
        v = tl.load(v_ptrs, mask=(keys[:, None] < key_limit) & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
    else:
        k_t = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    qk = _dot(q, k_t, None, INPUT_PRECISION, UPCAST) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
    if MASKED:
        qk = tl.where(keys[None, :] < row_limit[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: avoid inf - inf
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = m_new
    p = tl.math.exp2(qk - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)  # 0 on a row's first visible block (m_i = -inf)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], INPUT_PRECISION, UPCAST)
    return acc, m_new, l_i


@triton.autotune(
    configs=CONFIGS,
    key=["seq_q", "seq_k", "HEAD_DIM", "CAUSAL", "PADDED"],  # Triton adds the tensors' dtypes to the key
    prune_configs_by={"early_config_prune": _prune_configs},
)
@triton.jit
def _flash_forward_kernel(
    Q, K, V, Out, Lengths,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    qk_scale, heads, gqa_group, seq_q, seq_k, causal_offset,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, PADDED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    if CAUSAL:  # the last row tiles see the most keys: start them first, so the short ones fill the tail
        tile = tl.num_programs(0) - 1 - tile
    start_m = tile * BLOCK_M
    batch_head = tl.program_id(1)
    b = (batch_head // heads).to(tl.int64)
    h = batch_head % heads
    kv_h = (h // gqa_group).to(tl.int64)  # GQA: query head h reads kv head h // G
    h = h.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM  # BLOCK_D pads the head dim to a power of two
    m_ok = offs_m < seq_q

    # Row i sees keys j < row_limit[i]. first_limit / last_limit: the limits of the tile's first and last
    # real rows (the smallest and largest, since limits never decrease down the rows).
    row_limit = tl.zeros([BLOCK_M], dtype=tl.int32) + seq_k
    first_limit = seq_k
    last_limit = seq_k
    if CAUSAL:
        row_limit = tl.minimum(row_limit, offs_m + 1 + causal_offset)
        first_limit = tl.minimum(first_limit, start_m + 1 + causal_offset)
        last_limit = tl.minimum(last_limit, tl.minimum(start_m + BLOCK_M, seq_q) + causal_offset)
    if PADDED:
        length = tl.load(Lengths + b)
        row_limit = tl.minimum(row_limit, length)
        first_limit = tl.minimum(first_limit, length)
        last_limit = tl.minimum(last_limit, length)
    first_limit = tl.maximum(first_limit, 0)
    last_limit = tl.maximum(last_limit, 0)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    k_block_ptrs = K + b * stride_kb + kv_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_block_ptrs = V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Key blocks every row of the tile sees in full: no masking at all.
    unmasked_end = (first_limit // BLOCK_N) * BLOCK_N
    for start_n in range(0, unmasked_end, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q, k_block_ptrs, v_block_ptrs, start_n, offs_n, d_ok, row_limit, last_limit,
            qk_scale, stride_kn, stride_vn, False, INPUT_PRECISION, UPCAST,
        )  # fmt: skip
    # Boundary blocks, up to the last row's limit; blocks past it are skipped.
    for start_n in range(unmasked_end, last_limit, BLOCK_N):
        acc, m_i, l_i = _attend_block(
            acc, m_i, l_i, q, k_block_ptrs, v_block_ptrs, start_n, offs_n, d_ok, row_limit, last_limit,
            qk_scale, stride_kn, stride_vn, True, INPUT_PRECISION, UPCAST,
        )  # fmt: skip

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # rows that saw no key: acc = 0, so zeros
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def causal_offset(mask: str, seq_q: int, seq_k: int) -> int | None:
    """The diagonal offset of a causal mask (row i sees keys j <= i + offset), or None for other masks."""
    if mask == "causal":
        return 0
    if mask == "causal_bottom_right":
        return seq_k - seq_q
    return None


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: str = "none",
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v for q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), any strides; returns
    a new (B, Hq, Sq, D) tensor in q's dtype.

    ``mask`` is one of attnbench's masks; ``padding`` needs ``lengths``, an int32 tensor (B,) of valid
    key counts on q's device (build it once, outside any timed region).
    """
    B, Hq, Sq, D = q.shape
    _, Hkv, Sk, _ = k.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or Hq % Hkv:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if mask not in MASKS:
        raise ValueError(f"unknown mask {mask!r}; known: {', '.join(MASKS)}")
    if mask == "padding" and (lengths is None or lengths.shape != (B,) or lengths.dtype != torch.int32):
        raise ValueError("mask 'padding' needs lengths: an int32 tensor of shape (B,)")
    offset = causal_offset(mask, Sq, Sk)
    out = q.new_empty(B, Hq, Sq, D)

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return triton.cdiv(Sq, meta["BLOCK_M"]), B * Hq

    _flash_forward_kernel[grid](
        q, k, v, out, lengths if mask == "padding" else None,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        scale * LOG2_E, Hq, Hq // Hkv, Sq, Sk, offset or 0,
        HEAD_DIM=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        CAUSAL=offset is not None,
        PADDED=mask == "padding",
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST=INTERPRETED and q.dtype == torch.bfloat16,
    )  # fmt: skip
    return out


__all__ = ["CONFIGS", "INTERPRETED", "INTERPRETER_BLOCKS", "causal_offset", "flash_forward", "shared_bytes"]
