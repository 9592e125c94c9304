"""Reading Nsight Compute's raw page: the metrics ``attnbench profile --ncu`` asks for, one row per kernel
launch parsed from ``ncu --import REPORT --csv --page raw``, launches summed per kernel, names shortened.

The raw page is one header row (``"ID","Process ID","Process Name","Host Name","Kernel Name",…`` and then
one column per metric), a units row (empty under the identification columns, ``%``, ``nsecond`` … under the
metrics) and one row per launch. Numbers carry thousands separators (``"1,234.5"``); a metric ncu could not
give is ``n/a`` or empty. ncu's own ``==PROF==`` / ``==WARNING==`` / ``==ERROR==`` lines may be mixed in.

Per kernel (every launch of one demangled name): the time is the sum of the launches' durations, each
percentage the time-weighted mean of the launches that report it.
"""

from __future__ import annotations

import csv
import math
import re

import pandas as pd

DURATION = "gpu__time_duration.sum"
# Each figure shown and the metrics that may give it, in order of preference: the first one a launch reports.
SM = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
DRAM = ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")
OCCUPANCY = ("sm__warps_active.avg.pct_of_peak_sustained_active",)
# The tensor pipe: mma.sync (hmma; Volta to Hopper), Hopper's warpgroup wgmma (gmma), and the whole MMA pipe
# where the GPU has that counter. A launch shows the busiest one reported, and says which.
TENSOR = {
    "hmma": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "gmma": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "mma": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
}
PERCENTS = {"sm_pct": SM, "dram_pct": DRAM, "occupancy_pct": OCCUPANCY}
METRICS = (DURATION, *SM, *DRAM, *TENSOR.values(), *OCCUPANCY)
# What every GPU from Volta to Hopper has: asked for when ncu cannot say which metrics this GPU has.
COMMON_METRICS = (DURATION, SM[0], DRAM[0], TENSOR["hmma"], OCCUPANCY[0])
TIME_UNITS_MS = {
    "nsecond": 1e-6,
    "ns": 1e-6,
    "usecond": 1e-3,
    "us": 1e-3,
    "msecond": 1.0,
    "ms": 1.0,
    "second": 1e3,
    "s": 1e3,
}
LAUNCH_COLUMNS = ["id", "name", "time_ms", "sm_pct", "dram_pct", "tensor_pct", "tensor_pipe", "occupancy_pct"]
KERNEL_COLUMNS = [
    "kernel",
    "launches",
    "time_ms",
    "sm_pct",
    "dram_pct",
    "tensor_pct",
    "tensor_pipe",
    "occupancy_pct",
    "name",
]
SHORT_NAME_CHARS = 80


class NcuOutputError(ValueError):
    """ncu's output is not the raw page this module reads (the message says what is wrong, in one line)."""


def metric_base(metric: str) -> str:
    """``sm__throughput.avg.pct_of_peak_sustained_elapsed`` → ``sm__throughput`` (what --query-metrics lists)."""
    return metric.split(".", 1)[0]


def choose_metrics(query_output: str) -> tuple[str, ...]:
    """The metrics of :data:`METRICS` whose base name ``ncu --query-metrics`` lists for this GPU; the
    :data:`COMMON_METRICS` when its output names none of them (an older ncu, another layout, an error)."""
    listed = set(re.findall(r"\b[a-z0-9]+__[a-z0-9_]+\b", query_output))
    chosen = tuple(m for m in METRICS if metric_base(m) in listed)
    return chosen if DURATION in chosen else COMMON_METRICS


def number(text: str) -> float:
    """A metric value as ncu prints it: ``"1,234.5"`` → 1234.5; ``n/a``, empty or anything else → NaN."""
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return math.nan


def error_lines(text: str) -> list[str]:
    """ncu's ``==ERROR==`` lines, stripped."""
    return [line.strip() for line in text.splitlines() if line.lstrip().startswith("==ERROR==")]


def _header(rows: list[list[str]], text: str) -> int:
    for index, row in enumerate(rows):
        if "ID" in row and "Kernel Name" in row:
            return index
    errors = error_lines(text)
    why = f": {errors[0]}" if errors else ""
    raise NcuOutputError(f"no raw-page header ('ID', …, 'Kernel Name') in ncu's CSV{why}")


def _first(row: dict[str, str], metrics: tuple[str, ...]) -> float:
    for metric in metrics:
        value = number(row.get(metric, ""))
        if not math.isnan(value):
            return value
    return math.nan


def _tensor(row: dict[str, str]) -> tuple[float, str]:
    """The busiest tensor pipe a launch reports, and which (hmma, gmma, mma); (NaN, '') when none."""
    best, pipe = math.nan, ""
    for name, metric in TENSOR.items():
        value = number(row.get(metric, ""))
        if not math.isnan(value) and (math.isnan(best) or value > best):
            best, pipe = value, name
    return best, pipe


def parse_raw_csv(text: str) -> pd.DataFrame:
    """One row per kernel launch (:data:`LAUNCH_COLUMNS`; ``name`` is the kernel's name as ncu printed it,
    ``time_ms`` its duration). Raises :class:`NcuOutputError` without a header or with a time unit it does
    not know."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("==")]
    rows = list(csv.reader(lines))
    at = _header(rows, text)
    header, body = rows[at], rows[at + 1 :]
    id_column = header.index("ID")
    units: dict[str, str] = {}
    if body and len(body[0]) == len(header) and not body[0][id_column].strip():
        units, body = dict(zip(header, body[0], strict=True)), body[1:]
    unit = units.get(DURATION, "").strip() or "nsecond"  # --print-units base: nanoseconds
    if DURATION in header and unit not in TIME_UNITS_MS:
        raise NcuOutputError(f"{DURATION} in unit {unit!r}; known: {', '.join(TIME_UNITS_MS)}")
    records = []
    for values in body:
        if len(values) != len(header) or not values[id_column].strip().isdigit():
            continue  # a line that is not a launch (the application's own output, a wrapped message)
        row = dict(zip(header, values, strict=True))
        tensor, pipe = _tensor(row)
        records.append(
            {
                "id": int(row["ID"]),
                "name": row["Kernel Name"].strip(),
                "time_ms": number(row.get(DURATION, "")) * TIME_UNITS_MS[unit],
                **{column: _first(row, metrics) for column, metrics in PERCENTS.items()},
                "tensor_pct": tensor,
                "tensor_pipe": pipe,
            }
        )
    return pd.DataFrame(records, columns=LAUNCH_COLUMNS)


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    """Time-weighted mean of the values present; the plain mean when no launch has a duration."""
    present = values.notna()
    if not present.any():
        return math.nan
    w = weights[present].fillna(0.0)
    if w.sum() <= 0:
        return float(values[present].mean())
    return float((values[present] * w).sum() / w.sum())


def per_kernel(launches: pd.DataFrame) -> pd.DataFrame:
    """Launches summed per kernel name (:data:`KERNEL_COLUMNS`), the longest first: ``launches`` and
    ``time_ms`` summed, each percentage the time-weighted mean, ``tensor_pipe`` the pipes that gave the
    tensor figure (``hmma+gmma`` when launches differ), ``kernel`` the shortened name."""
    records = []
    for name, group in launches.groupby("name", sort=False):
        pipes = sorted({p for p in group["tensor_pipe"] if p})
        records.append(
            {
                "name": name,
                "launches": len(group),
                "time_ms": float(group["time_ms"].sum(min_count=1)),
                **{
                    c: _weighted(group[c], group["time_ms"])
                    for c in ("sm_pct", "dram_pct", "tensor_pct", "occupancy_pct")
                },
                "tensor_pipe": "+".join(pipes),
            }
        )
    frame = pd.DataFrame(records, columns=[c for c in KERNEL_COLUMNS if c != "kernel"])
    frame = frame.sort_values("time_ms", ascending=False, ignore_index=True, na_position="last")
    frame.insert(0, "kernel", short_names(list(frame["name"])))
    return frame[KERNEL_COLUMNS]


# --- kernel names ---------------------------------------------------------------------------------------

_OPEN, _CLOSE = "<([", ">)]"
_QUALIFIER = re.compile(r"(?:\(anonymous namespace\)::|[A-Za-z_]\w*::)+")


def _split_top(text: str) -> tuple[str, str]:
    """(head, template) where template is the first top-level ``<…>`` of ``text`` (empty if none)."""
    depth, start = 0, -1
    for i, char in enumerate(text):
        if char in _OPEN:
            if char == "<" and depth == 0:
                start = i
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth == 0 and start >= 0 and char == ">":
                return text[:start], text[start : i + 1]
    return (text, "") if start < 0 else (text[:start], text[start:])


def _drop_parameters(name: str) -> str:
    """Without the trailing parameter list ``(…)`` of a demangled name."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        if name[i] in _CLOSE:
            depth += 1
        elif name[i] in _OPEN:
            depth -= 1
            if depth == 0:
                return name[:i] if i > 0 else name
    return name


def base_name(name: str) -> str:
    """The function's own name: no return type, namespaces, template arguments or parameters
    (``void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*)`` → ``cunn_SoftMaxForward``)."""
    head, _ = _split_top(_drop_parameters(name.strip()))
    head = _QUALIFIER.sub("", head).strip()
    return head.split()[-1] if head.split() else name.strip()


def short_name(name: str, limit: int = SHORT_NAME_CHARS) -> str:
    """The base name with its template arguments, their namespaces dropped, cut to ``limit`` characters:
    ``flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, half_t, …``."""
    _, template = _split_top(_drop_parameters(name.strip()))
    text = base_name(name) + _QUALIFIER.sub("", template)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_names(names: list[str]) -> list[str]:
    """:func:`short_name` of each; names that come out alike get `` #2``, `` #3`` … after the first."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        short = short_name(name)
        seen[short] = seen.get(short, 0) + 1
        out.append(short if seen[short] == 1 else f"{short} #{seen[short]}")
    return out
