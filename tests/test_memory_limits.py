"""Decode that outgrows memory: the free memory a case is priced against, the skip with its figures, an
allocation that fails under a memory cap (``oom``, the sweep goes on), and a worker the OOM killer ends."""

import json
import resource
import signal
import subprocess
import sys

import pandas as pd
import pytest

from attnbench.measure import _memory as memory
from attnbench.runner._predict import Prediction, skip_reason
from attnbench.runner._worker import death_status

from conftest import CHECKED, attnbench_cmd, fake_distribution

GIB = 2**30

HOG = """
import torch
from attnbench import Capabilities, Contender

class Hog(Contender):
    name = "planted_hog"
    description = "allocates 3 GiB in its call while its memory model says a few bytes"
    capabilities = Capabilities(devices=frozenset({"cpu"}))
    def prepare(self, inputs, workload):
        return lambda: torch.ones(3 * 2**30, dtype=torch.uint8)
"""


@pytest.fixture(scope="module")
def hog_site(tmp_path_factory):
    """A contender whose memory model under-predicts, installed by putting it on PYTHONPATH."""
    site = tmp_path_factory.mktemp("site")
    fake_distribution(site, "hog", {"planted_hog": "hog:Hog"}, {"hog": HOG})
    return {"PYTHONPATH": str(site)}


CAP_BYTES = int(2.5 * GIB)  # address space for each process: torch maps about 1 GiB, so ~1.4 GiB is left


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))


def test_decode_over_a_memory_cap_is_skipped_or_oom_and_the_sweep_goes_on(hog_site, tmp_path):
    """Under RLIMIT_AS, a decode case of 4 GiB of KV cache is skipped with its figures; a contender whose
    call allocates past the cap gives an oom row; the small case after them is ok in the same sweep."""
    out = tmp_path / "run"
    args = [
        "run",
        "--impl",
        "planted_hog,bmm",
        "--seq",
        "1",
        "--seq-kv",
        "65536,256",
        "--batch",
        "16",
        "--heads",
        "8",
        "--kv-heads",
        "8",
        "--head-dim",
        "64",
        "--mask",
        "none",
        "--budget-s",
        "0.02",
        "--out",
        str(out),
    ]
    env = {**__import__("os").environ, **hog_site}
    result = subprocess.run(attnbench_cmd(*args), capture_output=True, text=True, env=env, preexec_fn=_capped)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = pd.read_parquet(out / "results.parquet").set_index(["impl", "seq_k"])
    big = rows.loc[("bmm", 65536)]
    assert big["status"] == "skipped"
    figures = big["reason"]
    assert "predicted 4." in figures and "GiB free" in figures, figures
    free = float(figures.split("of the ")[1].split(" GiB free")[0])
    assert 0 < free < CAP_BYTES / GIB  # the cap, not the machine's MemAvailable
    assert rows.loc[("planted_hog", 65536), "status"] == "skipped"
    hog = rows.loc[("planted_hog", 256)]
    assert hog["status"] == "oom" and "can't allocate memory" in hog["reason"], hog["reason"]
    assert rows.loc[("bmm", 256), "status"] in CHECKED


def test_skip_reason_gives_predicted_and_free_gib():
    prediction = Prediction(0.001, extra_bytes=1 * GIB, total_bytes=9 * GIB, check_bytes=0.5 * GIB)
    reason = skip_reason(prediction, case_budget_s=60, free_bytes=10 * GIB)
    assert reason == (
        "predicted 9 GiB (inputs, their making and output 7.50 GiB, working memory 1.00 GiB, check 0.50 GiB) "
        "exceeds 70% of the 10 GiB free"
    )


def test_free_memory_is_the_least_of_meminfo_cgroup_and_address_space(tmp_path, monkeypatch):
    (tmp_path / "memory.max").write_text(f"{4 * GIB}\n")
    (tmp_path / "memory.current").write_text(f"{3 * GIB}\n")
    (tmp_path / "memory.stat").write_text(f"anon 1\ninactive_file {GIB // 2}\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    monkeypatch.setattr(memory, "CGROUP_V2", tmp_path)
    monkeypatch.setattr(memory, "CGROUP_V1", tmp_path / "absent")
    assert memory._cgroup_room() == GIB + GIB // 2  # the limit less the usage, reclaimable cache counted as room
    assert memory.oom_kills() == 2
    assert memory.free_memory_bytes("cpu") <= 1.5 * GIB
    mapped = memory._status_bytes("VmSize")
    assert mapped is not None
    monkeypatch.setattr(memory.resource, "getrlimit", lambda _which: (mapped + GIB // 4, mapped + GIB // 4))
    assert GIB // 4 - 2**26 < memory.free_memory_bytes("cpu") <= GIB // 4


def test_unlimited_cgroup_and_no_oom_counter(tmp_path, monkeypatch):
    (tmp_path / "memory.max").write_text("max\n")
    monkeypatch.setattr(memory, "CGROUP_V2", tmp_path)
    monkeypatch.setattr(memory, "CGROUP_V1", tmp_path / "absent")
    assert memory._cgroup_room() is None
    assert memory.oom_kills() is None


def test_a_worker_the_oom_killer_ended_gives_an_oom_row():
    sigkill = -int(signal.SIGKILL)
    status, reason = death_status(sigkill, oom_killed=True)
    assert status == "oom"
    assert reason == (
        "the kernel's OOM killer ended the worker process during the case (signal 9 (SIGKILL); cgroup oom_kill rose)"
    )
    assert death_status(sigkill, oom_killed=False) == (
        "error",
        "the worker process died during the case (signal 9 (SIGKILL))",
    )
    status, reason = death_status(sigkill, oom_killed=None)
    assert status == "error" and "no cgroup oom_kill count could be read" in reason
    assert death_status(-int(signal.SIGSEGV), oom_killed=True)[0] == "error"  # a crash is not the OOM killer


RELEASE = """
import json, torch
from attnbench.contenders import registry
from attnbench.measure.allocator import configure_cpu_allocator
from attnbench.runner.cases import RunOptions, run_group
from attnbench.workload import Workload

def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key + ":")).split()[1]) * 1024

def rss():
    return status("VmRSS")

configure_cpu_allocator("cached")
registry.load()
small = Workload(1, 4, 4, 1, 64, 64, mask="none")
run_group(["bmm", "sdpa_math"], small, RunOptions(budget_s=0.01))  # code loaded on first use, in the baseline
before = rss()
run_group(["bmm", "sdpa_math"], Workload(2, 8, 8, 1, 65536, 64, mask="none"), RunOptions(budget_s=0.01))
used = status("VmHWM") - before
run_group(["bmm"], small, RunOptions(budget_s=0.01))
print(json.dumps({"used": used, "after_next": rss() - before}))
"""


def test_the_next_workload_starts_without_the_last_ones_memory():
    """A worker that ran a 0.5 GiB decode group holds nothing of it once the next group starts, so the
    free memory that group reads is a fresh worker's."""
    result = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["used"] > 2**29 and figures["after_next"] < 64 * 2**20, figures
