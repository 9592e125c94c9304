"""trials/: kernel changes queued for `attnbench ab` on a GPU, and the script that judges them.

Every queued patch must keep applying to the tree (a change that breaks one updates it), say what it is, and
carry the `ab` that judges it; ``judge.sh --dry-run`` applies and takes back each one in a clone, leaving it
clean; bad arguments get one line and exit status 2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# git as the tests need it whatever the user's settings: an identity, no signing, plain diffs
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "-c", "color.ui=never"]
GIT += ["-c", "diff.noprefix=false"]
TRIALS = sorted((ROOT / "trials").glob("*.patch"))

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a git checkout"
)


def _judge(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "trials/judge.sh", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_trials_are_queued():
    assert TRIALS, "no trials/*.patch"


@pytest.mark.parametrize("patch", TRIALS, ids=[p.stem for p in TRIALS])
def test_each_trial_applies_to_the_tree_and_says_how_it_is_judged(patch):
    text = patch.read_text()
    preamble = text.split("\ndiff --git ", 1)[0]
    assert preamble.startswith("Trial: ") and "Checked without a GPU:" in preamble
    runs = [line for line in preamble.splitlines() if line.startswith("run: ")]
    assert any("attnbench ab --impl fused_triton --base HEAD" in line and "$TRIAL_OUT" in line for line in runs)
    check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, f"{patch.name} no longer applies: {check.stderr.strip()}"


def test_a_dry_run_applies_and_takes_back_every_trial_in_a_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shutil.copytree(ROOT / "trials", clone / "trials", dirs_exist_ok=True)  # as in this tree, committed or not
    subprocess.run(["git", "add", "-A"], cwd=clone, check=True)
    subprocess.run([*GIT, "commit", "-qm", "t", "--allow-empty"], cwd=clone, check=True)
    done = subprocess.run(  # from another folder: a relative --out is taken from there
        ["bash", str(clone / "trials" / "judge.sh"), "--dry-run", "--out", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").is_dir() and not (clone / "out").exists()
    said = done.stdout.splitlines()
    assert {line.split(":")[0] for line in said} == {p.stem for p in TRIALS}
    assert all(": would run: " in line for line in said)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert status == ""  # every patch taken back


def test_the_list_names_each_trial_with_its_first_line():
    done = _judge("--list")
    assert done.returncode == 0
    names = [line.split()[0] for line in done.stdout.splitlines()]
    assert names == [p.stem for p in TRIALS]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--bogus"], "unknown option --bogus; allowed: --out DIR"),
        (["no-such-trial"], "no trial 'no-such-trial'; queued: "),
        (["--out"], "--out needs a folder"),
    ],
)
def test_bad_arguments_get_one_line_and_status_2(args, said):
    done = _judge(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("judge.sh: " + said)


def test_a_tree_with_changes_is_refused_without_commit_tree(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shutil.copytree(ROOT / "trials", clone / "trials", dirs_exist_ok=True)
    (clone / "stray.txt").write_text("not committed")
    done = _judge("--out", str(tmp_path / "out"), cwd=clone)
    assert done.returncode == 2 and "the working tree has changes" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def _clone_with_trials(tmp_path: Path, trials: dict[str, str]) -> Path:
    """A clone of this tree whose only queued trials are ``trials`` (name → run lines), each a change to
    README.md."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    shutil.copytree(ROOT / "trials", clone / "trials", dirs_exist_ok=True)
    for patch in (clone / "trials").glob("*.patch"):
        patch.unlink()
    (clone / "README.md").write_text((clone / "README.md").read_text() + "\na trial's change\n")
    diff = subprocess.run(
        [*GIT, "diff", "--no-ext-diff", "--", "README.md"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout
    subprocess.run(["git", "checkout", "-q", "README.md"], cwd=clone, check=True)
    for name, runs in trials.items():
        (clone / "trials" / f"{name}.patch").write_text(f"Trial: {name}\n{runs}\n\n{diff}")
    subprocess.run(["git", "add", "-A"], cwd=clone, check=True)
    subprocess.run([*GIT, "commit", "-qm", "t"], cwd=clone, check=True)
    return clone


def test_editable_installs_this_clone_where_attnbench_is_imported_from_elsewhere(tmp_path):
    """--editable: python3 (here a stand-in on PATH that logs its arguments) says attnbench lies elsewhere, so
    this clone is installed editable before any trial runs; once it says this clone, nothing is installed."""
    clone = _clone_with_trials(tmp_path, {"quick": "run: echo judged"})
    bin_dir, log = tmp_path / "bin", tmp_path / "python3.log"
    bin_dir.mkdir()
    stand_in = bin_dir / "python3"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in *"pip install"*) touch "$PWD/.installed"; exit 0 ;; esac\n'
        'if [ -e "$PWD/.installed" ]; then echo "$PWD"; else echo /usr/lib/python3/site-packages; fi\n'
    )
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def judge() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "trials/judge.sh", "--editable", "--out", str(tmp_path / "out"), "--commit-tree", "quick"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = judge()
    assert done.returncode == 0, done.stderr
    assert "installing it editable" in done.stderr and "quick| judged" in done.stdout
    pips = [line for line in log.read_text().splitlines() if "pip install" in line]
    assert pips == ["-m pip install -q --no-deps --no-build-isolation --no-index -e ."]
    log.unlink()
    done = judge()  # now imported from the clone: no install
    assert done.returncode == 0 and "installing" not in done.stderr
    assert "pip install" not in log.read_text()


def test_an_interrupted_trial_is_taken_back(tmp_path):
    """A judge stopped while a trial's run line runs (a time limit's TERM) leaves the tree as it found it."""
    clone = _clone_with_trials(tmp_path, {"stopped": "run: echo before; kill -TERM $PPID; sleep 5; echo after"})
    done = _judge("--out", str(tmp_path / "out"), "stopped", cwd=clone)
    assert done.returncode == 143 and "took trials/stopped.patch back" in done.stderr
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert status == ""
    assert (tmp_path / "out" / "stopped" / "log.txt").read_text().splitlines()[-1] == "before"


def test_a_deadline_stops_the_run_line_past_it_and_the_tarball_holds_what_was_judged(tmp_path):
    """--deadline-s: a run line still running then is stopped (124), the trials after it are not started, every
    patch is taken back; --tar packs OUT after each trial, and each run line's last output is on stdout."""
    import tarfile
    import time

    clone = _clone_with_trials(
        tmp_path,
        {
            "a-quick": "run: echo verdict 0.9x",
            "b-slow": "run: echo started; sleep 60 & wait; echo never",
            "c-late": "run: echo never",
        },
    )
    began = time.monotonic()
    done = _judge("--out", str(tmp_path / "out"), "--tar", str(tmp_path / "t.tgz"), "--deadline-s", "3", cwd=clone)
    assert time.monotonic() - began < 30 and done.returncode == 1, done.stderr
    assert "a-quick| verdict 0.9x" in done.stdout and "b-slow: stopped at the deadline (3 s)" in done.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("a-quick: run lines exited 0;")
    assert summary[1].startswith("b-slow: run lines exited 124;")
    assert summary[2] == "c-late: not run: the deadline (3 s) has passed"
    assert "never" not in (tmp_path / "out" / "b-slow" / "log.txt").read_text().splitlines()  # stopped
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert status == ""
    with tarfile.open(tmp_path / "t.tgz") as packed:
        names = packed.getnames()
    assert {"out/summary.txt", "out/a-quick/log.txt", "out/b-slow/log.txt"} <= set(names)


def test_the_tarball_must_lie_outside_out(tmp_path):
    done = _judge("--out", str(tmp_path / "out"), "--tar", str(tmp_path / "out" / "t.tgz"))
    assert done.returncode == 2 and done.stderr.startswith("judge.sh: --tar ") and "outside --out" in done.stderr


@pytest.mark.parametrize("spelling", ["{out}/", "{out}/./", "{out}/../out"])
def test_the_tarball_is_refused_inside_out_however_out_is_spelled(tmp_path, spelling):
    out = str(tmp_path / "out")
    done = _judge("--out", spelling.format(out=out), "--tar", f"{out}/t.tgz")
    assert done.returncode == 2 and "outside --out" in done.stderr


def test_a_tarball_needs_its_folder(tmp_path):
    done = _judge("--out", str(tmp_path / "out"), "--tar", str(tmp_path / "no" / "t.tgz"))
    assert done.returncode == 2 and done.stderr.startswith("judge.sh: --tar ") and ": no folder " in done.stderr


def test_an_earlier_calls_results_are_not_packed_again(tmp_path):
    """A warm machine keeps OUT between calls: a trial not judged this time leaves nothing of the last call's in
    the tarball, and the summary is said again at the end of the output."""
    import tarfile

    clone = _clone_with_trials(tmp_path, {"a-first": "run: echo one", "b-second": "run: echo two"})
    out, packed = str(tmp_path / "out"), str(tmp_path / "t.tgz")
    assert _judge("--out", out, "--tar", packed, cwd=clone).returncode == 0
    done = _judge("--out", out, "--tar", packed, "b-second", cwd=clone)
    assert done.returncode == 0 and done.stdout.splitlines()[-1].startswith("b-second: run lines exited 0;")
    with tarfile.open(packed) as archive:
        names = set(archive.getnames())
    assert "out/b-second/log.txt" in names and not any(name.startswith("out/a-first") for name in names)


def _run_lines() -> list[tuple[str, str]]:
    return [
        (patch.stem, line[len("run: ") :])
        for patch in TRIALS
        for line in patch.read_text().split("\ndiff --git ", 1)[0].splitlines()
        if line.startswith("run: ")
    ]


@pytest.mark.parametrize(("trial", "command"), _run_lines(), ids=[f"{t}-{i}" for i, (t, _) in enumerate(_run_lines())])
def test_each_run_line_is_a_command_that_parses_here(trial, command, tmp_path, monkeypatch):
    """A GPU's minutes are not spent on a typo: each `attnbench ab` line parses and builds its workloads (flags,
    suite, axis values, as `ab` checks them before timing anything, CUDA taken as there), each `attnbench run` line
    its checked request (fused_triton among its contenders, on CUDA, a folder of its own); each `python3 -c` line
    compiles."""
    import shlex

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GPU machine's answer

    words = shlex.split(command.replace("$TRIAL_OUT", str(tmp_path)))
    if words[0] == "attnbench":
        from attnbench import cli
        from attnbench.reports import ab_command
        from attnbench.runner import ab

        args = cli.build_parser().parse_args(words[1:])
        if args.func is cli.cmd_run:  # a run beside the ab (e.g. for a ratio to another contender): its request
            args.command_line = command
            request = cli.request_from_args(args)
            assert request.out is not None and "fused_triton" in request.axes["impl"], trial
            assert request.axes["device"] == ["cuda"], trial
            return
        assert args.func is cli.cmd_ab and args.impl == "fused_triton" and args.base == "HEAD", trial
        ab_command.check_flags(args)
        workloads = ab.sweep_workloads(args.suite, cli.ab_overrides(args))
        assert workloads and all(w.device == "cuda" for w in workloads), trial
    else:
        assert words[:2] == ["python3", "-c"] and len(words) == 3, (trial, command)
        compile(words[2], f"{trial} run line", "exec")
