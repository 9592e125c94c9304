"""The suites through pytest-benchmark: checked, timed, workload in extra_info, skips with reasons."""

import dataclasses
import json
import sys

from attnbench.reports.frames import load_run
from attnbench.workload import Workload
from attnbench.workload.flops import attention_bytes

from conftest import REPO, run_subprocess


def test_pytest_benchmark_front_end(tmp_path):
    report = tmp_path / "bench.json"
    result = run_subprocess(
        sys.executable,
        "-m",
        "pytest",
        str(REPO / "suites"),
        "--benchmark-only",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        "--attnbench-suite",
        "quick",
        "--attnbench-set",
        "impl=bmm,sdpa_flash,xformers",
        "--attnbench-set",
        "seq=64",
        "--attnbench-set",
        "mask=causal",
        "--benchmark-min-rounds=3",
        "--benchmark-max-time=0.05",
        f"--benchmark-json={report}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed, 2 skipped" in result.stdout
    assert "unavailable: xformers" in result.stdout
    benchmarks = json.loads(report.read_text())["benchmarks"]
    assert len(benchmarks) == 4
    for bench in benchmarks:
        info = bench["extra_info"]
        assert info["correct"] is True and info["max_abs_err"] <= info["atol"]
        assert info["mask"] == "causal" and info["impl"] in {"bmm", "sdpa_flash"} and info["flops"] > 0
        fields = {f.name: info[f.name] for f in dataclasses.fields(Workload) if f.name in info}
        workload = Workload(**fields, pass_=info["pass"])
        assert info["bytes"] == attention_bytes(workload)  # the row's GB/s in a report of this file
        assert info["roof_tflops"] > 0 and info["matmul_roof_tflops"] > 0  # its % of the roofs, as a run's rows
        assert bench["stats"]["median"] > 0
    rows = load_run(report).frame
    assert len(rows) == 4 and rows["pct_of_peak"].notna().all() and rows["pct_of_matmul"].notna().all()
    for row, bench in zip(rows.to_dict("records"), benchmarks, strict=True):  # in the file's order
        assert row["impl"] == bench["extra_info"]["impl"] and row["median_ms"] == bench["stats"]["median"] * 1e3
        assert abs(row["pct_of_peak"] - 100 * row["tflops"] / bench["extra_info"]["roof_tflops"]) < 1e-9


def test_bad_override_is_a_usage_error(tmp_path):
    result = run_subprocess(
        sys.executable,
        "-m",
        "pytest",
        str(REPO / "suites"),
        "--benchmark-only",
        "-p",
        "no:cacheprovider",
        "--attnbench-set",
        "seq=zero",
        cwd=tmp_path,
    )
    assert result.returncode == 4
    assert "--seq 'zero': expected positive integers" in result.stderr
