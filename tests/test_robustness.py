"""Faults survived (raising, wrong, hung contenders), interrupt and resume, shards and merge."""

import json
import signal
import subprocess
import time

import pandas as pd
import pytest

from attnbench.runner.results import case_key

from conftest import CHECKED, attnbench_cmd, fake_distribution, run_subprocess

PLANTED = """
import time
import torch
from attnbench import Capabilities, Contender

class _Base(Contender):
    capabilities = Capabilities(devices=frozenset({"cpu"}))

class Raises(_Base):
    name = "planted_raises"
    def prepare(self, inputs, workload):
        def run():
            raise RuntimeError("planted failure")
        return run

class Wrong(_Base):
    name = "planted_wrong"
    def prepare(self, inputs, workload):
        q, k, v = inputs.q, inputs.k, inputs.v
        return lambda: torch.softmax(q @ k.transpose(-1, -2) / workload.head_dim, dim=-1) @ v

class Sleeper(_Base):
    name = "planted_sleeper"
    def prepare(self, inputs, workload):
        return lambda: time.sleep(3600)
"""


@pytest.fixture(scope="module")
def planted_site(tmp_path_factory):
    """A distribution with three misbehaving contenders, installed by putting it on PYTHONPATH."""
    site = tmp_path_factory.mktemp("site")
    entry_points = {
        "planted_raises": "planted:Raises",
        "planted_wrong": "planted:Wrong",
        "planted_sleeper": "planted:Sleeper",
    }
    fake_distribution(site, "planted", entry_points, {"planted": PLANTED})
    return {"PYTHONPATH": str(site)}


@pytest.mark.slow
def test_sweep_survives_raising_wrong_and_hung_contenders(planted_site, tmp_path):
    out = tmp_path / "run"
    impls = "planted_raises,planted_wrong,planted_sleeper,bmm,sdpa_math"
    args = [
        "run",
        "--impl",
        impls,
        "--seq",
        "64",
        "--kv-heads",
        "8",
        "--mask",
        "none",
        "--budget-s",
        "0.05",
        "--timeout-s",
        "10",  # a step of a sound contender (bmm, sdpa_math) took over 4 s on a busy 2-core machine
        "--out",
        str(out),
    ]
    start = time.perf_counter()
    result = run_subprocess(*attnbench_cmd(*args), env=planted_site)
    assert result.returncode == 0, result.stderr
    assert time.perf_counter() - start < 120  # two hung cases cost their timeout, not an hour each
    frame = pd.read_parquet(out / "results.parquet")
    by_impl = frame.groupby("impl")["status"].agg(set)
    assert by_impl["planted_raises"] == {"error"} and by_impl["planted_wrong"] == {"incorrect"}
    assert by_impl["planted_sleeper"] == {"timeout"}
    assert by_impl["bmm"] <= set(CHECKED) and by_impl["sdpa_math"] <= set(CHECKED)
    reasons = frame.set_index("impl")["reason"]
    line = next(n for n, text in enumerate(PLANTED.splitlines(), 1) if '"planted failure"' in text)
    assert (reasons["planted_raises"] == f"RuntimeError: planted failure (raised in run, planted.py:{line})").all()
    assert reasons["planted_sleeper"].str.contains("no result within --timeout-s 10 s").all()
    # an incorrect result never ranks, nor ties (no fastest column where both sound contenders' rows stalled)
    table = result.stdout.split("\n\n")[0].splitlines()
    if table and table[0].rstrip().endswith(" fastest"):
        assert not any("planted_wrong" in row for row in table[1:])
    else:
        assert set(by_impl["bmm"]) | set(by_impl["sdpa_math"]) == {"stalled"}, result.stdout


def _key_set(frame: pd.DataFrame) -> set:
    return {case_key(row["impl"], row) for row in frame.to_dict("records")}


@pytest.mark.slow
def test_interrupt_then_resume_gives_the_full_case_set_once(tmp_path):
    out = tmp_path / "run"
    args = [
        "run",
        "--impl",
        "bmm,einsum,sdpa_math",
        "--seq",
        "128,256,512",
        "--mask",
        "none,causal",
        "--budget-s",
        "0.05",
        "--isolate",
        "none",
        "--out",
        str(out),
    ]
    process = subprocess.Popen(
        attnbench_cmd(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # (SIG_DFL: under a shell's background job SIGINT arrives ignored, and an ignored signal stays ignored)
    rows = out / "rows.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not rows.exists() or len(rows.read_text().splitlines()) < 4):
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert f"attnbench run --resume {out}" in err
    partial = pd.read_parquet(out / "results.parquet")
    plan = json.loads((out / "plan.json").read_text())
    assert 4 <= len(partial) < len(plan)

    resumed = run_subprocess(*attnbench_cmd("run", "--resume", str(out)))
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(partial)} of {len(plan)} cases done" in resumed.stderr
    final = pd.read_parquet(out / "results.parquet")
    assert len(final) == len(plan) and len(_key_set(final)) == len(final)
    assert final.status.isin(CHECKED).all(), final[["status", "reason"]]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["finished"] is True and len(meta["resumed"]) == 1

    fresh = tmp_path / "fresh"
    full_args = [a if a != str(out) else str(fresh) for a in args]
    assert run_subprocess(*attnbench_cmd(*full_args[:-2], "--out", str(fresh))).returncode == 0
    assert _key_set(final) == _key_set(pd.read_parquet(fresh / "results.parquet"))


@pytest.mark.slow
def test_shards_merge_into_exactly_the_unsharded_cases(tmp_path):
    sweep = [
        "--impl",
        "bmm,sdpa_flash,naive,xformers",
        "--seq",
        "32,64",
        "--mask",
        "none,causal",
        "--budget-s",
        "0.02",
        "--isolate",
        "none",
    ]
    assert run_subprocess(*attnbench_cmd("run", *sweep, "--out", str(tmp_path / "all"))).returncode == 0
    shards = []
    for index in (1, 2, 3):
        folder = tmp_path / f"shard{index}"
        result = run_subprocess(*attnbench_cmd("run", *sweep, "--shard", f"{index}/3", "--out", str(folder)))
        assert result.returncode == 0, result.stderr
        shards.append(folder)
    sizes = [len(pd.read_parquet(s / "results.parquet")) for s in shards]
    assert min(sizes) > 0
    merged = tmp_path / "merged"
    result = run_subprocess(*attnbench_cmd("merge", *map(str, shards), "--out", str(merged)))
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(merged / "results.parquet")
    everything = pd.read_parquet(tmp_path / "all" / "results.parquet")
    assert len(frame) == len(everything) == sum(sizes)
    assert _key_set(frame) == _key_set(everything)
    assert set(frame["run"]) == {"shard1", "shard2", "shard3"} and "warning" not in result.stderr
    partial = run_subprocess(*attnbench_cmd("merge", str(shards[0]), str(shards[2]), "--out", str(tmp_path / "p")))
    assert partial.returncode == 0 and "shard(s) 2 of 3 are not among these runs" in partial.stderr, partial.stderr
    repeat = run_subprocess(*attnbench_cmd("merge", str(shards[0]), str(shards[0]), "--out", str(tmp_path / "x")))
    assert repeat.returncode == 2 and "merge shards or machines, not repeats" in repeat.stderr


def test_shards_are_balanced_and_deterministic():
    from attnbench.contenders import registry
    from attnbench.runner._shard import shard_cases, workload_cost
    from attnbench.workload.suite import expand, load_suite

    cases = expand(load_suite("standard"), {}, sorted(registry.load()))
    parts = [shard_cases(cases, i, 4) for i in range(1, 5)]
    assert sorted(str(case) for part in parts for case in part) == sorted(map(str, cases))
    loads = [sum(workload_cost(w) for w in {w for _, w in part}) for part in parts]  # whole workloads per shard
    assert max(loads) <= 1.25 * min(loads)
    assert parts == [shard_cases(cases, i, 4) for i in range(1, 5)]


def test_resume_of_a_folder_that_is_not_a_run(cli, tmp_path):
    code, _, err = cli("run", "--resume", str(tmp_path))
    assert code == 2 and "not an attnbench run folder" in err
    code, _, err = cli("run", "--resume", str(tmp_path), "--seq", "64")
    assert code == 2 and "--resume takes the sweep and its settings from the run folder (meta.json); drop --seq" in err
    # the run's settings go on: one given here would be dropped without a word, so it is refused as the axes are
    code, _, err = cli("run", "--resume", str(tmp_path), "--budget-s", "1", "--threads", "1", "--seed", "3")
    assert code == 2 and err.rstrip().endswith("drop --threads, --budget-s, --seed"), err
    code, _, err = cli("run", "--resume", str(tmp_path / "nope"))
    assert code == 2 and "no such folder" in err, err
    # the default suite's name too: the folder may hold another suite, which --suite quick would not change
    code, _, err = cli("run", "--resume", str(tmp_path), "--suite", "quick")
    assert code == 2 and err.rstrip().endswith("drop --suite"), err


@pytest.mark.parametrize("meta", ["[1, 2]", "{}", '{"settings": 3}'])
def test_resume_of_a_run_whose_meta_is_damaged(cli, tmp_path, meta):
    from attnbench.runner.results import RunWriter
    from attnbench.workload import Workload

    writer = RunWriter(tmp_path / "run")
    writer.start({"settings": {}}, [("bmm", Workload(1, 1, 1, 4, 4, 4))])
    writer.release()  # the run's process is gone
    (tmp_path / "run" / "meta.json").write_text(meta)
    code, out, err = cli("run", "--resume", str(tmp_path / "run"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"--resume {tmp_path / 'run'}: meta.json is damaged" in err
    assert not (tmp_path / "run" / "results.parquet").exists()


def test_resume_of_a_run_whose_settings_lack_what_they_must_hold(cli, tmp_path):
    """Settings without the budgets were a TypeError traceback (RunSettings.__init__ missing arguments)."""
    from attnbench.runner.results import RunWriter
    from attnbench.workload import Workload

    writer = RunWriter(tmp_path / "run")
    writer.start({"settings": {"threads": 1}}, [("bmm", Workload(1, 1, 1, 4, 4, 4))])
    writer.release()  # the run's process is gone
    code, out, err = cli("run", "--resume", str(tmp_path / "run"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "meta.json's run settings are damaged: budget_s, case_budget_s missing" in err


def test_truncated_rows_file_resumes_cleanly(tmp_path):
    from attnbench.runner.results import RunWriter
    from attnbench.workload import Workload

    writer = RunWriter(tmp_path / "run")
    w = Workload(1, 1, 1, 4, 4, 4)
    writer.start({"settings": {}}, [("bmm", w)])
    writer.rows_path.write_text('{"impl": "bmm", "status": "o')  # killed mid-write
    writer.release()  # with its process
    reopened, _, plan = RunWriter.reopen(tmp_path / "run")
    reopened.release()
    assert reopened.rows == [] and plan == [("bmm", w)]
    assert reopened.rows_path.read_text() == ""


def test_worker_reports_how_it_died(tmp_path):
    from attnbench.runner._worker import CaseWorker
    from attnbench.runner.cases import RunOptions
    from attnbench.workload import Workload

    worker = CaseWorker(RunOptions(budget_s=0.02), "system", timeout_s=60)
    try:
        row = worker.run("bmm", Workload(1, 2, 2, 16, 16, 8))
        assert row["status"] in CHECKED
        worker._process.kill()  # simulate a crash between cases
        time.sleep(0.2)
        row = worker.run("bmm", Workload(1, 2, 2, 16, 16, 8))
        assert row["status"] == "error" and "worker process died" in row["reason"]
        assert worker.run("bmm", Workload(1, 2, 2, 16, 16, 8))["status"] in CHECKED  # a fresh worker took over
    finally:
        worker.close()


def test_a_run_folder_another_process_writes_is_not_resumed_beside_it(cli, tmp_path):
    """`--resume` of a run still being written (a job thought dead, a second shell) ran beside it, and rows.jsonl
    ended with 32 rows for a 24-case plan: a run holds its folder's lock while it lives, and a resume or an --out of
    that folder is refused naming the process; once it is gone, the folder resumes."""
    import os

    from attnbench.runner._folder_lock import hold

    tiny = ["--impl", "bmm", "--seq", "64", "--head-dim", "16", "--mask", "none", "--budget-s", "0.02", "--no-memory"]
    out = tmp_path / "run"
    assert cli("run", *tiny, "--out", str(out))[0] == 0
    held = hold(out, "--out")  # as the run's own process holds it while it runs
    try:
        code, _, err = cli("run", "--resume", str(out))
        assert code == 2 and err.strip().endswith(
            f"--resume {out}: another attnbench process (pid {os.getpid()}) is writing this run folder now; wait "
            "for it to end, or stop it and then resume"
        ), err
        code, _, err = cli("run", *tiny, "--out", str(out))
        assert code == 2 and f"another attnbench process (pid {os.getpid()}) is writing a run there now" in err, err
    finally:
        if held is not None:
            os.close(held)
    assert cli("run", "--resume", str(out))[0] == 0


def test_a_filesystem_that_cannot_lock_runs_unlocked(monkeypatch, tmp_path):
    """flock fails with ENOLCK on some network mounts: a run there goes on without the lock, as before the lock,
    instead of being refused as if another process held its folder."""
    import errno

    from attnbench.runner import _folder_lock

    def cannot_lock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_folder_lock.fcntl, "flock", cannot_lock)
    assert _folder_lock.hold(tmp_path, "--out") is None
    assert _folder_lock.writer_pid(tmp_path) is None
