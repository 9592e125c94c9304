"""`attnbench profile`: where the time goes, per contender.

For each case: prepare and check as a run does, warm up, then record a few calls with torch.profiler.
Writes a Chrome/Perfetto trace per case, a table of the top operators (or kernels, on CUDA) by self
time, and a breakdown of the time into matmul / softmax / copies / fused attention / other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.measure import call_once_ms, synchronize
from attnbench.memory import quiet_native_stderr
from attnbench.runner import prepare_checked
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


def category(op_name: str) -> str:
    for name, pattern in CATEGORIES:
        if pattern.search(op_name):
            return name
    return "other"


@dataclass(frozen=True)
class CaseProfile:
    impl: str
    workload: Workload
    calls: int  # calls recorded
    trace_path: Path
    top_ops: pd.DataFrame  # op, self_ms_per_call, count_per_call, pct
    breakdown: pd.DataFrame  # category, ms_per_call, pct


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def profile_case(impl: str, workload: Workload, out_dir: Path, calls: int = 5, seed: int = 0) -> CaseProfile:
    """Profile ``calls`` calls of a checked case; write its trace into ``out_dir``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    prepared = prepare_checked(impl, workload, seed)
    if not prepared.check.ok:
        raise RuntimeError(f"{impl} is incorrect on {workload.label()}: {prepared.check.reason}")
    for _ in range(2):
        prepared.fn()
    call_ms, _ = call_once_ms(prepared.fn, workload.device)
    calls = max(1, min(calls, int(PROFILE_SECONDS * 1e3 / max(call_ms, 1e-3))))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if workload.device == "cuda" else [])
    with quiet_native_stderr(), profile(activities=activities) as prof:
        for _ in range(calls):
            with record_function(f"attnbench::{impl}"):
                prepared.fn()
            synchronize(workload.device)
    trace_path = out_dir / f"{_slug(impl)}__{_slug(workload.label())}.trace.json"
    prof.export_chrome_trace(str(trace_path))
    top, breakdown = _tables(prof.key_averages(), workload.device, calls)
    return CaseProfile(impl, workload, calls, trace_path, top, breakdown)


def _tables(averages: list, device: str, calls: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Self time per operator (kernel time on CUDA), per call, ranked; and its split by category."""
    on_gpu = device == "cuda"
    records = []
    for event in averages:
        if event.key.startswith("attnbench::") or event.key.startswith("ProfilerStep"):
            continue
        self_us = getattr(event, "self_device_time_total", 0.0) if on_gpu else event.self_cpu_time_total
        if self_us > 0:
            records.append({"op": event.key, "self_ms_per_call": self_us / 1e3 / calls,
                            "count_per_call": event.count / calls})  # fmt: skip
    top = pd.DataFrame(records, columns=["op", "self_ms_per_call", "count_per_call"])
    top = top.sort_values("self_ms_per_call", ascending=False, ignore_index=True)
    total = top["self_ms_per_call"].sum()
    top["pct"] = 100 * top["self_ms_per_call"] / total if total > 0 else 0.0
    top["category"] = top["op"].map(category)
    breakdown = top.groupby("category", as_index=False)[["self_ms_per_call", "pct"]].sum()
    breakdown = breakdown.rename(columns={"self_ms_per_call": "ms_per_call"})
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
