"""CUDA timing without the host's launch work, on CPU: torch.cuda's events, syncs and _sleep faked by a
model of one GPU stream, where each operation starts when both the stream is free and the host has issued it."""

import statistics
import types

import pytest
import torch

from attnbench import measure

KERNEL_MS = 0.02  # GPU time of one call
HOST_MS = 0.05  # the host's work to issue one call: longer than the kernel, as for a small attention kernel
CYCLES_PER_MS = 1.5e6


class Stream:
    """host: the host's clock (ms); free: when the GPU finishes what it was given; log: what was issued."""

    def __init__(self) -> None:
        self.host = 0.0
        self.free = 0.0
        self.log: list[str] = []

    def run(self, name: str, duration_ms: float) -> float:
        start = max(self.free, self.host)
        self.free = start + duration_ms
        self.log.append(name)
        return start


@pytest.fixture
def gpu(monkeypatch):
    stream = Stream()

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.time: float | None = None

        def record(self) -> None:
            self.time = stream.run("record", 0.0)

        def synchronize(self) -> None:
            stream.host = max(stream.host, self.time)

        def elapsed_time(self, end: "Event") -> float:
            return end.time - self.time

    def synchronize() -> None:
        stream.host = max(stream.host, stream.free)
        stream.log.append("synchronize")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: stream.run("sleep", cycles / CYCLES_PER_MS))
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: stream.host / 1e3))
    monkeypatch.setattr(measure, "_cold_median_ms", lambda fn, budget_s: None)  # triton's do_bench needs a GPU
    measure._sleep_cycles_per_ms.cache_clear()
    yield stream
    measure._sleep_cycles_per_ms.cache_clear()


def small_kernel(stream: Stream):
    def call() -> None:
        stream.host += HOST_MS  # argument binding, dispatch …
        stream.run("kernel", KERNEL_MS)

    return call


def test_events_time_the_kernel_not_the_host(gpu):
    timing = measure.time_cuda(small_kernel(gpu), budget_s=0.02, estimate_s=1e-3)
    assert timing.method == "cuda_events+sleep"
    assert timing.n_samples >= measure.MIN_SAMPLES
    assert timing.samples_ms == pytest.approx([KERNEL_MS] * timing.n_samples)  # not HOST_MS + KERNEL_MS
    # wall time of a synchronised call (host work, then the kernel) minus the kernel time
    assert timing.host_overhead_us == pytest.approx(HOST_MS * 1e3)


def test_a_sleep_is_enqueued_before_each_group_of_start_events(gpu):
    measure.time_cuda(small_kernel(gpu), budget_s=0.02, estimate_s=1e-3)
    log = [entry for entry in gpu.log if entry != "synchronize"]
    calibration, timed = log[:3], log[3:]
    assert calibration == ["sleep", "record", "sleep"]  # _sleep_cycles_per_ms: warm-up, then an event pair
    assert timed[:5] == ["record", "sleep", "record", "kernel", "record"]  # its end event, then the probe group
    groups = "".join("s" if e == "sleep" else "r" if e == "record" else "k" for e in timed[1:]).split("s")[1:]
    assert len(groups) >= 2 and all(g and set(g) <= {"r", "k"} and g.startswith("rk") for g in groups)


def test_without_the_sleep_host_work_would_land_in_the_samples(gpu, monkeypatch):
    """The defect the sleep removes, shown on the same model: no sleep, so the GPU waits for the host."""
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    samples = measure.events_loop(small_kernel(gpu), 0.01)
    assert statistics.median(samples) == pytest.approx(HOST_MS)  # the host's time per call, 2.5× the kernel's


def test_graph_replays_keep_their_method_and_get_the_host_overhead(gpu, monkeypatch):
    monkeypatch.setattr(measure, "_graph_samples", lambda fn, budget_s: [KERNEL_MS] * 20)
    timing = measure.time_cuda(small_kernel(gpu), budget_s=0.02, estimate_s=1e-6)
    assert timing.method == "cuda_graph" and timing.calls_per_sample == 100
    assert timing.host_overhead_us == pytest.approx(HOST_MS * 1e3)


def test_cpu_timings_have_no_host_overhead():
    timing = measure.time_callable(lambda: None, "cpu", 1, budget_s=0.01, estimate_s=1e-6)
    assert timing.host_overhead_us is None
