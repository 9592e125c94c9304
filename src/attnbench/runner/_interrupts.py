"""What SIGINT, SIGTERM and SIGHUP mean during a sweep: stop after the case in hand, keep every result.

Interrupts come in bursts. Coreutils ``timeout`` signals the run and then its whole process group (two
SIGTERMs), SLURM signals every process of a job step and again before SIGKILL, a user presses Ctrl-C twice.
One exception per signal (the old way) lets the second land while the first is being handled and abort the
writing of the results. So :class:`StopSignals` counts them:

1. the first asks the sweep to stop after the case in hand (the sweep loop reads :attr:`requested`);
2. the second cuts the case in hand short (``KeyboardInterrupt`` raised inside :meth:`StopSignals.case`);
   outside a case — while finished rows are saved and the results written — it is ignored;
3. the third (the user insists) exits at once, status 130: ``at_exit`` kills the worker and removes
   half-written temporary files, and one line says that ``rows.jsonl`` keeps every finished row and
   ``attnbench run --resume RUN_DIR`` continues.

Handlers are installed only in the main thread (``signal`` allows no other) and only for signals that are
not ignored already: under ``nohup`` SIGHUP stays ignored, and so does SIGINT in a background job of a
non-interactive shell. Messages go straight to file descriptor 2: a handler may run while ``sys.stderr``
is in the middle of a write.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_STATUS = 130  # what a shell reports for a run stopped by Ctrl-C


def say(text: str) -> None:
    """One line on stderr, safe in a signal handler (and when stderr is gone: a hung-up terminal)."""
    with contextlib.suppress(OSError):
        os.write(2, f"attnbench: {text}\n".encode())


class StopSignals:
    """Counts SIGINT/SIGTERM/SIGHUP while installed (a context manager); see the module docstring."""

    def __init__(self, run_dir: Path, at_exit: Callable[[], None]) -> None:
        self.run_dir = run_dir
        self.at_exit = at_exit  # kill the worker, remove unfinished files: the third signal's way out
        self.count = 0
        self._in_case = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once a signal has asked the sweep to stop."""
        return self.count > 0

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    @contextlib.contextmanager
    def case(self) -> Iterator[None]:
        """The case in hand: a second signal while inside raises KeyboardInterrupt here to cut it short."""
        self._in_case = True
        try:
            yield
        finally:
            self._in_case = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        if self.count == 1:
            say(f"{name}: stopping after the case in hand (a second signal cuts it short, a third exits at once)")
        elif self.count == 2 and self._in_case:
            self._in_case = False
            say(f"{name}: cutting the case in hand short")
            raise KeyboardInterrupt
        elif self.count == 2:
            say(f"{name}: already stopping; saving the finished rows (a third signal exits at once)")
        else:
            self.at_exit()
            say(
                f"{name}: exiting at once; every finished row is kept in {self.run_dir / 'rows.jsonl'}; "
                f"continue with: attnbench run --resume {self.run_dir}"
            )
            os._exit(EXIT_STATUS)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt while inside, as Ctrl-C does: a command that keeps its finished
    work on Ctrl-C (``ab``'s verdicts, ``profile``'s tables, no half a report) keeps it when ``timeout``, SLURM or a
    closed terminal stops it. A sweep installs :class:`StopSignals` over it. Main thread only; an ignored signal
    stays ignored."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, _raise_interrupt)
    try:
        yield
    finally:
        for restored, handler in previous.items():
            signal.signal(restored, handler)
