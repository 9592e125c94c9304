"""A noise model from history: each case's between-run spread, as the results store has seen it.

A run's own repeats see what changes between its worker processes, but not what changes over minutes and
hours — the drift that makes two runs of identical code differ. The store has seen that: every earlier run
of the same case on the same machine. So ``compare --db STORE`` takes each case's floor from there:

* **series** — the case (``attnbench.results.CASE_COLUMNS``) on the new run's machine, its ok runs in the
  store in order of start time, the two compared runs left out; the last ``HISTORY_RUNS`` of them;
* **between-run σ** (log scale) — from successive differences, 1.4826 · median |y_{i+1} − y_i| / √2 with
  y = ln median_ms (as ``reports.changes`` estimates its series noise): robust to a real step in the
  series, which moves one difference only, and to one odd run;
* needs ``MIN_HISTORY_RUNS`` runs; a case with fewer keeps the floor of its own runs.

``compare`` then judges the change of the pair against the difference of two runs with that spread:
floor = e^{z · √2 · σ} − 1 with z the one-sided normal quantile at ``alpha`` (never below ``--threshold``
or the pair's own measured noise), and p = P(|Z| ≥ change / (√2 σ)) one-sided.

With ``--normalise yardstick`` the history is normalised too (``reports.normalise``), so the spread is
that of the quantity compared.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnbench.reports.normalise import normalise, references, ridge_from_meta
from attnbench.results import CASE_COLUMNS

HISTORY_RUNS = 20  # the newest stored runs of a case that its spread is taken from
MIN_HISTORY_RUNS = 5  # fewer than this and the case's floor is its own runs'


def case_key(row: dict[Any, Any], machine: Any) -> tuple[Any, ...]:
    """The case's columns (missing values as None) and the machine: how a compared row finds its series."""
    values = []
    for column in CASE_COLUMNS:
        value = row.get(column)
        missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
        values.append(None if missing else value.item() if isinstance(value, np.generic) else value)
    return (*values, None if machine is None else str(machine))


def between_run_sigma(medians: list[float]) -> float:
    """σ of ln(median) between runs from successive differences (module docstring); needs two runs."""
    logs = np.log(np.asarray(medians, dtype=float))
    return float(1.4826 * np.median(np.abs(np.diff(logs))) / math.sqrt(2))


def history_sigmas(
    history: pd.DataFrame, exclude: set[str], last: int = HISTORY_RUNS
) -> dict[tuple[Any, ...], tuple[float, int]]:
    """Case key (:func:`case_key`) → (between-run σ, runs it came from), for the cases with enough history.

    ``history`` has the case columns, ``machine``, ``run_id``, ``started_at`` and ``median_ms`` of ok rows."""
    kept = history[~history["run_id"].isin(exclude)].sort_values(["started_at", "run_id"], kind="stable")
    series: dict[tuple[Any, ...], list[float]] = {}
    for row in kept.to_dict("records"):
        median = row.get("median_ms")
        if median is not None and math.isfinite(float(median)) and float(median) > 0:
            series.setdefault(case_key(row, row.get("machine")), []).append(float(median))
    return {key: (between_run_sigma(values[-last:]), len(values[-last:]))
            for key, values in series.items() if len(values) >= MIN_HISTORY_RUNS}  # fmt: skip


def load_store_history(db: Path, normalised: bool) -> pd.DataFrame:
    """The store's ok rows as :func:`history_sigmas` reads them (normalised by the yardsticks when asked)."""
    from attnbench.reports.history import load_history
    from attnbench.reports.store import open_store

    with open_store(db, write=False) as con:
        frame = load_history(con, [], [])
        metas = dict(con.execute("SELECT run_id, meta_json FROM runs").fetchall())
    if not normalised or frame.empty:
        return frame
    parsed = {run: json.loads(text) if text else {} for run, text in metas.items()}
    ridge_of = lambda row: ridge_from_meta(parsed.get(row["run_id"], {}), str(row.get("dtype")))  # noqa: E731
    normalised_frame = normalise(frame, ridge_of, references(frame))
    return normalised_frame[normalised_frame["yardstick"].notna()]  # a raw time is not the same quantity
