"""Reports: report.html and figures from runs, escaping, pytest-benchmark input, merged machines, compare."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import attnbench
from attnbench.contenders import registry
from attnbench.reports.compare import Evidence, Settings, verdict
from attnbench.reports.summary import merged_reasons

from conftest import Shifted, fake_distribution, stalled_as_ok

SMALL = ["--seq", "64,128", "--mask", "none,causal", "--budget-s", "0.03", "--threads", "1"]


def table_rows(html: str) -> list[list]:
    """The rows the results table is given (itables' DataTables arguments in the page); the browser test
    checks what the interactive table shows."""
    start = html.index("let dt_args = ") + len("let dt_args = ")
    arguments = json.loads(html[start : html.index(";\n", start)])
    return json.loads(arguments["data_json"])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A run on this machine and a copy that claims to come from another machine."""
    from attnbench.cli import main

    root = tmp_path_factory.mktemp("runs")
    assert main(["run", "--impl", "bmm,sdpa_flash,naive,xformers", *SMALL, "--out", str(root / "a")]) == 0
    stalled_as_ok(root / "a")  # what reads a run is tested here, not the timing: a busy machine stalls rows
    shutil.copytree(root / "a", root / "b")
    meta = json.loads((root / "b" / "meta.json").read_text())
    meta["environment"]["cpu_name"] = "Other CPU"
    meta["environment"]["hostname"] = "elsewhere"
    (root / "b" / "meta.json").write_text(json.dumps(meta))
    return root / "a", root / "b"


def test_report_has_figures_every_row_and_every_reason(cli, two_runs, tmp_path):
    run, _ = two_runs
    out = tmp_path / "report"
    code, text, _ = cli("report", str(run), "--out", str(out))
    assert code == 0
    pngs = sorted(out.glob("*.png"))
    drawn = {"latency.png", "tflops.png", "memory.png", "speedup.png", "roofline.png", "masks.png"}  # masks: causal's
    assert {p.name for p in pngs} >= drawn
    masks = pd.read_csv(out / "masks.csv")["mask"]
    assert {"S64 causal", "S128 causal"} <= set(masks) and all(m.endswith(" causal") for m in masks)  # per sequence
    for png in pngs:
        with Image.open(png) as image:
            image.verify()
    html = (out / "report.html").read_text()
    roof_source = json.loads((run / "meta.json").read_text())["ceilings"]["cpu"]["roof_source"]["float32"]
    assert "<th>hardware roof TFLOP/s</th>" in html and "<th>torch matmul TFLOP/s</th>" in html
    assert "<th>TFLOP/s</th><th>GB/s</th>" in html  # the headline: a decode step is bound by its bytes
    assert roof_source in html
    frame = pd.read_parquet(run / "results.parquet")
    rows = table_rows(html)
    assert len(rows) == len(frame) and sorted(r[0] for r in rows) == sorted(frame.impl)
    for reason in merged_reasons(frame[frame.status != "ok"]).unique():  # a stalled contender's percentages: a range
        assert reason.replace("'", "&#39;") in html
    assert html.count("data:image/png;base64,") == len(pngs)
    # Self-contained: nothing loads from elsewhere (links for a reader to follow are fine).
    fetching = re.findall(r"<(\w+)[^>]*\b(?:src|href)\s*=\s*[\"']?https?://", html)
    assert set(fetching) <= {"a"} and "<link" not in html and "url(http" not in html and "@import" not in html
    assert "attnbench run --impl bmm,sdpa_flash,naive,xformers" in html  # the command that made the run
    assert f"report: {out / 'report.html'}" in text


def test_the_runs_warnings_lead_the_page_and_a_fastest_above_the_roof_says_so(cli, two_runs, tmp_path):
    run, _ = two_runs
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["warnings"] = ["1 row(s) above 100 % of the hardware roof (pct_of_peak), a measurement defect: planted"]
    (copy / "meta.json").write_text(json.dumps(meta))
    frame = pd.read_parquet(copy / "results.parquet")
    frame["pct_of_peak"] = frame["pct_of_peak"].astype("float64").where(frame["status"] != "ok", 150.0)
    frame.to_parquet(copy / "results.parquet", index=False)
    code, _, _ = cli("report", str(copy), "--out", str(tmp_path / "report"))
    html = (tmp_path / "report" / "report.html").read_text()
    top = html[: html.index('id="figures"')]
    assert code == 0 and "What the run(s) warned of" in top and "a measurement defect: planted" in top
    assert "(above the hardware roof: a measurement defect)</span>" in top or "No correct result to rank" in top


def test_report_into_an_earlier_report_replaces_it_and_refuses_other_folders_and_a_run_twice(cli, two_runs, tmp_path):
    """A figure the new runs do not draw must not stay beside the new page (a decode figure from an earlier report
    stayed once); a folder of other files is not a report's to clear; the same run twice is one run."""
    run, _ = two_runs
    earlier = tmp_path / "report"
    earlier.mkdir()
    for name in ("report.html", "decode.png", "masks.csv"):
        (earlier / name).write_text("from an earlier report")
    (earlier / "notes.txt").write_text("mine")
    code, _, _ = cli("report", str(run), "--out", str(earlier))
    assert code == 0 and not (earlier / "decode.png").exists() and (earlier / "notes.txt").read_text() == "mine"
    assert "from an earlier report" not in (earlier / "report.html").read_text()
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("x")
    code, _, err = cli("report", str(run), "--out", str(other))
    assert code == 2 and "already holds files and no earlier report.html (e.g. data.csv)" in err
    assert [p.name for p in other.iterdir()] == ["data.csv"]
    code, _, err = cli("report", str(run), f"{run}/", "--out", str(tmp_path / "twice"))
    assert code == 2 and "given twice" in err and not (tmp_path / "twice").exists()


def test_a_report_cut_short_by_ctrl_c_leaves_no_figures_without_their_page(cli, two_runs, tmp_path, monkeypatch):
    """Ctrl-C after the figures and before the page: the folder it made is gone, and "nothing was written" is so;
    in an earlier report's folder that page stands (it embeds its figures), without the new figures."""
    import attnbench.reports.build

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(attnbench.reports.build, "write_report", ctrl_c)
    run, _ = two_runs
    code, _, err = cli("report", str(run), "--out", str(tmp_path / "new" / "report"))
    assert code == 130 and err == "attnbench: interrupted; nothing was written\n", err
    assert not (tmp_path / "new" / "report").exists()
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in ("report.html", "latency.png", "notes.txt"):
        (earlier / name).write_text("from an earlier report")
    code, _, err = cli("report", str(run), "--out", str(earlier))
    assert code == 130 and f"the earlier report.html in {earlier} stands (its other files were cleared)" in err
    assert sorted(p.name for p in earlier.iterdir()) == ["notes.txt", "report.html"]
    assert (earlier / "report.html").read_text() == "from an earlier report"
    monkeypatch.undo()
    assert cli("report", str(run), "--out", str(earlier))[0] == 0  # the folder is still a report's to replace
    assert cli("list")[0] == 0 and (earlier / "latency.png").is_file()  # a later command leaves it alone


def test_merged_machines_never_collide(cli, two_runs, tmp_path):
    from attnbench.reports.frames import load_runs

    frame, runs = load_runs(list(two_runs))
    assert frame["machine"].nunique() == 2 and [r.name for r in runs] == ["a", "b"]
    key = ["machine", "impl", "seq_q", "seq_k", "kv_heads", "mask"]
    assert not frame.duplicated(key).any()
    out = tmp_path / "merged"
    assert cli("report", *map(str, two_runs), "--out", str(out))[0] == 0
    html = (out / "report.html").read_text()
    assert "Other CPU" in html and "elsewhere" in html


def test_contender_names_and_reasons_are_escaped(cli, planted, tmp_path):
    class Evil(Shifted):
        name = "<script>alert(1)</script>"

    attnbench.register(Evil)
    planted.append(Evil.name)
    run = tmp_path / "run"
    # Evil is a local class, which the worker process cannot import: run it in this process.
    assert (
        cli(
            "run",
            "--impl",
            f"{Evil.name},bmm",
            "--seq",
            "32",
            "--mask",
            "none",
            "--budget-s",
            "0.02",
            "--isolate",
            "none",
            "--out",
            str(run),
        )[0]
        == 0
    )
    assert cli("report", str(run), "--out", str(tmp_path / "rep"))[0] == 0
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("alert(1)") == html.count("&lt;script&gt;alert(1)&lt;/script&gt;")  # every time escaped


def test_a_results_file_without_its_meta_json_is_read_with_a_note(cli, two_runs, tmp_path):
    """results.parquet copied without meta.json made a report whose rows said 'unknown machine' (and a merge with the
    run it came from counted two machines) without a word: the note says what is unknown, on stderr and the page."""
    run, _ = two_runs
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run / "results.parquet", bare / "results.parquet")
    code, _, err = cli("report", str(bare), "--out", str(tmp_path / "report"))
    assert code == 0 and f"note: {bare}: no meta.json beside its results: its machine, versions" in err, err
    assert "no meta.json beside its results" in (tmp_path / "report" / "report.html").read_text()
    code, _, err = cli("report", str(run), "--out", str(tmp_path / "whole"))
    assert code == 0 and "no meta.json" not in err


def test_pytest_benchmark_json_is_a_run(cli, tmp_path):
    from attnbench.reports.frames import load_runs

    data = {
        "machine_info": {"node": "bench-host", "cpu": {"brand_raw": "Test CPU"}},
        "benchmarks": [
            {
                "extra_info": {
                    "impl": "bmm",
                    "device": "cpu",
                    "dtype": "float32",
                    "batch": 1,
                    "heads": 8,
                    "kv_heads": 8,
                    "seq_q": 64,
                    "seq_k": 64,
                    "head_dim": 64,
                    "mask": "none",
                    "pass": "fwd",
                    "scale": 0.125,
                    "flops": 1e8,
                    "bytes": 4e6,
                    "max_abs_err": 1e-7,
                    "atol": 1e-4,
                    "rtol": 1e-4,
                    "correct": True,
                },
                "stats": {"median": 0.001, "iqr": 0.0001, "rounds": 50, "iterations": 1, "data": [0.001, 0.0011]},
            }
        ],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    frame, _ = load_runs([path])
    row = frame.iloc[0]
    assert row["status"] == "ok" and row["median_ms"] == 1.0 and row["source"] == "pytest-benchmark"
    assert row["tflops"] == pytest.approx(0.1) and row["machine"] == "Test CPU @ bench-host"
    # the minimum bytes the front end writes give the row its GB/s and intensity, as a run's rows have them
    assert row["bytes"] == 4e6 and row["gbps"] == pytest.approx(4.0) and row["intensity"] == pytest.approx(25)
    assert cli("report", str(path), "--out", str(tmp_path / "rep"))[0] == 0


def test_a_pytest_benchmark_json_with_other_benchmarks_keeps_attnbench_cases(cli, tmp_path):
    """A team's suite runs attnbench's cases beside its own benchmarks into one --benchmark-json: report and
    compare refused the whole file ("extra_info has no attnbench workload")."""
    ours = {
        "name": "test_attention[bmm-B1-H8-S64-D64-float32-cpu-none-fwd]",
        "extra_info": {
            **{"impl": "bmm", "device": "cpu", "dtype": "float32", "batch": 1, "heads": 8, "kv_heads": 8},
            **{"seq_q": 64, "seq_k": 64, "head_dim": 64, "mask": "none", "pass": "fwd", "flops": 1e8},
            **{"max_abs_err": 1e-7, "atol": 1e-4, "rtol": 1e-4, "correct": True},
        },
        "stats": {"median": 0.001, "iqr": 0.0001, "rounds": 50, "iterations": 1, "data": [0.001, 0.0011]},
    }
    theirs = {"name": "test_tokenizer", "extra_info": {}, "stats": dict(ours["stats"])}
    mixed, only_theirs = tmp_path / "mixed.json", tmp_path / "theirs.json"
    mixed.write_text(json.dumps({"machine_info": {}, "benchmarks": [theirs, ours]}))
    only_theirs.write_text(json.dumps({"machine_info": {}, "benchmarks": [theirs]}))
    code, _, err = cli("report", str(mixed), "--out", str(tmp_path / "rep"))
    assert code == 0
    assert "1 benchmark(s) without an attnbench workload left out: test_tokenizer" in err
    from attnbench.reports.frames import load_runs

    frame, runs = load_runs([mixed])
    assert list(frame["impl"]) == ["bmm"] and "test_tokenizer" in runs[0].meta["warnings"][0]
    code, _, err = cli("report", str(only_theirs), "--out", str(tmp_path / "rep2"))
    assert code == 2 and "none of its 1 benchmark(s) has an attnbench workload" in err
    assert "Traceback" not in err and not (tmp_path / "rep2").exists()


def _cut_short_rows(run: Path) -> None:
    """A run stopped before its results files, whose last row was cut short (an older attnbench, a copy)."""
    (run / "results.parquet").unlink()
    (run / "results.csv").unlink(missing_ok=True)
    (run / "rows.jsonl").write_text('{"impl": "bmm"}\n{"impl": "bm')


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            lambda p: (p / "results.parquet").write_bytes(b"PAR1 truncated"),
            "results.parquet: results file is unreadable",
        ),
        (_cut_short_rows, "rows.jsonl: results file is unreadable (JSONDecodeError"),
        (lambda p: (p / "meta.json").write_text("{not json"), "meta.json: not valid JSON"),
        (lambda p: pd.DataFrame({"x": [1]}).to_parquet(p / "results.parquet"), "not an attnbench results file"),
    ],
)
def test_bad_runs_are_one_line_errors(cli, two_runs, tmp_path, setup, message):
    broken = tmp_path / "broken"
    shutil.copytree(two_runs[0], broken)
    setup(broken)
    code, _, err = cli("report", str(broken), "--out", str(tmp_path / "rep"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "rep").exists()


def test_compare_same_run_has_no_slower_case(cli, two_runs, tmp_path):
    run, _ = two_runs
    code, text, _ = cli("compare", str(run), str(run), "--out", str(tmp_path / "cmp"))
    assert code == 0
    assert "slower" not in text.split("\n")[-3]  # summary line
    assert (tmp_path / "cmp" / "compare.html").exists() and (tmp_path / "cmp" / "compare.png").exists()


def _slowed_copy(run: Path, target: Path, impl: str, factor: float, repeats: bool = False) -> Path:
    """A copy of ``run`` with ``impl``'s times × ``factor``; ``repeats``: every ok row given three per-repeat
    medians (±1 %) as ``--repeat 3`` would have stored."""
    shutil.copytree(run, target)
    frame = pd.read_parquet(target / "results.parquet")
    chosen = frame.impl == impl
    frame.loc[chosen, "median_ms"] *= factor
    frame["samples_ms"] = [
        [s * factor for s in samples] if pick and samples is not None else samples
        for samples, pick in zip(frame["samples_ms"], chosen, strict=True)
    ]
    if repeats:
        frame["repeat_medians_ms"] = [
            [m * 0.99, m, m * 1.01] if status == "ok" else None
            for m, status in zip(frame["median_ms"], frame["status"], strict=True)
        ]
    frame.to_parquet(target / "results.parquet")
    return target


def _comparable(text: str, impls: tuple[str, ...]) -> list[str]:
    """compare's table lines for ``impls``, less the cases it says are `not comparable`: a row the shared run
    timed `stalled` (a busy machine) has no verdict, in any copy of it."""
    lines = [line for line in text.splitlines() if line.lstrip().startswith(impls)]
    return [line for line in lines if " not comparable " not in line]


def test_compare_of_runs_on_different_thread_counts_says_so(cli, two_runs, tmp_path):
    run, _ = two_runs
    other = tmp_path / "one-thread"
    shutil.copytree(run, other)
    frame = pd.read_parquet(other / "results.parquet")
    frame["threads"] = 1
    frame.to_parquet(other / "results.parquet", index=False)
    code, text, _ = cli("compare", str(run), str(other), "--out", str(tmp_path / "cmp"))
    assert code in (0, 1)  # 1: a case called slower (one thread against two)
    threads = int(pd.read_parquet(run / "results.parquet")["threads"].dropna().iloc[0])
    said = f"note: BASE ran its CPU cases on {threads} thread(s) and NEW on 1: every case moves with the thread count"
    assert (said in text) == (threads != 1), text
    code, text, _ = cli("compare", str(run), str(run), "--out", str(tmp_path / "same"))
    assert code == 0 and "thread count" not in text


def test_compare_flags_a_contender_made_slower_and_exits_1(cli, two_runs, tmp_path):
    run, _ = two_runs
    base = _slowed_copy(run, tmp_path / "base", "bmm", 1.0, repeats=True)
    slowed = _slowed_copy(run, tmp_path / "slow", "bmm", 1.5, repeats=True)
    code, text, err = cli("compare", str(base), str(slowed), "--out", str(tmp_path / "cmp"))
    assert code == 1 and "slower beyond their floor" in err
    lines = _comparable(text, ("bmm", "sdpa_flash", "naive"))
    assert any(line.lstrip().startswith("bmm") for line in lines)
    said = ("faster", "slower", "same", "unclear")
    verdicts = [(line.split()[0], next(word for word in line.split() if word in said)) for line in lines]
    assert all(verdict != "slower" for impl, verdict in verdicts if impl != "bmm")
    assert all(verdict in ("slower", "unclear") for impl, verdict in verdicts if impl == "bmm")  # unclear: load
    assert "geometric-mean new/base" in text and "from per-repeat medians" in text
    page = (tmp_path / "cmp" / "compare.html").read_text()  # drawn from reports/templates/compare.html.j2
    assert '<td class="slower">slower</td>' in page and f"base: <code>{base}</code>" in page, page


def test_compare_within_run_only_never_says_slower(cli, two_runs, tmp_path):
    """Without per-repeat medians even a 100× slowdown (beyond any noise this loaded machine measures) is
    `unclear`, with the way to decide it (exit 0)."""
    run, _ = two_runs
    slowed = _slowed_copy(run, tmp_path / "slow", "bmm", 100.0)
    code, text, err = cli("compare", str(run), str(slowed), "--out", str(tmp_path / "cmp"))
    assert code == 0 and err == ""
    bmm = _comparable(text, ("bmm",))
    marks = {line.split()[-1] for line in bmm}  # the note, printed once below the table
    assert bmm and all(" unclear " in line for line in bmm) and len(marks) == 1, text
    assert f"{marks.pop()} looks slower, but on within-run samples only" in text
    assert " slower " not in text.split("note:")[0]
    assert "no case is called slower or faster" in text and "--repeat 3" in text and "`attnbench ab`" in text


def test_verdict_rules():
    def repeats(values):
        return Evidence(np.asarray(values), "repeats", float(max(values) / min(values) - 1))

    base = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98] * 5
    assert verdict(repeats(base), repeats([x * 1.5 for x in base]), Settings())[0] == "slower"
    assert verdict(repeats(base), repeats([x / 1.5 for x in base]), Settings())[0] == "faster"
    assert verdict(base, [x * 1.01 for x in base], Settings())[0] == "same"
    assert verdict([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], Settings(threshold=0.02))[0] == "unclear"
    clear_cut = verdict(repeats([1.0, 1.3]), repeats([1.7, 2.2]), Settings())
    assert clear_cut[0] == "slower" and clear_cut[2] > 0.05  # not significant, but every new value is beyond
    # Raw samples of one process each (no --repeat): never slower or faster, whatever the size of the change.
    outcome, ratio, _, _, note = verdict(base, [x * 1.5 for x in base], Settings())
    assert outcome == "unclear" and ratio == pytest.approx(1.5) and note.startswith("looks slower")
    assert verdict(base, [x / 1.5 for x in base], Settings())[4].startswith("looks faster")


def test_compare_rejects_bad_settings(cli, two_runs):
    code, _, err = cli("compare", str(two_runs[0]), str(two_runs[0]), "--threshold", "5")
    assert code == 2 and "--threshold 5.0: must be a fraction" in err
    code, _, err = cli("compare", str(two_runs[0]), "/no/such/run")
    assert code == 2 and "/no/such/run: no such run folder or file" in err


def test_compare_with_a_run_of_no_finished_case_and_report_with_an_unknown_baseline(cli, two_runs, tmp_path):
    stopped = tmp_path / "stopped"  # a run stopped before its first case finished: meta and plan, no row
    shutil.copytree(two_runs[0], stopped)
    for name in ("results.parquet", "results.csv"):
        (stopped / name).unlink()
    (stopped / "rows.jsonl").write_text("")
    code, out, err = cli("compare", str(two_runs[0]), str(stopped), "--out", str(tmp_path / "cmp"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert f"{stopped}: no finished case (the run stopped before its first row)" in err
    assert not (tmp_path / "cmp").exists()
    code, out, err = cli("report", str(two_runs[0]), "--baseline", "sdpa_flsh", "--out", str(tmp_path / "rep"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--baseline 'sdpa_flsh': no row of it in the runs; allowed: a contender they hold (bmm, naive," in err
    assert not (tmp_path / "rep").exists()
    old = tmp_path / "old"  # an earlier report is left whole by a misspelt baseline (it was cleared first)
    assert cli("report", str(two_runs[0]), "--out", str(old))[0] == 0
    before = sorted(path.name for path in old.iterdir())
    assert cli("report", str(two_runs[0]), "--baseline", "sdpa_flsh", "--out", str(old))[0] == 2
    assert sorted(path.name for path in old.iterdir()) == before and "report.html" in before


def test_registry_is_untouched_by_reports():
    assert "bmm" in registry.load()


def test_the_accuracy_table_counts_stalled_rows_they_were_checked_too():
    """A stalled row's time is not ranked, but its output was checked against float64 before it was timed: the
    accuracy table counts it, and its error can be the worst (review 1, finding 4: 4 of 8 checked cases shown)."""
    from attnbench.reports.html import _accuracy
    from attnbench.runner.results import make_row, rows_to_frame

    shapes = [attnbench.Workload(1, 2, 2, seq, seq, 16) for seq in (64, 128, 256, 512)]
    checked = {"atol": 1e-4, "rtol": 1e-4, "median_ms": 1.0}
    rows = [
        make_row("bmm", shapes[0], "ok", max_abs_err=1e-6, **checked),
        make_row("bmm", shapes[1], "stalled", "the machine stalled", max_abs_err=5e-6, **checked),
        make_row("bmm", shapes[2], "incorrect", "max_abs_err 0.3 over tolerance", max_abs_err=0.3, **checked),
        make_row("bmm", shapes[3], "error", "RuntimeError: boom"),  # never checked
        make_row("einsum", shapes[0], "stalled", "the machine stalled", max_abs_err=2e-6, **checked),
        make_row("einsum", shapes[1], "stalled", "the machine stalled", max_abs_err=7e-6, **checked),
        make_row("einsum", shapes[2], "unsupported", "no"),
    ]
    table = {row["impl"]: row for row in _accuracy(rows_to_frame(rows))}
    assert (table["bmm"]["checked"], table["bmm"]["incorrect"], table["bmm"]["worst"]) == (3, 1, "0.3")
    assert (table["einsum"]["checked"], table["einsum"]["incorrect"]) == (2, 0)
    assert table["einsum"]["worst"] == "7e-06", table["einsum"]  # the stalled rows' worst error is shown


def test_a_case_in_two_runs_of_one_machine_is_ranked_on_its_pooled_median_not_its_best_run(tmp_path):
    """Two runs of one machine: bmm was fast in one run only (1 ms, then 3 ms), einsum 1.5 ms in both. Its faster
    row made bmm the headline's fastest at 1 ms (best-of-two: a contender in more runs or a noisier one wins more
    often) while the latency figure drew the runs' mean. Pooled, each contender's median is that of its processes
    in both runs (bmm 2 ms), its runs' medians decide the lead (they interleave: within the noise), and a
    contender that stalled in one run but ran ok in the other is ranked, not counted as stalled."""
    from attnbench.reports.html import _headline, write_report
    from attnbench.runner.results import make_row, rows_to_frame

    shape = attnbench.Workload(1, 2, 2, 64, 64, 16)

    def row(impl, median, run, status="ok"):
        samples = [median * (1 + k / 1000) for k in range(-5, 6)]
        reason = "" if status == "ok" else "the machine stalled"
        return make_row(impl, shape, status, reason, median_ms=median, samples_ms=samples, tflops=1 / median) | {
            "run": run
        }

    rows = [
        row("bmm", 1.0, "a"),
        row("einsum", 1.5, "a"),
        row("naive", 9.0, "a", "stalled"),
        row("bmm", 3.0, "b"),
        row("einsum", 1.5, "b"),
        row("naive", 8.0, "b"),
        row("flex", 5.0, "b", "stalled"),
    ]
    frame = rows_to_frame(rows).assign(machine="test cpu", run=[r["run"] for r in rows])
    (headline,) = _headline(frame, None)
    assert headline["fastest"] == "einsum ≈ bmm" and headline["within_noise"], headline
    assert headline["median"] == "1.5" and headline["margin"].startswith("1.33×"), headline
    assert headline["stalled"] == 1 and headline["runs"] == 2, headline  # flex only: naive ran ok in run b
    page = write_report(frame, [], [], tmp_path, None, "attnbench report a b").read_text()
    assert '<td class="num">1.5 (2 runs)</td>' in page  # the pooled median says so in its cell


def test_the_page_says_which_machines_the_figures_leave_out_and_what_a_blank_speedup_cell_means(tmp_path):
    """A ×2-thread run whose every case stalled beside a ×1-thread run: the figures drew the ×1 run's panels, titled
    without a machine (they name one only where they draw several), so nothing said whose they were."""
    from attnbench.reports.html import CAPTIONS, write_report
    from attnbench.runner.results import make_row, rows_to_frame

    shape = attnbench.Workload(1, 2, 2, 64, 64, 16)
    rows = [
        make_row("bmm", shape, "ok", median_ms=1.0) | {"machine": "cpu ×1 threads @ vm"},
        make_row("bmm", shape, "stalled", "the machine stalled", median_ms=2.0) | {"machine": "cpu ×2 threads @ vm"},
    ]
    frame = rows_to_frame(rows).assign(machine=[r["machine"] for r in rows], run=["one", "two"])
    page = write_report(frame, [], [], tmp_path, None, "attnbench report one two").read_text()
    assert "The figures show cpu ×1 threads @ vm\nonly: no row of cpu ×2 threads @ vm ran ok." in page
    alone = write_report(frame.iloc[:1], [], [], tmp_path, None, "attnbench report one").read_text()
    assert 'id="undrawn-machines"' not in alone
    assert "A blank cell: that contender has no ok row there" in CAPTIONS["speedup.png"]


def test_the_headline_names_one_machine_once_and_several_in_a_column(tmp_path):
    """A report of one machine repeated its label in every headline row; it is said once above the table, and the
    column is there where the rows come from several machines."""
    from attnbench.reports.html import write_report
    from attnbench.runner.results import make_row, rows_to_frame

    shapes = [attnbench.Workload(1, 2, 2, seq, seq, 16) for seq in (64, 128)]
    rows = [make_row("bmm", shape, "ok", median_ms=1.0) for shape in shapes]
    frame = rows_to_frame(rows).assign(machine="cpu ×1 threads @ vm", run="one")
    page = write_report(frame, [], [], tmp_path, None, "attnbench report one").read_text()
    table = page[page.index('id="headline-table"') :].split("</table>")[0]
    assert '<p class="sub" id="headline-machine">On cpu ×1 threads @ vm.</p>' in page
    assert "<th>machine</th>" not in table and "cpu ×1 threads" not in table
    two = frame.assign(machine=["cpu ×1 threads @ vm", "cpu ×1 threads @ other"])
    page = write_report(two, [], [], tmp_path, None, "attnbench report one two").read_text()
    table = page[page.index('id="headline-table"') :].split("</table>")[0]
    assert 'id="headline-machine"' not in page and "<th>machine</th>" in table and table.count("<td>cpu ×1") == 2


def test_a_reader_that_leaves_early_keeps_the_finished_page(two_runs, tmp_path, monkeypatch):
    """`attnbench report RUN --out R | true`: the pipe closed as the command printed the page's path, after the
    page was written, and the cleanup of unfinished pages removed it — the earlier report with it — exit 0.
    compare printed its table before writing its page, so `compare … | head` left none."""
    import builtins
    import io
    import sys

    from attnbench.cli import main

    run, _ = two_runs
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    real = builtins.print

    def closed_pipe(*args, **kwargs):
        if kwargs.get("file") in (None, sys.stdout):
            raise BrokenPipeError
        real(*args, **kwargs)

    monkeypatch.setattr(builtins, "print", closed_pipe)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # what a closed pipe's handler closes
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    kept = {p.name for p in (tmp_path / "report").iterdir()}
    assert {"report.html", "latency.png"} <= kept, kept
    assert main(["compare", str(run), str(run), "--out", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "compare.html").is_file()


def test_runs_of_one_machine_that_ran_different_code_are_pooled_with_a_warning(tmp_path):
    """`attnbench report before after` on one host, torch upgraded between them: both runs' cases were pooled as
    repeats of one contender, and nothing said the code differed."""
    from attnbench.reports.frames import Run
    from attnbench.reports.html import write_report
    from attnbench.reports.pooled import code_differences
    from attnbench.runner.results import make_row, rows_to_frame

    shape = attnbench.Workload(1, 2, 2, 64, 64, 16)
    environment = {"cpu_name": "cpu", "hostname": "vm", "threads": 1, "torch_version": "2.13.0", "git_commit": "abc"}
    before = Run("before", tmp_path / "before", pd.DataFrame(), {"environment": environment})
    after = Run(
        "after", tmp_path / "after", pd.DataFrame(), {"environment": {**environment, "torch_version": "2.11.0"}}
    )
    same = Run("again", tmp_path / "again", pd.DataFrame(), {"environment": environment})
    assert code_differences([before, same]) == []
    (line,) = code_differences([before, after, same])
    said = "ran different code (torch 2.13.0 (before, again) / 2.11.0 (after)): "
    assert line.startswith(f"runs before, after, again of cpu ×1 threads @ vm {said}")
    assert "`attnbench compare`" in line and "commit" not in line
    frame = rows_to_frame([make_row("bmm", shape, "ok", median_ms=m) for m in (1.0, 1.2)])
    frame = frame.assign(machine="cpu ×1 threads @ vm", run=["before", "after"])
    page = write_report(frame, [before, after], [], tmp_path, None, "attnbench report before after").read_text()
    assert '<p class="warn pooled-code">runs before, after of cpu ×1 threads @ vm ran different code' in page


def test_runs_of_two_commits_of_a_plugin_are_pooled_with_a_warning(tmp_path):
    """A kernel author's runs of their plugin at two commits, attnbench and torch unchanged: `report v1 v2` pooled
    them as repeats of one contender, and nothing said the kernel differed. A run from before plugins were
    recorded is left out of that comparison (it cannot say); one without the plugin says it was not installed."""
    from attnbench.reports.frames import Run
    from attnbench.reports.pooled import code_differences

    environment = {"cpu_name": "cpu", "hostname": "vm", "threads": 1, "torch_version": "2.13.0", "git_commit": "abc"}

    def run(name: str, **plugins: str) -> Run:
        return Run(name, tmp_path / name, pd.DataFrame(), {"environment": {**environment, "plugins": plugins}})

    v1, v2 = run("v1", tiledattn="0.1.0 at cb4fd76d7e10"), run("v2", tiledattn="0.1.0 at 7cbd6124e78a+edits")
    older = Run("older", tmp_path / "older", pd.DataFrame(), {"environment": environment})
    assert code_differences([v1, run("again", tiledattn="0.1.0 at cb4fd76d7e10"), older]) == []
    (line,) = code_differences([v1, v2, older, run("none")])
    assert line.startswith("runs v1, v2, older, none of cpu ×1 threads @ vm ran different code (plugin tiledattn ")
    said = "0.1.0 at cb4fd76d7e10 (v1) / 0.1.0 at 7cbd6124e78a+edits (v2) / not installed (none)): "
    assert f"(plugin tiledattn {said}" in line and "torch" not in line and "`attnbench compare`" in line


def test_the_environment_names_each_plugin_with_its_version_and_commit(tmp_path, monkeypatch):
    """meta.json says which version of a plugin's contender a run timed: the distribution's version, and the git
    commit of the checkout it is installed editable from (+edits when its tracked files changed)."""
    from attnbench.measure.environment import plugins

    site, clone = tmp_path / "site", tmp_path / "clone"
    clone.mkdir()
    (clone / "kernel.py").write_text("X = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=clone, check=True)
    subprocess.run([*git, "add", "-A"], cwd=clone, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], cwd=clone, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, check=True, capture_output=True, text=True).stdout
    fake_distribution(site, "edplug", {"edplug": "edplug:contender"}, {})
    direct = {"url": clone.as_uri(), "dir_info": {"editable": True}}
    (site / "edplug-1.0.dist-info" / "direct_url.json").write_text(json.dumps(direct))
    fake_distribution(site, "plainplug", {"plainplug": "plainplug:contender"}, {})
    monkeypatch.syspath_prepend(str(site))
    found = plugins()
    assert found["edplug"] == f"1.0 at {sha[:12]}" and found["plainplug"] == "1.0" and "attnbench" not in found
    (clone / "kernel.py").write_text("X = 2\n")
    assert plugins()["edplug"] == f"1.0 at {sha[:12]}+edits"


def test_the_report_and_compare_pages_say_near_their_top_what_each_run_ran_on_and_with(cli, two_runs, tmp_path):
    """A colleague's first question — which machine, how many threads, which attnbench commit and torch — was
    answered by report.html only in a JSON dump at its end, and by compare.html nowhere (it named the folders)."""
    from attnbench.reports.frames import environment_line

    run, other = two_runs
    meta = json.loads((run / "meta.json").read_text())
    env = meta["environment"]
    line = environment_line(meta)
    assert line.startswith(f"{env['cpu_name']} ×{env['threads']} threads @ {env['hostname']} ({env['cpu_count']} CPU")
    assert f"torch {env['torch_version']}; Python {env['python']}" in line and "started " in line
    commit = f"at {env['git_commit'][:12]}" if env["git_commit"] else "(not from a git checkout)"  # a plain install
    assert f"attnbench {env['attnbench_version']} {commit}{'+edits' if env['git_dirty'] else ''};" in line
    edited = {"git_commit": "a" * 40, "git_dirty": True, "workdir_commit": "f" * 40, "workdir_dirty": False}
    said = "at aaaaaaaaaaaa+edits, run in a checkout at ffffffffffff;"
    assert said in environment_line({**meta, "environment": {**env, **edited}})
    assert cli("report", str(run), "--out", str(tmp_path / "report"))[0] == 0
    page = (tmp_path / "report" / "report.html").read_text()
    top = page[: page.index('<h2 id="headline">')]
    assert f"<li>{run.name}: {line}</li>".replace("'", "&#39;") in top
    assert cli("compare", str(run), str(other), "--out", str(tmp_path / "cmp"))[0] in (0, 1)
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert f"base: <code>{run}</code> — {line}<br>".replace("'", "&#39;") in page
    assert f"new: <code>{other}</code> — Other CPU ×{env['threads']} threads @ elsewhere" in page


def test_the_results_table_says_what_its_numeric_columns_measure_and_of_which_roof(tmp_path):
    """The table's headings are the results' column names: `pct_of_peak` left a reader to guess whether it was a
    share of the FMA roof, the bandwidth roof or torch's matmul. Every number the table shows by default is read
    out under its heading: units, and for pct_of_peak the roof (the hardware roofline at the row's intensity)."""
    from attnbench.reports.frames import Run
    from attnbench.reports.html import write_report
    from attnbench.reports.table import SHOWN
    from attnbench.runner.results import make_row, rows_to_frame

    frame = rows_to_frame([make_row("bmm", attnbench.Workload(1, 2, 2, 64, 64, 16), "ok", median_ms=1.0)])
    frame = frame.assign(machine="cpu ×1 threads @ vm", run="a")
    page = write_report(frame, [Run("a", tmp_path / "a", frame)], [], tmp_path, None, "attnbench report a").read_text()
    start = page.index('<p class="sub" id="columns-read">')
    said = " ".join(page[start : page.index("</p>", start)].split())
    numeric = [c for c in SHOWN if c in frame and pd.api.types.is_numeric_dtype(frame[c]) and c != "case"]
    assert "pct_of_peak" in numeric and all(f"<code>{c}</code>" in said for c in numeric), (numeric, said)
    assert "<code>pct_of_peak</code>: TFLOP/s as a percentage of the hardware roofline at the row's arithmetic" in said


def test_the_headlines_ratios_say_which_time_is_divided_by_which():
    """ "margin 2.50×" and "speedup over baseline 2.50×" left a reader to guess the direction of each ratio (is 0.4×
    or 2.5× the better?): each heading says it is the other's time over the fastest's, so above 1× is a lead."""
    import tempfile

    from attnbench.reports.html import write_report
    from attnbench.runner.results import make_row, rows_to_frame

    shape = attnbench.Workload(1, 2, 2, 64, 64, 16)
    rows = [make_row("bmm", shape, "ok", median_ms=1.0), make_row("sdpa_flash", shape, "ok", median_ms=2.5)]
    frame = rows_to_frame(rows).assign(machine="cpu ×1 threads @ vm", run="one")
    with tempfile.TemporaryDirectory() as folder:
        page = write_report(frame, [], [], Path(folder), "sdpa_flash", "attnbench report one").read_text()
    table = page[page.index('id="headline-table"') :].split("</table>")[0]
    heads = [re.sub(r"<[^>]+>", " ", h).split() for h in re.findall(r"<th>(.*?)</th>", table)]
    assert ["margin", "runner-up's", "ms", "÷", "fastest's"] in heads
    assert ["speedup", "over", "baseline", "baseline's", "ms", "÷", "fastest's"] in heads
    cells = re.findall(r"<td[^>]*>(.*?)</td>", table)
    assert cells[1].startswith("bmm") and cells[5] == "sdpa_flash" and cells[6].startswith("2.50×"), cells
    assert cells[7:9] == ["sdpa_flash", "2.50×"], cells  # the baseline, 2.5× the fastest's time


def test_the_figure_captions_hold_no_markdown_which_the_page_shows_as_typed():
    """The masks figure's caption showed `choice` and `attnbench masks --tile` with their backticks: captions are
    escaped text on the page, not markdown."""
    from attnbench.reports.html import CAPTIONS

    assert [name for name, text in CAPTIONS.items() if "`" in text or "**" in text] == []
