"""The noxfile's own logic, without running nox: the user's plugins reach every session that runs attnbench,
torch is pinned before anything else, `nox -s dev` makes one durable .venv/ (issue 24)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from conftest import REPO, SPLIT_FIXTURE, attnbench_cmd, run_subprocess


def _load_noxfile():
    spec = importlib.util.spec_from_file_location("attnbench_noxfile", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


noxfile = _load_noxfile()


class FakeSession:
    """What a session body calls, recorded: pip installs, commands, log lines."""

    def __init__(self, tmp: Path, posargs: tuple[str, ...] = ()) -> None:
        self.tmp, self.posargs = tmp, list(posargs)
        self.installs: list[tuple[str, ...]] = []
        self.runs: list[tuple[str, ...]] = []
        self.envs: list[dict[str, str] | None] = []
        self.logs: list[str] = []

    def create_tmp(self) -> str:
        self.tmp.mkdir(parents=True, exist_ok=True)
        return str(self.tmp)

    def install(self, *args: str) -> None:
        self.installs.append(args)

    def run(self, *args: str, env: dict[str, str] | None = None, **_: object) -> str:
        self.runs.append(args)
        self.envs.append(env)
        return ""

    def log(self, message: str) -> None:
        self.logs.append(message)


@pytest.fixture
def plugins(monkeypatch, tmp_path):
    """ATTNBENCH_PLUGINS and a plugins.txt in a stand-in repository root."""
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    monkeypatch.setenv("ATTNBENCH_PLUGINS", "mypkg '/path/with space/pkg'")
    (tmp_path / "plugins.txt").write_text("# my contenders\n\nother-pkg>=1.2  # pinned\n-e ../editable-pkg\n")
    return ["mypkg", "/path/with space/pkg", "other-pkg>=1.2", "-e", "../editable-pkg"]


def test_plugin_requirements_come_from_the_variable_then_the_file(tmp_path):
    listed = tmp_path / "plugins.txt"
    listed.write_text("# comment\n  git+https://example.org/pkg.git  \n\n--editable ./local # mine\nplain\n")
    found = noxfile.plugin_requirements({"ATTNBENCH_PLUGINS": " a  'b c' "}, listed)
    assert found == ["a", "b c", "git+https://example.org/pkg.git", "--editable", "./local", "plain"]
    assert noxfile.plugin_requirements({}, tmp_path / "absent.txt") == []
    assert noxfile.plugin_requirements({"ATTNBENCH_PLUGINS": ""}, tmp_path / "absent.txt") == []


def test_install_steps_pin_torch_first_and_install_plugins_under_the_same_pin(plugins, tmp_path):
    (tmp_path / "tmp").mkdir()
    steps = noxfile.install_steps(tmp_path / "tmp", ("test",), editable=True)
    constraint = str(tmp_path / "tmp" / "torch-constraint.txt")
    pinned = ["--constraint", constraint]
    assert steps == [[noxfile.TORCH], [*pinned, "-e", ".[test]"], [*pinned, *plugins]]
    assert Path(constraint).read_text() == noxfile.TORCH + "\n"
    assert noxfile.install_steps(tmp_path / "tmp", (), plugins=False) == [[noxfile.TORCH], [*pinned, "."]]


def test_bench_gpu_installs_torch_and_xformers_as_a_pair_from_the_torch_index(plugins, tmp_path, monkeypatch):
    """xformers' extension loads only under the torch it was built for (issue 37): bench_gpu installs torch 2.10.0
    from PyTorch's cu128 index first, then attnbench[xformers] and the plugins with that torch and xformers 0.0.35
    pinned; the environment names another pair, and an empty index leaves pip's own."""
    for name in ("ATTNBENCH_GPU_TORCH", "ATTNBENCH_GPU_TORCH_INDEX", "ATTNBENCH_XFORMERS"):
        monkeypatch.delenv(name, raising=False)
    pair = noxfile.gpu_pair()
    assert pair == noxfile.Torch("torch==2.10.0", "https://download.pytorch.org/whl/cu128", ("xformers==0.0.35",))
    (tmp_path / "tmp").mkdir()
    steps = noxfile.install_steps(tmp_path / "tmp", ("xformers", "gpu"), torch=pair)
    constraint = tmp_path / "tmp" / "torch-constraint.txt"
    pinned = ["--constraint", str(constraint)]
    assert steps == [
        ["torch==2.10.0", "--index-url", "https://download.pytorch.org/whl/cu128"],
        [*pinned, ".[xformers,gpu]"],
        [*pinned, *plugins],
    ]
    assert constraint.read_text() == "torch==2.10.0\nxformers==0.0.35\n"
    session = FakeSession(tmp_path / "tmp", ("--seq", "1024"))
    noxfile.bench_gpu(session)
    assert [list(args) for args in session.installs] == steps
    assert session.runs == [("attnbench", "run", "--suite", "gpu", "--seq", "1024")]
    other = {
        "ATTNBENCH_GPU_TORCH": "torch==2.9.1",
        "ATTNBENCH_GPU_TORCH_INDEX": "",
        "ATTNBENCH_XFORMERS": "xformers==0.0.33.post2",
    }
    steps = noxfile.install_steps(tmp_path / "tmp", ("xformers",), plugins=False, torch=noxfile.gpu_pair(other))
    assert steps == [["torch==2.9.1"], [*pinned, ".[xformers]"]]
    assert constraint.read_text() == "torch==2.9.1\nxformers==0.0.33.post2\n"
    no_pin = noxfile.gpu_pair({"ATTNBENCH_XFORMERS": ""})
    assert no_pin.pinned == () and no_pin.requirement == "torch==2.10.0"
    bench = FakeSession(tmp_path / "bench")
    noxfile.bench(bench)  # the other sessions keep ATTNBENCH_TORCH, from pip's own index
    assert bench.installs[0] == (noxfile.TORCH,)


def test_sessions_that_run_attnbench_get_the_plugins_and_the_checks_do_not(plugins, tmp_path):
    bench = FakeSession(tmp_path / "bench", ("--seq", "512"))
    noxfile.bench(bench)
    assert bench.installs[0] == (noxfile.TORCH,) and bench.installs[-1][2:] == tuple(plugins)
    assert bench.runs == [("attnbench", "run", "--suite", "quick", "--seq", "512")]
    profile = FakeSession(tmp_path / "profile", ("--impl", "bmm", "--seq", "256"))
    noxfile.profile(profile)
    assert profile.installs[-1][2:] == tuple(plugins)
    assert profile.runs == [("attnbench", "profile", "--impl", "bmm", "--seq", "256")]
    tests = FakeSession(tmp_path / "tests")
    noxfile.tests(tests)
    assert len(tests.installs) == 2 and not any("mypkg" in args for args in tests.installs)


def test_dev_makes_the_venv_once_and_installs_attnbench_editable_with_the_plugins(plugins, tmp_path):
    session = FakeSession(tmp_path / "dev-tmp")
    noxfile.dev(session)
    python = str(tmp_path / ".venv" / "bin" / "python")
    assert session.runs[0] == (sys.executable, "-m", "venv", str(tmp_path / ".venv"))
    pip = [args[4:] for args in session.runs[1:]]
    assert all(args[:3] == (python, "-m", "pip") and args[3] == "install" for args in session.runs[1:])
    assert pip[0] == (noxfile.TORCH,) and pip[1][-2:] == ("-e", ".[test]") and pip[2][2:] == tuple(plugins)
    assert "`source .venv/bin/activate` puts attnbench on PATH (or call .venv/bin/attnbench)" in session.logs[-1]
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    again = FakeSession(tmp_path / "dev-tmp")
    noxfile.dev(again)
    assert len(again.runs) == 3 and all(args[0] == python for args in again.runs)  # kept, only updated


def test_a_plugin_named_in_plugins_txt_is_installed_and_listed(tmp_path):
    """The documented route, for real: a plugins.txt line naming the example package, given to pip as the
    sessions give it (here into a target folder, not a fresh venv), makes `chunked` show in `attnbench list`."""
    listed = tmp_path / "plugins.txt"
    listed.write_text("examples/attnbench-chunked  # the README's example\n")
    requirements = noxfile.plugin_requirements({}, listed)
    assert requirements == ["examples/attnbench-chunked"]
    site = tmp_path / "site"
    install = run_subprocess(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(site),
        *requirements,
        cwd=REPO,
    )
    assert install.returncode == 0, install.stderr
    shown = run_subprocess(*attnbench_cmd("list"), env={"PYTHONPATH": str(site)})
    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith("chunked ")]
    assert "available" in line and "query chunks of 256 rows" in line


def test_tests_warms_one_cache_then_runs_the_shared_phase_then_the_serial_phase(tmp_path, monkeypatch):
    shared, serial = noxfile.test_phases(["-k", "cli"], {"ATTNBENCH_TEST_WORKERS": "3"})
    assert shared == ["tests", "-n", "3", "--dist", "loadfile", "-m", "not timing and not serial", "-k", "cli"]
    assert serial == ["tests", "-m", "serial and not timing", "-k", "cli"]
    assert noxfile.test_phases([], {"ATTNBENCH_TEST_WORKERS": "0"})[0][1:3] == ["-n", "0"]  # in pytest's own process
    assert [noxfile.default_workers(cores) for cores in (1, 2, 16)] == [0, 2, 2]
    monkeypatch.delenv("ATTNBENCH_CACHE_DIR", raising=False)
    session = FakeSession(tmp_path / "tests")
    stale = tmp_path / "tests" / "attnbench-cache" / "ceilings.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")  # a cache an earlier run left: each run measures and builds anew
    noxfile.tests(session)
    phases = [("pytest", *args) for args in noxfile.test_phases([])]
    assert session.runs == [*noxfile.WARM_UP, *phases]
    cache = {"ATTNBENCH_CACHE_DIR": str(tmp_path / "tests" / "attnbench-cache")}
    assert session.envs == [cache] * 4 and not stale.exists() and stale.parent.is_dir()
    monkeypatch.chdir(tmp_path)  # nox's tmp folder is relative to the noxfile; the cache's path never is
    assert noxfile.test_cache(Path("tests")) == cache
    selected = FakeSession(tmp_path / "tests", ("-k", "cli"))
    noxfile.tests(selected)  # a selection of tests does without the warm-up
    assert selected.runs == [("pytest", *args) for args in noxfile.test_phases(["-k", "cli"])]
    assert noxfile.test_cache(tmp_path, {"ATTNBENCH_CACHE_DIR": "/mine"}) == {}  # the user's own cache is used


def test_every_fixture_that_splits_interpreter_cases_over_the_cores_makes_its_tests_serial():
    """run_cases_split keeps every core busy, so its fixture goes by the name conftest marks `serial`, and no other
    fixture has that name (a one-process fixture so named would idle a core in the serial phase)."""
    splitting, named = set(), set()
    for path in (REPO / "tests").glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
                calls = {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
                if "run_cases_split" in calls:
                    splitting.add(f"{path.name}::{node.name}")
                if node.name == SPLIT_FIXTURE:
                    named.add(f"{path.name}::{node.name}")
    assert len(splitting) >= 4 and splitting == named
