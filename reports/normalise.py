"""Times normalised by the yardstick that matches each case's place on the roofline (``--normalise yardstick``).

Every row of a CPU run keeps the rates its rounds measured for the two yardsticks (``attnbench.measure._yardsticks``):
``yardstick_fma_gflops`` and ``yardstick_stream_gbps``. A minute when the machine runs a kernel 10 % slower
runs the yardstick ~10 % slower too, so time × rate is the machine's speed divided out.

* **which yardstick** — a case whose arithmetic intensity (``intensity``, FLOP per byte of minimum traffic)
  is at or beyond the machine's **ridge point** is compute-bound: the FMA rate; below it memory-bound: the
  stream rate. The ridge is the hardware roof's (``roof_tflops[dtype] / roof_gbps`` of the run's ceilings
  in meta.json), else the row's own yardsticks' (fma_gflops / stream_gbps).
* **normalised time** — t × r / R: r the row's rate, R a reference rate (the median of that yardstick over
  the rows normalised together, per machine), so the figures stay in milliseconds at the reference speed.
  With ``repeat_medians_ms`` and the per-repeat rates beside them, each repeat's median is normalised by
  its own repeat's rate (each repeat ran in its own worker process, at its own minute); the row's median
  is then the median of those. Samples and IQR are scaled by the row's factor.
* A row without the rates (an older run, a GPU row, a machine where the kernels can't be built) is left
  raw; its ``yardstick`` column is empty.

So new/base normalised = (t_new · r_new) / (t_base · r_base): the raw ratio times r_new / r_base.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from attnbench.runner.results import REPEAT_YARDSTICK_COLUMNS, YARDSTICK_COLUMNS

SHORT = {"fma_gflops": "fma", "stream_gbps": "stream"}

RidgeOf = Callable[[dict[Any, Any]], float | None]  # a row → the ridge point (FLOP/byte) of its run, if known


def ridge_from_meta(meta: dict[Any, Any], dtype: str) -> float | None:
    """The hardware roof's ridge point (FLOP/byte) for ``dtype`` from a run's meta.json ceilings (CPU)."""
    ceilings = (meta.get("ceilings") or {}).get("cpu") or {}
    peak, gbps = (ceilings.get("roof_tflops") or {}).get(dtype), ceilings.get("roof_gbps")
    if not peak or not gbps:
        return None
    return float(peak) * 1e12 / (float(gbps) * 1e9)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def yardstick_of(row: dict[Any, Any], ridge: float | None) -> str | None:
    """``fma_gflops`` (compute-bound) or ``stream_gbps`` (memory-bound) for a row, None without rates."""
    fma, stream = (_number(row.get(column)) for column in YARDSTICK_COLUMNS.values())
    intensity = _number(row.get("intensity"))
    if fma is None or stream is None or intensity is None:
        return None
    ridge = ridge if ridge is not None else fma / stream
    return "fma_gflops" if intensity >= ridge else "stream_gbps"


def references(frame: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(machine, yardstick) → the median rate over the frame's rows: the R of every normalised time."""
    found = {}
    machines = frame["machine"] if "machine" in frame else pd.Series("", index=frame.index)
    for name, column in YARDSTICK_COLUMNS.items():
        if column not in frame:
            continue
        rates = pd.to_numeric(frame[column], errors="coerce")
        for machine, values in rates.groupby(machines.fillna("")):
            values = values[values > 0].dropna()
            if len(values):
                found[(str(machine), name)] = float(values.median())
    return found


def _listed(value: Any) -> list[float] | None:
    if value is None or isinstance(value, float | str):
        return None
    numbers = [_number(v) for v in value]
    return None if any(v is None for v in numbers) else [float(v) for v in numbers if v is not None]


def normalise_row(row: dict[Any, Any], ridge: float | None, reference: dict[tuple[str, str], float]) -> dict[Any, Any]:
    """The row with its times normalised (module docstring) and ``yardstick`` naming the one used, or unchanged
    with ``yardstick`` None."""
    row = {**row, "yardstick": None}
    name = yardstick_of(row, ridge)
    reference_rate = reference.get((str(row.get("machine") or ""), name or ""))
    if row.get("status", "ok") != "ok" or name is None or reference_rate is None:
        return row
    factor = float(row[YARDSTICK_COLUMNS[name]]) / reference_rate
    repeats, rates = _listed(row.get("repeat_medians_ms")), _listed(row.get(REPEAT_YARDSTICK_COLUMNS[name]))
    if repeats and rates and len(repeats) == len(rates):
        scaled = [t * r / reference_rate for t, r in zip(repeats, rates, strict=True)]
        row["repeat_medians_ms"], row["median_ms"] = scaled, float(np.median(scaled))
    else:
        row["median_ms"] = float(row["median_ms"]) * factor
    samples = _listed(row.get("samples_ms"))
    if samples:
        row["samples_ms"] = [s * factor for s in samples]
    if _number(row.get("iqr_ms")) is not None:
        row["iqr_ms"] = float(row["iqr_ms"]) * factor
    row["yardstick"] = SHORT[name]
    return row


def normalise(frame: pd.DataFrame, ridge_of: RidgeOf, reference: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Every row through :func:`normalise_row` (index and columns kept, ``yardstick`` added)."""
    rows = [normalise_row(row, ridge_of(row), reference) for row in frame.to_dict("records")]
    out = pd.DataFrame(rows, index=frame.index)
    return out.reindex(columns=[*frame.columns, *(["yardstick"] if "yardstick" not in frame else [])])
