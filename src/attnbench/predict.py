"""Predict a case's time and memory before running it, and skip what would not fit.

A CPU process that runs out of memory is killed, not caught, and a Python loop at 16k tokens would run
for an hour; so every case is priced first. Time comes from the contender's model (by default its FLOPs
at the machine's measured matmul rate — a lower bound); memory from its memory model (the working memory
one call needs beyond inputs and output; for a contender that does not read a paged cache, at least the
harness's gather of it) plus the inputs and the output.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.ceilings import Ceilings
from attnbench.contender import Contender, output_bytes
from attnbench.paged import gather_bytes
from attnbench.workload import Workload

CALLS_AT_LEAST = 3  # first call, one warm-up, one sample: a case costs at least this many calls
MEMORY_HEADROOM = 0.7  # use at most this fraction of the free memory (the rest: reference, allocator slack)
FALLBACK_FLOPS_PER_S = 1e11  # when no ceiling was measured for the dtype
FALLBACK_BYTES_PER_S = 1e10
MEMORY_PASS_COST = 20  # the CPU memory pass (the profiler) can cost this many calls of op-heavy code


def input_bytes(w: Workload) -> int:
    """q, k, v, upstream gradient (B, H, S, D) in the workload's dtype, and a paged cache's pool."""
    element = w.torch_dtype.itemsize
    kv_rows = w.batch * w.kv_heads * w.seq_k
    if w.page_size:  # the page pool holds a second copy of k and v, whole pages
        kv_rows += w.batch * w.kv_heads * -(-w.seq_k // w.page_size) * w.page_size
    return element * w.head_dim * (2 * w.batch * w.heads * w.seq_q + 2 * kv_rows)


@dataclass(frozen=True)
class Prediction:
    seconds: float  # one call
    extra_bytes: float  # one call's working memory at its peak, beyond inputs and output
    total_bytes: float  # with the inputs and the output

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
    extra = contender.predicted_extra_bytes(w)
    if w.page_size and not contender.reads_pages(w):  # the harness's gather of the pages, in the timed call:
        extra = max(extra, gather_bytes(w))  # its temporary is freed before the contender's call begins
    seconds = contender.predicted_seconds(w, flops_per_s, bytes_per_s)
    return Prediction(seconds, extra, extra + input_bytes(w) + output_bytes(w))


def skip_reason(prediction: Prediction, case_budget_s: float, free_bytes: int) -> str | None:
    """Why a case must not run (over the per-case time budget or the free memory), else None."""
    if prediction.seconds * CALLS_AT_LEAST > case_budget_s:
        return (
            f"predicted {prediction.seconds:.3g} s per call; {CALLS_AT_LEAST} calls exceed the case budget "
            f"of {case_budget_s:g} s (raise --case-budget-s to run it)"
        )
    if prediction.total_bytes > MEMORY_HEADROOM * free_bytes:
        return (
            f"predicted {prediction.total_bytes / 2**30:.3g} GiB (inputs + {prediction.mem_mb:.0f} MiB "
            f"extra) exceeds {MEMORY_HEADROOM:.0%} of the {free_bytes / 2**30:.3g} GiB free"
        )
    return None
