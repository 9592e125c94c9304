"""Warnings about other work count only work outside attnbench's own tree, and name it (issue 19, item 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from attnbench.measure import _other_work as other_work
from attnbench.measure._other_work import OtherWork, Process, own_pids
from attnbench.runner._noise import environment_warnings

SPIN = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _ticks(pid: int) -> int:
    return other_work.processes()[pid].ticks


def _wait_until_spinning(pid: int) -> None:
    first = _ticks(pid)
    deadline = time.time() + 20
    while _ticks(pid) == first and time.time() < deadline:
        time.sleep(0.05)


@pytest.fixture
def own_hog() -> Iterator[subprocess.Popen[bytes]]:
    """A spinning child of this process, in a session of its own: still attnbench's (a descendant)."""
    hog = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    _wait_until_spinning(hog.pid)
    yield hog
    hog.kill()
    hog.wait()


@pytest.fixture
def orphan_hog() -> Iterator[int]:
    """A spinning process outside this process's tree: started by a shell that exits at once, so it is
    re-parented (to init or a subreaper), as another user's job would be."""
    shell = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "{SPIN}" >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(shell.stdout)
    _wait_until_spinning(pid)
    yield pid
    os.kill(pid, 9)


def _table(*rows: tuple[int, int, int]) -> dict[int, Process]:
    return {pid: Process(pid, f"p{pid}", ppid, session, 0) for pid, ppid, session in rows}


def test_own_tree_is_roots_descendants_and_the_parent_chain_within_the_session():
    table = _table(
        (1, 0, 0),  # init
        (10, 1, 10),  # sshd, outside the session
        (20, 10, 20),  # the user's shell: session leader
        (30, 20, 20),  # nox / the calibrate driver
        (31, 20, 20),  # another job of the same shell: not ours
        (40, 30, 20),  # attnbench run: the root
        (41, 40, 20),  # its worker
        (42, 41, 99),  # the worker's compiler, in a session of its own: still a descendant
        (50, 30, 20),  # the driver's earlier run, still exiting: not in this run's tree (not an ancestor)
    )
    assert own_pids(table, [40]) == {40, 41, 42, 30, 20}
    assert own_pids(table, [41]) == {41, 42, 40, 30, 20}
    assert own_pids(table, [42]) == {42}  # its session starts with it
    assert own_pids(table, [12345]) == set()  # a root that has ended


def test_warning_names_the_busy_processes_with_their_share_or_says_nothing():
    quiet = OtherWork(0.25, 2, 0.1, [(7, "sshd", 0.05)])
    assert quiet.warning() is None
    busy = OtherWork(0.25, 2, 1.7, [(1234, "python3", 0.85), (99, "cc1plus", 0.6), (5, "a", 0.3), (6, "b", 0.21)])
    assert busy.warning() == (
        "other work used 1.7 of 2 cores over 0.25 s before the run: process 1234 (python3) used 85% of a core, "
        "process 99 (cc1plus) used 60% of a core, process 5 (a) used 30% of a core, and 1 more over 20%"
    )
    spread = OtherWork(0.25, 2, 0.8, [(5, "a", 0.1)])
    assert spread.warning() == (
        "other work used 0.8 of 2 cores over 0.25 s before the run, no process over 20% of a core "
        "(short-lived or many small ones)"
    )


def test_a_busy_process_outside_the_tree_is_named(orphan_hog):
    seen = other_work.measure(window_s=0.5)
    assert seen is not None
    share = {pid: s for pid, _, s in seen.busy}
    assert share.get(orphan_hog, 0) > 0, seen
    hog_only = OtherWork(seen.window_s, seen.cores, seen.cores_used, [b for b in seen.busy if b[0] == orphan_hog])
    named = hog_only.warning(min_share=0.01)  # other agents' work may crowd it out of the top three, or below 20 %
    # the interpreter's name as the kernel has it: python, python3 or python3.11, as pytest was started
    assert named is not None and re.search(rf"process {orphan_hog} \(python[\d.]*\) used ", named), named
    assert seen.cores_used >= share[orphan_hog]


def test_attnbench_own_busy_child_is_not_blamed(own_hog):
    seen = other_work.measure(window_s=0.5)
    assert seen is not None and own_hog.pid not in {pid for pid, _, _ in seen.busy}
    assert not any(f"process {own_hog.pid} " in w for w in environment_warnings())


def test_explicit_roots_decide_what_is_own(own_hog):
    """Rooted at another child of this process, the hog is outside the tree, so it is named."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen = other_work.measure(window_s=0.5, roots=[sleeper.pid])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert seen is not None and own_hog.pid in {pid for pid, _, _ in seen.busy}
    assert os.getpid() not in {pid for pid, _, _ in seen.busy}  # the sleeper's parent: its command


def test_the_driver_that_started_the_run_is_not_blamed():
    """A driver (calibrate, nox) busy in a thread while its child measures: the child's parent chain is its own."""
    load = f"spec = importlib.util.spec_from_file_location('w', {other_work.__file__!r})"  # stdlib only: no torch
    child = (
        f"import importlib.util, json, os, sys; {load}; w = importlib.util.module_from_spec(spec); "
        "sys.modules['w'] = w; spec.loader.exec_module(w); seen = w.measure(0.5); "
        "print(json.dumps({'ppid': os.getppid(), 'busy': [pid for pid, _, _ in seen.busy]}))"
    )
    driver = textwrap.dedent(f"""
        import subprocess, sys, threading, time
        def spin():
            end = time.time() + 30
            while time.time() < end:
                pass
        threading.Thread(target=spin, daemon=True).start()
        print(subprocess.run([sys.executable, "-c", {child!r}], capture_output=True, text=True).stdout)
    """)
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120)
    found = json.loads(done.stdout)
    assert found["ppid"] not in found["busy"], found
