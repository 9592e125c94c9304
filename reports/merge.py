"""`attnbench merge`: shards of one sweep and runs from several machines into one results set.

The merged folder is a run folder like any other (results.parquet, results.csv, meta.json), with the
``run`` and ``machine`` columns kept, so `report` and `compare` read it as they read a single run. Its meta.json
lists the runs it was made of (``merged_from``: each one's name, path and whole meta.json; a merged folder given
to merge is replaced by its own), which `report`, `compare` and `store` read for what each run's meta says
(reports.frames.parts): environment, ceilings, warnings, start time and commit. A case
that appears twice for one machine is an error: that is a repeat, not a shard. Shards of one sweep whose
partitions were computed from different workloads (``shard_plan`` in their meta.json: a different attnbench,
suite file or flags) are refused too: together they would lose some cases and repeat others.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import UsageError
from attnbench.reports.frames import CASE_KEY, Run, all_parts, load_runs, machine_label, workload_label
from attnbench.runner.results import write_frame, write_text


def _shard_of(meta: dict[str, Any]) -> tuple[int, int] | None:
    """(I, N) of a shard's meta ("shard": "I/N"); None for a run that is not a shard; a UsageError for a value
    that is neither (a damaged meta.json)."""
    shard = meta.get("shard")
    if shard is None or shard == "":
        return None
    found = re.fullmatch(r"(\d+)/(\d+)", shard) if isinstance(shard, str) else None
    if found is None:
        raise UsageError(
            f"a run's meta.json says shard {shard!r}, not I/N as run --shard writes it: a damaged meta.json"
        )
    return int(found.group(1)), int(found.group(2))


def _sweep_key(meta: dict[str, Any]) -> tuple[str, str, int] | None:
    """(suite, flags, shard count) of a shard's meta; None for a run that is not a shard."""
    shard = _shard_of(meta)
    if shard is None:
        return None
    return str(meta.get("suite", "")), json.dumps(meta.get("overrides") or {}, sort_keys=True), shard[1]


def _plan_said(plan: Any) -> str:
    if not isinstance(plan, dict):
        return "per case, by an attnbench older than shard plans"
    return f"{plan.get('workloads')} workloads by {plan.get('by')}, plan {plan.get('sha256')}"


def check_shard_plans(names: list[str], metas: list[dict[str, Any]]) -> None:
    """A UsageError where two shards of one sweep (same suite, flags and shard count) were partitioned from
    different plans (_shard.shard_plan): their cases neither add up nor exclude each other."""
    seen: dict[tuple[str, str, int], tuple[str, Any]] = {}
    for name, meta in zip(names, metas, strict=True):
        key = _sweep_key(meta)
        if key is None:
            continue
        plan = meta.get("shard_plan")
        if key not in seen:
            seen[key] = (name, plan)
            continue
        first, first_plan = seen[key]
        if plan != first_plan:
            raise UsageError(
                f"shards {first} and {name} of suite {key[0]} (split into {key[2]}) were planned from different "
                f"sweeps ({first}: {_plan_said(first_plan)}; {name}: {_plan_said(plan)}): plan every shard with the "
                "same attnbench, suite files and flags, and merge shards of one plan"
            )


def _shard_index(meta: dict[str, Any]) -> int:
    """A shard's I (its meta has one: :func:`_sweep_key` said so)."""
    shard = _shard_of(meta)
    assert shard is not None
    return shard[0]


def missing_shards(metas: list[dict[str, Any]]) -> list[str]:
    """A line per sharded sweep some of whose shards are not among the runs merged: its suite, its flags and the
    shards missing (a failed array task of a batch job leaves a merge that lacks its cases)."""
    sweeps: dict[tuple[str, str, int], set[int]] = {}
    for meta in metas:
        key = _sweep_key(meta)
        if key is not None:
            sweeps.setdefault(key, set()).add(_shard_index(meta))
    lines = []
    for (suite, overrides, count), present in sweeps.items():
        absent = [str(i) for i in range(1, count + 1) if i not in present]
        if absent:
            flags = "" if overrides == "{}" else f" with {overrides}"
            lines.append(
                f"suite {suite}{flags} was split into {count} shards and shard(s) {', '.join(absent)} of {count} "
                "are not among these runs: the merged set lacks their cases"
            )
    return lines


def uneven_shards(names: list[str], metas: list[dict[str, Any]]) -> list[str]:
    """A line per sharded sweep whose shards are not each on as many machines: a shard run again (a requeued array
    task on another node: a different host is a different machine, so its cases do not collide and would be in the
    merged set twice), or one machine kind's set of shards that lacks some the other has. Whole copies of a sweep
    (every shard once per machine) are not uneven, nor runs of one shard on one machine (a report pools them)."""
    sweeps: dict[tuple[str, str, int], dict[int, dict[str, list[str]]]] = {}
    for name, meta in zip(names, metas, strict=True):
        key = _sweep_key(meta)
        if key is not None:
            machine = machine_label(meta.get("environment") or {})
            sweeps.setdefault(key, {}).setdefault(_shard_index(meta), {}).setdefault(machine, []).append(name)
    lines = []
    for (suite, overrides, count), shards in sweeps.items():
        if len({len(machines) for machines in shards.values()}) < 2:
            continue
        flags = "" if overrides == "{}" else f" with {overrides}"
        where = {i: "; ".join(f"{', '.join(runs)}: {m}" for m, runs in shards[i].items()) for i in shards}
        said = ", ".join(f"shard {i} on {len(shards[i])} ({where[i]})" for i in sorted(shards))
        lines.append(
            f"the shards of suite {suite}{flags} (split into {count}) are not each on as many machines: {said}; "
            "some workloads are in these runs more often than others, each copy as its machine's: if a shard was run "
            "again (a requeued array task), merge one of its runs"
        )
    return lines


def unfinished_runs(runs: list[Run]) -> list[str]:
    """A line per run that holds fewer rows than it planned (a shard killed mid-sweep, by SIGTERM or its wall
    time, and never resumed): the merged set lacks its other cases, which no missing shard would name."""
    lines = []
    for run in runs:
        planned = run.meta.get("n_cases")
        if isinstance(planned, int) and len(run.frame) < planned:
            lines.append(
                f"run {run.name} stopped after {len(run.frame)} of its {planned} planned cases: the rest are not among "
                f"these runs; continue it with: attnbench run --resume {run.path}"
            )
    return lines


def contender_differences(runs: list[Run]) -> list[str]:
    """A line per sharded sweep whose shards hold different contenders: ``--impl available`` or ``all`` (or an
    installed plugin) resolves on each machine, so a contender one machine lacks is timed on the other shards'
    workloads alone, and the merged report ranks it on those alone. Shards that hold no row are left out."""
    sweeps: dict[tuple[str, str, int], list[tuple[int, str, set[str]]]] = {}
    for run in runs:
        key = _sweep_key(run.meta)
        if key is not None and len(run.frame) and "impl" in run.frame:
            machine = machine_label(run.meta.get("environment") or {})
            ran = run.frame.loc[run.frame["status"] != "unavailable", "impl"]  # --impl all: rows of what it lacks
            sweeps.setdefault(key, []).append((_shard_index(run.meta), machine, set(ran.astype(str))))
    lines = []
    for (suite, _, count), shards in sweeps.items():
        everywhere = set.intersection(*(impls for _, _, impls in shards))
        uneven = sorted(set.union(*(impls for _, _, impls in shards)) - everywhere)
        if not uneven:
            continue
        said = []
        for impl in uneven:
            lacking = [f"{index} ({machine})" for index, machine, impls in sorted(shards) if impl not in impls]
            said.append(f"{impl} not in shard(s) {', '.join(lacking)}")
        lines.append(
            f"the shards of suite {suite} (split into {count}) hold different contenders — {'; '.join(said)}: the "
            "contenders were resolved on each machine (--impl available or all, or a plugin installed on some), so "
            "those are ranked on the other shards' workloads alone; give every shard one --impl list to compare them "
            "on all"
        )
    return lines


def _where(path: Path) -> str:
    """A run's path as merged_from keeps it: absolute where it exists (the merged folder may be read elsewhere)."""
    return str(path.resolve()) if path.exists() else str(path)


def merge_runs(paths: list[Path], out_dir: Path, command: str) -> tuple[pd.DataFrame, list[str]]:
    """The runs' rows in one run folder at ``out_dir``; the frame, and warnings (shards missing, shards that hold
    different contenders)."""
    frame, runs = load_runs(paths)
    runs = all_parts(runs)  # a merged folder given here is the runs it was made of
    for run in runs:
        try:
            _shard_of(run.meta)
        except UsageError as exc:
            raise UsageError(f"{run.path}: {exc}") from None
    check_shard_plans([run.name for run in runs], [run.meta for run in runs])
    # As text, so that missing values (a workload without `hidden`) compare equal.
    keys = pd.Series(["|".join(map(repr, row)) for row in frame[CASE_KEY].itertuples(index=False)], index=frame.index)
    repeated = keys.duplicated(keep=False)
    if repeated.any():
        first = frame[repeated].iloc[0]
        same = frame.loc[keys == keys[repeated].iloc[0], "run"].tolist()
        raise UsageError(
            f"case {first['impl']} {workload_label(first)} on {first['machine']} is in runs {', '.join(same)}: "
            "merge shards or machines, not repeats"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_frame(frame, out_dir)
    meta = {
        "command": command,
        "n_cases": len(frame),
        "merged_from": [{"run": run.name, "path": _where(run.path), "meta": run.meta} for run in runs],
    }
    write_text(out_dir / "meta.json", json.dumps(meta, indent=2, default=str) + "\n")
    return frame, set_warnings(runs)


def set_warnings(runs: list[Run]) -> list[str]:
    """What a set of runs (a merged folder's parts, or the folders given to `report`) lacks or holds twice as
    shards of one sweep: shards missing, a shard in more runs than another, runs that stopped before their end,
    shards that hold different contenders."""
    names, metas = [run.name for run in runs], [run.meta for run in runs]
    return [
        *missing_shards(metas),
        *uneven_shards(names, metas),
        *unfinished_runs(runs),
        *contender_differences(runs),
    ]
