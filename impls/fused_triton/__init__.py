"""``fused_triton`` — attnbench's own FlashAttention-2 kernels, forward and backward, written in Triton (CUDA).

This package holds them: the kernels, a file a family (``forward_kernels.py``, ``backward_kernels.py``,
``decode_kernels.py``, what they share in ``shared_kernels.py``; design: masks as per-row key ranges with fully
masked blocks skipped, GQA by head index, the head dim padded to a power of two, a backward that recomputes
P from the saved log-sum-exp); the attention function, its plan and the autograd wrapper in ``flash.py``;
tile candidates and tuning in ``tiles.py``; ``smoke.py``, ``nox -s gpu_smoke``'s check of every tile on a
GPU. This module (the package's ``__init__``, the entry point) is the contender around them: ``prepare``
builds the plan (padding lengths on the device) and tunes every kernel the pass needs once, so the timed
callable launches the chosen tiles directly. It reads ``inputs.q``, ``k`` and ``v`` at call time and passes
their strides, so nothing is copied and the mha module's in-place projections are seen. ``bwd`` and
``fwd_bwd`` go through torch.autograd into the backward kernels (``backward=True``).

Every mask and score modifier of the harness runs in the kernel (``_mask_options``): ``sliding_window`` as
its bottom-right ``window``, ``document`` as ``cu_seqlens`` from ``masks.document_lengths`` (the lengths
every contender uses), ``chunked`` as its ``chunk``, a mixed or ragged batch (``lengths``) as the
harness's per-row key ranges (``masks.key_ranges``, turned into row and key tables once in ``prepare``),
``softcap`` and ``alibi`` inside the score tile. The newest workloads' features run in the kernels too
(``plan_options``): a value head dim of its own (``head_dim_v``), learned ``sinks`` (forward and backward,
their gradient included: the runner's fourth leaf), a KV cache stored as bf16 or fp8 with float32 scales
(``kv_dtype``, forward only: converted and scaled after the load, never dequantized into a copy), an MLA
``latent`` cache (v the view of k's first Dv channels, read through k's pointer and strides — the key tile
itself when as wide; MLA's 576-wide head dim split 512 + 64 in the forward, ``WIDE_LATENT_BACKWARD`` says why
not backward), and a ``shared_prefix`` as cascade attention (forward: the prefix's one copy,
``inputs.prefix_kv``, is read for the rows of every sequence at once — by the decode kernel's splits for a
decode step, by a prefix kernel for longer query blocks, whose state the forward kernel continues over each
row's own suffix — and the levels merged by log-sum-exp; ``SHARED_PREFIX_BACKWARD`` and ``SHARED_PREFIX_FP8``
say what it does not run). An fp8 forward (``q_dtype`` float8_e4m3fn beside an e4m3 cache: q, k and v in
e4m3 with per-(sequence, head) scales) runs the forward kernel with both dots in e4m3, decode-sized steps too
(``FP8_FORWARD_LAYOUT`` says what it does not run).

A forward of at most ``decode.DECODE_MAX_QUERIES`` query rows per sequence (a decode step, speculative
decoding's 2–8) runs the split-KV decode kernels (``decode.py``, ``decode_kernels.py``): a kv head's whole
group of query rows in one tile, the keys split across the SMs, the splits merged by log-sum-exp. They read
a paged KV cache in place, through its page table (``reads_pages``: the harness gathers nothing, the
contiguous k and v are not read); other paged workloads — prefill-sized query blocks, a shared prefix in
pages — are gathered back into contiguous k and v by the harness at the start of the timed call.

Without a GPU, ``TRITON_INTERPRET=1`` (set before Triton defines the kernel, i.e. in the environment of
the process) runs the same kernel in Triton's CPU interpreter; the contender then also accepts CPU
workloads, so the whole harness can check its correctness on any machine. Its times mean nothing there;
its time model then counts the interpreter's steps instead of FLOPs, so that the harness skips cases too
long to interpret (with the prediction as the reason) instead of letting them time out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from attnbench import errors
from attnbench.contenders.contract import ALL_MASKS, ALL_SCORE_MODS, Capabilities, Contender
from attnbench.impls.fused_triton.tiles import head_dim_blocks
from attnbench.workload import Workload, kv_cache
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import document_lengths, key_ranges
from attnbench.workload.sequences import is_ragged, sequence_offsets

NEEDS_CUDA = "needs a CUDA GPU (set TRITON_INTERPRET=1 to run it in Triton's CPU interpreter, for correctness only)"
# Triton's interpreter runs the grid in Python. Measured with Triton 3.9 on a 2-core x86 machine, whatever
# the head dim: about 2 ms per (tile, key block) step and 4.5 ms more per tile; the backward's steps (dK/dV
# and dQ together) cost 1.8–3.5 times the forward's (measured on three shapes): BACKWARD_STEPS.
INTERPRETER_SECONDS_PER_BLOCK = 2e-3
INTERPRETER_SECONDS_PER_TILE = 4.5e-3
BACKWARD_STEPS = 3.0
MAX_HEAD_DIM_V = 256  # as the head dim: a BLOCK_M × Dv fp32 accumulator past 256 spills on a GPU
MAX_LATENT_HEAD_DIM = 576  # MLA's cache (DeepSeek-V3: 512 latent + 64 rope channels), split 512 + 64 in the forward
WIDE_LATENT_BACKWARD = (
    "kv_layout latent with head_dim > 256: forward only (the forward splits the head dim 512 + 64; the backward "
    "kernels keep whole D-wide k and dK tiles, not split)"
)
SHARED_PREFIX_BACKWARD = (
    "shared_prefix: forward only (cascade attention is a serving-time layout; FlashInfer's cascade is forward only)"
)
FP8_FORWARD_LAYOUT = (
    "q_dtype float8_e4m3fn (an fp8 forward) reads a contiguous cache with one scale per (sequence, head): no pages, "
    "no shared prefix"
)
SHARED_PREFIX_FP8 = (
    "shared_prefix with an fp8 kv_dtype not supported: the prefix kernel reads no scales (and a contiguous fp8 cache "
    "scales each sequence's copy of the prefix on its own, so no one copy stands for the batch)"
)


_flash: ModuleType | None
_decode: ModuleType | None
try:  # Triton is optional. Imported here, once, so no call imports it later (and `ab --base` sees its own);
    # nothing at this module's top imports a module that imports Triton, or a missing Triton fails the entry point
    from attnbench.impls.fused_triton import decode as _decode  # the decode kernels' launchers
    from attnbench.impls.fused_triton import flash as _flash  # decides from TRITON_INTERPRET: GPU or interpreter
except Exception as exc:  # ImportError, or a Triton too old or broken to define the kernel
    _flash, _decode, _FLASH_ERROR = None, None, errors.reason(exc)


def _kernels() -> ModuleType:
    """The kernel module (``flash``), or the ImportError that kept it from importing."""
    if _flash is None:
        raise ImportError(_FLASH_ERROR)
    return _flash


def _decodes(w: Workload) -> bool:
    """Whether the decode kernels run ``w`` (``decode.decodes``); never without Triton."""
    return _decode is not None and _decode.decodes(w)


def _interpreted() -> bool:
    try:
        return bool(_kernels().INTERPRETED)
    except Exception:  # no usable Triton: availability() reports why
        return False


def _interpreter_seconds(w: Workload) -> float:
    """One call in Triton's interpreter: count the tiles and the key blocks the kernel visits (the same
    bounds as its loops: from the block holding the lowest key some row of the tile sees up to the highest),
    from the harness's per-row key ranges."""
    kernels = _kernels()
    tile = kernels.INTERPRETER_TILES["fwd"]
    block_m, block_n = tile.block_m, tile.block_n
    lo, hi = key_ranges(w)  # (B|1, Sq) each
    tiles_per_row = -(-w.seq_q // block_m)
    pad = tiles_per_row * block_m - w.seq_q
    seen = lo < hi
    lowest = torch.nn.functional.pad(torch.where(seen, lo, w.seq_k), (0, pad), value=w.seq_k)
    highest = torch.nn.functional.pad(torch.where(seen, hi, 0), (0, pad), value=0)
    lowest = lowest.view(lo.shape[0], tiles_per_row, block_m).amin(-1)
    highest = highest.view(lo.shape[0], tiles_per_row, block_m).amax(-1)
    start = lowest.div(block_n, rounding_mode="floor") * block_n
    blocks = int((torch.maximum(highest, start) - start).add(block_n - 1).div(block_n, rounding_mode="floor").sum())
    blocks *= w.batch // lo.shape[0]
    tiles = w.batch * tiles_per_row
    forward = w.heads * (INTERPRETER_SECONDS_PER_TILE * tiles + INTERPRETER_SECONDS_PER_BLOCK * blocks)
    return forward * {"fwd": 1.0, "bwd": BACKWARD_STEPS, "fwd_bwd": 1.0 + BACKWARD_STEPS}[w.pass_]


def _mask_options(inputs: AttentionInputs, w: Workload) -> dict[str, Any]:
    """The kernel's keyword arguments for the workload's mask and score modifier, as the harness defines
    them (``attnbench.workload.masks``): a sliding window is the kernel's bottom-right ``window``; documents are
    ``cu_seqlens`` from the harness's own document lengths; chunked its ``chunk``; a ragged or mixed batch
    the harness's per-row key ranges (``masks.key_ranges``) with each sequence's own diagonal for ALiBi;
    softcap its value; alibi the kernel's slopes 2^(−8(h+1)/H) over the query heads."""
    device = inputs.q.device
    options: dict[str, Any] = {"mask": w.mask}
    if is_ragged(w):  # the whole mask, window included, as per-row ranges
        options.update(mask="none", row_ranges=key_ranges(w), seq_offsets=sequence_offsets(w, "cpu"))
    elif w.mask == "padding":
        assert inputs.lengths is not None
        options["lengths"] = torch.tensor(inputs.lengths, dtype=torch.int32, device=device)  # (B,)
    elif w.mask == "sliding_window":
        options.update(mask="none", window=w.window)
    elif w.mask == "document":
        offsets = [0, *itertools.accumulate(document_lengths(w.seq_q, w.documents, w.lengths))]
        options.update(mask="none", cu_seqlens=torch.tensor(offsets, dtype=torch.int32))
    elif w.mask == "chunked":
        options["chunk"] = w.chunk
    if w.score_mod == "softcap":
        options["softcap"] = w.softcap
    elif w.score_mod == "alibi":
        options["alibi"] = True
    return options


def plan_options(inputs: AttentionInputs, w: Workload) -> dict[str, Any]:
    """Every keyword argument of ``flash.make_plan`` for this case: scale, mask and score modifier
    (``_mask_options``), the sinks (looked at for their shape), an fp8 cache's scales with the positions
    each covers (a sequence, or a page)."""
    options = {
        "scale": inputs.scale,
        "sinks": inputs.sinks,
        "shared_prefix": w.shared_prefix,
        **_mask_options(inputs, w),
    }
    if inputs.k_scale is not None:
        options.update(k_scale=inputs.k_scale, v_scale=inputs.v_scale, scale_block=kv_cache.scale_block(w))
    if inputs.q_scale is not None:  # an fp8 forward: q in e4m3 too, the output in the dtype
        options.update(q_scale=inputs.q_scale, out_dtype=w.torch_dtype)
    return options


class FusedTriton(Contender):
    name = "fused_triton"
    description = (
        "our Triton FlashAttention-2 kernels, forward and backward (CUDA; tiles tuned once, masked blocks skipped; "
        "windows, documents, chunks, ragged and mixed batches, softcap, ALiBi, sinks, Dv ≠ D, MLA latent and "
        "bf16/fp8 caches in the kernel; an fp8 forward (q, k, v in e4m3, fp8 dots); decode (Sq ≤ 8) split across "
        "the SMs with a kv group's rows in one tile, paged caches read in place)"
    )
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({"float16", "bfloat16", "float32"}),
        min_head_dim=16,
        max_head_dim=256,
        masks=ALL_MASKS,
        score_mods=ALL_SCORE_MODS,
        paged="native",  # the decode kernels read pages in place (reads_pages); the harness gathers the others
        gqa=True,
        cross=True,
        backward=True,
        # head_dim_v: v, O and dO Dv wide in every kernel; sinks: in the forward's denominator and the
        # backward (their gradient from the preprocess); lengths: a ragged batch as per-row key ranges;
        # kv_dtype (bf16, fp8 e4m3 / e5m2, forward only): converted and scaled after the load;
        # kv_layout latent: v is the view of k's first Dv channels, read through k's pointer and strides (the
        # key tile itself when as wide); head dims past 256 (up to MLA's 576) split in the forward.
        # shared_prefix (forward): cascade in the kernels — the prefix's one copy read for the whole batch by
        # a kernel whose programs take rows from every sequence, each suffix after it, merged by log-sum-exp.
        # q_dtype float8_e4m3fn: an fp8 forward, both dots in e4m3 (the forward kernel, decode steps too).
        features=frozenset({"head_dim_v", "sinks", "lengths", "kv_dtype", "q_dtype", "kv_layout", "shared_prefix"}),
    )
    # What Triton's CPU interpreter can run: the same, on CPU tensors too.
    interpreter_capabilities = dataclasses.replace(capabilities, devices=frozenset({"cpu", "cuda"}))

    def availability(self) -> str | None:
        try:
            kernels = _kernels()
        except ImportError as exc:
            return f"triton is not installed or failed to import ({exc})"
        if not kernels.INTERPRETED and not torch.cuda.is_available():
            return NEEDS_CUDA
        return None

    def unsupported_reason(self, workload: Workload) -> str | None:
        w = workload
        base = super().unsupported_reason(w)  # the module rules, then self.capabilities'
        if base is not None and base != self.capabilities.unsupported_reason(w):
            return base  # a module rule (the mha module's)
        capabilities = self.interpreter_capabilities if w.device == "cpu" and _interpreted() else self.capabilities
        assert capabilities.max_head_dim is not None
        max_head_dim_v = MAX_HEAD_DIM_V
        if w.kv_layout == "latent" and w.head_dim > capabilities.max_head_dim:  # MLA's 576, split in the forward
            capabilities = dataclasses.replace(capabilities, max_head_dim=MAX_LATENT_HEAD_DIM)
            if w.pass_ != "fwd":
                return capabilities.unsupported_reason(w) or WIDE_LATENT_BACKWARD
            max_head_dim_v = head_dim_blocks(w.head_dim)[0]  # the values within the split's main tile (512)
        reason = capabilities.unsupported_reason(w)
        if reason is not None:
            return reason
        low = capabilities.min_head_dim
        if not low <= w.head_dim_v <= max_head_dim_v:
            return f"head_dim_v {w.head_dim_v} outside [{low}, {max_head_dim_v}]"
        if w.shared_prefix and w.pass_ != "fwd":
            return SHARED_PREFIX_BACKWARD
        if w.shared_prefix and kv_cache.is_scaled(w):
            return SHARED_PREFIX_FP8
        if w.q_dtype != w.dtype and w.page_size:
            return FP8_FORWARD_LAYOUT
        return None

    def reads_pages(self, workload: Workload) -> bool:
        """A paged cache is read in place by the decode kernels: a forward of few query rows, no shared prefix."""
        w = workload
        return bool(w.page_size) and _decodes(w) and not w.shared_prefix

    def predicted_extra_bytes(self, workload: Workload) -> float:
        """fp32 softmax statistics per query row; a shared prefix adds its level's fp32 output and log-sum-exp
        per row (the state the suffix level starts from). The decode kernels instead keep each split's fp32
        partial output and log-sum-exp per row (``decode.partial_bytes``)."""
        w = workload
        rows = w.batch * w.heads * w.seq_q
        if _decode is not None and _decode.decodes(w):
            return float(_decode.partial_bytes(w, _interpreted()))
        return 8.0 * rows + (4.0 * rows * (w.head_dim_v + 1) if w.shared_prefix else 0.0)

    def predicted_seconds(self, workload: Workload, flops_per_s: float, bytes_per_s: float) -> float:
        if workload.device == "cpu" and _interpreted():
            return _interpreter_seconds(workload)  # the interpreter's steps, not FLOPs, set its time
        return super().predicted_seconds(workload, flops_per_s, bytes_per_s)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        kernels = _kernels()
        q, k, v = inputs.q, inputs.k, inputs.v
        paged = inputs.paged if self.reads_pages(workload) else None
        pages = None
        options = plan_options(inputs, workload)
        if paged is not None:  # read in place: the pool, its table and its per-page scales
            pages = kernels.Pages(
                paged.k_pages, paged.v_pages, paged.page_table, paged.page_size, paged.k_scale, paged.v_scale
            )
            options["page_size"] = paged.page_size
        plan = kernels.make_plan(q, k, v, **options)
        sinks = inputs.sinks
        plan.tune(
            q.detach(),
            k.detach(),
            v.detach(),
            backward=workload.pass_ != "fwd",
            sinks=None if sinks is None else sinks.detach(),
            pages=pages,
        )  # once, untimed
        attend = kernels.attend

        def run() -> torch.Tensor:  # a shared prefix: its one copy, inputs.prefix_kv (views of sequence 0's)
            return attend(inputs.q, inputs.k, inputs.v, plan, inputs.sinks, inputs.prefix_kv, pages)

        run.plan = plan  # type: ignore[attr-defined]  # the tiles it launches, for tests and reports
        run.choice = plan.chosen_tiles  # type: ignore[attr-defined]  # read after the first call (contract.choice_of)
        return run


contender = FusedTriton()
