"""The worker process's side of :mod:`attnbench.runner._worker`: a fresh interpreter that runs groups of cases.

The parent starts it as ``python -c BOOTSTRAP …`` (see :func:`attnbench.runner._worker.CaseWorker`), never through
``multiprocessing``: a spawned process re-imports the caller's main module, which breaks a script without an
``if __name__ == "__main__":`` guard, ``python -`` and embedded interpreters. Here nothing of the caller is
imported — the bootstrap sets ``sys.path`` to the parent's (so contenders registered by ``module:qualname``
import as they did there) and calls :func:`main`.

The two processes share a connected socket (pickled messages, ``multiprocessing.connection.Connection``)
and a 16-byte shared page (:class:`ProgressPage`, an mmap of an unlinked temporary file): the worker writes the
index of the contender it is busy with and a step counter there before every step, so the parent can tell
a hung kernel from a slow one without asking the (possibly stuck) worker anything.

The worker dies with its parent: on Linux the kernel sends it SIGKILL when the parent goes
(``PR_SET_PDEATHSIG``), even while it is stuck in a kernel; it ignores SIGINT, SIGTERM and SIGHUP, which
reach the whole process group from a terminal, ``timeout`` or a scheduler — the parent decides what they
mean and stops the worker itself.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import struct
import sys
from multiprocessing.connection import Connection
from typing import NoReturn

PROGRESS_FORMAT = "qq"  # the contender index, the step counter
PROGRESS_BYTES = struct.calcsize(PROGRESS_FORMAT)
IDLE = -1  # the progress index between groups
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class ProgressPage:
    """The shared page: which contender the worker is on, and how many steps it has taken."""

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, PROGRESS_BYTES)

    def read(self) -> tuple[int, int]:
        current, steps = struct.unpack_from(PROGRESS_FORMAT, self._map)
        return current, steps

    def write(self, current: int, steps: int) -> None:
        struct.pack_into(PROGRESS_FORMAT, self._map, 0, current, steps)

    def close(self) -> None:
        self._map.close()


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent ends (Linux); exit now if it already has.

    Strictly, when the parent's thread that started it ends: the thread running the sweep, which closes
    its workers before it returns."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(1)


def main(argv: list[str]) -> None:
    """Serve groups until the parent sends None or goes away: ``argv`` is the socket's file descriptor,
    the progress page's file descriptor and the parent's pid."""
    conn_fd, progress_fd, parent_pid = (int(a) for a in argv)
    die_with_parent(parent_pid)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # the parent decides what they mean
    conn, progress = Connection(conn_fd), ProgressPage(progress_fd)
    options, allocator, references = conn.recv()

    import torch

    from attnbench.contenders.registry import load, register_reference
    from attnbench.measure.allocator import configure_cpu_allocator
    from attnbench.runner.cases import run_group

    configure_cpu_allocator(allocator)
    torch.set_num_threads(options.threads)
    load()
    for reference in references:  # contenders the parent registered in-process
        register_reference(reference)
    steps = 0

    def step(index: int) -> None:
        nonlocal steps
        steps += 1
        progress.write(index, steps)

    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent closed its end
            leave()
        if message is None:
            leave()
        impls, workload = message
        rows = run_group(impls, workload, options, step)
        progress.write(IDLE, steps)
        conn.send(rows)


def leave() -> NoReturn:
    """Exit now, skipping the interpreter's teardown: a process that has imported torch takes 0.5–1 s to shut
    down (0.48 s after `import torch` alone, about 1.1 s for a worker that ran cases, on the 2-core Zen 4 VM),
    which every run's end waited for. Nothing of the worker outlives the rows it sent: flush and go."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
