"""Calibrate ``attnbench compare`` on this machine: how often it cries wolf, how often it catches a slowdown.

``python -m attnbench.reports.calibrate`` (``nox -s calibrate``) makes N identical runs of the ``calibrate``
suite (bmm, einsum, sdpa_flash at S 512/1024, none/causal) with ``--repeat 3``, then

* compares every pair of runs (A/A: the same code twice): every ``faster`` or ``slower`` verdict is a false
  alarm;
* compares every pair again with one contender's stored times in the newer run multiplied by 1.10 and by
  1.25 (all its time columns: median, samples, per-repeat medians; the noise stays the real one): every
  case of it not called ``slower`` is a miss;
* prints the false-alarm rate, the detection rates (per case, and per pair: every case of the contender
  caught), and the spread of the repeated medians per contender — the noise this machine has.

It times things, so it is not a test; its output goes into the README.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.reports.compare import Settings, compare_frames

SLOWDOWNS = (1.10, 1.25)
TIME_COLUMNS = ("median_ms", "iqr_ms")
LIST_COLUMNS = ("samples_ms", "repeat_medians_ms")
RATE_COLUMNS = ("tflops", "gbps", "pct_of_peak", "pct_of_matmul")


def slowed(frame: pd.DataFrame, impl: str, factor: float) -> pd.DataFrame:
    """A copy of a run's results with ``impl``'s stored times multiplied by ``factor``."""
    frame = frame.copy()
    chosen = frame["impl"] == impl
    for column in TIME_COLUMNS:
        frame.loc[chosen, column] = frame.loc[chosen, column] * factor
    for column in RATE_COLUMNS:
        if column in frame:
            frame.loc[chosen, column] = frame.loc[chosen, column] / factor
    for column in LIST_COLUMNS:
        frame[column] = [
            [v * factor for v in values] if pick and values is not None else values
            for values, pick in zip(frame[column], chosen, strict=True)
        ]
    return frame


def make_runs(count: int, repeat: int, out: Path, extra: list[str]) -> list[Path]:
    runs = []
    for index in range(count):
        target = out / f"run-{index + 1}"
        command = [sys.executable, "-m", "attnbench", "run", "--suite", "calibrate", "--repeat", str(repeat),
                   "--progress", "off", "--out", str(target), *extra]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        print(f"run {index + 1}/{count}: {target} ({time.perf_counter() - start:.0f} s)", flush=True)
        runs.append(target)
    return runs


def calibrate(frames: list[pd.DataFrame], settings: Settings) -> dict[str, object]:
    """False alarms over all A/A pairs and detection of injected slowdowns, as counts and rates."""
    aa_decisions = aa_alarms = 0
    caught = {f: [0, 0] for f in SLOWDOWNS}  # cases caught, cases
    pairs_caught = {f: [0, 0] for f in SLOWDOWNS}  # (pair, contender) with every case caught, total
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


def spread_table(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per contender: the median relative range of the per-repeat medians within a run, and of the
    medians between runs (the drift a single run's samples cannot see)."""
    rows = []
    joined = pd.concat([f.assign(run=i) for i, f in enumerate(frames)], ignore_index=True)
    joined = joined[joined["status"] == "ok"]
    keys = ["impl", "seq_q", "mask"]
    for impl, group in joined.groupby("impl"):
        within = [max(v) / min(v) - 1 for v in group["repeat_medians_ms"] if v is not None and len(v) > 1]
        between = [g["median_ms"].max() / g["median_ms"].min() - 1 for _, g in group.groupby(keys)]
        rows.append({"impl": impl, "within_run_repeat_spread": float(np.median(within)) if within else np.nan,
                     "between_run_spread": float(np.median(between)) if between else np.nan})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.reports.calibrate", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="identical runs to make (default 6)")
    parser.add_argument("--repeat", type=int, default=3, help="--repeat of each run (default 3)")
    parser.add_argument("--out", help="folder for the runs (default: a temporary folder)")
    parser.add_argument("--use", nargs="*", default=None, help="existing run folders instead of new runs")
    args, extra = parser.parse_known_args(argv)
    settings = Settings()
    if args.use:
        runs = [Path(p) for p in args.use]
    else:
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="attnbench-calibrate-"))
        runs = make_runs(args.runs, args.repeat, out, extra)
    frames = [pd.read_parquet(run / "results.parquet") for run in runs]
    result = calibrate(frames, settings)
    decisions, alarms = result["aa_decisions"], result["aa_alarms"]
    assert isinstance(decisions, int) and isinstance(alarms, int)
    print(f"\nA/A: {len(runs)} runs, {len(runs) * (len(runs) - 1) // 2} pairs, {decisions} decisions, "
          f"{alarms} false alarm(s) = {alarms / max(decisions, 1):.1%}")  # fmt: skip
    caught, pairs = result["caught"], result["pairs_caught"]
    assert isinstance(caught, dict) and isinstance(pairs, dict)
    for factor in SLOWDOWNS:
        hits, total = caught[factor]
        whole, count = pairs[factor]
        print(
            f"slowdown ×{factor:.2f}: {hits}/{total} cases caught = {hits / max(total, 1):.1%}; "
            f"every case of the contender caught in {whole}/{count} pair×contender = {whole / max(count, 1):.1%}"
        )
    print("\nspread of medians (median over cases; relative range):")
    print(spread_table(frames).to_string(index=False, float_format=lambda v: f"{v:.1%}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
