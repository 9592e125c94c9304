"""Peak working memory of one call, measured in a pass of its own (never while timing), and free memory.

The figure is what a call allocates at its peak beyond its inputs and its output: the output is the
same for every contender, so leaving it out shows what tells them apart — an S×S score matrix (bmm's
memory grows 4× when S doubles) against a flash kernel's few row statistics.

CUDA: reset the allocator's peak statistic, call, and take max_memory_allocated minus what was allocated
before, less the output's storage.

CPU: PyTorch's CPU allocations bypass Python's allocator, so tracemalloc never sees them. The profiler
with ``profile_memory=True`` records every allocation and free the CPU allocator makes, in order; the
running sum of those byte counts peaks at the same figure as on CUDA.

Free memory, for the planner's skip decision: on CPU the least of the kernel's MemAvailable, the memory
cgroup's room and the address-space limit's room (a container's or a ``ulimit -v``'s cap is the one that
kills). The caller adds back what its own allocator holds for reuse (:func:`held_for_reuse_bytes`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from attnbench.measure.allocator import free_bytes_held, release_free_memory, uncached

MB = 2**20
CGROUP_V2, CGROUP_V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a huge number (9223372036854771712)


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
    # The autograd profiler that torch.profiler.profile wraps: the wrapper's first start imports torch._inductor
    # (1.13 s on the 2-core Zen 4 VM, once per worker process) to read a CUDA-graphs setting; this one doesn't.
    from torch.autograd.profiler import profile

    # uncached: the profiler's own buffers, between the call's blocks in the cache, would fragment it
    with uncached(), quiet_native_stderr(), profile(use_cpu=True, profile_memory=True, use_kineto=True) as prof:
        output = fn()
    events = [e for e in prof.kineto_results.events() if e.name() == "[memory]"]
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


def _status_bytes(key: str) -> int | None:
    """A ``kB`` line of /proc/self/status (VmSize, VmRSS, VmHWM) in bytes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_number(name: str, key: str | None = None) -> int | None:
    """A number from a cgroup file under /sys/fs/cgroup (v2) or /sys/fs/cgroup/memory (v1): the whole file,
    or the value on the line that starts with ``key``. None where missing or unlimited ("max")."""
    for folder in (CGROUP_V2, CGROUP_V1):
        try:
            text = (folder / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if key is None and words and words[0].isdigit():
                return int(words[0])
            if key is not None and len(words) == 2 and words[0] == key and words[1].isdigit():
                return int(words[1])
    return None


def _either(first: int | None, second: int | None) -> int | None:
    """The cgroup v2 figure, else the v1 one (a 0 is a figure, not a miss)."""
    return first if first is not None else second


def _cgroup_room() -> int | None:
    """What the memory cgroup still allows: its limit less its usage, page cache that can be reclaimed
    (inactive files) counted as room. None without a limit."""
    limit = _either(_cgroup_number("memory.max"), _cgroup_number("memory.limit_in_bytes"))
    if limit is None or limit >= UNLIMITED:
        return None
    usage = _either(_cgroup_number("memory.current"), _cgroup_number("memory.usage_in_bytes")) or 0
    inactive = _cgroup_number("memory.stat", "inactive_file")  # v2; v1 says total_inactive_file
    cache = _either(inactive, _cgroup_number("memory.stat", "total_inactive_file"))
    return max(0, limit - usage + (cache or 0))


def _address_space_room() -> int | None:
    """RLIMIT_AS (``ulimit -v``, ``prlimit --as``) less the address space this process already maps."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(0, soft - (_status_bytes("VmSize") or 0))


def _system_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def free_memory_bytes(device: str) -> int:
    """Memory a case may still use: CUDA free memory, or on CPU the least of the kernel's MemAvailable,
    the memory cgroup's room and the address-space limit's room."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    return min(room for room in (_system_available(), _cgroup_room(), _address_space_room()) if room is not None)


def held_for_reuse_bytes(device: str) -> int:
    """Memory this process holds freed in its allocator cache, which its next allocations reuse: CUDA's
    reserved but unallocated bytes, or glibc's free bytes in its arenas (see ``attnbench.measure.allocator``)."""
    if device == "cuda":
        return int(torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
    return free_bytes_held()


def release_cached_memory(device: str) -> None:
    """Collect garbage and give the allocator's cache back, so the next workload starts as in a fresh
    process (what the free-memory figure then reads is what a fresh case could have)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    else:
        release_free_memory()


def oom_kills() -> int | None:
    """The memory cgroup's count of processes the OOM killer ended (v2 ``memory.events``, v1
    ``memory.oom_control``), or None where neither can be read."""
    return _either(_cgroup_number("memory.events", "oom_kill"), _cgroup_number("memory.oom_control", "oom_kill"))
