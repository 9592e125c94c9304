"""Compile a tuning's candidate tiles side by side, in worker processes, before they are timed.

On a fresh machine nearly all of fused_triton's tuning is Triton compiling each candidate tile (issue 37's H100 run:
``setup_ms`` up to 30 s a case; an sm_90 compile of the forward kernel is 1.2 s on a 2-core Intel Xeon, half of it
in LLVM), one after another, while the GPU machine's other cores idle. Threads don't help much: Triton's compile
holds Python's lock for about a third of its time (two threads on 2 cores: 1.5×, not 2×). So:

1. **Record** what each candidate would compile: ``launch(tile)`` under Triton's ``jit_cache_hook``, which is
   handed each kernel's specialisation (signature, constants, attributes, options — exactly as the launcher
   made them) before it is compiled; the hook answers True, so that launch compiles nothing and runs nothing.
   A kernel this process already holds compiled skips the hook and launches as usual (a tuning's launches are
   thrown away).
2. **Compile** those in ``workers`` fresh processes (``python -m attnbench.impls.fused_triton.precompile``, the
   specialisations on stdin as JSON): each hands them to ``JITFunction.preload`` for this GPU's target, which
   compiles them into Triton's on-disk cache. The workers need no GPU: ``preload`` asks the driver only for a
   device number and the target, which a stand-in gives.
3. **Time** as before: the tuning's first launch of each tile finds its kernel in that cache and loads it.

**The same name in every process.** Triton 3.6 names a compiled kernel in its disk cache by a hash of its source
and of the functions it calls, and a caller's hash takes in the global constants a helper uses only if that
helper was hashed before it (3.9 hashes the helper first): the name of a kernel depended on which kernels the
process had compiled before (a worker given the dK/dV tiles named 4 of 10 kernels differently from the tuner,
which then compiled them again). ``settle_hashes``, called where ``flash`` imports the kernels, hashes every
function of the kernel modules once, in one order, before anything is compiled — in the tuner and in each
worker alike.

Nothing here changes which tile is chosen, or fails a tuning: a specialisation that does not compile, a worker that
fails or takes longer than ``TIMEOUT_S``, a cache that can't be written — each leaves that kernel to be compiled (or
to fail) in the tuning itself, as without this. Fewer than ``MIN_KERNELS`` kernels to compile, or fewer than two
CPUs, compile in the tuning too (a worker takes a few seconds to import torch and Triton). The number of workers is
the CPUs this process may use, at most ``MAX_WORKERS``, or ``ATTNBENCH_COMPILE_WORKERS`` (0 or 1: none).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV_WORKERS = "ATTNBENCH_COMPILE_WORKERS"
MAX_WORKERS = 16
MIN_KERNELS = 3
TIMEOUT_S = 600.0
STANDARD_LOADERS = ("_frozen_importlib_external", "_frozen_importlib", "importlib.machinery")


def settle_hashes(*modules: ModuleType) -> None:
    """Hash each Triton function of ``modules`` now, in the order given and, within a module, defined (see the
    module docstring); functions run by Triton's interpreter have no such hash and are left alone."""
    from triton.runtime.jit import JITFunction

    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, JITFunction):
                _ = value.cache_key


def worker_count() -> int:
    """The worker processes to compile in: ``ATTNBENCH_COMPILE_WORKERS``, else the CPUs this process may use,
    at most ``MAX_WORKERS``. An unreadable setting counts as unset."""
    setting = os.environ.get(ENV_WORKERS, "").strip()
    if setting.isdigit():
        return int(setting)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return min(cpus, MAX_WORKERS)


def importable(module: str) -> bool:
    """Whether a fresh Python process imports ``module`` as this one did: its package loaded by Python's own
    file loaders (an editable install's too), not by an importer only this process has (``attnbench ab
    --base``'s copy of a contender at another revision)."""
    loader = getattr(getattr(sys.modules.get(module.partition(".")[0]), "__spec__", None), "loader", None)
    return type(loader).__module__ in STANDARD_LOADERS


def record(launch: Callable[[Any], object], tiles: Sequence[Any]) -> list[dict[str, str]]:
    """The kernels launching each of ``tiles`` would compile (``{"module", "name", "data"}``, data: Triton's
    serialised specialisation), each once; none of them is compiled or run. A tile whose launch raises is
    skipped, and a kernel of a module a worker can't import (``importable``) is compiled and launched as
    usual: the tuning meets both as before."""
    from triton import knobs

    found: dict[str, dict[str, str]] = {}

    def hook(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool | None:
        kernel = fn.jit_function.fn  # the Python function under @triton.jit: where the worker finds it
        if not importable(kernel.__module__):
            return None  # compiled by the tuning itself, as without workers
        data = compile["specialization_data"]
        found.setdefault(data, {"module": kernel.__module__, "name": kernel.__name__, "data": data})
        return True  # no compile, no launch

    saved = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        for tile in tiles:
            try:
                launch(tile)
            except Exception:
                continue
    finally:
        knobs.runtime.jit_cache_hook = saved
    return list(found.values())


def current_target() -> dict[str, Any]:
    """This process's GPU target (backend, arch, warp size), as a worker rebuilds it."""
    from triton.runtime import driver

    target = driver.active.get_current_target()
    return {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size}


def compile_ahead(
    launch: Callable[[Any], object],
    tiles: Sequence[Any],
    workers: int | None = None,
    target: dict[str, Any] | None = None,
) -> int:
    """Compile what launching ``tiles`` needs into Triton's disk cache, in worker processes side by side (the
    module docstring says how); the kernels compiled ahead, 0 when it would not pay or could not be done."""
    workers = worker_count() if workers is None else workers
    if workers < 2:
        return 0
    try:
        kernels = record(launch, tiles)
        if len(kernels) < MIN_KERNELS:
            return 0
        target = target or current_target()
    except Exception:
        return 0
    count = min(workers, len(kernels))
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    started = []
    for part in (kernels[index::count] for index in range(count)):
        try:  # each worker reads its whole request first, so writing it can't wait on another worker
            process = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            assert process.stdin is not None
            with process.stdin:
                process.stdin.write(json.dumps({"target": target, "kernels": part}).encode())
        except OSError:
            continue
        started.append((process, len(part)))
    deadline = time.monotonic() + TIMEOUT_S
    done = 0
    for process, size in started:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
            done += size if process.returncode == 0 else 0  # a worker that crashed: its kernels not counted
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return done


class _StandInDriver:
    """What ``JITFunction.preload`` asks of Triton's driver, in a process without a GPU: a device number and
    the target to compile for."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def compile_in_this_process(request: dict[str, Any]) -> int:
    """Compile each of ``request["kernels"]`` for ``request["target"]`` into Triton's disk cache; the number
    that failed (each said on stderr)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from attnbench.impls.fused_triton import flash  # noqa: F401 (its import settles the hashes, as in the tuner)

    driver.set_active(_StandInDriver(GPUTarget(**request["target"])))
    failed = 0
    for kernel in request["kernels"]:
        try:
            getattr(importlib.import_module(kernel["module"]), kernel["name"]).preload(kernel["data"])
        except Exception as exc:
            failed += 1
            print(
                f"{kernel['name']}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                file=sys.stderr,
            )
    return failed


if __name__ == "__main__":
    compile_in_this_process(json.load(sys.stdin))  # a kernel that failed is said, and met again by the tuning
