"""Repeats across processes: ``attnbench run --repeat N`` runs every case N times, each time in a fresh
worker process, the passes spread over the run (pyperf's way of seeing between-process variance).

The samples of one process see only the noise of that process; what changes between processes (memory
layout, the allocator's history, the machine's speed minutes later) shows only between them. So a row keeps
its per-repeat medians (``repeat_medians_ms``), its ``median_ms`` is their median, and its own within-run
noise estimate (``iqr_ms``, the median of the repeats' IQRs) stays beside them. ``compare`` decides from the
per-repeat medians when both runs have them.

Each repeat's row goes to ``repeats.jsonl`` as it finishes, so an interrupted run resumes with the repeats it
already has; the merged row goes to ``rows.jsonl`` when a case has all of them.
"""

from __future__ import annotations

import statistics
from typing import Any

from attnbench.runner.results import REPEAT_YARDSTICK_COLUMNS, YARDSTICK_COLUMNS

DECIDED_ONCE = ("unavailable", "unsupported", "skipped")  # no measurement: the same in every process
RATE_COLUMNS = ("tflops", "gbps", "pct_of_peak", "pct_of_matmul")  # ∝ 1 / median_ms


def merge_repeats(rows: list[dict[str, Any]], repeats: int | None = None) -> dict[str, Any]:
    """One row from the rows of one case's repeats (in the order they ran), of ``repeats`` asked for (default:
    as many as given; fewer when one was not ok and the case ended there).

    All ok: ``median_ms`` is the median of the repeats' medians and rates follow it; samples are pooled;
    the worst error and the largest memory are kept. Any repeat not ok: that repeat's row, its reason
    saying which repeat it was (the first too) — a case that failed once is not ``ok``."""
    repeats = repeats or len(rows)
    if repeats == 1:
        ok = rows[0]["status"] == "ok"
        return {**rows[0], "repeat_medians_ms": [rows[0]["median_ms"]] if ok else None, **_repeat_yardsticks(rows)}
    for number, row in enumerate(rows, start=1):
        if row["status"] != "ok":
            return {**row, "reason": f"repeat {number} of {repeats}: {row['reason']}", "repeat_medians_ms": None}
    merged, _ = pool_processes(rows, [float(row["median_ms"]) for row in rows])
    merged.update(
        iqr_ms=statistics.median(float(row["iqr_ms"]) for row in rows),
        n_samples=sum(int(row["n_samples"]) for row in rows),
        rounds=sum(int(row.get("rounds") or 0) for row in rows),
        unstable=any(bool(row.get("unstable")) for row in rows),
        first_call_ms=rows[0].get("first_call_ms"),
        setup_ms=rows[0].get("setup_ms"),
        choice=" | ".join(dict.fromkeys(str(row["choice"]) for row in rows if row.get("choice"))) or None,
    )
    merged.update(_repeat_yardsticks(rows))
    return merged


def _known(value: Any) -> bool:
    return value is not None and value == value  # a missing figure: None, or NaN from a frame's record


def listed(value: Any) -> list[float]:
    """A list column's value (``samples_ms``, ``repeat_medians_ms``) as floats; [] where empty (None or NaN)."""
    return [float(v) for v in value] if value is not None and not isinstance(value, float) else []


def pool_processes(rows: list[dict[str, Any]], medians: list[float]) -> tuple[dict[str, Any], float]:
    """One row for ok rows of one case from several processes, ``medians`` the processes' medians: the row
    nearest their median, with ``median_ms`` that median and ``repeat_medians_ms`` them, the samples pooled, the
    rates following the median, the worst error and the largest memory; and the scale (the middle row's median
    over the pooled one) other figures of one call follow. ``merge_repeats`` pools a run's repeats with it, and
    attnbench.reports.pooled several runs' rows."""
    median = statistics.median(medians)
    middle = min(rows, key=lambda row: abs(float(row["median_ms"]) - median))
    merged = dict(middle)
    merged.update(
        median_ms=median,
        repeat_medians_ms=medians,
        samples_ms=[s for row in rows for s in listed(row.get("samples_ms"))],
    )
    for column in ("max_abs_err", "rms_err", "grad_err", "peak_mem_mb"):
        values = [float(row[column]) for row in rows if _known(row.get(column))]
        merged[column] = max(values) if values else None
    scale = float(middle["median_ms"]) / median
    for column in RATE_COLUMNS:
        if _known(merged.get(column)):
            merged[column] = float(merged[column]) * scale
    return merged, scale


def _repeat_yardsticks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per yardstick: its rate in each repeat (beside ``repeat_medians_ms``, in the same order) and their
    median; both empty unless every repeat is ok and has the rate."""
    merged: dict[str, Any] = {}
    for name, column in YARDSTICK_COLUMNS.items():
        rates = [row.get(column) for row in rows]
        whole = all(row["status"] == "ok" for row in rows) and all(rate is not None for rate in rates)
        numbers = [float(rate) for rate in rates if rate is not None]
        merged[REPEAT_YARDSTICK_COLUMNS[name]] = numbers if whole else None
        merged[column] = statistics.median(numbers) if whole else None
    return merged
