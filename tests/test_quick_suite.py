"""The issue's acceptance run: the quick suite end to end through the installed CLI (about a minute)."""

import json
import time

import pandas as pd
import pytest

from conftest import REPO, attnbench_cmd, run_subprocess

CPU_CONTENDERS = ["naive", "bmm", "einsum", "sdpa_math", "sdpa_flash", "flex", "fused_cpu"]


def _readme_sample() -> list[str]:
    """The lines `nox -s bench` prints in the README's sample, after its `$ nox -s bench` line."""
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("```\n$ nox -s bench\n") :].split("```")[1]
    return block.strip().splitlines()[1:]


@pytest.mark.slow
def test_quick_suite_gives_a_checked_row_for_every_contender(tmp_path):
    start = time.perf_counter()
    # the suite as `nox -s bench` runs it, timed briefly: what is checked here is rows, statuses and output
    result = run_subprocess(*attnbench_cmd("run", "--budget-s", "0.1", "--out", str(tmp_path / "run")), cwd=tmp_path)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(tmp_path / "run" / "results.parquet")
    ok = frame[frame.status.isin(["ok", "stalled"])]  # stalled: checked, timed while the machine stalled
    for impl in CPU_CONTENDERS:
        rows = frame[frame.impl == impl]
        assert rows.status.isin(["ok", "stalled"]).all(), rows[["status", "reason"]]
    assert (ok.max_abs_err <= ok.atol).all()
    xformers = frame[frame.impl == "xformers"]
    assert (xformers.status == "unavailable").all() and xformers.reason.str.contains("xformers").all()
    # every planned case is exactly one row
    assert not frame.duplicated(["impl", "batch", "heads", "kv_heads", "seq_q", "seq_k", "mask"]).any()
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["n_cases"] == len(frame) and meta["finished"]
    print(f"quick suite: {elapsed:.0f} s wall, {len(frame)} rows")  # shown with -s; not asserted (noisy)
    # `nox -s bench` runs this: the README's sample has its table's columns (none a contender can't fill:
    # cascade is left out, and says so) and its count of cases by status
    sample = _readme_sample()
    printed = result.stdout.splitlines()
    assert printed[0].split() == sample[0].split() and "cascade" not in printed[0]
    counts = next(line for line in sample if " cases: " in line)
    got = next(line for line in printed if " cases: " in line)
    assert got == counts or "stalled" in got  # a stalled machine changes the counts, not the plan
    left_out = [line.strip() for line in sample if "left out" in line]
    assert left_out == [line.strip() for line in printed if "left out" in line] and len(left_out) == 1
