"""CUDA timing on CPU: torch.cuda's events, syncs and _sleep faked by a model of one GPU stream, where each
operation starts when both the stream is free and the host has issued it, and whose clock can drift."""

from __future__ import annotations

import statistics
import types
from dataclasses import dataclass, field

import pandas as pd
import pytest
import torch

from attnbench.measure import _gpu_state as gpu_state
from attnbench.measure import stopwatch_cuda as measure_cuda
from attnbench.measure.stopwatch import SampleError
from attnbench.runner._noise import result_warnings

KERNEL_MS = 0.2  # GPU time of one warm call
COLD_EXTRA_MS = 0.05  # what the same call costs more right after L2 was flushed
HOST_MS = 0.05  # the host's work to issue one call
FLUSH_MS = 0.08
CYCLES_PER_MS = 1.5e6


@dataclass
class Stream:
    """host: the host's clock (ms); free: when the GPU finishes what it was given; slowdown: the GPU's time per
    ms of work grows by this share per second of GPU time (a GPU heating up); log: what was issued."""

    host: float = 0.0
    free: float = 0.0
    slowdown: float = 0.0
    flushed: bool = False
    l2: str = ""  # whose data L2 holds: a call finding another's (or a flush's) pays COLD_EXTRA_MS
    log: list[str] = field(default_factory=list)

    def run(self, name: str, duration_ms: float) -> float:
        start = max(self.free, self.host)
        self.free = start + duration_ms * (1 + self.slowdown * start / 1e3)
        self.log.append(name)
        return start


@pytest.fixture
def gpu(monkeypatch):
    stream = Stream()

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.time = 0.0

        def record(self) -> None:
            self.time = stream.run("record", 0.0)

        def synchronize(self) -> None:
            stream.host = max(stream.host, self.time)

        def elapsed_time(self, end: Event) -> float:
            return end.time - self.time

        def query(self) -> bool:  # the host waits until the GPU is past the event
            stream.host = max(stream.host, self.time)
            return True

    def synchronize() -> None:
        stream.host = max(stream.host, stream.free)

    def flush() -> None:
        stream.host += 0.005
        stream.run("flush", FLUSH_MS)
        stream.flushed = True

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: stream.run("sleep", cycles / CYCLES_PER_MS))
    monkeypatch.setattr(measure_cuda, "time", types.SimpleNamespace(perf_counter=lambda: stream.host / 1e3))
    monkeypatch.setattr(measure_cuda, "l2_flusher", lambda: flush)
    monkeypatch.setattr(measure_cuda, "capture_graph", lambda fn: None)
    monkeypatch.setattr(gpu_state, "open_watch", lambda: None)
    monkeypatch.setattr(measure_cuda, "_max_clock_khz", lambda: None)
    measure_cuda._sleep_cycles_per_ms.cache_clear()
    yield stream
    measure_cuda._sleep_cycles_per_ms.cache_clear()


def kernel(stream: Stream, gpu_ms: float = KERNEL_MS, host_ms: float = HOST_MS, name: str = "kernel"):
    def call() -> None:
        stream.host += host_ms  # argument binding, dispatch …
        stream.run(name, gpu_ms + (COLD_EXTRA_MS if stream.flushed or stream.l2 not in ("", name) else 0.0))
        stream.flushed, stream.l2 = False, name

    return call


def test_events_time_the_kernel_and_the_host_its_own_time(gpu):
    timing = measure_cuda.time_cuda(kernel(gpu), budget_s=0.05)
    assert timing.method == "cuda_events+sleep" and timing.n_samples >= 10
    assert timing.samples_ms == pytest.approx([KERNEL_MS] * timing.n_samples)  # not HOST_MS + KERNEL_MS
    assert timing.cold_median_ms == pytest.approx(KERNEL_MS + COLD_EXTRA_MS)  # the flush itself stays outside
    assert timing.host_overhead_us == pytest.approx(HOST_MS * 1e3)  # timed on the host around the call alone
    assert timing.calls_per_sample == 5  # GROUP_MS of GPU time per warm sample


def test_a_launch_bound_call_shows_a_host_overhead_above_its_kernel_time(gpu):
    timing = measure_cuda.time_cuda(kernel(gpu, gpu_ms=0.004, host_ms=0.03), budget_s=0.05)
    assert timing.median_ms == pytest.approx(0.004)
    assert timing.host_overhead_us == pytest.approx(30.0) and timing.host_overhead_us > 1e3 * timing.median_ms


def test_without_the_sleep_host_work_would_land_in_the_samples(gpu, monkeypatch):
    """The defect the sleep removes, shown on the same model: no sleep, so the GPU waits for the host."""
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    timing = measure_cuda.time_cuda(kernel(gpu, gpu_ms=0.02), budget_s=0.05)
    assert timing.median_ms == pytest.approx(HOST_MS, rel=0.05)  # the host's time per call, 2.5× the kernel's


def test_each_round_takes_a_warm_and_a_cold_sample_of_every_contender_in_a_shuffled_order(gpu):
    fns = {name: kernel(gpu, name=name) for name in ("a", "b", "c")}
    seen: list[str] = []
    timings = measure_cuda.time_cuda_rounds(fns, budget_s=0.05, on_sample=seen.append)
    rounds = timings["a"].rounds
    assert all(timings[n].rounds == rounds and timings[n].n_samples == rounds for n in fns)  # type: ignore[union-attr]
    per_round = [seen[i : i + 6] for i in range(0, len(seen), 6)]
    assert all(sorted(chunk) == ["a", "a", "b", "b", "c", "c"] for chunk in per_round)
    assert len({tuple(chunk) for chunk in per_round}) > 1  # shuffled, not one fixed order


def test_a_gpu_heating_up_slows_every_contender_alike_and_cold_stays_above_warm(gpu):
    """Clock drift: the GPU's time per call grows 300 % per second. Timed one after another, the second of two
    identical contenders reads slower; in rounds, it doesn't, and cold (taken in the same rounds) stays above
    warm."""
    gpu.slowdown = 3.0
    alone = [measure_cuda.time_cuda(kernel(gpu), budget_s=0.05).median_ms for _ in range(2)]
    assert alone[1] / alone[0] > 1.05  # the defect of timing one after another
    timings = measure_cuda.time_cuda_rounds({"a": kernel(gpu), "b": kernel(gpu)}, budget_s=0.05)
    a, b = timings["a"], timings["b"]
    assert not isinstance(a, SampleError) and not isinstance(b, SampleError)
    assert b.median_ms / a.median_ms == pytest.approx(1.0, abs=0.01)
    assert a.cold_median_ms is not None and a.cold_median_ms >= a.median_ms
    ratios = [y / x for x, y in zip(a.samples_ms, b.samples_ms, strict=False)]
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.01)


def test_paired_rounds_give_every_contender_one_warm_sample_per_round_and_no_cold(gpu):
    timings = measure_cuda.time_cuda_rounds(
        {"a": kernel(gpu), "b": kernel(gpu, gpu_ms=0.4)}, budget_s=0.05, paired=True, cold=False
    )
    a, b = timings["a"], timings["b"]
    assert not isinstance(a, SampleError) and not isinstance(b, SampleError)
    assert a.n_samples == b.n_samples == a.rounds >= 10
    assert a.cold_median_ms is None and "flush" not in gpu.log
    assert b.median_ms / a.median_ms == pytest.approx(2.0)


def test_ab_cold_judges_the_flushed_samples_one_pair_a_round(gpu):
    """``attnbench ab --cold``: paired rounds take a warm and a cold sample of each version every round; the verdict
    reads the cold ones (``judged_samples``), A's i-th and B's i-th from round i."""
    from attnbench.runner.ab import judged_samples

    timings = measure_cuda.time_cuda_rounds(
        {"a": kernel(gpu), "b": kernel(gpu, gpu_ms=0.4)}, budget_s=0.05, paired=True, cold=True
    )
    a, b = timings["a"], timings["b"]
    assert not isinstance(a, SampleError) and not isinstance(b, SampleError)
    assert len(a.cold_samples_ms) == len(b.cold_samples_ms) == a.rounds == a.n_samples >= 10
    assert judged_samples(a, cold=True) == a.cold_samples_ms == pytest.approx([KERNEL_MS + COLD_EXTRA_MS] * a.rounds)
    assert judged_samples(b, cold=False) == b.samples_ms == pytest.approx([0.4] * b.rounds)
    warm_only = measure_cuda.time_cuda_rounds({"a": kernel(gpu)}, budget_s=0.02, paired=True, cold=False)["a"]
    assert not isinstance(warm_only, SampleError)
    with pytest.raises(ValueError, match="cold samples asked for, none taken"):
        judged_samples(warm_only, cold=True)


def test_a_contender_that_raises_drops_out_the_others_go_on(gpu):
    calls = {"n": 0}

    def flaky() -> None:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("illegal memory access")
        kernel(gpu)()

    timings = measure_cuda.time_cuda_rounds({"flaky": flaky, "fine": kernel(gpu)}, budget_s=0.05)
    assert isinstance(timings["flaky"], SampleError) and "illegal memory access" in str(timings["flaky"])
    assert not isinstance(timings["fine"], SampleError) and timings["fine"].n_samples >= 10


def test_tiny_calls_are_replayed_from_a_graph_and_keep_the_host_figure_of_direct_calls(gpu, monkeypatch):
    direct = kernel(gpu, gpu_ms=0.01, host_ms=0.02)

    def capture(fn):
        def replay() -> None:
            gpu.host += 0.005
            for _ in range(measure_cuda.GRAPH_REPLAYS):
                gpu.run("kernel", 0.01)

        return replay

    monkeypatch.setattr(measure_cuda, "capture_graph", capture)
    timing = measure_cuda.time_cuda(direct, budget_s=0.05)
    assert timing.method == "cuda_graph" and timing.calls_per_sample % measure_cuda.GRAPH_REPLAYS == 0
    assert timing.median_ms == pytest.approx(0.01)
    assert timing.host_overhead_us == pytest.approx(20.0)  # from the cold groups' direct calls


class FakeNvml:
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, sm: list[float], reasons: int) -> None:
        self.sm, self.reasons, self.reads = list(sm), reasons, 0

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetClockInfo(self, handle, kind):
        if kind == self.NVML_CLOCK_MEM:
            return 2619
        self.reads += 1
        return self.sm[min(self.reads - 1, len(self.sm) - 1)]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetPowerUsage(self, handle):
        return 690_000

    def nvmlDeviceGetTemperature(self, handle, kind):
        return 71


def test_each_sample_reads_the_gpu_state_and_the_row_says_it_ran_throttled(gpu, monkeypatch):
    nvml = FakeNvml([1755.0, 1740.0, 1770.0], reasons=0x1 | 0x4)  # idle bit (not reported) and the power cap
    monkeypatch.setattr(gpu_state, "open_watch", lambda: gpu_state.Watch(nvml, handle=None))
    timing = measure_cuda.time_cuda(kernel(gpu), budget_s=0.05)
    state = timing.gpu_state
    assert nvml.reads >= 2 * timing.n_samples  # warm and cold samples each read once
    assert state["sm_clock_mhz"] == 1770.0 and state["sm_clock_min_mhz"] == 1740.0
    assert state["max_sm_clock_mhz"] == 1980 and state["mem_clock_mhz"] == 2619
    assert state["power_w"] == 690.0 and state["gpu_temp_c"] == 71 and state["throttle"] == "sw_power_cap"
    why = gpu_state.slowed(state)
    assert why == "throttled (sw_power_cap); SM clock 1770 of 1980 MHz"
    row = {
        "impl": "sdpa_flash",
        "device": "cuda",
        "dtype": "bfloat16",
        "batch": 8,
        "heads": 16,
        "seq_q": 4096,
        "head_dim": 128,
        "mask": "causal",
        "pass": "fwd",
        "status": "ok",
        "n_samples": 40,
        "unstable": False,
        "median_ms": 1.0,
        "iqr_ms": 0.01,
        "cold_median_ms": 1.001,
        **state,
    }
    warnings = result_warnings(pd.DataFrame([row]))
    assert any(w.startswith("1 GPU case(s) ran throttled") and "sdpa_flash at cuda bfloat16" in w for w in warnings)


def test_a_full_clock_without_slowing_reasons_raises_no_warning():
    state = gpu_state.summary([gpu_state.Reading(1980.0, 2619.0, 400.0, 60.0, 0x1)], 1980.0)
    assert state["throttle"] == "" and gpu_state.slowed(state) is None
    assert gpu_state.summary([], 1980.0) == {}


def test_cold_below_warm_beyond_the_iqr_is_named_as_a_timing_defect():
    row = {
        "impl": "bmm",
        "status": "ok",
        "n_samples": 40,
        "unstable": False,
        "median_ms": 1.0,
        "iqr_ms": 0.01,
        "cold_median_ms": 0.95,
    }
    assert any("faster with the caches flushed than warm" in w for w in result_warnings(pd.DataFrame([row])))


def test_nvml_index_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert gpu_state._nvml_index(1) == 5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    assert gpu_state._nvml_index(0) == 0


def test_a_warm_group_starts_with_an_untimed_call_so_no_timed_call_finds_another_contenders_l2(gpu):
    timings = measure_cuda.time_cuda_rounds(
        {"a": kernel(gpu, name="a"), "b": kernel(gpu, gpu_ms=0.3, name="b")}, budget_s=0.05
    )
    a, b = timings["a"], timings["b"]
    assert not isinstance(a, SampleError) and not isinstance(b, SampleError)
    assert a.samples_ms == pytest.approx([KERNEL_MS] * a.n_samples) and b.median_ms == pytest.approx(0.3)
    assert a.cold_median_ms == pytest.approx(KERNEL_MS + COLD_EXTRA_MS)


def test_no_graphs_for_a_backward_pass_and_in_ab_both_or_neither(gpu, monkeypatch):
    captured = []

    def capture(fn):
        captured.append(fn)
        return None if fn is refuses else fn

    monkeypatch.setattr(measure_cuda, "capture_graph", capture)
    tiny, refuses = kernel(gpu, gpu_ms=0.01, name="tiny"), kernel(gpu, gpu_ms=0.01, name="refuses")
    assert measure_cuda.time_cuda(tiny, budget_s=0.02, graphs=False).method == "cuda_events+sleep" and not captured
    assert measure_cuda.time_cuda(tiny, budget_s=0.02).method == "cuda_graph"
    paired = measure_cuda.time_cuda_rounds({"a": tiny, "b": refuses}, budget_s=0.02, paired=True, cold=False)
    assert {t.method for t in paired.values() if not isinstance(t, SampleError)} == {"cuda_events+sleep"}
    alone = measure_cuda.time_cuda_rounds({"a": tiny, "b": refuses}, budget_s=0.02)
    assert [t.method for t in alone.values() if not isinstance(t, SampleError)] == ["cuda_graph", "cuda_events+sleep"]


def test_a_failed_capture_puts_torch_back_on_the_stream_it_was_on(monkeypatch):
    """torch.cuda.graph ends the capture before restoring the stream; when the end raises, the stream stays."""
    import contextlib

    streams = ["default"]

    class FakeStream:
        def wait_stream(self, other) -> None:
            pass

    @contextlib.contextmanager
    def failing_graph(graph):
        streams.append("capture")
        yield
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: streams[-1])
    monkeypatch.setattr(torch.cuda, "set_stream", streams.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", failing_graph)
    assert measure_cuda.capture_graph(lambda: None) is None
    assert streams[-1] == "default"
