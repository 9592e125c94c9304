"""`attnbench profile`: where the time goes, per contender.

For each case: prepare and check as a run does, warm up, time it with the run's median method
(:func:`attnbench.measure.timing.time_callable`), then record a few calls with torch.profiler, each call under its
own ``record_function`` range named ``attnbench.call:<impl>`` (after one call the profiler records and discards,
which takes the profiler's own start-up). Writes a Chrome/Perfetto trace per case, a
table of the top operators (or kernels, on CUDA) by self time, and a breakdown of each call into categories.

Definitions (per call, from the profiled calls):

* an operator's category comes from its name (``CATEGORIES``): matmul, softmax, copies, fused_attention,
  else ``other``; on CPU an operator inside a matmul or softmax operator takes that one's category, and a
  matmul computing Q·Kᵀ or P·V says which in its name among the top ops (:func:`op_totals`);
* the range's self time (CPU: time inside the contender's range that no torch operator in it accounts for)
  is split by its gap structure: the stretches of a call with no torch operator running — before the first,
  between two, after the last. A stretch that holds at least ``KERNEL_STRETCH_SHARE`` of the call and at
  least ``KERNEL_STRETCH_MIN_US`` is ``kernel (outside torch ops)``: a kernel called through ctypes or a
  library that does not go through torch's dispatcher (``fused_cpu``, numpy) runs there, in one stretch.
  The other stretches are ``python / dispatch overhead between ops``: the contender's Python between its
  torch calls, argument parsing and dispatch before each operator's start is stamped, the range's own entry
  and exit, and, after a large operator, the interpreter running from caches the operator evicted. A
  pure-torch contender (``bmm``) has only these: measured at S 256, about ten stretches of 2–30 µs and one
  of 60–140 µs as the call returns — no stretch near a quarter of the call;
* ``unattributed`` — the profiled wall time of a call that nothing above accounts for (the range's own
  entry and exit, synchronisation, profiler overhead; on CUDA also gaps between kernels);
* the categories are then scaled by ``median_ms / profiled_ms`` so that a case's breakdown adds up to its
  measured median (the profiler slows calls down a little; the split is what it measures, the total is the
  run's figure). ``breakdown.csv`` keeps ``median_ms``, ``profiled_ms`` and the unscaled ``profiled_ms_per_call``.

Which calls (CPU): a tracer's first recorded calls run slow — each profiler session's start-up goes on beside
them. bmm at B1 H8 S1024 D64 (2-vCPU Intel Xeon, nothing else running, calls around them 11–15 ms): the first
two to four recorded calls took 18–38 ms in each of six sessions, and a noisy machine adds slow calls of its own
anywhere. Averaged over five calls they made the profile read 16.9 ms against a median of 10.9 (its table's ms and
its breakdown's then told two stories). So on CPU ``2 × calls + RECORD_EXTRA_CALLS`` calls are recorded and the
``calls`` whose wall time lies nearest the case's timed median are kept: every figure of the tables comes from
those calls only (each operator's self time summed over the events under their ranges). The trace keeps every
recorded call. On CUDA the tables read the device's kernel times, which the host's start-up does not stretch:
``calls`` are recorded and all of them kept.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnbench import errors
from attnbench.contenders import registry
from attnbench.contenders.contract import Unsupported
from attnbench.measure._memory import quiet_native_stderr
from attnbench.measure.stopwatch import synchronize, warm_up
from attnbench.measure.timing import time_callable
from attnbench.runner.cases import prepare_checked
from attnbench.runner.results import replacing
from attnbench.workload import Workload

TOP_N = 15
# Checked in order; the first pattern that matches an operator's name picks its category.
CATEGORIES = [
    ("fused_attention", re.compile(r"attention|flash|fmha|cpp_fused|triton_|flex|CompiledFxGraph", re.I)),
    ("matmul", re.compile(r"::(bmm|mm|addmm|baddbmm|matmul|einsum|dot|mv|addmv_?|linear)$|gemm", re.I)),
    ("softmax", re.compile(r"softmax|::(exp|amax|logsumexp|max|sum|div)_?$", re.I)),
    ("copies", re.compile(r"copy|clone|contiguous|::to$|::cat$|repeat|expand$|masked_fill|fill_", re.I)),
]
PROFILE_SECONDS = 0.1  # record at most about this much run time (a Python-loop trace grows fast)
PROFILER_WARMUP_CALLS = 1  # calls recorded and discarded first: a fresh profiler's start-up lands in them
RECORD_EXTRA_CALLS = 3  # CPU: recorded beyond twice the calls kept (the tracer's slow start, measured 2-4 calls)
RANGE_PREFIX = "attnbench.call:"  # each profiled call runs under the range RANGE_PREFIX + impl
OUTSIDE_OPS = "kernel (outside torch ops)"
OVERHEAD = "python / dispatch overhead between ops"
KERNEL_STRETCH_SHARE = 0.25  # a stretch without a torch op this share of its call or more is a kernel …
KERNEL_STRETCH_MIN_US = 50.0  # … when it is this long too (Python between ops takes microseconds)
UNATTRIBUTED = "unattributed"


def category(op_name: str) -> str:
    for name, pattern in CATEGORIES:
        if pattern.search(op_name):
            return name
    return "other"


@dataclass(frozen=True)
class CaseProfile:
    impl: str
    workload: Workload
    calls: int  # calls the tables are per: those kept (CPU: nearest the median), all recorded on CUDA
    median_ms: float  # the case's median per call, timed as a run times it
    profiled_ms: float  # wall time per call while the profiler recorded
    trace_path: Path
    top_ops: pd.DataFrame  # op, self_ms_per_call, count_per_call, pct (of profiled_ms), category
    breakdown: pd.DataFrame  # category, ms_per_call (scaled to median_ms), pct, profiled_ms_per_call
    kernels: pd.DataFrame  # CUDA: every device kernel (KERNEL_COLUMNS), not only the top ones; else empty
    recorded: int = 0  # calls the profiler recorded (the trace holds them all); 0: as many as ``calls``
    waited: float | None = None  # CPU: the median sample's share of thread time spent waiting for a core
    asked: int = 0  # the calls asked for (--calls); more than ``calls`` where PROFILE_SECONDS capped them


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


class CaseFailed(Exception):
    """A case that could not be profiled, as a run's row would say it: its status (``incorrect``, ``unsupported``,
    ``error``) and one-line reason."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(f"{status} — {reason}")
        self.status, self.reason = status, reason


def profile_case(
    impl: str, workload: Workload, out_dir: Path, calls: int = 5, seed: int = 0, budget_s: float = 1.0
) -> CaseProfile:
    """Time, then profile ``calls`` calls of a checked case; write its trace into ``out_dir``. A case that is
    incorrect, unsupported or raises is :class:`CaseFailed` (and writes nothing)."""
    try:
        return _profile(impl, workload, out_dir, calls, seed, budget_s)
    except CaseFailed:
        raise
    except Unsupported as exc:
        raise CaseFailed("unsupported", errors.one_line(str(exc))) from exc
    except Exception as exc:  # a contender may fail in any way; the other cases are still profiled
        code = type(registry.get(impl).contender).__module__  # the reason names the line of its code that failed
        raise CaseFailed("error", errors.reason(exc, code=code)) from exc


def _profile(impl: str, workload: Workload, out_dir: Path, calls: int, seed: int, budget_s: float) -> CaseProfile:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    prepared = prepare_checked(impl, workload, seed)
    if not prepared.check.ok:
        raise CaseFailed("incorrect", prepared.check.reason)
    estimate_s = warm_up(prepared.fn, workload.device, prepared.first_call_ms, budget_s)
    timing = time_callable(
        prepared.fn, workload.device, torch.get_num_threads(), budget_s, estimate_s, graphs=workload.pass_ == "fwd"
    )
    asked, calls = calls, max(1, min(calls, int(PROFILE_SECONDS * 1e3 / max(timing.median_ms, 1e-3))))
    on_gpu = workload.device == "cuda"
    recorded = calls if on_gpu else 2 * calls + RECORD_EXTRA_CALLS
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    name = RANGE_PREFIX + impl
    walls_ms: list[float] = []
    # The first call under a fresh profiler pays its start-up: a stretch before its first operator that the
    # breakdown would name a kernel outside torch (with PROFILER_WARMUP_CALLS = 0, `attnbench profile --impl
    # sdpa_flash --seq 256` gave that category 15-16 % of the call in three runs on a 2-vCPU Intel Xeon with
    # nothing else running). So one call is recorded as the schedule's warm-up step, which the profiler
    # discards, and the next ``recorded`` are kept.
    steps = schedule(wait=0, warmup=PROFILER_WARMUP_CALLS, active=recorded, repeat=1)
    # shapes name which product a matmul computes (op_totals)
    with quiet_native_stderr(), profile(activities=activities, schedule=steps, record_shapes=True) as prof:
        for step in range(PROFILER_WARMUP_CALLS + recorded):
            synchronize(workload.device)
            start = time.perf_counter()
            with record_function(name):
                prepared.fn()
            synchronize(workload.device)
            if step >= PROFILER_WARMUP_CALLS:
                walls_ms.append((time.perf_counter() - start) * 1e3)
            prof.step()
    trace_path = out_dir / f"{_slug(impl)}__{_slug(workload.label())}.trace.json"
    with replacing(trace_path) as tmp:  # whole or not at all: a Ctrl-C while a long trace is written leaves none
        prof.export_chrome_trace(str(tmp))
    ranges = sorted((e for e in prof.events() if e.name == name), key=lambda e: e.time_range.start)
    if on_gpu or len(ranges) != len(walls_ms):
        kept_ranges, kept_walls, averages = ranges, walls_ms, list(prof.key_averages())
    else:
        keep = nearest(walls_ms, timing.median_ms, calls)
        kept_ranges, kept_walls = [ranges[i] for i in keep], [walls_ms[i] for i in keep]
        averages = op_totals(kept_ranges, (workload.head_dim, workload.seq_k, workload.head_dim_v))
    per_call = len(kept_walls)
    profiled_ms = sum(kept_walls) / per_call
    stretches = outside_op_stretches(kept_ranges, name)
    top, breakdown = _tables(averages, name, workload.device, per_call, profiled_ms, timing.median_ms, stretches)
    kernels = device_kernels(averages, per_call) if on_gpu else pd.DataFrame(columns=KERNEL_COLUMNS)
    return CaseProfile(
        impl,
        workload,
        per_call,
        timing.median_ms,
        profiled_ms,
        trace_path,
        top,
        breakdown,
        kernels,
        len(walls_ms),
        timing.waited,
        asked,
    )


def nearest(walls_ms: list[float], median_ms: float, count: int) -> list[int]:
    """Indices of the ``count`` calls whose wall time lies nearest ``median_ms``, in recorded order."""
    ranked = sorted(range(len(walls_ms)), key=lambda i: (abs(walls_ms[i] - median_ms), i))
    return sorted(ranked[:count])


@dataclass
class OpTotal:
    """One operator's self time and count summed over some calls: what ``key_averages()`` gives for all."""

    key: str
    self_cpu_time_total: float = 0.0  # µs
    count: int = 0
    category: str | None = None  # None: from the key's name (``category``)


COMPOSITE_CATEGORIES = ("matmul", "softmax")  # an operator inside one of these is part of its work
SCORES, PV = "scores Q·Kᵀ", "P·V"  # the two products of attention a matmul operator may compute
PHASED = re.compile(r"::(bmm|mm|matmul|baddbmm|addmm)$")  # operators whose last two operands are the product's


def matmul_phase(event: Any, dims: tuple[int, int, int] | None) -> str | None:
    """Which product of attention a matmul operator computes, from its operands' recorded shapes (``dims``: the
    workload's D, Sk, Dv): Q·Kᵀ contracts over D into Sk columns, P·V over Sk into Dv columns. None where the
    shapes are not recorded, or name neither product or both (Sk = D = Dv)."""
    if dims is None or not PHASED.search(event.name):
        return None
    shapes = [s for s in getattr(event, "input_shapes", None) or [] if len(s) >= 2]
    if len(shapes) < 2 or not all(isinstance(x, int) for x in (*shapes[-2], *shapes[-1])):
        return None
    inner, columns = shapes[-2][-1], shapes[-1][-1]
    head_dim, seq_k, head_dim_v = dims
    scores, pv = (inner, columns) == (head_dim, seq_k), (inner, columns) == (seq_k, head_dim_v)
    return None if scores == pv else SCORES if scores else PV


def op_totals(ranges: list, dims: tuple[int, int, int] | None = None) -> list[OpTotal]:
    """Per operator (by name), the self time and count of every event under the given call ranges, the ranges'
    own included — key_averages() restricted to those calls.

    An operator that runs inside a matmul or softmax operator is part of that one's work and takes its category:
    sdpa_math's ``aten::_safe_softmax`` spends most of its time in ``aten::isneginf``, ``aten::all`` and
    ``aten::where`` (which its name does not say), ``aten::matmul`` in the reshapes and copies around its
    ``aten::bmm``. Where that changes the operator's own category, its key says whose it is:
    ``aten::where (in aten::_safe_softmax)``. With ``dims`` (D, Sk, Dv) and shapes recorded, a matmul operator
    that computes one of attention's two products says which, and so do the operators inside it:
    ``aten::bmm [scores Q·Kᵀ]``, ``aten::bmm [P·V]`` (:func:`matmul_phase`)."""
    totals: dict[str, OpTotal] = {}
    # (event, the matmul/softmax operator it runs inside: (name, category, phase tag), is a call's range)
    pending: list[tuple[Any, tuple[str, str, str] | None, bool]] = [(event, None, True) for event in ranges]
    while pending:
        event, inside, is_range = pending.pop()
        own = category(event.name)
        key, op_category = event.name, own
        if inside is not None:
            inside_name, inside_category, tag = inside
            if own != inside_category:
                key, op_category = f"{event.name} (in {inside_name}{tag})", inside_category
            else:  # an einsum's shapes name no product; the bmm it runs has them
                phase = None if tag else matmul_phase(event, dims)
                key = event.name + (f" [{phase}]" if phase else tag)
        elif not is_range and own in COMPOSITE_CATEGORIES:  # a range's name is the contender's, not an operator's
            phase = matmul_phase(event, dims)
            tag = f" [{phase}]" if phase else ""
            key, inside = event.name + tag, (event.name, own, tag)
        total = totals.setdefault(key, OpTotal(key, category=op_category))
        total.self_cpu_time_total += event.self_cpu_time_total
        total.count += 1
        pending.extend((child, inside, False) for child in event.cpu_children)
    return list(totals.values())


KERNEL_COLUMNS = ["kernel", "ms_per_call", "launches_per_call", "category"]


def device_kernels(averages: list, calls: int) -> pd.DataFrame:
    """The device's own events (CUDA kernels, memcpy, memset) per call: their time and launches, longest
    first (empty on CPU). Kept whole, so ``profile --ncu`` finds every kernel Nsight Compute saw."""
    from torch.autograd import DeviceType

    records = [
        {
            "kernel": event.key,
            "ms_per_call": event.self_device_time_total / 1e3 / calls,
            "launches_per_call": event.count / calls,
            "category": category(event.key),
        }
        for event in averages
        if event.device_type != DeviceType.CPU
    ]
    frame = pd.DataFrame(records, columns=KERNEL_COLUMNS)
    return frame.sort_values("ms_per_call", ascending=False, ignore_index=True)


def outside_op_stretches(events: list, range_name: str) -> tuple[float, float]:
    """(kernel µs, overhead µs) summed over the recorded calls: each call's range split into its stretches
    with no torch operator running, each stretch named by its length (see the module docstring)."""
    kernel_us = overhead_us = 0.0
    for event in events:
        if event.name != range_name:
            continue
        start, end = event.time_range.start, event.time_range.end
        edges = [start]
        for child in sorted(event.cpu_children, key=lambda c: c.time_range.start):
            edges += [child.time_range.start, child.time_range.end]
        edges.append(end)
        for gap_start, gap_end in zip(edges[::2], edges[1::2], strict=True):
            gap = max(0.0, gap_end - gap_start)
            if gap >= KERNEL_STRETCH_SHARE * (end - start) and gap >= KERNEL_STRETCH_MIN_US:
                kernel_us += gap
            else:
                overhead_us += gap
    return kernel_us, overhead_us


def _tables(
    averages: list,
    range_name: str,
    device: str,
    calls: int,
    profiled_ms: float,
    median_ms: float,
    stretches: tuple[float, float],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Self time per operator (kernel time on CUDA), per call, ranked; and the call split by category,
    scaled to add up to ``median_ms`` (see the module docstring)."""
    on_gpu = device == "cuda"
    records = []
    for event in averages:
        if event.key.startswith("ProfilerStep") or (event.key.startswith(RANGE_PREFIX) and event.key != range_name):
            continue
        if event.key == range_name:
            if on_gpu:
                continue  # host time of the call, not device time; on CUDA third-party kernels show by name
            kernel_us, overhead_us = stretches
            parts = [
                (f"{range_name} ({OUTSIDE_OPS})", kernel_us, 1.0, OUTSIDE_OPS),
                (f"{range_name} ({OVERHEAD})", overhead_us, 1.0, OVERHEAD),
            ]
        else:
            self_us = getattr(event, "self_device_time_total", 0.0) if on_gpu else event.self_cpu_time_total
            op_category = getattr(event, "category", None) or category(event.key)
            parts = [(event.key, self_us, event.count / calls, op_category)]
        for op, self_us, count, op_category in parts:
            if self_us > 0:
                records.append(
                    {
                        "op": op,
                        "self_ms_per_call": self_us / 1e3 / calls,
                        "count_per_call": count,
                        "category": op_category,
                    }
                )
    top = pd.DataFrame(records, columns=["op", "self_ms_per_call", "count_per_call", "category"])
    top = top.sort_values("self_ms_per_call", ascending=False, ignore_index=True)
    top.insert(3, "pct", 100 * top["self_ms_per_call"] / profiled_ms if profiled_ms > 0 else 0.0)
    split = top.groupby("category")["self_ms_per_call"].sum()
    split[UNATTRIBUTED] = max(0.0, profiled_ms - float(split.sum()))
    total = float(split.sum())
    breakdown = pd.DataFrame({"category": split.index, "profiled_ms_per_call": split.to_numpy()})
    scale = median_ms / total if total > 0 else 0.0
    breakdown.insert(1, "ms_per_call", breakdown["profiled_ms_per_call"] * scale)
    breakdown.insert(2, "pct", 100 * breakdown["ms_per_call"] / median_ms if median_ms > 0 else 0.0)
    breakdown = breakdown.assign(median_ms=median_ms, profiled_ms=profiled_ms)
    return top.head(TOP_N), breakdown.sort_values("ms_per_call", ascending=False, ignore_index=True)


def write_tables(profiles: list[CaseProfile], out_dir: Path) -> tuple[Path, Path]:
    """top_ops.csv and breakdown.csv for all profiled cases."""
    tops, breakdowns = [], []
    for p in profiles:
        tops.append(p.top_ops.assign(impl=p.impl, workload=p.workload.label()))
        breakdowns.append(p.breakdown.assign(impl=p.impl, workload=p.workload.label()))
    top_path, breakdown_path = out_dir / "top_ops.csv", out_dir / "breakdown.csv"
    pd.concat(tops, ignore_index=True).to_csv(top_path, index=False)
    pd.concat(breakdowns, ignore_index=True).to_csv(breakdown_path, index=False)
    return top_path, breakdown_path


def side_by_side(profiles: list[CaseProfile]) -> str:
    """Each workload profiled with two contenders or more, its categories in one table: a row per category, a
    column per contender, ms per call scaled to that contender's median (the breakdowns above, read across), the
    medians last. Empty where no workload has two contenders."""
    by_workload: dict[str, list[CaseProfile]] = {}
    for profile in profiles:
        by_workload.setdefault(profile.workload.label(), []).append(profile)
    blocks = []
    for label, group in by_workload.items():
        if len({p.impl for p in group}) < 2:
            continue
        table = pd.DataFrame({p.impl: p.breakdown.set_index("category")["ms_per_call"] for p in group})
        table = table.loc[table.max(axis=1).sort_values(ascending=False).index]
        table.loc["median"] = [p.median_ms for p in group]
        cells = [["category", *table.columns]]
        cells += [
            [str(category), *("-" if pd.isna(v) else f"{v:.3g}" for v in row)] for category, row in table.iterrows()
        ]
        widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
        lines = [
            "  ".join(
                [line[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:], strict=True))]
            )
            for line in cells
        ]
        blocks.append(f"{label}: ms per call, each contender's breakdown scaled to its median\n" + "\n".join(lines))
    return "\n\n".join(blocks)
