"""``attnbench.run()`` from every kind of caller (issue 19, item 1): the worker process must start without
re-running the caller's main module — a script without a main guard, ``python -``, ``python -c``, ``python
-i`` fed like a notebook, a host that runs the code with ``runpy`` or ``exec`` (``__main__`` without
``__file__``) and pytest itself. Each prints the frame's checked rows (`ok`, or `stalled` where the machine was
busy) and exits 0.
"""

import re
import subprocess
import sys
import textwrap

import pytest

import attnbench

from conftest import CHECKED, run_subprocess

FAST = {"impl": "bmm", "seq": [64], "mask": "none", "budget_s": 0.02, "memory": False, "progress": "off"}
# What a new user writes first: no `if __name__ == "__main__":` guard.
SCRIPT = textwrap.dedent(f"""\
    import attnbench
    df = attnbench.run(**{FAST!r})
    print(df[["impl", "seq_q", "status"]].to_string())
    print("checked rows:", int(df.status.isin({CHECKED!r}).sum()), "of", len(df))
""")


def check_printed_a_frame(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr
    assert "bootstrapping" not in result.stderr and "did not start" not in result.stderr
    assert re.search(r"impl +seq_q +status", result.stdout), result.stdout
    counts = re.search(r"checked rows: (\d+) of (\d+)", result.stdout)
    assert counts is not None, result.stdout
    assert int(counts[1]) == int(counts[2]) >= 1, result.stdout


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "s.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.slow
def test_a_script_without_a_main_guard(script):
    check_printed_a_frame(run_subprocess(sys.executable, str(script), cwd=script.parent))


@pytest.mark.slow
def test_a_script_fed_to_python_dash(script):
    result = subprocess.run(
        [sys.executable, "-"], input=SCRIPT, capture_output=True, text=True, timeout=600, cwd=script.parent
    )
    check_printed_a_frame(result)


@pytest.mark.slow
def test_python_dash_c(tmp_path):
    check_printed_a_frame(run_subprocess(sys.executable, "-c", SCRIPT, cwd=tmp_path))


@pytest.mark.slow
def test_an_interactive_session_like_a_notebook(tmp_path):
    """``python -i`` reading its cells from stdin: ``__main__`` is the interactive namespace, no file."""
    cells = SCRIPT + "\nimport __main__; print('has file:', hasattr(__main__, '__file__'))\n"
    result = subprocess.run(
        [sys.executable, "-i", "-q"], input=cells, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    check_printed_a_frame(result)
    assert "has file: False" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "host",
    [
        "import runpy; runpy.run_path(sys.argv[1], run_name='__main__')",
        "exec(compile(open(sys.argv[1]).read(), '<embedded>', 'exec'), {'__name__': '__main__'})",
        "import __main__; del __main__.__file__; exec(open(sys.argv[1]).read())",
    ],
    ids=["runpy", "exec", "main without __file__"],
)
def test_an_embedding_host(tmp_path, script, host):
    """A host program runs the user's code as its main module: the worker must not re-import the host."""
    hosting = tmp_path / "host.py"
    hosting.write_text(f"import sys\n{host}\n")
    check_printed_a_frame(run_subprocess(sys.executable, str(hosting), str(script), cwd=tmp_path))


def test_from_pytest_itself():
    frame = attnbench.run(**FAST)
    assert len(frame) >= 1 and frame.status.isin(CHECKED).all()
    assert (frame.impl == "bmm").all() and (frame.seq_q == 64).all()
