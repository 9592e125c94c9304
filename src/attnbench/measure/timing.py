"""The timer for a device: attnbench.measure.stopwatch on CPU, attnbench.measure.stopwatch_cuda on CUDA."""

from __future__ import annotations

from collections.abc import Callable

from attnbench.measure.stopwatch import Timing, time_cpu
from attnbench.measure.stopwatch_cuda import time_cuda


def time_callable(
    fn: Callable[[], object], device: str, threads: int, budget_s: float, estimate_s: float, graphs: bool = True
) -> Timing:
    """Median, IQR and raw per-call samples of ``fn`` on ``device`` within about ``budget_s`` seconds
    (``estimate_s``, one call's time, sizes a CPU sample's block of calls; ``graphs=False``: no CUDA graph
    replays, for a backward pass)."""
    if device == "cuda":
        return time_cuda(fn, budget_s, graphs)
    return time_cpu(fn, threads, budget_s, estimate_s)
