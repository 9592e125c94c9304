"""The KV cache's own element type (``kv_dtype``): how k and v are stored, and how a contender reads them back.

A cache may be narrower than the workload's dtype, as serving engines keep it (FlashInfer ``--kv_dtype``,
vLLM ``kv_cache_dtype``, tritonbench ``fp8kv``); q, the output and the upstream gradient stay in the dtype.

- ``bfloat16`` (with dtype float32): the float32 draws cast to bfloat16; no scale.
- fp8 (``float8_e4m3fn``, ``float8_e5m2``): each block of the cache is quantized with one float32 scale,
  scale = amax(|block|) / max(fp8), stored = fp8(x / scale), so the block's largest value lands on the fp8
  type's largest — as FlashInfer and vLLM compute a per-tensor/per-head scale. A block is one (sequence, kv
  head): all its Sk positions; with a paged cache, one (page, kv head): the page's ``page_size`` positions,
  so a page carries its own scale wherever it sits in the pool (``attnbench.workload.paged`` pools the scales with the
  pages). Scales are (B, Hkv, blocks, 1) float32, blocks = 1, or ceil(Sk / page_size) when paged.

Dequantized, a stored value reads x̂ = float32(stored)·scale, rounded to the dtype. The contenders do that
where their users would, inside the timed call, on the tensors they were prepared with (a paged cache's
gather writes the fp8 pages into them first): :func:`kv_loader`. The float64 reference re-derives x̂ on its
own (``attnbench.workload.reference``), so fp8's rounding of k and v is in the data both sides see.

An fp8 forward (``q_dtype`` float8_e4m3fn beside an e4m3 cache, as FlashAttention-3 and cuDNN take it) stores q
the same way, one scale per (sequence, head) over its Sq positions: :func:`quantize_query`, :func:`query_loader`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.workload._problem import Workload
from attnbench.workload.axes import FP8_DTYPES

SCALE_BYTES = 4  # one float32 per block


def is_scaled(w: Workload) -> bool:
    """Whether the cache carries scales (an fp8 kv_dtype)."""
    return w.kv_dtype in FP8_DTYPES


def is_narrowed(w: Workload) -> bool:
    """Whether the cache is stored in a type other than the dtype (a contender must convert it)."""
    return w.kv_dtype != w.dtype


def scale_block(w: Workload) -> int:
    """Cached positions sharing one scale: a page when paged, else the whole sequence."""
    return w.page_size or w.seq_k


def scale_blocks(w: Workload) -> int:
    """Scales per (sequence, kv head) of one of k, v: 1, or the sequence's pages."""
    return -(-w.seq_k // scale_block(w))


def scale_count(w: Workload) -> int:
    """Scales of one of k, v over the batch (0 without an fp8 cache)."""
    return w.batch * w.kv_heads * scale_blocks(w) if is_scaled(w) else 0


def quantize(x: torch.Tensor, w: Workload) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 (B, Hkv, Sk, D) → (the cache in kv_dtype, its (B, Hkv, blocks, 1) float32 scales or None)."""
    if not is_scaled(w):
        return x.to(w.kv_torch_dtype), None
    return _scaled(x, w.kv_torch_dtype, scale_block(w))


def quantize_query(x: torch.Tensor, w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 q (B, Hq, Sq, D) → (q in q_dtype, its (B, Hq, 1, 1) float32 scales): one per (sequence, head)."""
    return _scaled(x, w.q_torch_dtype, x.shape[2])


def _scaled(x: torch.Tensor, stored_dtype: torch.dtype, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, S, D) → (stored in ``stored_dtype``, (B, H, blocks, 1) float32 scales of ``block`` positions each)."""
    batch, heads, seq, head_dim = x.shape
    blocks = -(-seq // block)
    padded = x.new_zeros(batch, heads, blocks * block, head_dim)
    padded[:, :, :seq] = x
    amax = padded.view(batch, heads, blocks, block * head_dim).abs().amax(dim=-1, keepdim=True)
    scale = (amax / torch.finfo(stored_dtype).max).clamp_min(torch.finfo(torch.float32).tiny)  # (B, H, n, 1)
    per_position = scale.repeat_interleave(block, dim=2)[:, :, :seq]  # (B, H, S, 1)
    return (x / per_position).to(stored_dtype), scale


def position_scales(scale: torch.Tensor, block: int, positions: int) -> torch.Tensor:
    """(…, blocks, 1) scales → (…, positions, 1): each position its block's scale (broadcasts against a cache
    with ``positions`` tokens; a single block stays (…, 1, 1))."""
    if scale.shape[-2] == 1:
        return scale
    return scale.repeat_interleave(block, dim=-2)[..., :positions, :]


def dequantize(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The cache in ``dtype``: float32(stored)·scale rounded to ``dtype`` (``scale`` broadcasting against
    ``stored``, see :func:`position_scales`), or a plain cast without a scale."""
    if scale is None:
        return stored.to(dtype)
    return stored.to(torch.float32).mul_(scale).to(dtype)


KvLoad = Callable[[], tuple[torch.Tensor, torch.Tensor]]


def kv_loader(
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    dtype: torch.dtype,
) -> KvLoad:
    """The call a contender makes at the start of its timed callable to read its k and v in ``dtype``: the
    tensors themselves when the cache is in ``dtype``, else both dequantized (scales as given to
    :func:`dequantize`, laid out before timing). It reads ``k`` and ``v`` at each call, so what a paged
    cache's gather wrote into them is what it dequantizes."""
    if k.dtype == dtype:
        return lambda: (k, v)
    return lambda: (dequantize(k.detach(), k_scale, dtype), dequantize(v.detach(), v_scale, dtype))


def query_loader(q: torch.Tensor, q_scale: torch.Tensor | None, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """What a contender calls in its timed callable to read q in ``dtype``: q itself, or an fp8 forward's q
    dequantized (its (B, Hq, 1, 1) scales)."""
    if q_scale is None:
        return lambda: q
    return lambda: dequantize(q.detach(), q_scale, dtype)


def dequantized_bytes(w: Workload) -> float:
    """Memory model of a contender reading a narrowed cache: the dequantized k and v in the dtype, held through
    the call, and the float32 product of one of them before its rounding to a dtype narrower than float32 —
    per (sequence, kv head) for Sk positions, or for whole pages when paged (flex dequantizes the pool)."""
    if not is_narrowed(w):
        return 0.0
    tokens = w.batch * w.kv_heads * scale_blocks(w) * scale_block(w)
    elements = tokens * (w.head_dim + w.head_dim_v)  # k and v
    product = 4 * tokens * max(w.head_dim, w.head_dim_v) if is_scaled(w) and w.torch_dtype.itemsize < 4 else 0
    position_scales = 2 * SCALE_BYTES * tokens if is_scaled(w) and scale_blocks(w) > 1 else 0  # laid out per page
    return float(elements * w.torch_dtype.itemsize + product + position_scales)
