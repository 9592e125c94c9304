"""Predict a case's time and memory before running it, and skip what would not fit.

A CPU process that runs out of memory is killed, not caught, and a Python loop at 16k tokens would run
for an hour; so every case is priced first. Time comes from the contender's model (by default its FLOPs
at the machine's measured matmul rate — a lower bound). Memory is an upper bound of everything the case
holds at its peak: the inputs (and a paged cache's pool), the output, the contender's working memory (its
memory model; for a contender that does not read a paged cache itself, at least the harness's gather of
it), and the correctness check's float64 reference (attnbench.workload.reference.reference_bytes). Measured against
a fresh process's peak RSS (VmHWM) the figure stays above it; docs/measuring.md (Predictions) gives the audit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.contenders.contract import Contender, output_bytes
from attnbench.measure._ceilings import Ceilings
from attnbench.workload import Workload
from attnbench.workload.flops import kv_channels
from attnbench.workload.kv_cache import SCALE_BYTES, dequantized_bytes, scale_count
from attnbench.workload.paged import gather_bytes, pool_bytes
from attnbench.workload.reference import checked_row_count, reference_bytes

CALLS_AT_LEAST = 3  # first call, one warm-up, one sample: a case costs at least this many calls
MEMORY_HEADROOM = 0.7  # use at most this fraction of the free memory (the rest: other processes' growth)
FALLBACK_FLOPS_PER_S = 1e11  # when no ceiling was measured for the dtype
FALLBACK_BYTES_PER_S = 1e10
# The working memory counts twice on CPU: blocks freed and asked for again every call, between smaller ones,
# land in new places in the cached allocator (allocator.py), which then holds a second set (measured RSS over
# the profiler's peak: bmm gathering pages at B 8, 16k keys, +1.6 GiB; sdpa_math prefill at 2048, +0.8 GiB).
CACHE_COPIES = {"cpu": 2, "cuda": 1}
MEMORY_PASS_COST = 20  # the CPU memory pass (the profiler) can cost this many calls of op-heavy code


def input_bytes(w: Workload) -> int:
    """q and k (D wide), v and the upstream gradient (Dv wide; latent: v is k's view), q and the upstream
    gradient in the workload's dtype, k and v in its kv_dtype with an fp8 cache's scales, and a paged cache's
    pool (a second copy of k and v, whole pages, and scales)."""
    element, cached = w.torch_dtype.itemsize, w.kv_torch_dtype.itemsize
    scale_sets = (1 if w.kv_layout == "latent" else 2) * (2 if w.page_size else 1)
    queries = w.batch * w.heads * w.seq_q * (w.head_dim * w.q_torch_dtype.itemsize / element + w.head_dim_v)
    kv = w.batch * w.kv_heads * w.seq_k * kv_channels(w) * cached
    return int(element * queries + kv + SCALE_BYTES * scale_count(w) * scale_sets + pool_bytes(w))


def making_bytes(w: Workload) -> float:
    """What making the inputs holds for a moment beyond them: a float32 draw of the largest tensor before it
    is converted to the dtype, or a paged pool's padded and reordered copies of k (then v) (see
    attnbench.workload.paged.make_paged), whichever is larger."""
    largest = max(w.head_dim, w.head_dim_v) * max(w.batch * w.heads * w.seq_q, w.batch * w.kv_heads * w.seq_k)
    draw = 4.0 * largest if w.torch_dtype != torch.float32 else 0.0
    if w.kv_dtype != w.dtype:  # the cache's float32 draw, and quantize's padded and divided copies of it
        draw = max(draw, 12.0 * w.head_dim * w.batch * w.kv_heads * w.seq_k)
    return max(draw, pool_bytes(w))  # the pool is k's and v's copies: two more of one while it is made


@dataclass(frozen=True)
class Prediction:
    seconds: float  # one call
    extra_bytes: float  # one call's working memory at its peak, beyond inputs and output (peak_mem_mb's figure)
    total_bytes: float  # with the inputs, the output and the check
    check_bytes: float = 0.0  # the correctness check's float64 reference
    cache_bytes: float = 0.0  # a second set of the working memory the CPU allocator's cache may hold

    @property
    def ms(self) -> float:
        return self.seconds * 1e3

    @property
    def mem_mb(self) -> float:
        return self.extra_bytes / 2**20


def predict(contender: Contender, w: Workload, ceilings: Ceilings | None) -> Prediction:
    flops_per_s, bytes_per_s = FALLBACK_FLOPS_PER_S, FALLBACK_BYTES_PER_S
    if ceilings is not None:
        flops_per_s = ceilings.matmul_tflops.get(w.dtype, flops_per_s / 1e12) * 1e12
        bytes_per_s = ceilings.copy_gbps * 1e9 or bytes_per_s
    extra = contender.predicted_extra_bytes(w) + dequantized_bytes(w)  # a narrowed cache read back in the dtype
    if w.page_size and not contender.reads_pages(w):  # the harness's gather of the pages, in the timed call:
        extra = max(extra, gather_bytes(w))  # its temporary is freed before the contender's call begins
    rows = w.seq_q if contender.kind == "module" else checked_row_count(w)
    check = reference_bytes(w, rows, repeated_keys=contender.kind == "scoring")
    seconds = contender.predicted_seconds(w, flops_per_s, bytes_per_s)
    held = input_bytes(w) + making_bytes(w) + output_bytes(w)
    cache = (CACHE_COPIES.get(w.device, 1) - 1) * extra
    return Prediction(seconds, extra, held + extra + cache + check, check, cache)


def skip_reason(prediction: Prediction, case_budget_s: float, free_bytes: int) -> str | None:
    """Why a case must not run (over the per-case time budget or the free memory), else None."""
    if prediction.seconds * CALLS_AT_LEAST > case_budget_s:
        return (
            f"predicted {prediction.seconds:.3g} s per call; {CALLS_AT_LEAST} calls exceed the case budget "
            f"of {case_budget_s:g} s (raise --case-budget-s to run it)"
        )
    if prediction.total_bytes > MEMORY_HEADROOM * free_bytes:
        gib = 2**30
        total, extra, check = prediction.total_bytes / gib, prediction.extra_bytes / gib, prediction.check_bytes / gib
        held = total - extra - check - prediction.cache_bytes / gib
        cache = f" + {prediction.cache_bytes / gib:.2f} GiB allocator cache" if prediction.cache_bytes else ""
        return (
            f"predicted {total:.3g} GiB (inputs, their making and output {held:.2f} GiB, "
            f"working memory {extra:.2f} GiB{cache}, check {check:.2f} GiB) "
            f"exceeds {MEMORY_HEADROOM:.0%} of the {free_bytes / gib:.3g} GiB free"
        )
    return None
