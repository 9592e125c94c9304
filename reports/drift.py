"""Machine drift between two runs: what ``compare`` divides out, and what the noise model measures beyond it.

A shared machine's speed moves the contenders timed together alike between runs minutes apart (the
contenders of one workload are timed in interleaved rounds, at the same minutes). So the **shift** of a
case between two runs is the median change (log of new/base medians) over its workload's contenders when
it has ``MIN_CONTENDERS_PER_WORKLOAD`` or more, else over all the remaining cases together when they span
``MIN_CASES_FOR_SHIFT`` cases of two contenders or more; a case's **relative change** is its change less
that shift. ``compare`` decides on the relative change (reports.compare) and the noise model from history
(reports.noise_floor) measures the spread of the same quantity between the stored runs, with this one
definition for both.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.runner.results import CASE_COLUMNS

MIN_CASES_FOR_SHIFT = 3  # cases (over ≥ 2 contenders) needed before a run-wide shift is estimated
MIN_CONTENDERS_PER_WORKLOAD = 3  # a workload's own shift is the median of this many contenders or more


def shift_groups(frame: pd.DataFrame) -> list[pd.Index]:
    """Row groups that share a machine drift: the contenders of one workload (timed together in interleaved
    rounds, so at the same minutes) when it has three or more; the rest together, when they span three cases
    over two contenders."""
    key = [c for c in CASE_COLUMNS if c != "impl"]
    groups: list[pd.Index] = []
    rest: list[pd.Index] = []
    for _, group in frame.groupby(key, dropna=False, sort=False):
        (groups if group["impl"].nunique() >= MIN_CONTENDERS_PER_WORKLOAD else rest).append(group.index)
    leftover = frame.loc[[i for index in rest for i in index]]
    if len(leftover) >= MIN_CASES_FOR_SHIFT and leftover["impl"].nunique() >= 2:
        groups.append(leftover.index)
    return groups


def workload_shifts(frame: pd.DataFrame, changes: pd.Series | np.ndarray) -> tuple[pd.Series, bool]:
    """Each row's shift (0 where none is estimated) and whether any was: ``frame`` has ``impl`` and the case
    columns of the cases ok in both runs, ``changes`` their log new/base ratios (in the same order)."""
    changes = pd.Series(np.asarray(changes, dtype=float), index=frame.index)
    shifts = pd.Series(0.0, index=frame.index)
    groups = shift_groups(frame)
    for index in groups:
        shifts[index] = float(np.median(changes[index]))
    return shifts, bool(groups)
