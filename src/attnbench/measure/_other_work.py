"""CPU used by work that is not attnbench's own, measured over a short window from /proc.

A warning that other work competes for the CPU must be about *other* work. The 1-minute load average
cannot say whose work it is: it decays over minutes, so after attnbench's own previous run (the calibrate
driver's last run, the previous nox session) it still reads as if someone else were busy. So the machine is
watched for ``window_s`` instead:

- every process's CPU time (``utime + stime`` in /proc/[pid]/stat) at the start and end of the window gives
  each process's share of a core;
- the machine's busy time in /proc/stat (user, nice, system, irq, softirq) gives all work done in the
  window, short-lived processes included;
- attnbench's own tree is left out of both: the root processes (by default the current one), everything
  they started (workers, compilers: found through the ``ppid`` links), and each root's parent chain within
  its session (the command the user ran: the calibrate driver, nox, pytest, the shell). The chain stops at
  the session's edge, so a terminal, an SSH daemon or another user's session is never counted as ours.
  Passes that have ended are gone from /proc and cost nothing; a worker still exiting is a child, so ours.

What it finds is said with the figures: "process 1234 (python3) used 85 % of a core", and how much of the
machine other work used in all. Linux only (elsewhere nothing is measured and nothing is said).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
BUSY_PROCESS_SHARE = 0.2  # another process using a fifth of a core is worth naming
OTHER_WORK_CORES = 0.5  # other work using half a core in all is worth a warning, named or not
NAMED = 3  # the busiest other processes named in the warning


@dataclass(frozen=True)
class Process:
    """One line of /proc/[pid]/stat, the fields used here."""

    pid: int
    name: str
    ppid: int
    session: int
    ticks: int  # utime + stime, in clock ticks (all threads)


@dataclass(frozen=True)
class OtherWork:
    """What other work did during the window: its share of the machine and the busiest other processes."""

    window_s: float
    cores: int
    cores_used: float  # cores' worth of CPU time used by work outside attnbench's tree
    busy: list[tuple[int, str, float]] = field(default_factory=list)  # (pid, name, share of a core), busiest first

    def warning(self, min_share: float = BUSY_PROCESS_SHARE, min_cores: float = OTHER_WORK_CORES) -> str | None:
        """One line naming the busiest other processes (those over ``min_share`` of a core), or None when
        neither a process nor other work in all (``min_cores``) is busy enough to matter."""
        named = [(pid, name, share) for pid, name, share in self.busy if share >= min_share]
        if not named and self.cores_used < min_cores:
            return None
        head = f"other work used {self.cores_used:.2g} of {self.cores} cores over {self.window_s:.2g} s before the run"
        if not named:
            return f"{head}, no process over {min_share:.0%} of a core (short-lived or many small ones)"
        listed = ", ".join(f"process {pid} ({name}) used {share:.0%} of a core" for pid, name, share in named[:NAMED])
        more = f", and {len(named) - NAMED} more over {min_share:.0%}" if len(named) > NAMED else ""
        return f"{head}: {listed}{more}"


def _parse_stat(pid: int, text: str) -> Process:
    name = text[text.find("(") + 1 : text.rfind(")")]
    fields = text[text.rfind(")") + 2 :].split()  # fields[0] is the state, field 3 of the man page
    return Process(pid, name, int(fields[1]), int(fields[3]), int(fields[11]) + int(fields[12]))


def processes() -> dict[int, Process]:
    """Every process /proc shows now (those that end while it is read are left out)."""
    found = {}
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            found[int(stat.parent.name)] = _parse_stat(int(stat.parent.name), stat.read_text())
        except (OSError, ValueError, IndexError):
            continue
    return found


def machine_busy_ticks() -> int | None:
    """Busy clock ticks of all CPUs since boot (/proc/stat's user, nice, system, irq, softirq), or None."""
    try:
        first = (PROC / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = map(int, first[1:8])
    return user + nice + system + irq + softirq


def own_pids(table: dict[int, Process], roots: Iterable[int]) -> set[int]:
    """attnbench's own tree in ``table``: the roots, all their descendants, and each root's parent chain
    while it stays in the root's session (the command the user ran, up to the session's shell)."""
    roots = [pid for pid in roots if pid in table]
    children: dict[int, list[int]] = {}
    for process in table.values():
        children.setdefault(process.ppid, []).append(process.pid)
    ancestors: set[int] = set()
    for root in roots:
        parent = table[root].ppid
        while parent in table and table[parent].session == table[root].session and parent not in ancestors:
            ancestors.add(parent)
            parent = table[parent].ppid
    tree: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in tree:
            tree.add(pid)
            stack.extend(children.get(pid, []))
    return tree | ancestors


def measure(window_s: float = 0.25, roots: Iterable[int] | None = None) -> OtherWork | None:
    """Watch the machine for ``window_s`` and return what work outside attnbench's tree (``roots``: by
    default this process) did; None where /proc is not there to read."""
    if not (PROC / "self" / "stat").exists():
        return None
    roots = set(roots) if roots is not None else {os.getpid()}
    hertz = os.sysconf("SC_CLK_TCK")
    busy_before, before, start = machine_busy_ticks(), processes(), time.perf_counter()
    time.sleep(window_s)
    busy_after, after, elapsed = machine_busy_ticks(), processes(), time.perf_counter() - start
    own = own_pids(before, roots) | own_pids(after, roots)
    used = {pid: p.ticks - before[pid].ticks for pid, p in after.items() if pid in before}
    own_ticks = sum(ticks for pid, ticks in used.items() if pid in own)
    others = sorted(
        (
            (pid, after[pid].name, ticks / hertz / elapsed)
            for pid, ticks in used.items()
            if pid not in own and ticks > 0
        ),
        key=lambda item: -item[2],
    )
    named_cores = sum(share for _, _, share in others)
    if busy_before is not None and busy_after is not None:
        cores_used = max(named_cores, (busy_after - busy_before - own_ticks) / hertz / elapsed)
    else:
        cores_used = named_cores
    cores = os.cpu_count() or 1
    return OtherWork(elapsed, cores, min(cores_used, cores), others)  # ticks are coarse: never over the machine
