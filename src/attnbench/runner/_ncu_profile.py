"""``attnbench profile --ncu``: per kernel of the profiled call, what Nsight Compute measures — achieved SM
throughput and DRAM throughput (% of peak), tensor-pipe utilisation and achieved occupancy — beside the
torch.profiler figures of the same kernels.

How: ncu must start the process it profiles, so each case runs again in a child interpreter under ncu
(:mod:`attnbench.runner._ncu_child`: same contender, workload and seed; checked and warmed up outside the profiled
range; ``calls`` calls inside it). Two ncu commands per case, both kept in the profile folder:

1. ``ncu --profile-from-start off --metrics … --export CASE.ncu-rep python -c …`` — collects only the
   kernels between the child's cudaProfilerStart and cudaProfilerStop; the report opens in Nsight Compute;
2. ``ncu --import CASE.ncu-rep --csv --page raw --print-units base --print-kernel-base demangled`` — one
   row per launch, saved as ``CASE.ncu.csv`` and read by :mod:`attnbench.runner._ncu_csv`.

ncu replays every kernel once per group of metrics, with its clocks locked to base and caches flushed
before each replay (``--clock-control base --cache-control all``, ncu's defaults, given explicitly): its
durations are of that setting, longer than the run's; the percentages are of the peak at that clock. Which
metrics exist depends on the GPU: ``ncu --query-metrics`` says, once per command (:func:`metrics_here`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from attnbench.contenders import registry
from attnbench.runner._ncu_child import BOOTSTRAP, FAILED, ChildCase
from attnbench.runner._ncu_csv import (
    COMMON_METRICS,
    NcuOutputError,
    base_name,
    choose_metrics,
    error_lines,
    parse_raw_csv,
    per_kernel,
)
from attnbench.runner._profiling import category
from attnbench.workload import Workload

NCU_TIMEOUT_S = 900.0  # one case under ncu: the child's start, check and warm-up, then every kernel replayed
QUERY_TIMEOUT_S = 60.0
NCU_COLUMNS = ["ncu_ms_per_call", "sm_pct", "dram_pct", "tensor_pct", "tensor_pipe", "occupancy_pct"]
JOINED_COLUMNS = [
    "kernel",
    "launches_per_call",
    "ncu_ms_per_call",
    "profiler_ms_per_call",
    "category",
    "sm_pct",
    "dram_pct",
    "tensor_pct",
    "tensor_pipe",
    "occupancy_pct",
    "name",
    "profiler_name",
]


class NcuError(RuntimeError):
    """ncu could not profile a case; the message is one line saying why."""


def unavailable_reason(ncu: str | None, cuda: bool) -> str | None:
    """Why ``--ncu`` cannot be done on this machine (None when it can): ncu must be on PATH, and CUDA here."""
    if ncu is None:
        return "--ncu needs Nsight Compute's ncu on PATH (not found)"
    if not cuda:
        return "--ncu needs CUDA (torch.cuda.is_available() is False on this machine)"
    return None


def find_ncu() -> str | None:
    return shutil.which("ncu")


def metrics_here(ncu: str) -> tuple[str, ...]:
    """The metrics to ask for on this machine's GPU (:func:`attnbench.runner._ncu_csv.choose_metrics` of ``ncu
    --query-metrics``); the common set when the query fails."""
    try:
        done = subprocess.run(
            [ncu, "--query-metrics"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=QUERY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return COMMON_METRICS
    return choose_metrics(done.stdout) if done.returncode == 0 else COMMON_METRICS


def child_command(case: ChildCase) -> list[str]:
    path = [os.fspath(p) for p in sys.path if isinstance(p, str | os.PathLike)]
    return [sys.executable, "-c", BOOTSTRAP, json.dumps(path), case.to_json()]


def profile_command(ncu: str, metrics: tuple[str, ...], report: Path, child: list[str]) -> list[str]:
    """ncu collecting ``metrics`` of the kernels in the child's profiled range into ``report``."""
    return [
        ncu,
        "--profile-from-start",
        "off",
        "--target-processes",
        "all",
        "--replay-mode",
        "kernel",
        "--clock-control",
        "base",
        "--cache-control",
        "all",
        "--metrics",
        ",".join(metrics),
        "--export",
        str(report),
        "--force-overwrite",
        *child,
    ]


def import_command(ncu: str, report: Path) -> list[str]:
    """ncu printing ``report``'s raw page as CSV: one row per launch, base units, full demangled names."""
    return [
        ncu,
        "--import",
        str(report),
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--print-kernel-base",
        "demangled",
    ]


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in its own process group, which is killed whole (ncu and the child) past the limit."""
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise NcuError(
                f"ncu gave no result within {timeout_s:g} s; it and the profiled process were killed"
            ) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def failure_reason(output: str, code: int) -> str:
    """One line from a failed ncu run: the child's own reason, else ncu's first error, else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(FAILED):
            return line[len(FAILED) :]
    errors = error_lines(output)
    if errors:
        return errors[0]
    others = [line for line in lines if not line.startswith("==PROF==")]
    return f"exit code {code}" + (f": {others[-1]}" if others else "")


@dataclasses.dataclass(frozen=True)
class NcuProfile:
    impl: str
    workload: Workload
    calls: int  # calls in the profiled range
    kernels: pd.DataFrame  # JOINED_COLUMNS, per call
    report_path: Path
    csv_path: Path


def profile_case(
    ncu: str,
    metrics: tuple[str, ...],
    impl: str,
    workload: Workload,
    out_dir: Path,
    stem: str,
    calls: int,
    seed: int,
    profiler_kernels: pd.DataFrame,
) -> NcuProfile:
    """Run the case under ncu, read its raw page and join it with torch.profiler's ``profiler_kernels``
    (:func:`attnbench.runner._profiling.device_kernels` of the same case). Raises :class:`NcuError`."""
    references, problems = registry.in_process_references()
    if impl in problems:
        raise NcuError(f"{impl} is registered in-process and {problems[impl]}: the process ncu starts cannot make it")
    report, csv_path = out_dir / f"{stem}.ncu-rep", out_dir / f"{stem}.ncu.csv"
    child = child_command(ChildCase(impl, dataclasses.asdict(workload), seed, calls, tuple(references.values())))
    done = _run(profile_command(ncu, metrics, report, child), NCU_TIMEOUT_S)
    output = done.stderr + "\n" + done.stdout
    if done.returncode != 0 or not report.is_file() or FAILED in output or error_lines(output):
        raise NcuError(failure_reason(output, done.returncode))
    imported = _run(import_command(ncu, report), QUERY_TIMEOUT_S)
    if imported.returncode != 0:
        why = failure_reason(imported.stderr + imported.stdout, imported.returncode)
        raise NcuError(f"ncu --import {report.name}: {why}")
    csv_path.write_text(imported.stdout)
    try:
        launches = parse_raw_csv(imported.stdout)
    except NcuOutputError as exc:
        raise NcuError(f"{csv_path.name}: {exc}") from None
    if launches.empty:
        raise NcuError(f"ncu recorded no kernel launch in the profiled range ({report.name})")
    kernels = join_kernels(per_kernel(launches), profiler_kernels, calls)
    return NcuProfile(impl, workload, calls, kernels, report, csv_path)


# --- joining with torch.profiler ------------------------------------------------------------------------


def match_names(ncu_names: list[str], profiler_names: list[str]) -> dict[str, str]:
    """{ncu kernel name: torch.profiler kernel name}: the same name; else the same once spaces are dropped
    (two demanglers); else the same function name (:func:`attnbench.runner._ncu_csv.base_name`) where exactly one
    kernel on each side has it."""
    matched: dict[str, str] = {}
    left = list(profiler_names)

    def pair(key: Callable[[str], str]) -> None:
        for name in ncu_names:
            if name in matched:
                continue
            candidates = [p for p in left if key(p) == key(name)]
            rivals = [n for n in ncu_names if n not in matched and key(n) == key(name)]
            if len(candidates) == 1 and len(rivals) == 1:
                matched[name] = candidates[0]
                left.remove(candidates[0])

    pair(lambda n: n)
    pair(lambda n: "".join(n.split()))
    pair(base_name)
    return matched


def join_kernels(kernels: pd.DataFrame, profiler_kernels: pd.DataFrame, calls: int) -> pd.DataFrame:
    """ncu's kernels (:func:`attnbench.runner._ncu_csv.per_kernel`) per call, with torch.profiler's time for the same
    kernel in the same case (NaN where it has none) and the kernel's category (as in the breakdown)."""
    names = match_names(list(kernels["name"]), list(profiler_kernels["kernel"]))
    profiler_ms = dict(zip(profiler_kernels["kernel"], profiler_kernels["ms_per_call"], strict=True))
    joined = kernels.assign(
        launches_per_call=kernels["launches"] / calls,
        ncu_ms_per_call=kernels["time_ms"] / calls,
        profiler_name=[names.get(n, "") for n in kernels["name"]],
        profiler_ms_per_call=[profiler_ms[names[n]] if n in names else math.nan for n in kernels["name"]],
        category=[category(n) for n in kernels["name"]],
    )
    return joined[JOINED_COLUMNS]


def annotate_top_ops(top_ops: pd.DataFrame, joined: pd.DataFrame) -> pd.DataFrame:
    """The torch.profiler top-operator table with ncu's figures on the rows that are kernels ncu profiled."""
    by_op = joined[joined["profiler_name"] != ""].set_index("profiler_name")[NCU_COLUMNS]
    return top_ops.join(by_op, on="op")


def annotate_breakdown(breakdown: pd.DataFrame, joined: pd.DataFrame) -> pd.DataFrame:
    """The breakdown with ncu's figures per category: its kernels' ncu time per call, and each percentage
    weighted by that time (empty for the categories that are no kernel: overhead, unattributed)."""
    records = []
    for name, group in joined.groupby("category"):
        weights = group["ncu_ms_per_call"].fillna(0.0)
        figures = {"category": name, "ncu_ms_per_call": float(weights.sum())}
        for column in ("sm_pct", "dram_pct", "tensor_pct", "occupancy_pct"):
            present = group[column].notna() & (weights > 0)
            figures[column] = (
                float((group[column][present] * weights[present]).sum() / weights[present].sum())
                if present.any()
                else math.nan
            )
        records.append(figures)
    by_category = pd.DataFrame(
        records, columns=["category", "ncu_ms_per_call", "sm_pct", "dram_pct", "tensor_pct", "occupancy_pct"]
    ).set_index("category")
    return breakdown.join(by_category, on="category")


def format_table(result: NcuProfile) -> str:
    """The printed per-kernel table: per call, ncu's figures beside torch.profiler's time."""
    shown = result.kernels.drop(columns=["name", "profiler_name"]).rename(
        columns={
            "launches_per_call": "launches",
            "ncu_ms_per_call": "ncu_ms",
            "profiler_ms_per_call": "profiler_ms",
            "sm_pct": "SM_%",
            "dram_pct": "DRAM_%",
            "tensor_pct": "tensor_%",
            "tensor_pipe": "pipe",
            "occupancy_pct": "occupancy_%",
        }
    )
    for column, form in (
        ("ncu_ms", ".4g"),
        ("profiler_ms", ".4g"),
        ("launches", "g"),
        ("SM_%", ".1f"),
        ("DRAM_%", ".1f"),
        ("tensor_%", ".1f"),
        ("occupancy_%", ".1f"),
    ):
        shown[column] = shown[column].map(lambda v, form=form: "" if pd.isna(v) else format(v, form))
    head = (
        f"ncu, per kernel per call ({result.calls} calls; ncu_ms at base clocks with caches flushed, "
        f"profiler_ms as torch.profiler timed it; % of peak): {result.report_path}"
    )
    return head + "\n" + shown.to_string(index=False)


def write_kernels(results: list[NcuProfile], out_dir: Path) -> Path:
    """ncu_kernels.csv: every kernel ncu profiled, per case, with its torch.profiler time and category."""
    path = out_dir / "ncu_kernels.csv"
    frames = [r.kernels.assign(impl=r.impl, workload=r.workload.label(), calls=r.calls) for r in results]
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)
    return path
