"""`attnbench.run()`: a sweep from Python with the CLI's axes, validation and messages; the results frame
back; a run folder only when `out` is given; contenders registered in-process run in the worker when their
class can be imported by reference (issue 12 item 7)."""

import json
import re
import tempfile
import time

import numpy as np
import pandas as pd
import pytest
import torch

import attnbench
from attnbench.runner._noise import result_warnings
from attnbench.runner.results import COLUMNS

from conftest import CHECKED, REPO

FAST = {"budget_s": 0.02, "memory": False}


class WorkerSdpa(attnbench.Contender):
    """Registered in-process by a test; importable as test_api:WorkerSdpa, so the worker can load it."""

    name = "planted_worker_sdpa"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

    def prepare(self, inputs, workload):
        q, k, v = inputs.q, inputs.k, inputs.v
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A private temporary folder and working directory, to see that nothing is left behind."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return temp, work


def _ours(folder):
    """What attnbench left in a temporary folder (torch keeps its own caches there, e.g. torchinductor_*)."""
    return [p.name for p in folder.iterdir() if not p.name.startswith("torchinductor")]


def test_readme_example_returns_the_results_frame_and_writes_nothing(scratch, capsys):
    """The README's notebook example, run as written: attnbench.run(impl=["bmm", "sdpa_flash"], seq=[256, 512])."""
    readme = (REPO / "README.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL) if "attnbench.run(" in b]
    assert len(example.strip().splitlines()) <= 5 and 'impl=["bmm", "sdpa_flash"], seq=[256, 512]' in example
    # the table it pivots holds ok rows only: a stalled row's time (29.8 ms beside 0.97 ms once) never ranks
    assert 'frame[frame.status == "ok"].pivot_table(' in example
    namespace: dict = {}
    exec(example, namespace)
    frame = namespace["frame"]
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == COLUMNS
    assert sorted(zip(frame.impl, frame.seq_q, strict=True)) == [
        ("bmm", 256),
        ("bmm", 512),
        ("sdpa_flash", 256),
        ("sdpa_flash", 512),
    ]
    assert set(frame.status) <= set(CHECKED) and (frame.median_ms > 0).all()
    assert (frame.batch == 1).all() and (frame.heads == 8).all() and (frame.head_dim == 64).all()
    printed = capsys.readouterr().out
    assert "sdpa_flash" in printed and "median_ms" in printed
    temp, work = scratch
    assert _ours(temp) == [] and list(work.iterdir()) == []


def test_out_writes_the_run_folder(tmp_path):
    out = tmp_path / "run"
    frame = attnbench.run("quick", impl="bmm", seq=128, mask="none", out=out, isolate="none", **FAST)
    saved = pd.read_parquet(out / "results.parquet")
    assert len(frame) == len(saved) == 2  # quick's two sweeps at seq 128
    assert list(saved.impl) == list(frame.impl) and (out / "meta.json").exists()
    assert "attnbench.run(suite='quick', impl='bmm'" in (out / "meta.json").read_text()


def test_numpy_values_and_ranges_are_the_numbers_they_hold(tmp_path):
    """A notebook's `seq=np.arange(…)` or `range(…)` was refused ("expected positive integers"), and
    `threads=np.int64(1)` passed the checks, then failed with a TypeError after the first case, leaving half a run
    folder (meta.json, plan.json, rows.jsonl)."""
    frame = attnbench.run(
        impl="bmm",
        seq=np.arange(64, 129, 64),
        kv_heads=range(8, 9),
        threads=np.int64(1),
        budget_s=np.float64(0.02),
        memory=np.bool_(False),
        isolate="none",
        out=tmp_path / "run",
        progress="off",
    )
    assert sorted(frame.seq_q) == [64, 128] and (frame.kv_heads == 8).all() and (frame.threads == 1).all()
    assert set(frame.status) <= set(CHECKED) and (tmp_path / "run" / "results.parquet").exists()
    assert "kv_heads=[8], seq=[64, 128], threads=1, budget_s=0.02" in (tmp_path / "run" / "meta.json").read_text()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"seq_q": 256}, "'seq_q': the results column seq_q is set by seq= (e.g. seq=[256, 512])"),
        ({"seq_k": 256}, "'seq_k': the results column seq_k is set by seq_kv="),
        ({"budget": 1}, "'budget'; did you mean budget_s=?"),
        ({"pass": "bwd"}, "'pass'; did you mean pass_=?"),
        ({"colour": 1}, "'colour'; the axes: impl, batch, heads"),
    ],
)
def test_an_unknown_keyword_says_what_was_meant(kwargs, says):
    """The frame's columns are seq_q and seq_k; a notebook that set them got a bare "unexpected keyword"."""
    with pytest.raises(TypeError) as caught:
        attnbench.run(**kwargs)
    assert str(caught.value).startswith(f"run() got an unexpected keyword argument {says}")


BAD = [
    ({"seq": [256, -1]}, ["--seq", "256,-1"]),
    ({"seq": "x"}, ["--seq", "x"]),
    ({"impl": "nosuch"}, ["--impl", "nosuch"]),
    ({"dtype": ["float31"]}, ["--dtype", "float31"]),
    ({"device": "tpu"}, ["--device", "tpu"]),
    ({"mask": "diagonal"}, ["--mask", "diagonal"]),
    ({"threads": 0}, ["--threads", "0"]),
    ({"budget_s": -1}, ["--budget-s", "-1"]),
    ({"isolate": "maybe"}, ["--isolate", "maybe"]),
    ({"suite": "nosuch"}, ["--suite", "nosuch"]),
]


@pytest.mark.parametrize(("kwargs", "flags"), BAD, ids=[f[0] for _, f in BAD])
def test_bad_values_raise_the_cli_message(cli, scratch, kwargs, flags):
    code, _, err = cli("run", *[f"{f}={v}" for f, v in zip(flags[::2], flags[1::2], strict=True)], "--out", "x")
    assert code == 2
    with pytest.raises(attnbench.UsageError) as caught:
        attnbench.run(**kwargs)
    assert err.strip() == f"attnbench: error: {caught.value}"
    temp, work = scratch
    assert _ours(temp) == [] and list(work.iterdir()) == []


class SlowCall(WorkerSdpa):
    """A call of 60 ms (asleep, so no core is taken from the machine): a 0.02 s budget gets fewer than 5 samples."""

    name = "planted_slow_call"

    def prepare(self, inputs, workload):
        attention = super().prepare(inputs, workload)
        return lambda: time.sleep(0.06) or attention()


def test_the_results_warnings_are_said_and_saved_as_the_command_does(planted, tmp_path, capsys):
    """A notebook saw the run's early warnings but not what its results raise (stalled, unstable, too few samples),
    and the run folder's meta.json, which the report shows, lacked them: `attnbench run` says and saves both."""
    attnbench.register(SlowCall)
    planted.append(SlowCall.name)
    frame = attnbench.run(impl=SlowCall.name, seq=64, isolate="none", out=tmp_path / "run", progress="off", **FAST)
    late = result_warnings(frame)
    assert late, list(frame.reason)  # too few samples (or, on a busy machine, stalled)
    said = capsys.readouterr().err.splitlines()
    assert all(f"warning: {warning}" in said for warning in late), said
    saved = json.loads((tmp_path / "run" / "meta.json").read_text())["warnings"]
    assert set(late) <= set(saved)


def test_a_registered_importable_contender_runs_in_the_worker(planted):
    attnbench.register(WorkerSdpa)
    planted.append(WorkerSdpa.name)
    frame = attnbench.run(impl=[WorkerSdpa.name, "bmm"], seq=64, isolate="worker", **FAST)
    assert frame.status.isin(CHECKED).all() and len(frame) == 2, list(frame.reason)


def test_a_notebook_class_needs_isolate_none(planted):
    class Local(WorkerSdpa):
        name = "planted_local_sdpa"

    attnbench.register(Local)
    planted.append(Local.name)
    with pytest.raises(attnbench.UsageError, match=r"defined inside a function.*isolate=\"none\""):
        attnbench.run(impl=Local.name, seq=64, **FAST)
    frame = attnbench.run(impl=Local.name, seq=64, isolate="none", **FAST)
    assert list(frame.status) in (["ok"], ["stalled"])
