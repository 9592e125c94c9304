"""Interleaved rounds, repeats across processes, and a dead worker told apart from a hung one (issue 11, 12)."""

import json
import statistics
import time

import pandas as pd
import pytest

from attnbench import register
from attnbench.measure.stopwatch import SampleError, Timing, time_cpu_rounds
from attnbench.runner._repeats import merge_repeats
from attnbench.runner.cases import RunOptions, run_group
from attnbench.workload import Workload

from conftest import CHECKED, Raising, attnbench_cmd, run_subprocess

FAST = RunOptions(budget_s=0.05, threads=1)
SMALL = Workload(1, 2, 2, 32, 32, 16)


def test_every_round_samples_each_contender_once_in_a_seeded_shuffled_order():
    seen: list[str] = []
    fns = {name: (lambda: None) for name in "abcd"}
    # estimates near a no-op's true cost (~0.1 µs), so a sample's block lasts MIN_SAMPLE_S and the budget is spent
    # in a few dozen rounds (estimated at 1e-4 s, its samples took a thousandth of the budget's share and the rounds
    # ran on to MAX_SAMPLES: 8–83 s)
    estimates = dict.fromkeys(fns, 1e-7)
    results = time_cpu_rounds(fns, 1, 0.05, estimates, seed=3, on_sample=seen.append)
    timings = list(results.values())
    assert all(isinstance(t, Timing) for t in timings)
    rounds = timings[0].rounds  # type: ignore[union-attr]
    assert all(t.rounds == rounds for t in timings)  # type: ignore[union-attr]
    assert len(seen) == sum(t.n_samples for t in timings)  # type: ignore[union-attr]
    full = [seen[i : i + 4] for i in range(0, 4 * min(t.n_samples for t in timings), 4)]  # type: ignore[union-attr]
    assert len(full) >= 3 and all(sorted(order) == list("abcd") for order in full)
    assert len({tuple(order) for order in full}) > 1  # shuffled per round
    again: list[str] = []
    time_cpu_rounds(fns, 1, 0.05, estimates, seed=3, on_sample=again.append)
    assert again[:8] == seen[:8]  # the shuffle is seeded


def test_a_contender_that_raises_while_sampled_drops_out_alone():
    calls = {"n": 0}

    def flaky() -> None:
        calls["n"] += 1
        if calls["n"] > 50:
            raise RuntimeError("gave up")

    results = time_cpu_rounds({"good": lambda: None, "flaky": flaky}, 1, 0.05, {"good": 1e-4, "flaky": 1e-4})
    assert isinstance(results["good"], Timing) and results["good"].n_samples >= 5
    assert isinstance(results["flaky"], SampleError) and "gave up" in str(results["flaky"].cause)


def test_cold_samples_come_each_right_after_a_flush_and_only_for_the_contenders_named():
    """A cold sample is one call timed alone just after the flush; a run takes COLD_SAMPLES of them at most (a
    flush costs several warm samples), paired rounds one every round."""
    from attnbench.measure.stopwatch import COLD_SAMPLES

    state = {"flushed": False, "after_flush": 0, "calls": 0}

    def flush() -> None:
        state["flushed"] = True

    def fn() -> None:
        state["calls"] += 1
        state["after_flush"] += state["flushed"]
        state["flushed"] = False

    fns = {"cold": fn, "warm": lambda: None}
    estimates = dict.fromkeys(fns, 1e-7)
    results = time_cpu_rounds(fns, 1, 0.05, estimates, cold=["cold"], flush=flush)
    cold, warm = results["cold"], results["warm"]
    assert isinstance(cold, Timing) and isinstance(warm, Timing)
    taken = len(cold.cold_samples_ms)
    assert taken == state["after_flush"]  # every cold call came right after a flush
    # one a round while it samples (the round its stop rule is met may end before its cold call), 25 at most
    assert min(COLD_SAMPLES, cold.n_samples - 1) <= taken <= min(COLD_SAMPLES, cold.n_samples)
    assert cold.cold_median_ms is not None and warm.cold_samples_ms == [] and warm.cold_median_ms is None
    assert time_cpu_rounds(fns, 1, 0.05, estimates, cold=["cold"])["cold"].cold_samples_ms == []  # no flush given
    paired = time_cpu_rounds(fns, 1, 0.2, estimates, paired=True, cold=list(fns), flush=flush)
    assert all(len(t.cold_samples_ms) == t.n_samples == t.rounds for t in paired.values())  # type: ignore[union-attr]
    # paired (ab --cold judges the cold samples): a flush and its call count in the budget, so a slow flush ends
    # the rounds near the budget instead of running past it: each side's round costs its 2 ms warm block and a
    # 10 ms flush, so about 0.2 s / 12 ms rounds (uncounted, the warm blocks alone would take about 100)
    slow = time_cpu_rounds(fns, 1, 0.2, estimates, paired=True, cold=list(fns), flush=lambda: time.sleep(0.01))
    assert all(10 <= t.rounds <= 20 for t in slow.values()), [t.rounds for t in slow.values()]  # type: ignore[union-attr]


def test_a_cpu_row_whose_bytes_fit_in_the_last_level_cache_has_a_cold_median():
    """models-cpu's decode steps over 1k keys read their cache from a 32 MiB L3 warm and ran above the DRAM roof;
    their rows now also carry the median with the caches flushed, as a GPU row does with L2."""
    from attnbench.measure._ceilings import Ceilings

    ceilings = Ceilings("cpu", "test", 1, "x", roof_tflops={"float32": 1.0}, roof_gbps=50.0, cache_bytes=2**20)
    decode = Workload(1, 4, 2, 1, 512, 32, mask="causal_bottom_right")  # 256 KiB of k and v
    options = RunOptions(budget_s=0.05, threads=1, ceilings={"cpu": ceilings})
    bmm, unnamed = run_group(["bmm"], decode, options)[0], run_group(["bmm"], SMALL, RunOptions(0.05, threads=1))[0]
    assert bmm["status"] in CHECKED and bmm["cache_resident"] and bmm["cold_median_ms"] > 0
    assert unnamed["cold_median_ms"] is None  # no ceilings, no cache named: warm samples only


def test_a_plugin_whose_flop_count_raises_is_its_own_error_row_beside_the_others(planted):
    """Whether a row will be cache_resident asks the contender's flops(); asked before timing, a plugin whose
    flops() raised ended the workload's group (the other contenders' rows lost), where it used to be an error row."""
    import attnbench
    from attnbench.impls.bmm import contender as bmm
    from attnbench.measure._ceilings import Ceilings

    class BadFlops(type(bmm)):  # type: ignore[misc]
        name = "planted_bad_flops"

        def flops(self, workload):
            raise ValueError("no count for this workload")

    attnbench.register(BadFlops())
    planted.append(BadFlops.name)
    ceilings = Ceilings("cpu", "test", 1, "x", roof_tflops={"float32": 1.0}, roof_gbps=50.0, cache_bytes=2**20)
    decode = Workload(1, 4, 2, 1, 512, 32, mask="causal_bottom_right")
    rows = run_group([BadFlops.name, "bmm"], decode, RunOptions(budget_s=0.05, threads=1, ceilings={"cpu": ceilings}))
    assert rows[0]["status"] == "error" and "no count for this workload" in rows[0]["reason"]
    assert rows[1]["status"] in CHECKED and rows[1]["cold_median_ms"] > 0


def test_a_flush_fills_every_last_level_cache_the_threads_may_use(monkeypatch):
    """A server CPU has a last-level cache per chiplet; a flush split across threads fills each with only its
    threads' part, so it must be as large as all the caches the threads may spread over."""
    from attnbench.measure import _hardware as hardware

    chiplets = {cpu: f"{8 * (cpu // 8)}-{8 * (cpu // 8) + 7}" for cpu in range(32)}  # four of 8 cores
    monkeypatch.setattr(hardware, "_last_level_sharing", chiplets.get)
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda _pid: set(range(32)), raising=False)
    assert [hardware.last_level_caches_used(t) for t in (1, 2, 8, 32)] == [1, 2, 4, 4]
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda _pid: set(range(8)), raising=False)
    assert hardware.last_level_caches_used(32) == 1  # pinned to one chiplet
    monkeypatch.setattr(hardware, "_last_level_sharing", lambda cpu: None)
    assert hardware.last_level_caches_used(32) == 1  # sysfs says nothing


def test_group_rows_come_in_order_and_share_their_rounds(planted):
    register(Raising())
    planted.append(Raising.name)
    rows = run_group(["bmm", Raising.name, "sdpa_math"], SMALL, FAST)
    assert [row["impl"] for row in rows] == ["bmm", Raising.name, "sdpa_math"]
    assert [row["status"] in CHECKED for row in rows] == [True, False, True] and rows[1]["status"] == "error"
    assert rows[0]["rounds"] == rows[2]["rounds"] >= max(rows[0]["n_samples"], rows[2]["n_samples"])


def _row(median: float, status: str = "ok", **extra: object) -> dict:
    base = {
        "impl": "bmm",
        "status": status,
        "reason": "" if status == "ok" else "boom",
        "median_ms": median,
        "iqr_ms": 0.1,
        "n_samples": 10,
        "rounds": 12,
        "samples_ms": [median] * 3,
        "unstable": False,
        "tflops": 1.0 / median,
        "gbps": 2.0 / median,
        "pct_of_peak": 50.0 / median,
        "max_abs_err": 1e-6,
        "grad_err": None,
        "peak_mem_mb": 1.0,
        "first_call_ms": 5.0,
        "setup_ms": 1.0,
    }
    return {**base, **extra}


def test_merged_repeats_take_the_median_of_medians_and_keep_them():
    merged = merge_repeats([_row(1.0), _row(1.3, peak_mem_mb=2.0), _row(1.1, max_abs_err=3e-6)])
    assert merged["median_ms"] == 1.1 and merged["repeat_medians_ms"] == [1.0, 1.3, 1.1]
    assert merged["n_samples"] == 30 and len(merged["samples_ms"]) == 9 and merged["rounds"] == 36
    assert merged["peak_mem_mb"] == 2.0 and merged["max_abs_err"] == 3e-6
    assert merged["tflops"] == pytest.approx(1 / 1.1) and merged["pct_of_peak"] == pytest.approx(50 / 1.1)
    failed = merge_repeats([_row(1.0), _row(1.0, status="error")])
    assert failed["status"] == "error" and failed["reason"] == "repeat 2 of 2: boom"
    # the first of three not ok: the case ends with that one row, and its reason still says which repeat it was
    first = merge_repeats([_row(1.0, status="stalled")], 3)
    assert first["reason"] == "repeat 1 of 3: boom" and first["repeat_medians_ms"] is None


def test_repeat_runs_each_case_in_separate_processes(tmp_path):
    out = tmp_path / "run"
    args = [
        "run",
        "--impl",
        "bmm,sdpa_math",
        "--seq",
        "64",
        "--mask",
        "none",
        "--budget-s",
        "0.03",
        "--repeat",
        "2",
        "--out",
        str(out),
    ]
    result = run_subprocess(*attnbench_cmd(*args))
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(out / "results.parquet")
    # two contenders on the quick suite's two workloads; a repeat timed while this shared machine stalled makes
    # its case `stalled`, saying which repeat (merge_repeats), and takes no merged medians
    assert frame["status"].isin(["ok", "stalled"]).all() and len(frame) == 4, frame[["status", "reason"]]
    for row in frame[frame["status"] == "stalled"].to_dict("records"):
        assert row["reason"].startswith("repeat ") and row["repeat_medians_ms"] is None
    for row in frame[frame["status"] == "ok"].to_dict("records"):
        assert len(row["repeat_medians_ms"]) == 2
        assert row["median_ms"] == pytest.approx(statistics.median(row["repeat_medians_ms"]))
        assert row["rounds"] >= 2
    repeats = [json.loads(line) for line in (out / "repeats.jsonl").read_text().splitlines()]
    # each repeat that ran has its line: both of an ok case, those of a stalled one up to the repeat that stalled
    ran = [2 if row["status"] == "ok" else int(row["reason"].split()[1]) for row in frame.to_dict("records")]
    assert len(repeats) == sum(ran)
    assert json.loads((out / "meta.json").read_text())["settings"]["repeat"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--repeat", "0"], "--repeat 0: must be a positive integer"),
        (["--repeat", "x"], "--repeat x: must be a positive integer"),
        (["--repeat", "-2"], "--repeat -2: must be a positive integer"),
        (["--repeat", "2", "--isolate", "none"], "--repeat 2 runs each case in separate worker processes"),
    ],
)
def test_bad_repeat_is_one_line_and_writes_nothing(cli, tmp_path, args, message):
    out = tmp_path / "run"
    code, _, err = cli("run", "--impl", "bmm", "--seq", "64", "--out", str(out), *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


ABORTING = """
import os
from attnbench import Capabilities, Contender

class Aborts(Contender):
    name = "planted_abort"
    capabilities = Capabilities(devices=frozenset({"cpu"}))
    def prepare(self, inputs, workload):
        os.abort()
"""


@pytest.mark.slow
def test_a_contender_that_kills_its_process_is_an_error_every_time(tmp_path):
    """8 consecutive crashing cases: 8 `error` rows saying how the worker died, none `timeout`; the
    contenders timed beside it in the same workload still get their rows."""
    site = tmp_path / "site"
    info = site / "planted_abort-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-abort\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[attnbench.impls]\nplanted_abort = planted_abort:Aborts\n")
    (site / "planted_abort.py").write_text(ABORTING)
    suite = tmp_path / "crashes.toml"
    seqs = ", ".join(str(16 + i) for i in range(8))
    suite.write_text(
        f'budget_s = 0.02\n[[sweep]]\nimpl = "planted_abort"\nbatch = 1\nheads = 2\n'
        f'head_dim = 8\nmask = "none"\nseq = [{seqs}]\n'
    )
    out = tmp_path / "run"
    args = ["run", "--suite", str(suite), "--timeout-s", "60", "--out", str(out)]
    start = time.perf_counter()
    result = run_subprocess(*attnbench_cmd(*args), env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(out / "results.parquet")
    assert len(frame) == 8 and set(frame["status"]) == {"error"}
    assert frame["reason"].str.contains(r"worker process died during the case \(signal 6 \(SIGABRT\)\)").all()
    assert time.perf_counter() - start < 8 * 60  # not one of them waited for its timeout
    mixed = tmp_path / "mixed"
    args = [
        "run",
        "--impl",
        "bmm,planted_abort,sdpa_math",
        "--seq",
        "32",
        "--kv-heads",
        "8",
        "--mask",
        "none",
        "--head-dim",
        "8",
        "--budget-s",
        "0.02",
        "--out",
        str(mixed),
    ]
    result = run_subprocess(*attnbench_cmd(*args), env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    statuses = pd.read_parquet(mixed / "results.parquet").groupby("impl")["status"].agg(set)  # quick's 2 sweeps
    assert sorted(statuses.index) == ["bmm", "planted_abort", "sdpa_math"] and statuses["planted_abort"] == {"error"}
    assert statuses["bmm"] | statuses["sdpa_math"] <= set(CHECKED)
