"""The bookkeeping of ``nox -s calibrate`` for the answers that cross runs: run-vs-run ``compare`` and ``history``.

The runs (:func:`make_runs`): N identical runs of the ``calibrate`` suite (bmm, einsum, sdpa_flash; S 512
and 1024, none and causal) plus one more contender, ``calib_step``: bmm as it is in the runs before
``step_at``, bmm followed by real extra work costing 10 % of its time (calibrate_ab's small matmuls, not a
sleep) from run ``step_at`` on — a commit that made a CPU-bound kernel 10 % slower.

* :func:`run_vs_run` — every pair of runs compared, by each method of :data:`METHODS`: ``raw`` (the floors
  of the runs' own repeats), ``yardstick`` (times normalised by the yardsticks, reports.normalise),
  ``history`` (raw, each case's floor from the spread between the *other* runs, reports.noise_floor) and
  ``yardstick+history``. A/A: every ``faster``/``slower`` of bmm, einsum or sdpa_flash is a false alarm;
  each is listed (``aa_cases``: pair, case, ratio, floor and its source), to see which cases and runs.
  **Leave-pair-out**: the history of a pair is the runs other than those two — the floor never comes from
  the runs it judges (the runs after the pair count too: the calibration's runs are exchangeable, while
  ``compare --db`` in use sees the runs stored before). It is the history of the sweep compared: without
  ``calib_step`` for the A/A and injected comparisons, with it for ``calib_step``'s real step.
  Detection: the newer run's times of one contender multiplied by ×1.05, ×1.10, ×1.25 (the noise stays
  the real one), every case not ``slower`` a miss; and ``calib_step`` across the step (a run before
  ``step_at`` against one from it on): real extra work, every case not ``slower`` a miss.
* :func:`history_detection` — the runs in order as a history (one commit each) through ``history``'s
  change detection, raw and normalised: the bmm, einsum and sdpa_flash series must show no step (A/A);
  each ``calib_step`` series one step, at run ``step_at``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnbench.contenders import registry
from attnbench.contenders.contract import Contender
from attnbench.reports.calibrate_ab import Slowed
from attnbench.reports.changes import ALPHA, MIN_CHANGE
from attnbench.reports.compare import Settings, compare_frames
from attnbench.reports.frames import load_runs
from attnbench.reports.history import case_histories, change_records, normalise_history
from attnbench.reports.noise_floor import history_sigmas
from attnbench.reports.normalise import normalise, references, ridge_from_meta
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs

SLOWDOWNS = (1.05, 1.10, 1.25)
CONTENDERS = ("bmm", "einsum", "sdpa_flash")
STEP = "calib_step"
STEP_FACTOR = 1.10
METHODS = ("raw", "yardstick", "history", "yardstick+history")
TIME_COLUMNS = ("median_ms", "iqr_ms")
LIST_COLUMNS = ("samples_ms", "repeat_medians_ms")
RATE_COLUMNS = ("tflops", "gbps", "pct_of_peak", "pct_of_matmul")
DECIDED = ("faster", "slower", "same", "unclear")


class StepBase(Slowed):
    """``calib_step`` before the step: bmm, nothing added."""

    name = STEP
    FACTOR = 1.0

    def __init__(self) -> None:
        base = registry.get("bmm").contender
        assert base is not None
        super().__init__(base, self.FACTOR)
        self.name = STEP
        self.description = f"bmm, then matmuls costing {self.FACTOR - 1:.0%} of its median (calibration)"

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        return self.base.prepare(inputs, workload) if self.FACTOR == 1.0 else super().prepare(inputs, workload)


class StepUp(StepBase):
    """``calib_step`` from the step on: bmm and real work costing 10 % of it."""

    FACTOR = STEP_FACTOR


def make_runs(count: int, step_at: int, repeat: int, out: Path, axes: dict[str, Any]) -> list[Path]:
    """``count`` runs of the calibrate suite with ``calib_step`` (module docstring) under ``out``."""
    import time

    import attnbench

    runs = []
    for index in range(1, count + 1):
        contender: type[Contender] = StepUp if index >= step_at else StepBase
        registry.unregister(STEP)
        registry.register(contender)
        target = out / f"run-{index:02d}"
        start = time.perf_counter()
        attnbench.run("calibrate", impl=[*CONTENDERS, STEP], repeat=repeat, out=target, progress="off", **axes)
        print(f"run {index}/{count} ({contender.__name__}): {target} ({time.perf_counter() - start:.0f} s)", flush=True)
        runs.append(target)
    registry.unregister(STEP)
    return runs


def load(runs: list[Path]) -> tuple[list[pd.DataFrame], list[dict[str, Any]]]:
    """Each run's rows (with ``machine``) and its meta.json."""
    frames, metas = [], []
    for path in runs:
        frame, loaded = load_runs([path])
        frames.append(frame)
        metas.append(loaded[0].meta)
    return frames, metas


def slowed(frame: pd.DataFrame, impl: str, factor: float) -> pd.DataFrame:
    """A copy of a run's results with ``impl``'s stored times multiplied by ``factor``."""
    frame = frame.copy()
    chosen = frame["impl"] == impl
    for column in TIME_COLUMNS:
        frame.loc[chosen, column] = frame.loc[chosen, column].astype(float) * factor
    for column in RATE_COLUMNS:
        if column in frame:
            frame.loc[chosen, column] = frame.loc[chosen, column].astype(float) / factor
    for column in LIST_COLUMNS:
        frame[column] = [
            [v * factor for v in values] if pick and values is not None else values
            for values, pick in zip(frame[column], chosen, strict=True)
        ]
    return frame


def normalised(frames: list[pd.DataFrame], metas: list[dict[str, Any]]) -> list[pd.DataFrame]:
    """Every run normalised by the yardsticks, with one reference rate for all (ratios don't depend on it)."""
    joined = pd.concat(frames, ignore_index=True)
    reference = references(joined)
    out = []
    for frame, meta in zip(frames, metas, strict=True):
        ridge_of = lambda row, meta=meta: ridge_from_meta(meta, str(row.get("dtype")))  # noqa: E731
        out.append(normalise(frame, ridge_of, reference))
    return out


def _history_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The runs as a store's history: run ``run-NN`` started NN minutes in, on commit ``cNN``."""
    start = pd.Timestamp("2000-01-01")
    parts = [
        frame.assign(
            run_id=f"run-{i:02d}",
            started_at=start + pd.Timedelta(minutes=i),
            git_commit=f"c{i:02d}",
            git_dirty=False,
            run_name=f"run-{i:02d}",
        )
        for i, frame in enumerate(frames, start=1)
    ]
    joined = pd.concat(parts, ignore_index=True)
    return joined[joined["status"] == "ok"].reset_index(drop=True)


def _tally(table: pd.DataFrame, impl: str | None = None) -> tuple[int, int]:
    """(slower, decided) among the compared cases (of ``impl`` when given)."""
    rows = table[table["verdict"].isin(DECIDED)]
    if impl is not None:
        rows = rows[rows["impl"] == impl]
    return int((rows["verdict"] == "slower").sum()), len(rows)


def run_vs_run(
    frames: list[pd.DataFrame],
    metas: list[dict[str, Any]],
    step_at: int,
    methods: tuple[str, ...] = METHODS,
    factors: tuple[float, ...] = SLOWDOWNS,
) -> pd.DataFrame:
    """One row per method (of :data:`METHODS`): A/A decisions and false alarms (and the list of them,
    ``aa_cases``), injected slowdowns (by ``factors``) caught, ``calib_step``'s real step caught (module
    docstring)."""
    settings = Settings()
    by_method = {"raw": frames, "yardstick": normalised(frames, metas)}
    histories = {name: _history_frame(runs) for name, runs in by_method.items()}  # with calib_step
    plain_histories = {name: frame[frame["impl"] != STEP] for name, frame in histories.items()}
    rows = []
    for method in methods:
        base_method = method.split("+")[0] if method != "history" else "raw"
        runs = by_method[base_method]
        counts: dict[str, list[int]] = {key: [0, 0] for key in ("aa", "real", *map(str, factors))}
        alarms: list[str] = []
        for i, j in itertools.combinations(range(len(runs)), 2):
            history = step_history = None
            if method.endswith("history"):  # leave-pair-out: the other runs only (module docstring)
                pair = {f"run-{i + 1:02d}", f"run-{j + 1:02d}"}
                history = history_sigmas(plain_histories[base_method], pair)
            base, new = runs[i], runs[j]
            plain_base, plain_new = base[base["impl"] != STEP], new[new["impl"] != STEP]
            table = compare_frames(plain_base, plain_new, settings, history).table
            decided = table[table["verdict"].isin(DECIDED)]
            counts["aa"][0] += int(decided["verdict"].isin(["faster", "slower"]).sum())
            counts["aa"][1] += len(decided)
            alarms += [
                f"{i + 1}-{j + 1} {r['impl']} {r['workload']} {r['verdict']} ×{r['ratio']:.3f} "
                f"(floor {r['floor']:.1%}, {r['floor_source']})"
                for r in decided[decided["verdict"].isin(["faster", "slower"])].to_dict("records")
            ]
            for factor, impl in itertools.product(factors, CONTENDERS):
                verdicts = compare_frames(plain_base, slowed(plain_new, impl, factor), settings, history).table
                caught, total = _tally(verdicts, impl)
                counts[str(factor)][0] += caught
                counts[str(factor)][1] += total
            if i + 1 < step_at <= j + 1 and (base["impl"] == STEP).any():
                if method.endswith("history"):
                    step_history = history_sigmas(histories[base_method], pair)
                caught, total = _tally(compare_frames(base, new, settings, step_history).table, STEP)
                counts["real"][0] += caught
                counts["real"][1] += total
        rows.append(
            {
                "method": method,
                **{f"{key}_hits": c[0] for key, c in counts.items()},
                **{f"{key}_total": c[1] for key, c in counts.items()},
                "aa_cases": alarms,
            }
        )
    return pd.DataFrame(rows)


def best_method(table: pd.DataFrame, most_alarms: float = 0.01) -> str:
    """The run-vs-run method to recommend: of those with A/A false alarms ≤ ``most_alarms``, the one that
    catches most ×1.10 (then ×1.05) slowdowns; with none that quiet, the one with the fewest alarms."""
    rate = lambda row, key: row[f"{key}_hits"] / max(row[f"{key}_total"], 1)  # noqa: E731
    records = table.to_dict("records")
    quiet = [row for row in records if rate(row, "aa") <= most_alarms]
    if quiet:
        return str(max(quiet, key=lambda row: (rate(row, "1.1"), rate(row, "1.05")))["method"])
    return str(min(records, key=lambda row: rate(row, "aa"))["method"])


def history_detection(
    frames: list[pd.DataFrame], metas: list[dict[str, Any]], step_at: int, normalise_times: bool
) -> dict[str, Any]:
    """The runs as one history through change detection: steps in the A/A series, and where each
    ``calib_step`` series' step was found."""
    frame = _history_frame(frames)
    if normalise_times:
        runs = pd.DataFrame(
            {
                "run_id": [f"run-{i:02d}" for i in range(1, len(metas) + 1)],
                "meta_json": [json.dumps(meta, default=str) for meta in metas],
            }
        )
        frame, _ = normalise_history(frame, runs)
    cases = case_histories(frame, ALPHA, MIN_CHANGE)
    changes = change_records(cases)
    steps = changes[changes["impl"] == STEP]
    right = steps[steps["run_after"] == f"run-{step_at:02d}"]
    return {
        "aa_series": sum(1 for case in cases if case.impl != STEP),
        "aa_steps": int((changes["impl"] != STEP).sum()),
        "step_series": sum(1 for case in cases if case.impl == STEP),
        "step_found": len(right),
        "step_elsewhere": len(steps) - len(right),
        "step_change_pct": float(right["change_pct"].median()) if len(right) else None,
    }
