"""Timing a prepared zero-argument callable, so that a figure attnbench prints can be quoted.

CPU — a sample is a block of calls timed by Python's ``timeit`` (``perf_counter``, garbage collection off
during the block) with torch's threads pinned to the run's count, calls blocked into samples of at least
``MIN_SAMPLE_S`` so timer overhead is negligible, after untimed calls (:func:`warm_calls`) that refill the
caches the round's other samples left. torch.utils.benchmark's ``Timer.timeit`` would warm up with at least
two calls: with the 2 ms+ calls of most CPU cases (one call a sample) a sample cost three calls, a third of
them timed. We drive the loop ourselves rather than calling ``adaptive_autorange`` because its only stop
rule is IQR/median < threshold, which accepts a median that still wanders by several percent between runs;
we stop when the 95 % confidence interval of the median is within ``TARGET_CI`` of it, or the budget is
spent.

Interleaved rounds — the contenders of one workload are timed together (:func:`time_cpu_rounds`): each
round takes one sample of every contender still sampling, in an order shuffled per round from a seeded
generator, until each one's stop rule is met. A shared machine's speed wanders by several per cent over
minutes; timed one after another, contender A would get the fast minute and B the slow one, and their
ratio would carry the drift. In rounds, the drift lands on all of them alike. With ``paired=True`` (the A/B
command) no contender drops out early: every one takes a sample in every round until one of them has spent
the budget, so sample i of each comes from round i and per-round ratios can be formed.

Cold samples — a warm sample reads its inputs from wherever the round's earlier calls left them: a decode
step whose KV cache fits in the last-level cache reads it from there, faster than memory, as no layer of a
model would (its next step finds other layers' caches there). Given ``cold`` names and a ``flush``
(:func:`cache_flusher`), each named contender also takes, at its own shuffled place in every round, one call
timed alone right after the flush: ``cold_samples_ms``, as the GPU's L2-flushed samples. A flush costs
several warm samples' time, so a run takes ``COLD_SAMPLES`` of them (its ``cold_median_ms`` is a figure beside
the warm median, which alone decides the stop rule); paired rounds (ab's ``--cold``) take one every round.

GPU — attnbench.measure.stopwatch_cuda: CUDA events, the same interleaved rounds and stop rule, warm and cold samples
alike (``time_callable`` here picks the timer for the device).
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
import time
import timeit
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.benchmark.utils.common import set_torch_threads

from attnbench.measure._cpu_wait import waited_ns
from attnbench.measure._hardware import last_level_caches_used
from attnbench.measure.allocator import keeps_freed_memory

MIN_SAMPLE_S = 2e-3  # a CPU sample blocks calls until it lasts at least this long
PAIRED_BLOCK_GROWTH = 10  # paired rounds: a slower contender's block grows to at most 10 × MIN_SAMPLE_S
TARGET_CI = 0.005  # stop once the median's 95 % CI half-width is within 0.5 % of the median
MIN_SAMPLES = 10  # before the confidence-interval rule may stop sampling
MIN_TRUSTED = 5  # a budget-limited case still gets this many samples, up to twice its budget
MAX_SAMPLES = 10_000
UNSTABLE_REL_IQR = 0.10  # flag a case whose IQR is 10 % of its median or more
FLUSH_CACHES = 4  # a CPU flush reads and writes this many times the last-level cache (as the GPU's: 4 × L2)
MIN_FLUSH_BYTES = 64 * 2**20
COLD_SAMPLES = 25  # a run's cold samples per contender (a flush costs more than a warm sample); ab's: every round


@dataclass(frozen=True)
class Timing:
    median_ms: float
    iqr_ms: float
    n_samples: int
    calls_per_sample: int
    samples_ms: list[float]
    method: str  # how the samples were taken: timeit, cuda_events+sleep or cuda_graph
    cold_samples_ms: list[float] = field(default_factory=list)  # the cache flushed before each call, one a round
    rounds: int = 1  # rounds of the interleaved loop the workload's contenders were sampled in
    host_overhead_us: float | None = None  # GPU: the host's own time to issue one call (measure_cuda)
    yardstick_rounds: dict[str, list[float]] = field(default_factory=dict)  # CPU: each yardstick rate of its rounds
    waited: float | None = None  # CPU: median share of a sample's thread time spent waiting for a core (cpu_wait)
    stalled: str | None = None  # why its rounds ran on a stalled machine (the runner's check), else None
    gpu_state: dict[str, Any] = field(default_factory=dict)  # GPU: clocks, power, throttling while sampled (gpu_state)

    @property
    def cold_median_ms(self) -> float | None:
        """The median of the cold samples (None where none were taken)."""
        return statistics.median(self.cold_samples_ms) if self.cold_samples_ms else None

    @property
    def yardsticks(self) -> dict[str, float]:
        """CPU: each yardstick's median rate over the rounds it sampled in."""
        return {name: statistics.median(rates) for name, rates in self.yardstick_rounds.items()}

    @property
    def rel_iqr(self) -> float:
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else math.inf

    @property
    def unstable(self) -> bool:
        return self.rel_iqr >= UNSTABLE_REL_IQR


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


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        return samples[0], samples[0], samples[0]
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, median, q3


def median_ci(samples: Sequence[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval of the median (order statistics); (-inf, inf) under 6
    samples."""
    n = len(samples)
    if n < 6:
        return -math.inf, math.inf
    ordered = sorted(samples)
    spread = 1.96 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - spread))
    high = min(n - 1, math.ceil(n / 2 + spread))
    return ordered[low], ordered[high]


def median_ci_halfwidth(samples: Sequence[float]) -> float:
    """Half-width of :func:`median_ci`."""
    low, high = median_ci(samples)
    return (high - low) / 2


def warm_calls() -> int:
    """Untimed calls before each CPU sample's block. One refills the caches the round's other contenders left
    — under the ``cached`` allocator policy (attnbench's default) a sample after one measured what it does
    after two. Where malloc maps and unmaps large blocks (``--cpu-allocator system``) the first call after
    another contender's frees still finds glibc's thresholds moved: bmm at S512 measured 5–9 % slower after
    one warm call than after two (Intel Xeon, three interleaved runs of 100 rounds), so two there."""
    return 1 if keeps_freed_memory() else 2


def cache_flusher(cache_bytes: int, threads: int) -> Callable[[], object]:
    """A call that evicts the CPU's caches of what earlier calls left there: one pass that reads and writes
    ``FLUSH_CACHES`` times the last-level caches the threads may spread over (``cache_bytes``, one cache's size,
    times _hardware.last_level_caches_used: a pass split across threads fills each cache with only its threads'
    part; at least ``MIN_FLUSH_BYTES``) on ``threads`` threads, so every core the timed call runs on has its
    private caches emptied too. An add, not a fill: a fill this large may be written by streaming stores that go
    around the cache (glibc's memset does above a size), evicting nothing. The buffer lives as long as the call
    returned (a workload's rounds), not the process."""
    caches = cache_bytes * last_level_caches_used(threads)
    buffer = torch.empty(max(MIN_FLUSH_BYTES, FLUSH_CACHES * caches) // 4, dtype=torch.int32)

    def flush() -> object:
        with set_torch_threads(threads):
            return buffer.add_(1)

    return flush


@dataclass
class _CpuSeries:
    """One contender's samples in the interleaved loop: its timer, block size, samples and spent time."""

    timer: timeit.Timer
    calls: int
    threads: int = 1
    warm_calls: int = 1
    samples_ms: list[float] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)  # per sample: its share of thread time spent waiting for a core
    ordered: list[float] = field(default_factory=list)  # samples_ms kept sorted, for the stop rule
    cold_ms: list[float] = field(default_factory=list)  # one call each, timed alone after a cache flush
    spent_s: float = 0.0

    def take(self) -> None:
        with set_torch_threads(self.threads):  # as torch's Timer does around each block
            self.timer.timeit(self.warm_calls)
            before, start = waited_ns(), time.perf_counter_ns()
            seconds = max(self.timer.timeit(self.calls), 1e-9)  # one block of `calls` calls
            after, wall = waited_ns(), time.perf_counter_ns() - start
        self.samples_ms.append(seconds / self.calls * 1e3)
        bisect.insort(self.ordered, self.samples_ms[-1])
        self.spent_s += seconds
        if before is not None and after is not None and wall > 0:
            self.waited.append((after - before) / (wall * self.threads))

    def take_cold(self, flush: Callable[[], object], counted: bool) -> None:
        """One call timed alone right after ``flush``; with ``counted`` (paired rounds, where the cold samples may
        be the ones judged) its time and the flush's count in the budget, else not: a run's warm samples decide."""
        with set_torch_threads(self.threads):
            start = time.perf_counter()
            flush()
            self.cold_ms.append(self.timer.timeit(1) * 1e3)
        if counted:
            self.spent_s += time.perf_counter() - start

    def spent_budget(self, budget_s: float) -> bool:
        return paired_budget_spent(self.samples_ms, self.spent_s, budget_s)

    def finished(self, budget_s: float) -> bool:
        return stop_rule_met(self.ordered, self.spent_s, budget_s)


def paired_budget_spent(samples_ms: list[float], spent_s: float, budget_s: float) -> bool:
    """The paired stop rule: the budget spent with MIN_SAMPLES samples (or twice it with MIN_TRUSTED)."""
    n = len(samples_ms)
    return (
        n >= MAX_SAMPLES or (spent_s >= budget_s and n >= MIN_SAMPLES) or (spent_s >= 2 * budget_s and n >= MIN_TRUSTED)
    )


def stop_rule_met(samples_ms: list[float], spent_s: float, budget_s: float) -> bool:
    """The stop rule: the median's 95 % CI within TARGET_CI, or the budget spent (with enough samples to trust,
    or ever at twice the budget). It reads no order: a caller asking after every sample passes its samples kept
    sorted (``bisect.insort``), so that the sorts here are linear passes, not a sort of the whole series each time."""
    n = len(samples_ms)
    if n >= MAX_SAMPLES:
        return True
    if (spent_s >= budget_s and n >= MIN_TRUSTED) or (spent_s >= 2 * budget_s and n >= 3):
        return True
    return n >= MIN_SAMPLES and median_ci_halfwidth(samples_ms) <= TARGET_CI * statistics.median(samples_ms)


class SampleError(Exception):
    """A contender raised while being sampled; ``name`` says which, the cause is chained."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(f"{name}: {cause}")
        self.name, self.cause = name, cause


def time_cpu_rounds(
    fns: dict[str, Callable[[], object]],
    threads: int,
    budget_s: float,
    estimates_s: dict[str, float],
    seed: int = 0,
    on_sample: Callable[[str], None] | None = None,
    paired: bool = False,
    yardsticks: Mapping[str, Callable[[], float]] | None = None,
    cold: Collection[str] = (),
    flush: Callable[[], object] | None = None,
) -> dict[str, Timing | SampleError]:
    """Time the callables of one workload in interleaved rounds (see the module docstring).

    Each contender keeps its own stop rule and budget; ``on_sample(name)`` is called before each of its
    samples (the worker uses it to know who is running). A contender that raises drops out with a
    :class:`SampleError` in its place; the others go on. ``paired``: all sample in every round until one
    has spent ``budget_s`` (:meth:`_CpuSeries.spent_budget`), so their samples pair up round by round.

    ``yardsticks``: name → a call returning a rate, timed once in every round at a shuffled place among
    the contenders (attnbench.measure._yardsticks); each Timing keeps the median rate over the rounds it sampled in
    (its sample i came from round i). A yardstick that raises is dropped, the contenders go on.

    ``cold``: the contenders that also take one cold sample a round, each call after ``flush`` (none without
    one), up to ``COLD_SAMPLES`` of them unless ``paired``; a contender that raises there drops out as on a
    warm sample."""
    calls = {name: max(1, math.ceil(MIN_SAMPLE_S / max(estimate, 1e-9))) for name, estimate in estimates_s.items()}
    if paired:  # one block size for all (the one the fastest needs), so a block's timer overhead is shared alike
        shared = max(calls[name] for name in fns)
        calls = {name: min(shared, PAIRED_BLOCK_GROWTH * calls[name]) for name in fns}
    warm = warm_calls()
    series = {
        name: _CpuSeries(timeit.Timer(stmt="fn()", globals={"fn": fn}), calls[name], threads, warm)
        for name, fn in fns.items()
    }
    failed: dict[str, SampleError] = {}
    active = list(series)
    generator = random.Random(seed)
    rounds = 0
    sticks = dict(yardsticks or {})
    rates: dict[str, list[float]] = {name: [] for name in sticks}
    flushed = set(cold) if flush is not None else set()
    while active:
        rounds += 1
        order = [(name, "warm") for name in active]
        order += [(n, "cold") for n in active if n in flushed and (paired or len(series[n].cold_ms) < COLD_SAMPLES)]
        order += [(name, "yardstick") for name in sticks]
        generator.shuffle(order)
        for name, kind in order:
            if kind == "yardstick":
                _take_yardstick(name, sticks, rates)
                continue
            if name not in active:  # it failed, or met its stop rule, earlier in this round
                continue
            if on_sample is not None:
                on_sample(name)
            try:
                series[name].take() if kind == "warm" else series[name].take_cold(flush, paired)  # type: ignore[arg-type]
            except Exception as exc:  # a contender may fail on any call; the others go on
                failed[name] = SampleError(name, exc)
                active.remove(name)
                continue
            if kind == "warm" and not paired and series[name].finished(budget_s):
                active.remove(name)
        if paired and any(series[name].spent_budget(budget_s) for name in active):
            active = []
    results: dict[str, Timing | SampleError] = dict(failed)
    for name, one in series.items():
        if name not in failed:
            q1, median, q3 = quartiles(one.samples_ms)
            seen = {
                stick: values[: len(one.samples_ms)] for stick, values in rates.items() if stick in sticks and values
            }
            waited = statistics.median(one.waited) if one.waited else None
            results[name] = Timing(
                median,
                q3 - q1,
                len(one.samples_ms),
                one.calls,
                one.samples_ms,
                "timeit",
                cold_samples_ms=one.cold_ms,
                rounds=rounds,
                yardstick_rounds=seen,
                waited=waited,
            )
    return results


def _take_yardstick(name: str, sticks: dict[str, Callable[[], float]], rates: dict[str, list[float]]) -> None:
    """One rate of yardstick ``name`` into ``rates``; a yardstick that raises or returns no positive rate
    is dropped (the round's other samples go on)."""
    try:
        rate = float(sticks[name]())
    except Exception:  # a broken yardstick must not cost the contenders their row
        rate = math.nan
    if math.isfinite(rate) and rate > 0:
        rates[name].append(rate)
    else:
        del sticks[name]


def time_cpu(fn: Callable[[], object], threads: int, budget_s: float, estimate_s: float) -> Timing:
    """Samples of ``fn`` on CPU until the median is pinned down or ``budget_s`` is spent."""
    result = time_cpu_rounds({"fn": fn}, threads, budget_s, {"fn": estimate_s})["fn"]
    if isinstance(result, SampleError):
        raise result.cause
    return result


def warm_up(fn: Callable[[], object], device: str, first_call_ms: float, budget_s: float) -> float:
    """Calls after the first until caches, allocator pools and autotuners settle; returns the last
    call's time in seconds, an estimate for block sizing."""
    calls = 1 if first_call_ms > 1e3 * budget_s / 4 else 3
    elapsed_ms = first_call_ms
    for _ in range(calls):
        elapsed_ms, _ = call_once_ms(fn, device)
    return elapsed_ms / 1e3
