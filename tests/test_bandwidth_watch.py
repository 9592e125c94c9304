"""The bandwidth measured during the run: meta.json, the warning when it moved, the report (issue 19, item 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from attnbench.measure import _bandwidth_watch as bandwidth_watch
from attnbench.measure._bandwidth_watch import MOVED_FLOOR, BandwidthWatch, moved_warning, spread
from attnbench.measure._ceilings import Ceilings
from attnbench.measure.native_build import BuildError
from attnbench.reports.frames import load_runs
from attnbench.reports.html import bandwidth_during_run, write_report

CPU = {"cpu": Ceilings("cpu", "Test CPU", 2, torch.__version__, roof_gbps=50.0)}


@pytest.fixture(autouse=True)
def watch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bandwidth_watch.SWITCH, "on")  # conftest turns it off for the other tests' runs


def fake(*rates: tuple[float, float]) -> bandwidth_watch.Measure:
    """A measurement that returns ``(read, triad)`` GB/s in turn, one pair per call."""
    queue: Iterator[tuple[float, float]] = iter(rates)

    def measure(threads: int) -> dict[str, float]:
        read, triad = next(queue)
        return {"read_gbps": read, "triad_gbps": triad}

    return measure


def test_spread_is_max_over_min_per_stream_against_the_floor():
    steady = [
        {"when": "before", "read_gbps": 40.0, "triad_gbps": 30.0},
        {"when": "after", "read_gbps": 42.0, "triad_gbps": 30.0},
    ]
    assert spread(steady) == {
        "read_gbps": pytest.approx(0.05),
        "triad_gbps": 0.0,
        "floor": MOVED_FLOOR,
        "measurements": 2,
        "moved": False,
    }
    assert moved_warning(steady, 50.0) is None
    swung = [
        {"when": "before", "read_gbps": 83.0, "triad_gbps": 60.0},
        {"when": "after", "read_gbps": 33.0, "triad_gbps": 58.0},
    ]
    assert spread(swung)["moved"] and spread(swung)["read_gbps"] == pytest.approx(83 / 33 - 1)
    assert moved_warning(swung, 50.0) == (
        "memory bandwidth moved during the run: read stream 33–83 GB/s (+152%), triad 58–60 GB/s (+3%) over 2 "
        "measurements (before, after), more than the 10% floor; the cached roof pct_of_peak divides by is 50 GB/s, "
        "so memory-bound rows' pct_of_peak moved with the machine, not only the kernel"
    )


def test_watch_records_before_and_after_and_warns_when_it_moved():
    meta: dict = {}
    watch = BandwidthWatch(meta, CPU, 2, fake((80.0, 60.0), (40.0, 45.0)))
    assert [e["when"] for e in meta["bandwidth_during_run"]] == ["before"]
    warnings = watch.after(interrupted=False)
    entries = meta["bandwidth_during_run"]
    assert [(e["when"], e["read_gbps"], e["triad_gbps"], e["passes"]) for e in entries] == [
        ("before", 80.0, 60.0, 3),
        ("after", 40.0, 45.0, 3),
    ]
    assert all(e["device"] == "cpu" and e["time"][:2] == "20" for e in entries)
    assert meta["bandwidth_spread"]["read_gbps"] == pytest.approx(1.0) and meta["bandwidth_spread"]["moved"]
    assert len(warnings) == 1 and "read stream 40–80 GB/s (+100%)" in warnings[0]


def test_a_roof_below_every_measurement_of_the_run_says_how_to_measure_it_again():
    """A new user's every run warned "read stream 70.4–73.9 GB/s … the cached roof … is 53.3 GB/s" and never
    said what to do: a roof every measurement of the run beats was taken on a slower moment."""
    quiet = BandwidthWatch({}, CPU, 2, fake((72.0, 60.0), (74.0, 61.0))).after(interrupted=False)
    assert quiet == [
        "every bandwidth measurement of this run (72–74 GB/s) is above the cached roof pct_of_peak divides by (50 "
        "GB/s, measured on a slower moment): memory-bound rows may pass 100 % of it; `attnbench run "
        "--remeasure-ceilings` measures the ceilings again"
    ]
    assert BandwidthWatch({}, CPU, 2, fake((72.0, 60.0), (54.0, 50.0))).after(interrupted=False)[1:] == []


def test_watch_is_quiet_within_the_floor_and_skips_after_an_interrupt():
    meta: dict = {}
    assert BandwidthWatch(meta, CPU, 2, fake((40.0, 30.0), (41.0, 31.0))).after(interrupted=False) == []
    assert meta["bandwidth_spread"]["moved"] is False
    interrupted: dict = {}
    assert BandwidthWatch(interrupted, CPU, 2, fake((40.0, 30.0))).after(interrupted=True) == []
    assert [e["when"] for e in interrupted["bandwidth_during_run"]] == ["before"]


def test_a_resumed_run_adds_to_what_its_first_session_measured():
    meta: dict = {}
    BandwidthWatch(meta, CPU, 2, fake((80.0, 60.0), (78.0, 60.0))).after(interrupted=False)
    warnings = BandwidthWatch(meta, CPU, 2, fake((30.0, 25.0), (31.0, 25.0))).after(interrupted=False)
    assert [e["when"] for e in meta["bandwidth_during_run"]] == ["before", "after", "before (resumed)", "after"]
    assert meta["bandwidth_spread"]["measurements"] == 4 and "read stream 30–80 GB/s" in warnings[0]


def test_what_is_not_measured_says_why(monkeypatch):
    def broken(threads: int) -> dict[str, float]:
        raise BuildError("no C++ compiler")

    meta: dict = {}
    assert BandwidthWatch(meta, CPU, 2, broken).after(interrupted=False) == []
    why = "not measured: the stream kernels could not run (no C++ compiler)"
    assert meta == {"bandwidth_during_run": [], "bandwidth_spread": {"note": why}}
    gpu: dict = {}
    BandwidthWatch(gpu, {}, 2, fake())
    assert gpu["bandwidth_spread"]["note"].startswith("not measured: no CPU cases")
    monkeypatch.setenv(bandwidth_watch.SWITCH, "off")
    off: dict = {}
    BandwidthWatch(off, CPU, 2, fake())
    assert off["bandwidth_spread"] == {"note": "not measured: ATTNBENCH_BANDWIDTH_WATCH=off"}


def test_report_cell_shows_each_stream_range_spread_and_floor():
    meta: dict = {}
    BandwidthWatch(meta, CPU, 2, fake((80.0, 60.0), (40.0, 59.0))).after(interrupted=False)
    cell = bandwidth_during_run(meta, "cpu")
    assert cell.startswith("read 40–80 (spread 100%), triad 59–60 (spread 2%); moved more than the 10% floor (before ")
    assert ", after " in cell and bandwidth_during_run(meta, "cuda") == ""
    assert bandwidth_during_run({}, "cpu") == ""  # a run made before the watch existed


def test_the_real_stream_kernels_give_a_rate_for_each_stream():
    meta: dict = {}
    BandwidthWatch(meta, CPU, 1)
    (entry,) = meta["bandwidth_during_run"]
    assert entry["read_gbps"] > 0.1 and entry["triad_gbps"] > 0.1, entry


def test_run_keeps_the_bandwidth_in_meta_warns_and_the_report_shows_it(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(bandwidth_watch, "measure_streams", fake((80.0, 60.0), (33.0, 58.0)))
    ceilings = Ceilings(
        "cpu",
        "Test CPU",
        1,
        torch.__version__,
        matmul_tflops={"float32": 0.1},
        copy_gbps=20.0,
        roof_tflops={"float32": 0.2},
        roof_gbps=50.0,
    )
    monkeypatch.setattr("attnbench.runner.sweep._measure_ceilings", lambda cases, threads, again: {"cpu": ceilings})
    out = tmp_path / "run"
    code, _, err = cli(
        "run",
        "--impl",
        "bmm",
        "--seq",
        "64",
        "--heads",
        "2",
        "--budget-s",
        "0.02",
        "--no-memory",
        "--isolate",
        "none",
        "--progress",
        "off",
        "--out",
        str(out),
    )
    assert code == 0
    meta = json.loads((out / "meta.json").read_text())
    assert [(e["when"], e["read_gbps"]) for e in meta["bandwidth_during_run"]] == [("before", 80.0), ("after", 33.0)]
    assert meta["bandwidth_spread"]["read_gbps"] == pytest.approx(80 / 33 - 1)
    (moved,) = [w for w in meta["warnings"] if w.startswith("memory bandwidth moved during the run")]
    assert "read stream 33–80 GB/s (+142%)" in moved and err.count(f"warning: {moved}") == 1  # under the table, once
    frame, runs = load_runs([out])
    (tmp_path / "report").mkdir()
    html = write_report(frame, runs, [], tmp_path / "report", None, "attnbench report").read_text()  # no figures
    assert "<th>bandwidth during the run GB/s</th>" in html
    assert "<td>read 33–80 (spread 142%), triad 58–60 (spread 3%); moved more than the 10% floor (before " in html
