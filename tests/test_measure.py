"""Timing mechanics (structure, not speed: machines are noisy, so no test asserts a duration)."""

import math
import random
import time

import torch

from attnbench.measure.stopwatch import (
    MIN_SAMPLES,
    _CpuSeries,
    median_ci_halfwidth,
    quartiles,
    stop_rule_met,
    time_cpu,
    warm_calls,
    warm_up,
)


def test_median_ci_uses_order_statistics():
    assert math.isinf(median_ci_halfwidth([1.0, 2.0, 3.0]))
    samples = [float(x) for x in range(1, 101)]  # n=100: ranks 50 ± 9.8 -> indices 40 and 60
    assert median_ci_halfwidth(samples) == (61 - 41) / 2
    assert median_ci_halfwidth([5.0] * 50) == 0.0


class _ScriptedTimer:
    """A stand-in for timeit.Timer whose blocks last the given seconds; it keeps the calls it was asked for."""

    def __init__(self, seconds: list[float]) -> None:
        self.seconds, self.asked = iter(seconds), []

    def timeit(self, calls: int) -> float:
        self.asked.append(calls)
        return next(self.seconds)


def test_the_stop_rule_reads_no_order_so_the_series_asks_it_with_their_samples_kept_sorted():
    generator = random.Random(3)
    samples = [1.0 + generator.gauss(0, 0.004) for _ in range(400)]
    answers = [stop_rule_met(samples[:n], 0.0, 1.0) for n in range(1, 401)]
    assert answers == [stop_rule_met(sorted(samples[:n]), 0.0, 1.0) for n in range(1, 401)]
    assert not answers[MIN_SAMPLES - 2] and any(answers)  # the rule is asked something it answers both ways
    timer = _ScriptedTimer([9.0, 3e-3, 9.0, 1e-3, 9.0, 2e-3, 9.0, 5e-3, 9.0, 4e-3])  # a warm call, then a block
    series = _CpuSeries(timer, calls=1)  # type: ignore[arg-type]
    for _ in range(5):
        series.take()
    assert series.samples_ms == [3.0, 1.0, 2.0, 5.0, 4.0]  # in the order taken: paired rounds pair sample i
    assert series.ordered == sorted(series.samples_ms) and math.isclose(series.spent_s, 0.015)
    assert timer.asked == [1, 1] * 5  # one untimed call before each block (torch's Timer: two or more)


def test_two_warm_calls_where_malloc_maps_and_unmaps_large_blocks(monkeypatch):
    from attnbench.measure import allocator

    monkeypatch.setattr(allocator, "_applied", "cached: glibc malloc keeps freed memory")
    assert warm_calls() == 1
    monkeypatch.setattr(allocator, "_applied", "system malloc")
    assert warm_calls() == 2


def test_quartiles():
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)


def test_short_calls_are_blocked_into_samples():
    x = torch.ones(8)
    timing = time_cpu(lambda: x.add(1), threads=1, budget_s=0.2, estimate_s=1e-5)
    assert timing.calls_per_sample == 200  # 2 ms samples of ~10 µs calls
    assert timing.method == "timeit"
    assert timing.n_samples == len(timing.samples_ms) >= 3


def test_stops_on_a_steady_median_before_the_budget():
    timing = time_cpu(lambda: time.sleep(0.002), threads=1, budget_s=30.0, estimate_s=0.002)
    assert MIN_SAMPLES <= timing.n_samples < 1000  # far fewer than 30 s of 2 ms samples
    assert median_ci_halfwidth(timing.samples_ms) <= 0.01 * timing.median_ms


def test_budget_bounds_a_noisy_case():
    state = {"n": 0}

    def jittery():
        state["n"] += 1
        time.sleep(0.001 * (1 + state["n"] % 7))  # 1–7 ms: the median never settles to 1 %

    start = time.perf_counter()
    timing = time_cpu(jittery, threads=1, budget_s=0.3, estimate_s=0.004)
    assert time.perf_counter() - start < 3.0
    assert timing.unstable and timing.rel_iqr >= 0.1


def test_warm_up_returns_a_call_estimate():
    estimate = warm_up(lambda: time.sleep(0.001), "cpu", first_call_ms=1.0, budget_s=1.0)
    assert estimate >= 0.001
