"""Shared helpers: run the CLI in-process or as a real subprocess, and plant contenders."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import attnbench
from attnbench.cli import main
from attnbench.contenders import registry

REPO = Path(__file__).resolve().parent.parent
# A real contender's row passed the correctness gate with either status: `stalled` is a row timed while this
# shared VM stalled (its time kept, not ranked). A test of anything but stall detection accepts both.
CHECKED = ("ok", "stalled")


def stalled_as_ok(run: Path) -> None:
    """A run's `stalled` rows rewritten as `ok`: for a test of what reads a run's rows (a report's filters, ratios'
    pairing), not of its timing — on a busy CI machine a few rows stall, and the reader would have fewer to read."""
    import pandas as pd

    from attnbench.runner.results import write_frame

    frame = pd.read_parquet(run / "results.parquet")
    stalled = frame["status"] == "stalled"
    frame.loc[stalled, ["status", "reason"]] = ["ok", ""]
    write_frame(frame, run)


os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager reach for the network
# fused_triton's tuner compiles its candidates in threads first (impls/fused_triton/precompile.py); the tests that
# tune replace the kernels and the timing with fakes, so none: tests/test_fused_triton_precompile.py checks it.
os.environ.setdefault("ATTNBENCH_COMPILE_THREADS", "0")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
NEEDS_CHROMIUM = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)


def headless_chromium(tmp_path_factory: pytest.TempPathFactory, height: int) -> Iterator[object]:
    """Headless Chromium driven by Selenium through Debian's chromedriver, its browser log kept; for a
    module-scoped fixture (``yield from``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        f"--window-size=1400,{height}",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


# The fixture name of a module's Triton-interpreter cases, run by run_cases_split in a process per core.
SPLIT_FIXTURE = "interpreted"


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` selection reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use a module's interpreter cases (SPLIT_FIXTURE) are ``serial``: they keep every core busy, so
    `nox -s tests` runs them after the tests that share the cores. Tests marked ``cuda`` skip, saying why, where
    torch sees no CUDA device (`pytest -m cuda` on a GPU)."""
    for item in items:
        if SPLIT_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.serial)
    if torch.cuda.is_available():
        for item in items:  # on a GPU they time the device: `nox -s tests` runs them alone, not beside a worker
            if item.get_closest_marker("cuda") is not None:
                item.add_marker(pytest.mark.serial)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False): run `pytest -m cuda` on one")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    # One ceilings cache for the whole session (and its subprocesses), not the user's.
    os.environ.pop("ATTNBENCH_TUNING_DIR", None)  # tests point the tiles elsewhere through ATTNBENCH_CACHE_DIR
    if "ATTNBENCH_CACHE_DIR" not in os.environ:
        os.environ["ATTNBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnbench-test-cache-")
    # The bandwidth measured before and after each run (1–4 s each, by the size of the last-level cache) is
    # left out of the many tiny test runs; tests/test_bandwidth_watch.py turns it on.
    os.environ.setdefault("ATTNBENCH_BANDWIDTH_WATCH", "off")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `attnbench ARGS` in this process; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def fake_distribution(site: Path, name: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """Install a minimal distribution by hand: a dist-info with entry points, plus module files."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "\n".join(f"{key} = {value}" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[attnbench.impls]\n{lines}\n")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


def v1_store(
    path: Path, series: dict[str, list[float]], machine: str, seq: tuple[int, int] = (256, 256), iqr_share: float = 0.01
) -> None:
    """A results store as schema version 1 wrote it (fewer run and result columns; opened read-only it is
    migrated in memory): run n on day n + 1 at commit n (40 hex digits), one row per contender of ``series``
    with its n-th median, IQR ``iqr_share`` of it."""
    import duckdb

    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute(
        "CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, path VARCHAR, machine VARCHAR, git_commit VARCHAR,"
        " started_at TIMESTAMP, suite VARCHAR, command VARCHAR)"
    )
    con.execute(
        "CREATE TABLE rows (run_id VARCHAR NOT NULL, impl VARCHAR, device VARCHAR, dtype VARCHAR,"
        " batch BIGINT, heads BIGINT, kv_heads BIGINT, seq_q BIGINT, seq_k BIGINT, head_dim BIGINT,"
        " mask VARCHAR, pass VARCHAR, machine VARCHAR, status VARCHAR, median_ms DOUBLE,"
        " iqr_ms DOUBLE)"
    )
    for n in range(max(len(medians) for medians in series.values())):
        run = f"run{n}"
        con.execute(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, 'quick', 'attnbench run')",
            [run, f"/runs/{run}", machine, f"{n:040x}", f"2026-01-{n + 1:02d} 12:00:00"],
        )
        for impl, medians in series.items():
            con.execute(
                "INSERT INTO rows VALUES (?, ?, 'cpu', 'float32', 1, 8, 8, ?, ?, 64, 'none', 'fwd', ?, 'ok', ?, ?)",
                [run, impl, *seq, machine, medians[n], medians[n] * iqr_share],
            )
    con.close()


def run_subprocess(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run a command with this interpreter's environment (plus ``env``), capturing text output. pytest-xdist's
    variables stay behind: a pytest started here is not a worker (pytest-benchmark would turn itself off)."""
    own = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST_")}
    full_env = {**own, **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=600)


def _interpreter_cost(spec: dict[str, Any]) -> float:
    """A case's rough cost in Triton's interpreter: a backward is two or three more kernels than the forward."""
    return 3.0 if spec.get("pass_", "fwd") != "fwd" else 1.0


def run_cases_split(script: str, cases: dict[str, Any], env: dict[str, str], tail: str) -> dict[str, Any]:
    """Run ``script`` (python -c: the cases as JSON in argv[1]; with argv[2] "tail", its one-off checks after
    them; prints one JSON object of results last) on the cases in one process per core, at once, and merge the
    results. Triton's interpreter runs one Python thread, so the test waiting on it alone would leave the other
    core idle; torch keeps to one thread in each."""
    parts = max(1, min(os.cpu_count() or 1, 4, len(cases)))
    shares: list[list[str]] = [[] for _ in range(parts)]
    load = [2.0] + [0.0] * (parts - 1)  # the tail runs in the first process
    for name in sorted(cases, key=lambda name: -_interpreter_cost(cases[name])):  # largest first, to the lightest
        lightest = load.index(min(load))
        shares[lightest].append(name)
        load[lightest] += _interpreter_cost(cases[name])
    full_env = {**os.environ, **env, "OMP_NUM_THREADS": "1"}
    merged: dict[str, Any] = {}
    with contextlib.ExitStack() as files:  # output to files, so that no process waits on a full pipe
        runs = []
        for part in range(parts):
            share = json.dumps({name: cases[name] for name in shares[part]})
            args = [sys.executable, "-c", script, share, *([tail] if part == 0 else [])]
            out, err = (files.enter_context(tempfile.TemporaryFile("w+")) for _ in range(2))
            runs.append((subprocess.Popen(args, stdout=out, stderr=err, text=True, env=full_env), out, err))
        for proc, out, err in runs:
            proc.wait(timeout=600)
            out.seek(0), err.seek(0)
            assert proc.returncode == 0, err.read()[-3000:]
            merged.update(json.loads(out.read().strip().splitlines()[-1]))
    return merged


def attnbench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnbench", *args]


@pytest.fixture
def planted() -> Iterator[list[str]]:
    """Contenders registered in-process during a test are removed afterwards (append their names)."""
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


class Shifted(attnbench.Contender):
    """A deliberately wrong contender: SDPA math with scores divided by D instead of √D (the seeds' bug)."""

    name = "planted_wrong_scale"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

    def prepare(self, inputs, workload):
        q, k, v = inputs.q, inputs.k, inputs.v
        return lambda: torch.softmax(q @ k.transpose(-1, -2) / workload.head_dim, dim=-1) @ v


class Raising(attnbench.Contender):
    name = "planted_raises"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

    def prepare(self, inputs, workload):
        def run():
            raise RuntimeError("planted failure\nsecond line")

        return run


def plant_raising(planted: list[str], name: str) -> str:
    """Register a CPU float32 contender named ``name`` whose every call raises RuntimeError("boom in my kernel");
    ``planted`` (the fixture) takes it back after the test. Returns the name."""

    class Raising(attnbench.Contender):
        capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}))

        def prepare(self, inputs, workload):
            def run():
                raise RuntimeError("boom in my kernel")

            return run

    Raising.name = name
    attnbench.register(Raising())
    planted.append(name)
    return name


# where an error row of plant_raising's contender says it raised: its line of this file (errors.raised_in)
BOOM_AT = " (raised in run, conftest.py:{})".format(
    next(
        n
        for n, line in enumerate(Path(__file__).read_text().splitlines(), 1)
        if 'raise RuntimeError("boom in my kernel")' in line
    )
)
