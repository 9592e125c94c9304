"""Every attnbench and pytest command in the README runs as written (the nox ones run in CI itself; the
SLURM script is covered by the shard, merge and resume tests)."""

import re
import shlex
import sys

import pytest

from conftest import REPO, run_subprocess

README = (REPO / "README.md").read_text()


def _commands(prefix: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL)
    blocks = [block for block in blocks if not block.startswith("#!")]  # job scripts (SLURM) are examples
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith(prefix)]


def test_readme_names_the_two_setup_commands_and_ci_runs_the_test_one():
    setup = _commands("python3 -m pip install nox")
    assert setup == ["python3 -m pip install nox && nox -s bench", "python3 -m pip install nox && nox -s tests"]
    assert "nox -s lint tests" in (REPO / ".ci" / "run").read_text()


@pytest.mark.slow
def test_readme_attnbench_commands_run_in_order(tmp_path):
    commands = _commands("attnbench ")
    assert len(commands) >= 5
    for command in commands:
        args = shlex.split(command)[1:]
        result = run_subprocess(sys.executable, "-m", "attnbench", *args, cwd=tmp_path)
        allowed = (0, 1) if args[0] in ("compare", "ab") else (0,)  # compare, ab: exit 1 when a case got slower
        allowed = (0, 1) if "--fail-on-regression" in args else allowed  # history: 1 when the newest step is slower
        assert result.returncode in allowed, (command, result.stderr[-2000:])
    assert (tmp_path / "runs" / "report" / "report.html").exists()
    assert (tmp_path / "runs" / "prof" / "top_ops.csv").exists()


def test_readme_pytest_command_runs():
    (command,) = _commands("pytest suites/")
    result = run_subprocess(sys.executable, "-m", *shlex.split(command), "-q", "-p", "no:cacheprovider", cwd=REPO)
    assert result.returncode == 0, result.stdout[-2000:]
