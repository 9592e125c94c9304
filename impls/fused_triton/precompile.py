"""Compile a tuning's candidate tiles side by side, in threads, before they are timed.

On a fresh machine nearly all of fused_triton's tuning is Triton compiling each candidate tile, one after another,
while the GPU machine's other cores idle: a candidate's timing is ~25 ms of calls (``time_tile``), its compile
about 1 s (an sm_90 compile of the forward kernel on a 2-vCPU Intel Xeon; issue 37's run, H100 SXM, torch
2.11.0+cu130, Triton 3.6.0, had ``setup_ms`` up to 30 s a case). Triton's compile leaves Python's lock free for
nearly all of its time (LLVM, ptxas), so threads compile side by side: nine forward tiles in 4.6–5.2 s on two
threads against 8.9–10.1 s on one (``trials/probes/compile_ahead.py``, that machine, Triton 3.6, nothing else
running). So:

1. **Record** what each candidate would compile: ``launch(tile)`` under Triton's ``jit_cache_hook``, which is
   handed each kernel's specialisation (signature, constants, attributes, options — exactly as the launcher
   made them) before it is compiled; the hook answers True, so that launch compiles nothing and runs nothing.
   A kernel this process already holds compiled skips the hook and launches as usual (a tuning's launches are
   thrown away).
2. **Compile** those in ``threads`` threads: ``JITFunction.preload`` of each specialisation, which compiles it
   into the kernel's own cache (and Triton's on-disk one), as the launch would have.
3. **Time** as before: the tuning's first launch of each tile finds its kernel compiled.

Nothing here changes which tile is chosen, or fails a tuning: a specialisation that does not compile is left for the
tuning to compile (and fail) again, as without this. Fewer than ``MIN_KERNELS`` kernels, or fewer than two threads,
compile in the tuning itself. The threads are the CPUs this process may use, at most ``MAX_THREADS``, or
``ATTNBENCH_COMPILE_THREADS`` (0 or 1: none).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

ENV_THREADS = "ATTNBENCH_COMPILE_THREADS"
MAX_THREADS = 16
MIN_KERNELS = 2


class Specialisation(NamedTuple):
    """One compile a launch asked for: the kernel and Triton's serialised specialisation of it."""

    kernel: Any  # the JITFunction
    data: str


def thread_count() -> int:
    """The threads to compile in: ``ATTNBENCH_COMPILE_THREADS``, else the CPUs this process may use, at most
    ``MAX_THREADS``. An unreadable setting counts as unset."""
    setting = os.environ.get(ENV_THREADS, "").strip()
    if setting.isdigit():
        return int(setting)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(cpus, MAX_THREADS)


def record(launch: Callable[[Any], object], tiles: Sequence[Any]) -> list[Specialisation]:
    """The compiles launching each of ``tiles`` would start, each once; none of them is compiled or run. A tile
    whose launch raises is skipped: the tuning meets it as before."""
    from triton import knobs

    found: dict[tuple[int, str], Specialisation] = {}

    def hook(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        data = compile["specialization_data"]
        found.setdefault((id(fn.jit_function), data), Specialisation(fn.jit_function, data))
        return True  # no compile, no launch

    saved = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        for tile in tiles:
            try:
                launch(tile)
            except Exception:  # any failure here is the tuning's to meet, not ours
                continue
    finally:
        knobs.runtime.jit_cache_hook = saved
    return list(found.values())


def compile_ahead(launch: Callable[[Any], object], tiles: Sequence[Any], threads: int | None = None) -> int:
    """Compile what launching ``tiles`` needs, in threads side by side (the module docstring says how); the
    kernels compiled, 0 when it would not pay or could not be done."""
    threads = thread_count() if threads is None else threads
    if threads < 2:
        return 0
    try:
        wanted = record(launch, tiles)
        device = _current_device()
    except Exception:  # a Triton without the hook, no driver: compile in the tuning
        return 0
    if len(wanted) < MIN_KERNELS:
        return 0

    def compile_one(specialisation: Specialisation) -> bool:
        try:
            _use_device(device)  # a new thread's current device is the first; the tuning's may be another
            specialisation.kernel.preload(specialisation.data)
            return True
        except Exception:  # a tile that does not compile: the tuning meets it
            return False

    with ThreadPoolExecutor(min(threads, len(wanted)), thread_name_prefix="attnbench-compile") as pool:
        return sum(pool.map(compile_one, wanted))


def _current_device() -> int:
    from triton.runtime import driver

    return int(driver.active.get_current_device())


def _use_device(device: int) -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(device)
