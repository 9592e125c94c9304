"""`--shard I/N`: a deterministic slice of a sweep, balanced by predicted cost.

Existing tools spread the slices (a SLURM array job, a Kubernetes indexed Job, an ssh loop); attnbench
only has to give every machine the same answer to "which cases are mine". Costs are predicted with fixed
reference rates, not this machine's measured ceilings, so every machine computes the same partition;
the greedy longest-first assignment puts each case on the least-loaded shard. Together the N shards hold
every case exactly once.
"""

from __future__ import annotations

import re

from attnbench.contenders import registry
from attnbench.errors import UsageError
from attnbench.workload import Workload

REFERENCE_FLOPS_PER_S = 1e11
REFERENCE_BYTES_PER_S = 1e10
SETUP_SECONDS = 0.5  # inputs, the first call, the correctness check: every runnable case pays about this


def parse_shard(text: str) -> tuple[int, int]:
    """'2/3' -> (2, 3); one-line errors otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise UsageError(f"--shard {text!r}: expected I/N, e.g. --shard 2/3")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--shard {text!r}: I must be between 1 and N (N ≥ 1)")
    return index, count


def case_cost(impl: str, workload: Workload) -> float:
    """Machine-independent predicted seconds of a case (0 for cases that won't run)."""
    entry = registry.get(impl)
    contender = entry.contender
    if not entry.available or contender is None or contender.unsupported_reason(workload) is not None:
        return 0.0
    return SETUP_SECONDS + 3 * contender.predicted_seconds(workload, REFERENCE_FLOPS_PER_S, REFERENCE_BYTES_PER_S)


def shard_cases(cases: list[tuple[str, Workload]], index: int, count: int) -> list[tuple[str, Workload]]:
    """The cases of shard ``index`` (1-based) of ``count``, in the sweep's own order."""
    costs = [case_cost(impl, workload) for impl, workload in cases]
    order = sorted(range(len(cases)), key=lambda i: (-costs[i], i))  # longest first, ties by sweep order
    loads = [0.0] * count
    owner = [0] * len(cases)
    for i in order:
        # Least-loaded shard; free cases go round-robin so every shard gets its share of rows too.
        target = min(range(count), key=lambda s: (loads[s], s)) if costs[i] > 0 else i % count
        owner[i] = target
        loads[target] += costs[i]
    return [case for i, case in enumerate(cases) if owner[i] == index - 1]
