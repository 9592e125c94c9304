"""The fastest contender of a case is named alone only when its lead is beyond the noise its samples show."""

import random

import pandas as pd

from attnbench.reports import ranking
from attnbench.reports.html import _headline
from attnbench.reports.pooled import pool_runs
from attnbench.reports.summary import summary_table
from attnbench.runner.results import make_row, rows_to_frame
from attnbench.workload import Workload

WORKLOAD = Workload(1, 2, 2, 64, 64, 16)


def _samples(median: float, spread: float, n: int = 60, seed: int = 0) -> list[float]:
    """``n`` samples spread ±``spread`` (relative) around ``median``, shuffled."""
    rng = random.Random(seed)
    return [median * (1 + spread * (2 * rng.random() - 1)) for _ in range(n)]


def _row(impl: str, median: float, spread: float = 0.02, n: int = 60, **extra: object) -> dict:
    samples = _samples(median, spread, n, seed=len(impl))
    return make_row(impl, WORKLOAD, "ok", median_ms=median, samples_ms=samples, n_samples=n, **extra)


def test_a_lead_beyond_both_intervals_is_clear_and_one_inside_them_is_not():
    fast, close, far = _row("fast", 1.0, 0.3), _row("close", 1.03, 0.3), _row("far", 2.0, 0.3)
    assert ranking.beyond_noise(fast, far) and not ranking.beyond_noise(far, fast)
    assert not ranking.beyond_noise(fast, close)  # 3 % apart in ±30 % samples: the run can't tell
    # the same 3 % with tight samples is measured
    assert ranking.beyond_noise(_row("fast", 1.0, 0.005), _row("close", 1.03, 0.005))


def test_under_six_samples_their_range_stands_for_the_interval_and_none_is_no_lead():
    assert ranking.beyond_noise(_row("fast", 1.0, 0.01), _row("slow", 80.0, 0.1, n=3))  # naive's three calls
    close = make_row("close", WORKLOAD, "ok", median_ms=1.05, samples_ms=[0.98, 1.05, 1.12], n_samples=3)
    assert not ranking.beyond_noise(_row("fast", 1.0, 0.01), close)  # the fastest's interval reaches into its range
    assert ranking.beyond_noise(_row("fast", 1.0, 0.01, n=1), _row("slow", 3.0, 0.01))
    assert not ranking.beyond_noise(_row("fast", 1.0, 0.01), make_row("slow", WORKLOAD, "ok", median_ms=3.0))


def test_repeats_whose_medians_interleave_are_no_lead_even_when_pooled_samples_are():
    fast = _row("fast", 1.0, 0.005, repeat_medians_ms=[0.95, 1.0, 1.08])
    slow = _row("slow", 1.1, 0.005, repeat_medians_ms=[1.05, 1.1, 1.12])
    assert not ranking.beyond_noise(fast, slow)
    apart = _row("slow", 1.1, 0.005, repeat_medians_ms=[1.09, 1.1, 1.12])
    assert ranking.beyond_noise(fast, apart)


def test_rank_names_the_runner_up_and_the_margin():
    frame = rows_to_frame([_row("b", 2.0), _row("a", 1.0), _row("c", 3.0)])
    assert ranking.rank(frame) == ranking.Ranking("a", "b", 2.0)
    assert ranking.rank(frame[frame.impl == "c"]) == ranking.Ranking("c")
    tied = ranking.rank(rows_to_frame([_row("a", 1.0, 0.3), _row("b", 1.02, 0.3)]))
    assert not tied.clear and tied.label() == "a ≈ b" and tied.margin == 1.02


def test_every_contender_within_the_noise_is_named_not_only_the_runner_up():
    # b is 20 % slower in tight samples (beyond), c 25 % in wide ones (within)
    frame = rows_to_frame([_row("a", 1.0, 0.01), _row("b", 1.2, 0.01), _row("c", 1.25, 0.9)])
    found = ranking.rank(frame)
    assert (found.runner_up, found.within, found.label()) == ("b", ("c",), "a ≈ c")


def test_a_contender_in_two_runs_ranks_by_its_pooled_median_not_its_faster_row():
    """Two runs of one machine: a's runs took 1.2 and 1.0 ms. The headline took its faster row (best-of-two);
    it now ranks the median of its runs' medians (pooled.py), as the figures draw it."""
    rows = [_row("a", 1.2, 0.01), _row("a", 1.0, 0.01), _row("b", 2.0, 0.01)]
    frame = rows_to_frame(rows).assign(machine="m", run=["one", "two", "two"])
    pooled = pool_runs(frame)
    assert list(pooled["runs"]) == [2, 1] and ranking.rank(pooled) == ranking.Ranking("a", "b", 2.0 / 1.1)
    (row,) = _headline(frame, None)
    assert (row["fastest"], row["median"], row["runner_up"], row["margin"]) == ("a", "1.1", "b", "1.82×")


def test_contenders_pooled_from_the_same_runs_are_judged_run_by_run():
    """One run: a 1.0, b 1.05, tight samples — a clear lead. A second run with the same 5 % on a machine 10 %
    slower (a 1.10, b 1.155): pooled unpaired, a's 1.10 sat above b's 1.05 and the lead became a tie — more
    data, a weaker verdict. Each run's own rows decide now, and a run that disagrees still makes a tie."""
    rows = [_row("a", 1.0, 0.005), _row("b", 1.05, 0.005), _row("a", 1.10, 0.005), _row("b", 1.155, 0.005)]
    frame = rows_to_frame(rows).assign(machine="m", run=["one", "one", "two", "two"])
    pooled = pool_runs(frame)
    assert list(pooled["runs"]) == [2, 2] and ranking.rank(pooled).clear
    assert pool_runs(pooled) is pooled  # pooled once
    flipped = rows_to_frame([*rows[:2], _row("a", 1.16, 0.005), rows[3]]).assign(machine="m", run=frame["run"])
    assert not ranking.rank(pool_runs(flipped)).clear  # run two has b first
    alone = rows_to_frame([*rows, _row("b", 1.1, 0.005)]).assign(machine="m", run=["one", "one", "two", "two", "x"])
    assert not ranking.rank(pool_runs(alone)).clear  # b in a run a is not in: the spread between runs decides


def test_a_pooled_row_keeps_its_types_and_scales_its_cold_time_with_its_median():
    """A pooled row's warm median is the runs' while its cold one was the middle run's (cold/warm 1.04 where
    every run had 1.2); its sample count described one run; Int64 and boolean columns turned object."""
    rows = [_row("a", 1.0, cold_median_ms=1.2), _row("a", 1.3, cold_median_ms=1.56)]
    frame = rows_to_frame(rows).assign(machine="m", run=["one", "two"])
    (row,) = pool_runs(frame).to_dict("records")
    assert row["median_ms"] == 1.15 and abs(row["cold_median_ms"] / row["median_ms"] - 1.2) < 1e-9
    assert row["n_samples"] == 120
    pooled = pool_runs(frame)
    assert pooled["n_samples"].dtype == frame["n_samples"].dtype and pooled["hidden"].dtype == frame["hidden"].dtype


def test_summary_table_names_both_within_noise_and_says_what_the_mark_means():
    clear = summary_table(rows_to_frame([_row("a", 1.0), _row("b", 2.0)]))
    assert clear.splitlines()[-1].split()[-1] == "a" and ranking.TIE not in clear
    tied = summary_table(rows_to_frame([_row("a", 1.0, 0.3), _row("b", 1.02, 0.3)]))
    *table, legend = tied.splitlines()
    assert table[-1].endswith("a ≈ b") and legend == ranking.LEGEND


def test_a_fastest_beside_stalled_rows_says_it_was_not_ranked_against_them():
    """A stalled row's time is shown (~) and not ranked: the fastest of the clean rows must not read as if it beat
    it (a busy machine once left one clean contender in a row of stalled ones)."""
    stalled = make_row("b", WORKLOAD, "stalled", "the machine stalled", median_ms=0.5, samples_ms=[0.5] * 10)
    table = summary_table(rows_to_frame([_row("a", 1.0), stalled]))
    assert table.splitlines()[-1].endswith("a (1 stalled, not ranked)") and "0.5~" in table, table


def test_the_runs_table_names_no_fastest_where_every_row_stalled_and_says_why():
    """The terminal's `fastest` cell was blank where every row of a workload stalled (the report said "no ranked
    contender: all 2 stalled"); a --repeat run's stalled rows read a line each, "repeat 1 of 3: …"."""
    from attnbench.reports.summary import non_ok_reasons

    stalled = [
        make_row(
            impl,
            WORKLOAD,
            "stalled",
            f"repeat {n} of 3: the machine stalled: waited {w}% of their time",
            median_ms=0.5,
            samples_ms=[0.5] * 10,
        )
        for impl, n, w in (("a", 1, 40), ("b", 1, 50), ("a", 2, 45))
    ]
    frame = rows_to_frame(stalled[:2])
    assert summary_table(frame).splitlines()[-1].endswith("no ranked contender: all 2 stalled")
    lines = non_ok_reasons(rows_to_frame(stalled)).splitlines()
    assert lines == [
        "  a: stalled — repeats 1, 2 of 3: the machine stalled: waited 40–45% of their time",
        "  b: stalled — repeat 1 of 3: the machine stalled: waited 50% of their time",
    ], lines


def test_the_report_headline_says_where_rows_stalled_and_names_no_fastest_where_all_did():
    """The page named naive fastest at S1024 (173 ms) where fused_cpu ran in 11 ms but stalled, and left out the
    workloads whose every row stalled: now as the run's table, and the fastest beside stalled rows is not bold."""
    stalled = make_row("b", WORKLOAD, "stalled", "the machine stalled", median_ms=0.5, samples_ms=[0.5] * 10)
    other = Workload(1, 2, 2, 128, 128, 16)
    alone = make_row("a", other, "stalled", "the machine stalled", median_ms=2.0, samples_ms=[2.0] * 10)
    frame = rows_to_frame([_row("a", 1.0), stalled, alone]).assign(machine="m", run="r")
    first, second = _headline(frame, None)
    assert (first["fastest"], first["stalled"]) == ("a", 1)
    assert (second["fastest"], second["stalled"], second["median"]) == ("", 1, "")


def test_the_report_headline_says_where_a_contender_was_incorrect_and_names_no_fastest_where_all_were(tmp_path):
    """An incorrect row is timed and never ranked: the headline named the slower correct contender fastest without a
    word of the faster wrong one (stalled rows were counted), and left out a workload whose every row was wrong."""
    from attnbench.reports.html import write_report

    wrong = make_row("b", WORKLOAD, "incorrect", "max_abs_err 0.3 over tolerance", median_ms=0.5, samples_ms=[0.5] * 9)
    other = Workload(1, 2, 2, 128, 128, 16)
    alone = make_row("a", other, "incorrect", "max_abs_err 0.2 over tolerance", median_ms=2.0, samples_ms=[2.0] * 9)
    frame = rows_to_frame([_row("a", 1.0), wrong, alone]).assign(machine="m", run="r")
    first, second = _headline(frame, None)
    assert (first["fastest"], first["not_ranked"]) == ("a", "(1 incorrect, not ranked)")
    assert (second["fastest"], second["not_ranked"]) == ("", "no ranked contender: 1 incorrect")
    page = write_report(frame, [], [], tmp_path, None, "attnbench report r").read_text()
    assert '<span class="warn">(1 incorrect, not ranked)</span>' in page
    assert '<span class="warn">no ranked contender: 1 incorrect</span>' in page


def test_a_fastest_above_the_hardware_roof_says_it_is_a_measurement_defect():
    table = summary_table(rows_to_frame([_row("a", 1.0, pct_of_peak=103.0), _row("b", 2.0, pct_of_peak=51.0)]))
    assert table.splitlines()[-1].endswith("a (above the hardware roof: a measurement defect, see the warning)")
    clean = summary_table(rows_to_frame([_row("a", 1.0, pct_of_peak=99.0), _row("b", 2.0, pct_of_peak=51.0)]))
    assert clean.splitlines()[-1].endswith(" a")


def test_report_headline_marks_a_lead_within_noise():
    frame = rows_to_frame([_row("a", 1.0, 0.3), _row("b", 1.02, 0.3)])
    ok = frame.assign(machine="m", run="r")
    (row,) = _headline(ok, None)
    assert row["fastest"] == "a ≈ b" and row["runner_up"] == "b" and row["within_noise"]
    assert row["margin"] == "1.02×, ≈ within noise"
    (clear,) = _headline(rows_to_frame([_row("a", 1.0), _row("b", 2.0)]).assign(machine="m", run="r"), None)
    assert clear["margin"] == "2.00×" and not clear["within_noise"]


def test_the_headline_gives_the_fastest_s_bandwidth_beside_its_flops():
    """A decode step is bound by the bytes it reads: its TFLOP/s (0.06 on a CPU) says nothing of how near the roof
    it ran. The headline gave TFLOP/s alone; it now gives the fastest's GB/s too, as the decode figure draws it."""
    frame = rows_to_frame([_row("a", 1.0, gbps=31.5, tflops=0.06), _row("b", 2.0, gbps=15.7, tflops=0.03)])
    (row,) = _headline(frame.assign(machine="m", run="r"), None)
    assert (row["fastest"], row["tflops"], row["gbps"]) == ("a", "0.06", "31.5")


def test_rows_read_back_from_a_run_folder_rank_alike(tmp_path):
    frame = rows_to_frame([_row("a", 1.0), _row("b", 2.0, 0.3), _row("c", 2.05, 0.3)])
    frame.to_parquet(tmp_path / "results.parquet")
    again = pd.read_parquet(tmp_path / "results.parquet")
    assert ranking.rank(again) == ranking.rank(frame) == ranking.Ranking("a", "b", 2.0)
    assert not ranking.rank(again[again.impl != "a"]).clear
