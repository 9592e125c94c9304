import math
import sys
from pathlib import Path

import torch

from attnbench import Capabilities, Contender, make_inputs, register
from attnbench.runner.cases import RunOptions, run_case, run_group
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


class ScalesQInPlace(Contender):
    """An author's kernel that folds the softmax scale into q in place — in its call, or once in prepare."""

    name = "planted_scales_q"
    capabilities = Capabilities(devices=frozenset({"cpu"}), masks=frozenset({"none"}))
    in_prepare = False

    def prepare(self, inputs, workload):
        q, k, v = inputs.q, inputs.k, inputs.v
        if self.in_prepare:
            q.mul_(inputs.scale)
            return lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return lambda: torch.softmax(q.mul_(inputs.scale) @ k.transpose(-1, -2), -1) @ v


class KeepsWhatItGot(Contender):
    """Records the q it was given."""

    name = "planted_keeps_q"
    capabilities = Capabilities(devices=frozenset({"cpu"}), masks=frozenset({"none"}))

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def prepare(self, inputs, workload):
        self.seen.append(inputs.q.clone())
        q, k, v = inputs.q, inputs.k, inputs.v
        return lambda: torch.softmax(q @ k.transpose(-1, -2) * inputs.scale, -1) @ v


def test_a_contender_that_writes_into_its_inputs_is_an_error_and_the_next_gets_them_as_made(planted):
    """A kernel that scaled q in place was 'incorrect — wrong in every row', which said nothing of why, and the
    contenders after it in the workload were checked and timed on the q it left (scaled by scale^calls, a q of
    denormals): now its row is an error naming the input, and the next contender reads q as made."""
    scales, keeps = ScalesQInPlace(), KeepsWhatItGot()
    for contender in (scales, keeps):
        register(contender)
        planted.append(contender.name)
    workload = Workload(1, 2, 2, 32, 32, 16)
    for in_prepare in (False, True):
        scales.in_prepare = in_prepare
        keeps.seen.clear()
        wrote, kept = run_group([scales.name, keeps.name], workload, FAST)
        assert wrote["status"] == "error" and wrote["reason"].startswith(
            f"InputsModified: {scales.name} wrote into its input q in place (in prepare or its first call); "
        ), wrote["reason"]
        assert kept["status"] in CHECKED and torch.equal(keeps.seen[0], make_inputs(workload).q)


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
