"""Timing of a prepared zero-argument callable (first version; see issue 3 for the hardened one).

CPU: torch.utils.benchmark's ``adaptive_autorange`` — it sizes blocks so that timer overhead is
negligible, pins the thread count, and stops once the IQR is within 10 % of the median or the case's
budget is spent. GPU: CUDA events around each call; the host waits only after the end event is recorded,
so host syncs are not counted as kernel time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils.benchmark as benchmark


@dataclass(frozen=True)
class Timing:
    median_ms: float
    iqr_ms: float
    n_samples: int
    calls_per_sample: int
    samples_ms: list[float]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def call_once_ms(fn: Callable[[], object], device: str) -> tuple[float, object]:
    """Wall time of one call including device completion, and its result."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3, result


def _quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        return samples[0], samples[0], samples[0]
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, median, q3


def _from_samples(samples_ms: list[float], calls_per_sample: int) -> Timing:
    q1, median, q3 = _quartiles(samples_ms)
    return Timing(median, q3 - q1, len(samples_ms), calls_per_sample, samples_ms)


def time_cpu(fn: Callable[[], object], threads: int, budget_s: float) -> Timing:
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    measurement = timer.adaptive_autorange(
        threshold=0.1, min_run_time=min(0.2, budget_s), max_run_time=budget_s
    )
    samples_ms = [t * 1e3 for t in measurement.times]  # per-call time of each block
    return _from_samples(samples_ms, measurement.number_per_run)


def time_cuda(
    fn: Callable[[], object], budget_s: float, min_samples: int = 10, max_samples: int = 1000
) -> Timing:
    start_events: list[torch.cuda.Event] = []
    end_events: list[torch.cuda.Event] = []
    torch.cuda.synchronize()
    deadline = time.perf_counter() + budget_s
    while len(start_events) < max_samples and (
        len(start_events) < min_samples or time.perf_counter() < deadline
    ):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        start_events.append(start)
        end_events.append(end)
    samples_ms = [s.elapsed_time(e) for s, e in zip(start_events, end_events, strict=True)]
    return _from_samples(samples_ms, 1)


def warm_up(fn: Callable[[], object], device: str, first_call_ms: float, budget_s: float) -> None:
    """A few more calls after the first, so caches, allocator pools and autotuners settle."""
    calls = 1 if first_call_ms > 1e3 * budget_s / 4 else 3
    for _ in range(calls):
        fn()
    synchronize(device)


def time_callable(fn: Callable[[], object], device: str, threads: int, budget_s: float) -> Timing:
    """Median, IQR and raw per-call samples of ``fn`` on ``device`` within about ``budget_s`` seconds."""
    if device == "cuda":
        return time_cuda(fn, budget_s)
    return time_cpu(fn, threads, budget_s)
