"""A case timed while the machine stalled (its FMA yardstick collapsed in its rounds) is timed again, and if
still stalled gets the status ``stalled``: its time kept and shown, never ranked as a clean figure."""

import os
import subprocess
import sys
import time

import pytest
import torch

from attnbench.measure import _yardsticks as yardsticks
from attnbench.reports.summary import summary_table
from attnbench.runner import cases as runner
from attnbench.runner._noise import result_warnings
from attnbench.runner.cases import RunOptions, run_group
from attnbench.runner.results import rows_to_frame
from attnbench.workload import Workload

# serial: beside other tests the threads' real waits for a core give the stall's reason before the planted yardstick
pytestmark = pytest.mark.serial
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
    # shown with its mark, no clean figure to rank, and the fastest column says so (it was blank)
    assert "~" in table and table.splitlines()[-1].endswith("no ranked contender: all 2 stalled"), table
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
@pytest.mark.parametrize("competitor", ["busy loops", "busy loops niced"])
def test_busy_loops_on_every_core_stall_the_rows_timed_meanwhile_unless_niced(monkeypatch, competitor):
    """The real thing, on a quiet machine (`nox -s timing_checks -- -k stall -s` prints the figures): a clean
    group, then three timed while busy loops run on every core. At the same priority the threads wait for a
    core much of their time (and a fifth of the rounds' FMA calls collapse): every row is `stalled`, never
    `ok` more than 1.5x its quiet time; niced to 19, the loops leave the rows (nearly) clean and `ok`."""
    cores = os.cpu_count() or 1
    options = RunOptions(budget_s=0.3, measure_memory=False, threads=cores)
    workload = Workload(1, 8, 8, 256, 256, 64)
    quiet = run_group(["bmm", "einsum"], workload, options)
    assert [row["status"] for row in quiet] == ["ok", "ok"]
    reference = yardsticks.for_threads(cores).quiet["fma_gflops"]
    timings = []
    real = runner.time_cpu_rounds
    monkeypatch.setattr(runner, "time_cpu_rounds", lambda *a, **k: timings.append(real(*a, **k)) or timings[-1])
    nice = (lambda: os.nice(19)) if competitor.endswith("niced") else None
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=nice) for _ in range(2 * cores)]
    try:
        time.sleep(0.5)
        rows = [row for _ in range(3) for row in run_group(["bmm", "einsum"], workload, options)]
    finally:
        for hog in hogs:
            hog.kill()
    rates = [r / reference for t in timings for one in t.values() for r in one.yardstick_rounds["fma_gflops"]]
    collapsed = sum(r < yardsticks.STALL_FRACTION for r in rates) / len(rates)
    slowdown = [row["median_ms"] / quiet[i % 2]["median_ms"] for i, row in enumerate(rows)]
    waited = [row["waited_pct"] or 0.0 for row in rows]
    print(
        f"{competitor}: {collapsed:.0%} of {len(rates)} rounds' FMA yardstick collapsed; threads waited "
        f"{min(waited):.0f}-{max(waited):.0f} % (quiet {max(r['waited_pct'] or 0.0 for r in quiet):.0f} %); "
        f"statuses {[r['status'] for r in rows]}; times {min(slowdown):.2f}-{max(slowdown):.2f}x quiet"
    )
    for row, slower in zip(rows, slowdown, strict=True):
        assert row["status"] == "stalled" or slower < 1.5, (row["status"], slower, row["reason"])
    if competitor == "busy loops":
        assert collapsed >= yardsticks.STALL_SHARE and all(row["status"] == "stalled" for row in rows)
    else:
        assert all(row["status"] == "ok" for row in rows)


def test_one_preempted_round_is_not_a_stall_but_a_quarter_of_many_is():
    sticks = yardsticks.Yardsticks(library=None, fma_code=0, fma_iters=0, threads=1, array=torch.empty(1), chunk=1)  # type: ignore[arg-type]
    sticks.quiet = {"fma_gflops": 40.0}
    assert sticks.stalled({"fma_gflops": [40.0, 39.0, 1.0, 41.0]}) is None  # one round of four
    assert sticks.stalled({"fma_gflops": [40.0, 1.0, 1.0, 41.0]}) is None  # two: fewer than STALL_ROUNDS
    assert sticks.stalled({"fma_gflops": [1.0, 1.0]}) is not None  # every round of a short case
    assert sticks.stalled({"fma_gflops": [1.0] * 3 + [40.0] * 27}) is not None  # a tenth of thirty
    assert sticks.stalled({"fma_gflops": [1.0] * 3 + [40.0] * 28}) is None  # under a tenth
    assert sticks.stalled({"fma_gflops": [25.0] * 12}) is None  # slower, not stalled: above half the quiet rate
    assert sticks.stalled({}) is None  # no yardstick (kernels not built): nothing to say


def test_the_wait_for_a_core_is_read_from_linux_and_kept_in_the_row():
    from attnbench.measure._cpu_wait import waited_ns

    if waited_ns() is None:
        pytest.skip("this system does not say how long its threads waited for a core (/proc/self/task/*/schedstat)")
    (row,) = run_group(["bmm"], WORKLOAD, RunOptions(budget_s=0.05, measure_memory=False, yardsticks=False))
    assert row["waited_pct"] is not None and 0 <= row["waited_pct"] < 100
