"""A noise model from history: how far a case's relative change moves between two runs of the same code.

A run's own repeats see what changes between its worker processes, but not what changes over minutes and
hours — the drift that makes two runs of identical code differ. The store has seen that: every earlier run
of the same case on the same machine. So ``compare --db STORE`` takes each case's floor from there, as a
prediction interval for the one quantity ``compare`` decides on:

* **series** — the case (``attnbench.runner.results.CASE_COLUMNS``) on one machine, its ok runs in the store in
  order of start time, the runs being compared left out (``exclude``); the last ``HISTORY_RUNS`` of them;
  ``MIN_HISTORY_RUNS`` at least.
* **successive differences** — for each two successive runs a, b of the series, the case's relative change
  d = ln(median_b / median_a) − shift_ab, its workload's machine drift divided out exactly as ``compare``
  does for the pair it compares (reports.drift): draws of the very statistic ``compare`` tests, from pairs
  of runs of the same code.
* **spread** s — the root mean square of those differences (zero mean: the same code), *not* a robust
  scale. The calibration's false alarms came from rare large moves — a contender whose worker processes
  now and then run in a slow mode (sdpa_flash on the 2-core VM: +7 % at S 1024, +19 % at S 512), so a run's
  median of three repeats sometimes lands there — which a median-based scale (the σ from the median
  successive difference used before) ignores by design, so its floors were too low exactly where it
  mattered. One difference is left out: the largest, since a real step in the series moves exactly one
  successive difference (an outlier run moves two, so it still counts); the mean square of the other j =
  k − 1 is divided by c_k, the share of the mean square that the k − 1 smallest of k successive differences
  of steady Gaussian noise keep (:func:`trim_factor`), so s is unbiased for steady noise.
* **degrees of freedom** ν = 2j² / (3j − 1) (Satterthwaite: successive differences share a run, correlation
  −½), so a short history gives a wide interval rather than a confident wrong one.
* **floor** = e^{t · s} − 1 with t the 1 − α/2 quantile of Student's t with ν degrees of freedom — the
  prediction interval of the relative change of a new pair of runs of the same code, two-sided because
  ``faster`` and ``slower`` are both alarms; p = 2 · P(T_ν ≥ |relative change| / s) (reports.compare).
* **pooled** — a case the store holds in fewer than ``MIN_HISTORY_RUNS`` runs takes the pooled spread of
  the cases of the same contender, device, dtype and pass on the same machine and the same side of the
  roofline (compute- or memory-bound by its own yardstick rates, when it has them) that have enough:
  s² = Σ ν_i s_i² / Σ ν_i with ν the mean ν_i (those cases come from the same runs, so their degrees of
  freedom do not add; ``MIN_POOLED_CASES`` at least). Without them, the case keeps the floor of its own runs.

**Leave-out.** The floor of a pair must not come from that pair's runs (a run compared against a floor it
helped estimate looks less extreme than it is): ``compare --db`` leaves the two compared runs out of the
store's history (reports.compare.load_for_compare), and the calibration does the same for every pair it
compares (reports.calibrate_runs.run_vs_run) — history from the other runs only.

With ``--normalise yardstick`` the history is normalised too (``reports.normalise``), so the spread is
that of the quantity compared.
"""

from __future__ import annotations

import functools
import json
import math
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from attnbench.reports.drift import workload_shifts
from attnbench.reports.normalise import normalise, references, ridge_from_meta, yardstick_of
from attnbench.runner.results import CASE_COLUMNS

HISTORY_RUNS = 20  # the newest stored runs of a case that its spread is taken from
MIN_HISTORY_RUNS = 5  # fewer than this and the case's floor is pooled (or its own runs')
POOLED = "pooled"  # first item of the key of a pooled spread (:func:`regime_key`)
MIN_POOLED_CASES = 2  # a pooled spread needs this many cases with history of their own
TRIM_DRAWS = 50_000  # simulated series behind each trim_factor (fixed seed: the same number every time)


class HistoryNoise(NamedTuple):
    """What history says about one case: the spread of its relative change between two runs (log scale),
    the runs it came from, its degrees of freedom, and over how many cases it was pooled (0: its own)."""

    spread: float
    runs: int
    df: float
    pooled: int = 0

    @property
    def source(self) -> str:
        """The ``floor_source`` of compare's table."""
        return f"history (pooled, {self.pooled} cases)" if self.pooled else f"history ({self.runs} runs)"


def case_key(row: dict[Any, Any], machine: Any) -> tuple[Any, ...]:
    """The case's columns (missing values as None) and the machine: how a compared row finds its series."""
    values = []
    for column in CASE_COLUMNS:
        value = row.get(column)
        missing = value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
        values.append(None if missing else value.item() if isinstance(value, np.generic) else value)
    return (*values, None if machine is None else str(machine))


def regime_key(row: dict[Any, Any], machine: Any, suffix: str = "") -> tuple[Any, ...]:
    """The key of the pooled spread a case without history falls back on: its contender, device, dtype and
    pass on its machine, and its side of the roofline (``fma_gflops`` / ``stream_gbps``, None without
    rates). ``suffix`` reads a compared row's columns (``_new``)."""
    plain = {
        column: row.get(f"{column}{suffix}", row.get(column))
        for column in ("intensity", "yardstick_fma_gflops", "yardstick_stream_gbps")
    }
    side = yardstick_of(plain, None)
    return (
        POOLED,
        *(row.get(c) for c in ("impl", "device", "dtype", "pass")),
        side,
        None if machine is None else str(machine),
    )


@functools.lru_cache(maxsize=64)
def trim_factor(differences: int) -> float:
    """c_k: E[mean of the k − 1 smallest of k squared successive differences] / their variance, for steady
    Gaussian noise (by simulation, fixed seed); 1 for fewer than 3 differences (nothing is left out)."""
    if differences < 3:
        return 1.0
    draws = np.random.default_rng(0).standard_normal((TRIM_DRAWS, differences + 1))
    squares = np.sort((np.diff(draws, axis=1) ** 2) / 2, axis=1)
    return float(squares[:, :-1].mean())


def spread_of(differences: list[float]) -> tuple[float, float]:
    """(s, ν) of a case's successive relative differences (module docstring): the largest left out when
    there are three or more, the rest's root mean square unbiased by :func:`trim_factor`."""
    values = np.asarray(differences, dtype=float)
    k = len(values)
    if k >= 3:
        values = np.delete(values, int(np.argmax(np.abs(values))))
    j = len(values)
    spread = math.sqrt(float(np.mean(values**2)) / trim_factor(k))
    return spread, 2 * j * j / (3 * j - 1)


def _relative_changes(base: pd.DataFrame, new: pd.DataFrame) -> dict[tuple[Any, ...], float]:
    """Case key → its relative change from ``base`` to ``new`` (two runs' ok rows), as compare computes it."""
    merged = base.merge(new, on=list(CASE_COLUMNS), suffixes=("_base", "_new"))
    if merged.empty:
        return {}
    merged.index = pd.RangeIndex(len(merged))
    changes = np.log(merged["median_ms_new"].astype(float) / merged["median_ms_base"].astype(float))
    shifts, _ = workload_shifts(merged, changes)
    relative = changes - shifts
    return {
        case_key(row, row.get("machine_new")): float(value)
        for row, value in zip(merged.to_dict("records"), relative, strict=True)
    }


def history_sigmas(
    history: pd.DataFrame, exclude: set[str], last: int = HISTORY_RUNS
) -> dict[tuple[Any, ...], HistoryNoise]:
    """Case key (:func:`case_key`) → its :class:`HistoryNoise`, for the cases with enough history, and
    :func:`regime_key` → the pooled spread of each contender's cases that have it (module docstring).

    ``history`` has the case columns, ``machine``, ``run_id``, ``started_at`` and ``median_ms`` of ok rows
    (and the yardstick rates and ``intensity`` where known); the runs in ``exclude`` are left out."""
    kept = history[~history["run_id"].isin(exclude)]
    if "status" in kept:
        kept = kept[kept["status"] == "ok"]
    medians = pd.to_numeric(kept["median_ms"], errors="coerce")
    kept = kept[np.isfinite(medians) & (medians > 0)].sort_values(["started_at", "run_id"], kind="stable")
    runs = {run: frame for run, frame in kept.groupby("run_id", sort=False)}
    series: dict[tuple[Any, ...], list[str]] = {}
    latest: dict[tuple[Any, ...], dict[Any, Any]] = {}
    for row in kept.to_dict("records"):
        key = case_key(row, row.get("machine"))
        if row["run_id"] not in series.setdefault(key, []):
            series[key].append(row["run_id"])
        latest[key] = row
    pairs: dict[tuple[str, str], dict[tuple[Any, ...], float]] = {}
    found: dict[tuple[Any, ...], HistoryNoise] = {}
    for key, run_ids in series.items():
        run_ids = run_ids[-last:]
        if len(run_ids) < MIN_HISTORY_RUNS:
            continue
        differences = []
        for pair in pairwise(run_ids):
            if pair not in pairs:
                pairs[pair] = _relative_changes(runs[pair[0]], runs[pair[1]])
            differences.append(pairs[pair][key])
        spread, df = spread_of(differences)
        found[key] = HistoryNoise(spread, len(run_ids), df)
    regimes: dict[tuple[Any, ...], list[HistoryNoise]] = {}
    for key, noise in found.items():
        regimes.setdefault(regime_key(latest[key], latest[key].get("machine")), []).append(noise)
    for regime, noises in regimes.items():
        if len(noises) < MIN_POOLED_CASES:
            continue
        weight = sum(n.df for n in noises)
        spread = math.sqrt(sum(n.df * n.spread**2 for n in noises) / weight)
        found[regime] = HistoryNoise(spread, max(n.runs for n in noises), weight / len(noises), len(noises))
    return found


def lookup(
    history: dict[tuple[Any, ...], HistoryNoise], row: dict[Any, Any], machine: Any, suffix: str = ""
) -> HistoryNoise | None:
    """A compared case's own history, else its contender's pooled spread (:func:`regime_key`), else None."""
    return history.get(case_key(row, machine)) or history.get(regime_key(row, machine, suffix))


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
