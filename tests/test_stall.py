"""A case timed while the machine stalled (its FMA yardstick collapsed in its rounds) is timed again, and if
still stalled gets the status ``stalled``: its time kept and shown, never ranked as a clean figure."""

import os
import subprocess
import sys
import time

import pytest
import torch

from attnbench import runner, yardsticks
from attnbench.noise import result_warnings
from attnbench.reports.summary import summary_table
from attnbench.results import rows_to_frame
from attnbench.runner import RunOptions, run_group
from attnbench.workload import Workload

WORKLOAD = Workload(1, 2, 2, 64, 64, 16)
OPTIONS = RunOptions(budget_s=0.05, measure_memory=False)


@pytest.fixture
def planted_stall(monkeypatch):
    """Yardsticks whose FMA rate is 40 GFLOP/s when quiet and 0.03 while ``state["stalled"]`` (the gpt-oss row's
    0.033 against 41); ``state["attempts_stalled"]``: how many timings of a group the stall lasts."""
    sticks = yardsticks.Yardsticks(library=None, fma_code=0, fma_iters=0, threads=1, array=torch.empty(1), chunk=1)  # type: ignore[arg-type]
    sticks.quiet = {"fma_gflops": 40.0}
    state = {"attempts_stalled": 0, "timings": 0}
    sticks.callables = lambda: {"fma_gflops": lambda: 0.03 if state["timings"] < state["attempts_stalled"] else 40.0}  # type: ignore[method-assign]
    real = runner.time_cpu_rounds

    def counted(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            state["timings"] += 1

    monkeypatch.setattr(runner, "time_cpu_rounds", counted)
    monkeypatch.setattr(yardsticks, "for_threads", lambda threads: sticks)
    return state


def test_a_group_stalled_in_both_timings_is_stalled_shown_and_never_ranked(planted_stall):
    planted_stall["attempts_stalled"] = 2
    rows = run_group(["bmm", "einsum"], WORKLOAD, OPTIONS)
    assert planted_stall["timings"] == 2  # timed once more before giving up
    assert [row["status"] for row in rows] == ["stalled", "stalled"]
    for row in rows:
        assert row["median_ms"] > 0 and row["yardstick_fma_gflops"] == pytest.approx(0.03)
        assert row["reason"].startswith("the machine stalled while it was timed (twice): its FMA yardstick ran below")
        assert (
            f"below 50% of its quiet 40 GFLOP/s in {row['n_samples']} of {row['n_samples']} rounds (median 0.03)"
            in row["reason"]
        )
    frame = rows_to_frame(rows)
    table = summary_table(frame)
    assert "~" in table and "fastest" not in table  # shown with its mark, no clean figure to rank
    (warning,) = [w for w in result_warnings(frame) if "stalled" in w]
    assert (
        warning.startswith("2 case(s) stalled (the machine stalled while they were timed") and "bmm, einsum" in warning
    )


def test_a_stall_that_passed_before_the_second_timing_gives_clean_rows(planted_stall):
    planted_stall["attempts_stalled"] = 1
    rows = run_group(["bmm", "einsum"], WORKLOAD, OPTIONS)
    assert planted_stall["timings"] == 2
    assert [row["status"] for row in rows] == ["ok", "ok"]
    assert all(row["yardstick_fma_gflops"] == pytest.approx(40.0) for row in rows)
    assert "fastest" in summary_table(rows_to_frame(rows))


def test_a_quiet_group_is_timed_once_and_raises_the_quiet_rate(planted_stall):
    rows = run_group(["bmm"], WORKLOAD, OPTIONS)
    assert planted_stall["timings"] == 1 and rows[0]["status"] == "ok"


@pytest.mark.timing
def test_a_second_process_hogging_every_core_makes_the_rows_timed_meanwhile_stalled():
    """The real thing, on a quiet machine: a clean group, then one timed while busy loops hog every core. Some
    row is stalled, and a row still reported ok is a clean figure (within 1.5x of its quiet time)."""
    options = RunOptions(budget_s=0.3, measure_memory=False, threads=os.cpu_count() or 1)
    workload = Workload(1, 8, 8, 256, 256, 64)
    quiet = run_group(["bmm", "einsum"], workload, options)
    assert [row["status"] for row in quiet] == ["ok", "ok"]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.5)
        rows = run_group(["bmm", "einsum"], workload, options)
    finally:
        for hog in hogs:
            hog.kill()
    assert any(row["status"] == "stalled" for row in rows), [row["median_ms"] for row in rows]
    for before, row in zip(quiet, rows, strict=True):
        assert row["status"] == "stalled" or row["median_ms"] < 1.5 * before["median_ms"], (before, row)


def test_one_preempted_round_is_not_a_stall_but_a_quarter_of_many_is():
    sticks = yardsticks.Yardsticks(library=None, fma_code=0, fma_iters=0, threads=1, array=torch.empty(1), chunk=1)  # type: ignore[arg-type]
    sticks.quiet = {"fma_gflops": 40.0}
    assert sticks.stalled({"fma_gflops": [40.0, 39.0, 1.0, 41.0]}) is None  # one round of four
    assert sticks.stalled({"fma_gflops": [40.0, 1.0, 1.0, 41.0]}) is None  # two: fewer than STALL_ROUNDS
    assert sticks.stalled({"fma_gflops": [1.0, 1.0]}) is not None  # every round of a short case
    assert sticks.stalled({"fma_gflops": [1.0] * 3 + [40.0] * 9}) is not None  # a quarter of twelve
    assert sticks.stalled({"fma_gflops": [1.0] * 3 + [40.0] * 10}) is None  # under a quarter
    assert sticks.stalled({"fma_gflops": [25.0] * 12}) is None  # slower, not stalled: above half the quiet rate
    assert sticks.stalled({}) is None  # no yardstick (kernels not built): nothing to say
