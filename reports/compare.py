"""`attnbench compare BASE NEW`: a verdict per case, calibrated by the noise the runs measured.

Two sources of evidence, by what the runs have:

* **per-repeat medians** (both runs made with ``--repeat N``, N ≥ 2): each case's N medians come from N
  separate processes spread over the run, so their spread includes what changes between processes and over
  minutes — the noise a run-vs-run comparison must beat. A one-sided Welch t-test on their logarithms
  decides significance;
* **within-run samples** only (``--repeat 1``): a Mann-Whitney U test on the raw samples. Those samples do
  not see what changes between processes and over minutes (two identical quick runs differed by 8 % on one
  case with p 7e-05), so they never decide ``slower`` or ``faster``: a case that would be called so is
  ``unclear``, and its note says to rerun both with ``--repeat N`` or to time both versions in one process
  (``attnbench ab``).

A case is ``slower`` / ``faster`` only when its change is beyond its **floor** — the larger of
``--threshold`` and the noise the runs measured for that case (the relative range of the per-repeat
medians, or the width of the 95 % confidence interval of the samples' median) — *and* significant
(p < alpha, or clear-cut: every new value beyond every base value), *and* not explained by the
**shift of its workload**. A shared machine's speed moves the contenders timed together alike between runs
minutes apart (the contenders of one workload are timed in interleaved rounds, at the same minutes): the
median change over a workload's contenders (three or more), else over all cases (three or more, from two
contenders or more), is that shift, and a case must move beyond its floor relative to it too. A change the
shift explains is ``unclear`` (machine drift, or a change everywhere: the runs can't tell which), never
``slower``. ``same`` is within ``--threshold``; a
change beyond it but within the measured noise is ``unclear``, as is anything else that can't be decided.

**Floors from history** (``--db STORE``): a case the store has seen in ``MIN_HISTORY_RUNS`` runs or more
on the new run's machine (the two compared runs left out) takes its floor from how far its relative change
moved between successive runs of the same code there (reports.noise_floor) — the drift over minutes and
hours and the rare slow runs that a run's own repeats cannot see: floor = e^{t·s} − 1, the two-sided
prediction interval at ``alpha`` (Student's t with the history's degrees of freedom), never below
``--threshold`` or the runs' own noise, and p from the same t; the clear-cut rule does not apply (with
three repeats a side it is a 1-in-20 event). A case with less history takes the pooled spread of its
contender's cases on the same side of the roofline. Such a case may be decided on within-run samples too.
The ``floor_source`` column says which floor each case used: ``history (N runs)``, ``history (pooled, N
cases)``, ``repeats`` or ``within-run only``.

**Yardstick-normalised** (``--normalise yardstick``): each case's times are divided by the machine's
speed of the moment, the rate of the yardstick that matches its place on the roofline, timed in the same
rounds (reports.normalise); the ``yardstick`` column says which (``fma``, ``stream``, ``raw`` without
rates). Raw is the default until the calibration (``nox -s calibrate``) shows normalising helps.

The geometric mean of the ratios summarises the comparison; the exit code is 1 when any case is slower.
Two runs that share no case, or no case that ran ``ok`` in both, are bad input (nothing compared is not a
pass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu, ttest_ind
from scipy.stats import t as student_t

from attnbench.errors import UsageError
from attnbench.measure.stopwatch import median_ci_halfwidth
from attnbench.reports.drift import workload_shifts
from attnbench.reports.frames import (
    all_parts,
    environment_line,
    load_run,
    load_runs,
    parts,
    without_threads,
    workload_label,
)
from attnbench.reports.noise_floor import (
    HISTORY_RUNS,
    MIN_HISTORY_RUNS,
    HistoryNoise,
    history_sigmas,
    load_store_history,
    lookup,
)
from attnbench.reports.normalise import normalise, references, ridge_from_meta
from attnbench.reports.out_folder import write_page
from attnbench.reports.summary import CASE_FAILURES
from attnbench.runner._repeats import listed
from attnbench.runner.results import CASE_COLUMNS, YARDSTICK_COLUMNS

MATCH_ON = CASE_COLUMNS
HistorySigmas = dict[tuple[Any, ...], HistoryNoise]  # case or regime key → its spread (reports.noise_floor)
VERDICTS = ("faster", "slower", "same", "unclear")
# A NEW status that fails the gate where BASE ran ok: the case failed (summary's CASE_FAILURES, as `ab` fails on
# incorrect and error), or the contender no longer loads or runs here (a plugin whose import broke is `unavailable`).
BROKEN = (*CASE_FAILURES, "unavailable")
WITHIN_RUN_ONLY = (
    "looks {direction}, but on within-run samples only: rerun both with --repeat 3, "
    "or time both versions in one process with `attnbench ab`"
)


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.05
    alpha: float = 0.01


@dataclass(frozen=True)
class Evidence:
    """What one run measured for one case: the values compared and how noisy they are."""

    values: np.ndarray  # per-repeat medians, or raw samples (ms)
    basis: str  # "repeats" or "samples"
    noise: float  # relative noise of this run for this case

    @property
    def median(self) -> float:
        return float(np.median(self.values))


def evidence(row: Any, suffix: str = "") -> Evidence:
    """The per-repeat medians when there are two or more, else the raw samples (else the median alone).

    Per-repeat medians are centred on the row's ``median_ms`` (their spread is kept), so that the
    median_ms of the row is what is compared whatever else a tool rewrote."""
    median = float(row[f"median_ms{suffix}"])
    repeats = listed(row.get(f"repeat_medians_ms{suffix}"))
    if len(repeats) >= 2:
        values = np.asarray(repeats) * (median / float(np.median(repeats)))
        return Evidence(values, "repeats", float(values.max() / values.min() - 1))
    samples = listed(row.get(f"samples_ms{suffix}"))
    if not samples:
        return Evidence(np.array([median]), "samples", 0.0)
    values = np.asarray(samples)
    if len(samples) >= 6:
        width = 2 * median_ci_halfwidth(samples)
    else:
        q1, q3 = np.percentile(values, [25, 75])
        width = float(q3 - q1)
    return Evidence(values, "samples", float(width / np.median(values)))


def _p_value(base: np.ndarray, new: np.ndarray, basis: str, shift: float) -> float:
    """One-sided p-value that ``new`` moved in the direction it did, beyond the run-wide shift (logs)."""
    log_base, log_new = np.log(base), np.log(new) - shift
    if len(base) < 2 or len(new) < 2:
        return 0.0 if np.median(log_new) != np.median(log_base) else 1.0
    if np.ptp(log_base) == 0 and np.ptp(log_new) == 0:
        return 0.0 if log_new[0] != log_base[0] else 1.0
    alternative = "greater" if np.median(log_new) > np.median(log_base) else "less"
    if basis == "repeats":
        return float(ttest_ind(log_new, log_base, equal_var=False, alternative=alternative).pvalue)
    return float(mannwhitneyu(log_new, log_base, alternative=alternative).pvalue)


def history_floor(spread: float, alpha: float, df: float = math.inf) -> float:
    """The relative change (beyond the drift) that a new pair of runs of the same code exceeds, either way,
    with probability ``alpha``, when history saw it move with spread ``spread`` (log scale) on ``df``
    degrees of freedom: e^{t_{1−α/2, df} · spread} − 1, a prediction interval (reports.noise_floor)."""
    return math.expm1(float(student_t.isf(alpha / 2, df)) * spread)


def history_p_value(relative: float, noise: HistoryNoise) -> float:
    """Two-sided p of a relative change (log, drift divided out) under history's spread: 2·P(T_df ≥ |x|/s)."""
    if noise.spread <= 0:
        return float(relative == 0)
    return float(2 * student_t.sf(abs(relative) / noise.spread, noise.df))


class Verdict(NamedTuple):
    """One case's verdict between two runs, with what it rests on."""

    outcome: str  # faster, slower, same or unclear
    ratio: float  # new/base median
    p_value: float
    floor: float  # the smallest relative change the case could show, as a fraction
    note: str  # why the outcome is unclear, or ""


def verdict(
    base: Any, new: Any, settings: Settings, shift: float = 0.0, history: HistoryNoise | None = None
) -> Verdict:
    """The :class:`Verdict` (outcome, new/base median ratio, p-value, floor, note) for one case.

    ``base`` and ``new`` are :class:`Evidence` or plain lists of samples; ``shift`` is the run-wide change
    (log of a ratio) that a case must move beyond. ``history``: what the store saw of the case's relative
    change between runs of the same code (reports.noise_floor); it raises the floor to the prediction
    interval :func:`history_floor`, gives the p-value (:func:`history_p_value`, two-sided) in place of the
    runs' own test and of the clear-cut rule, and lets within-run samples decide, since the spread between
    runs is then known."""
    base_ev = base if isinstance(base, Evidence) else Evidence(np.asarray(base, float), "samples", 0.0)
    new_ev = new if isinstance(new, Evidence) else Evidence(np.asarray(new, float), "samples", 0.0)
    ratio = new_ev.median / base_ev.median
    change = math.log(ratio)
    floor = max(settings.threshold, base_ev.noise, new_ev.noise)
    if history is not None:
        floor = max(floor, history_floor(history.spread, settings.alpha, history.df))
    limit = math.log1p(floor)
    basis = base_ev.basis if base_ev.basis == new_ev.basis else "samples"
    if history is None:
        p_value = _p_value(base_ev.values, new_ev.values, basis, shift)
    else:
        p_value = history_p_value(change - shift, history)
    if abs(change) <= math.log1p(settings.threshold):
        return Verdict("same", ratio, p_value, floor, "")
    if abs(change) <= limit:
        return Verdict("unclear", ratio, p_value, floor, f"within the noise the runs measured ({floor:.1%})")
    relative = change - shift
    if abs(relative) <= limit or (relative > 0) != (change > 0):
        run = math.expm1(shift)
        note = (
            f"this case moved {ratio - 1:+.1%}, and the cases it is judged beside {run:+.1%} (the median change of "
            "its workload's contenders, or of the run's other cases where a workload has under three: machine drift "
            "or a change in every contender); beside that, its own change is within the noise"
        )
        return Verdict("unclear", ratio, p_value, floor, note)
    adjusted = new_ev.values * math.exp(-shift)
    separated = adjusted.min() > base_ev.values.max() if change > 0 else adjusted.max() < base_ev.values.min()
    if p_value >= settings.alpha and (history is not None or not separated):
        return Verdict("unclear", ratio, p_value, floor, "beyond the floor but not significant")
    direction = "slower" if change > 0 else "faster"
    if basis == "samples" and history is None:
        return Verdict("unclear", ratio, p_value, floor, WITHIN_RUN_ONLY.format(direction=direction))
    return Verdict(direction, ratio, p_value, floor, "")


@dataclass
class Comparison:
    """The per-case table and what the whole comparison rests on."""

    table: pd.DataFrame
    basis: str  # "repeats" or "samples"
    notes: list[str] = field(default_factory=list)


def repeat_count(frame: pd.DataFrame, name: str) -> int:
    """How many repeats a run's ok rows have; a run mixing counts is bad input."""
    ok = frame[frame["status"] == "ok"]
    counts = {max(1, len(listed(v))) for v in ok.get("repeat_medians_ms", pd.Series(dtype=object))} or {1}
    if len(counts) > 1:
        raise UsageError(
            f"{name} mixes rows with {' and '.join(map(str, sorted(counts)))} repeats; "
            "compare runs made with one --repeat"
        )
    return counts.pop()


def compare_frames(
    base: pd.DataFrame, new: pd.DataFrame, settings: Settings, history: HistorySigmas | None = None
) -> Comparison:
    """One row per case present in either run: verdict, ratio, p-value, floor, or why it can't be compared.

    ``history``: what the store saw of each case's relative change between runs, per case and machine
    (reports.noise_floor.history_sigmas, the two compared runs left out); a case found there, or whose
    contender's cases are (pooled), takes its floor from it. ``floor_source`` says, per case, which floor it
    used."""
    merged = base.merge(new, on=MATCH_ON, how="outer", suffixes=("_base", "_new"), indicator=True)
    shared = merged[merged["_merge"] == "both"]
    if shared.empty:
        raise UsageError(
            f"BASE and NEW share no case ({len(base)} case(s) in BASE, {len(new)} in NEW, none with "
            "the same contender and workload): compare two runs of the same sweep"
        )
    if not ((shared["status_base"] == "ok") & (shared["status_new"] == "ok")).any():
        raise UsageError(f"BASE and NEW share {len(shared)} case(s) but none ran ok in both: nothing to compare")
    base_repeats, new_repeats = repeat_count(base, "BASE"), repeat_count(new, "NEW")
    if base_repeats != new_repeats:
        raise UsageError(
            f"BASE has {base_repeats} repeat(s) per case and NEW {new_repeats}: "
            "compare runs made with the same --repeat"
        )
    merged["_row"] = range(len(merged))
    merged.index = merged["_row"]
    both = merged[(merged["_merge"] == "both") & (merged["status_base"] == "ok") & (merged["status_new"] == "ok")]
    changes = np.log(both["median_ms_new"].astype(float) / both["median_ms_base"].astype(float))
    shifts, estimate = workload_shifts(both, changes)
    shift = float(np.median(changes)) if estimate else 0.0
    records: list[dict[str, Any]] = []
    bases: set[str] = set()
    histories = 0
    for row in merged.to_dict("records"):
        record = {key: row[key] for key in MATCH_ON}
        record["workload"] = workload_label(pd.Series(record))
        record["reproduce"] = row.get("reproduce_new") if isinstance(row.get("reproduce_new"), str) else ""
        record.update(base_status=row.get("status_base"), new_status=row.get("status_new"))
        if row["_merge"] != "both":
            record.update(verdict="missing", note=f"only in {'base' if row['_merge'] == 'left_only' else 'new'}")
        elif row["status_base"] != "ok" or row["status_new"] != "ok":
            record.update(verdict="not comparable", note=f"base {row['status_base']}, new {row['status_new']}")
        else:
            base_ev, new_ev = evidence(row, "_base"), evidence(row, "_new")
            bases.add(base_ev.basis if base_ev.basis == new_ev.basis else "samples")
            case_shift = float(shifts.get(row["_row"], 0.0))
            seen = lookup(history, row, row.get("machine_new"), "_new") if history else None
            found = verdict(base_ev, new_ev, settings, case_shift, seen)
            own = "repeats" if base_ev.basis == new_ev.basis == "repeats" else "within-run only"
            record.update(
                verdict=found.outcome,
                ratio=found.ratio,
                p_value=found.p_value,
                floor=found.floor,
                note=found.note,
                base_ms=row["median_ms_base"],
                new_ms=row["median_ms_new"],
                floor_source=seen.source if seen else own,
                yardstick=_yardsticks_used(row),
            )
            histories += bool(seen)
        records.append(record)
    columns = [
        "impl",
        "workload",
        "verdict",
        "ratio",
        "p_value",
        "floor",
        "floor_source",
        *(["yardstick"] if "yardstick_new" in merged else []),
        "base_ms",
        "new_ms",
        "base_status",
        "new_status",
        "note",
        "reproduce",
        *MATCH_ON[1:],
    ]
    table = pd.DataFrame.from_records(records).reindex(columns=columns)
    basis = "repeats" if bases == {"repeats"} else "samples"
    notes = []
    compared = int(table["floor_source"].notna().sum())
    if history is not None:
        notes.append(
            f"{histories} of {compared} case(s) took their floor from the store's between-run spread "
            f"(history, the last {HISTORY_RUNS} runs at most, {MIN_HISTORY_RUNS} at least, the compared "
            "runs left out; else pooled over the contender's cases); the others kept their runs' own "
            "floor (floor_source)"
        )
    if basis == "samples" and histories < compared:
        notes.append(
            "verdicts are within-run only: the runs have no per-repeat medians, so no case is called "
            "slower or faster (run both with --repeat 3 to see the noise between processes and over "
            "time, or time both versions in one process with `attnbench ab`)"
        )
    if estimate:
        notes.append(
            f"machine drift divided out: the contenders of each workload (timed together) move alike "
            f"between runs; median shift {math.expm1(shift):+.1%} over {len(both)} cases, and a case must "
            "move beyond its floor relative to its workload's shift"
        )
    elif len(both):
        notes.append("one contender (or under 3 cases): no control for machine drift between the runs")
    machines = {side: _machines(both, side) for side in ("_base", "_new")}
    if machines["_base"] and machines["_new"] and machines["_base"] != machines["_new"]:
        said = {side: " and ".join(found) for side, found in machines.items()}
        notes.insert(
            0,
            f"BASE ran on {said['_base']} and NEW on {said['_new']}: every case moves with the hardware, so these "
            "verdicts weigh the machines as much as the code (compare runs made on the same machine)",
        )
    threads = {side: _thread_counts(both, side) for side in ("_base", "_new")}
    if threads["_base"] and threads["_new"] and threads["_base"] != threads["_new"]:
        said = {side: "/".join(map(str, counts)) for side, counts in threads.items()}
        notes.insert(
            0,
            f"BASE ran its CPU cases on {said['_base']} thread(s) and NEW on {said['_new']}: every case moves with "
            "the thread count, so these verdicts weigh the setting as much as the code (compare runs made with the "
            "same --threads)",
        )
    return Comparison(table, basis, notes)


def _thread_counts(rows: pd.DataFrame, side: str) -> list[int]:
    """The thread counts one side's compared CPU rows ran on (empty where the column is missing)."""
    column = f"threads{side}"
    if column not in rows:
        return []
    counts = rows.loc[rows["device"] == "cpu", column].dropna()
    return sorted({int(count) for count in counts})


def _machines(rows: pd.DataFrame, side: str) -> list[str]:
    """The machines one side's compared rows ran on, less their thread counts (the thread note says those)."""
    column = f"machine{side}"
    if column not in rows:
        return []
    return sorted({without_threads(str(machine)) for machine in rows[column].dropna()})


def _yardsticks_used(row: dict[Any, Any]) -> str | None:
    """Which yardstick normalised the case ("fma", "stream"; "raw" when a side had none), None unless the
    runs were normalised (reports.normalise)."""
    if "yardstick_new" not in row:
        return None
    sides = {row.get("yardstick_base"), row.get("yardstick_new")}
    return sides.pop() if len(sides) == 1 and all(isinstance(side, str) for side in sides) else "raw"


def geometric_mean(ratios: pd.Series) -> float | None:
    values = ratios.dropna()
    return float(np.exp(np.log(values).mean())) if len(values) else None


def load_for_compare(
    base: Path, new: Path, mode: str = "raw", db: Path | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, HistorySigmas | None]:
    """BASE's and NEW's rows, normalised by the yardsticks when ``mode`` is ``yardstick``
    (reports.normalise), and the store's between-run spread per case when ``db`` is given
    (reports.noise_floor; the two compared runs left out of it, so no floor comes from the runs it judges)."""
    frame, runs = load_runs([base, new])
    for run in runs:
        if run.frame.empty:  # a run stopped before its first case finished: no case to judge
            raise UsageError(
                f"{run.path}: no finished case (the run stopped before its first row); compare runs with rows"
            )
    # BASE is the first folder's rows, whatever their `run` (a merged folder keeps each row's shard): load_runs
    # concatenates each run's rows in order, so they are the frame's first rows (its index, kept by normalise)
    is_base = pd.Series(frame.index < len(runs[0].frame), index=frame.index)
    if mode == "yardstick":
        if not any(column in frame and frame[column].notna().any() for column in YARDSTICK_COLUMNS.values()):
            raise UsageError(
                "--normalise yardstick: neither run has yardstick rates (runs made before attnbench "
                "timed yardsticks, or on a GPU); compare them raw"
            )
        metas = {part.name: part.meta for part in all_parts(runs)}
        ridge_of = lambda row: ridge_from_meta(metas.get(row["run"], {}), str(row.get("dtype")))  # noqa: E731
        frame = normalise(frame, ridge_of, references(frame))
    sides = frame[is_base], frame[~is_base]
    for side, rows, run in zip(("BASE", "NEW"), sides, runs, strict=True):
        keys = pd.Series(["|".join(map(repr, r)) for r in rows[MATCH_ON].itertuples(index=False)], index=rows.index)
        twice = keys.duplicated(keep=False)
        if twice.any():  # a merged folder of several machines' runs of one sweep: which of them is the run?
            same = rows[keys == keys[twice].iloc[0]]
            first = same.iloc[0]
            raise UsageError(
                f"{side} {run.path} holds case {first['impl']} {workload_label(first)} {len(same)} times (from "
                f"{' and '.join(dict.fromkeys(map(str, same['machine'])))}): compare folders that hold each case once, "
                "e.g. one machine's runs"
            )
    history = None
    if db is not None:
        from attnbench.reports.store import run_id

        stored = load_store_history(db, normalised=mode == "yardstick")
        history = history_sigmas(stored, {run_id(part) for part in all_parts(runs)}) if not stored.empty else {}
    return sides[0], sides[1], history


def ratio_figure(
    table: pd.DataFrame, path: Path, settings: Settings, sides: tuple[str, str] | None = None
) -> Path | None:
    """Dot plot of new/base ratios per case, coloured by verdict, each over its floor (a grey bar); the ratio axis
    is logarithmic only when the ratios span a factor of 3 (figure_layout.value_axis), the legend outside; the
    cases not drawn (missing, not comparable) counted in the title; ``sides``: BASE's and NEW's names, under the
    axis."""
    figure = ratio_plot(table, settings, sides)
    if figure is None:
        return None
    from attnbench.reports.plots import save

    return save(figure, path)


def _ticks_through_one(low: float, high: float) -> list[float]:
    """Even steps of 1, 2, 2.5 or 5 times a power of ten from 1 (the line of no change always labelled), about
    five across ``low`` … ``high``."""
    from attnbench.reports.trend import nice_step

    step = nice_step(high - low)
    return [round(1 + k * step, 10) for k in range(math.ceil((low - 1) / step), math.floor((high - 1) / step) + 1)]


def ratio_plot(table: pd.DataFrame, settings: Settings, sides: tuple[str, str] | None = None) -> Any:
    """The figure of :func:`ratio_figure`; ``sides`` (BASE, NEW) are named under the ratio axis: compare.png sent alone
    said "new / base" without saying which runs those were."""
    from attnbench.reports.figure_layout import DPI, VERDICT_COLOURS, finish, legend_right, value_axis
    from attnbench.reports.plots import matplotlib, plt, sns

    compared = table[table["ratio"].notna()]
    if compared.empty:
        return None
    labels = compared["impl"] + " · " + compared["workload"]
    figure, axis = plt.subplots(figsize=(8, 0.28 * len(compared) + 1.6), layout="constrained", dpi=DPI)
    sns.scatterplot(
        x=compared["ratio"].to_numpy(),
        y=labels.to_numpy(),
        hue=compared["verdict"].to_numpy(),
        palette=VERDICT_COLOURS,
        ax=axis,
        s=30,
        legend=False,
    )
    # each case's floor, the band a ratio must leave to be called faster or slower (|log ratio| > log(1 + floor))
    floors = compared["floor"].fillna(settings.threshold).to_numpy(dtype=float)
    axis.hlines(labels.to_numpy(), 1 / (1 + floors), 1 + floors, color="#d0d0d0", linewidth=7, zorder=0)
    axis.axvline(1, color="black", linewidth=0.8)
    value_axis(axis, compared["ratio"], which="x", extra=[*(1 / (1 + floors)), *(1 + floors)], zero=False)
    if axis.get_xscale() == "linear":
        axis.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(_ticks_through_one(*axis.get_xlim())))
    named = f"\nnew: {sides[1]}, base: {sides[0]}" if sides else ""
    axis.set_xlabel(f"new / base median (< 1 is faster); grey: the case's floor{named}")
    left_out = len(table) - len(compared)
    if left_out:
        axis.set_title(f"{left_out} case(s) not drawn: missing or not comparable (the table says why)", size=8)
    axis.tick_params(axis="y", labelsize=7)
    shown = [v for v in VERDICT_COLOURS if v in set(compared["verdict"])]
    handles = [
        matplotlib.lines.Line2D([], [], color=VERDICT_COLOURS[v], marker="o", linestyle="", label=v) for v in shown
    ]
    legend_right(figure, handles, "verdict")
    return finish(figure)


def floor_band(floor: Any) -> str:
    """The new/base ratios a floor leaves ``same`` or ``unclear``: 1/(1 + floor) to 1 + floor. The floor holds on
    the log scale, so a faster case must fall below 1/(1 + floor) — 0.879 is beyond a 13.1 % floor (0.884) though
    it is only 12.1 % under 1; printing the band, not the percentage, keeps the verdict and its column agreeing."""
    if floor is None or (isinstance(floor, float) and math.isnan(floor)):
        return ""
    return f"{1 / (1 + floor):.3f}–{1 + floor:.3f}"


def terminal_table(table: pd.DataFrame) -> tuple[str, list[str]]:
    """The comparison as the terminal shows it, and its footnotes. Each distinct note is printed once below the
    table and marked ``[n]`` in its rows (one long note repeated per row made the table 450 characters wide);
    ``floor_source`` is a column only where the cases' floors come from more than one source (the summary line
    counts them either way)."""
    columns = ["impl", "workload", "verdict", "ratio", "p_value", "floor"]
    if table["floor_source"].dropna().str.replace(r" \(.*\)", "", regex=True).nunique() > 1:  # kinds, not counts
        columns.append("floor_source")
    if "yardstick" in table:
        columns.append("yardstick")
    shown = table[columns].copy()
    shown["ratio"] = shown["ratio"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    shown["p_value"] = shown["p_value"].map(lambda v: "" if pd.isna(v) else f"{v:.2g}")
    shown["floor"] = shown["floor"].map(floor_band)
    notes: dict[str, int] = {}
    marks = []
    for note in table["note"]:
        text = note if isinstance(note, str) else ""
        marks.append(f"[{notes.setdefault(text, len(notes) + 1)}]" if text else "")
    if notes:
        shown["note"] = marks
    footnotes = [f"[{number}] {text}" for text, number in notes.items()]
    return shown.to_string(index=False), footnotes


def broken(table: pd.DataFrame) -> pd.DataFrame:
    """The cases that ran ok in BASE and failed in NEW (``incorrect``, ``error``, ``timeout``, ``oom``) or whose
    contender is ``unavailable`` there: not comparable, having no time to compare, but a gate must not pass a kernel
    that broke (``attnbench ab`` fails on incorrect and error too)."""
    return table[(table["base_status"] == "ok") & table["new_status"].isin(BROKEN)]


def summary_line(comparison: Comparison, settings: Settings) -> str:
    table = comparison.table
    counts = table["verdict"].value_counts()
    parts = [f"{counts.get(v, 0)} {v}" for v in (*VERDICTS, "missing", "not comparable") if counts.get(v, 0)]
    mean = geometric_mean(table["ratio"])
    gm = f"; geometric-mean new/base {mean:.3f}" if mean is not None else ""
    basis = "per-repeat medians" if comparison.basis == "repeats" else "within-run samples"
    kinds = table["floor_source"].dropna().str.replace(r" \(.*\)", "", regex=True).value_counts()
    sources = ", ".join(f"{kind} {count}" for kind, count in kinds.items())
    floor = (
        f" (floor: the new/base band a case must leave to be called either way, at least ±{settings.threshold:.0%}"
        f" and the measured noise, alpha {settings.alpha:g}, from {basis}; "
        f"floors: {sources or 'none'})"
    )
    return ", ".join(parts) + gm + floor


def write_compare(
    comparison: Comparison, out_dir: Path, base: Path, new: Path, settings: Settings, command: str
) -> tuple[Path, Path | None]:
    import base64
    from importlib import resources

    import jinja2

    table = comparison.table
    out_dir.mkdir(parents=True, exist_ok=True)
    png = ratio_figure(table, out_dir / "compare.png", settings, (base.name, new.name))
    image = base64.b64encode(png.read_bytes()).decode() if png else None

    def fmt(value: Any, spec: str) -> str:
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)

    def ran_on(path: Path) -> str:  # a merged folder: each of its runs
        runs = parts(load_run(path))
        return " | ".join(
            environment_line(r.meta) if len(runs) == 1 else f"{r.name}: {environment_line(r.meta)}" for r in runs
        )

    rows = [
        {
            "impl": r["impl"],
            "workload": r["workload"],
            "verdict": r["verdict"],
            "ratio": fmt(r["ratio"], ".3f"),
            "p_value": fmt(r["p_value"], ".2g"),
            "floor": floor_band(r["floor"]),
            "floor_source": r["floor_source"] if isinstance(r["floor_source"], str) else "",
            "base_ms": fmt(r["base_ms"], ".4g"),
            "new_ms": fmt(r["new_ms"], ".4g"),
            "note": r["note"],
            "reproduce": r["reproduce"],
        }
        for r in table.to_dict("records")
    ]
    template = resources.files("attnbench.reports").joinpath("templates/compare.html.j2").read_text()
    html = (
        jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
        .from_string(template)
        .render(
            base=str(base),
            new=str(new),
            base_env=ran_on(base),
            new_env=ran_on(new),
            summary=summary_line(comparison, settings),
            notes=comparison.notes,
            image=image,
            rows=rows,
            command=command,
        )
    )
    table.to_csv(out_dir / "compare.csv", index=False)  # for scripts: every column, one row per case
    path = out_dir / "compare.html"
    write_page(path, html)
    return path, png
