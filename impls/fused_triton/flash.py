"""fused_triton's Python side: the attention function, its plan, the launches and the autograd wrapper.

``flash_attention(q, k, v, ...)`` computes softmax(q·kᵀ·scale + mask [+ score modifiers])·v with the
kernels of ``forward_kernels`` (``shared_kernels``' docstring has the algorithm) and, when q, k, v or the
sinks require grad, records a backward that runs the FlashAttention-2 backward kernels (``backward_kernels``).
q is (B, Hq, Sq, D), k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv) — Dv may differ from D, and v may be a view of k
(an MLA latent cache's first Dv channels: read in place through k's memory). Its keyword arguments:

* ``mask``: one of attnbench's masks (``none``, ``causal`` top-left, ``causal_bottom_right``,
  ``padding`` with ``lengths``, an int32 (B,) tensor of valid key counts; ``chunked`` with ``chunk``;
  ``mixed`` with ``row_ranges``);
* ``window=W``: a sliding window, key j visible to row i iff i + (Sk − Sq) − W < j ≤ i + (Sk − Sq);
* ``document_ids`` (B, S) or ``cu_seqlens`` (n + 1,) offsets shared by the batch: row i sees key j iff
  both lie in the same document and j ≤ i (Sq = Sk); documents are runs of equal ids;
* ``chunk=C`` (mask ``chunked``, Llama 4): row i at position p = i + Sk − Sq sees keys ⌊p/C⌋·C ≤ j ≤ p;
* ``row_ranges=(lo, hi)``: each row's visible keys [lo, hi) given outright, int tensors (B or 1, Sq) — a
  ragged or mixed batch (``attnbench.workload.masks.key_ranges``); in each sequence the rows that see a key must be
  one run along which lo and hi never decrease (every harness mask is). ``seq_offsets`` (B,): each
  sequence's diagonal kv_len − q_len, for ALiBi's distance (default Sk − Sq);
* ``softcap=c``: scores ← c·tanh(scores/c), before the mask;
* ``alibi=True``: score += −slope_h·|i + offset − j|, slope_h = 2^(−8(h+1)/H);
* ``sinks`` (Hq,) float32: learned sink logits (gpt-oss), one more term exp(sink_h) in each row's softmax
  denominator with no value; differentiable;
* ``k_scale``, ``v_scale`` (B, Hkv, blocks, 1) float32 with ``scale_block`` positions per block: a KV cache
  stored narrower than q (bf16, or fp8 e4m3 / e5m2 with these scales, ``attnbench.workload.kv_cache``), read as
  stored·scale; forward only;
* ``q_scale`` (B, Hq[, 1, 1]) float32 and ``out_dtype``, with q, k and v all in e4m3 and one k and v scale per
  (sequence, kv head): an fp8 forward (both dots in e4m3, the output in ``out_dtype``); forward only;
* ``shared_prefix=P``: every sequence's first P keys and values are the same (a cached system prompt):
  cascade attention, forward only — the prefix read once for the whole batch (one program per kv head and
  block of rows taken from every sequence), each sequence's own keys after it, merged by log-sum-exp.

A :class:`Plan` holds everything about a call that does not change between calls (mask tables built on
the device, flags, scale) and the tile chosen for each kernel; fused_triton builds it and tunes it in
``prepare`` (``plan.tune``), so each timed call launches ``kernel[grid](..., BLOCK_M=…, num_warps=…)``
directly. Tile choice, pruning and the tuning cache are in ``tiles`` (kept on disk by ``tile_cache``, keyed
by ``KERNEL_SOURCE``, the hash of the kernels' sources and this launcher's: editing any tunes afresh).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from attnbench.impls.fused_triton import (
    backward_kernels,
    decode,
    decode_kernels,
    forward_kernels,
    layout_kernels,
    shared_kernels,
)
from attnbench.impls.fused_triton.decode import DECODE_MAX_QUERIES, Pages, is_view_of
from attnbench.impls.fused_triton.tile_cache import source_hash
from attnbench.impls.fused_triton.tiles import (
    CUDA_TILES,
    INTERPRETER_TILES,
    Tile,
    TuningKey,
    cached,
    cdiv,
    choose,
    head_dim_blocks,
    is_hopper,
    length_bucket,
    max_shared_memory,
    next_power_of_2,
    prune,
    tuning_key,
)
from attnbench.workload import MASKS

LOG2_E = 1.4426950408889634
# fp32 dots on CUDA: three TF32 passes give fp32-level products (plain TF32 misses attnbench's 1e-4).
FP32_CUDA_PRECISION = "tf32x3"
PREPROCESS_BLOCK_M = 32
COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# A KV cache may be stored narrower than q: bf16, or fp8 with float32 scales (converted in the kernel).
CACHE_DTYPES = (*COMPUTE_DTYPES, torch.float8_e4m3fn, torch.float8_e5m2)
# An fp8 forward (FlashAttention-3's, cuDNN's): q, k and v in e4m3, each with one float32 scale per (sequence,
# head); both dots in fp8 (P rounded to e4m3 for P·V), the output in ``out_dtype``.
FP8_FORWARD = torch.float8_e4m3fn


def _interpreting() -> bool:
    """Whether ``triton.jit`` (at this module's import) made interpreted functions: Triton's own switch."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in {"1", "true", "on", "yes"}


INTERPRETED = _interpreting()
KERNELS = ("fwd", "dkdv", "dq")
# The sources that decide what a tile's launch does, part of each tuning key: the kernels launched here (fwd,
# prefix, dkdv, dq: their families' files and the pieces they share) and this launcher (grids, layouts, flags);
# the decode kernel and its merge add their own file, the shared pieces and its launcher, ``decode`` (split
# sizing, candidates). An edit to any of them tunes afresh: session 26's split-rounding trial, a change to
# ``decode`` alone, ran main's tiles tuned under main's split rule.
KERNEL_SOURCE = source_hash(shared_kernels, forward_kernels, backward_kernels, sys.modules[__name__])
DECODE_SOURCE = source_hash(shared_kernels, decode_kernels, decode, sys.modules[__name__])


def causal_offset(mask: str, seq_q: int, seq_k: int) -> int | None:
    """The diagonal offset of a causal mask (row i sees keys j <= i + offset), or None for other masks."""
    if mask == "causal":
        return 0
    if mask == "causal_bottom_right":
        return seq_k - seq_q
    return None


def alibi_slopes(heads: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """ALiBi's slopes 2^(−8(h+1)/H), h = 0 … H − 1, fp32 (H,)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32, device=device)


def document_bounds(
    document_ids: torch.Tensor | None, cu_seqlens: torch.Tensor | None, batch: int, seq: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (start, end) of its document, int32 (B, S) each, from ids (B, S) or offsets (n + 1,)."""
    if cu_seqlens is not None:
        offsets = cu_seqlens.to("cpu", torch.int64)
        if offsets[0] != 0 or offsets[-1] != seq or bool((offsets[1:] < offsets[:-1]).any()):
            raise ValueError(f"cu_seqlens must rise from 0 to the sequence length {seq}, got {offsets.tolist()}")
        document_ids = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff()).expand(batch, seq)
    assert document_ids is not None
    ids = document_ids.to("cpu", torch.int64)
    if ids.shape != (batch, seq):
        raise ValueError(f"document_ids must have shape {(batch, seq)}, got {tuple(ids.shape)}")
    starts, ends = torch.empty(batch, seq, dtype=torch.int32), torch.empty(batch, seq, dtype=torch.int32)
    for b in range(batch):
        values, counts = torch.unique_consecutive(ids[b], return_counts=True)
        if len(values) != len(torch.unique(values)):
            raise ValueError("document_ids: each document must be one run of equal ids")
        ends_b = torch.cumsum(counts, 0)
        starts[b] = torch.repeat_interleave(ends_b - counts, counts).to(torch.int32)
        ends[b] = torch.repeat_interleave(ends_b, counts).to(torch.int32)
    return starts.to(device), ends.to(device)


def chunked_ranges(seq_q: int, seq_k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), (1, Sq) each, of the chunked mask: row i at position p = i + Sk − Sq sees the keys of p's
    chunk up to p, [⌊p/C⌋·C, p + 1) (empty for p < 0)."""
    position = torch.arange(seq_q).view(1, -1) + (seq_k - seq_q)
    hi = (position + 1).clamp(0, seq_k)
    lo = torch.div(position, chunk, rounding_mode="floor").mul(chunk).clamp(0, seq_k).clamp(max=hi)
    return lo, hi


def range_tables(
    lo: torch.Tensor, hi: torch.Tensor, batch: int, seq_q: int, seq_k: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """The kernels' tables for explicit per-row key ranges: rows' [lo, hi) and keys' [rlo, rhi) (the rows that
    see each key), int32 (B or 1, Sq) and (B or 1, Sk), contiguous, on ``device``; a row or key that sees
    nothing gets [0, 0). O(B·(Sq + Sk)·log Sq) on the host, once per plan.

    The key-side range is exact when, in each sequence, the rows that see some key are one run and lo, hi
    never decrease along it (then the rows seeing key j are those with hi > j and lo ≤ j: a run); anything
    else is refused."""
    lo, hi = (t.to("cpu", torch.int64) for t in (lo, hi))
    if lo.dim() != 2 or lo.shape != hi.shape or lo.shape[0] not in (1, batch) or lo.shape[1] != seq_q:
        raise ValueError(f"row_ranges must be two ({batch} or 1, {seq_q}) tensors, got {tuple(lo.shape)}")
    hi = hi.clamp(0, seq_k)
    lo = lo.clamp(0, seq_k)
    seen = lo < hi
    lo, hi = torch.where(seen, lo, 0), torch.where(seen, hi, 0)
    rows = torch.arange(seq_q).view(1, -1)
    count = seen.sum(1, keepdim=True)
    first = torch.where(seen, rows, seq_q).amin(1, keepdim=True)
    runs = (seen[:, 1:] & ~seen[:, :-1]).sum(1) + seen[:, 0].long()  # starts of runs of rows that see keys
    if bool((runs > 1).any()):
        raise ValueError("row_ranges: in each sequence the rows that see a key must be one run")
    inside = (rows >= first) & (rows < first + count)
    for name, edge in (("lo", lo), ("hi", hi)):
        steps = edge.diff(dim=1)
        if bool(((steps < 0) & inside[:, 1:] & inside[:, :-1]).any()):
            raise ValueError(f"row_ranges: {name} must not decrease along the rows that see keys")
    # monotone stand-ins over all rows: before the run −1, after it past any key
    big = seq_k + 1
    lo_m = torch.where(rows < first, -1, torch.where(rows >= first + count, big, lo))
    hi_m = torch.where(rows < first, -1, torch.where(rows >= first + count, big, hi))
    keys = torch.arange(seq_k).view(1, -1).expand(lo.shape[0], -1).contiguous()
    key_lo = torch.searchsorted(hi_m.contiguous(), keys, right=True)  # first row with hi > j
    key_hi = torch.searchsorted(lo_m.contiguous(), keys, right=True)  # first row with lo > j
    key_hi = torch.minimum(key_hi, first + count)
    empty = key_lo >= key_hi
    key_lo, key_hi = torch.where(empty, 0, key_lo), torch.where(empty, 0, key_hi)
    return tuple(t.to(device, torch.int32).contiguous() for t in (lo, hi, key_lo, key_hi))


@dataclasses.dataclass
class Plan:
    """What a call needs besides q, k, v (and sinks): flags, scalars, device tables, and the chosen tiles."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    scale: float
    head_dim_v: int = 0  # 0: head_dim
    kv_dtype: torch.dtype | None = None  # the cache's stored type (None: dtype)
    causal_offset: int | None = None
    window: int = 0
    lengths: torch.Tensor | None = None  # int32 (B,)
    doc_start: torch.Tensor | None = None  # int32 (B, S)
    doc_end: torch.Tensor | None = None
    row_lo: torch.Tensor | None = None  # int32 (B|1, Sq): explicit ranges (chunked, mixed, ragged)
    row_hi: torch.Tensor | None = None
    key_lo: torch.Tensor | None = None  # int32 (B|1, Sk): the rows that see each key
    key_hi: torch.Tensor | None = None
    seq_offsets: torch.Tensor | None = None  # int32 (B,): each sequence's diagonal, with explicit ranges
    softcap: float = 0.0
    slopes: torch.Tensor | None = None  # fp32 (Hq,)
    sinks: bool = False  # calls pass (Hq,) sink logits
    k_scale: torch.Tensor | None = None  # fp32 (B, Hkv, blocks): an fp8 cache's scales
    v_scale: torch.Tensor | None = None
    scale_block: int = 1  # positions per scale
    q_scale: torch.Tensor | None = None  # fp32 (B, Hq): an fp8 forward's q scales (q, k and v in e4m3)
    out_dtype: torch.dtype | None = None  # the output's type (None: dtype; an fp8 forward's: bf16, fp16 or fp32)
    prefix: int = 0  # a shared prefix: every sequence's first P positions are the same (read once: cascade)
    page_size: int = 0  # a paged cache's positions per page (read in place by the decode kernel)
    tiles: dict[str, Tile] = dataclasses.field(default_factory=dict)
    splits: int = 0  # the decode kernel's key splits at its last launch

    def __post_init__(self) -> None:
        self.head_dim_v = self.head_dim_v or self.head_dim
        self.kv_dtype = self.kv_dtype or self.dtype
        self.out_dtype = self.out_dtype or self.dtype

    def chosen_tiles(self) -> str:
        """The tiles this plan launches, by kernel, spelled as ``compile_report --tiles`` takes them
        (``BLOCK_M,BLOCK_N,WARPS,STAGES[,WAVES[,PARTS]]``): "fwd 128,64,8,3; dkdv 64,128,8,2"."""
        return "; ".join(f"{kernel} {','.join(map(str, tile.fields()))}" for kernel, tile in self.tiles.items())

    @property
    def block_d(self) -> int:
        """The head dim's (main) tile: padded to a power of two, or a wide head dim's power-of-two part."""
        return head_dim_blocks(self.head_dim)[0]

    @property
    def block_dt(self) -> int:
        """A wide head dim's tail tile after ``block_d`` (MLA's 64 rope channels), 0 without one."""
        return head_dim_blocks(self.head_dim)[1]

    @property
    def block_dv(self) -> int:
        return max(16, next_power_of_2(self.head_dim_v))

    @property
    def ranges(self) -> bool:
        return self.row_lo is not None

    @property
    def decode(self) -> bool:
        """Whether a forward without log-sum-exp takes the split-KV decode kernels (few query rows; not an fp8
        forward, which only the forward kernel runs)."""
        return self.seq_q <= DECODE_MAX_QUERIES and self.q_scale is None

    @functools.cached_property
    def decode_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode kernel's per-row key ranges (``decode.row_bounds``), built once."""
        return decode.row_bounds(self)

    @functools.cached_property
    def decode_offsets(self) -> torch.Tensor:
        return decode.seq_offsets(self)

    def key_shape(self) -> torch.Tensor:
        """A (B, Hkv, Sk, D) stand-in for k (no memory) where the keys are a page pool: tuning keys read shapes."""
        return torch.empty(self.batch, self.kv_heads, self.seq_k, self.head_dim, device="meta")

    @property
    def narrowed(self) -> bool:
        """Whether k and v are stored in another type than the output (a narrowed cache, an fp8 forward's e4m3):
        then forward only."""
        return self.kv_dtype != self.out_dtype

    def features(self) -> tuple[Any, ...]:
        """The mask family, score modifiers, value width and cache type: part of the tuning key."""
        return (
            self.causal_offset is not None,
            self.window > 0,
            self.lengths is not None,
            self.doc_start is not None,
            self.ranges,
            self.softcap > 0,
            self.slopes is not None,
            self.sinks,
            self.head_dim_v,
            str(self.kv_dtype),
            self.k_scale is not None,
            self.q_scale is not None,
            self.prefix > 0,
            self.page_size,
        )

    def constants(self) -> dict[str, Any]:
        """The constexpr arguments every kernel shares."""
        interpreted_bf16 = INTERPRETED and self.dtype in (torch.bfloat16, FP8_FORWARD)  # fp8 dots likewise
        fp32 = "ieee" if INTERPRETED else FP32_CUDA_PRECISION
        return {
            "HEAD_DIM": self.head_dim,
            "BLOCK_D": self.block_d,
            "EVEN_D": self.block_d == self.head_dim or self.block_dt > 0,  # a split head dim's main tile is full
            "HEAD_DIM_V": self.head_dim_v,
            "BLOCK_DV": self.block_dv,
            "EVEN_DV": self.block_dv == self.head_dim_v,
            "CAUSAL": self.causal_offset is not None,
            "WINDOW": self.window > 0,
            "PADDED": self.lengths is not None,
            "DOCS": self.doc_start is not None,
            "RANGES": self.ranges,
            "SOFTCAP": self.softcap > 0,
            "ALIBI": self.slopes is not None,
            "INPUT_PRECISION": fp32 if self.dtype == torch.float32 else "tf32",
            "UPCAST": interpreted_bf16,
        }

    def scalars(self) -> tuple[Any, ...]:
        return (self.scale, self.scale * LOG2_E, self.softcap or 1.0)

    def row_tables(self) -> tuple[Any, ...]:
        """The tables every kernel reads per row: (Lengths, DocStart, DocEnd, Slopes, RowLo, RowHi)."""
        return (self.lengths, self.doc_start, self.doc_end, self.slopes, self.row_lo, self.row_hi)

    def table_strides(self) -> tuple[int, int]:
        """Batch strides of the document tables and of the row-range tables (0 where shared by the batch)."""
        doc = self.doc_start.stride(0) if self.doc_start is not None else 0
        rows = self.row_lo.stride(0) if self.row_lo is not None and self.row_lo.shape[0] > 1 else 0
        return doc, rows

    def key_stride(self) -> int:
        return self.key_lo.stride(0) if self.key_lo is not None and self.key_lo.shape[0] > 1 else 0

    def candidates(self, kernel: str) -> list[Tile]:
        """The tiles to choose from (fewer for the forward on a Hopper GPU, ``tiles.hopper_forward``); the
        prefix kernel's are the forward's (rows × keys, the same operands)."""
        kernel = "fwd" if kernel == "prefix" else kernel
        if kernel == "decode":
            return decode.candidates(self, INTERPRETED)
        if INTERPRETED:
            return [INTERPRETER_TILES[kernel]]
        return prune(
            kernel,
            CUDA_TILES[kernel],
            seq_q=self.seq_q,
            seq_k=self.seq_k,
            head_dim=self.head_dim,
            itemsize=self.dtype.itemsize,
            shared_cap=max_shared_memory(self.device),
            head_dim_v=self.head_dim_v,
            hopper=is_hopper(self.device),
        )

    def key(self, kernel: str, q: torch.Tensor, k: torch.Tensor) -> TuningKey:
        """The tuning key of ``kernel`` on q (B, Hq, Sq, D) against k (B, Hkv, Sk, D). The decode kernel's
        features add the sequences × kv heads, bucketed: the programs a launch has before its keys are split,
        which decide how many splits fill the GPU (MLA at B8 and B64 differ); the other kernels' grids grow
        with the rows, so their keys leave the batch out."""
        features = self.features()
        if kernel == "decode":
            features = (*features, length_bucket(k.shape[0] * k.shape[1]))
        return tuning_key(kernel, q, k, features, DECODE_SOURCE if kernel == "decode" else KERNEL_SOURCE)

    def tile(self, kernel: str, q: torch.Tensor, k: torch.Tensor, launch: Any) -> Tile:
        """The tile of ``kernel``: the one chosen already, or chosen now (timed once per tuning key)."""
        if kernel not in self.tiles:
            self.tiles[kernel] = choose(self.key(kernel, q, k), self.candidates(kernel), launch)
        return self.tiles[kernel]

    def tune(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        backward: bool = False,
        sinks: torch.Tensor | None = None,
        pages: Pages | None = None,
    ) -> None:
        """Choose every tile now (outside any timed region). Tiles known already (one candidate, as in the
        interpreter, or tuned before in this process or, kept on disk, by another) are taken without launching
        anything; only when some kernel has a choice left to time do the kernels run once, timing it."""
        first = "decode" if self.decode and not backward else "fwd"
        kernels = (KERNELS if backward else (first,)) + (("prefix",) if self.prefix and first == "fwd" else ())
        for kernel in kernels:
            if kernel not in self.tiles:  # the prefix kernel's keys: the prefix, (1, Hkv, P, D) as prefix_level's
                keys = {"prefix": k[:1, :, : self.prefix], "decode": self.key_shape()}.get(kernel, k)
                found = cached(self.key(kernel, q, keys), self.candidates(kernel))
                if found is not None:
                    self.tiles[kernel] = found
        if all(kernel in self.tiles for kernel in kernels):
            return
        with torch.no_grad():
            out, lse = forward(q, k, v, self, store_lse=backward, sinks=sinks, pages=pages)
        if backward:
            assert lse is not None
            backward_grads(q, k, v, out, lse, torch.ones_like(out), self, sinks=sinks)


def make_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    mask: str = "none",
    lengths: torch.Tensor | None = None,
    window: int | None = None,
    document_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk: int | None = None,
    row_ranges: tuple[torch.Tensor, torch.Tensor] | None = None,
    seq_offsets: torch.Tensor | None = None,
    softcap: float | None = None,
    alibi: bool = False,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    scale_block: int | None = None,
    shared_prefix: int = 0,
    page_size: int = 0,
    q_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Plan:
    """Validate a call's arguments and build its plan (tables on q's device). ``sinks`` is only looked at
    here (its shape; that calls will pass sinks): each call passes the tensor itself. An fp8 forward: q, k and
    v in e4m3 with ``q_scale`` (B, Hq[, 1, 1]) and the cache's scales, one per sequence; ``out_dtype``."""
    B, Hq, Sq, D = q.shape
    _, Hkv, Sk, _ = k.shape
    Dv = v.shape[3]
    if v.shape[:3] != k.shape[:3] or k.shape[0] != B or k.shape[3] != D or Hq % Hkv:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.dtype == FP8_FORWARD:
        _check_fp8_forward(q, k, q_scale, k_scale, scale_block, out_dtype, shared_prefix, page_size)
    elif q_scale is not None or out_dtype not in (None, q.dtype):
        raise ValueError(f"q_scale and out_dtype are an fp8 forward's (q in {FP8_FORWARD}); q is {q.dtype}")
    if q.dtype not in (*COMPUTE_DTYPES, FP8_FORWARD) or k.dtype != v.dtype or k.dtype not in CACHE_DTYPES:
        raise ValueError(f"q must be fp16, bf16 or fp32, k, v one cache type; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.dtype != q.dtype and k.dtype.itemsize >= q.dtype.itemsize:
        raise ValueError(f"a KV cache in another type than q must be narrower: q {q.dtype}, k and v {k.dtype}")
    if (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale and v_scale come together")
    if k.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and k_scale is None:
        raise ValueError(f"a {k.dtype} cache needs its float32 scales k_scale and v_scale")
    if mask not in MASKS:
        raise ValueError(f"unknown mask {mask!r}; known: {', '.join(MASKS)}")
    if mask == "padding" and (lengths is None or lengths.shape != (B,) or lengths.dtype != torch.int32):
        raise ValueError("mask 'padding' needs lengths: an int32 tensor of shape (B,)")
    if mask == "chunked" and (chunk is None or chunk < 1):
        raise ValueError(f"mask 'chunked' needs chunk ≥ 1, got {chunk}")
    if mask == "mixed" and row_ranges is None:
        raise ValueError("mask 'mixed' needs row_ranges: each row's key range (attnbench.workload.masks.key_ranges)")
    plan = Plan(
        B,
        Hq,
        Hkv,
        Sq,
        Sk,
        D,
        q.dtype,
        q.device,
        1.0 / math.sqrt(D) if scale is None else scale,
        head_dim_v=Dv,
        kv_dtype=k.dtype,
        out_dtype=out_dtype,
    )
    if q_scale is not None:
        plan.q_scale = q_scale.reshape(B, Hq).to(q.device, torch.float32).contiguous()
    plan.causal_offset = causal_offset(mask, Sq, Sk)
    plan.lengths = lengths if mask == "padding" else None
    if window is not None:
        if window < 1 or mask not in ("none", "causal_bottom_right"):
            raise ValueError(f"window must be ≥ 1 with mask none or causal_bottom_right, got {window} with {mask}")
        plan.causal_offset, plan.window = Sk - Sq, window
    if document_ids is not None or cu_seqlens is not None:
        if Sq != Sk or mask not in ("none", "causal") or window is not None:
            raise ValueError("documents need Sq == Sk, mask none or causal, and no window")
        plan.causal_offset = 0
        plan.doc_start, plan.doc_end = document_bounds(document_ids, cu_seqlens, B, Sq, q.device)
    if mask == "chunked":
        assert chunk is not None
        row_ranges = chunked_ranges(Sq, Sk, chunk)
    if row_ranges is not None:
        if mask not in ("none", "mixed", "chunked") or window is not None or plan.doc_start is not None:
            raise ValueError("row_ranges are the whole mask: give them with mask none or mixed, no window or documents")
        plan.row_lo, plan.row_hi, plan.key_lo, plan.key_hi = range_tables(*row_ranges, B, Sq, Sk, q.device)
        offsets = torch.full((B,), Sk - Sq) if seq_offsets is None else seq_offsets.to("cpu").view(B)
        plan.seq_offsets = offsets.to(q.device, torch.int32)
    if softcap is not None:
        if not softcap > 0:
            raise ValueError(f"softcap must be > 0, got {softcap}")
        plan.softcap = float(softcap)
    if alibi:
        plan.slopes = alibi_slopes(Hq, q.device)
    if sinks is not None:
        if sinks.shape != (Hq,):
            raise ValueError(f"sinks must have shape ({Hq},): one logit per query head, got {tuple(sinks.shape)}")
        plan.sinks = True
    if k_scale is not None and v_scale is not None:
        plan.k_scale, plan.v_scale = (_scales(s, B, Hkv, q.device) for s in (k_scale, v_scale))
        plan.scale_block = scale_block or Sk
        if plan.k_scale.shape[2] * plan.scale_block < Sk:
            raise ValueError(f"{plan.k_scale.shape[2]} scales of {plan.scale_block} positions don't cover Sk {Sk}")
    if shared_prefix:
        if not 0 < shared_prefix < Sk:
            raise ValueError(f"shared_prefix must lie in [1, Sk) = [1, {Sk}), got {shared_prefix}")
        if k_scale is not None:
            raise ValueError("shared_prefix with an fp8 cache: each sequence's copy of the prefix has its own scale")
        plan.prefix = shared_prefix
    if page_size:
        if page_size < 1 or Sq > DECODE_MAX_QUERIES:
            raise ValueError(
                f"a paged cache is read by the decode kernels: page_size ≥ 1 and Sq ≤ "
                f"{DECODE_MAX_QUERIES}, got page_size {page_size}, Sq {Sq}"
            )
        if shared_prefix:
            raise ValueError("shared_prefix with a paged cache not supported: give the cache contiguous")
        plan.page_size = page_size
    return plan


def _scales(scale: torch.Tensor, batch: int, kv_heads: int, device: torch.device) -> torch.Tensor:
    """(B, Hkv, blocks[, 1]) scales as the kernel reads them: fp32 (B, Hkv, blocks), blocks contiguous (a
    view of the given tensor when it already is one: no copy, so the plan sees the inputs' scales)."""
    if scale.dim() not in (3, 4) or scale.shape[:2] != (batch, kv_heads):
        raise ValueError(f"scales must be ({batch}, {kv_heads}, blocks, 1), got {tuple(scale.shape)}")
    flat = scale.reshape(batch, kv_heads, -1).to(device, torch.float32)
    return flat if flat.stride(2) == 1 else flat.contiguous()


def _check_fp8_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    q_scale: torch.Tensor | None,
    k_scale: torch.Tensor | None,
    scale_block: int | None,
    out_dtype: torch.dtype | None,
    shared_prefix: int,
    page_size: int,
) -> None:
    """An fp8 forward's arguments: k and v in e4m3 too, every scale one per (sequence, head), an output type."""
    B, Hq, _, _ = q.shape
    if k.dtype != FP8_FORWARD or k_scale is None or q_scale is None or q_scale.numel() != B * Hq:
        raise ValueError(f"an fp8 forward needs k and v in {FP8_FORWARD} with k_scale, v_scale, and q_scale (B, Hq)")
    if (scale_block or k.shape[2]) < k.shape[2] or k_scale.numel() != B * k.shape[1]:
        raise ValueError("an fp8 forward takes one k and one v scale per (sequence, kv head), not per page")
    if out_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"an fp8 forward needs out_dtype: fp16, bf16 or fp32 (got {out_dtype})")
    if shared_prefix or page_size:
        raise ValueError("an fp8 forward reads a contiguous cache without a shared prefix")


def _descriptor_ready(t: torch.Tensor) -> bool:
    """Whether a tensor descriptor can address ``t``: 16-byte aligned, unit last stride, the others positive
    multiples of 16 bytes (an expanded, stride-0 dimension is not one)."""
    size = t.element_size()
    leading = t.stride()[:-1]
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s > 0 and s * size % 16 == 0 for s in leading)


def takes_descriptors(plan: Plan, k: torch.Tensor, v: torch.Tensor, v_from_k: bool) -> bool:
    """Whether the forward reads k and v by tensor descriptors (``shared_kernels._box``): a Hopper GPU (or the
    interpreter, so that the tests run this path), 16-bit q, k and v of one type (not an fp8 forward, whose v is
    read keys-contiguous), head dims that fill their tiles, v not read out of k's tile, and both tensors
    addressable (``_descriptor_ready``)."""
    return (
        (INTERPRETED or is_hopper(k.device))
        and plan.dtype in (torch.float16, torch.bfloat16)
        and not plan.narrowed
        and plan.block_d == plan.head_dim
        and plan.block_dv == plan.head_dim_v
        and not v_from_k
        and _descriptor_ready(k)
        and _descriptor_ready(v)
    )


def _row_grid(plan: Plan, heads: int, block: int, length: int) -> tuple[int, int]:
    return heads * plan.batch, cdiv(length, block)  # batch·heads on axis 0: axis 1 caps at 65535


def _tile_grid(plan: Plan, heads: int, block: int, length: int) -> tuple[int]:
    """One axis of batch·heads·tiles programs, tiles fastest (``shared_kernels._tile_program``)."""
    return (heads * plan.batch * cdiv(length, block),)


def prefix_level(
    q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor, plan: Plan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cascade's first level: every row of the batch against the shared prefix's one copy, k_prefix (Hkv, P, D)
    and v_prefix (Hkv, P, Dv) — one program per (kv head, BLOCK_M rows of all B·G·Sq) — as each row's
    normalised output (B, Hq, Sq, Dv) fp32 and log-sum-exp (B, Hq, Sq) (log2 units, −inf: no prefix key)."""
    prev = torch.empty(plan.batch, plan.heads, plan.seq_q, plan.head_dim_v, dtype=torch.float32, device=q.device)
    prev_lse = torch.empty(plan.batch, plan.heads, plan.seq_q, dtype=torch.float32, device=q.device)
    group = plan.heads // plan.kv_heads
    rows = plan.batch * group * plan.seq_q
    constants = plan.constants()
    v_from_k = is_view_of(v_prefix, k_prefix) and plan.block_dv == plan.block_d

    def launch(tile: Tile) -> None:
        forward_kernels._prefix_kernel[(plan.kv_heads * cdiv(rows, tile.block_m),)](
            q,
            k_prefix,
            v_prefix,
            prev,
            prev_lse,
            *plan.row_tables(),
            plan.seq_offsets,
            *q.stride(),
            *k_prefix.stride(),
            *v_prefix.stride(),
            *plan.table_strides(),
            *plan.scalars(),
            plan.heads,
            group,
            plan.batch,
            plan.seq_q,
            plan.seq_k,
            plan.prefix,
            plan.causal_offset or 0,
            plan.window,
            **constants,
            SPLIT_D=plan.block_dt > 0,
            BLOCK_DT=max(16, plan.block_dt),
            V_FROM_K=v_from_k,
            **tile.launch_kwargs(),
        )

    launch(plan.tile("prefix", q, k_prefix.unsqueeze(0), launch))  # keyed as (1, Hkv, P, D), as in Plan.tune
    return prev, prev_lse


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: Plan,
    store_lse: bool = False,
    visited: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    pages: Pages | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """O (B, Hq, Sq, Dv) and, with ``store_lse``, the row log-sum-exp (B, Hq, Sq) fp32 in log2 units (the
    sink's term included). ``visited`` (tests): an int32 (B·Hq, row tiles, 2) tensor that receives, per
    program, the number of key blocks it visits and how many of them are unmasked. With a shared prefix the
    prefix is read once for the batch from ``prefix_kv`` (its one copy, k (Hkv, P, D) and v (Hkv, P, Dv);
    default: sequence 0's first P positions, attnbench's ``inputs.prefix_kv``), each sequence's own keys after
    it by the forward kernel, which starts from the prefix level's state (the log-sum-exp merge).

    Without ``store_lse`` or ``visited``, a plan of few query rows (``Plan.decode``) takes the split-KV decode
    kernels (``decode``); ``pages`` (a paged cache, read in place: k and v are then not read) only there."""
    if (sinks is not None) != plan.sinks:
        raise ValueError("the plan was made " + ("with" if plan.sinks else "without") + " sinks; pass them alike")
    to_decode = plan.decode and not store_lse and visited is None
    if (pages is not None) != (plan.page_size > 0) or (pages is not None and not to_decode):
        raise ValueError("a paged cache: a plan made with its page_size, and a forward without log-sum-exp")
    prev = prev_lse = None
    if plan.prefix:
        prefix_kv = prefix_kv or (k[0, :, : plan.prefix], v[0, :, : plan.prefix])
    if to_decode:  # a shared prefix's one copy read by the decode kernels too, for every sequence's rows
        return decode.decode_forward(q, k, v, plan, sinks, prefix_kv, pages, INTERPRETED), None
    if prefix_kv is not None:
        prev, prev_lse = prefix_level(q, *prefix_kv, plan)
    out = torch.empty(plan.batch, plan.heads, plan.seq_q, plan.head_dim_v, dtype=plan.out_dtype, device=q.device)
    lse = torch.empty(plan.batch, plan.heads, plan.seq_q, dtype=torch.float32, device=q.device) if store_lse else None
    fp8 = plan.q_scale is not None  # its scales fold into the score scale and the output: no per-key scaling
    scaled = plan.k_scale is not None and not fp8
    k_scale, v_scale = plan.k_scale, plan.v_scale
    scale_strides: tuple[int, ...] = (0,) * 4
    if k_scale is not None and v_scale is not None:
        scale_strides = (*k_scale.stride()[:2], *v_scale.stride()[:2])

    # v is k's first Dv channels (an MLA latent cache, passed as the view): reuse the key tile when it is as wide
    v_from_k = is_view_of(v, k) and plan.block_dv == plan.block_d
    if fp8 and not v_from_k and v.stride(2) != 1:
        # Hopper's fp8 wgmma reads its B operand K-major only: P·V wants v with the keys contiguous. Transposed
        # here, in the call, by our tiled kernel; read as rows, Triton 3.6's P·V made the whole forward 2.6× slower
        # (H200, B8 H16 S16384 D128: 62.6 ms against 24.1 for the kernel on a transposed v). The call took 25.3 ms
        # with torch's strided copy, 24.0 with this kernel (ab on an H200: 0.946×; causal 0.902×).
        v = layout_kernels.keys_contiguous(v)
    tma = takes_descriptors(plan, k, v, v_from_k)

    def launch(tile: Tile) -> None:
        k_desc: Any = TensorDescriptor.from_tensor(k, [1, 1, tile.block_n, plan.block_d]) if tma else k
        v_desc: Any = TensorDescriptor.from_tensor(v, [1, 1, tile.block_n, plan.block_dv]) if tma else v
        forward_kernels._forward_kernel[_tile_grid(plan, plan.heads, tile.block_m, plan.seq_q)](
            q,
            k,
            v,
            k_desc,
            v_desc,
            out,
            lse,
            *plan.row_tables(),
            plan.seq_offsets,
            sinks,
            k_scale,
            v_scale,
            plan.q_scale,
            visited,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *out.stride(),
            *plan.table_strides(),
            *scale_strides,
            *(plan.q_scale.stride() if plan.q_scale is not None else (0, 0)),
            plan.scale_block,
            prev,
            prev_lse,
            plan.prefix,
            *plan.scalars(),
            plan.heads,
            plan.heads // plan.kv_heads,
            plan.seq_q,
            plan.seq_k,
            plan.causal_offset or 0,
            plan.window,
            **plan.constants(),
            SINKS=sinks is not None,
            KV_SCALED=scaled,
            FP8=fp8,
            SPLIT_D=plan.block_dt > 0,
            BLOCK_DT=max(16, plan.block_dt),
            V_FROM_K=v_from_k,
            MERGE=plan.prefix > 0,
            STORE_LSE=store_lse,
            COUNT_BLOCKS=visited is not None,
            TMA=tma,
            **tile.launch_kwargs(),
        )

    launch(plan.tile("fwd", q, k, launch))
    return out, lse


def backward_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    plan: Plan,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) for upstream gradient ``grad_out``, from the forward's output and log-sum-exp; with
    ``sinks``, the sink logits' gradient (Hq,) fp32 as a fourth."""
    if plan.narrowed:
        raise ValueError(f"a KV cache stored as {plan.kv_dtype} is a serving cache: forward only")
    if plan.block_dt:
        raise ValueError(f"head_dim {plan.head_dim} (split past 256): forward only")
    if plan.prefix:
        raise ValueError("a shared prefix (cascade) is a serving-time layout: forward only")
    delta = torch.empty_like(lse)
    blocks = cdiv(plan.seq_q, PREPROCESS_BLOCK_M)
    partials = None  # with sinks: (B·Hq, row blocks) parts of their gradient
    if sinks is not None:
        partials = torch.empty(plan.batch * plan.heads, blocks, dtype=torch.float32, device=q.device)
    backward_kernels._preprocess_kernel[_row_grid(plan, plan.heads, PREPROCESS_BLOCK_M, plan.seq_q)](
        out,
        grad_out,
        delta,
        lse,
        sinks,
        partials,
        *out.stride(),
        *grad_out.stride(),
        plan.heads,
        plan.seq_q,
        HEAD_DIM=plan.head_dim_v,
        BLOCK_D=plan.block_dv,
        SINKS=sinks is not None,
        BLOCK_M=PREPROCESS_BLOCK_M,
    )
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    doc_stride, rows_stride = plan.table_strides()
    shared = (*plan.scalars(),)
    group = plan.heads // plan.kv_heads

    # k, v, q and dO read by tensor descriptors where they can be (the forward's rule, ``takes_descriptors``)
    tma = takes_descriptors(plan, k, v, False)
    tma = tma and _descriptor_ready(q) and _descriptor_ready(grad_out)

    def launch_dkdv(tile: Tile) -> None:
        q_desc: Any = TensorDescriptor.from_tensor(q, [1, 1, tile.block_m, plan.block_d]) if tma else q
        do_desc: Any = TensorDescriptor.from_tensor(grad_out, [1, 1, tile.block_m, plan.block_dv]) if tma else grad_out
        backward_kernels._dkdv_kernel[_tile_grid(plan, plan.kv_heads, tile.block_n, plan.seq_k)](
            q,
            k,
            v,
            grad_out,
            q_desc,
            do_desc,
            lse,
            delta,
            dk,
            dv,
            *plan.row_tables(),
            plan.key_lo,
            plan.key_hi,
            plan.seq_offsets,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *grad_out.stride(),
            *dk.stride(),
            *dv.stride(),
            doc_stride,
            rows_stride,
            plan.key_stride(),
            *shared,
            plan.heads,
            plan.kv_heads,
            group,
            plan.seq_q,
            plan.seq_k,
            plan.causal_offset or 0,
            plan.window,
            **plan.constants(),
            TMA=tma,
            **tile.launch_kwargs(),
        )

    def launch_dq(tile: Tile) -> None:
        k_desc: Any = TensorDescriptor.from_tensor(k, [1, 1, tile.block_n, plan.block_d]) if tma else k
        v_desc: Any = TensorDescriptor.from_tensor(v, [1, 1, tile.block_n, plan.block_dv]) if tma else v
        backward_kernels._dq_kernel[_tile_grid(plan, plan.heads, tile.block_m, plan.seq_q)](
            q,
            k,
            v,
            k_desc,
            v_desc,
            grad_out,
            lse,
            delta,
            dq,
            *plan.row_tables(),
            plan.seq_offsets,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            *grad_out.stride(),
            *dq.stride(),
            doc_stride,
            rows_stride,
            *shared,
            plan.heads,
            group,
            plan.seq_q,
            plan.seq_k,
            plan.causal_offset or 0,
            plan.window,
            **plan.constants(),
            TMA=tma,
            **tile.launch_kwargs(),
        )

    launch_dkdv(plan.tile("dkdv", q, k, launch_dkdv))
    launch_dq(plan.tile("dq", q, k, launch_dq))
    if partials is None:
        return dq, dk, dv
    return dq, dk, dv, partials.view(plan.batch, plan.heads, blocks).sum(dim=(0, 2))


class _FlashAttention(torch.autograd.Function):
    """Forward saves q, k, v, O, the log-sum-exp (and the sinks); backward runs the FlashAttention-2 kernels."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, plan: Plan
    ) -> torch.Tensor:
        out, lse = forward(q, k, v, plan, store_lse=True, sinks=sinks)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, sinks = ctx.saved_tensors
        grads = backward_grads(q, k, v, out, lse, grad_out, ctx.plan, sinks=sinks)
        return (*grads[:3], grads[3] if sinks is not None else None, None)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: Plan,
    sinks: torch.Tensor | None = None,
    prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    pages: Pages | None = None,
) -> torch.Tensor:
    """Attention with a ready plan: through autograd when a gradient is wanted, else the forward alone
    (``prefix_kv``: a shared prefix's one copy; ``pages``: a paged cache read in place; see :func:`forward`)."""
    wanted = q.requires_grad or k.requires_grad or v.requires_grad or (sinks is not None and sinks.requires_grad)
    if torch.is_grad_enabled() and wanted:
        if plan.narrowed:  # refused before any launch
            raise ValueError(f"a KV cache stored as {plan.kv_dtype} is a serving cache: forward only")
        if plan.block_dt:
            raise ValueError(f"head_dim {plan.head_dim} (split past 256): forward only")
        if plan.prefix or pages is not None:
            raise ValueError("a shared prefix (cascade) and a paged cache are serving-time layouts: forward only")
        out: torch.Tensor = _FlashAttention.apply(q, k, v, sinks, plan)
        return out
    return forward(q, k, v, plan, sinks=sinks, prefix_kv=prefix_kv, pages=pages)[0]


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None = None, **options: Any
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v for q (B, Hq, Sq, D), k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv), any
    strides; a new (B, Hq, Sq, Dv) tensor in q's dtype, differentiable (in the sinks too). ``options``: see
    the module docstring."""
    return attend(q, k, v, make_plan(q, k, v, sinks=sinks, **options), sinks)


__all__ = [
    "INTERPRETED",
    "INTERPRETER_TILES",
    "Pages",
    "Plan",
    "alibi_slopes",
    "attend",
    "causal_offset",
    "chunked_ranges",
    "document_bounds",
    "flash_attention",
    "make_plan",
    "range_tables",
]
