"""Run cases in a worker process, so that a hung or crashing kernel cannot take the sweep with it.

One worker (spawned, so CUDA initialises cleanly) imports torch once and runs groups — the contenders of one
workload, timed together in interleaved rounds (runner.run_group) — one after another. The worker writes
the index of the contender it is busy with, and a step counter, into shared memory before every step
(prepare, each timing sample, the memory pass); the parent watches them:

* no step within ``timeout_s`` → that contender gets a ``timeout`` row, the worker is killed;
* the worker process ends (a segfault, an abort, ``os._exit``) → that contender gets an ``error`` row
  saying how it died (signal or exit code); killed by the kernel's OOM killer (SIGKILL while the memory
  cgroup's oom_kill count rose) → an ``oom`` row (:func:`death_status`). A closed pipe is a death, never a timeout: the
  parent waits for the process to be reaped before it says how it ended.

Either way the rest of the group runs again in a fresh worker, without the contender that failed, so one
bad kernel costs its own row and nothing else. Contenders come from the entry-point group, as in the
parent; ones registered in-process with ``attnbench.register`` are registered again in the worker from their
class references (``module:qualname``, see :func:`attnbench.registry.in_process_references`); a class that
cannot be imported by reference (defined in ``__main__`` or in a function) needs ``--isolate none``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from attnbench.memory import oom_kills
from attnbench.results import make_row
from attnbench.runner import RunOptions, run_group
from attnbench.workload import Workload

STARTUP_TIMEOUT_S = 300.0  # importing torch and probing every plugin
POLL_S = 0.1  # how often the parent looks at the worker's progress
REAP_S = 10.0  # a worker whose pipe closed gets this long to be reaped, so its exit status is known
IDLE = -1  # the progress index between groups


def _serve(
    conn: Connection, options: RunOptions, allocator: str, current: Any, steps: Any, references: tuple[str, ...] = ()
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    import torch

    from attnbench.allocator import configure_cpu_allocator
    from attnbench.registry import load, register_reference

    configure_cpu_allocator(allocator)
    torch.set_num_threads(options.threads)
    load()
    for reference in references:  # contenders the parent registered in-process
        register_reference(reference)

    def progress(index: int) -> None:
        current.value = index
        steps.value += 1

    conn.send("ready")
    while True:
        message = conn.recv()
        if message is None:
            return
        impls, workload = message
        rows = run_group(impls, workload, options, progress)
        current.value = IDLE
        conn.send(rows)


def _how_it_died(code: int | None) -> str:
    if code is None:
        return "it closed its connection and was killed"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"signal {-code} ({name})"
    return f"exit code {code}"


def death_status(code: int | None, oom_killed: bool | None) -> tuple[str, str]:
    """Status and reason for the contender whose worker died with exit ``code`` (negative: the signal).

    ``oom_killed`` is the evidence: whether the memory cgroup's oom_kill count rose while the case ran
    (None where it can't be read). SIGKILL with that evidence is the kernel's OOM killer: ``oom``.
    Anything else is an ``error`` saying how the worker died."""
    how = _how_it_died(code)
    if code == -signal.SIGKILL and oom_killed:
        return "oom", f"the kernel's OOM killer ended the worker process during the case ({how}; cgroup oom_kill rose)"
    if code == -signal.SIGKILL and oom_killed is None:
        how += "; the OOM killer sends it too, but no cgroup oom_kill count could be read here"
    return "error", f"the worker process died during the case ({how})"


class CaseWorker:
    """A worker process that turns the contenders of a workload into rows, with a per-step time limit."""

    def __init__(self, options: RunOptions, allocator: str, timeout_s: float, references: tuple[str, ...] = ()) -> None:
        self.options, self.allocator, self.timeout_s = options, allocator, timeout_s
        self.references = references  # module:qualname of contenders registered in the parent
        self._context = mp.get_context("spawn")
        self._current = self._context.Value("i", IDLE, lock=False)
        self._steps = self._context.Value("q", 0, lock=False)
        self._process: Any = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        parent, child = self._context.Pipe()
        args = (child, self.options, self.allocator, self._current, self._steps, self.references)
        self._process = self._context.Process(target=_serve, args=args, daemon=True, name="attnbench-worker")
        self._process.start()
        child.close()
        try:
            ready = parent.poll(STARTUP_TIMEOUT_S) and parent.recv() == "ready"
        except (EOFError, OSError):  # it died while starting
            ready = False
        if not ready:
            self._conn = parent
            self.close()
            raise RuntimeError("the attnbench worker process did not start")
        self._conn = parent
        return parent

    def run(self, impl: str, workload: Workload) -> dict[str, Any]:
        """One case to one row."""
        return self.run_group([impl], workload)[0]

    def run_group(self, impls: list[str], workload: Workload) -> list[dict[str, Any]]:
        """The contenders of one workload to one row each, in order; a contender that hangs or kills the
        worker gets its own timeout or error row and the others run again in a fresh worker."""
        rows: dict[int, dict[str, Any]] = {}
        pending = list(range(len(impls)))
        while pending:
            outcome = self._attempt([impls[i] for i in pending], workload)
            if isinstance(outcome, list):
                rows.update(zip(pending, outcome, strict=True))
                break
            culprit, row = outcome
            failed = pending[culprit] if 0 <= culprit < len(pending) else pending[0]
            rows[failed] = row
            pending.remove(failed)
        return [rows[i] for i in range(len(impls))]

    def _attempt(self, impls: list[str], workload: Workload) -> list[dict[str, Any]] | tuple[int, dict[str, Any]]:
        """Rows for every contender, or (index of the contender that failed, its row)."""
        conn = self._conn or self._start()
        kills_before = oom_kills()
        self._current.value = 0
        last_steps, last_progress = self._steps.value, time.monotonic()
        try:
            conn.send((impls, workload))
            while True:
                if conn.poll(POLL_S):
                    rows: list[dict[str, Any]] = conn.recv()
                    return rows
                if not self._process.is_alive():
                    break
                if self._steps.value != last_steps:
                    last_steps, last_progress = self._steps.value, time.monotonic()
                elif time.monotonic() - last_progress > self.timeout_s:
                    culprit = int(self._current.value)
                    self._kill()
                    reason = f"no result within --timeout-s {self.timeout_s:g} s; the worker was killed"
                    return culprit, make_row(impls[max(culprit, 0)], workload, "timeout", reason)
        except (EOFError, OSError):
            pass  # the pipe closed: the worker died; say how below
        culprit = int(self._current.value)
        code = self._reap()
        kills_after = oom_kills()
        oom_killed = None if kills_before is None or kills_after is None else kills_after > kills_before
        status, reason = death_status(code, oom_killed)
        return culprit, make_row(impls[max(culprit, 0)], workload, status, reason)

    def _reap(self) -> int | None:
        """Wait for a dying worker to end and return its exit code (negative: the signal)."""
        process, self._process = self._process, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if process is None:
            return None
        process.join(REAP_S)
        if process.is_alive():  # closed its end of the pipe but lives on: not a result we can use
            process.kill()
            process.join()
            return None
        code: int | None = process.exitcode
        return code

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
