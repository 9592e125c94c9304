"""Several runs of one machine in one report: each contender's rows of a case pooled into one row.

`attnbench report RUN RUN …` takes any runs; two of one machine hold each case twice. Ranking by a contender's
faster row (as the headline once did) is best-of-N: a contender in more runs, or a noisier one, wins more often,
and the headline's median is one run's while the figures drew the mean of both (seaborn's default) with an
unlabelled band. Pooled, every number of the page — the headline's median, its margin and noise test, the
speedup map and every figure — is one figure per contender and case: the median over its processes in every run
(each run's, or each ``--repeat`` process' median), as ``--repeat`` pools a run's processes
(``attnbench.runner._repeats``). A lead is then decided run by run where both contenders ran in the same runs
(``ranking.beyond_noise``: every run's own rows must show it; a run's contenders were timed in the same
interleaved rounds, while a machine's drift between runs moves them all), else on the spread between runs (each
of the fastest's process medians below each of the runner-up's). Runs of one machine that ran different code
are still pooled, with a warning (:func:`code_differences`).

Only ``ok`` rows are pooled (a stalled or incorrect row never ranks). A case in one run only is that run's row.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnbench.reports.frames import CASE_KEY, Run, machine_label
from attnbench.runner._repeats import listed, pool_processes

RUNS = "runs"  # the column saying how many runs' rows a pooled row stands for


def _medians(row: dict[str, Any]) -> list[float]:
    """A row's process medians: its ``--repeat`` processes', else its own median."""
    return listed(row.get("repeat_medians_ms")) or [float(row["median_ms"])]


PER_RUN = "per_run"  # a pooled row's own rows' timing, one per run: what ranking.beyond_noise pairs run by run
_PER_RUN_FIELDS = ("run", "median_ms", "samples_ms", "repeat_medians_ms")
SCALED = ("cold_median_ms",)  # other times of one call: the middle run's, scaled to the pooled median as the rates


def _pool(rows: list[dict[str, Any]]) -> dict[str, Any]:
    pooled, scale = pool_processes(rows, [m for row in rows for m in _medians(row)])
    pooled.update(
        samples_ms=pooled["samples_ms"] or None,
        n_samples=len(pooled["samples_ms"]) if pooled["samples_ms"] else pooled.get("n_samples"),
        run=", ".join(dict.fromkeys(str(row.get("run")) for row in rows)),
        **{RUNS: len(rows), PER_RUN: [{key: row.get(key) for key in _PER_RUN_FIELDS} for row in rows]},
    )
    for column in SCALED:
        if pooled.get(column) is not None and pooled[column] == pooled[column]:
            pooled[column] = float(pooled[column]) / scale
    return pooled


def pool_runs(ok: pd.DataFrame) -> pd.DataFrame:
    """``ok`` rows with each (machine, case, contender) once: a case in several runs pooled (the module's rule),
    with ``runs`` the number of rows it stands for (1 where the case is in one run) and, where pooled, ``per_run``
    its rows' own timing. A frame already pooled is returned as it is."""
    if RUNS in ok.columns:
        return ok
    if ok.empty:
        return ok.assign(**{RUNS: pd.Series(dtype="int64")})
    key = [c for c in CASE_KEY if c in ok.columns]
    group = ok.groupby(key, sort=False, dropna=False).ngroup()
    if group.nunique() == len(ok):
        return ok.assign(**{RUNS: 1})
    cases: dict[int, list[dict[str, Any]]] = {}
    records: list[dict[str, Any]] = ok.to_dict("records")  # type: ignore[assignment]
    for number, row in zip(group, records, strict=True):
        cases.setdefault(number, []).append(row)
    rows = [_pool(members) if len(members) > 1 else {**members[0], RUNS: 1} for members in cases.values()]
    pooled = pd.DataFrame(rows, columns=[*ok.columns, RUNS, PER_RUN])
    for column, dtype in ok.dtypes.items():  # the frame's own types (Int64, boolean), not object
        try:
            pooled[column] = pooled[column].astype(dtype)
        except (TypeError, ValueError):
            continue
    return pooled


_CODE = {"torch_version": "torch", "attnbench_version": "attnbench", "git_commit": "commit", "git_dirty": "dirty"}


def _code_facts(environment: dict[str, Any]) -> dict[str, str]:
    """What code a run ran, as {what: value}: torch, attnbench, its commit (12 characters) and edits, and each
    plugin's version and commit (``plugin NAME``; absent from a meta.json written before plugins were recorded)."""
    facts = {said: str(environment.get(key)) for key, said in _CODE.items()}
    facts["commit"] = facts["commit"][:12]
    return {**facts, **{f"plugin {name}": str(value) for name, value in (environment.get("plugins") or {}).items()}}


def code_differences(runs: list[Run]) -> list[str]:
    """A line per machine whose runs in the report ran different code (torch, attnbench, its commit or edits, a
    plugin's version or commit): their cases are pooled as repeats of one contender, which they are not;
    ``attnbench compare`` tells them apart."""
    by_machine: dict[str, list[Run]] = {}
    for run in runs:
        by_machine.setdefault(machine_label(run.meta.get("environment") or {}), []).append(run)
    lines = []
    for machine, group in by_machine.items():
        if len(group) < 2:
            continue
        facts = {run.name: _code_facts(run.meta.get("environment") or {}) for run in group}
        recorded = [run for run in group if "plugins" in (run.meta.get("environment") or {})]
        plugins = sorted({what for run in recorded for what in facts[run.name] if what.startswith("plugin ")})
        differ = []
        for what in [*_CODE.values(), *plugins]:
            runs_of: dict[str, list[str]] = {}
            for run in group if what in _CODE.values() else recorded:
                runs_of.setdefault(facts[run.name].get(what, "not installed"), []).append(run.name)
            if len(runs_of) > 1:  # each value once, with the runs that have it
                differ.append(
                    f"{what} " + " / ".join(f"{value} ({', '.join(names)})" for value, names in runs_of.items())
                )
        if differ:
            names = ", ".join(run.name for run in group)
            lines.append(
                f"runs {names} of {machine} ran different code ({'; '.join(differ)}): a case in several of them is "
                f"pooled as repeats of one contender — compare them with `attnbench compare` instead"
            )
    return lines
