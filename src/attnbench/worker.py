"""Run cases in a worker process, so that a hung or crashing kernel cannot take the sweep with it.

One worker (spawned, so CUDA initialises cleanly) imports torch once and runs cases one after another.
The parent waits for each row at most ``timeout_s``; past that it kills the worker, records a ``timeout``
row and starts a fresh worker for the next case. A worker that dies mid-case (a segfault, the OOM killer)
gives an ``error`` row naming how it died. Contenders come from the entry-point group, as in the parent;
ones registered in-process with ``attnbench.register`` are registered again in the worker from their class
references (``module:qualname``, see :func:`attnbench.registry.in_process_references`); a class that cannot
be imported by reference (defined in ``__main__`` or in a function) needs ``--isolate none``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
from multiprocessing.connection import Connection
from typing import Any

from attnbench.results import make_row
from attnbench.runner import RunOptions, run_case
from attnbench.workload import Workload

STARTUP_TIMEOUT_S = 300.0  # importing torch and probing every plugin


def _serve(conn: Connection, options: RunOptions, allocator: str, references: tuple[str, ...] = ()) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    import torch

    from attnbench.allocator import configure_cpu_allocator
    from attnbench.registry import load, register_reference

    configure_cpu_allocator(allocator)
    torch.set_num_threads(options.threads)
    load()
    for reference in references:  # contenders the parent registered in-process
        register_reference(reference)
    conn.send("ready")
    while True:
        message = conn.recv()
        if message is None:
            return
        impl, workload = message
        conn.send(run_case(impl, workload, options))


class CaseWorker:
    """A worker process that turns (contender, workload) into a row, with a per-case time limit."""

    def __init__(self, options: RunOptions, allocator: str, timeout_s: float, references: tuple[str, ...] = ()) -> None:
        self.options, self.allocator, self.timeout_s = options, allocator, timeout_s
        self.references = references  # module:qualname of contenders registered in the parent
        self._context = mp.get_context("spawn")
        self._process: Any = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        parent, child = self._context.Pipe()
        args = (child, self.options, self.allocator, self.references)
        self._process = self._context.Process(target=_serve, args=args, daemon=True, name="attnbench-worker")
        self._process.start()
        child.close()
        if not parent.poll(STARTUP_TIMEOUT_S) or parent.recv() != "ready":
            self.close()
            raise RuntimeError("the attnbench worker process did not start")
        self._conn = parent
        return parent

    def run(self, impl: str, workload: Workload) -> dict[str, Any]:
        conn = self._conn or self._start()
        try:
            conn.send((impl, workload))
            if conn.poll(self.timeout_s):
                row: dict[str, Any] = conn.recv()
                return row
        except (EOFError, OSError):
            pass  # the worker died; say how below
        if self._process is not None and self._process.is_alive():
            self._kill()
            reason = f"no result within --timeout-s {self.timeout_s:g} s; the worker was killed"
            return make_row(impl, workload, "timeout", reason)
        code = self._process.exitcode if self._process is not None else None
        self._kill()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return make_row(impl, workload, "error", f"the worker process died during the case ({how})")

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._conn is not None:
            with contextlib.suppress(OSError, ValueError):  # already gone: nothing to tell it
                self._conn.send(None)
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(timeout=2)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._process = None
