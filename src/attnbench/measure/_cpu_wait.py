"""How long this process's threads waited for a core: the direct evidence of a stalled sample on Linux.

The kernel keeps, per thread, the time it spent runnable but not running (``/proc/self/task/T/schedstat``,
second field, "run_delay", in ns). Summed over the process's threads before and after a sample, the
difference over the sample's wall time × the threads it ran on is the share of its thread time spent
waiting for a core: 0 on a quiet machine, 0.65–0.70 with busy loops on every core of the 2-core Zen 4 VM
(`nox -s timing_checks -- -k stall -s`). A wait share that large inflates the sample by as much, whatever
the kernel.

What it does not see: time the hypervisor takes from the whole VM (steal) — the yardsticks' collapsed rounds
cover that (attnbench.measure._yardsticks). Where the file does not exist (not Linux, schedstats off), nothing is
measured and the rows' ``waited_pct`` stays empty.
"""

from __future__ import annotations

import os

TASKS = "/proc/self/task"


def waited_ns() -> int | None:
    """The run-queue wait of every thread of this process so far, in ns; None where Linux does not say."""
    try:
        tasks = os.listdir(TASKS)
    except OSError:
        return None
    total, seen = 0, False
    for task in tasks:
        try:
            with open(f"{TASKS}/{task}/schedstat") as file:
                total += int(file.read().split()[1])
                seen = True
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total if seen else None
