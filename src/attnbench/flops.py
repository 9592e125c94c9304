"""One FLOP count for every contender (see DESIGN.md).

forward = 2·Hq·(D + Dv)·P, with P the exact number of (query, key) pairs the mask leaves visible summed
over the batch — so causal with Sq ≠ Sk and padding are counted right, and a kernel that skips masked
blocks is not credited with work it did not need to do. Backward is 2.5× forward, forward+backward 3.5×.
"""

from __future__ import annotations

from attnbench.masks import visible_pairs
from attnbench.workload import Workload

PASS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def attention_flops(w: Workload) -> float:
    """Floating-point operations of one call of the workload's pass."""
    pairs = visible_pairs(w.mask, w.batch, w.seq_q, w.seq_k)
    forward = 2.0 * w.heads * (w.head_dim + w.head_dim) * pairs
    return forward * PASS_FACTOR[w.pass_]


def tflops(w: Workload, median_ms: float) -> float:
    """Achieved TFLOP/s at the given per-call time."""
    return attention_flops(w) / (median_ms * 1e-3) / 1e12
