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
threads (merging the partial max, sum and output) when B·Hkv items are too few to feed them.

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

from attnbench.contender import ALL_MASKS, ALL_SCORE_MODS, DEFAULT_MASKS, Capabilities, Contender
from attnbench.errors import UsageError
from attnbench.impls.fused_cpu import bindings
from attnbench.impls.fused_cpu.bindings import ScoreOptions
from attnbench.impls.fused_cpu.cascade import cascade_attention
from attnbench.inputs import AttentionInputs
from attnbench.masks import alibi_slopes, key_ranges
from attnbench.sequences import sequence_lengths
from attnbench.workload import Workload

BLOCK_Q = 2048  # most query rows per forward work item: its row groups share each key block while in L2
MIN_BLOCK_Q = 48  # fewest, when more items are needed to feed the threads
GROUP = 6  # query rows per step of the forward (fused_cpu_kernel.cpp's GROUP)
BLOCK_K = 1024  # keys per forward step
BACKWARD_BLOCK_Q = 64  # the backward holds two BACKWARD_BLOCK_Q × BACKWARD_BLOCK_K tiles (P and dP) per thread
BACKWARD_BLOCK_K = 256


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def block_q(batch_heads: int, seq_q: int, threads: int) -> int:
    """Query rows per forward work item: BLOCK_Q (long items share each key block among more row groups),
    fewer — whole groups, at least MIN_BLOCK_Q — when that would leave a thread fewer than 4 items."""
    rows = _round_up(-(-batch_heads * seq_q // (4 * max(threads, 1))), GROUP)
    return min(seq_q, max(MIN_BLOCK_Q, min(BLOCK_Q, rows)))


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
    if folds(q, k, v, options):
        q, mask, options = _folded(q, k, mask, options)
    out32, _, tiles = _forward(
        q, k, v, scale=scale, mask=mask, lengths=lengths, threads=threads, keep_lse=False, options=options
    )
    return _narrow(out32, q, v.shape[-1]).view(*leaves[0].shape[:3], v.shape[-1]), tiles


def folds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: ScoreOptions | None) -> bool:
    """Whether the forward folds each kv head's query heads into its query rows: with few query rows per head
    (decode, MLA's 128 heads over one latent cache) a work item of one head's rows would run the 6-row tiles
    nearly empty and read the keys once per head; folded, the G·Sq rows of a kv group share every key block
    (read once per sequence) in full tiles. Not where the decode kernel takes the case (few rows in all), and
    not with per-head score terms (ALiBi's slopes, sinks), which the folded rows would lose."""
    heads, seq_q, kv_heads = q.shape[1], q.shape[2], k.shape[1]
    group = heads // kv_heads
    per_head = options is not None and (options.alibi is not None or options.sinks is not None)
    decode_kernel = seq_q * group <= bindings.load().decode_max_rows() and options is None
    decode_kernel = decode_kernel and v.shape[-1] == q.shape[-1]
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
) -> tuple[torch.Tensor, int]:
    """Decode attention over a paged KV cache: q (B, H, Sq ≤ 16, D); k_pages, v_pages (num_pages, Hkv,
    page_size, D) pools, page_size a multiple of 16; page_table (B, max_pages) int, batch b's keys being its
    pages in order; lengths (B,) the cache length of each sequence for the padding mask; ``mask`` one of the
    decode kernel's (none, causal, causal_bottom_right, padding; default padding with lengths, else none);
    ``seq_k`` the cache length (default: every page full). The kernel reads the pages in place (no gather).
    Returns the output in q's dtype and the score entries computed."""
    kernel = bindings.load()
    padded_dim = _round_up(q.shape[-1], bindings.VECTOR)
    out = torch.empty(*q.shape[:3], padded_dim, dtype=torch.float32)
    k32 = k_pages.detach().to(torch.float32).contiguous()
    if lengths is not None:
        lengths = lengths.to(torch.int64).contiguous()
    tiles, _ = kernel.decode(
        q.detach().to(torch.float32).contiguous(),
        k32,
        _padded32(v_pages, padded_dim),
        out,
        None,
        scale=scale,
        mask=mask or ("none" if lengths is None else "padding"),
        lengths=lengths,
        threads=threads or torch.get_num_threads(),
        pages=page_table.to(torch.int32).contiguous(),
        seq_k=seq_k,
    )
    return _narrow(out, q), tiles


def _narrow(out32: torch.Tensor, q: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The kernel's padded float32 output as the caller's (B, H, Sq, dim) in q's dtype (dim: q's head dim
    unless given — the value head dim for an attention output)."""
    head_dim = q.shape[-1] if dim is None else dim
    return (out32 if out32.shape[-1] == head_dim else out32[..., :head_dim]).to(q.dtype)


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
    rows = block_q(batch * heads, seq_q, threads)
    out = torch.empty(batch, heads, seq_q, padded_dim, dtype=torch.float32)
    lse = torch.empty(batch, heads, seq_q, dtype=torch.float32) if keep_lse else None
    # bandwidth-bound: k and v read once, keys split across threads
    decode = seq_q <= kernel.decode_max_rows() and options is None and v.shape[-1] == head_dim
    if not decode and isa(q.dtype) == "avx512_bf16":
        q16 = _even_dim(q.detach().contiguous())
        k16 = _even_dim(_in_place_or_contiguous(k.detach(), dense_rows=True))
        v16 = _even_dim(_in_place_or_contiguous(v.detach()))
        sizes = {"block_q": rows, "block_k": BLOCK_K, "threads": threads}
        tiles = kernel.forward_bf16(
            q16, k16, v16, out, lse, scale=scale, mask=mask, lengths=lengths, options=options, **sizes
        )
        return out, lse, tiles
    q32 = q.detach().to(torch.float32).contiguous()  # the float32 paths from here on (no copy for float32)
    k32 = _in_place_or_contiguous(k.detach().to(torch.float32))
    v32 = _padded32(v, padded_dim, view_ok=True)
    if decode:
        k32, v32 = k32.contiguous(), v32.contiguous()
        tiles, _ = kernel.decode(q32, k32, v32, out, lse, scale=scale, mask=mask, lengths=lengths, threads=threads)
        return out, lse, tiles
    kt = torch.empty(batch * kv_heads * kernel.packed_keys(seq_k) * head_dim)  # the kernel packs kᵀ here
    scratch = torch.empty(threads * kernel.scratch_floats(rows, BLOCK_K, head_dim, padded_dim))
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
        block_k=BLOCK_K,
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
    rows, pages of a multiple of 16 keys, a mask that kernel applies itself and no score modifier. Other paged
    workloads are gathered into contiguous k and v by the harness inside the timed call."""
    rows = bindings.load().decode_max_rows()
    plain = w.head_dim_v == w.head_dim and w.sinks == "none" and w.kv_dtype == w.dtype and not w.shared_prefix
    plain = plain and sequence_lengths(w) is None and w.kv_layout != "latent"  # what paged_decode takes today
    plain = plain and w.mask in NATIVE_PAGED_MASKS and w.score_mod == "none"
    return plain and w.seq_q <= rows and w.page_size % 16 == 0


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
        devices=frozenset({"cpu"}), masks=ALL_MASKS, score_mods=ALL_SCORE_MODS, paged="native", backward=True,
        features=frozenset({"head_dim_v", "sinks", "kv_layout", "lengths", "shared_prefix"}),
    )  # fmt: skip

    def availability(self) -> str | None:
        return bindings.unavailable_reason()

    def unsupported_reason(self, workload: Workload) -> str | None:
        reason = super().unsupported_reason(workload)
        w = workload
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
        padded_dim = _round_up(w.head_dim, bindings.VECTOR)
        widened = w.torch_dtype != torch.float32
        q_rows = w.batch * w.heads * w.seq_q
        kv_rows = w.batch * w.kv_heads * w.seq_k
        decode = w.seq_q <= kernel.decode_max_rows() and w.mask in DEFAULT_MASKS and w.score_mod == "none"
        floats = 0 if decode else w.batch * w.kv_heads * kernel.packed_keys(w.seq_k) * w.head_dim  # packed kᵀ
        floats += kv_rows * padded_dim if widened or padded_dim != w.head_dim else 0  # v in float32
        floats += (q_rows + kv_rows) * w.head_dim if widened else 0  # q and k in float32
        floats += q_rows * padded_dim if widened or padded_dim != w.head_dim else 0  # the float32 output
        threads = torch.get_num_threads()
        rows = block_q(w.batch * w.heads, w.seq_q, threads)
        per_thread = 0 if decode else kernel.scratch_floats(rows, BLOCK_K, w.head_dim, padded_dim)  # decode: none
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
        if (ragged := ragged_padding(w)) is not None:
            lengths = ragged
        scale, (mask, options) = inputs.scale, score_options(w)
        sinks = inputs.sinks
        paged = inputs.paged
        if paged is not None and self.reads_pages(w):
            table = paged.page_table.contiguous()

            def decode() -> torch.Tensor:
                out, _ = paged_decode(
                    inputs.q, paged.k_pages, paged.v_pages, table, lengths, scale=scale, mask=mask, seq_k=w.seq_k
                )
                return out

            return decode

        if w.shared_prefix:
            lo, hi = key_ranges(w)
            prefix = w.shared_prefix

            def cascade() -> torch.Tensor:
                threads = torch.get_num_threads()
                return cascade_attention(
                    inputs.q, inputs.k, inputs.v, prefix, (lo, hi), scale=scale, threads=threads, sinks=sinks
                )

            return cascade

        def run() -> torch.Tensor:
            q, k, v = inputs.q, inputs.k, inputs.v
            out, _ = fused_attention(q, k, v, scale=scale, mask=mask, lengths=lengths, options=options, sinks=sinks)
            return out

        return run


contender = FusedCpu()
