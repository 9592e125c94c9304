"""fused_triton's decode path: the split-KV kernels of ``decode_kernels`` launched for few query rows.

``flash.forward`` sends a forward without log-sum-exp to :func:`decode_forward` when the plan has at most
``DECODE_MAX_QUERIES`` query rows (a decode step, or speculative decoding's 2–8): every mask, score
modifier, sinks, Dv ≠ D, narrow caches and MLA's latent cache run there, and a shared prefix: its one copy
split across the SMs with the rows of every sequence in each program, then each sequence's own keys, all
merged by log-sum-exp. A paged cache is read in place (:class:`Pages`: the pool, its page table and its
per-page scales); the contiguous k and v are not touched.

Split sizing (``split_count``): the programs of one launch — sequences × kv heads × row blocks × splits —
are made at least ``waves`` times the GPU's SM count, each split at least ``MIN_SPLIT_KEYS`` keys and a
whole number of key blocks, so a batch of 8 sequences with 8 kv heads still keeps every SM streaming the
cache. More splits fill the SMs sooner but each writes B·Hq·Sq·Dv fp32 partials that the merge reads back
(for MLA's 128 heads × 512 channels as many bytes as the latent cache itself at 32 splits), and a short
split spends more of its time starting and storing: ``waves`` is tuned with the tile, each candidate of
``DECODE_TILES`` / ``WIDE_TILES`` (and ``HALF_TILES``, MLA's value halves: two programs a block of rows and
split, the split count sized for both) timed at every ``WAVE_CHOICES`` value (one compiled kernel per tile, the
split count being a launch argument).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from attnbench.impls.fused_triton import decode_kernels
from attnbench.impls.fused_triton.tiles import Tile, cdiv, max_shared_memory, next_power_of_2, shared_bytes

if TYPE_CHECKING:
    from attnbench.impls.fused_triton.flash import Plan
    from attnbench.workload import Workload

DECODE_MAX_QUERIES = 8  # query rows per sequence up to which a forward takes the decode kernels
WAVES = 4  # programs per SM to aim for, where a tile does not say (``Tile.waves``)
WAVE_CHOICES = (1, 2, 4, 8)  # the tuned values of ``Tile.waves``
MIN_SPLIT_KEYS = 256
# The interpreter: small splits and few "SMs", so that small test cases have several splits and partial ones
INTERPRETER_SMS = 2
INTERPRETER_MIN_SPLIT_KEYS = 32
MAX_ROW_BLOCK = 64  # a program's query rows at most (MLA's 128 heads take two or more programs)

# (BLOCK_N, num_warps, num_stages) for the decode kernel; BLOCK_M is the group's rows (``row_blocks``).
# fmt: off
DECODE_TILES = ((64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (32, 4, 3),
                (256, 8, 2))
# A shared prefix's level holds the rows of every sequence: with many, these taller tiles (BLOCK_M 64) read
# the prefix fewer times (each row block reads it once); timed among the others, which stay candidates
PREFIX_TILES = ((64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 8, 2))
# MLA's 576-wide latent cache: (BLOCK_M, BLOCK_N, num_warps, num_stages), fewer keys per block
WIDE_TILES = ((16, 32, 4, 2), (32, 32, 4, 2), (32, 32, 8, 2), (64, 32, 8, 2), (64, 16, 8, 2), (64, 64, 8, 1),
              (32, 64, 8, 2), (16, 64, 4, 2), (64, 64, 8, 2), (32, 128, 8, 1), (64, 128, 8, 1))
# The same with the value channels in two halves, a program each (``Tile.parts`` 2): 64 rows in one warp group
# (wgmma's height: each program's 64 × 256 fp32 output 128 registers a thread) or two, one of 32 rows; 2–4
# stages, the next key blocks' copies in flight; 64×16×4×2 fits two programs an SM
HALF_TILES = ((64, 16, 4, 2), (64, 16, 4, 4), (64, 32, 4, 3), (64, 32, 8, 3), (64, 64, 8, 2), (32, 32, 4, 3))
# fmt: on
INTERPRETER_TILE = Tile(16, 16, 1, 1)


@dataclasses.dataclass(frozen=True)
class Pages:
    """A paged cache as the decode kernel reads it: k and v pools (N, Hkv, page_size, D / Dv), the page
    table (B, pages per sequence) int32 of pool indices, and an fp8 cache's per-page scales (N, Hkv, 1, 1)."""

    k: torch.Tensor
    v: torch.Tensor
    table: torch.Tensor
    page_size: int
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


def decodes(w: Workload) -> bool:
    """Whether fused_triton runs workload ``w`` in the decode kernels: a forward of at most
    ``DECODE_MAX_QUERIES`` query rows per sequence, not an fp8 forward (``Plan.decode`` says the same of a
    plan's calls)."""
    return w.pass_ == "fwd" and w.seq_q <= DECODE_MAX_QUERIES and w.q_dtype == w.dtype


def row_bounds(plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query row's visible keys [lo, hi), int32 (B or 1, Sq) each on the plan's device, from the plan's
    mask (the same ranges as ``shared_kernels._row_ranges``)."""
    if plan.row_lo is not None and plan.row_hi is not None:
        lo, hi = plan.row_lo.long(), plan.row_hi.long()
    else:
        rows = torch.arange(plan.seq_q, device=plan.device).view(1, -1)
        lo, hi = torch.zeros_like(rows), torch.full_like(rows, plan.seq_k)
        if plan.causal_offset is not None:
            hi = torch.minimum(hi, rows + 1 + plan.causal_offset)
        if plan.window:
            lo = torch.maximum(lo, rows + 1 + (plan.causal_offset or 0) - plan.window)
        if plan.lengths is not None:
            hi = torch.minimum(hi, plan.lengths.long().view(-1, 1))
        if plan.doc_start is not None and plan.doc_end is not None:
            lo = torch.maximum(lo, plan.doc_start[:, : plan.seq_q].long())
            hi = torch.minimum(hi, plan.doc_end[:, : plan.seq_q].long())
    lo, hi = lo.clamp(0, plan.seq_k), hi.clamp(0, plan.seq_k)
    lo, hi = torch.broadcast_tensors(lo, hi)
    return lo.to(torch.int32).contiguous(), hi.to(torch.int32).contiguous()


def seq_offsets(plan: Plan) -> torch.Tensor:
    """(B,) int32: each sequence's diagonal, ALiBi's offset (kv_len − q_len)."""
    if plan.seq_offsets is not None:
        return plan.seq_offsets
    return torch.full((plan.batch,), plan.seq_k - plan.seq_q, dtype=torch.int32, device=plan.device)


@functools.cache
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def sm_count(device: torch.device) -> int:
    """The GPU's streaming multiprocessors (``INTERPRETER_SMS`` off CUDA)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def split_count(programs: int, keys: int, block_n: int, sms: int, min_keys: int, waves: int = WAVES) -> tuple[int, int]:
    """(splits, keys per split) for ``keys`` keys and ``programs`` programs per split: at least
    ``waves`` × ``sms`` programs in all where the keys allow splits of ``min_keys`` or more; each split a
    whole number of ``block_n`` key blocks."""
    keys = max(1, keys)
    wanted = max(1, min(cdiv(waves * sms, max(1, programs)), keys // max(min_keys, block_n)))
    per_split = cdiv(cdiv(keys, wanted), block_n) * block_n
    return cdiv(keys, per_split), per_split


def partial_bytes(w: Workload, interpreted: bool) -> float:
    """The decode kernels' working memory for workload ``w``: each split's fp32 partial output and log-sum-exp
    per query row, at most as many splits as the smallest key block and the most waves give (``split_count``);
    a shared prefix's splits besides the suffix's."""
    sms, min_keys = split_limits(interpreted, None)
    group_rows = w.heads // w.kv_heads * w.seq_q
    block_n = INTERPRETER_TILE.block_n if interpreted else min(spec[0] for spec in DECODE_TILES)
    block_m = INTERPRETER_TILE.block_m if interpreted else 16  # the shortest tile: the most programs, fewest splits
    blocks = cdiv(group_rows, block_m)
    waves = WAVES if interpreted else max(WAVE_CHOICES)
    splits = split_count(w.batch * w.kv_heads * blocks, w.seq_k - w.shared_prefix, block_n, sms, min_keys, waves)[0]
    if w.shared_prefix:
        prefix_blocks = cdiv(w.batch * group_rows, block_m)
        splits += split_count(w.kv_heads * prefix_blocks, w.shared_prefix, block_n, sms, min_keys, waves)[0]
    return 4.0 * splits * w.batch * w.heads * w.seq_q * (w.head_dim_v + 1)


def split_limits(interpreted: bool, device: torch.device | None) -> tuple[int, int]:
    """(SMs, least keys a split) for ``split_count``: the interpreter's small ones, or ``device``'s SM count
    (None: the current CUDA device's, as a prediction made before any tensor exists; 132 without one)."""
    if interpreted:
        return INTERPRETER_SMS, INTERPRETER_MIN_SPLIT_KEYS
    if device is not None:
        return sm_count(device), MIN_SPLIT_KEYS
    return (_sm_count(torch.cuda.current_device()) if torch.cuda.is_available() else 132), MIN_SPLIT_KEYS


def row_block(plan: Plan) -> int:
    """A program's query rows when the head dim is not split: the kv group's G·Sq rows padded to a power of
    two ≥ 16 (tl.dot's least), at most ``MAX_ROW_BLOCK``."""
    rows = plan.heads // plan.kv_heads * plan.seq_q
    return min(MAX_ROW_BLOCK, max(16, next_power_of_2(rows)))


def candidates(plan: Plan, interpreted: bool) -> list[Tile]:
    """The decode kernel's tiles for this plan, each at every ``WAVE_CHOICES`` value, those over the device's
    shared memory dropped (the smallest kept if none fits)."""
    if interpreted:
        return [INTERPRETER_TILE]
    if plan.block_dt:
        tiles = [Tile(*spec) for spec in WIDE_TILES] + [Tile(*spec, parts=2) for spec in HALF_TILES]
    else:
        block_m = row_block(plan)
        tiles = [Tile(block_m, *spec) for spec in DECODE_TILES]
        prefix_rows = min(MAX_ROW_BLOCK, next_power_of_2(plan.batch * plan.heads // plan.kv_heads * plan.seq_q))
        if plan.prefix and prefix_rows > block_m:  # the prefix level's rows come from every sequence: taller tiles
            tiles += [Tile(prefix_rows, *spec) for spec in PREFIX_TILES]
    cap = max_shared_memory(plan.device)
    width = plan.block_d + plan.block_dt

    def size(tile: Tile) -> int:
        total = shared_bytes("fwd", tile, width, plan.dtype.itemsize, plan.block_dv)
        if plan.block_dt:  # MLA's latent cache: the values are the key tile's channels, no buffer of their own
            total -= plan.dtype.itemsize * tile.block_n * plan.block_dv * max(1, tile.num_stages)
        return total

    fitting = [t for t in tiles if size(t) <= cap] or [min(tiles, key=size)]
    return [dataclasses.replace(t, waves=waves) for t in fitting for waves in WAVE_CHOICES]


def decode_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: Plan,
    sinks: torch.Tensor | None,
    prefix_kv: tuple[torch.Tensor, torch.Tensor] | None,
    pages: Pages | None,
    interpreted: bool,
) -> torch.Tensor:
    """O (B, Hq, Sq, Dv) in q's dtype: the split kernel over each sequence's keys — with a shared prefix, first
    over the prefix's one copy ``prefix_kv`` (k (Hkv, P, D), v (Hkv, P, Dv)) for the rows of every sequence,
    then over each sequence's keys after it — and the merge of all the splits."""
    group_rows = plan.heads // plan.kv_heads * plan.seq_q
    rows = plan.batch * plan.heads * plan.seq_q
    lo, hi = plan.decode_bounds
    sms, min_keys = split_limits(interpreted, q.device)
    k_src, v_src, table, page_size = k, v, None, 1
    k_scale, v_scale, scale_block = plan.k_scale, plan.v_scale, plan.scale_block
    if pages is not None:
        k_src, v_src, table, page_size = pages.k, pages.v, pages.table, pages.page_size
        k_scale, v_scale = pages.k_scale, pages.v_scale
    scaled = k_scale is not None
    scale_strides: tuple[int, ...] = (0,) * 4
    if k_scale is not None and v_scale is not None:
        scale_strides = (*k_scale.stride()[:2], *v_scale.stride()[:2])
    fp8 = plan.kv_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    constants = plan.constants()
    flags = {
        name: constants[name]
        for name in (
            "HEAD_DIM",
            "BLOCK_D",
            "EVEN_D",
            "HEAD_DIM_V",
            "BLOCK_DV",
            "EVEN_DV",
            "SOFTCAP",
            "ALIBI",
            "INPUT_PRECISION",
            "UPCAST",
        )
    }
    flags.update(
        SPLIT_D=plan.block_dt > 0,
        BLOCK_DT=max(16, plan.block_dt),
        PAGE_SIZE=page_size,
        FP16_DOTS=fp8 and plan.dtype == torch.bfloat16,
    )
    stride_rows = lo.stride(0) if lo.shape[0] > 1 else 0
    out = q.new_empty(plan.batch, plan.heads, plan.seq_q, plan.head_dim_v)

    def split(
        tile: Tile,
        keys: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        sequences: int,
        row_count: int,
        key_range: tuple[int, int],
        **kind: Any,
    ) -> tuple[int, Callable[..., None]]:
        """(splits, a launch of them into given partials at a split index) for one level."""
        kk, vv, page_table = keys
        blocks = cdiv(row_count, tile.block_m)
        programs = sequences * plan.kv_heads * blocks * tile.parts
        count, per_split = split_count(
            programs, key_range[1] - key_range[0], tile.block_n, sms, min_keys, tile.waves or WAVES
        )
        strides = (*kk.stride(), *vv.stride()) if kk.dim() == 4 else (0, *kk.stride(), 0, *vv.stride())

        def run(part_out: torch.Tensor, part_lse: torch.Tensor, base: int) -> None:
            decode_kernels._decode_split_kernel[(programs, count)](
                q,
                kk,
                vv,
                part_out,
                part_lse,
                lo,
                hi,
                plan.decode_offsets,
                plan.slopes,
                page_table,
                k_scale,
                v_scale,
                *q.stride(),
                *strides,
                stride_rows,
                0 if page_table is None else page_table.stride(0),
                *scale_strides,
                scale_block,
                *plan.scalars(),
                plan.heads,
                plan.kv_heads,
                blocks,
                plan.seq_q,
                rows,
                *key_range,
                per_split,
                base,
                V_FROM_K=is_view_of(vv, kk) and plan.block_dv == plan.block_d,
                VALUE_PARTS=tile.parts,
                **flags,
                **kind,
                **tile.launch_kwargs(),
            )

        return count, run

    # MLA's latent cache, unconverted: keys-major (``decode_kernels._decode_block``'s ``KEYS_MAJOR``): for
    # Triton 3.6 on sm_90 the 64×32×8×2 tile then takes 218 registers and spills nothing (rows-major: 255 and
    # 136 B spilled), P·V as wgmma over the 512 value channels; ab on an H200, B8 and B64: 0.963× and 0.962×.
    # A converted (fp8) cache stays rows-major: keys-major over the GQA fp8 cache measured 1.031× (slower);
    # fp8 MLA unmeasured (its 64×32×8×2 tile: 243 registers, none spilled, against 255 and 1072 B rows-major).
    # A tile of value halves (``Tile.parts`` 2) runs rows-major: its 64 rows are wgmma's height in one warp group
    keys_major = is_view_of(v_src, k_src) and plan.block_dt > 0 and plan.kv_dtype == plan.dtype

    def launch(tile: Tile) -> int:
        """Both levels' splits and the merge with ``tile``; returns the number of splits."""
        levels = []
        suffix_start = 0
        if plan.prefix:
            assert prefix_kv is not None
            levels.append(
                split(
                    tile,
                    (*prefix_kv, None),
                    1,
                    plan.batch * group_rows,
                    (0, plan.prefix),
                    PAGED=False,
                    KV_SCALED=False,
                    SCALE_ONCE=False,
                    PREFIX=True,
                    KEYS_MAJOR=False,
                )
            )
            suffix_start = plan.prefix
        once = scaled and pages is None and scale_block >= plan.seq_k
        levels.append(
            split(
                tile,
                (k_src, v_src, table),
                plan.batch,
                group_rows,
                (suffix_start, plan.seq_k),
                PAGED=pages is not None,
                KV_SCALED=scaled,
                SCALE_ONCE=once,
                PREFIX=False,
                KEYS_MAJOR=keys_major and tile.parts == 1,
            )
        )
        splits = sum(count for count, _ in levels)
        part_out = torch.empty(splits * rows, plan.head_dim_v, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(splits * rows, dtype=torch.float32, device=q.device)
        base = 0
        for count, run in levels:
            run(part_out, part_lse, base)
            base += count
        decode_kernels._decode_merge_kernel[(rows,)](
            part_out,
            part_lse,
            sinks,
            out,
            *out.stride(),
            plan.heads,
            plan.seq_q,
            splits,
            rows,
            HEAD_DIM_V=plan.head_dim_v,
            BLOCK_DV=plan.block_dv,
            BLOCK_S=max(2, next_power_of_2(splits)),
            SINKS=sinks is not None,
        )
        return splits

    plan.splits = launch(plan.tile("decode", q, plan.key_shape(), launch))
    return out


def is_view_of(v: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether v is k's first channels (an MLA latent cache's values): same memory, same strides."""
    return v.data_ptr() == k.data_ptr() and v.stride() == k.stride() and v.dtype == k.dtype
