import math
import sys
from pathlib import Path

from attnbench import register
from attnbench.runner.cases import RunOptions, run_case
from attnbench.runner.results import COLUMNS, STATUSES
from attnbench.workload import Workload

from conftest import CHECKED, Raising, Shifted

FAST = RunOptions(budget_s=0.05, threads=1)
SMALL = Workload(1, 2, 2, 32, 32, 16)


def test_ok_row_has_every_column_and_consistent_figures():
    row = run_case("bmm", SMALL, FAST)
    assert list(row) == COLUMNS
    assert row["status"] in CHECKED and (row["status"] == "stalled" or row["reason"] == "")
    assert row["n_samples"] == len(row["samples_ms"]) >= 1
    assert min(row["samples_ms"]) <= row["median_ms"] <= max(row["samples_ms"])
    assert math.isclose(row["tflops"], row["flops"] / (row["median_ms"] * 1e-3) / 1e12)
    assert row["flops"] == 2 * 2 * 32 * 32 * 32
    assert row["max_abs_err"] < row["atol"] and row["threads"] == 1 and row["first_call_ms"] > 0


def test_wrong_contender_is_incorrect_but_keeps_its_time(planted):
    register(Shifted())
    planted.append(Shifted.name)
    row = run_case(Shifted.name, SMALL, FAST)
    assert row["status"] == "incorrect"
    assert "over tolerance" in row["reason"] and row["median_ms"] > 0


def test_raising_contender_is_an_error_row_with_its_lines_on_one_line(planted):
    register(Raising)
    planted.append(Raising.name)
    row = run_case(Raising.name, SMALL, FAST)
    assert row["status"] == "error"
    conftest = Path(sys.modules[Raising.__module__].__file__)
    line = next(n for n, text in enumerate(conftest.read_text().splitlines(), 1) if '"planted failure' in text)
    assert row["reason"] == f"RuntimeError: planted failure; second line (raised in run, conftest.py:{line})"


def test_backward_passes_of_a_forward_only_contender_are_unsupported_with_a_reason():
    row = run_case("naive", Workload(1, 2, 2, 8, 8, 4, pass_="fwd_bwd"), FAST)
    assert row["status"] == "unsupported" and "backward" in row["reason"]


def test_status_vocabulary():
    assert STATUSES == (
        "ok",
        "unavailable",
        "unsupported",
        "skipped",
        "oom",
        "timeout",
        "error",
        "incorrect",
        "stalled",
    )
