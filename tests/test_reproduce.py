"""One command per row (issue 19, item 4): every row's `reproduce` command reruns exactly its case, and
`attnbench run --from RUN_DIR --case N` reruns row N of a run with that run's settings."""

import json
import shlex

import pandas as pd
import pytest

from attnbench.cli import build_parser, main, request_from_args
from attnbench.reports.compare import Settings, compare_frames
from attnbench.reports.frames import load_run
from attnbench.reports.table import SHOWN, shown_columns, table_frame
from attnbench.runner.request import RunSettings
from attnbench.runner.results import CASE_COLUMNS, load_results
from attnbench.runner.sweep import plan_cases

SMALL = ["--impl", "bmm,sdpa_flash", "--seq", "64,128", "--mask", "none,causal", "--budget-s", "0.02"]
FEATURES = [
    "--impl",
    "bmm,sdpa_flash",
    "--seq",
    "64",
    "--mask",
    "sliding_window",
    "--window",
    "16",
    "--budget-s",
    "0.02",
    "--seed",
    "3",
    "--threads",
    "1",
    "--isolate",
    "none",
]


def _case(row: dict) -> dict:
    return {column: row[column] for column in CASE_COLUMNS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reproduce")
    made = {}
    for name, flags in (("small", SMALL), ("features", FEATURES)):
        assert main(["run", *flags, "--progress", "off", "--out", str(folder / name)]) == 0
        made[name] = folder / name
    return made


def _planned(command: str):
    argv = shlex.split(command)
    assert argv[:2] == ["attnbench", "run"]
    args = build_parser().parse_args(argv[1:])
    args.command_line = command
    request = request_from_args(args)
    return request, plan_cases(request)[1]


@pytest.mark.parametrize("name", ["small", "features"])
def test_every_rows_command_plans_exactly_its_case_with_the_runs_settings(runs, name):
    frame = load_results(runs[name])
    assert len(frame) == (16 if name == "small" else 4)
    settings = RunSettings.from_meta(json.loads((runs[name] / "meta.json").read_text())["settings"])
    for row in frame.to_dict("records"):
        request, cases = _planned(row["reproduce"])
        assert len(cases) == 1
        impl, workload = cases[0]
        assert _case({"impl": impl, **workload.as_row()}) == _case(row)
        assert (request.budget_s, request.seed) == (0.02, settings.seed)
        assert "--out" not in row["reproduce"]
    if name == "features":
        assert all("--window 16 --seed 3 --threads 1" in c and c.endswith("--isolate none") for c in frame["reproduce"])
        assert request.threads == 1 and request.isolate == "none"


def test_a_rows_command_run_as_printed_gives_one_row_of_the_same_case(runs, tmp_path):
    row = load_results(runs["features"]).iloc[2].to_dict()
    argv = shlex.split(row["reproduce"])
    assert main([*argv[1:], "--progress", "off", "--out", str(tmp_path / "again")]) == 0
    again = load_results(tmp_path / "again")
    assert len(again) == 1 and _case(again.iloc[0].to_dict()) == _case(row)
    assert again.iloc[0]["reproduce"] == row["reproduce"]


def test_from_case_reruns_that_row_with_the_runs_settings(runs, tmp_path):
    row = load_results(runs["small"]).iloc[5].to_dict()
    assert (
        main(["run", "--from", str(runs["small"]), "--case", "5", "--progress", "off", "--out", str(tmp_path / "five")])
        == 0
    )
    again = load_results(tmp_path / "five")
    assert len(again) == 1 and _case(again.iloc[0].to_dict()) == _case(row)
    meta = json.loads((tmp_path / "five" / "meta.json").read_text())
    assert meta["settings"]["budget_s"] == 0.02 and meta["settings"]["seed"] == 0
    assert again.iloc[0]["reproduce"] == row["reproduce"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--case", "16"], "--case 16: out of range; {run} has cases 0 to 15"),
        (["--case", "-1"], "--case -1: out of range; {run} has cases 0 to 15"),
        (["--case", "two"], "--case 'two': expected a case number, 0 to 15"),
        (["--case", "1.5"], "--case '1.5': expected a case number"),
        ([], "--from RUN_DIR and --case N go together"),
        (["--case", "1", "--seq", "64"], "--from reruns one case of RUN_DIR with its settings; drop --seq"),
        (["--case", "1", "--suite", "quick", "--budget-s", "1"], "drop --suite, --budget-s"),
        (["--case", "1", "--seed", "3", "--no-memory"], "drop --seed, --no-memory"),
        (["--case", "1", "--isolate", "none", "--cpu-allocator", "system"], "drop --cpu-allocator, --isolate"),
        (["--case", "1", "--remeasure-ceilings"], "drop --remeasure-ceilings"),
        (["--case", "1", "--seed", "0", "--isolate=worker"], "drop --seed, --isolate"),  # the defaults, written
    ],
)
def test_bad_from_case_is_one_line_exit_2_nothing_written(runs, tmp_path, capsys, flags, message):
    out = tmp_path / "never"
    assert main(["run", "--from", str(runs["small"]), *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(run=runs["small"]) in err
    assert not out.exists()


def test_from_a_folder_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    cases = ((tmp_path / "empty", "no results.parquet or rows.jsonl"), (tmp_path / "no", "not a folder"))
    for folder, message in cases:
        assert main(["run", "--from", str(folder), "--case", "0", "--out", str(tmp_path / "never")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--from {folder}" in err and message in err
    assert not (tmp_path / "never").exists()


def test_old_runs_get_their_commands_and_reports_show_them(runs, tmp_path):
    fresh = load_run(runs["features"]).frame
    old = tmp_path / "old"
    old.mkdir()
    (old / "meta.json").write_text((runs["features"] / "meta.json").read_text())
    pd.read_parquet(runs["features"] / "results.parquet").drop(columns=["reproduce"]).to_parquet(
        old / "results.parquet"
    )
    assert load_run(old).frame["reproduce"].tolist() == fresh["reproduce"].tolist()
    table = table_frame(fresh.assign(run="features"))
    assert table["case"].tolist() == [0, 1, 2, 3] and "case" in SHOWN and "reproduce" not in SHOWN
    assert table["reproduce"].tolist() == fresh["reproduce"].tolist()


def test_a_report_of_two_runs_shows_and_filters_which_run_each_row_is_from(runs):
    """`report runs/k05 runs/k06` showed two rows alike for each case (impl, case number, shape) but for their
    medians: which run a row came from was a hidden column with no pane. Where a report holds two runs (or
    machines), the column is shown after impl and is a filter."""
    from attnbench.reports.table import _options

    fresh = load_run(runs["features"]).frame.assign(machine="vm")
    one = table_frame(fresh.assign(run="features"))
    assert "run" not in shown_columns(one) and "machine" not in shown_columns(one)
    both = table_frame(pd.concat([fresh.assign(run="before"), fresh.assign(run="after", machine="node2")]))
    assert list(both.columns[:4]) == ["impl", "run", "machine", "case"]
    assert both["case"].tolist() == [0, 1, 2, 3] * 2  # each run's own row numbers (run --from RUN --case N)
    options = _options(both)
    assert options["searchPanes"]["columns"][:2] == [1, 2]
    assert not {1, 2} & set(options["columnDefs"][0]["targets"])  # shown, not hidden


def test_compare_offers_the_new_runs_command_per_case(runs):
    new = load_run(runs["small"]).frame
    comparison = compare_frames(new, new, Settings(threshold=0.05, alpha=0.01))
    by_case = {tuple(_case(r).values()): r["reproduce"] for r in new.to_dict("records")}
    assert [by_case[tuple(_case(r).values())] for r in comparison.table.to_dict("records")] == comparison.table[
        "reproduce"
    ].tolist()
    assert comparison.table["reproduce"].str.startswith("attnbench run --impl ").all()
