"""One tree: a core from one checkout beside another install's contenders and reports is refused at the start.

pyproject maps impls/, reports/ and suites/ into the package from outside src/, so ``PYTHONPATH=<clone>/src``
beside an editable install of another checkout ran the clone's core with the other tree's code (review 1,
finding 1): ``ab --base`` judged code the user never ran, and meta.json credited the clone's commit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attnbench.measure import _source_trees as trees

from conftest import attnbench_cmd, run_subprocess

ROOT = Path(__file__).resolve().parent.parent
KEEP_OUT = shutil.ignore_patterns("__pycache__", "*.so")


def test_the_source_and_the_installed_layouts_are_one_tree_and_a_mix_is_named(tmp_path):
    clone, other, site = tmp_path / "clone", tmp_path / "main", tmp_path / "site-packages"
    source = {name: clone / name for name in trees.MAPPED}
    assert trees.mixed(clone / "src" / "attnbench", source) == []  # an editable install: TREE/src/attnbench, TREE/impls
    installed = {name: site / "attnbench" / name for name in trees.MAPPED}
    assert trees.mixed(site / "attnbench", installed) == []  # a plain install: all in site-packages/attnbench
    mix = {**source, "impls": other / "impls", "reports": other / "reports"}
    assert trees.mixed(clone / "src" / "attnbench", mix) == ["impls", "reports"]
    assert trees.mixed(site / "attnbench", source) == list(trees.MAPPED)  # an installed core, a checkout's parts
    assert trees.source_tree(site / "attnbench") is None
    view = tmp_path / "view" / "attnbench"  # a view of links, as `nox -s lint` makes one: view/attnbench/impls → main
    view.mkdir(parents=True)
    for name in trees.MAPPED:
        (other / name).mkdir(parents=True)
        (view / name).symlink_to(other / name, target_is_directory=True)
    assert trees.mixed(view, {name: view / name for name in trees.MAPPED}) == []
    assert trees.mixed(view, {name: other / name for name in trees.MAPPED}) == []  # the links resolved


def test_a_clones_core_on_pythonpath_beside_this_install_is_refused_in_one_line(tmp_path):
    """The review's repro: the clone's src/ on PYTHONPATH, this checkout installed editable (its finder answers
    for attnbench.impls and attnbench.reports). Exit 2, one line naming where each came from and the fix, and
    nothing written."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "src", clone / "src", ignore=KEEP_OUT)
    out = tmp_path / "run"
    args = attnbench_cmd("run", "--impl", "bmm", "--seq", "64", "--out", str(out))
    done = run_subprocess(*args, env={"PYTHONPATH": str(clone / "src")}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    core = (clone / "src" / "attnbench").resolve()
    assert line.startswith(f"attnbench: error: attnbench's packages come from different trees: its core from {core}, ")
    import attnbench.impls

    if Path(attnbench.impls.__path__[0]).resolve() == (ROOT / "impls").resolve():  # this checkout installed editable
        assert f"attnbench.impls from {ROOT / 'impls'}" in line and f"attnbench.reports from {ROOT / 'reports'}" in line
    else:  # a plain install (nox's): its mapped packages lie inside its own folder, found from no clone
        assert "no attnbench.impls, no attnbench.reports, no attnbench.suites" in line
    assert f"`pip install -e {clone.resolve()}`" in line
    assert not out.exists() and done.stdout == ""


def test_a_plain_install_with_every_package_in_one_folder_runs(tmp_path):
    """site-packages' layout (attnbench/ holding impls/, reports/, suites/) is one tree, though none of it lies
    beside a src/ folder: only a true mix is refused."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "src" / "attnbench", site / "attnbench", ignore=KEEP_OUT)
    for name in trees.MAPPED:
        shutil.copytree(ROOT / name, site / "attnbench" / name, ignore=KEEP_OUT)
    done = run_subprocess(*attnbench_cmd("suites"), env={"PYTHONPATH": str(site)}, cwd=tmp_path)
    assert done.returncode == 0 and "quick" in done.stdout, done.stderr
