"""trials/: kernel changes queued for `attnbench ab` on a GPU, and the script that judges them.

Every queued patch must keep applying to the tree (a change that breaks one updates it), say what it is, and
carry the `ab` that judges it; ``judge.sh --dry-run`` applies and takes back each one in a clone, leaving it
clean; bad arguments get one line and exit status 2.
"""

from __future__ import annotations

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


def test_an_interrupted_trial_is_taken_back(tmp_path):
    """A judge stopped while a trial's run line runs (a time limit's TERM) leaves the tree as it found it."""
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
    preamble = "Trial: stopped\nrun: echo before; kill -TERM $PPID; sleep 5; echo after\n\n"
    (clone / "trials" / "stopped.patch").write_text(preamble + diff)
    subprocess.run(["git", "add", "-A"], cwd=clone, check=True)
    subprocess.run([*GIT, "commit", "-qm", "t"], cwd=clone, check=True)
    done = _judge("--out", str(tmp_path / "out"), "stopped", cwd=clone)
    assert done.returncode == 143 and "took trials/stopped.patch back" in done.stderr
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert status == ""
    assert (tmp_path / "out" / "stopped" / "log.txt").read_text().splitlines()[-1] == "before"
