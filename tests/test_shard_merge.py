"""Shards and what reads them: whole workloads per shard, a partition no machine's software changes, merge's
checks, and a merged folder read by compare, store and report as its shards are (review 2, findings 1–6)."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from attnbench.runner.request import build_request
from attnbench.runner.sweep import plan_cases

from conftest import stalled_as_ok

SWEEP = ["--suite", "quick", "--impl", "bmm,einsum", "--seq", "64", "--budget-s", "0.05", "--threads", "1"]


def _shard_workloads(impl: str, count: int, **axes: str) -> list[set]:
    """Each shard's workloads for ``--impl impl`` (the quick suite), with each shard's plan."""
    found = []
    for index in range(1, count + 1):
        plan: dict = {}
        _, cases = plan_cases(build_request("quick", {"impl": impl, **axes}, shard=f"{index}/{count}"), plan=plan)
        found.append(({w for _, w in cases}, cases, plan))
    return found


def test_a_shard_holds_every_contender_of_its_workloads():
    axes = {"seq": "256,512", "mask": "none,causal"}
    _, everything = plan_cases(build_request("quick", {"impl": "bmm,sdpa_flash,einsum", **axes}))
    shards = _shard_workloads("bmm,sdpa_flash,einsum", 3, **axes)
    owned = [workloads for workloads, _, _ in shards]
    assert all(owned) and sum(map(len, owned)) == len(set.union(*owned))  # each workload in one shard only
    for workloads, cases, _ in shards:
        # every contender of a workload it holds, so they are timed together (interleaved rounds)
        assert sorted(cases, key=str) == sorted([c for c in everything if c[1] in workloads], key=str)
    assert sorted(c for _, cases, _ in shards for c in map(str, cases)) == sorted(map(str, everything))


def test_the_partition_does_not_depend_on_which_contenders_a_machine_has():
    """A machine where fused_triton loads (TRITON_INTERPRET=1) plans `available` with one contender more: the
    workloads each shard owns, and the plan meta.json records, stay the same (review 2, finding 3)."""
    axes = {"seq": "256,512", "mask": "none"}
    without = _shard_workloads("bmm,sdpa_flash", 2, **axes)
    with_more = _shard_workloads("bmm,sdpa_flash,fused_triton,einsum", 2, **axes)
    assert [w for w, _, _ in without] == [w for w, _, _ in with_more]
    plans = [plan for _, _, plan in without + with_more]
    assert plans[0]["by"] == "workload" and plans[0]["workloads"] == 4
    assert all(plan == plans[0] for plan in plans)
    # the plan is the sweep's workloads before any contender is left out: a machine whose `available` contenders
    # all suit none of a sweep's workloads would have lost those workloads from the partition
    alone = _shard_workloads("einsum", 2, **axes)
    assert [p for _, _, p in alone] == plans[:2] and [w for w, _, _ in alone] == [w for w, _, _ in without]
    other = _shard_workloads("bmm", 2, seq="256", mask="none")[0][2]
    assert other["sha256"] != plans[0]["sha256"] and other["workloads"] == 2


def test_a_shard_with_no_workload_says_it_runs_nothing(cli, tmp_path):
    """Whole workloads per shard: a sweep of fewer workloads than shards leaves the last shard empty — said, not
    silent."""
    out = tmp_path / "empty"
    code, _, err = cli("run", "--suite", "quick", "--impl", "bmm", "--seq", "64", "--mask", "none", "--shard", "9/9",
                       "--budget-s", "0.05", "--threads", "1", "--out", str(out))  # fmt: skip
    assert code == 0, err
    said = re.search(r"shard 9/9 holds none of this sweep's ([1-8]) workload\(s\)[^\n]*: it runs nothing", err)
    assert said and said.group(0) in json.loads((out / "meta.json").read_text())["warnings"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two shards of one tiny sweep and their merge."""
    from attnbench.cli import main

    root = tmp_path_factory.mktemp("shards")
    for index in (1, 2):
        assert main(["run", *SWEEP, "--shard", f"{index}/2", "--out", str(root / f"s{index}")]) == 0
        stalled_as_ok(root / f"s{index}")  # the readers are tested, not the timing: a busy machine stalls rows
    assert main(["merge", str(root / "s1"), str(root / "s2"), "--out", str(root / "merged")]) == 0
    return root / "s1", root / "s2", root / "merged"


def _edit_meta(folder: Path, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    meta.update(changes)
    (folder / "meta.json").write_text(json.dumps(meta))


def test_merge_refuses_shards_planned_from_different_sweeps(cli, shards, tmp_path):
    s1, s2, merged = shards
    frame = pd.read_parquet(merged / "results.parquet")
    assert frame.groupby("mask")["run"].nunique().eq(1).all()  # a workload's contenders come from one shard
    plan = json.loads((s1 / "meta.json").read_text())["shard_plan"]
    assert plan == json.loads((s2 / "meta.json").read_text())["shard_plan"] and plan["workloads"] == 4
    other = tmp_path / "s2-other"
    shutil.copytree(s2, other)
    _edit_meta(other, shard_plan={**plan, "workloads": 3, "sha256": "0" * 16})
    code, _, err = cli("merge", str(s1), str(other), "--out", str(tmp_path / "m"))
    assert code == 2 and not (tmp_path / "m").exists(), err
    line = err.strip()
    assert line.startswith("attnbench: error: shards s1 and s2-other"), line
    assert (
        "\n" not in line and "shards s1 and s2-other of suite quick (split into 2) were planned from different " in line
    )
    assert f"s1: 4 workloads by workload, plan {plan['sha256']}; s2-other: 3 workloads" in line
    old = tmp_path / "s2-old"  # planned by an attnbench that split per case
    shutil.copytree(s2, old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["shard_plan"]
    (old / "meta.json").write_text(json.dumps(meta))
    code, _, err = cli("merge", str(s1), str(old), "--out", str(tmp_path / "m"))
    assert code == 2 and "s2-old: per case, by an attnbench older than shard plans" in err, err
    damaged = tmp_path / "s2-damaged"  # a traceback (ValueError), exit 1, before
    shutil.copytree(s2, damaged)
    _edit_meta(damaged, shard="1/two")
    code, _, err = cli("merge", str(s1), str(damaged), "--out", str(tmp_path / "m"))
    assert code == 2 and err.count("\n") == 1 and "says shard '1/two', not I/N" in err, err
    assert not (tmp_path / "m").exists()


def _verdicts(text: str) -> pd.Series:
    """compare's verdict per table line (its words after the workload: `missing`, `same`, `not comparable` …)."""
    found = [v for line in text.splitlines() for v in ("missing", "same", "unclear", "comparable") if f" {v} " in line]
    return pd.Series(found, dtype=object)


def test_compare_reads_a_merged_folder_as_one_run(cli, shards, tmp_path):
    s1, s2, merged = shards
    code, text, err = cli("compare", str(merged), str(merged), "--out", str(tmp_path / "same"))
    assert code == 0, err
    assert len(_verdicts(text)) == 8 and "missing" not in text, text  # every case of both shards, against itself
    for shard in (s1, s2):
        code, text, err = cli("compare", str(shard), str(merged), "--out", str(tmp_path / shard.name))
        assert code == 0, err
        assert (_verdicts(text) == "missing").sum() == 4 and text.count("only in new") == 1, text  # a footnote
        assert "only in base" not in text
    code, _, err = cli("compare", str(s1), str(s2), "--out", str(tmp_path / "none"))
    assert code == 2 and "(4 case(s) in BASE, 4 in NEW, none with the same contender and workload)" in err


def _copy_as_other_machine(run: Path, target: Path, **environment) -> Path:
    shutil.copytree(run, target)
    meta = json.loads((target / "meta.json").read_text())
    meta["environment"].update(environment)
    (target / "meta.json").write_text(json.dumps(meta))
    return target


def test_compare_across_machines_names_both(cli, shards, tmp_path):
    from attnbench.reports.frames import machine_label, without_threads

    s1 = shards[0]
    other = _copy_as_other_machine(s1, tmp_path / "x", cpu_name="Intel(R) Xeon(R) Platinum 8480", hostname="other-box")
    here = without_threads(machine_label(json.loads((s1 / "meta.json").read_text())["environment"]))
    code, text, err = cli("compare", str(s1), str(other), "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    said = (
        f"BASE ran on {here} and NEW on Intel(R) Xeon(R) Platinum 8480 @ other-box: every case moves with the hardware"
    )
    assert f"note: {said}" in text, text
    assert said in (tmp_path / "cmp" / "compare.html").read_text()
    threads = _copy_as_other_machine(s1, tmp_path / "t", threads=7)  # a setting, not a machine: no machine note
    for new in (s1, threads):
        code, text, _ = cli("compare", str(s1), str(new), "--out", str(tmp_path / f"c-{new.name}"))
        assert code == 0 and " ran on " not in text, text


def test_merging_a_merged_folder_lists_its_runs_and_compare_refuses_a_case_held_twice(cli, shards, tmp_path):
    s1, _, merged = shards
    other = _copy_as_other_machine(s1, tmp_path / "s1", cpu_name="Other CPU", hostname="elsewhere")
    again = tmp_path / "again"
    assert cli("merge", str(merged), str(other), "--out", str(again))[0] == 0
    entries = json.loads((again / "meta.json").read_text())["merged_from"]
    assert [e["run"] for e in entries] == ["s1", "s2", "s1#2"]  # the merged folder's own runs, names kept unique
    assert entries[2]["meta"]["environment"]["hostname"] == "elsewhere"
    assert set(pd.read_parquet(again / "results.parquet")["run"]) == {"s1", "s2", "s1#2"}
    code, _, err = cli("compare", str(again), str(merged), "--out", str(tmp_path / "cmp"))
    assert code == 2 and err.count("\n") == 1 and f"BASE {again} holds case " in err and " 2 times (from " in err, err
    assert "Other CPU ×1 threads @ elsewhere" in err


def _runs_table(db: Path) -> pd.DataFrame:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT name, machine, git_commit, started_at, n_rows FROM runs ORDER BY name").df()
        runs.attrs["rows"] = con.execute("SELECT count(*) FROM rows").fetchone()[0]
    return runs


def test_storing_a_merged_folder_stores_its_shards_once(cli, shards, tmp_path):
    s1, s2, merged = shards
    db = tmp_path / "h.duckdb"
    code, text, _ = cli("store", str(merged), "--db", str(db))
    assert code == 0 and text.count("added") == 2 and "s1 (from merged)" in text, text
    runs = _runs_table(db)
    commits = [json.loads((s / "meta.json").read_text())["environment"]["git_commit"] for s in (s1, s2)]
    assert list(runs["name"]) == ["s1", "s2"] and list(runs["git_commit"]) == commits, runs
    assert "unknown machine" not in set(runs["machine"]) and runs.attrs["rows"] == 8
    copy = tmp_path / "merged-copy"
    shutil.copytree(merged, copy)
    code, text, _ = cli("store", str(s1), str(s2), str(copy), "--db", str(db))  # its shards and a copy: nothing new
    assert code == 0 and text.count("unchanged") == 4 and "added" not in text, text
    assert len(_runs_table(db)) == 2 and _runs_table(db).attrs["rows"] == 8
    meta = json.loads((copy / "meta.json").read_text())
    meta["merged_from"][1]["meta"] = {}
    (copy / "meta.json").write_text(json.dumps(meta))
    code, _, err = cli("store", str(copy), "--db", str(tmp_path / "new.duckdb"))
    assert code == 2 and err.count("\n") == 1 and "store the run folders it was merged from" in err, err
    assert not (tmp_path / "new.duckdb").exists()


def test_report_of_a_merged_folder_says_what_its_shards_reports_say(cli, shards, tmp_path):
    import html

    s1, s2, merged = shards
    planted = tmp_path / "merged"
    shutil.copytree(merged, planted)
    meta = json.loads((planted / "meta.json").read_text())
    meta["merged_from"][1]["meta"]["warnings"] = ["a planted warning of shard 2 <b>"]
    (planted / "meta.json").write_text(json.dumps(meta))
    assert cli("report", str(planted), "--out", str(tmp_path / "rep"))[0] == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert (tmp_path / "rep" / "roofline.png").exists()  # drawn from the shards' ceilings
    assert "2 run(s), 8 rows" in page and "unknown machine" not in page
    assert "s2: " + html.escape("a planted warning of shard 2 <b>", quote=False) in page
    assert cli("report", str(merged), "--out", str(tmp_path / "m"))[0] == 0
    assert cli("report", str(s1), str(s2), "--out", str(tmp_path / "s12"))[0] == 0
    said = [
        re.findall(r'<div class="warn" id="run-warnings">.*?</div>', (tmp_path / d / "report.html").read_text(), re.S)
        for d in ("m", "s12")
    ]
    assert said[0] == said[1]
    for shard in (s1, s2):
        environment = json.loads((shard / "meta.json").read_text())["environment"]
        assert html.escape(environment["cpu_name"], quote=False) in page and environment["hostname"] in page


def test_merge_warns_when_shards_hold_different_contenders(cli, shards, tmp_path):
    """`--impl available` resolves on each machine: a shard from a machine without einsum leaves einsum ranked on
    the other shard's workloads alone, and merge said nothing of it."""
    s1, s2, _ = shards
    code, _, err = cli("merge", str(s1), str(s2), "--out", str(tmp_path / "same"))
    assert code == 0 and "different contenders" not in err, err
    lacking = tmp_path / "s2-lacking"
    shutil.copytree(s2, lacking)
    frame = pd.read_parquet(lacking / "results.parquet")
    frame[frame["impl"] != "einsum"].to_parquet(lacking / "results.parquet")
    _edit_meta(lacking, environment={"cpu_name": "Other CPU", "hostname": "elsewhere", "threads": 1})
    code, _, err = cli("merge", str(s1), str(lacking), "--out", str(tmp_path / "m"))
    assert code == 0, err
    (line,) = [line for line in err.splitlines() if "different contenders" in line]
    assert line.startswith("warning: the shards of suite quick (split into 2) hold different contenders — einsum ")
    assert "einsum not in shard(s) 2 (Other CPU ×1 threads @ elsewhere)" in line and "bmm" not in line
    assert "one --impl list" in line
    frame.loc[frame["impl"] == "einsum", "status"] = "unavailable"  # --impl all: rows of what the machine lacks
    frame.to_parquet(lacking / "results.parquet")
    code, _, err = cli("merge", str(s1), str(lacking), "--out", str(tmp_path / "m2"))
    assert code == 0 and "einsum not in shard(s) 2 (Other CPU ×1 threads @ elsewhere)" in err, err


def test_merge_warns_when_a_shard_is_in_more_runs_than_another(cli, shards, tmp_path):
    """A requeued array task runs shard 2 again on another node: a different host is a different machine, so its
    cases did not collide, and merge took them in twice without a word (three runs of a two-shard sweep, 12 rows
    of 8 cases). Whole copies of the sweep on two machine kinds are not uneven."""
    s1, s2, _ = shards
    node = json.loads((s2 / "meta.json").read_text())["environment"]
    again = _copy_as_other_machine(s2, tmp_path / "s2-again", hostname="node03")
    code, text, err = cli("merge", str(s1), str(s2), str(again), "--out", str(tmp_path / "m"))
    assert code == 0 and "12 rows" in text, err
    (line,) = [line for line in err.splitlines() if "not each on as many machines" in line]
    assert line.startswith("warning: the shards of suite quick with {") and "(split into 2)" in line, line
    assert "shard 1 on 1 (s1: " in line and "shard 2 on 2 (s2: " in line and f"@ {node['hostname']}; s2-again: " in line
    assert "@ node03)" in line and "merge one of its runs" in line
    kind = {"cpu_name": "Other CPU", "hostname": "elsewhere"}
    others = [_copy_as_other_machine(s, tmp_path / f"other-{s.name}", **kind) for s in (s1, s2)]
    code, _, err = cli("merge", str(s1), str(s2), *map(str, others), "--out", str(tmp_path / "two-kinds"))
    assert code == 0 and "not each on as many machines" not in err and "not among these runs" not in err, err
    code, _, err = cli("merge", str(s1), str(s2), str(others[0]), "--out", str(tmp_path / "one-lacking"))
    assert code == 0 and "shard 1 on 2 (s1: " in err and "other-s1: Other CPU" in err, err
    rerun = tmp_path / "s2-rerun"  # shard 2 again on its own machine: a report pools the two, as it pools repeats
    shutil.copytree(s2, rerun)
    code, _, err = cli("report", str(s1), str(s2), str(rerun), "--out", str(tmp_path / "pooled"))
    assert code == 0 and "as many machines" not in err, err


def test_from_a_merged_folder_reruns_its_row_with_its_shards_settings(cli, shards, tmp_path):
    """`merge`, `report`, then `run --from MERGED --case N` on a suspicious row: refused ("a merged folder?; give
    the run folder the row came from"), while the report numbered a merged folder's rows per shard, so its `case`
    was no row number of the folder the report was made from. Now N is the row's index in the merged file, the
    report's `case` column says that index, and the settings are those of the shard the row came from."""
    from test_reports import table_rows

    s1, _, merged = shards
    planted = tmp_path / "merged"
    shutil.copytree(merged, planted)
    meta = json.loads((planted / "meta.json").read_text())
    assert [e["run"] for e in meta["merged_from"]] == ["s1", "s2"]
    meta["merged_from"][1]["meta"]["settings"]["seed"] = 7  # shard 2 ran with its own settings
    (planted / "meta.json").write_text(json.dumps(meta))
    frame = pd.read_parquet(planted / "results.parquet")
    number = len(pd.read_parquet(s1 / "results.parquet"))  # the first row of shard 2
    assert frame.loc[number, "run"] == "s2" and number > 0
    assert cli("report", str(planted), "--out", str(tmp_path / "rep"))[0] == 0
    rows = table_rows((tmp_path / "rep" / "report.html").read_text())
    header = ["impl", "run", "case"]  # shown_columns: run after impl where the table holds two runs
    assert [row[: len(header)] for row in rows] == [[r.impl, r.run, i] for i, r in enumerate(frame.itertuples())]
    out = tmp_path / "again"
    code, _, err = cli("run", "--from", str(planted), "--case", str(number), "--progress", "off", "--out", str(out))
    assert code == 0, err
    (row,) = pd.read_parquet(out / "results.parquet").to_dict("records")
    case = ["impl", "seq_q", "seq_k", "mask", "heads", "kv_heads", "head_dim"]
    assert [row[c] for c in case] == [frame.loc[number, c] for c in case]
    assert json.loads((out / "meta.json").read_text())["settings"]["seed"] == 7
    meta["merged_from"] = meta["merged_from"][:1]  # a merged folder whose rows name a run it does not keep
    (planted / "meta.json").write_text(json.dumps(meta))
    code, _, err = cli("run", "--from", str(planted), "--case", str(number), "--out", str(tmp_path / "never"))
    assert code == 2 and err.count("\n") == 1 and "does not name the row's run 's2' in merged_from" in err, err
    assert not (tmp_path / "never").exists()


def test_run_into_a_folder_that_holds_a_stopped_run_says_to_resume_it(cli, shards, tmp_path):
    """A job killed mid-sweep and started again with the same --out (a requeued array task) got "already exists and
    is not an empty folder; choose a new one": a new folder would begin the sweep again. Now the line says how far
    the run got and the --resume command that continues it; a finished run, and other commands' --out, as before."""
    s1, _, _ = shards
    stopped = tmp_path / "stopped"
    shutil.copytree(s1, stopped)
    _edit_meta(stopped, finished=False)
    rows = (stopped / "rows.jsonl").read_text().splitlines(keepends=True)
    (stopped / "rows.jsonl").write_text("".join(rows[:1]))
    before = {p.name: p.read_bytes() for p in stopped.iterdir()}
    code, _, err = cli("run", *SWEEP, "--shard", "1/2", "--out", str(stopped))
    assert code == 2 and err.count("\n") == 1, err
    said = f"it holds a run that stopped after 1 of its {len(rows)} cases; continue it with: attnbench run --resume "
    assert said + f"{stopped} (or choose a new folder)" in err, err
    assert {p.name: p.read_bytes() for p in stopped.iterdir()} == before
    code, _, err = cli("run", "--resume", str(stopped), "--progress", "off")
    assert code == 0 and len((stopped / "rows.jsonl").read_text().splitlines()) == len(rows), err
    code, _, err = cli("run", *SWEEP, "--out", str(s1))
    assert code == 2 and err.endswith(
        "already exists and is not an empty folder; it holds a finished run; choose a new one\n"
    )
    code, _, err = cli("merge", str(s1), "--out", str(stopped))
    assert code == 2 and err.endswith("already exists and is not an empty folder; choose a new one\n"), err


def test_merge_warns_of_a_shard_that_stopped_before_its_end(cli, shards, tmp_path):
    """Two array tasks killed by their wall time and never resumed: merge took 6 rows of a 20-case sweep without a
    word (every shard present, so no shard was missing). Now each stopped run is named with its count and the
    --resume command, from its folder or from a merged folder's copy of its meta.json."""
    s1, s2, _ = shards
    stopped = tmp_path / "s2"
    shutil.copytree(s2, stopped)
    frame = pd.read_parquet(stopped / "results.parquet")
    frame.iloc[:1].to_parquet(stopped / "results.parquet")
    _edit_meta(stopped, finished=False)
    code, text, err = cli("merge", str(s1), str(stopped), "--out", str(tmp_path / "m"))
    assert code == 0 and f", {len(pd.read_parquet(s1 / 'results.parquet')) + 1} rows," in text, err
    said = f"warning: run s2 stopped after 1 of its {len(frame)} planned cases: the rest are not among these runs; "
    assert said + f"continue it with: attnbench run --resume {stopped}" in err.splitlines(), err
    assert "s1 stopped" not in err
    code, _, err = cli("merge", str(tmp_path / "m"), "--out", str(tmp_path / "again"))
    assert code == 0 and said + f"continue it with: attnbench run --resume {stopped.resolve()}" in err.splitlines()
    code, _, err = cli("merge", str(s1), str(s2), "--out", str(tmp_path / "whole"))
    assert code == 0 and "stopped after" not in err, err


def test_a_report_of_shard_folders_says_what_merge_would_warn_of(cli, shards, tmp_path):
    """docs/long-sweeps.md: join the shards with merge, "or give all the folders to report" — but report said nothing
    of a shard missing or a run that stopped (merge's warnings were merge's alone). Now its terminal and its page
    say them."""
    import markupsafe

    s1, s2, merged = shards
    code, _, err = cli("report", str(s1), "--out", str(tmp_path / "one"))
    assert code == 0, err
    (line,) = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert "was split into 2 shards and shard(s) 2 of 2 are not among these runs" in line, err
    page = (tmp_path / "one" / "report.html").read_text()
    assert 'id="set-warnings"' in page and str(markupsafe.escape(line.removeprefix("warning: "))) in page
    for given in ([s1, s2], [merged]):
        code, _, err = cli("report", *map(str, given), "--out", str(tmp_path / given[-1].name))
        assert code == 0 and "warning: " not in err, err
        assert 'id="set-warnings"' not in (tmp_path / given[-1].name / "report.html").read_text()


def test_a_shard_given_with_spaces_or_zeros_merges(cli, shards, tmp_path):
    """`--shard " 1/2"` (a script's "$I/$N" with a stray space) ran, and meta.json kept the text as given, which merge
    then refused as "a damaged meta.json", naming no folder. meta.json now keeps I/N as merge reads it, and a shard
    merge cannot read is named by its folder."""
    _, s2, _ = shards
    spaced = tmp_path / "spaced"
    code, _, err = cli("run", *SWEEP, "--shard", " 01/2", "--progress", "off", "--out", str(spaced))
    assert code == 0, err
    assert json.loads((spaced / "meta.json").read_text())["shard"] == "1/2"
    code, _, err = cli("merge", str(spaced), str(s2), "--out", str(tmp_path / "m"))
    assert code == 0 and "warning" not in err, err
    _edit_meta(spaced, shard=" 1/2")  # as an earlier attnbench wrote it
    code, _, err = cli("merge", str(spaced), str(s2), "--out", str(tmp_path / "m2"))
    said = "a run's meta.json says shard ' 1/2', not I/N as run --shard writes it: a damaged meta.json"
    assert code == 2 and err == f"attnbench: error: {spaced}: {said}\n", err


def test_shards_on_a_clusters_nodes_are_drawn_as_one_machine(shards, tmp_path):
    """A sweep split over two nodes of one kind: each node's host name made it a machine of its own, and the report
    cut every workload group into a panel per node (S64 and S512 of one line in two panels). Hosts of one kind that
    hold disjoint cases now share their panels; hosts that ran the same cases stay apart."""
    from attnbench.reports.facets import facets
    from attnbench.reports.frames import load_runs
    from attnbench.reports.plots import plottable, roof_key

    s1, s2, _ = shards
    node2 = _copy_as_other_machine(s2, tmp_path / "s2", hostname="node2")

    def panels(*runs: Path) -> list[str]:
        frame, _ = load_runs(list(runs))
        return [facet.title for facet in facets(plottable(frame))]

    one_host = panels(s1, s2)
    assert panels(s1, node2) == one_host and not any("@" in title for title in one_host), panels(s1, node2)
    frame, _ = load_runs([s1, node2])
    ok = plottable(frame)
    assert set(ok["machine"]) == {f"{frame['machine'].iloc[0].split(' @ ')[0]} @ 2 hosts"}
    assert {roof_key(r)[0] for r in ok.to_dict("records")} == set(frame["machine"])  # each node's own ceilings
    again = _copy_as_other_machine(s1, tmp_path / "s1", hostname="node2")  # the same cases on a second node
    both = panels(s1, again)
    assert len(both) == 2 * len(panels(s1)) and sum("@ node2" in title for title in both) == len(panels(s1))
