"""Build, cache and call the fused CPU kernel, with no build system at all: ``fused_cpu_kernel.cpp`` (forward),
``fused_cpu_backward.cpp``, ``fused_cpu_decode.cpp`` (forward for few query rows), on ``fused_cpu_tiles.h``.

The C++ sources have plain C entry points, so it needs neither torch's headers nor pybind11: one g++ call
(about 2 s) builds a shared library that ctypes loads. attnbench.measure.native_build compiles it at first use with
``-O3 -march=native`` (so the vectors are AVX-512 where the CPU has it) and caches it under
``$ATTNBENCH_CACHE_DIR/kernels`` (default ``~/.cache/attnbench/kernels``), keyed by the sources and
headers, the compiler, the flags and the CPU's feature flags — a cache shared between different machines
never hands one a binary built for the other. ``$CXX`` picks the compiler (default ``g++``).

The decode entry (``Kernel.decode``) takes q in float32 or bfloat16 and k, v in the cache's own type (``KV_TYPES``),
with an fp8 cache's scales, learned sinks and a ragged batch's row limits in ``CacheOptions``.

Anything that goes wrong (no compiler, a compile error, a library that won't load) is kept as a
one-line reason: the contender is then ``unavailable`` with it, never a crash.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnbench.measure.native_build import BuildError, load_library

HERE = Path(__file__).parent
SOURCES = tuple(HERE / f"fused_cpu_{part}.cpp" for part in ("kernel", "backward", "decode"))  # one library
HEADERS = (
    HERE / "fused_cpu_tiles.h",
    HERE / "fused_cpu_bf16.h",
    HERE / "fused_cpu_pipeline.h",
)  # part of the build's identity too
# ranges: the forward's per-row [lo, hi); the decode kernel's per-row prefixes [0, hi) (CacheOptions.row_hi)
MASK_CODES = {"none": 0, "causal": 1, "causal_bottom_right": 2, "padding": 3, "ranges": 4}
VECTOR = 16  # floats per vector in the kernel: the head dim of v is padded to it


class ForwardExtras(ctypes.Structure):
    """fused_cpu_kernel.cpp's ForwardExtras: per-row key ranges (mask "ranges"), softcap, ALiBi slopes, sink
    logits, and v's layout when it is not dense (a strided view, or Dv ≠ D in bf16)."""

    _fields_ = [
        ("lo", ctypes.c_void_p),
        ("hi", ctypes.c_void_p),
        ("softcap", ctypes.c_float),
        ("alibi", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p),
        ("v_stride", ctypes.c_int64),
        ("dv", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
    ]


@dataclass(frozen=True)
class ScoreOptions:
    """What the forward takes beyond the masks: ``ranges`` (lo, hi), each (B, Sq) int64, row i of batch b
    seeing keys [lo, hi) (with mask "ranges"); ``softcap`` (scores ← softcap·tanh(scores / softcap));
    ``alibi`` (H float32 slopes: scores −= slope_h·|i + Sk − Sq − j|); ``sinks`` (H float32 learned logits,
    natural log: exp(sink_h) joins each row's denominator and its log-sum-exp). Scores are q·kᵀ·scale."""

    ranges: tuple[torch.Tensor, torch.Tensor] | None = None
    softcap: float | None = None
    alibi: torch.Tensor | None = None
    sinks: torch.Tensor | None = None

    def structure(self, batch: int, heads: int, seq_q: int, layout: tuple[int, ...] = (0, 0, 0, 0)) -> ForwardExtras:
        lo = hi = None
        if self.ranges is not None:
            lo, hi = self.ranges
            for bound in (lo, hi):
                if bound.dtype != torch.int64 or bound.shape != (batch, seq_q) or not bound.is_contiguous():
                    raise ValueError(f"key ranges must be contiguous int64 of shape ({batch}, {seq_q})")
        for name, per_head in (("alibi slopes", self.alibi), ("sinks", self.sinks)):
            if per_head is not None and (
                per_head.dtype != torch.float32 or per_head.shape != (heads,) or not per_head.is_contiguous()
            ):
                raise ValueError(f"{name} must be contiguous float32 of shape ({heads},)")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"softcap must be positive, got {self.softcap}")
        lo_p, hi_p, alibi_p, sinks_p = (None if t is None else t.data_ptr() for t in (lo, hi, self.alibi, self.sinks))
        return ForwardExtras(lo_p, hi_p, self.softcap or 0.0, alibi_p, sinks_p, *layout)


# The KV cache types the decode kernel reads as stored (fused_cpu_decode.cpp's KvType)
KV_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}


class DecodeCache(ctypes.Structure):
    """fused_cpu_decode.cpp's DecodeCache: the types of q and of the cache, v's head dim and row stride, fp8
    scales, learned sinks."""

    _fields_ = [
        ("q_type", ctypes.c_int64),
        ("kv_type", ctypes.c_int64),
        ("head_dim_v", ctypes.c_int64),
        ("v_row", ctypes.c_int64),
        ("k_scale", ctypes.c_void_p),
        ("v_scale", ctypes.c_void_p),
        ("scale_block", ctypes.c_int64),
        ("sinks", ctypes.c_void_p),
        ("row_hi", ctypes.c_void_p),
        ("k_head", ctypes.c_int64),
        ("v_head", ctypes.c_int64),
    ]


@dataclass(frozen=True)
class CacheOptions:
    """What the decode kernel takes beyond q, k, v and the mask: an fp8 cache's float32 scales ``k_scale`` and
    ``v_scale`` (``attnbench.workload.kv_cache``: contiguous, (B, Hkv, blocks, 1) with one scale per ``scale_block``
    positions; paged, (num_pages, Hkv, 1, 1), one per pool page), and ``sinks``, (H,) float32 learned sink
    logits (natural log) that join each row's softmax denominator; ``row_hi`` (B, Sq) int64 with mask "ranges",
    row i of batch b seeing keys [0, row_hi[b, i]) (a ragged batch's rows: ``masks.key_ranges``' hi)."""

    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    scale_block: int | None = None  # default: the whole sequence (one scale per sequence and kv head)
    sinks: torch.Tensor | None = None
    row_hi: torch.Tensor | None = None

    def structure(
        self,
        kv_type: int,
        q_dtype: torch.dtype,
        head_dim_v: int,
        v_row: int,
        block: int,
        blocks: int,
        rows: tuple[int, int, int],
        heads_apart: tuple[int, int] = (0, 0),
    ) -> DecodeCache:
        """The C structure, after checking the scales (``blocks`` of each, one per ``block`` positions of a
        contiguous cache), the sinks and the row limits (``rows``: B, H, Sq)."""
        batch, heads, seq_q = rows
        scaled = kv_type >= KV_TYPES[torch.float8_e4m3fn]
        if scaled and (self.k_scale is None or self.v_scale is None):
            raise ValueError("an fp8 cache needs its k_scale and v_scale")
        for name, scale in (("k_scale", self.k_scale), ("v_scale", self.v_scale)):
            if scale is None or not scaled:
                continue
            if scale.dtype != torch.float32 or not scale.is_contiguous() or scale.numel() != blocks:
                raise ValueError(f"{name} must be contiguous float32 with {blocks} scales, got {tuple(scale.shape)}")
        if block < 1:
            raise ValueError(f"scale_block must be positive, got {block}")
        sinks = self.sinks
        if sinks is not None and (sinks.dtype != torch.float32 or sinks.shape != (heads,) or not sinks.is_contiguous()):
            raise ValueError(f"sinks must be contiguous float32 of shape ({heads},)")
        pointers = [
            None if t is None or (t is not sinks and not scaled) else t.data_ptr()
            for t in (self.k_scale, self.v_scale, sinks)
        ]
        hi = self.row_hi
        if hi is not None and (hi.dtype != torch.int64 or hi.shape != (batch, seq_q) or not hi.is_contiguous()):
            raise ValueError(f"row_hi must be contiguous int64 of shape ({batch}, {seq_q})")
        q_type = 1 if q_dtype == torch.bfloat16 else 0
        row_hi = None if hi is None else hi.data_ptr()
        return DecodeCache(
            q_type, kv_type, head_dim_v, v_row, pointers[0], pointers[1], block, pointers[2], row_hi, *heads_apart
        )


@dataclass(frozen=True)
class Kernel:
    library: ctypes.CDLL
    path: Path

    def scratch_floats(self, block_q: int, block_k: int, head_dim: int, padded_dim: int) -> int:
        return int(self.library.attnbench_fused_scratch_floats(block_q, block_k, head_dim, padded_dim))

    def packed_keys(self, seq_k: int) -> int:
        return int(self.library.attnbench_fused_packed_keys(seq_k))

    def backward_scratch_floats(
        self, q: torch.Tensor, k: torch.Tensor, block_q: int, block_k: int, threads: int
    ) -> int:
        (batch, heads, seq_q, padded), (kv_heads, seq_k) = q.shape, k.shape[1:3]
        args = (batch, heads, kv_heads, seq_q, seq_k, padded, block_q, block_k, threads)
        return int(self.library.attnbench_fused_backward_scratch_floats(*args))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        kt: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None = None,
        *,
        scale: float,
        mask: str,
        lengths: torch.Tensor | None,
        block_q: int,
        block_k: int,
        threads: int,
        scratch: torch.Tensor,
        options: ScoreOptions | None = None,
    ) -> int:
        """out (B, H, Sq, Dp) = attention of q (B, H, Sq, D) over k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dp), all
        float32 and contiguous — but v, which may be a view whose rows are evenly spaced (MLA's values, the first
        Dv channels of its latent keys); Dp, a multiple of VECTOR, is the value head dim and need not equal D; kt is
        scratch for B·Hkv·packed_keys(Sk)·D floats; lse (B, H, Sq), when given, receives each row's
        log-sum-exp for the backward. Returns the number of score entries computed."""
        batch, heads, seq_q, head_dim = q.shape
        kv_heads, seq_k = k.shape[1], k.shape[2]
        _check_float32(q=q, kt=kt, out=out, scratch=scratch)
        if v.dtype != torch.float32 or k.dtype != torch.float32:
            raise ValueError("k and v must be float32 CPU tensors")
        (_, k_head_stride), (v_stride, v_head_stride) = strides(k), strides(v)
        padded = v.shape[-1]
        if k.shape[0] != batch or heads % kv_heads or v.shape[:3] != k.shape[:3] or k.shape[3] != head_dim:
            raise ValueError(f"shapes don't match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if out.shape != (batch, heads, seq_q, padded) or padded % VECTOR:
            raise ValueError(f"out must be {(batch, heads, seq_q, padded)} with the head dim padded to {VECTOR}")
        if kt.numel() < batch * kv_heads * self.packed_keys(seq_k) * head_dim:
            raise ValueError(f"kt holds {kt.numel()} floats, fewer than the packed keys need")
        if scratch.numel() < threads * self.scratch_floats(block_q, block_k, head_dim, padded):
            raise ValueError(f"scratch holds {scratch.numel()} floats, fewer than {threads} threads need")
        shape = (batch, heads, kv_heads, seq_q, seq_k, head_dim, padded)
        pointers = (q, k, kt, v, out)
        return self._forward_call(
            self.library.attnbench_fused_forward,
            "fused_cpu",
            pointers,
            lse,
            shape,
            scale=scale,
            mask=mask,
            lengths=lengths,
            block_q=block_q,
            block_k=block_k,
            threads=threads,
            scratch=scratch,
            options=options,
            layout=(v_stride, 0, k_head_stride, v_head_stride),
        )

    def has_bf16(self) -> bool:
        """Whether this build has the bfloat16 forward (AVX512-BF16 dot products)."""
        return bool(self.library.attnbench_fused_has_bf16())

    def forward_bf16(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        *,
        scale: float,
        mask: str,
        lengths: torch.Tensor | None,
        block_q: int,
        block_k: int,
        threads: int,
        options: ScoreOptions | None = None,
    ) -> int:
        """out (B, H, Sq, Dp) float32 = attention of bfloat16 q (B, H, Sq, D) over k (B, Hkv, Sk, D) and v (B, Hkv,
        Sk, Dv), D and Dv even, Dp ≥ Dv, q and k contiguous, v contiguous or a view with evenly spaced rows, with
        AVX512-BF16 dot products and float32 softmax and accumulators; lse as in forward. Returns the number of
        score entries computed."""
        for name, t in {"q": q, "k": k, "v": v}.items():
            if t.dtype != torch.bfloat16 or not (t.is_contiguous() or name != "q") or t.device.type != "cpu":
                raise ValueError(f"{name} must be a contiguous bfloat16 CPU tensor")
        _check_float32(out=out)
        (k_stride, k_head_stride), (v_stride, v_head_stride) = strides(k), strides(v)
        if k_stride != k.shape[-1]:
            raise ValueError(f"k's rows must be dense, got strides {k.stride()}")
        batch, heads, seq_q, head_dim = q.shape
        kv_heads, seq_k, padded, dv = k.shape[1], k.shape[2], out.shape[-1], v.shape[-1]
        if k.shape[0] != batch or heads % kv_heads or v.shape[:3] != k.shape[:3] or k.shape[3] != head_dim:
            raise ValueError(f"shapes don't match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if head_dim % 2 or dv % 2:
            raise ValueError(f"the bf16 forward takes even head dims, got D {head_dim} and Dv {dv}")
        if out.shape != (batch, heads, seq_q, padded) or padded < dv or padded % VECTOR:
            raise ValueError(f"out must be {(batch, heads, seq_q, padded)} with the head dim padded to {VECTOR}")
        keys = batch * kv_heads * self.packed_keys(seq_k)
        kt16, v16 = torch.empty(keys * head_dim, dtype=torch.bfloat16), torch.empty(keys * padded, dtype=torch.bfloat16)
        scratch = torch.empty(threads * self.scratch_floats(block_q, block_k, head_dim, padded))
        shape = (batch, heads, kv_heads, seq_q, seq_k, head_dim, padded)
        pointers = (q, k, kt16, v, v16, out)
        return self._forward_call(
            self.library.attnbench_fused_forward_bf16,
            "fused_cpu bf16",
            pointers,
            lse,
            shape,
            scale=scale,
            mask=mask,
            lengths=lengths,
            block_q=block_q,
            block_k=block_k,
            threads=threads,
            scratch=scratch,
            options=options,
            layout=(v_stride, dv, k_head_stride, v_head_stride),
        )

    def _forward_call(
        self,
        entry: Any,
        what: str,
        pointers: tuple[torch.Tensor, ...],
        lse: torch.Tensor | None,
        shape: tuple[int, ...],
        *,
        scale: float,
        mask: str,
        lengths: torch.Tensor | None,
        block_q: int,
        block_k: int,
        threads: int,
        scratch: torch.Tensor,
        options: ScoreOptions | None,
        layout: tuple[int, int, int, int] = (0, 0, 0, 0),
    ) -> int:
        """Both forwards' shared checks (lse, lengths) and C call: `pointers` (the tensors before lse), then
        lse, the shape (B, H, Hkv, Sq, Sk, D, Dp), scale, mask, lengths, extras, sizes, scratch, tiles.
        ``layout`` (v's row stride, its row length, k's and v's kv-head strides) rides in the extras."""
        batch, heads, _, seq_q = shape[:4]
        if lse is not None:
            _check_float32(lse=lse)
            if lse.shape != (batch, heads, seq_q):
                raise ValueError(f"lse must be {(batch, heads, seq_q)}, got {tuple(lse.shape)}")
        _check_lengths(mask, lengths, batch)
        extras = ctypes.byref((options or ScoreOptions()).structure(batch, heads, seq_q, layout))
        tiles = ctypes.c_int64(0)
        status = entry(
            *(t.data_ptr() for t in pointers),
            None if lse is None else lse.data_ptr(),
            *shape,
            scale,
            MASK_CODES[mask],
            None if lengths is None else lengths.data_ptr(),
            extras,
            block_q,
            block_k,
            threads,
            scratch.data_ptr(),
            ctypes.byref(tiles),
        )
        if status != 0:
            raise RuntimeError(f"{what} kernel rejected its arguments (status {status})")
        return tiles.value

    def decode_max_rows(self) -> int:
        return int(self.library.attnbench_fused_decode_max_rows())

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        *,
        scale: float,
        mask: str,
        lengths: torch.Tensor | None,
        threads: int,
        pages: torch.Tensor | None = None,
        seq_k: int | None = None,
        cache: CacheOptions | None = None,
    ) -> tuple[int, int]:
        """out (B, H, Sq, Dvp) float32 = attention of q (B, H, Sq, D), Sq ≤ decode_max_rows(), float32 or
        bfloat16, over k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv) in the cache's type (float32, bfloat16,
        float8_e4m3fn, float8_e5m2: read as stored and widened in registers, fused_cpu_decode.cpp), Dvp = Dv
        padded to a multiple of 16; keys split across threads when B·Hkv is too few to feed them; lse as in
        forward. k contiguous; v contiguous or a view of k's first Dv channels (a latent cache). Returns (score
        entries computed, key splits). Paged KV: ``pages`` (B, max_pages) int32 indexes k (num_pages, Hkv,
        page_size, D) and v (…, Dv) pools, the keys of batch b being its pages in order; page_size a multiple of
        16; ``seq_k``, the cache length when the last page is partly used (default: every page full; the masks'
        offset Sk − Sq is taken from it). ``cache``: fp8 scales and learned sinks (``CacheOptions``)."""
        cache = cache or CacheOptions()
        if q.dtype not in (torch.float32, torch.bfloat16) or not q.is_contiguous() or q.device.type != "cpu":
            raise ValueError("q must be a contiguous float32 or bfloat16 CPU tensor")
        if k.dtype not in KV_TYPES or v.dtype != k.dtype or k.device.type != "cpu" or v.device.type != "cpu":
            raise ValueError(f"k and v must be CPU tensors of one cache type ({', '.join(map(str, KV_TYPES))})")
        _check_float32(out=out)
        batch, heads, seq_q, head_dim = q.shape
        kv_heads, head_dim_v = k.shape[1], v.shape[-1]
        padded = -(-head_dim_v // VECTOR) * VECTOR
        # read in place: contiguous, a latent cache's values (a view of its keys), a suffix (kv heads apart)
        (k_row, k_head), (v_row, v_head) = strides(k), strides(v)
        if k_row != k.shape[-1]:
            raise ValueError(f"k's rows must be dense, got strides {k.stride()}")
        heads_apart = (0, 0) if pages is not None else (k_head, v_head)
        page_size = max_pages = 0
        if pages is not None:
            page_size, max_pages = k.shape[2], pages.shape[1]
            seq_k = max_pages * page_size if seq_k is None else seq_k
            if not 0 < seq_k <= max_pages * page_size:
                raise ValueError(f"seq_k {seq_k} must lie in [1, {max_pages * page_size}] (the pages' keys)")
            if pages.dtype != torch.int32 or pages.shape[0] != batch or not pages.is_contiguous() or page_size % 16:
                raise ValueError(f"pages must be contiguous int32 ({batch}, max_pages), pages of a multiple of 16")
            if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= k.shape[0]):
                raise ValueError(f"page table entries must lie in [0, {k.shape[0]})")
        elif k.shape[0] != batch or seq_k not in (None, k.shape[2]):
            raise ValueError(f"shapes don't match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        else:
            seq_k = k.shape[2]
        if heads % kv_heads or v.shape[:3] != k.shape[:3] or k.shape[3] != head_dim:
            raise ValueError(f"shapes don't match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if out.shape != (batch, heads, seq_q, padded):
            raise ValueError(f"out must be {(batch, heads, seq_q, padded)}: v's head dim padded to {VECTOR}")
        if lse is not None:
            _check_float32(lse=lse)
            if lse.shape != (batch, heads, seq_q):
                raise ValueError(f"lse must be {(batch, heads, seq_q)}, got {tuple(lse.shape)}")
        _check_lengths(mask, lengths, batch)
        block = cache.scale_block or seq_k
        blocks = k.shape[0] * kv_heads if pages is not None else batch * kv_heads * -(-seq_k // block)
        rows = (batch, heads, seq_q)
        extras = cache.structure(KV_TYPES[k.dtype], q.dtype, head_dim_v, v_row, block, blocks, rows, heads_apart)
        if mask == "ranges" and cache.row_hi is None:
            raise ValueError("mask 'ranges' needs row_hi (the decode kernel's rows see key prefixes [0, hi))")
        args = (batch, heads, kv_heads, seq_q, seq_k, head_dim, head_dim_v, threads)
        scratch = torch.empty(int(self.library.attnbench_fused_decode_kv_scratch_floats(*args)))
        tiles, splits = ctypes.c_int64(0), ctypes.c_int64(0)
        status = self.library.attnbench_fused_decode_kv(
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            out.data_ptr(),
            None if lse is None else lse.data_ptr(),
            batch,
            heads,
            kv_heads,
            seq_q,
            seq_k,
            head_dim,
            scale,
            MASK_CODES[mask],
            None if lengths is None else lengths.data_ptr(),
            None if pages is None else pages.data_ptr(),
            page_size,
            max_pages,
            ctypes.byref(extras),
            threads,
            scratch.data_ptr(),
            ctypes.byref(tiles),
            ctypes.byref(splits),
        )
        if status != 0:
            raise RuntimeError(f"fused_cpu decode kernel rejected its arguments (status {status})")
        return tiles.value, splits.value

    def backward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        dout: torch.Tensor,
        lse: torch.Tensor,
        *,
        scale: float,
        mask: str,
        lengths: torch.Tensor | None,
        block_q: int,
        block_k: int,
        threads: int,
        ranges: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(dq, dk, dv) of attention for q, out, dout (B, H, Sq, Dp), k, v (B, Hkv, Sk, Dp) and the forward's
        lse (B, H, Sq), all float32 and contiguous, the head dim zero-padded to a multiple of VECTOR; dk and dv
        summed over each kv head's query heads; ``ranges`` (lo, hi) for mask "ranges", as in the forward. Also
        returns the number of score entries computed."""
        _check_float32(q=q, k=k, v=v, out=out, dout=dout, lse=lse)
        batch, heads, seq_q, padded = q.shape
        kv_heads, seq_k = k.shape[1], k.shape[2]
        if padded % VECTOR or k.shape != v.shape or k.shape[0] != batch or k.shape[3] != padded or heads % kv_heads:
            raise ValueError(f"shapes don't match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if out.shape != q.shape or dout.shape != q.shape or lse.shape != q.shape[:3]:
            raise ValueError(f"out, dout must be {tuple(q.shape)} and lse {tuple(q.shape[:3])}")
        _check_lengths(mask, lengths, batch)
        if ranges is not None:
            ScoreOptions(ranges=ranges).structure(batch, heads, seq_q)  # checks their dtype and shape
        scratch = torch.empty(self.backward_scratch_floats(q, k, block_q, block_k, threads))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        tiles = ctypes.c_int64(0)
        status = self.library.attnbench_fused_backward(
            *(t.data_ptr() for t in (q, k, v, out, dout, lse, dq, dk, dv)),
            batch,
            heads,
            kv_heads,
            seq_q,
            seq_k,
            padded,
            scale,
            MASK_CODES[mask],
            None if lengths is None else lengths.data_ptr(),
            None if ranges is None else ranges[0].data_ptr(),
            None if ranges is None else ranges[1].data_ptr(),
            block_q,
            block_k,
            threads,
            scratch.data_ptr(),
            ctypes.byref(tiles),
        )
        if status != 0:
            raise RuntimeError(f"fused_cpu backward kernel rejected its arguments (status {status})")
        return dq, dk, dv, tiles.value


def strides(x: torch.Tensor) -> tuple[int, int]:
    """(row stride, kv-head stride) in elements of k or v (B, Hkv, Sk, d) as the forward kernel reads it in
    place: rows evenly spaced with unit channel stride, kv head b·Hkv + h at (b·Hkv + h)·head stride — a
    contiguous tensor, MLA's values (the first Dv channels of the latent keys), a shared prefix (the first P
    keys of a longer cache). Else ValueError: the caller copies it."""
    batch, kv_heads, seq_k, dim = x.shape
    row = x.stride(2) if seq_k > 1 else dim
    head = x.stride(1) if kv_heads > 1 else (x.stride(0) if batch > 1 else seq_k * row)
    if x.device.type != "cpu" or (dim > 1 and x.stride(3) != 1) or (batch > 1 and x.stride(0) != kv_heads * head):
        raise ValueError(f"k and v must have unit channel stride and evenly spaced kv heads, got {x.stride()}")
    if row < dim or head < seq_k * row:
        raise ValueError(f"rows or heads overlap: strides {x.stride()} for shape {tuple(x.shape)}")
    return row, head


def _check_float32(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"{name} must be a contiguous float32 CPU tensor")


def _check_lengths(mask: str, lengths: torch.Tensor | None, batch: int) -> None:
    if lengths is not None and (lengths.dtype != torch.int64 or lengths.shape != (batch,)):
        raise ValueError(f"lengths must be int64 of shape ({batch},), got {lengths.dtype} {tuple(lengths.shape)}")
    if mask == "padding" and lengths is None:
        raise ValueError("mask 'padding' needs lengths")


def _declare(library: ctypes.CDLL) -> None:
    """The C signatures (fused_cpu_kernel.cpp's extern "C" block), so ctypes converts every argument."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    library.attnbench_fused_scratch_floats.restype = i64
    library.attnbench_fused_scratch_floats.argtypes = [i64] * 4
    library.attnbench_fused_packed_keys.restype = i64
    library.attnbench_fused_packed_keys.argtypes = [i64]
    forward: list[type] = [ptr] * 6  # q, k, kt, v, out, lse
    forward += [i64] * 7  # batch, heads, kv_heads, seq_q, seq_k, head_dim, dp
    forward += [ctypes.c_float, i64, ptr, ctypes.POINTER(ForwardExtras)]  # scale, mask, lengths, extras
    forward += [i64] * 3  # block_q, block_k, nthreads
    forward += [ptr, ctypes.POINTER(i64)]  # scratch, tiles
    library.attnbench_fused_forward.restype = ctypes.c_int
    library.attnbench_fused_forward.argtypes = forward
    library.attnbench_fused_backward_scratch_floats.restype = i64
    library.attnbench_fused_backward_scratch_floats.argtypes = [i64] * 9
    backward: list[type] = [ptr] * 9  # q, k, v, out, dout, lse, dq, dk, dv
    backward += [i64] * 6  # batch, heads, kv_heads, seq_q, seq_k, dp
    backward += [ctypes.c_float, i64, ptr, ptr, ptr]  # scale, mask, lengths, row_lo, row_hi
    backward += [i64] * 3  # block_q, block_k, nthreads
    backward += [ptr, ctypes.POINTER(i64)]  # scratch, tiles
    library.attnbench_fused_backward.restype = ctypes.c_int
    library.attnbench_fused_backward.argtypes = backward
    library.attnbench_fused_has_bf16.restype = ctypes.c_int
    library.attnbench_fused_has_bf16.argtypes = []
    bf16: list[type] = [ptr] * 7  # q, k, kt16, v, v16, out, lse
    bf16 += [i64] * 7  # batch, heads, kv_heads, seq_q, seq_k, head_dim, dp
    bf16 += [ctypes.c_float, i64, ptr, ctypes.POINTER(ForwardExtras)]  # scale, mask, lengths, extras
    bf16 += [i64] * 3  # block_q, block_k, nthreads
    bf16 += [ptr, ctypes.POINTER(i64)]  # scratch, tiles
    library.attnbench_fused_forward_bf16.restype = ctypes.c_int
    library.attnbench_fused_forward_bf16.argtypes = bf16
    library.attnbench_fused_decode_max_rows.restype = i64
    library.attnbench_fused_decode_max_rows.argtypes = []
    library.attnbench_fused_decode_scratch_floats.restype = i64
    library.attnbench_fused_decode_scratch_floats.argtypes = [i64] * 7
    decode: list[type] = [ptr] * 5  # q, k, v, out, lse
    decode += [i64] * 7  # batch, heads, kv_heads, seq_q, seq_k, head_dim, dp
    decode += [ctypes.c_float, i64, ptr, ptr, i64, i64, i64]  # scale, mask, lengths, pages, page size/count, nthreads
    decode += [ptr, ctypes.POINTER(i64), ctypes.POINTER(i64)]  # scratch, tiles, splits
    library.attnbench_fused_decode.restype = ctypes.c_int
    library.attnbench_fused_decode.argtypes = decode
    library.attnbench_fused_decode_kv_scratch_floats.restype = i64
    library.attnbench_fused_decode_kv_scratch_floats.argtypes = [i64] * 8
    decode_kv: list[type] = [ptr] * 5  # q, k, v, out, lse
    decode_kv += [i64] * 6  # batch, heads, kv_heads, seq_q, seq_k, head_dim
    decode_kv += [ctypes.c_float, i64, ptr, ptr, i64, i64]  # scale, mask, lengths, pages, page size/count
    decode_kv += [ctypes.POINTER(DecodeCache), i64, ptr, ctypes.POINTER(i64), ctypes.POINTER(i64)]
    library.attnbench_fused_decode_kv.restype = ctypes.c_int
    library.attnbench_fused_decode_kv.argtypes = decode_kv  # cache, nthreads, scratch, tiles, splits


def load() -> Kernel:
    """The built kernel, compiling it on first use; raises BuildError with the reason when it can't."""
    built = _build()
    if isinstance(built, str):
        raise BuildError(built)
    return built


@functools.cache  # once per process, failures included: a missing compiler is not retried per case
def _build() -> Kernel | str:
    try:
        built = load_library("fused_cpu", SOURCES, HEADERS)
    except BuildError as exc:
        return str(exc)
    _declare(built.library)
    return Kernel(built.library, built.path)


def unavailable_reason() -> str | None:
    try:
        load()
    except BuildError as exc:
        return str(exc)
    return None
