"""`--shard I/N`: a deterministic slice of a sweep, whole workloads at a time, balanced by predicted cost.

Existing tools spread the slices (a SLURM array job, a Kubernetes indexed Job, an ssh loop); attnbench
only has to give every machine the same answer to "which cases are mine". Two rules make that answer hold:

* **whole workloads**: every contender of a workload lands in the same shard, so they are timed together in
  interleaved rounds (the reason the ratios between contenders of one run are what to quote) and the report
  ranks contenders timed in one process, never across shards or machines;
* **nothing machine-dependent**: a workload's cost is predicted from the workload alone (its FLOPs and
  minimum bytes at fixed reference rates), never from which contenders are installed, load or support it
  here, and never from this machine's ceilings. Machines with different software still split the same
  workloads the same way; only the contenders each one runs for them may differ.

The greedy longest-first assignment puts each workload on the least-loaded shard; together the N shards hold
every case exactly once. What a partition was computed from (the sweep's workloads, as a count and a hash)
goes into each shard's meta.json (``shard_plan``), and ``attnbench merge`` refuses shards of one sweep
whose plans differ (different attnbench, suite files or flags): they would lose or repeat cases.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from attnbench.errors import UsageError
from attnbench.workload import Workload
from attnbench.workload.flops import attention_bytes, attention_flops

REFERENCE_FLOPS_PER_S = 1e11
REFERENCE_BYTES_PER_S = 1e10
SETUP_SECONDS = 0.5  # inputs, the first call, the correctness check: every runnable case pays about this
PLAN_BY = "workload"  # what a shard_plan's partition assigns whole (shards planned before it have no shard_plan)


def parse_shard(text: str) -> tuple[int, int]:
    """'2/3' -> (2, 3); one-line errors otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise UsageError(f"--shard {text!r}: expected I/N, e.g. --shard 2/3")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--shard {text!r}: I must be between 1 and N (N ≥ 1)")
    return index, count


def workload_cost(workload: Workload) -> float:
    """Machine-independent predicted seconds of one contender on ``workload``: set-up and three calls at the
    reference rates (the roofline time). It reads the workload only, so it is the same on every machine."""
    call = max(attention_flops(workload) / REFERENCE_FLOPS_PER_S, attention_bytes(workload) / REFERENCE_BYTES_PER_S)
    return SETUP_SECONDS + 3 * call


def _workloads(cases: list[tuple[str, Workload]]) -> list[Workload]:
    return list(dict.fromkeys(workload for _, workload in cases))


def assign_workloads(workloads: list[Workload], count: int) -> dict[Workload, int]:
    """Each workload's shard (0-based): longest first, each to the least-loaded shard (ties: sweep order, then
    the lower shard)."""
    costs = [workload_cost(w) for w in workloads]
    loads = [0.0] * count
    owner: dict[Workload, int] = {}
    for i in sorted(range(len(workloads)), key=lambda i: (-costs[i], i)):
        target = min(range(count), key=lambda s: (loads[s], s))
        owner[workloads[i]] = target
        loads[target] += costs[i]
    return owner


def shard_cases(
    cases: list[tuple[str, Workload]], index: int, count: int, workloads: list[Workload] | None = None
) -> list[tuple[str, Workload]]:
    """The cases of shard ``index`` (1-based) of ``count``, in the sweep's own order: every contender of the
    workloads this shard owns. ``workloads``: the sweep's, the partition's basis (default: those of ``cases``);
    given before any contender is left out, a workload no contender of this machine suits keeps its place."""
    owner = assign_workloads(workloads if workloads is not None else _workloads(cases), count)
    return [(impl, workload) for impl, workload in cases if owner.get(workload) == index - 1]


def workload_key(workload: Workload) -> str:
    """A workload as stable text (its result columns, sorted), for the plan's hash."""
    return json.dumps(workload.as_row(), sort_keys=True, default=str)


def shard_plan(workloads: list[Workload]) -> dict[str, Any]:
    """What the partition of a sweep (all shards') was computed from: its workloads, as a count and a hash of
    their keys in sweep order. Two shards of one sweep with different plans split different sweeps."""
    workloads = list(dict.fromkeys(workloads))
    digest = hashlib.sha256("\n".join(map(workload_key, workloads)).encode()).hexdigest()[:16]
    return {"by": PLAN_BY, "workloads": len(workloads), "sha256": digest}
