"""Run cases in a worker process, so that a hung or crashing kernel cannot take the sweep with it.

One worker — a fresh interpreter, so CUDA initialises cleanly, started without re-running the caller's main
module (see :mod:`attnbench.runner._worker_main`) — imports torch once and runs groups — the contenders of one
workload, timed together in interleaved rounds (runner.run_group) — one after another. The worker writes
the index of the contender it is busy with, and a step counter, into shared memory before every step
(prepare, each timing sample, the memory pass); the parent watches them:

* no step within ``timeout_s`` → that contender gets a ``timeout`` row, the worker is killed;
* the worker process ends (a segfault, an abort, ``os._exit``) → that contender gets an ``error`` row
  saying how it died (signal or exit code); killed by the kernel's OOM killer (SIGKILL while the memory
  cgroup's oom_kill count rose) → an ``oom`` row (:func:`death_status`). A closed connection is a death,
  never a timeout: the parent waits for the process to be reaped before it says how it ended.

Either way the rest of the group runs again in a fresh worker, without the contender that failed, so one
bad kernel costs its own row and nothing else. Contenders come from the entry-point group, as in the
parent; ones registered in-process with ``attnbench.register`` are registered again in the worker from their
class references (``module:qualname``, see :func:`attnbench.contenders.registry.in_process_references`), with the
parent's ``sys.path``; a class that cannot be imported by reference (defined in ``__main__`` or in a
function) needs ``--isolate none``.

A worker never outlives its run: the parent kills every live worker on its way out (:func:`kill_workers`,
also at interpreter exit), and on Linux the kernel kills a worker whose parent died without doing so.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import Any

from attnbench.measure._memory import oom_kills
from attnbench.runner._worker_main import IDLE, PROGRESS_BYTES, ProgressPage
from attnbench.runner.cases import RunOptions
from attnbench.runner.results import make_row
from attnbench.workload import Workload

STARTUP_TIMEOUT_S = 300.0  # importing torch and probing every plugin
POLL_S = 0.1  # how often the parent looks at the worker's progress
REAP_S = 10.0  # a worker whose connection closed gets this long to be reaped, so its exit status is known
# The worker's first line: the parent's import path, then worker_main.main. Never the caller's __main__.
BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from attnbench.runner._worker_main import main; main(sys.argv[2:])"
)

_live: set[subprocess.Popen[bytes]] = set()  # every worker process started here and not yet reaped


def kill_workers() -> None:
    """Kill and reap every live worker (the way out of a run, however it ends); safe in a signal handler."""
    for process in list(_live):
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            process.wait(REAP_S)
        _live.discard(process)


atexit.register(kill_workers)


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
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._progress: ProgressPage | None = None

    def _start(self) -> Connection:
        """A fresh worker: a new interpreter given one end of a socket pair and the progress page."""
        ours, theirs = socket.socketpair()
        with tempfile.TemporaryFile() as page:  # unlinked at once; the mapping outlives the file object
            page.truncate(PROGRESS_BYTES)
            self._progress = ProgressPage(page.fileno())
            self._progress.write(IDLE, 0)
            path = [os.fspath(p) for p in sys.path if isinstance(p, str | os.PathLike)]
            command = [
                spawn.get_executable(),
                "-c",
                BOOTSTRAP,
                json.dumps(path),
                str(theirs.fileno()),
                str(page.fileno()),
                str(os.getpid()),
            ]
            shared = (theirs.fileno(), page.fileno())
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=shared)
            _live.add(self._process)
        theirs.close()
        conn = self._conn = Connection(ours.detach())
        try:
            conn.send((self.options, self.allocator, self.references))
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not conn.poll(POLL_S):  # in short steps, so a signal handler gets to run
                if self._process.poll() is not None or time.monotonic() > deadline:
                    break
            ready = conn.poll(0) and conn.recv() == "ready"
        except (EOFError, OSError):  # it died while starting
            ready = False
        if not ready:
            self.close()
            raise RuntimeError("the attnbench worker process did not start")
        return conn

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
        assert self._process is not None and self._progress is not None
        progress = self._progress
        kills_before = oom_kills()
        progress.write(0, progress.read()[1])
        last_steps, last_progress = progress.read()[1], time.monotonic()
        try:
            conn.send((impls, workload))
            while True:
                if conn.poll(POLL_S):
                    rows: list[dict[str, Any]] = conn.recv()
                    return rows
                if self._process.poll() is not None:
                    break
                current, steps = progress.read()
                if steps != last_steps:
                    last_steps, last_progress = steps, time.monotonic()
                elif time.monotonic() - last_progress > self.timeout_s:
                    self.kill()
                    reason = f"no result within --timeout-s {self.timeout_s:g} s; the worker was killed"
                    return current, make_row(impls[max(current, 0)], workload, "timeout", reason)
        except (EOFError, OSError):
            pass  # the connection closed: the worker died; say how below
        culprit = progress.read()[0]
        code = self._reap()
        kills_after = oom_kills()
        oom_killed = None if kills_before is None or kills_after is None else kills_after > kills_before
        status, reason = death_status(code, oom_killed)
        return culprit, make_row(impls[max(culprit, 0)], workload, status, reason)

    def _forget(self) -> subprocess.Popen[bytes] | None:
        """Close the connection and the progress page; return the process (no longer ours to watch)."""
        process, self._process = self._process, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        return process

    def _reap(self) -> int | None:
        """Wait for a dying worker to end and return its exit code (negative: the signal)."""
        process = self._forget()
        if process is None:
            return None
        try:
            code: int | None = process.wait(REAP_S)
        except subprocess.TimeoutExpired:  # closed its end of the connection but lives on: no usable result
            process.kill()
            process.wait()
            code = None
        _live.discard(process)
        return code

    def kill(self) -> None:
        """Stop the worker now, whatever it is doing (a timeout, a case cut short)."""
        process = self._forget()
        if process is not None:
            process.kill()
            process.wait()
            _live.discard(process)

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._conn is not None:
            with contextlib.suppress(OSError, ValueError):  # already gone: nothing to tell it
                self._conn.send(None)
        process = self._forget()
        if process is not None:
            try:
                process.wait(2)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            _live.discard(process)

    @property
    def pid(self) -> int | None:
        """The live worker's process id (None between workers)."""
        return self._process.pid if self._process is not None else None
