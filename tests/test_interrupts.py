"""Signals during a sweep (issue 25): the first stops after the case in hand, more never lose the results.

Each scenario runs a real ``attnbench run`` in its own process group on a sweep made slow by a planted
contender whose ``prepare`` sleeps ``ATTNBENCH_TEST_PAUSE_S`` seconds, signals it once the first row is on
disk, then checks: results.parquet and results.csv readable, the resume hint on stderr, no "leaked
semaphore" warning, no worker process left, and ``--resume`` (pause 0) completing the plan with no finished
case run twice.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from attnbench.runner.results import case_key

from conftest import REPO, attnbench_cmd, fake_distribution, run_subprocess

PAUSING = """
import os
import time
import torch
from attnbench import Capabilities, Contender

class Pause(Contender):
    name = "planted_pause"
    capabilities = Capabilities(devices=frozenset({"cpu"}))
    def prepare(self, inputs, workload):
        time.sleep(float(os.environ.get("ATTNBENCH_TEST_PAUSE_S", "0")))
        q, k, v, scale = inputs.q, inputs.k, inputs.v, inputs.scale
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
"""
SWEEP = ["--impl", "planted_pause", "--seq", "16,32,48", "--mask", "none", "--budget-s", "0.02", "--no-memory"]
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the worker")


@pytest.fixture(scope="module")
def pausing_site(tmp_path_factory):
    """A distribution with the pausing contender, installed by putting it on PYTHONPATH."""
    site = tmp_path_factory.mktemp("site")
    fake_distribution(site, "planted_pause", {"planted_pause": "planted_pause:Pause"}, {"planted_pause": PAUSING})
    return {**os.environ, "PYTHONPATH": str(site), "ATTNBENCH_TEST_PAUSE_S": "1"}


def workers_of(parent: int) -> set[int]:
    """Live attnbench worker processes started by ``parent`` (their last argument is its pid)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if (
            state != "Z"
            and any(b"attnbench.runner._worker_main" in a for a in argv)
            and argv[-1] == str(parent).encode()
        ):
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _hear_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job of a shell inherits SIGINT ignored


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """The command in a process group of its own (signalled as a terminal or timeout would), hearing SIGINT."""
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_hear_ctrl_c,
    )


def wait_for_first_row(out: Path, run_pid: int) -> set[int]:
    """Block until the run has a finished row; return its worker's pid(s) then."""
    rows, deadline = out / "rows.jsonl", time.time() + 300
    while time.time() < deadline and not (rows.exists() and rows.read_text().strip()):
        time.sleep(0.05)
    assert rows.read_text().strip(), "the run never finished a case"
    workers = workers_of(run_pid)
    assert len(workers) == 1, workers
    return workers


def check_stopped(out: Path, err: str, workers: set[int], env: dict[str, str], results_written: bool = True) -> None:
    """What every interrupted run must leave, then --resume completes it without running a case twice."""
    assert f"attnbench run --resume {out}" in err, err
    assert "leaked semaphore" not in err, err
    deadline = time.time() + 10
    while time.time() < deadline and any(map(alive, workers)):
        time.sleep(0.05)
    assert not any(map(alive, workers)), f"worker {workers} outlived the run"
    assert not list(out.glob(".*.tmp")), "a half-written temporary file was left"
    plan = json.loads((out / "plan.json").read_text())
    done = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert 1 <= len(done) < len(plan)
    if results_written:
        parquet, csv = pd.read_parquet(out / "results.parquet"), pd.read_csv(out / "results.csv")
        assert len(parquet) == len(csv) == len(done)
        # stalled is a finished, checked row too: this test reads /proc every 50 ms, which on 2 cores takes
        # the worker's threads off their cores now and then
        assert parquet.status.isin(["ok", "stalled"]).all()
        assert json.loads((out / "meta.json").read_text())["finished"] is False

    resumed = run_subprocess(*attnbench_cmd("run", "--resume", str(out)), env={**env, "ATTNBENCH_TEST_PAUSE_S": "0"})
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {out}: {len(done)} of {len(plan)} cases done, {len(plan) - len(done)} to run" in resumed.stderr
    assert "leaked semaphore" not in resumed.stderr
    final = pd.read_parquet(out / "results.parquet")
    keys = [case_key(row["impl"], row) for row in final.to_dict("records")]
    assert len(final) == len(plan) == len(set(keys)) and final.status.isin(["ok", "stalled"]).all()
    assert [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()][: len(done)] == done


@LINUX
@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "count"),
    [(signal.SIGTERM, 2), (signal.SIGHUP, 1)],
    ids=["two SIGTERMs to the process group", "SIGHUP"],
)
def test_signals_stop_the_sweep_and_keep_its_results(pausing_site, tmp_path, signum, count):
    out = tmp_path / "run"
    run = start(attnbench_cmd("run", *SWEEP, "--out", str(out)), pausing_site)
    workers = wait_for_first_row(out, run.pid)
    for _ in range(count):
        os.killpg(run.pid, signum)
        time.sleep(0.05)
    text, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    # the count under the table says the run stopped short ("9 cases: 9 ok" read as a whole sweep)
    done, planned = len((out / "rows.jsonl").read_text().splitlines()), len(json.loads((out / "plan.json").read_text()))
    assert f"\n{done} of {planned} cases: " in text, text
    name = signal.Signals(signum).name
    assert err.count(f"attnbench: {name}: stopping after the case in hand") == 1
    # (whether the second SIGTERM cut the case short depends on whether the kernel delivered it before Python
    # ran the first one's handler — two deliveries of one signal can merge; test_signals_are_counted covers it)
    check_stopped(out, err, workers, pausing_site)


@LINUX
@pytest.mark.slow
def test_timeout_leaves_results_and_a_resumable_folder(pausing_site, tmp_path):
    """``timeout`` expiring: it signals the run, then its whole process group (two SIGTERMs). SIGALRM is
    how timeout learns its time is up, so sending it one once the sweep is under way takes that very path
    (exit 124) without guessing how long this machine needs to start a run."""
    out = tmp_path / "run"
    run = start(["timeout", "600", *attnbench_cmd("run", *SWEEP, "--out", str(out))], pausing_site)
    deadline = time.time() + 60
    while time.time() < deadline and not (children := _children(run.pid)):
        time.sleep(0.05)
    (attnbench,) = children
    workers = wait_for_first_row(out, attnbench)
    os.kill(run.pid, signal.SIGALRM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 124, err
    assert "attnbench: SIGTERM: stopping after the case in hand" in err
    check_stopped(out, err, workers, pausing_site)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@LINUX
@pytest.mark.slow
def test_a_third_signal_exits_at_once_and_resume_continues(pausing_site, tmp_path):
    out = tmp_path / "run"
    run = start(attnbench_cmd("run", *SWEEP, "--out", str(out)), pausing_site)
    workers = wait_for_first_row(out, run.pid)
    for _ in range(3):
        os.killpg(run.pid, signal.SIGINT)
        time.sleep(0.05)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err
    assert (
        f"attnbench: SIGINT: exiting at once; every finished row is kept in {out / 'rows.jsonl'}; "
        f"continue with: attnbench run --resume {out}"
    ) in err
    if (out / "results.parquet").exists():  # exiting at once writes none, or a whole one
        assert len(pd.read_parquet(out / "results.parquet")) >= 1
    if (out / "results.csv").exists():
        assert len(pd.read_csv(out / "results.csv")) >= 1
    check_stopped(out, err, workers, pausing_site, results_written=False)


@LINUX
@pytest.mark.slow
def test_the_worker_dies_with_a_killed_run(pausing_site, tmp_path):
    """SIGKILL leaves the run no chance to stop its worker: the kernel does it (PR_SET_PDEATHSIG)."""
    out = tmp_path / "run"
    run = start(attnbench_cmd("run", *SWEEP, "--out", str(out)), pausing_site)
    (worker,) = wait_for_first_row(out, run.pid)
    run.kill()
    run.communicate(timeout=60)
    deadline = time.time() + 10
    while time.time() < deadline and alive(worker):
        time.sleep(0.05)
    assert not alive(worker), "the worker outlived its killed parent"


@pytest.fixture
def signals_not_ignored():
    """SIGINT, SIGTERM and SIGHUP at their defaults for the test: a background job of a non-interactive shell
    starts with SIGINT ignored, and StopSignals rightly leaves an ignored signal ignored."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_signals_are_counted_and_the_handlers_restored(tmp_path, signals_not_ignored):
    from attnbench.runner._interrupts import StopSignals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    exits = []
    with StopSignals(tmp_path, lambda: exits.append("at exit")) as stop:
        assert not stop.requested
        signal.raise_signal(signal.SIGTERM)  # first: a request, no exception
        assert stop.requested and stop.count == 1
        signal.raise_signal(signal.SIGINT)  # second, outside a case: ignored
        assert stop.count == 2
        with pytest.raises(KeyboardInterrupt), stop.case():
            stop.count = 1  # as if this were the second signal, inside a case: cuts it short
            signal.raise_signal(signal.SIGHUP)
    assert exits == []
    assert {s: signal.getsignal(s) for s in before} == before


def test_an_ignored_signal_stays_ignored(tmp_path):
    """Under nohup SIGHUP is ignored before the run starts; the run must not start listening to it."""
    from attnbench.runner._interrupts import StopSignals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals(tmp_path, lambda: None) as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
            assert not stop.requested
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_outside_a_sweep_sigterm_and_sighup_are_ctrl_c_and_an_ignored_one_stays_ignored(signals_not_ignored):
    """ab, profile and the reports keep what Ctrl-C keeps when `timeout` or SLURM stops them: inside
    termination_as_interrupt SIGTERM and SIGHUP raise KeyboardInterrupt; nohup's SIGHUP stays ignored; the
    handlers are restored."""
    from attnbench.runner._interrupts import termination_as_interrupt

    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with termination_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.raise_signal(signal.SIGHUP)  # ignored: nothing raised
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    with termination_as_interrupt(), pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGHUP)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL


def test_a_write_cut_short_leaves_the_old_file_whole(tmp_path):
    from attnbench.runner.results import replacing, write_text

    path = tmp_path / "meta.json"
    write_text(path, '{"finished": false}\n')
    with pytest.raises(KeyboardInterrupt), replacing(path) as tmp:
        tmp.write_text('{"finish')  # a signal lands mid-write
        raise KeyboardInterrupt
    assert path.read_text() == '{"finished": false}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]


def test_import_attnbench_imports_neither_torch_nor_pandas():
    """The package's names are lazy, so the command can import its heavy modules where a Ctrl-C is caught."""
    code = "import sys, attnbench; print(sorted({'torch', 'pandas'} & set(sys.modules)), attnbench.Workload.__name__)"
    result = run_subprocess(sys.executable, "-c", code)
    assert result.returncode == 0 and result.stdout.split() == ["[]", "Workload"], result.stdout + result.stderr


def test_a_ctrl_c_while_the_command_imports_is_one_line_and_130(monkeypatch, capsys):
    """A Ctrl-C in the second the command takes to import torch and pandas printed Python's traceback of the
    import; the command's entry point says it in one line, exit 130. The wiring: the `attnbench` script calls it."""
    import importlib.abc

    from attnbench.__main__ import entry
    from attnbench.workload.suite import tomllib  # the standard library's, or tomli before Python 3.11

    class Interrupting(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "attnbench.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "attnbench.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert entry() == 130
    assert capsys.readouterr().err == "attnbench: interrupted while starting; nothing was written\n"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"attnbench": "attnbench.__main__:entry"}
