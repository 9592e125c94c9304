"""Calibrate attnbench's three answers to "is it slower?" on this machine, and print one table of them.

``python -m attnbench.reports.calibrate --ab`` (``nox -s calibrate``) reports A/A false alarms and the
detection of ×1.05, ×1.10 and ×1.25 slowdowns for

(a) ``attnbench ab``, A/B in one process (reports.calibrate_ab: real extra work, not a sleep; with ``--ab``);
(b) run-vs-run ``compare`` by each of its methods — raw, yardstick-normalised, floors from history, both
    (reports.calibrate_runs.run_vs_run) — and names the best one (A/A false alarms ≤ 1 %, most caught);
(c) ``history``'s change detection over the runs as ten commits with a real +10 % CPU-bound step at run
    ``--step-at`` (reports.calibrate_runs.history_detection): the step must be found at that run, the
    other series must show none.

The runs: ``--runs`` (default 10) runs of the calibrate suite with ``--repeat`` (default 3) plus the
``calib_step`` contender (see reports.calibrate_runs). ``--use RUN…`` reads runs made before instead
(made by this module: they have ``calib_step``). ``--quick`` makes a small version (4 runs at S 256,
short budgets, ab 1 pass) that checks the machinery, not the machine. It times things, so it is not a
test; its figures belong to a quiet machine.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from attnbench.measure.environment import cpu_name
from attnbench.reports import calibrate_runs
from attnbench.reports.calibrate_ab import calibrate_ab, rates
from attnbench.reports.calibrate_runs import (
    METHODS,
    SLOWDOWNS,
    best_method,
    history_detection,
    load,
    run_vs_run,
    slowed,
)
from attnbench.reports.compare import Settings, compare_frames
from attnbench.runner.ab import DEFAULT_BUDGET_S

# --quick: 4 runs at S 256 with short budgets, the step at run 3, ab one pass: the machinery, not the machine.
QUICK_RUNS, QUICK_STEP_AT, QUICK_REPEAT, QUICK_AB_PASSES, QUICK_AB_BUDGET_S = 4, 3, 2, 1, 0.5
QUICK_AXES: dict[str, Any] = {"seq": [256], "budget_s": 0.05}
HEADERS = ["answer", "A/A false alarms", *(f"×{f:.2f}" for f in SLOWDOWNS), "real +10 % step"]


def _rate(hits: int, total: int, digits: int = 0) -> str:
    return f"{hits}/{total} = {hits / total:.{digits}%}" if total else "–"


def compare_rows(table: pd.DataFrame) -> list[list[str]]:
    """(b): one line per compare method."""
    lines = []
    for row in table.to_dict("records"):
        lines.append(
            [
                f"compare, {row['method']}",
                _rate(row["aa_hits"], row["aa_total"], 1),
                *(_rate(row[f"{f}_hits"], row[f"{f}_total"]) for f in SLOWDOWNS),
                _rate(row["real_hits"], row["real_total"]),
            ]
        )
    return lines


def history_row(found: dict[str, Any], label: str, step_at: int) -> list[str]:
    """(c): steps reported in the A/A series, and the step series found at the right run."""
    size = f" ({found['step_change_pct']:+.1f} %)" if found["step_change_pct"] is not None else ""
    elsewhere = f", {found['step_elsewhere']} elsewhere" if found["step_elsewhere"] else ""
    aa = f"{found['aa_steps']} step(s) in {found['aa_series']} series"
    step = f"{found['step_found']}/{found['step_series']} series at run {step_at}{size}{elsewhere}"
    return [f"history, {label}", aa, "", "", "", step]


def markdown(rows: list[list[str]]) -> str:
    """The table as docs/compare.md quotes it."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def calibrate(frames: list[pd.DataFrame], settings: Settings) -> dict[str, object]:
    """Raw compare over every pair of runs: A/A decisions and false alarms, and per slowdown factor the cases
    caught and the (pair, contender)s with every case caught (of the newer run's contender ×factor)."""
    aa_decisions = aa_alarms = 0
    caught = {f: [0, 0] for f in SLOWDOWNS}
    pairs_caught = {f: [0, 0] for f in SLOWDOWNS}
    for base, new in itertools.combinations(frames, 2):
        table = compare_frames(base, new, settings).table
        decided = table[table["verdict"].isin(["faster", "slower", "same", "unclear"])]
        aa_decisions += len(decided)
        aa_alarms += int(decided["verdict"].isin(["faster", "slower"]).sum())
        for factor, impl in itertools.product(SLOWDOWNS, sorted(set(base["impl"]))):
            verdicts = compare_frames(base, slowed(new, impl, factor), settings).table
            mine = verdicts[(verdicts["impl"] == impl) & verdicts["ratio"].notna()]
            hits = int((mine["verdict"] == "slower").sum())
            caught[factor][0] += hits
            caught[factor][1] += len(mine)
            pairs_caught[factor][0] += int(hits == len(mine))
            pairs_caught[factor][1] += 1
    return {"aa_decisions": aa_decisions, "aa_alarms": aa_alarms, "caught": caught, "pairs_caught": pairs_caught}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.reports.calibrate", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="identical runs to make (default 10)")
    parser.add_argument("--step-at", type=int, default=6, help="first run with calib_step's +10 %% step (default 6)")
    parser.add_argument("--repeat", type=int, default=3, help="--repeat of each run (default 3)")
    parser.add_argument("--ab", action="store_true", help="also calibrate `attnbench ab` (reports.calibrate_ab)")
    parser.add_argument(
        "--ab-passes",
        type=int,
        default=13,
        help="ab's A/A passes over its 8 cases (default 13; a quarter as many per slowdown)",
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast version: checks the machinery only")
    parser.add_argument("--out", help="folder for the runs (default: a temporary folder)")
    parser.add_argument("--use", nargs="*", default=None, help="existing run folders (made by this module)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs_count, step_at, repeat = (
        (QUICK_RUNS, QUICK_STEP_AT, QUICK_REPEAT) if args.quick else (args.runs, args.step_at, args.repeat)
    )
    rows: list[list[str]] = []
    if args.ab:
        passes, budget = (QUICK_AB_PASSES, QUICK_AB_BUDGET_S) if args.quick else (args.ab_passes, DEFAULT_BUDGET_S)
        found = rates(calibrate_ab(["bmm", "sdpa_flash"], passes, max(1, passes // 4), budget))
        rows.append(["ab, one process", found["A/A false alarms"], *(found[f"×{f:.2f}"] for f in SLOWDOWNS), ""])
    if args.use:
        runs = [Path(p) for p in args.use]
    else:
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="attnbench-calibrate-"))
        axes = dict(QUICK_AXES) if args.quick else {}
        runs = calibrate_runs.make_runs(runs_count, step_at, repeat, out, axes)
    frames, metas = load(runs)
    table = run_vs_run(frames, metas, step_at)
    rows += compare_rows(table)
    for label, normalise_times in (("raw", False), ("yardstick", True)):
        rows.append(history_row(history_detection(frames, metas, step_at, normalise_times), label, step_at))
    print()
    print(markdown(rows))
    for row in table.to_dict("records"):
        listed = "".join(f"\n  {alarm}" for alarm in row["aa_cases"])
        print(f"\nA/A false alarms, compare {row['method']}: {len(row['aa_cases'])}{listed}")
    print(
        f"\nbest run-vs-run method: {best_method(table)} (of {', '.join(METHODS)}: A/A false alarms ≤ 1 %, "
        "then most ×1.10 caught)"
    )
    print(
        f"machine: {cpu_name()}, {torch.get_num_threads()} threads; {len(runs)} runs "
        f"({len(runs) * (len(runs) - 1) // 2} pairs), step at run {step_at}; {time.perf_counter() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
