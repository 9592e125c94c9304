"""``fused_cpu`` — our fused, memory-efficient attention for the CPU (FlashAttention's recurrence in C++).

This package holds the contender (this module, the entry point), ``bindings.py`` (builds the C++ sources
beside it at first use, caches the library and calls it through ctypes) and the sources themselves.

The kernel (``fused_cpu_kernel.cpp``) gives each work item up to BLOCK_Q query rows (fewer when that would leave a
thread fewer than 4 items) and walks them against blocks of BLOCK_K keys with the online softmax, six rows at a time,
so its working memory is a 6 × BLOCK_K score tile per thread instead of the S×S matrix, and it never visits a 64-key
panel the mask hides from all six rows (causal does about half the work of none). The inner products are register
tiles of 6 rows × 64 floats; a row group's exponentials (a 16-entry table and a cubic: few operations on the FMA
pipes) run inside the previous group's P·V loop, beside its FMAs (``fused_cpu_pipeline.h``), and each group
prefetches a share of the next key block into L2; kᵀ is packed into 64-key panels by the first work item that needs
each one.

Backward (``fused_cpu_backward.cpp``, FlashAttention-2): the forward also keeps each row's log-sum-exp; the
backward recomputes the probabilities tile by tile from q, k and it (64 query rows × 256 keys), one work item
per (batch, kv head, key block) owning its rows of dk and dv, dq summed from per-thread partials (no atomics,
no second pass: see the .cpp). It runs through ``torch.autograd.Function``, so ``torch.autograd.grad`` uses it.

bfloat16 (``fused_cpu_bf16.h``): where the build targets AVX512-BF16 (``-march=native`` on such a CPU), the
forward's two products are ``vdpbf16ps`` dot products of bf16 pairs (q read as is, kᵀ and v packed in pairs,
P rounded to bf16 before P·V as FlashAttention does on GPUs) with float32 softmax and accumulators. Setting
``ATTNBENCH_FUSED_CPU_ISA=fp32`` forces the float32 path instead (what a CPU without AVX512-BF16 takes).
float16 is always widened to float32 (``vcvtph2ps``, exact): there is no AVX512-FP16 here, and rounding fp16
to bf16 would drop 3 bits of every input. Widening is an O(S·D) copy on the way in, as is the packing of kᵀ
into panels of 64 keys in scratch memory this file allocates and v's padding when head_dim is not a multiple
of 16; all of it happens inside the timed call, because the mha module rewrites q, k and v before each call.

Decode (``fused_cpu_decode.cpp``): with at most 16 query rows, one work item per (batch, kv head, key split)
takes the whole GQA group, reads k and v once straight from the caller's tensors, and splits the keys across
threads (merging the partial max, sum and output) when B·Hkv items are too few to feed them. It reads the
cache in its own type (``kv_dtype`` float32, bfloat16, or fp8 e4m3fn/e5m2 with their scales folded into the
scores and the probabilities), widening 16 keys at a time in registers — never a float32 copy of the cache —
and takes a value head dim of its own (Dv from v), a latent cache (v a view of k's first Dv channels), learned
sinks (joined once, where each row is finished) and a ragged batch's rows (each its own key prefix). A narrow
cache (``DECODE_FEATURES``: kv_dtype) runs in the decode kernel only (``decode_attention``, ``paged_decode``);
a case that asks for one outside it (prefill rows, a backward, a window, a score modifier) is unsupported with
the reason in one line (``_decode_unsupported``).

Issue 23's workloads in the forward kernel, forward and backward: a value head dim of its own (v read through
its own strides, so MLA's values are read in place from the latent keys, and a shared prefix's keys and values
from sequence 0's cache); learned sinks in the kernel's epilogue (the row's denominator and lse; dsinks from
the lse in ``_FusedAttention``); chunked, mixed and ragged batches as per-row key ranges; few rows per head
(decode's GQA groups past 16 rows, MLA's 128 heads over one cache) fold a kv group's heads into the rows of
one problem (``folds``), so they share every key block in full tiles; a shared prefix runs as a cascade
(``cascade.py``): the prefix once for the batch, each suffix on its own, merged by log-sum-exp.

Issue 13's workloads (``score_options``, built in ``prepare``): sliding_window and document are per-row key
ranges [lo, hi) from ``masks.key_ranges`` (mask "ranges": blocks outside every row's range are skipped, so a
window's work grows with the window, not S); softcap and ALiBi (slopes 2^(−8(h+1)/H)) act inside the score
tile, forward only — the backward takes the ranges but not the modifiers, so those passes are unsupported. A
paged KV cache is read in place by the decode kernel through the page table (Sq ≤ 16, pages of a multiple
of 16 keys, the basic masks, no modifier: ``reads_pages``); for any other paged case the harness gathers the
pages into contiguous k and v inside the timed call, as for bmm.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

from attnbench.contenders.contract import ALL_MASKS, ALL_SCORE_MODS, DEFAULT_MASKS, Capabilities, Contender
from attnbench.errors import UsageError
from attnbench.impls.fused_cpu import bindings
from attnbench.impls.fused_cpu.bindings import ScoreOptions
from attnbench.impls.fused_cpu.cascade import cascade_attention
from attnbench.workload import Workload, kv_cache
from attnbench.workload.axes import DECLARED
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import alibi_slopes, key_ranges
from attnbench.workload.sequences import is_ragged, sequence_lengths

BLOCK_Q = 2048  # most query rows per forward work item: its row groups share each key block while in L2
MIN_BLOCK_Q = 48  # fewest, when more items are needed to feed the threads
GROUP = 6  # query rows per step of the forward (fused_cpu_kernel.cpp's GROUP)
BLOCK_K = 1024  # keys per forward step
BLOCK_BYTES = 512 * 1024  # a step's kᵀ panels and v rows together, so they stay in a 1 MiB L2 with room
BACKWARD_BLOCK_Q = 64  # the backward holds two BACKWARD_BLOCK_Q × BACKWARD_BLOCK_K tiles (P and dP) per thread
BACKWARD_BLOCK_K = 256


def block_k(head_dim: int, padded_dim: int) -> int:
    """Keys per forward step: as many as keep the step's kᵀ panels and v rows within BLOCK_BYTES (1024 at
    D 64, 512 at D 128, 128 for MLA's 576/512), whole panels, from 128 to BLOCK_K. Measured on this VM (Zen 4,
    1 MiB L2): D 128 with 128 rows a kv head (a shared prefix's level) 4 % faster at 512 than at 1024 keys, S4096
    prefill the same; MLA's 576/512 5–10 % faster at 128–256."""
    keys = BLOCK_BYTES // (4 * (head_dim + padded_dim)) // 64 * 64
    return max(128, min(BLOCK_K, keys))


DECODE_MAX_ROWS = 16  # the decode kernel's decode_max_rows(), for saying why where no kernel could be built


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def block_q(batch_heads: int, seq_q: int, threads: int, uniform: bool = False) -> int:
    """Query rows per forward work item: BLOCK_Q (long items share each key block among more row groups),
    fewer — whole groups, at least MIN_BLOCK_Q — when that would leave a thread fewer than 4 items. But where
    every (batch, head) costs the same (``uniform``: no per-sequence lengths) and the threads can take equal
    shares of whole sequences, whole sequences up to BLOCK_Q: splitting one into two items packs and reads its
    keys twice, the second time from memory (MLA's 128 folded heads at B4 on 2 threads: 66 + 62 rows an item
    took 1.10× the time of 128, bf16; ``attnbench ab``, Zen 4)."""
    threads = max(threads, 1)
    if uniform and batch_heads % threads == 0:
        return min(seq_q, BLOCK_Q)
    rows = _round_up(-(-batch_heads * seq_q // (4 * threads)), GROUP)
    return min(seq_q, max(MIN_BLOCK_Q, min(BLOCK_Q, rows)))


def uniform_rows(mask: str, lengths: torch.Tensor | None, options: ScoreOptions | None) -> bool:
    """Whether every sequence of the batch sees the same keys row for row (so its work items cost the same):
    no padding lengths, and key ranges, where given, the same for every sequence."""
    if mask == "padding" or lengths is not None:
        return False
    if mask != "ranges":
        return True
    assert options is not None and options.ranges is not None
    return all(bool((bound == bound[:1]).all()) for bound in options.ranges)


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: str = "none",
    lengths: torch.Tensor | None = None,
    threads: int | None = None,
    options: ScoreOptions | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """softmax(q·kᵀ·scale + mask)·v for q (B, H, Sq, D), k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv) on the CPU, H
    a multiple of Hkv, Dv any value head dim; ``lengths`` (one per batch element, any integer dtype) for the
    padding mask; ``sinks`` (H,) learned sink logits (gpt-oss: exp(sink_h) joins every row's denominator),
    differentiable. Returns the output (B, H, Sq, Dv), in q's dtype, and the number of score entries the kernel
    computed (how block skipping shows). When autograd records (grad enabled and q, k, v or sinks requiring
    grad), the output's backward is the fused backward kernel. ``options`` (per-row key ranges with mask
    "ranges", softcap, ALiBi: see ``bindings.ScoreOptions``) are forward only for now, but for the key ranges,
    which the backward takes too."""
    threads = threads or torch.get_num_threads()
    if lengths is not None:
        lengths = lengths.to(torch.int64).contiguous()  # any integer tensor; the kernel reads int64
    if sinks is not None:
        logits = sinks.detach().to(torch.float32).contiguous()
        options = dataclasses.replace(options or ScoreOptions(), sinks=logits)
    leaves = (q, k, v) if sinks is None else (q, k, v, sinks)
    if torch.is_grad_enabled() and any(t.requires_grad for t in leaves):
        if options is not None and (options.softcap is not None or options.alibi is not None):
            raise NotImplementedError("fused_cpu's backward takes key ranges, but no softcap or ALiBi yet")
        stats: dict[str, int] = {}
        out = _FusedAttention.apply(q, k, v, sinks, scale, mask, lengths, threads, stats, options)
        return out, stats["tiles"]
    if folds(q, k, options):
        q, mask, options = _folded(q, k, mask, options)
    out32, _, tiles = _forward(
        q, k, v, scale=scale, mask=mask, lengths=lengths, threads=threads, keep_lse=False, options=options
    )
    return _narrow(out32, q, v.shape[-1]).view(*leaves[0].shape[:3], v.shape[-1]), tiles


def folds(q: torch.Tensor, k: torch.Tensor, options: ScoreOptions | None) -> bool:
    """Whether the forward folds each kv head's query heads into its query rows: with few query rows per head
    (decode, MLA's 128 heads over one latent cache) a work item of one head's rows would run the 6-row tiles
    nearly empty and read the keys once per head; folded, the G·Sq rows of a kv group share every key block
    (read once per sequence) in full tiles. Not where the decode kernel takes the case (few rows in all), and
    not with per-head score terms (ALiBi's slopes, sinks), which the folded rows would lose."""
    heads, seq_q, kv_heads = q.shape[1], q.shape[2], k.shape[1]
    group = heads // kv_heads
    per_head = options is not None and (options.alibi is not None or options.sinks is not None)
    decode_kernel = seq_q * group <= bindings.load().decode_max_rows() and options is None
    return group > 1 and seq_q < MIN_BLOCK_Q and not per_head and not decode_kernel


def _folded(
    q: torch.Tensor, k: torch.Tensor, mask: str, options: ScoreOptions | None
) -> tuple[torch.Tensor, str, ScoreOptions | None]:
    """q (B, H, Sq, D) as (B, Hkv, G·Sq, D) — row g·Sq + i the query head kv·G + g at position i, a view, no
    copy — with the mask carried to the folded rows: none and padding as they are (the same keys for every row
    of a sequence), causal as each row's key range, ranges repeated for the G heads."""
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    group = heads // kv_heads
    folded = q.reshape(batch, kv_heads, group * seq_q, head_dim)
    if mask in ("none", "padding"):
        return folded, mask, options
    if mask == "ranges":
        assert options is not None and options.ranges is not None
        lo, hi = options.ranges
    else:  # causal, causal_bottom_right: row i sees keys [0, i + 1 + shift)
        shift = seq_k - seq_q if mask == "causal_bottom_right" else 0
        hi = (torch.arange(seq_q, dtype=torch.int64) + 1 + shift).clamp(0, seq_k).expand(batch, -1)
        lo = torch.zeros_like(hi)
    ranges = (lo.repeat(1, group).contiguous(), hi.repeat(1, group).contiguous())
    return folded, "ranges", dataclasses.replace(options or ScoreOptions(), ranges=ranges)


def paged_decode(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    scale: float,
    threads: int | None = None,
    mask: str | None = None,
    seq_k: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    row_hi: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Decode attention over a paged KV cache: q (B, H, Sq ≤ 16, D); k_pages (num_pages, Hkv, page_size, D) and
    v_pages (…, Dv) pools in the cache's type (float32, bfloat16, float8_e4m3fn, float8_e5m2, read as stored),
    page_size a multiple of 16; page_table (B, max_pages) int, batch b's keys being its pages in order; lengths
    (B,) the cache length of each sequence for the padding mask; ``mask`` one of the decode kernel's (none,
    causal, causal_bottom_right, padding; default padding with lengths, else none); ``seq_k`` the cache length
    (default: every page full); an fp8 pool's scales ``k_scale``, ``v_scale`` (num_pages, Hkv, 1, 1), one per
    pool page; ``sinks`` (H,) learned sink logits; ``row_hi`` (B, Sq) with mask "ranges": each row's keys [0, hi)
    (a ragged batch). The kernel reads the pages in place (no gather, no float32 copy). Returns the output
    (B, H, Sq, Dv) in q's dtype and the score entries computed."""
    if lengths is not None:
        lengths = lengths.to(torch.int64).contiguous()
    cache = bindings.CacheOptions(k_scale=k_scale, v_scale=v_scale, sinks=_sinks32(sinks), row_hi=row_hi)
    out, _, tiles = _decode(
        q,
        k_pages,
        v_pages,
        scale=scale,
        mask=mask or ("none" if lengths is None else "padding"),
        lengths=lengths,
        threads=threads or torch.get_num_threads(),
        pages=page_table.to(torch.int32).contiguous(),
        seq_k=seq_k,
        cache=cache,
    )
    return _narrow_to(out, v_pages.shape[-1], q.dtype), tiles


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: str = "none",
    lengths: torch.Tensor | None = None,
    threads: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    scale_block: int | None = None,
    sinks: torch.Tensor | None = None,
    row_hi: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Decode attention (forward) over a contiguous KV cache with the decode kernel: q (B, H, Sq ≤ 16, D),
    float32 or bfloat16 (others are widened); k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv) in the cache's type
    (float32, bfloat16, float8_e4m3fn, float8_e5m2: read as stored and widened in registers; v may be the view
    of k's first Dv channels, a latent cache); an fp8 cache's ``k_scale``, ``v_scale`` (B, Hkv, blocks, 1) float32,
    one per ``scale_block`` positions (default: the whole sequence); ``sinks`` (H,) learned sink logits (natural
    log) joining each row's softmax denominator; ``mask`` and ``lengths`` as in fused_attention (none, causal,
    causal_bottom_right, padding), or "ranges" with ``row_hi`` (B, Sq) int64: row i of batch b sees keys
    [0, row_hi[b, i]) (a ragged batch). Returns the output (B, H, Sq, Dv) in q's dtype and the score entries
    computed."""
    if lengths is not None:
        lengths = lengths.to(torch.int64).contiguous()
    cache = bindings.CacheOptions(k_scale, v_scale, scale_block, _sinks32(sinks), row_hi)
    out, _, tiles = _decode(
        q, k, v, scale=scale, mask=mask, lengths=lengths, threads=threads or torch.get_num_threads(), cache=cache
    )
    return _narrow_to(out, v.shape[-1], q.dtype), tiles


def _decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: str,
    lengths: torch.Tensor | None,
    threads: int,
    keep_lse: bool = False,
    pages: torch.Tensor | None = None,
    seq_k: int | None = None,
    cache: bindings.CacheOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """The decode kernel (Sq ≤ 16: bandwidth-bound, k and v read once in their own type, keys split across
    threads): (output (B, H, Sq, Dvp) float32, each row's log-sum-exp (B, H, Sq) or None, score entries
    computed). q goes as it is when float32 or bfloat16 (else widened: a few rows); k and v as they are in a
    type the kernel reads (float16 is widened, as the forward does)."""
    kernel = bindings.load()
    q = q.detach()
    q = q.contiguous() if q.dtype in (torch.float32, torch.bfloat16) else q.to(torch.float32).contiguous()
    latent = v.data_ptr() == k.data_ptr() and not v.is_contiguous()  # v the view of k's first channels
    k, v = k.detach(), v.detach()
    if k.dtype not in bindings.KV_TYPES:
        k = k.to(torch.float32).contiguous()
        v = k[..., : v.shape[-1]] if latent else v.to(torch.float32).contiguous()
    elif not _decode_reads_in_place(k, v):
        k, v = k.contiguous(), v.contiguous()
    batch, heads, seq_q = q.shape[:3]
    out = torch.empty(batch, heads, seq_q, _round_up(v.shape[-1], bindings.VECTOR), dtype=torch.float32)
    lse = torch.empty(batch, heads, seq_q, dtype=torch.float32) if keep_lse else None
    tiles, _ = kernel.decode(
        q,
        k,
        v,
        out,
        lse,
        scale=scale,
        mask=mask,
        lengths=lengths,
        threads=threads,
        pages=pages,
        seq_k=seq_k,
        cache=cache,
    )
    return out, lse, tiles


def _decode_reads_in_place(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the decode kernel reads k and v where they lie: contiguous, a latent cache's values (a view of
    its keys), or views with dense rows and evenly spaced kv heads (a shared prefix's suffixes)."""
    if k.is_contiguous() and v.is_contiguous():
        return True
    try:
        (k_row, _), _ = bindings.strides(k), bindings.strides(v)
    except ValueError:
        return False
    return k_row == k.shape[-1]


def _sinks32(sinks: torch.Tensor | None) -> torch.Tensor | None:
    return None if sinks is None else sinks.detach().to(torch.float32).contiguous()


def _narrow_to(out32: torch.Tensor, head_dim_v: int, dtype: torch.dtype) -> torch.Tensor:
    """The decode kernel's padded float32 output as (B, H, Sq, Dv) in ``dtype``."""
    return (out32 if out32.shape[-1] == head_dim_v else out32[..., :head_dim_v]).to(dtype)


def _narrow(out32: torch.Tensor, q: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The kernel's padded float32 output as the caller's (B, H, Sq, dim) in q's dtype (dim: q's head dim
    unless given — the value head dim for an attention output)."""
    return _narrow_to(out32, q.shape[-1] if dim is None else dim, q.dtype)


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: str,
    lengths: torch.Tensor | None,
    threads: int,
    keep_lse: bool,
    options: ScoreOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """The forward kernel: (output (B, H, Sq, Dp) float32 — Dp the value head dim Dv padded —, each row's
    log-sum-exp (B, H, Sq) or None, score entries computed). v (B, Hkv, Sk, Dv) may be a view with evenly spaced
    rows (MLA's values, the first Dv channels of the latent keys): the kernel reads it in place."""
    kernel = bindings.load()
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    padded_dim = _round_up(v.shape[-1], bindings.VECTOR)
    if seq_q <= kernel.decode_max_rows() and options is None:  # decode: k and v read once, in their own type
        return _decode(q, k, v, scale=scale, mask=mask, lengths=lengths, threads=threads, keep_lse=keep_lse)
    rows = block_q(batch * heads, seq_q, threads, uniform_rows(mask, lengths, options))
    out = torch.empty(batch, heads, seq_q, padded_dim, dtype=torch.float32)
    lse = torch.empty(batch, heads, seq_q, dtype=torch.float32) if keep_lse else None
    if isa(q.dtype) == "avx512_bf16":
        q16 = _even_dim(q.detach().contiguous())
        k16 = _even_dim(_in_place_or_contiguous(k.detach(), dense_rows=True))
        v16 = _even_dim(_in_place_or_contiguous(v.detach()))
        sizes = {"block_q": rows, "block_k": block_k(head_dim, padded_dim), "threads": threads}
        tiles = kernel.forward_bf16(
            q16, k16, v16, out, lse, scale=scale, mask=mask, lengths=lengths, options=options, **sizes
        )
        return out, lse, tiles
    q32 = q.detach().to(torch.float32).contiguous()  # the float32 paths from here on (no copy for float32)
    k32 = _in_place_or_contiguous(k.detach().to(torch.float32))
    v32 = _padded32(v, padded_dim, view_ok=True)
    kt = torch.empty(batch * kv_heads * kernel.packed_keys(seq_k) * head_dim)  # the kernel packs kᵀ here
    keys = block_k(head_dim, padded_dim)
    scratch = torch.empty(threads * kernel.scratch_floats(rows, keys, head_dim, padded_dim))
    tiles = kernel.forward(
        q32,
        k32,
        kt,
        v32,
        out,
        lse,
        scale=scale,
        mask=mask,
        lengths=lengths,
        block_q=rows,
        block_k=keys,
        threads=threads,
        scratch=scratch,
        options=options,
    )
    return out, lse, tiles


ISA_VARIABLE = "ATTNBENCH_FUSED_CPU_ISA"


def isa(dtype: torch.dtype) -> str:
    """The instructions fused_cpu's forward uses for inputs of this dtype (with Sq above the decode rows):
    "avx512_bf16" for bfloat16 where the build has AVX512-BF16 dot products (vdpbf16ps) and
    $ATTNBENCH_FUSED_CPU_ISA is not "fp32", else "fp32" (inputs widened to float32; float16 always is, since
    this CPU family has no AVX512-FP16 and rounding fp16 to bf16 would lose 3 bits of every input)."""
    choice = os.environ.get(ISA_VARIABLE, "auto")
    if choice not in ("auto", "fp32"):
        raise UsageError(f"{ISA_VARIABLE}={choice!r} is not known; allowed: auto, fp32")
    if dtype == torch.bfloat16 and choice == "auto" and bindings.load().has_bf16():
        return "avx512_bf16"
    return "fp32"


def _even_dim(x: torch.Tensor) -> torch.Tensor:
    """x with an odd last axis zero-padded by one (the bf16 dot products take pairs)."""
    return x if x.shape[-1] % 2 == 0 else torch.nn.functional.pad(x, (0, 1))


def _in_place_or_contiguous(x: torch.Tensor, dense_rows: bool = False) -> torch.Tensor:
    """x itself when the forward kernel can read it in place (see bindings.strides; ``dense_rows``: and its
    rows are unpadded), else a contiguous copy."""
    try:
        row, _ = bindings.strides(x)
    except ValueError:
        return x.contiguous()
    return x if row == x.shape[-1] or not dense_rows else x.contiguous()


def _padded32(x: torch.Tensor, padded_dim: int, view_ok: bool = False) -> torch.Tensor:
    """x as contiguous float32 with its last axis zero-padded to padded_dim: x itself when it already is (or,
    with ``view_ok``, when it is a view whose rows the forward kernel reads in place), else a copy."""
    if x.shape[-1] == padded_dim:
        x = x.detach().to(torch.float32)
        return _in_place_or_contiguous(x) if view_ok else x.contiguous()
    padded = torch.zeros(*x.shape[:-1], padded_dim, dtype=torch.float32)
    padded[..., : x.shape[-1]].copy_(x.detach())
    return padded


class _FusedAttention(torch.autograd.Function):
    """fused_attention with the fused backward: the forward keeps each row's log-sum-exp (B·H·Sq floats)
    beside its float32 output, and the backward (``fused_cpu_backward.cpp``) recomputes the probabilities
    tile by tile from them — FlashAttention-2's scheme, O(S·D) memory.

    Learned sinks: the forward's lse includes each row's sink (log(Σ_j e^s_ij + e^sink_h)), so the kernel's
    P = exp(s − lse) are the sink-normalised probabilities and dq, dk, dv need nothing more; the sink itself
    has p_sink = exp(sink_h − lse) and no value, so d sink_h = −Σ_rows p_sink·D_row with D_row = Σ_d dO·O
    (FlashAttention's D), O(B·H·Sq·Dv) here. Dv ≠ D: q, k, v, O and dO are zero-padded to one width for the
    backward kernel (zero channels add nothing to the scores and get zero gradients)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sinks: torch.Tensor | None,
        scale: float,
        mask: str,
        lengths: torch.Tensor | None,
        threads: int,
        stats: dict[str, int],
        options: ScoreOptions | None,
    ) -> torch.Tensor:
        out32, lse, stats["tiles"] = _forward(
            q, k, v, scale=scale, mask=mask, lengths=lengths, threads=threads, keep_lse=True, options=options
        )
        ctx.save_for_backward(q, k, v, sinks, out32, lse)
        ctx.options = (scale, mask, lengths, threads, None if options is None else options.ranges)
        return _narrow(out32, q, v.shape[-1])

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, sinks, out32, lse = ctx.saved_tensors
        scale, mask, lengths, threads, ranges = ctx.options
        padded_dim = max(out32.shape[-1], _round_up(q.shape[-1], bindings.VECTOR))
        dq, dk, dv, _ = bindings.load().backward(
            _padded32(q, padded_dim),
            _padded32(k, padded_dim),
            _padded32(v, padded_dim),
            _padded32(out32, padded_dim),
            _padded32(dout, padded_dim),
            lse,
            scale=scale,
            mask=mask,
            lengths=lengths,
            block_q=BACKWARD_BLOCK_Q,
            block_k=BACKWARD_BLOCK_K,
            threads=threads,
            ranges=ranges,
        )
        grads = (_narrow(g, t) for g, t in zip((dq, dk, dv), (q, k, v), strict=True))
        dsinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            rows_d = (dout.to(torch.float32) * out32[..., : dout.shape[-1]]).sum(-1)  # (B, H, Sq): D
            dsinks = -(torch.exp(sinks.detach().float().view(1, -1, 1) - lse) * rows_d).sum((0, 2)).to(sinks.dtype)
        return (*grads, dsinks, None, None, None, None, None, None)


# The masks the decode kernel applies itself while reading a paged cache in place.
NATIVE_PAGED_MASKS = frozenset({"none", "causal", "causal_bottom_right", "padding"})
# The cache features (axes.DECLARED) fused_cpu takes in its decode kernel only — a KV cache type (bfloat16, fp8
# with scales, read as stored), v's own head dim, a latent cache (v a view of k), learned sinks, a ragged batch's
# lengths (each row its own key prefix); the forward kernel for longer queries takes none of them yet (remove a
# name here when it does). ``_decode_unsupported`` says which of their cases the decode kernel cannot take.
DECODE_FEATURES = frozenset({"kv_dtype"})  # the cache types the decode kernel alone reads as stored


def _decode_features(w: Workload) -> list[str]:
    """What ``w`` asks for that only the decode kernel takes, as the reports name it ('kv_dtype float8_e5m2')."""
    return [a.asks(a.read(w)) if a.asks else a.name for a in DECLARED if a.name in DECODE_FEATURES and a.departs(w)]


def _decode_unsupported(w: Workload) -> str | None:
    """Why the decode kernel cannot take ``w`` (None when it can): it takes at most ``decode_max_rows()`` query
    rows, the forward pass, the masks it applies itself and no score modifier."""
    rows = DECODE_MAX_ROWS if bindings.unavailable_reason() else bindings.load().decode_max_rows()
    if w.seq_q > rows:
        return f"seq_q {w.seq_q} (prefill: the decode kernel takes at most {rows} query rows)"
    if w.pass_ != "fwd":
        return f"pass {w.pass_} (the decode kernel is forward only)"
    if w.mask not in NATIVE_PAGED_MASKS:
        return f"mask {w.mask} (the decode kernel applies {', '.join(sorted(NATIVE_PAGED_MASKS))})"
    if w.score_mod != "none":
        return f"score_mod {w.score_mod} (the decode kernel has no score modifier)"
    return None


def _takes_decode(w: Workload) -> bool:
    """Whether a forward case runs the decode kernel (directly, or through fused_attention's decode branch)."""
    return w.pass_ == "fwd" and _decode_unsupported(w) is None


def score_options(w: Workload) -> tuple[str, ScoreOptions | None]:
    """The kernel's mask code and options for a workload: sliding_window, document, chunked, mixed and any
    ragged batch (``lengths``) become mask "ranges" with each row's [lo, hi) from ``masks.key_ranges`` (the
    harness's own definition, so every contender agrees), softcap its value, alibi the slopes 2^(−8(h+1)/H) of
    the query heads (``masks.alibi_slopes``). A ragged batch whose rows all see a prefix of their sequence's
    keys (decode over ragged caches) is mask "padding" instead, with ``ragged_padding(w)``'s lengths."""
    mask, ranges = w.mask, None
    if ragged_padding(w) is not None:
        mask = "padding"
    elif w.mask not in DEFAULT_MASKS or sequence_lengths(w) is not None:
        lo, hi = key_ranges(w)
        ranges = (lo.expand(w.batch, -1).contiguous(), hi.expand(w.batch, -1).contiguous())
        mask = "ranges"
    softcap = w.softcap if w.score_mod == "softcap" else None
    alibi = alibi_slopes(w.heads).to(torch.float32) if w.score_mod == "alibi" else None
    if ranges is None and softcap is None and alibi is None:
        return mask, None
    return mask, ScoreOptions(ranges=ranges, softcap=softcap, alibi=alibi)


def ragged_padding(w: Workload) -> torch.Tensor | None:
    """(B,) int64: each sequence's key length, when the batch is ragged and every row of sequence b sees
    exactly its keys [0, length_b) — the padding mask, which the decode kernel applies itself; else None."""
    if sequence_lengths(w) is None or w.score_mod == "alibi":  # alibi's distances need each row's own offset
        return None
    lo, hi = key_ranges(w)
    if bool((lo == 0).all()) and bool((hi == hi[:, :1]).all()) and bool((hi[:, 0] > 0).all()):
        return hi[:, 0].contiguous()
    return None


def reads_pages_in_place(w: Workload) -> bool:
    """Whether a paged workload goes to the decode kernel reading the pool through the page table: few query
    rows, pages of a multiple of 16 keys, a mask that kernel applies itself and no score modifier, and no shared
    prefix (the cascade reads it once instead). Other paged workloads are gathered into contiguous k and v by
    the harness inside the timed call."""
    rows = bindings.load().decode_max_rows()
    native = w.mask in NATIVE_PAGED_MASKS and w.score_mod == "none" and not w.shared_prefix
    return native and w.seq_q <= rows and w.page_size % 16 == 0


def _decode_extra_bytes(w: Workload) -> float:
    """The decode kernel's working memory: its scratch (per-thread tiles and rows, split partials), the float32
    output (padded to 16) before it is narrowed, q widened when neither float32 nor bfloat16, and a float16
    cache widened (the kernel reads the others as stored)."""
    threads = torch.get_num_threads()
    args = (w.batch, w.heads, w.kv_heads, w.seq_q, w.seq_k, w.head_dim, w.head_dim_v, threads)
    floats = int(bindings.load().library.attnbench_fused_decode_kv_scratch_floats(*args))
    q_rows, kv_rows = w.batch * w.heads * w.seq_q, w.batch * w.kv_heads * w.seq_k
    floats += q_rows * _round_up(w.head_dim_v, bindings.VECTOR)
    floats += q_rows * w.head_dim if w.torch_dtype not in (torch.float32, torch.bfloat16) else 0
    floats += kv_rows * (w.head_dim + w.head_dim_v) if w.kv_torch_dtype not in bindings.KV_TYPES else 0
    return 4.0 * floats


class FusedCpu(Contender):
    name = "fused_cpu"
    description = (
        "ours: C++ online-softmax attention, 6-row × 1024-key steps with the softmax hidden under P·V, skips masked "
        "panels (windows, documents, chunks, ragged and mixed batches), softcap, ALiBi and sinks in the tile, no S² "
        "memory; decode reads KV pages in place (other paged cases gather them, timed); few rows per head fold a kv "
        "group's heads into one tile (MLA: 128 heads over one latent cache, read in place); a shared prefix is "
        "read once for the batch (cascade)"
    )
    capabilities = Capabilities(
        devices=frozenset({"cpu"}),
        masks=ALL_MASKS,
        score_mods=ALL_SCORE_MODS,
        paged="native",
        backward=True,
        features=frozenset({"head_dim_v", "sinks", "kv_layout", "lengths", "shared_prefix", *DECODE_FEATURES}),
    )

    def availability(self) -> str | None:
        return bindings.unavailable_reason()

    def unsupported_reason(self, workload: Workload) -> str | None:
        reason = super().unsupported_reason(workload)
        w = workload
        asked = _decode_features(w) if reason is None else []
        if asked and w.shared_prefix:
            return (
                f"{', '.join(asked)} with shared_prefix not supported: fused_cpu's cascade reads a cache in the dtype"
            )
        if asked and (why := _decode_unsupported(w)) is not None:
            them = "it" if len(asked) == 1 else "them"
            return f"{', '.join(asked)} not supported with {why}: fused_cpu takes {them} in its decode kernel only"
        if reason is None and w.pass_ != "fwd" and w.score_mod != "none":
            return (
                f"score_mod {w.score_mod} is forward only in fused_cpu: its backward recomputes the "
                "probabilities with key ranges, but not yet with softcap's tanh or ALiBi's bias"
            )
        if reason is None and w.shared_prefix and (w.pass_ != "fwd" or w.score_mod != "none"):
            return "shared_prefix: fused_cpu's cascade is forward only and takes no score_mod"
        return reason

    def reads_pages(self, workload: Workload) -> bool:
        return reads_pages_in_place(workload)

    def predicted_extra_bytes(self, workload: Workload) -> float:
        w = workload
        kernel = bindings.load()  # predictions are made only for available contenders
        if _takes_decode(w):
            return _decode_extra_bytes(w)
        padded_dim = _round_up(w.head_dim, bindings.VECTOR)
        widened = w.torch_dtype != torch.float32
        q_rows = w.batch * w.heads * w.seq_q
        kv_rows = w.batch * w.kv_heads * w.seq_k
        few_rows = w.seq_q * (w.heads // w.kv_heads) <= kernel.decode_max_rows()  # else folded: the forward
        decode = few_rows and w.mask in DEFAULT_MASKS and w.score_mod == "none"
        floats = 0 if decode else w.batch * w.kv_heads * kernel.packed_keys(w.seq_k) * w.head_dim  # packed kᵀ
        floats += kv_rows * padded_dim if widened or padded_dim != w.head_dim else 0  # v in float32
        floats += (q_rows + kv_rows) * w.head_dim if widened else 0  # q and k in float32
        floats += q_rows * padded_dim if widened or padded_dim != w.head_dim else 0  # the float32 output
        threads = torch.get_num_threads()
        uniform = w.mask in ("none", "causal", "causal_bottom_right") and not is_ragged(w)
        rows = block_q(w.batch * w.heads, w.seq_q, threads, uniform)
        keys = block_k(w.head_dim, padded_dim)
        per_thread = 0 if decode else kernel.scratch_floats(rows, keys, w.head_dim, padded_dim)  # decode: none
        if w.pass_ != "fwd":  # lse kept; the backward's scratch, padded copies and float32 gradients
            q_shape = torch.Size((w.batch, w.heads, w.seq_q, padded_dim))
            k_shape = torch.Size((w.batch, w.kv_heads, w.seq_k, padded_dim))
            q, k = torch.empty(q_shape, device="meta"), torch.empty(k_shape, device="meta")
            floats += w.batch * w.heads * w.seq_q  # lse
            floats += kernel.backward_scratch_floats(q, k, BACKWARD_BLOCK_Q, BACKWARD_BLOCK_K, threads)
            floats += 3 * (q_rows + kv_rows) * padded_dim  # q, dout, dq and k, v, dk, dv at worst
        return 4.0 * (floats + threads * per_thread)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        bindings.load()
        w = workload
        lengths = None if inputs.lengths is None else torch.tensor(inputs.lengths, dtype=torch.int64)
        scale, (mask, options) = inputs.scale, score_options(w)
        if w.shared_prefix:  # cascade (a paged cache is gathered by the harness: reads_pages says no)
            lo, hi = key_ranges(w)

            def cascade() -> torch.Tensor:
                return cascade_attention(
                    inputs.q,
                    inputs.k,
                    inputs.v,
                    w.shared_prefix,
                    (lo, hi),
                    scale=scale,
                    threads=torch.get_num_threads(),
                    forward=_forward,
                    sinks=inputs.sinks,
                )

            return cascade
        sinks, row_hi, decode_mask = _sinks32(inputs.sinks), None, mask
        if is_ragged(w):  # each sequence's rows see their own key prefixes [0, hi) (masks.key_ranges)
            row_hi, decode_mask = key_ranges(w)[1].expand(w.batch, -1).contiguous(), "ranges"
        paged = inputs.paged
        if paged is not None and self.reads_pages(w):
            table = paged.page_table.contiguous()

            def decode() -> torch.Tensor:
                out, _ = paged_decode(
                    inputs.q,
                    paged.k_pages,
                    paged.v_pages,
                    table,
                    lengths,
                    scale=scale,
                    mask=decode_mask,
                    seq_k=w.seq_k,
                    sinks=sinks,
                    row_hi=row_hi,
                    k_scale=paged.k_scale,
                    v_scale=paged.v_scale,
                )
                return out

            return decode
        few_rows = w.heads // w.kv_heads * w.seq_q <= bindings.load().decode_max_rows()
        if _takes_decode(w) and (_decode_features(w) or few_rows):
            # a narrow cache (only the decode kernel reads it), or few rows a kv head: bandwidth-bound, k and v
            # read once; more rows (MLA's 128 heads) fold into the forward kernel's tiles (fused_attention)

            def decode_kv() -> torch.Tensor:
                out, _ = decode_attention(
                    inputs.q,
                    inputs.k,
                    inputs.v,
                    scale=scale,
                    mask=decode_mask,
                    lengths=lengths,
                    sinks=sinks,
                    k_scale=inputs.k_scale,
                    v_scale=inputs.v_scale,
                    scale_block=kv_cache.scale_block(w),
                    row_hi=row_hi,
                )
                return out

            return decode_kv
        if (ragged := ragged_padding(w)) is not None:
            lengths = ragged

        def run() -> torch.Tensor:
            q, k, v = inputs.q, inputs.k, inputs.v
            out, _ = fused_attention(
                q, k, v, scale=scale, mask=mask, lengths=lengths, options=options, sinks=inputs.sinks
            )
            return out

        return run


contender = FusedCpu()
