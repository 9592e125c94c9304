"""Model presets through the command line: `attnbench models`, `run --model … --phase decode`, paged decode,
the report's decode figure and why-missing features, resume / compare / merge / ratios / pytest with the
new axes, and run folders written before the feature columns existed."""

import json
import shutil
import sys

import pandas as pd
import pytest

from attnbench.reports.frames import load_runs
from attnbench.runner.results import CASE_COLUMNS, FEATURE_DEFAULTS, case_key

from conftest import CHECKED, REPO, run_subprocess

DECODE = [
    "run",
    "--model",
    "llama3.1-8b",
    "--phase",
    "decode",
    "--impl",
    "bmm,sdpa_flash,fused_cpu,torch_mha",
    "--seq-kv",
    "256,512",
    "--batch",
    "2",
    "--page-size",
    "0,16",
    "--budget-s",
    "0.05",
]


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    from attnbench.cli import main

    out = tmp_path_factory.mktemp("models") / "decode"
    assert main([*DECODE, "--out", str(out)]) == 0
    return out


def test_models_lists_every_preset(cli):
    code, out, _ = cli("models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "name",
        "heads",
        "kv_heads",
        "head_dim",
        "Dv",
        "window",
        "chunk",
        "softcap",
        "sinks",
        "layout",
        "layers",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    plain = ["-"] * 5  # chunk, softcap, sinks, layout after the window; then the layers, counted
    assert rows["llama3.1-8b"] == ["32", "8", "128", "128", *plain, "full:32"]
    assert rows["llama3.1-70b"] == ["64", "8", "128", "128", *plain, "full:80"]
    assert rows["llama3.1-405b"] == ["128", "8", "128", "128", *plain, "full:126"]
    assert rows["llama3.2-1b"] == ["32", "8", "64", "64", *plain, "full:16"]
    assert rows["llama3.2-3b"] == ["24", "8", "128", "128", *plain, "full:28"]
    assert rows["mistral-7b"] == ["32", "8", "128", "128", "4096", *plain[1:], "sliding:32"]
    assert rows["gemma2-9b"] == ["16", "8", "256", "256", "4096", "-", "50", "-", "-", "sliding:21,full:21"]
    assert rows["qwen2.5-7b"] == ["28", "4", "128", "128", *plain, "full:28"]
    assert rows["gpt2"] == ["12", "12", "64", "64", *plain, "full:12"]


def test_model_decode_rows_carry_the_preset_and_bandwidth(decode_run):
    frame = pd.read_parquet(decode_run / "results.parquet")
    assert len(frame) == 4 * 2 * 2  # contenders × KV lengths × page sizes
    ok = frame[frame["status"].isin(CHECKED)]
    assert set(ok["impl"]) == {"bmm", "sdpa_flash", "fused_cpu"}
    assert (ok[["heads", "kv_heads", "head_dim"]] == [32, 8, 128]).all().all()
    assert (ok["seq_q"] <= 16).all() and (ok["model"] == "llama3.1-8b").all() and (ok["gbps"] > 0).all()
    paged = ok[ok["page_size"] == 16]
    assert sorted(paged["impl"]) == ["bmm", "bmm", "fused_cpu", "fused_cpu", "sdpa_flash", "sdpa_flash"]
    unsupported = frame[frame["status"] == "unsupported"]  # a whole module, not an attention core
    assert list(unsupported["impl"]) == ["torch_mha"] * 4 and (unsupported["page_size"] == 16).sum() == 2


def test_resume_of_a_feature_run_has_nothing_left(cli, decode_run):
    code, _, err = cli("run", "--resume", str(decode_run))
    assert code == 0
    assert "16 of 16 cases done, 0 to run" in err
    rows = [json.loads(line) for line in (decode_run / "rows.jsonl").read_text().splitlines()]
    plan = json.loads((decode_run / "plan.json").read_text())
    assert {case_key(r["impl"], r) for r in rows} == {
        case_key(e["impl"], {**e["workload"], "pass": e["workload"]["pass_"]}) for e in plan
    }


def test_report_draws_decode_bandwidth_and_names_missing_features(cli, decode_run, tmp_path):
    # The figure is under test, not the timing: a real row timed `stalled` (another job beside this one took
    # every row of a run once) is drawn as a clean one, in a copy of the run.
    run = tmp_path / "run"
    shutil.copytree(decode_run, run)
    frame = pd.read_parquet(run / "results.parquet")
    stalled = frame["status"] == "stalled"
    frame.loc[stalled, "status"], frame.loc[stalled, "reason"] = "ok", ""
    frame.to_parquet(run / "results.parquet", index=False)
    code, _, _ = cli("report", str(run), "--out", str(tmp_path / "report"))
    assert code == 0
    assert (tmp_path / "report" / "decode.png").is_file() and (tmp_path / "report" / "decode_ms.png").is_file()
    html = (tmp_path / "report" / "report.html").read_text()
    assert "<th>feature</th>" in html and "<td>paged KV</td>" in html
    assert "[llama3.1-8b]" in html


def test_compare_merge_and_ratios_key_on_the_new_axes(cli, decode_run, tmp_path):
    code, out, _ = cli("merge", str(decode_run), "--out", str(tmp_path / "merged"))
    assert code == 0
    merged = pd.read_parquet(tmp_path / "merged" / "results.parquet")
    assert sorted(merged["page_size"].unique()) == [0, 16] and set(merged["model"]) == {"llama3.1-8b"}
    code, out, _ = cli("ratios", str(decode_run), "--impl", "bmm", "--vs", "sdpa_flash", "--where", "page_size=16")
    assert code == 0 and out.count("page16") == 2
    code, out, _ = cli("compare", str(decode_run), str(decode_run), "--out", str(tmp_path / "cmp"))
    assert "page16 [llama3.1-8b]" in out


def test_a_run_folder_without_the_feature_columns_still_loads(decode_run, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    frame = pd.read_parquet(decode_run / "results.parquet")
    frame = frame[frame["page_size"] == 0].drop(columns=list(FEATURE_DEFAULTS))
    frame.to_parquet(old / "results.parquet", index=False)
    (old / "meta.json").write_text((decode_run / "meta.json").read_text())
    loaded, _ = load_runs([old])
    assert (loaded["model"] == "").all() and (loaded["page_size"] == 0).all() and (loaded["score_mod"] == "none").all()
    assert loaded[CASE_COLUMNS].notna().drop(columns=["hidden"]).all().all()


def test_pytest_front_end_takes_the_feature_axes(tmp_path):
    result = run_subprocess(
        sys.executable,
        "-m",
        "pytest",
        str(REPO / "suites"),
        "--benchmark-only",
        "-p",
        "no:cacheprovider",
        "-q",
        "--attnbench-suite",
        "quick",
        "--attnbench-set",
        "impl=bmm",
        "--attnbench-set",
        "seq=64",
        "--attnbench-set",
        "mask=sliding_window",
        "--attnbench-set",
        "window=8",
        "--attnbench-set",
        "score-mod=alibi",
        "--benchmark-min-rounds=3",
        "--benchmark-max-time=0.05",
        "--benchmark-json",
        str(tmp_path / "b.json"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    benchmarks = json.loads((tmp_path / "b.json").read_text())["benchmarks"]
    assert {(b["extra_info"]["window"], b["extra_info"]["score_mod"]) for b in benchmarks} == {(8, "alibi")}
