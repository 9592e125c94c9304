"""The CPU allocator policy, fixed for a whole run so timings don't depend on allocator history.

PyTorch's CPU tensors come from the C library's malloc. glibc serves large blocks with mmap and returns
them on free, so every call that allocates an S×S score matrix pays page faults to zero fresh memory —
and whether a 32 MB block is mmapped depends on a threshold glibc moves as the process runs, so the same
case measures 2× apart from one run to the next (seen: bmm at S=1024, 16 ms or 35 ms).

``cached`` (the default) tells glibc to keep freed memory (no mmap, no trimming), which is what a caching
allocator does on the GPU: timings then measure the kernels, not the page faults. ``system`` leaves malloc
as it is. Peak memory is measured by the profiler either way and does not depend on this.

What the cache holds is invisible to the kernel's free-memory figure (MemAvailable counts it as used), so
a worker that just ran a 16k-key case would read its own cache as memory it can't have and skip the next
case. Between workloads the worker gives its cache back (:func:`release_free_memory`, glibc's
``malloc_trim``); within one, :func:`free_bytes_held` says how much freed memory the process keeps for reuse.

The cache also fragments: the correctness check's float64 temporaries (128 MiB blocks at 16k keys) cut
into by small long-lived blocks grew a worker by twice their size, and more with each check. The check
runs outside the timed region, so it runs :func:`uncached` — large blocks mapped and unmapped as glibc
does by default — and leaves nothing behind in the cache.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator

POLICIES = ("cached", "system")
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
MMAP_ABOVE = 2**20  # inside uncached(): blocks of at least this size are mapped, and unmapped on free
_applied: str | None = None


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc 2.33+): the arenas' totals in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def free_bytes_held() -> int:
    """Freed memory malloc keeps in its arenas for reuse (``fordblks``); 0 where mallinfo2 is missing."""
    libc = _libc()
    mallinfo2 = getattr(libc, "mallinfo2", None)
    if mallinfo2 is None:
        return 0
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().fordblks)


def release_free_memory() -> None:
    """Give the freed memory malloc keeps back to the system (``malloc_trim(0)``), where glibc has it."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def configure_cpu_allocator(policy: str) -> str:
    """Apply ``policy`` once per process; returns what is in force, for meta.json."""
    global _applied
    if policy == "system":
        return _applied or "system malloc"
    if _applied is None:
        _applied = _keep_freed_memory()
    return _applied


def keeps_freed_memory() -> bool:
    """Whether this process runs under the ``cached`` policy (glibc keeps freed memory)."""
    return _applied is not None and _applied.startswith("cached")


def _keep_freed_memory() -> str:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "system malloc (mallopt not available here)"
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) != 1:
        return "system malloc (mallopt refused)"
    return "cached: glibc malloc keeps freed memory (M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"


@contextlib.contextmanager
def uncached() -> Iterator[None]:
    """Within the block, blocks of MMAP_ABOVE bytes or more are mmapped and given back on free, whatever
    the policy; outside it the policy in force returns (``cached``: no mmap)."""
    mallopt = getattr(_libc(), "mallopt", None) if keeps_freed_memory() else None
    if mallopt is None:
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_ABOVE)
    mallopt(_M_MMAP_MAX, 65536)
    try:
        yield
    finally:
        mallopt(_M_MMAP_MAX, 0)
