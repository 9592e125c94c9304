"""GPU timing: CUDA events in interleaved rounds, warm and cold samples alike, and what the GPU ran at.

Rounds — as on CPU (attnbench.measure.stopwatch), the contenders of one workload are timed together: each round takes
one *warm* and one *cold* sample of every contender still sampling, in an order shuffled per round, until
each one's stop rule (``measure.stop_rule_met``: the median's 95 % CI within 0.5 %, or its budget) is met.
An H100's clock moves with its temperature and power draw, and whatever runs first runs on a cooler GPU;
in rounds that drift lands on every contender, and on warm and cold, alike. ``paired=True`` (attnbench ab)
keeps every contender sampling in every round until one has spent the budget, so sample i of each comes
from round i.

A sample — a group of calls, each between a pair of CUDA events, after a device-side sleep
(``torch.cuda._sleep``) lasting ``SLEEP_COVER`` times the host's time to issue the group (measured on the
group before): the GPU starts the group only once the host has queued all of it, so the events see kernels,
not a GPU waiting for the host (argument binding or an autotuner's dispatch take tens of µs, as long as a
small attention kernel). The sample is the mean per-call time of its group.

* warm: back-to-back calls, L2 holding what the last call left; a group lasts about ``GROUP_MS`` and starts
  with one untimed call, so no timed call finds L2 as a flush or another contender left it;
* cold: L2 flushed (a buffer of at least 256 MiB, four times the L2, zeroed) before each call, outside
  its event pair; ``cold_median_ms`` is the median of these samples;
* calls shorter than ``GRAPH_BELOW_MS``: the warm sample replays ``GRAPH_REPLAYS`` captured calls from a
  CUDA graph, so launch gaps don't swamp them (``timing_method`` ``cuda_graph``; else ``cuda_events+sleep``);
  never for a backward pass (autograd's streams don't capture), and in paired rounds for all or none.

The host's own cost, ``host_overhead_us``, is the host's time inside each call while the GPU is kept busy
(the median over the cold groups' calls, each timed on the host around the call alone): what it takes to
issue one call. Never a difference of two GPU-bound walls, so never negative; on a launch-bound case it
exceeds the kernel time. ``gpu_state``: NVML's clocks, power and throttle reasons, read once per sample
while the GPU runs it (attnbench.measure._gpu_state).
"""

from __future__ import annotations

import bisect
import functools
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnbench.measure import _gpu_state as gpu_state
from attnbench.measure.stopwatch import (
    SampleError,
    Timing,
    paired_budget_spent,
    quartiles,
    stop_rule_met,
)

GRAPH_BELOW_MS = 0.05  # calls shorter than this are replayed from a CUDA graph
GRAPH_REPLAYS = 100  # captured calls per graph
GROUP_MS = 1.0  # a warm group lasts at least this long (of GPU time)
MAX_GROUP = 50  # most calls in one group
COLD_GROUP = 10  # most calls in one cold group (each after its own flush)
SLEEP_COVER = 1.5  # the device-side sleep lasts this many times the host's time to issue its group
MAX_SLEEP_MS = 50.0  # a group is cut short so that its sleep stays under this
PROBE_SLEEP_MS = 1.0  # per call before the first group, whose host time is not known yet
PROBE_CALLS = 3  # calls in the first, untimed group: the fastest gives the GPU's time per call
FLUSH_BYTES = 256 * 2**20  # at least this much is zeroed to flush L2 (triton's do_bench flushes 256 MiB)


def _max_clock_khz() -> float | None:
    """The GPU's maximum SM clock in kHz (cycles per ms), from Triton's driver; None where it can't say."""
    try:
        import triton

        props = triton.runtime.driver.active.utils.get_device_properties(torch.cuda.current_device())
        return float(props["sm_clock_rate"]) or None
    except Exception:  # no Triton or no driver: the sleep is timed instead
        return None


@functools.cache
def _sleep_cycles_per_ms() -> float:
    """GPU clock cycles that ``torch.cuda._sleep`` spins per millisecond: the maximum SM clock where it is known,
    so that a sleep is never shorter than asked (at a lower clock it lasts longer, the safe side); else timed
    with events after a 20 M-cycle spin that brings an idle GPU's clock up."""
    known = _max_clock_khz()
    if known is not None:
        return known
    cycles = 1_000_000
    torch.cuda._sleep(20 * cycles)  # warm up: an idle GPU runs at a fraction of its maximum clock
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def l2_flusher() -> Callable[[], object] | None:
    """A call that evicts L2: zeroing max(FLUSH_BYTES, 4 × L2) bytes; None if that much can't be had."""
    try:
        l2 = int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0))
        buffer = torch.empty(max(FLUSH_BYTES, 4 * l2) // 4, dtype=torch.int32, device="cuda")
    except Exception:  # out of memory: no cold figure for this group
        return None
    return buffer.zero_


@dataclass
class Group:
    """One group's per-call GPU times (ms), the host's time per call to issue it (ms, events and flushes
    included: what the next sleep must cover), and the host's time inside each call alone (ms)."""

    times_ms: list[float]
    issue_ms: float
    inside_ms: list[float]


def run_group(
    fn: Callable[[], object],
    calls: int,
    sleep_ms: float,
    flush: Callable[[], object] | None = None,
    watch: gpu_state.Watch | None = None,
    readings: list[gpu_state.Reading] | None = None,
    lead: bool = False,
) -> Group:
    """Sleep ``sleep_ms`` on the device, then queue ``calls`` calls, each (after ``flush``, if given) between
    two events — with ``lead``, after one untimed call, so the first timed call finds L2 as the others do, not
    as the last sample (a flush, another contender) left it; read the GPU's state once it has reached the calls;
    wait for the last event."""
    torch.cuda._sleep(int(_sleep_cycles_per_ms() * sleep_ms))
    pairs = []
    inside = []
    start_issue = time.perf_counter()
    if lead:
        fn()
    for _ in range(calls):
        if flush is not None:
            flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        before = time.perf_counter()
        fn()
        inside.append((time.perf_counter() - before) * 1e3)
        end.record()
        pairs.append((start, end))
    issue_ms = max((time.perf_counter() - start_issue) * 1e3 / (calls + lead), 1e-3)
    if watch is not None and readings is not None:
        while not pairs[0][0].query():  # past the sleep: read the clocks the calls run at, not the spin's
            pass
        reading = watch.read()
        if reading is not None:
            readings.append(reading)
    pairs[-1][1].synchronize()
    return Group([s.elapsed_time(e) for s, e in pairs], issue_ms, inside)


def capture_graph(fn: Callable[[], object], replays: int = GRAPH_REPLAYS) -> Callable[[], object] | None:
    """``replays`` calls of ``fn`` captured in a CUDA graph, as its replay; None if ``fn`` can't be captured.
    A capture that fails leaves torch on its capture stream (``torch.cuda.graph`` ends the capture before it
    restores the stream, and the end raises): the stream is put back, so what follows runs where it did."""
    previous = torch.cuda.current_stream()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm the capture stream's allocator pool
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(replays):
                fn()
    except Exception:  # not every kernel or library can be captured; the caller falls back to events
        torch.cuda.set_stream(previous)
        torch.cuda.synchronize()
        return None
    return graph.replay


@dataclass
class _Series:
    """One contender in the rounds: what a warm sample calls (``fn`` or a graph's replay of ``per_call``
    calls), its group sizes, the host times the next sleeps must cover, and what it took."""

    fn: Callable[[], object]
    warm_fn: Callable[[], object]
    per_call: int  # calls of fn in one call of warm_fn
    warm_calls: int
    cold_calls: int
    issue_ms: dict[bool, float]  # cold? → the host's time per call of the last group
    warm: list[float] = field(default_factory=list)
    ordered: list[float] = field(default_factory=list)  # warm, kept sorted for the stop rule
    cold: list[float] = field(default_factory=list)
    inside_ms: list[float] = field(default_factory=list)
    readings: list[gpu_state.Reading] = field(default_factory=list)
    spent_s: float = 0.0

    @property
    def method(self) -> str:
        return "cuda_graph" if self.per_call > 1 else "cuda_events+sleep"

    def take(self, cold: bool, flush: Callable[[], object] | None, watch: gpu_state.Watch | None) -> None:
        calls = self.cold_calls if cold else self.warm_calls
        sleep_ms = min(MAX_SLEEP_MS, SLEEP_COVER * (calls + (not cold)) * self.issue_ms[cold])
        started = time.perf_counter()
        group = run_group(
            self.fn if cold else self.warm_fn,
            calls,
            sleep_ms,
            flush if cold else None,
            watch,
            self.readings,
            lead=not cold,
        )
        self.spent_s += time.perf_counter() - started
        self.issue_ms[cold] = group.issue_ms
        mean_ms = statistics.fmean(group.times_ms) / (1 if cold else self.per_call)
        (self.cold if cold else self.warm).append(mean_ms)
        if not cold:
            bisect.insort(self.ordered, mean_ms)
        if cold or self.per_call == 1:  # calls of fn itself, not of a graph's replay
            self.inside_ms += group.inside_ms

    def finished(self, budget_s: float) -> bool:
        return stop_rule_met(self.ordered, self.spent_s, budget_s)

    def timing(self, rounds: int, max_sm_mhz: float | None) -> Timing:
        q1, median, q3 = quartiles(self.warm)
        return Timing(
            median,
            q3 - q1,
            len(self.warm),
            self.warm_calls * self.per_call,
            self.warm,
            self.method,
            rounds=rounds,
            host_overhead_us=statistics.median(self.inside_ms) * 1e3 if self.inside_ms else None,
            gpu_state=gpu_state.summary(self.readings, max_sm_mhz),
            cold_samples_ms=list(self.cold),
        )


def _group_calls(kernel_ms: float, issue_ms: float, most: int) -> int:
    """Calls in a group: enough for GROUP_MS of GPU time, at most ``most``, and a sleep under MAX_SLEEP_MS."""
    wanted = math.ceil(GROUP_MS / max(kernel_ms, 1e-3) - 1e-6)  # (not one more for a rounding error)
    return max(1, min(most, wanted, int(MAX_SLEEP_MS / (SLEEP_COVER * issue_ms)) - 1))


def _probe(fn: Callable[[], object]) -> tuple[float, float]:
    """(GPU ms per call, host ms to issue one) from a first group of PROBE_CALLS calls, not kept."""
    group = run_group(fn, PROBE_CALLS, PROBE_SLEEP_MS * PROBE_CALLS)
    return max(min(group.times_ms), 1e-3), group.issue_ms


def _series(
    fn: Callable[[], object], probe: tuple[float, float], replay: Callable[[], object] | None, cold: bool
) -> _Series:
    """A contender's series from its probe; ``replay``: a CUDA graph of GRAPH_REPLAYS calls for its warm samples."""
    kernel_ms, issue_ms = probe
    warm = (fn, 1, _group_calls(kernel_ms, issue_ms, MAX_GROUP), issue_ms)
    if replay is not None:
        graph_group = run_group(replay, 1, PROBE_SLEEP_MS)
        warm = (
            replay,
            GRAPH_REPLAYS,
            _group_calls(graph_group.times_ms[0], graph_group.issue_ms, MAX_GROUP),
            graph_group.issue_ms,
        )
    warm_fn, per_call, warm_calls, warm_issue = warm
    cold_calls = _group_calls(kernel_ms, issue_ms, COLD_GROUP) if cold else 0
    return _Series(fn, warm_fn, per_call, warm_calls, cold_calls, {False: warm_issue, True: issue_ms})


def _replays(
    fns: dict[str, Callable[[], object]], probes: dict[str, tuple[float, float]], paired: bool
) -> dict[str, Callable[[], object] | None]:
    """A CUDA graph for each contender whose calls take under GRAPH_BELOW_MS of GPU time. Paired (ab): all or
    none, so that A and B are timed the same way (a graph has no launch gaps: mixed methods would be a ratio of
    methods, not of kernels)."""
    wanted = {name: probe[0] < GRAPH_BELOW_MS for name, probe in probes.items()}
    if paired and any(wanted.values()):
        wanted = dict.fromkeys(wanted, True)
    replays = {name: capture_graph(fns[name]) if want else None for name, want in wanted.items()}
    if paired and any(replay is None for replay in replays.values()):
        replays = dict.fromkeys(replays)
    return replays


def time_cuda_rounds(
    fns: dict[str, Callable[[], object]],
    budget_s: float,
    seed: int = 0,
    on_sample: Callable[[str], None] | None = None,
    paired: bool = False,
    cold: bool = True,
    graphs: bool = True,
) -> dict[str, Timing | SampleError]:
    """Time the callables of one workload on the GPU in interleaved rounds (see the module docstring).

    Each contender keeps its own stop rule and budget (its warm samples decide); ``on_sample(name)`` is called
    before each of its samples. A contender that raises drops out with a :class:`SampleError` in its place.
    ``paired``: all sample in every round until one has spent ``budget_s``; ``cold=False``: warm samples only;
    ``graphs=False``: no CUDA graphs (a backward pass: autograd's streams don't capture)."""
    results: dict[str, Timing | SampleError] = {}
    probes: dict[str, tuple[float, float]] = {}
    for name, fn in fns.items():
        try:
            probes[name] = _probe(fn)
        except Exception as exc:  # a contender may fail on any call; the others go on
            results[name] = SampleError(name, exc)
    replays = _replays(fns, probes, paired) if graphs else dict.fromkeys(probes)
    series: dict[str, _Series] = {}
    for name, probe in probes.items():
        try:
            series[name] = _series(fns[name], probe, replays[name], cold)
        except Exception as exc:
            results[name] = SampleError(name, exc)
    flush = l2_flusher() if cold and series else None
    watch = gpu_state.open_watch() if series else None
    active = list(series)
    generator = random.Random(seed)
    rounds = 0
    while active:
        rounds += 1
        order = [(name, False) for name in active] + [(name, True) for name in active if flush is not None]
        generator.shuffle(order)
        for name, is_cold in order:
            if name not in active:
                continue
            if on_sample is not None:
                on_sample(name)
            try:
                series[name].take(is_cold, flush, watch)
            except Exception as exc:
                results[name] = SampleError(name, exc)
                active.remove(name)
        if paired:
            if any(paired_budget_spent(series[name].warm, series[name].spent_s, budget_s) for name in active):
                active = []
        else:
            active = [name for name in active if not series[name].finished(budget_s)]
    torch.cuda.synchronize()
    max_sm = watch.max_sm_mhz if watch is not None else None
    for name, one in series.items():
        if name not in results:
            results[name] = one.timing(rounds, max_sm)
    return results


def time_cuda(fn: Callable[[], object], budget_s: float, graphs: bool = True) -> Timing:
    """One callable's GPU timing (warm, cold, host overhead, GPU state) within about ``budget_s`` seconds."""
    result = time_cuda_rounds({"fn": fn}, budget_s, graphs=graphs)["fn"]
    if isinstance(result, SampleError):
        raise result.cause
    return result


def median_ms(fn: Callable[[], object], budget_s: float) -> float:
    """The warm median of ``fn``'s GPU time (ceilings' reference kernels)."""
    result = time_cuda_rounds({"fn": fn}, budget_s, cold=False)["fn"]
    if isinstance(result, SampleError):
        raise result.cause
    return result.median_ms
