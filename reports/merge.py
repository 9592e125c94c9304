"""`attnbench merge`: shards of one sweep and runs from several machines into one results set.

The merged folder is a run folder like any other (results.parquet, results.csv, meta.json), with the
``run`` and ``machine`` columns kept, so `report` and `compare` read it as they read a single run. A case
that appears twice for one machine is an error: that is a repeat, not a shard.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnbench.errors import UsageError
from attnbench.reports.frames import CASE_KEY, load_runs, workload_label
from attnbench.runner.results import write_frame, write_text


def merge_runs(paths: list[Path], out_dir: Path, command: str) -> pd.DataFrame:
    frame, runs = load_runs(paths)
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
        "merged_from": [{"run": run.name, "path": str(run.path), "meta": run.meta} for run in runs],
    }
    write_text(out_dir / "meta.json", json.dumps(meta, indent=2, default=str) + "\n")
    return frame
