"""`attnbench history`: every stored run of each case on each machine, its trend and its steps.

Reads the store (``reports.store``; never writes it), keeps ``ok`` rows, optionally of some contenders
(``--impl``) and matching ``--where COLUMN=VALUE`` (any column of ``rows`` or ``runs``, compared as
text), groups them into series — one per case (``attnbench.runner.results.CASE_COLUMNS``) and machine, in
order of start time — finds steps in each (``reports.changes``) and writes ``history.html`` (one
self-contained page: a trend per case as inline SVG, filters, the table of steps, the runs) and
``changes.csv`` (one line per step).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import jinja2
import numpy as np
import pandas as pd

import attnbench
from attnbench.errors import UsageError
from attnbench.reports.changes import Point, SeriesChanges, Step, detect, run_noise
from attnbench.reports.frames import workload_label
from attnbench.reports.normalise import normalise, references, ridge_from_meta
from attnbench.reports.out_folder import write_page
from attnbench.reports.store import table_columns
from attnbench.reports.trend import PALETTE, commit_label, panel
from attnbench.runner.results import CASE_COLUMNS, REPEAT_YARDSTICK_COLUMNS, YARDSTICK_COLUMNS
from attnbench.workload.axes import LABELLED_COLUMNS

# Columns that workload_label shows; any other case column (one a newer attnbench adds) is shown as col=value.
LABELLED = set(LABELLED_COLUMNS)
NOISE_COLUMNS = [
    "median_ms",
    "iqr_ms",
    "samples_ms",
    "repeat_medians_ms",
    "intensity",
    "status",
    *YARDSTICK_COLUMNS.values(),
    *REPEAT_YARDSTICK_COLUMNS.values(),
]
RUN_COLUMNS = ["git_commit", "git_dirty", "started_at", "name"]


@dataclass
class CaseHistory:
    """One case: its label, its series per machine and their changes."""

    key: tuple[Any, ...]
    impl: str
    label: str
    series: dict[str, SeriesChanges]

    @property
    def steps(self) -> list[tuple[str, Step]]:
        return [(machine, step) for machine, changes in self.series.items() for step in changes.steps]


def _parse_where(where: list[str], columns: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(table, column, value) per condition; a UsageError names an unknown column and the known ones."""
    known = {c: "r" for c in columns["rows"]} | {c: "runs" for c in columns["runs"] if c not in columns["rows"]}
    conditions = []
    for text in where:
        column, sep, value = text.partition("=")
        if not sep or column not in known:
            allowed = ", ".join(sorted(known))
            raise UsageError(f"--where {text!r}: expected COLUMN=VALUE with COLUMN a column of the store: {allowed}")
        conditions.append((known[column], column, value))
    return conditions


def load_history(con: duckdb.DuckDBPyConnection, impls: list[str], where: list[str]) -> pd.DataFrame:
    """The ok rows to draw, joined with their run's commit, dirty flag, start time and name."""
    columns = table_columns(con)
    conditions = _parse_where(where, columns)
    wanted = [*CASE_COLUMNS, "machine", *NOISE_COLUMNS]
    select = [f'r."{c}"' if c in columns["rows"] else f'NULL AS "{c}"' for c in dict.fromkeys(wanted)]
    machine = 'COALESCE(r."machine", runs."machine")' if "machine" in columns["rows"] else 'runs."machine"'
    select = [f'{machine} AS "machine"' if item in ('r."machine"', 'NULL AS "machine"') else item for item in select]
    select += [f'runs."{c}" AS "run_{c}"' if c == "name" else f'runs."{c}"' for c in RUN_COLUMNS]
    sql = f"SELECT r.run_id, {', '.join(select)} FROM rows r JOIN runs USING (run_id) WHERE r.status = 'ok'"
    params: list[Any] = []
    if impls:
        sql += f" AND r.impl IN ({', '.join('?' for _ in impls)})"
        params += impls
    for table, column, value in conditions:
        sql += f' AND CAST({table}."{column}" AS VARCHAR) = ?'
        params.append(value)
    frame = con.execute(sql + " ORDER BY runs.started_at, r.run_id", params).df()
    if impls:
        missing = sorted(set(impls) - set(frame["impl"]))
        if missing:
            raise UsageError(f"--impl: no ok row of {', '.join(missing)} in the store (with the --where given)")
    return frame


def normalise_history(frame: pd.DataFrame, runs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``--normalise yardstick``: every series' times divided by its yardstick's rate (reports.normalise),
    the ridge point from each run's ceilings. A series with a run that has no yardstick rates (stored before
    attnbench timed them) stays raw whole — half a series normalised would be a step of its own; returns
    the frame and how many series stayed raw."""
    metas = {
        row["run_id"]: json.loads(row["meta_json"]) if isinstance(row.get("meta_json"), str) else {}
        for row in runs.to_dict("records")
    }
    ridge_of = lambda row: ridge_from_meta(metas.get(row["run_id"], {}), str(row.get("dtype")))  # noqa: E731
    normalised = normalise(frame, ridge_of, references(frame))
    keys = [tuple(map(str, key)) for key in frame[[*CASE_COLUMNS, "machine"]].itertuples(index=False)]
    has_rates = normalised["yardstick"].notna().tolist()
    whole: dict[tuple[str, ...], bool] = {}
    for key, ok in zip(keys, has_rates, strict=True):
        whole[key] = whole.get(key, True) and ok
    raw = [not whole[key] for key in keys]
    rows = [
        {**old, "yardstick": None} if keep_raw else new
        for old, new, keep_raw in zip(frame.to_dict("records"), normalised.to_dict("records"), raw, strict=True)
    ]
    return pd.DataFrame(rows, columns=normalised.columns), sum(not ok for ok in whole.values())


def runs_table(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return con.execute("SELECT * FROM runs ORDER BY started_at, run_id").df()


def _label(row: dict[Any, Any]) -> str:
    extras = [f"{c}={row[c]}" for c in CASE_COLUMNS if c not in LABELLED and not _missing(row.get(c))]
    return " ".join([workload_label(row), *extras])


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _point(row: dict[Any, Any]) -> Point:
    sigma, source = run_noise(row["median_ms"], row["iqr_ms"], row["samples_ms"], row["repeat_medians_ms"])
    dirty = None if _missing(row["git_dirty"]) else bool(row["git_dirty"])
    commit = None if _missing(row["git_commit"]) else str(row["git_commit"])
    return Point(row["run_id"], commit, dirty, row["started_at"], float(row["median_ms"]), sigma, source)


def case_histories(frame: pd.DataFrame, alpha: float, min_change: float) -> list[CaseHistory]:
    """One CaseHistory per case, its series split by machine, each run through change detection."""
    cases: dict[tuple[Any, ...], CaseHistory] = {}
    for record in frame.to_dict("records"):
        key = tuple(None if _missing(record.get(c)) else record.get(c) for c in CASE_COLUMNS)
        case = cases.get(key)
        if case is None:
            case = cases[key] = CaseHistory(key, str(record["impl"]), _label(record), {})
        points = case.series.setdefault(str(record["machine"]), SeriesChanges(points=[]))
        points.points.append(_point(record))
    drift = machine_drift(list(cases.values()))
    for case in cases.values():
        for machine, pending in case.series.items():
            steady = [
                replace(p, median_ms=p.median_ms / math.exp(drift.get((machine, p.run_id, case.impl), 0.0)))
                for p in pending.points
            ]
            found = detect(steady, alpha, min_change)
            case.series[machine] = replace(found, points=pending.points)  # the page draws what was measured
    return sorted(cases.values(), key=lambda c: (c.label, c.impl))


MIN_SERIES_FOR_DRIFT = 3  # series (from ≥ 2 contenders) a run needs before its machine-wide drift is estimated
SHARED = 2 / 3  # the share of series that must have moved the drift's way for it to count as the machine's


def machine_drift(cases: list[CaseHistory]) -> dict[tuple[str, str, str], float]:
    """The run-wide drift of each (machine, run) as contender ``impl``'s series are to be divided by, on the log
    scale: the median over the *other* contenders of each one's median move that run (a series' move: its log
    median less the series' own median over all runs). A shared machine's speed moves every contender alike
    between runs minutes apart; change detection divides it out, so a step is a case moving against the others,
    not the machine's minute. A contender's own change never counts toward the drift it is divided by, nor does
    one other contender's (with a user's kernel beside bmm and sdpa_flash, whose runs land in two modes, a
    median over the three series took the kernel's +25 % and sdpa_flash's high mode for the machine and divided
    the kernel's step away; per series, bmm's step became "the machine" for sdpa_math). A run's drift counts
    only when two thirds of those contenders moved that way, and with fewer than three other series from two
    other contenders nothing is divided out. Of an even count of contenders the middle move nearer zero is taken,
    not the mean of the two middle ones: beside two peers, a kernel twice as slow made half of its step "the
    machine" for each peer, which then showed a -29 % step of its own (``_middle``)."""
    moves: dict[tuple[str, str], dict[str, list[float]]] = {}
    for case in cases:
        for machine, series in case.series.items():
            logs = [math.log(p.median_ms) for p in series.points]
            if not logs:
                continue
            middle = float(np.median(logs))
            for p, value in zip(series.points, logs, strict=True):
                moves.setdefault((machine, p.run_id), {}).setdefault(case.impl, []).append(value - middle)
    drift = {}
    for (machine, run), by_impl in moves.items():
        per_impl = {impl: float(np.median(values)) for impl, values in by_impl.items()}
        for impl in by_impl:
            others = [move for other, move in per_impl.items() if other != impl]
            counted = sum(len(values) for other, values in by_impl.items() if other != impl)
            if len(others) < 2 or counted < MIN_SERIES_FOR_DRIFT:
                continue
            middle = _middle(others)
            agreeing = sum(1 for move in others if move * middle > 0)
            if agreeing >= SHARED * len(others):  # most contenders moved that way: the machine, not one of them
                drift[(machine, run, impl)] = middle
    return drift


def _middle(moves: list[float]) -> float:
    """The median of the moves, but of an even count the middle one nearer zero: every contender on its side of
    the middle moved at least that far, so no single contender's move is averaged into the machine's."""
    ordered = sorted(moves)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[half]
    return min(ordered[half - 1], ordered[half], key=abs)


def change_records(cases: list[CaseHistory]) -> pd.DataFrame:
    """One row per accepted step: where, between which commits, how big, how sure."""
    rows = []
    for index, case in enumerate(cases):
        for machine, step in case.steps:
            series = case.series[machine]
            rows.append(
                {
                    "case": index,
                    "impl": case.impl,
                    "workload": case.label,
                    "machine": machine,
                    "commit_before": step.before.commit,
                    "commit_after": step.after.commit,
                    "run_before": step.before.run_id,
                    "run_after": step.after.run_id,
                    "date_after": pd.Timestamp(step.after.started_at),
                    "median_before_ms": step.median_before_ms,
                    "median_after_ms": step.median_after_ms,
                    "ratio": step.ratio,
                    "change_pct": step.change_pct,
                    "direction": step.direction,
                    "p_value": step.p_value,
                    "confidence": step.confidence,
                    "runs_before": step.n_before,
                    "runs_after": step.n_after,
                    "outliers_before": step.outliers_before,
                    "outliers_after": step.outliers_after,
                    "noise": series.noise_source,
                    "newest": step is series.newest_step(),
                }
            )
    columns = [
        "case",
        "impl",
        "workload",
        "machine",
        "commit_before",
        "commit_after",
        "run_before",
        "run_after",
        "date_after",
        "median_before_ms",
        "median_after_ms",
        "ratio",
        "change_pct",
        "direction",
        "p_value",
        "confidence",
        "runs_before",
        "runs_after",
        "outliers_before",
        "outliers_after",
        "noise",
        "newest",
    ]
    return pd.DataFrame(rows, columns=columns)


def regressions(changes: pd.DataFrame, pct: float) -> pd.DataFrame:
    """Series whose newest step is a slowdown beyond ``pct`` per cent."""
    return changes[changes["newest"] & (changes["change_pct"] > pct)]


def first_seen_since(steps: pd.DataFrame, since: pd.Timestamp) -> pd.DataFrame:
    """The steps whose first run after them started at ``since`` or later (``--since``: one before is a slowdown
    already known, shown and not failed)."""
    return steps[pd.to_datetime(steps["date_after"], utc=True) >= since]


def _run_rows(runs: pd.DataFrame, used: set[str]) -> list[dict[str, Any]]:
    rows = []
    for run in runs.to_dict("records"):
        if run["run_id"] not in used:
            continue
        rows.append(
            {
                "run_id": run["run_id"],
                "name": run.get("name") or "",
                "date": f"{pd.Timestamp(run['started_at']):%Y-%m-%d %H:%M:%S}",
                "commit": commit_label(run.get("git_commit"), run.get("git_dirty")),
                "machine": run.get("machine") or "",
                "suite": run.get("suite") or "",
                "attnbench": run.get("attnbench_version") or "",
                "torch": run.get("torch_version") or "",
                "command": run.get("command") or "",
            }
        )
    return rows


NOISE_SAID = {"repeats": "per-repeat medians", "samples": "samples' IQR", "none": "none recorded"}


def noise_said(case: CaseHistory) -> str:
    """Where a panel's bands come from, by how many of its runs: "per-repeat medians (3 runs), samples' IQR (1 run)"
    — the panel said "noise: mixed", which a reader could not decode, and "noise: repeats" for the first."""
    counts: dict[str, int] = {}
    for series in case.series.values():
        for point in series.points:
            counts[point.noise_source] = counts.get(point.noise_source, 0) + 1
    return ", ".join(
        f"{NOISE_SAID.get(source, source)} ({n} run{'' if n == 1 else 's'})" for source, n in sorted(counts.items())
    )


def write_history(
    cases: list[CaseHistory],
    changes: pd.DataFrame,
    runs: pd.DataFrame,
    out_dir: Path,
    x_mode: str,
    command: str,
    settings: dict[str, Any],
) -> Path:
    """history.html and changes.csv in ``out_dir``."""
    machines = sorted({m for case in cases for m in case.series})
    colours = {m: PALETTE[k % len(PALETTE)] for k, m in enumerate(machines)}
    panels = []
    for index, case in enumerate(cases):
        panels.append(
            {
                "id": f"case-{index}",
                "impl": case.impl,
                "label": case.label,
                "machines": machines_of(case),
                "n_steps": len(case.steps),
                "geometry": panel(case.series, colours, x_mode),
                "noise": noise_said(case),
            }
        )
    table = [
        {
            **row,
            "case_id": f"case-{row['case']}",
            "commit_before": commit_label(row["commit_before"], None),
            "commit_after": commit_label(row["commit_after"], None),
            "date_after": f"{row['date_after']:%Y-%m-%d %H:%M}",
            "before": f"{row['median_before_ms']:.4g}",
            "after": f"{row['median_after_ms']:.4g}",
            "change": f"{row['change_pct']:+.1f}%",
            "confidence": f"{row['confidence']:.4f}",
            "p": f"{row['p_value']:.2g}",
        }
        for row in changes.to_dict("records")
    ]
    used = {p.run_id for case in cases for s in case.series.values() for p in s.points}
    template_text = resources.files("attnbench.reports").joinpath("templates/history.html.j2").read_text()
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    html = environment.from_string(template_text).render(
        panels=panels,
        changes=table,
        runs=_run_rows(runs, used),
        machines=[(m, colours[m]) for m in machines],
        impls=sorted({case.impl for case in cases}),
        x_mode=x_mode,
        command=command,
        settings=settings,
        version=attnbench.__version__,
        generated=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    changes.to_csv(out_dir / "changes.csv", index=False)
    path = out_dir / "history.html"
    write_page(path, html)
    return path


def machines_of(case: CaseHistory) -> str:
    return "|".join(sorted(case.series))
