"""One process writes a run folder at a time.

A run holds an advisory lock (``flock``) on ``.lock`` in its folder from its start to its exit; ``--resume`` of
a folder that another process still writes (a job thought dead, a second shell) is refused in one line naming that
process — two writers appended the same cases twice to one ``rows.jsonl``. The lock goes with the process (the
kernel drops it at exit, even a kill -9), so a stopped run's folder resumes as before. Where ``fcntl`` does not
exist (Windows) nothing is locked.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from attnbench.errors import UsageError

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
HELD = (errno.EWOULDBLOCK, errno.EAGAIN)  # flock's answer where another process holds the lock


def writer_pid(out_dir: Path) -> int | None:
    """The process writing ``out_dir`` now (its pid, 0 where it wrote none yet), or None where none is."""
    path = out_dir / LOCK_NAME
    if fcntl is None or not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in HELD:  # cannot lock there at all: nobody is known to hold it
            return None
        text = path.read_text().strip()
        return int(text) if text.isdigit() else 0
    finally:
        os.close(fd)  # a shared lock taken here goes with it
    return None


def hold(out_dir: Path, flag: str) -> int | None:
    """Lock ``out_dir`` for this process (the returned descriptor holds it: keep it open), or a UsageError naming
    the process that writes it already."""
    if fcntl is None:
        return None
    fd = os.open(out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in HELD:  # a filesystem that cannot lock (some network mounts): run unlocked, as before
            return None
        pid = writer_pid(out_dir)
        raise UsageError(
            f"{flag} {out_dir}: another attnbench process{f' (pid {pid})' if pid else ''} is writing this run folder "
            "now; wait for it to end, or stop it and then resume"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
