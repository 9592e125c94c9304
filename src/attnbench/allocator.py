"""The CPU allocator policy, fixed for a whole run so timings don't depend on allocator history.

PyTorch's CPU tensors come from the C library's malloc. glibc serves large blocks with mmap and returns
them on free, so every call that allocates an S×S score matrix pays page faults to zero fresh memory —
and whether a 32 MB block is mmapped depends on a threshold glibc moves as the process runs, so the same
case measures 2× apart from one run to the next (seen: bmm at S=1024, 16 ms or 35 ms).

``cached`` (the default) tells glibc to keep freed memory (no mmap, no trimming), which is what a caching
allocator does on the GPU: timings then measure the kernels, not the page faults. ``system`` leaves malloc
as it is. Peak memory is measured by the profiler either way and does not depend on this.
"""

from __future__ import annotations

import ctypes
import ctypes.util

POLICIES = ("cached", "system")
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_applied: str | None = None


def configure_cpu_allocator(policy: str) -> str:
    """Apply ``policy`` once per process; returns what is in force, for meta.json."""
    global _applied
    if policy == "system":
        return _applied or "system malloc"
    if _applied is None:
        _applied = _keep_freed_memory()
    return _applied


def _keep_freed_memory() -> str:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "system malloc (mallopt not available here)"
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) != 1:
        return "system malloc (mallopt refused)"
    return "cached: glibc malloc keeps freed memory (M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
