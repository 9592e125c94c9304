"""Peak working memory of one call, measured in a pass of its own (never while timing), and free memory.

The figure is what a call allocates at its peak beyond its inputs and its output: the output is the
same for every contender, so leaving it out shows what tells them apart — an S×S score matrix (bmm's
memory grows 4× when S doubles) against a flash kernel's few row statistics.

CUDA: reset the allocator's peak statistic, call, and take max_memory_allocated minus what was allocated
before, less the output's storage.

CPU: PyTorch's CPU allocations bypass Python's allocator, so tracemalloc never sees them. The profiler
with ``profile_memory=True`` records every allocation and free the CPU allocator makes, in order; the
running sum of those byte counts peaks at the same figure as on CUDA.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

MB = 2**20


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence what C++ code writes straight to file descriptor 2 (the profiler's start/stop lines)."""
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (embedded interpreter): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _storage_bytes(output: object) -> int:
    if isinstance(output, torch.Tensor):
        return output.untyped_storage().nbytes()
    return 0


def _cpu_peak_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    from torch.profiler import ProfilerActivity, profile

    with quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        output = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        if getattr(event.device_type(), "name", "") == "CPU":
            current += event.nbytes()
            peak = max(peak, current)
    return peak, _storage_bytes(output)


def _cuda_peak_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    output = fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - baseline, _storage_bytes(output)


def peak_memory_mb(fn: Callable[[], object], device: str) -> float:
    """Working memory one call of ``fn`` needs at its peak beyond inputs and output, in MiB."""
    peak, output = _cuda_peak_bytes(fn) if device == "cuda" else _cpu_peak_bytes(fn)
    return max(0, peak - output) / MB


def free_memory_bytes(device: str) -> int:
    """Memory a case may still use: CUDA free memory, or the kernel's MemAvailable on CPU."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
