"""Issue 21, parts 2–4: yardsticks in the rounds, floors from history, and the calibration's bookkeeping."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.measure import _yardsticks as yardsticks
from attnbench.measure.stopwatch import time_cpu_rounds
from attnbench.reports.calibrate_runs import STEP, best_method, history_detection, run_vs_run
from attnbench.reports.compare import Settings, compare_frames, history_floor
from attnbench.reports.noise_floor import POOLED, case_key, history_sigmas, spread_of
from attnbench.reports.normalise import normalise, references, ridge_from_meta, yardstick_of
from attnbench.runner._repeats import merge_repeats
from attnbench.runner.cases import RunOptions, run_case
from attnbench.runner.results import make_row, rows_to_frame
from attnbench.workload import Workload

from conftest import CHECKED

IMPLS = ("bmm", "einsum", "sdpa_flash")
WORKLOADS = [Workload(1, 8, 8, s, s, 64, mask=m) for s in (512, 1024) for m in ("none", "causal")]
MACHINE = "test machine"


# --- yardsticks ------------------------------------------------------------------------------------------


def test_the_yardsticks_measure_positive_rates_and_every_row_keeps_them():
    sticks = yardsticks.for_threads(1, array_bytes=16 * 2**20)
    if sticks is None:
        pytest.skip("the hardware kernels can't be built here")
    assert sticks.fma_gflops() > 0 and sticks.stream_gbps() > 0
    row = run_case("bmm", Workload(1, 2, 2, 32, 32, 16), RunOptions(budget_s=0.02, measure_memory=False))
    assert row["status"] in CHECKED
    assert row["yardstick_fma_gflops"] > 0 and row["yardstick_stream_gbps"] > 0
    off = run_case(
        "bmm", Workload(1, 2, 2, 32, 32, 16), RunOptions(budget_s=0.02, measure_memory=False, yardsticks=False)
    )
    assert off["yardstick_fma_gflops"] is None and off["yardstick_stream_gbps"] is None


def test_yardsticks_whose_array_does_not_fit_are_left_out(monkeypatch):
    """Their stream array is 4× the last-level cache (1.9 GiB on a VM reporting a 480 MiB L3): past a memory
    cap the case runs without yardsticks instead of its worker dying."""
    if yardsticks.for_threads(1, array_bytes=16 * 2**20) is None:
        pytest.skip("the hardware kernels can't be built here")

    def no_room(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(yardsticks.torch, "full", no_room)
    assert yardsticks.for_threads(1, array_bytes=32 * 2**20) is None


def test_each_contender_keeps_the_median_rate_of_the_rounds_it_sampled_in():
    """A yardstick whose rate is the round's number: a contender sampled in rounds 1..n keeps median(1..n);
    a yardstick that raises is dropped and the contenders still get their timing."""
    counter = iter(range(1, 10_000))

    def broken() -> float:
        raise RuntimeError("no kernel")

    results = time_cpu_rounds(
        {"a": lambda: None, "b": lambda: sum(range(50))},
        1,
        0.01,
        {"a": 1e-6, "b": 1e-6},
        yardsticks={"round": lambda: float(next(counter)), "broken": broken},
    )
    for timing in results.values():
        assert not isinstance(timing, Exception)
        n = timing.n_samples
        assert timing.yardsticks == {"round": float(np.median(np.arange(1, n + 1)))}


def test_repeats_keep_each_process_yardstick_rate_beside_its_median():
    w = WORKLOADS[0]
    rows = [
        make_row(
            "bmm",
            w,
            "ok",
            median_ms=m,
            iqr_ms=0.1,
            n_samples=10,
            samples_ms=[m],
            yardstick_fma_gflops=f,
            yardstick_stream_gbps=s,
        )
        for m, f, s in ((1.0, 100.0, 10.0), (1.2, 80.0, 9.0), (1.1, 90.0, 8.0))
    ]
    merged = merge_repeats(rows)
    assert merged["repeat_fma_gflops"] == [100.0, 80.0, 90.0] and merged["repeat_stream_gbps"] == [10.0, 9.0, 8.0]
    assert merged["yardstick_fma_gflops"] == 90.0 and merged["yardstick_stream_gbps"] == 9.0
    assert merged["repeat_medians_ms"] == [1.0, 1.2, 1.1]


# --- normalised by the yardsticks ------------------------------------------------------------------------


def fake_run(
    seed: int, speed: float = 1.0, noise: float = 0.02, repeats: int = 3, step: float = 1.0, with_step: bool = False
) -> pd.DataFrame:
    """3 contenders (and calib_step, ``step`` × bmm) × 4 workloads; per-repeat medians scatter by ``noise``
    around a true time × the machine's ``speed``; the yardsticks' rates move as 1 / speed."""
    generator = np.random.default_rng(seed)
    rows = []
    impls = (*IMPLS, STEP) if with_step else IMPLS
    for i, impl in enumerate(impls):
        for j, w in enumerate(WORKLOADS):
            true_ms = (1 + min(i, 3) % 3) * (1 + j) * speed * (step if impl == STEP else 1.0)
            medians = list(true_ms * np.exp(generator.normal(0, noise, repeats)))
            samples = [m * float(np.exp(generator.normal(0, 0.005))) for m in medians for _ in range(10)]
            rates = {
                "yardstick_fma_gflops": 100 / speed,
                "yardstick_stream_gbps": 10 / speed,
                "repeat_fma_gflops": [100 / speed] * repeats,
                "repeat_stream_gbps": [10 / speed] * repeats,
            }
            rows.append(
                make_row(
                    impl,
                    w,
                    "ok",
                    median_ms=float(np.median(medians)),
                    iqr_ms=0.01 * true_ms,
                    samples_ms=samples,
                    repeat_medians_ms=medians if repeats > 1 else None,
                    intensity=50.0,
                    **rates,
                )
            )
    return rows_to_frame(rows).assign(machine=MACHINE)


def test_normalising_divides_out_a_machine_that_got_slower():
    """The machine 12 % slower in NEW and its yardsticks 12 % slower: raw ratios ≈ 1.12, normalised ≈ 1."""
    base, new = fake_run(0, noise=0.0), fake_run(1, speed=1.12, noise=0.0)
    joined = pd.concat([base.assign(run="b"), new.assign(run="n")], ignore_index=True)
    normalised = normalise(joined, lambda row: None, references(joined))
    table = compare_frames(normalised[normalised["run"] == "b"], normalised[normalised["run"] == "n"], Settings()).table
    assert np.allclose(table["ratio"], 1.0) and set(table["yardstick"]) == {"fma"}
    raw = compare_frames(base, new, Settings()).table
    assert np.allclose(raw["ratio"], 1.12)


def test_each_case_takes_the_yardstick_of_its_side_of_the_ridge():
    row = {"intensity": 20.0, "yardstick_fma_gflops": 100.0, "yardstick_stream_gbps": 10.0}
    assert yardstick_of(row, None) == "fma_gflops"  # the yardsticks' own ridge: 10 FLOP/byte
    assert yardstick_of(row, 40.0) == "stream_gbps"  # below the ceilings' ridge: memory-bound
    assert yardstick_of({**row, "yardstick_stream_gbps": None}, None) is None
    meta = {"ceilings": {"cpu": {"roof_tflops": {"float32": 0.5}, "roof_gbps": 25.0}}}
    assert ridge_from_meta(meta, "float32") == pytest.approx(20.0) and ridge_from_meta(meta, "bfloat16") is None


def test_each_repeat_is_normalised_by_its_own_process_rate():
    """Repeat 2 ran in a process 25 % slower, and its yardstick saw it: normalised, the repeats agree."""
    row = make_row(
        "bmm",
        WORKLOADS[0],
        "ok",
        median_ms=1.0,
        iqr_ms=0.1,
        intensity=50.0,
        samples_ms=[1.0],
        repeat_medians_ms=[1.0, 1.25, 1.0],
        repeat_fma_gflops=[100.0, 80.0, 100.0],
        yardstick_fma_gflops=100.0,
        yardstick_stream_gbps=10.0,
    )
    frame = rows_to_frame([row]).assign(machine=MACHINE)
    out = normalise(frame, lambda r: None, {(MACHINE, "fma_gflops"): 100.0}).iloc[0]
    assert list(out["repeat_medians_ms"]) == pytest.approx([1.0, 1.0, 1.0]) and out["median_ms"] == pytest.approx(1.0)


# --- floors from history ---------------------------------------------------------------------------------


def history(frames: list[pd.DataFrame]) -> pd.DataFrame:
    start = pd.Timestamp("2001-01-01")
    return pd.concat(
        [f.assign(run_id=f"r{i}", started_at=start + pd.Timedelta(hours=i)) for i, f in enumerate(frames)],
        ignore_index=True,
    )


def test_the_between_run_spread_comes_from_successive_differences():
    assert spread_of([0.1, -0.1])[0] == pytest.approx(0.1)  # two differences: nothing left out
    assert spread_of([0.0, 0.0, math.log(2), 0.0, 0.0]) == (0.0, pytest.approx(2 * 16 / 11))  # one real step
    frames = [fake_run(seed) for seed in range(6)]
    sigmas = history_sigmas(history(frames), exclude={"r0"})
    key = case_key(frames[0].iloc[0].to_dict(), MACHINE)
    own = {k: v for k, v in sigmas.items() if k[0] != POOLED}
    assert sigmas[key].runs == 5 and len(own) == 12 and len(sigmas) == 12 + 3  # and one pooled per contender
    assert history_sigmas(history(frames), exclude={"r0", "r1"}) == {}  # 4 runs left: too few


def test_compare_takes_each_case_floor_from_history_and_says_so():
    """Two --repeat 1 runs, bmm S1024 none 20 % slower: within-run only it is `unclear`; with a history of
    2 % between-run spread it is `slower`, and the table says which floor each case used."""
    base, new = fake_run(0, repeats=1), fake_run(1, repeats=1)
    case = (new["impl"] == "bmm") & (new["seq_q"] == 1024) & (new["mask"] == "none")
    new.loc[case, "median_ms"] *= 1.2
    new["samples_ms"] = [[v * 1.2 for v in s] if pick else s for s, pick in zip(new["samples_ms"], case, strict=True)]
    alone = compare_frames(base, new, Settings()).table
    assert set(alone["floor_source"]) == {"within-run only"} and "slower" not in set(alone["verdict"])
    sigmas = history_sigmas(history([fake_run(seed, noise=0.02, repeats=1) for seed in range(10, 18)]), set())
    table = compare_frames(base, new, Settings(), sigmas).table
    assert set(table["floor_source"]) == {"history (8 runs)"}
    slower = table[table["verdict"] == "slower"]
    seen = sigmas[case_key(base[case].iloc[0].to_dict(), MACHINE)]
    assert list(slower["impl"]) == ["bmm"] and slower["floor"].iloc[0] == pytest.approx(
        max(0.05, history_floor(seen.spread, 0.01, seen.df))
    )
    noisy = history_sigmas(history([fake_run(seed, noise=0.3, repeats=1) for seed in range(10, 18)]), set())
    assert "slower" not in set(compare_frames(base, new, Settings(), noisy).table["verdict"])


def save_run(frame: pd.DataFrame, folder: Path, hour: int) -> Path:
    folder.mkdir(parents=True)
    frame.drop(columns=["machine"]).to_parquet(folder / "results.parquet")
    meta = {"start_time": f"2001-01-01T{hour:02d}:00:00", "command": "test", "environment": {}}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_compare_db_reads_the_store_and_prints_the_floor_source(cli, tmp_path):
    runs = [save_run(fake_run(seed, repeats=1), tmp_path / f"run{seed}", seed) for seed in range(8)]
    db = tmp_path / "store.duckdb"
    assert cli("store", *map(str, runs), "--db", str(db))[0] == 0
    code, text, _ = cli("compare", str(runs[6]), str(runs[7]), "--db", str(db), "--out", str(tmp_path / "c"))
    assert code == 0 and "floors: history 12" in text  # one kind: said in the summary, no column
    assert "<td>history (6 runs)</td>" in (tmp_path / "c" / "compare.html").read_text()
    code, text, _ = cli("compare", str(runs[6]), str(runs[7]), "--out", str(tmp_path / "c2"))
    assert "within-run only" in text and "history (" not in text
    code, _, err = cli("compare", str(runs[6]), str(runs[7]), "--db", str(tmp_path / "none.duckdb"))
    assert code == 2 and "no such store" in err


# --- the calibration's bookkeeping -----------------------------------------------------------------------


def test_run_vs_run_counts_false_alarms_detection_and_the_real_step_per_method():
    """Four runs on a steady machine, calib_step 10 % slower from run 3: no A/A alarm, every ×1.25 caught,
    calib_step caught across the step (2 × 2 pairs × 4 cases), raw and normalised alike."""
    frames = [fake_run(seed, noise=0.01, step=1.10 if seed >= 2 else 1.0, with_step=True) for seed in range(4)]
    table = run_vs_run(frames, [{}] * 4, step_at=3, methods=("raw", "yardstick"), factors=(1.25,))
    table = table.set_index("method")
    assert list(table.index) == ["raw", "yardstick"]
    assert (table["aa_total"] == 6 * 12).all() and (table["aa_hits"] == 0).all()
    assert (table["1.25_hits"] == 6 * 12).all() and (table["1.25_total"] == 6 * 12).all()
    assert (table["real_total"] == 4 * 4).all() and (table["real_hits"] == 4 * 4).all()


def test_best_method_prefers_a_quiet_one_that_catches_most():
    table = pd.DataFrame(
        [
            {
                "method": "raw",
                "aa_hits": 0,
                "aa_total": 100,
                "1.1_hits": 10,
                "1.1_total": 100,
                "1.05_hits": 0,
                "1.05_total": 100,
            },
            {
                "method": "loud",
                "aa_hits": 5,
                "aa_total": 100,
                "1.1_hits": 90,
                "1.1_total": 100,
                "1.05_hits": 50,
                "1.05_total": 100,
            },
            {
                "method": "history",
                "aa_hits": 1,
                "aa_total": 100,
                "1.1_hits": 40,
                "1.1_total": 100,
                "1.05_hits": 5,
                "1.05_total": 100,
            },
        ]
    )
    assert best_method(table) == "history"
    assert best_method(table[table["method"] == "loud"]) == "loud"


def test_history_finds_the_real_step_at_its_run_and_none_in_the_steady_series():
    frames = [fake_run(seed, noise=0.01, step=1.10 if seed >= 5 else 1.0, with_step=True) for seed in range(10)]
    for normalised in (False, True):
        found = history_detection(frames, [{}] * 10, step_at=6, normalise_times=normalised)
        assert found["aa_series"] == 12 and found["aa_steps"] == 0
        assert found["step_series"] == 4 and found["step_found"] == 4 and found["step_elsewhere"] == 0
        assert found["step_change_pct"] == pytest.approx(10, abs=2)


def test_repeats_keep_every_choice_their_processes_made():
    """A tuned contender's processes may choose different tiles: the merged row names each once, in order."""
    w = WORKLOADS[0]
    rows = [
        make_row("bmm", w, "ok", median_ms=m, iqr_ms=0.1, n_samples=10, samples_ms=[m], choice=c)
        for m, c in ((1.0, "fwd 64,64,4,2"), (1.2, "fwd 128,64,8,3"), (1.1, "fwd 64,64,4,2"))
    ]
    assert merge_repeats(rows)["choice"] == "fwd 64,64,4,2 | fwd 128,64,8,3"
    assert merge_repeats([{**row, "choice": None} for row in rows])["choice"] is None
