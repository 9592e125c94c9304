"""`attnbench ab --impl NAME --base REV` times the base revision's own code, whenever that code imports it:
plugin packages in a flat and in a src layout (the kernel in a sibling module imported at import time), a
plugin that imports its modules lazily (inside ``prepare``, inside the timed call), and fused_cpu's
shared-prefix path (cascade) in a throwaway repository; and the import rewrite those rest on."""

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnbench.impls
from attnbench.contenders import _revision as revision
from attnbench.contenders import registry
from attnbench.errors import UsageError
from attnbench.runner import ab
from attnbench.workload import Workload

from conftest import attnbench_cmd, run_subprocess

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}
SHAPE = ["--batch", "1", "--heads", "2", "--seq", "256", "--head-dim", "64", "--threads", "1"]

# The package's __init__ is the entry point; the kernel is in a sibling module, imported at import time.
EAGER_INIT = '''\
"""A plugin contender whose kernel lives in a sibling module."""
from attnbench import Capabilities, Contender

from .work import attend


class Kernel(Contender):
    name = "{name}"
    capabilities = Capabilities(devices=frozenset({{"cpu"}}), masks=frozenset({{"none"}}))

    def prepare(self, inputs, workload):
        q, k, v, scale = inputs.q, inputs.k, inputs.v, inputs.scale
        return lambda: attend(q, k, v, scale)


contender = Kernel()
'''
# The kernel module imports its helpers lazily: one inside prepare (absolute), one inside the timed call.
LAZY_KERNEL = '''\
"""A plugin contender that imports its modules only when it needs them."""
from attnbench import Capabilities, Contender


class Kernel(Contender):
    name = "{name}"
    capabilities = Capabilities(devices=frozenset({{"cpu"}}), masks=frozenset({{"none"}}))

    def prepare(self, inputs, workload):
        from {package}.settings import PASSES  # lazily, inside prepare

        q, k, v, scale = inputs.q, inputs.k, inputs.v, inputs.scale

        def run():
            from .work import attend  # lazily, inside the timed call

            return attend(q, k, v, scale, PASSES)

        return run


contender = Kernel()
'''
WORK = """\
import torch


def attend(q, k, v, scale, passes={passes}):
    scores = q @ k.transpose(-1, -2)
    for _ in range(passes - 1):  # real extra work: the product again
        scores = torch.maximum(scores, q @ k.transpose(-1, -2))
    return torch.softmax(scores * scale, dim=-1) @ v
"""

WORK_MORE = WORK.format(passes=1).replace(  # two more products whatever the caller passes
    "    return torch.softmax",
    "    for _ in range(2):\n        scores = torch.maximum(scores, q @ k.transpose(-1, -2))\n    return torch.softmax",
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    )
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def plugin_repo(repo: Path, layout: str, package: str, files: dict[str, str], entry: str | None) -> Path:
    """A git repository holding ``package`` in a flat or a src layout, with a dist-info naming its entry point
    (if any) beside it, on the path a test puts on PYTHONPATH, which it returns."""
    path = repo / "src" if layout == "src" else repo
    (path / package).mkdir(parents=True)
    for name, text in files.items():
        (path / package / name).write_text(text)
    if entry is not None:
        info = path / f"{package}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[attnbench.impls]\n{entry}\n")
    git(repo, "init", "-q")
    commit_all(repo, "the kernel")
    return path


@pytest.mark.parametrize("layout", ["flat", "src"])
def test_a_commit_that_adds_work_in_a_sibling_module_is_slower_in_either_layout(tmp_path, layout):
    name, package = f"ab_{layout}", f"abplug_{layout}"
    repo = tmp_path / "repo"
    init = EAGER_INIT.format(name=name)
    path = plugin_repo(
        repo, layout, package, {"__init__.py": init, "work.py": WORK.format(passes=1)}, f"{name} = {package}:contender"
    )
    (path / package / "work.py").write_text(WORK.format(passes=3))
    commit_all(repo, "the score product three times")
    built = path / package / f"_built{importlib.machinery.EXTENSION_SUFFIXES[0]}"  # untracked; imported by none
    built.write_bytes(b"not a real library")
    args = attnbench_cmd(
        "ab", "--impl", name, "--base", "HEAD~1", *SHAPE, "--budget-s", "1", "--json", "--out", str(tmp_path / "ab")
    )
    done = run_subprocess(*args, env={"PYTHONPATH": str(path)}, cwd=repo)
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 1, (record, done.stderr)
    assert (record["impl_a"], record["verdict"]) == (f"{name}@HEAD~1", "slower") and record["ratio"] > 1.2, record
    commit = git(repo, "rev-parse", "HEAD~1")
    relative = (path / package).relative_to(repo).as_posix()
    resolved = (
        f"ab: note: A = {name}@HEAD~1: {package} ({relative}) at commit {commit[:12]} (HEAD~1) of {repo.resolve()}"
    )
    note = f"ab: note: HEAD~1: {built.relative_to(repo).as_posix()} not in git; the base version uses the working"
    said = done.stderr.splitlines()
    assert said[0] == resolved and said[1].startswith(note), done.stderr  # said before anything is timed
    assert "this run is an A/A" not in done.stderr  # work.py changed since HEAD~1
    # the extracted base is the whole package folder, not its __init__.py alone
    located = revision._package_root(package, (path / package / "__init__.py").resolve())
    assert located == (package, (path / package).resolve())
    base_root = revision.extract(
        revision.Located(package, "contender", package, located[1], repo.resolve()),
        git(repo, "rev-parse", "HEAD~1"),
        tmp_path / "base",
    )
    assert sorted(p.name for p in base_root.iterdir()) == ["__init__.py", "work.py"]
    assert "passes=1" in (base_root / "work.py").read_text()


@pytest.fixture
def lazy_plugin(tmp_path, monkeypatch, planted):
    """A plugin package ``ablazy`` (kernel module imported lazily inside prepare and inside the call) at its
    first commit, importable in this process and registered; yields (repo, package folder)."""
    repo = tmp_path / "lazyrepo"
    files = {
        "__init__.py": "",
        "kernel.py": LAZY_KERNEL.format(name="ab_lazy", package="ablazy"),
        "settings.py": "PASSES = 1\n",
        "work.py": WORK.format(passes=1),
    }
    path = plugin_repo(repo, "flat", "ablazy", files, None)  # registered below, in this process
    monkeypatch.syspath_prepend(str(path))
    import ablazy.kernel

    registry.register(ablazy.kernel.Kernel)
    planted.append("ab_lazy")
    yield repo, path / "ablazy"
    for module in [m for m in sys.modules if m == "ablazy" or m.startswith("ablazy.")]:
        del sys.modules[module]


def decide(name: str, rev: str, tmp_path: Path, budget_s: float = 1.0) -> ab.AbCase:
    a, b = ab.revision_versions(name, rev, tmp_path / f"base-{rev.replace('~', '-')}")
    workload = Workload(1, 2, 2, 256, 256, 64)
    (case,) = ab.run_ab(a, b, [workload], ab.AbOptions(budget_s=budget_s, threads=1))
    return case


def test_a_base_whose_package_files_equal_the_working_trees_says_the_run_is_an_a_a(lazy_plugin, tmp_path):
    """--base HEAD of a clean package: the notes say where REV resolved and that the run is an A/A; an edit in
    the working tree, or a new untracked module in the package, makes it a real A/B again."""
    repo, package = lazy_plugin
    commit = git(repo, "rev-parse", "HEAD")
    a, _ = ab.revision_versions("ab_lazy", "HEAD", tmp_path / "base-1")
    assert a.notes == (
        f"A = ab_lazy@HEAD: ablazy (ablazy) at commit {commit[:12]} (HEAD) of {repo.resolve()}",
        "ab_lazy's files are the same at HEAD and in the working tree: this run is an A/A (nothing in ablazy "
        f"differs from commit {commit[:12]}; edit the working tree or give another --base to compare)",
    )
    cache = package / "__pycache__"  # bytecode, untracked and not ignored here, changes nothing
    cache.mkdir(exist_ok=True)
    (cache / "kernel.cpython-311.pyc").write_bytes(b"\0")
    a, _ = ab.revision_versions("ab_lazy", "HEAD", tmp_path / "base-0")
    assert any("this run is an A/A" in note for note in a.notes), a.notes
    (package / "helper.py").write_text("X = 1\n")  # untracked, not ignored: the working tree has more
    a, _ = ab.revision_versions("ab_lazy", "HEAD", tmp_path / "base-2")
    assert len(a.notes) == 1 and a.notes[0].startswith("A = ab_lazy@HEAD: "), a.notes
    (package / "helper.py").unlink()
    (package / "settings.py").write_text("PASSES = 2\n")  # a tracked file edited, not committed
    a, _ = ab.revision_versions("ab_lazy", "HEAD", tmp_path / "base-3")
    assert not any("A/A" in note for note in a.notes), a.notes


@pytest.mark.parametrize(("planted_in", "change"), [("settings.py", "PASSES = 3\n"), ("work.py", WORK_MORE)])
def test_a_slowdown_in_a_lazily_imported_module_is_slower(lazy_plugin, tmp_path, planted_in, change):
    """settings.py is imported inside prepare, work.py inside the timed call: both the base revision's own."""
    repo, package = lazy_plugin
    (package / planted_in).write_text(change)
    commit_all(repo, f"plant: more work through {planted_in}")
    case = decide("ab_lazy", "HEAD~1", tmp_path)
    assert case.verdict == "slower" and case.paired is not None and case.paired.ratio > 1.2, case


@pytest.mark.serial  # `same` needs a quiet machine: beside another test's sweep both tries came back `unclear`
def test_a_comment_only_change_to_a_lazily_imported_module_is_same(lazy_plugin, tmp_path):
    repo, package = lazy_plugin
    work = package / "work.py"
    work.write_text("# only this comment is new\n" + work.read_text())
    commit_all(repo, "a comment")
    verdicts = []
    for attempt in range(2):  # one retry: a busy machine may leave one A/A run `unclear`, never `slower`
        case = decide("ab_lazy", "HEAD~1", tmp_path / str(attempt), budget_s=2.0)
        verdicts.append(case.verdict)
        assert case.verdict in ("same", "unclear"), case
        if case.verdict == "same":
            break
    assert "same" in verdicts, verdicts


def test_an_import_the_base_never_had_fails_naming_the_package_module(lazy_plugin, tmp_path):
    """A lazily imported module added after the base revision: the base's call fails, and the reason names
    the module as the package does (not the base's internal name)."""
    repo, package = lazy_plugin
    git(repo, "mv", "ablazy/work.py", "ablazy/work_old.py")
    commit_all(repo, "the base has no work module")
    (package / "work_old.py").rename(package / "work.py")
    commit_all(repo, "work is back")
    case = decide("ab_lazy", "HEAD~1", tmp_path)
    assert case.verdict == "error" and "No module named 'ablazy.work'" in case.reason, case


@pytest.mark.parametrize(
    ("old_import", "gone"),
    [
        ("from attnbench import kv_cache", "attnbench.kv_cache"),
        ("from attnbench.native_build import cache_dir", "attnbench.native_build"),
    ],
)
def test_a_base_from_before_the_rooms_names_the_module_it_imports_in_one_line(
    tmp_path, monkeypatch, planted, old_import, gone
):
    """A base revision written against the flat core (``attnbench.kv_cache``, ``attnbench.native_build``): the
    comparison stops with one line naming the module the old code imports, never a traceback."""
    repo = tmp_path / "oldrepo"
    init = EAGER_INIT.format(name="ab_old").replace(
        "from .work import attend", f"{old_import}\nfrom .work import attend"
    )
    path = plugin_repo(repo, "flat", "abold", {"__init__.py": init, "work.py": WORK.format(passes=1)}, None)
    (path / "abold" / "__init__.py").write_text(EAGER_INIT.format(name="ab_old"))
    commit_all(repo, "the core's new paths")
    monkeypatch.syspath_prepend(str(path))
    import abold

    registry.register(abold.Kernel)
    planted.append("ab_old")
    try:
        with pytest.raises(UsageError) as caught:
            ab.revision_versions("ab_old", "HEAD~1", tmp_path / "base")
    finally:
        for module in [m for m in sys.modules if m == "abold" or m.startswith("abold.")]:
            del sys.modules[module]
    message = str(caught.value)
    assert message == (
        f"--impl ab_old: its base version imports {gone}, a module this attnbench does not have (the "
        "core's modules moved into rooms: see the Layout section of the README)"
    ), message


CASCADE_WORKLOAD = Workload(4, 8, 2, 4, 1024, 64, shared_prefix=512)


@pytest.mark.slow
@pytest.mark.serial  # its comment-only commit must come back `same`, which needs a quiet machine
def test_fused_cpu_cascade_at_two_revisions_each_runs_its_own(tmp_path):
    """attnbench's own kernel, in a throwaway repository holding a copy of its impls package: a sleep planted
    in the cascade (shared-prefix) path at HEAD is `slower` against HEAD~1, a comment is `same`. Both versions
    come through the base-revision import (the installed attnbench may not be a git checkout)."""
    repo = tmp_path / "repo"
    shutil.copytree(Path(attnbench.impls.__file__).parent, repo / "impls", ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q")
    commit_all(repo, "attnbench's impls")
    cascade = repo / "impls" / "fused_cpu" / "cascade.py"
    source = cascade.read_text()
    marker = '    None. Returns (B, H, Sq, Dv) in q\'s dtype."""\n'
    assert marker in source
    cascade.write_text(source.replace("\nimport torch\n", "\n# a comment only\nimport torch\n"))
    commit_all(repo, "a comment")
    cascade.write_text(cascade.read_text().replace(marker, marker + "    import time\n\n    time.sleep(0.01)\n"))
    commit_all(repo, "plant: the cascade sleeps")
    located = revision.Located("attnbench.impls.fused_cpu", "contender", "attnbench.impls", repo / "impls", repo)

    def version(rev: str) -> ab.Version:
        commit = git(repo, "rev-parse", rev)
        base_root = revision.extract(located, commit, tmp_path / rev.replace("~", "-"))
        return ab.Version(f"fused_cpu@{rev}", revision.import_base("fused_cpu", located, base_root), rev)

    first, comment, planted = version("HEAD~2"), version("HEAD~1"), version("HEAD")
    options = ab.AbOptions(budget_s=1.0, threads=1)
    (slower,) = ab.run_ab(comment, planted, [CASCADE_WORKLOAD], options)
    assert slower.verdict == "slower" and slower.paired is not None and slower.paired.ratio > 1.2, slower
    verdicts = []
    for _ in range(2):  # one retry, as above
        (same,) = ab.run_ab(first, comment, [CASCADE_WORKLOAD], ab.AbOptions(budget_s=2.0, threads=1))
        verdicts.append(same.verdict)
        assert same.verdict in ("same", "unclear"), same
        if same.verdict == "same":
            break
    assert "same" in verdicts, verdicts
    assert "sleep" not in Path(sys.modules["attnbench.impls.fused_cpu.cascade"].__file__).read_text()


def test_the_rewrite_routes_every_form_of_import_and_leaves_the_rest(tmp_path):
    """Each import form the base code may use, compiled by the base loader: the root's names go to the base's
    modules (at import time and later), other names stay where they were."""
    repo = tmp_path / "repo"
    (repo / "rwplug" / "sub").mkdir(parents=True)
    (repo / "rwplug" / "__init__.py").write_text("WHERE = 'rwplug'\n")
    (repo / "rwplug" / "sub" / "__init__.py").write_text("")
    (repo / "rwplug" / "sub" / "leaf.py").write_text("VALUE = 1\n")
    (repo / "rwplug" / "forms.py").write_text(
        "import json\n"
        "import rwplug.sub.leaf\n"
        "import rwplug.sub.leaf as aliased\n"
        "from rwplug.sub import leaf\n"
        "from .sub.leaf import VALUE\n"
        "from . import sub\n"
        "from rwplug import sub as sub2\n"
        "\n"
        "def later():\n"
        "    from rwplug.sub.leaf import VALUE as inner\n"
        "    import rwplug\n"
        "    return inner, rwplug.WHERE, rwplug.sub.leaf.VALUE\n"
    )
    git(repo, "init", "-q")
    commit_all(repo, "one")
    (repo / "rwplug" / "sub" / "leaf.py").write_text("VALUE = 2\n")
    sys.path.insert(0, str(repo))
    try:
        import rwplug.forms

        located = revision.Located("rwplug.forms", "later", "rwplug", (repo / "rwplug").resolve(), repo.resolve())
        base_root = revision.extract(located, git(repo, "rev-parse", "HEAD"), tmp_path / "base")
        alias = revision.import_base.__globals__["ALIAS_PREFIX"]
        with pytest.raises(Exception, match="not a contender"):  # `later` is a function: the import still ran
            revision.import_base("rw", located, base_root)
        (name,) = [n for n in sys.modules if n.startswith(alias) and n.endswith(".forms")]
        forms = sys.modules[name]
        assert forms.rwplug.sub.leaf.VALUE == 1 and forms.aliased.VALUE == 1 and forms.leaf.VALUE == 1
        assert forms.VALUE == 1 and forms.sub.leaf.VALUE == 1 and forms.sub2.leaf.VALUE == 1
        assert forms.later() == (1, "rwplug", 1) and forms.json is sys.modules["json"]
        assert rwplug.forms.later() == (2, "rwplug", 2)  # the working tree's, untouched
        assert revision.readable(f"No module named '{name}'") == "No module named 'rwplug.forms'"
    finally:
        sys.path.remove(str(repo))
        for module in [m for m in sys.modules if m == "rwplug" or m.startswith("rwplug.")]:
            del sys.modules[module]


def test_a_contender_whose_module_git_does_not_track_is_refused_saying_why(tmp_path):
    """A kernel author's new contender module, not yet committed, has no base to compare with: the refusal says
    commit it (not "install it editable", which it already is); an ignored one (a plain install in a venv inside
    the clone) says install it from the clone."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text("venv/\n")
    git(repo, "init", "-q")
    commit_all(repo, "one")
    (repo / "venv").mkdir()
    for folder, module in ((repo, "untrackedplug"), (repo / "venv", "ignoredplug")):
        (folder / f"{module}.py").write_text(
            "from attnbench import Contender\n\nclass Kernel(Contender):\n    name = 'k'\n"
            "    def prepare(self, inputs, workload):\n        return lambda: None\n"
        )
        sys.path.insert(0, str(folder))
    try:
        import ignoredplug
        import untrackedplug

        with pytest.raises(UsageError) as refused:
            revision.locate("k", untrackedplug.Kernel())
        assert str(refused.value) == (
            f"--impl k: its module {(repo / 'untrackedplug.py').resolve()} is untracked in the git repository "
            f"{repo.resolve()}, so no revision has a version of it to compare with; commit it and give a --base that "
            "has it, or compare two registered contenders with --a and --b"
        )
        with pytest.raises(UsageError, match=r"ignored by git; install it editable from its clone\)$"):
            revision.locate("k", ignoredplug.Kernel())
    finally:
        for folder, module in ((repo, "untrackedplug"), (repo / "venv", "ignoredplug")):
            sys.path.remove(str(folder))
            sys.modules.pop(module, None)


def test_what_of_the_base_is_not_the_base_revisions_is_said(tmp_path):
    """A built extension git does not track is copied from the working tree, and a file outside the package
    that this process loaded and that changed since REV is named: one line each."""
    repo = tmp_path / "repo"
    (repo / "notedplug").mkdir(parents=True)
    (repo / "notedplug" / "__init__.py").write_text("import noted_helper\n")
    (repo / "noted_helper.py").write_text("HELP = 1\n")
    git(repo, "init", "-q")
    commit_all(repo, "one")
    (repo / "noted_helper.py").write_text("HELP = 2\n")
    built = repo / "notedplug" / f"_fast{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    built.write_bytes(b"\x7fELF not really")
    sys.path.insert(0, str(repo))
    try:
        import notedplug  # noqa: F401  (loads noted_helper, as the working tree's version does)

        located = revision.Located(
            "notedplug", "contender", "notedplug", (repo / "notedplug").resolve(), repo.resolve()
        )
        commit = git(repo, "rev-parse", "HEAD")
        base_root = revision.extract(located, commit, tmp_path / "base")
        copied = revision.copy_built_extensions(located, base_root)
        assert copied == [f"notedplug/{built.name}"] and (base_root / built.name).read_bytes() == built.read_bytes()
        said = revision.notes(located, commit, "HEAD", copied)
        assert said == [
            f"HEAD: notedplug/{built.name} not in git; the base version uses the working tree's build of it",
            "HEAD: outside notedplug/, the base version runs the working tree's noted_helper.py (changed since)",
        ]
    finally:
        sys.path.remove(str(repo))
        for module in ("notedplug", "noted_helper"):
            sys.modules.pop(module, None)


@pytest.mark.timing
def test_a_lazy_import_costs_the_base_what_it_costs_the_working_tree(tmp_path, capsys):
    """The rewrite leaves nothing of ours in the call: a lazy import statement, absolute or relative, and a call
    that imports nothing take the same time in the base version as in the working tree's (timeit, best of 5;
    `nox -s timing_checks -- -k lazy_import -s` prints them)."""
    import timeit

    repo = tmp_path / "repo"
    (repo / "costplug").mkdir(parents=True)
    (repo / "costplug" / "__init__.py").write_text("")
    (repo / "costplug" / "work.py").write_text("def f():\n    return 1\n")
    (repo / "costplug" / "kernel.py").write_text(
        "def lazy_absolute():\n    from costplug.work import f\n    return f()\n\n\n"
        "def lazy_relative():\n    from .work import f\n    return f()\n\n\n"
        "def plain():\n    return 1\n"
    )
    git(repo, "init", "-q")
    commit_all(repo, "one")
    sys.path.insert(0, str(repo))
    try:
        import costplug.kernel as current

        located = revision.Located(
            "costplug.kernel", "plain", "costplug", (repo / "costplug").resolve(), repo.resolve()
        )
        base_root = revision.extract(located, git(repo, "rev-parse", "HEAD"), tmp_path / "base")
        with pytest.raises(Exception, match="not a contender"):  # `plain` is a function: the module imported
            revision.import_base("cost", located, base_root)
        (name,) = [n for n in sys.modules if n.startswith(revision.ALIAS_PREFIX) and n.endswith(".kernel")]
        base = sys.modules[name]
        for call in ("lazy_absolute", "lazy_relative", "plain"):
            ns = {}
            for side, module in (("working tree", current), ("base", base)):
                best = min(timeit.repeat(getattr(module, call), number=200_000, repeat=5)) / 200_000
                ns[side] = best * 1e9
            with capsys.disabled():
                print(f"{call}: working tree {ns['working tree']:.0f} ns, base {ns['base']:.0f} ns")
            assert ns["base"] < 1.1 * ns["working tree"] + 5, (call, ns)
    finally:
        sys.path.remove(str(repo))
        for module in [m for m in sys.modules if m == "costplug" or m.startswith("costplug.")]:
            del sys.modules[module]
