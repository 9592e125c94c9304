"""A contender as it was at another git revision, imported beside the working tree's in this process.

``attnbench ab --impl NAME --base REV`` needs both versions of one contender alive at once. The steps:

1. find the module that defines the contender: its entry point's module (``module:attr``), else the
   module of its class (contenders added with ``register()``);
2. find the git repository holding that file (``git rev-parse --show-toplevel``); a contender installed
   from a wheel into site-packages has none, and that is bad input;
3. find the *package root*: the outermost package whose folder holds the module at its dotted path
   (``attnbench.impls`` for ``attnbench.impls.fused_cpu``, ``myplugin`` for ``myplugin.kernel`` or for an
   entry point naming ``myplugin`` itself — the package's folder, never only its ``__init__.py``; the module
   itself when it is a top-level file);
4. extract that folder as it was at REV (``git archive REV -- FOLDER``) into a temporary folder; extension
   modules git does not track (``.so`` files built in place) are copied in from the working tree, and said;
5. import it under a name of its own, ``_attnbench_base_N`` standing for the root (``myplugin.kernel`` at
   REV is ``_attnbench_base_1.kernel``), so that the base's modules and the working tree's live side by side
   in ``sys.modules`` for the whole run.

Every import the base code makes goes to the base's files, *whenever* it is made — at import time, inside
``prepare``, inside the timed call:

* relative imports (``from . import flash``) resolve against the module's own package, which is under
  the base name;
* absolute imports of the root's names (``from myplugin.work import f``, ``import attnbench.impls.x``)
  are rewritten in the base module's syntax tree before it is compiled (:class:`_Rewrite`; a loader on
  ``sys.meta_path`` that answers only for ``_attnbench_base_`` names compiles each base module so), so
  the interpreter's own import statement reaches ``_attnbench_base_N.work``. Nothing of ours runs when
  the statement does and nothing is swapped in ``sys.modules`` around a call: a lazy import inside the
  timed call costs what it costs in the working tree's version (`nox -s timing_checks -- -k lazy_import -s`
  on the 2-core Zen 4 VM, nothing else running, best of 5 timeit runs, two runs an hour apart: a lazy
  absolute import 691 / 681 ns in the base, 684 / 682 in the working tree; a relative one 1033 / 1039 and
  1041 / 1044 ns; a call that imports nothing 25 / 24 and 25 / 23 ns — the runs agree within 2 %).

Native code follows by itself when the package finds its sources beside its files: attnbench's
``fused_cpu`` at REV compiles REV's C++ from the extracted folder, and ``native_build`` keys each library
by its sources' contents, so the two builds are two libraries, both loaded.

Before anything is timed, :func:`orientation` says which repository and commit REV resolved to (the
contender's own repository, which is not always the one the command runs in) and, when the package's files
are the same at REV as in the working tree, that the run is an A/A — a ``same`` that only says the edit was
made elsewhere, or never saved, would otherwise read as "the change does nothing".

Limits, each said in one line before anything is timed (:func:`notes`): code outside the package root
(attnbench's core, another package of the repository) is the working tree's — the files of it that the
run loaded and that changed since REV are named; a built extension git does not track is the working
tree's build. ``importlib.import_module("myplugin.x")`` called by the base code is not routed (the import
statement is); a message naming a base module is turned back into the package's names (:func:`readable`).
The module the entry point names must exist under that name at REV. The base version's classes live under
the ``_attnbench_base_N`` names, so they cannot be pickled — the A/B command times both in this one process
and needs no worker.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import itertools
import re
import shutil
import subprocess
import sys
import tarfile
import types
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from attnbench.contenders.contract import Contender
from attnbench.contenders.registry import GROUP, as_contender
from attnbench.errors import UsageError, one_line

ALIAS_PREFIX = "_attnbench_base_"
_counter = itertools.count(1)


@dataclass(frozen=True)
class Located:
    """Where a contender's code lives: its module and attribute, the package root and the repository."""

    module: str  # the module holding the object the entry point names
    attr: str  # dotted attribute path of that object in the module
    root: str  # the package root to re-import (or the module itself)
    root_path: Path  # its folder (or file), in the working tree
    repo: Path  # the git repository's top level


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False, timeout=120)


def _object_path(name: str, contender: Contender) -> tuple[str, str]:
    """(module, attribute) of the registered object: the entry point's, else the contender's class."""
    for entry_point in metadata.entry_points(group=GROUP, name=name):
        return entry_point.module, entry_point.attr
    cls = type(contender)
    return cls.__module__, cls.__qualname__


def _package_root(module_name: str, file: Path) -> tuple[str, Path]:
    """The outermost package whose folder holds ``file`` at the module's dotted path, and that folder (a
    package's folder even when the module is the package itself: its ``__init__.py`` alone is not it)."""
    parts = module_name.split(".")
    root, root_path = module_name, file.parent if file.name == "__init__.py" else file
    for depth in range(len(parts) - 1, 0, -1):
        package = sys.modules.get(".".join(parts[:depth]))
        rest = parts[depth:]
        found = None
        for folder in (Path(p).resolve() for p in getattr(package, "__path__", [])):
            if file in (folder.joinpath(*rest[:-1], rest[-1] + ".py"), folder.joinpath(*rest, "__init__.py")):
                found = folder
        if found is None:
            break
        root, root_path = ".".join(parts[:depth]), found
    return root, root_path


def locate(name: str, contender: Contender) -> Located:
    """Where contender ``name`` is defined, in which git repository (UsageError when in none)."""
    module_name, attr = _object_path(name, contender)
    module = importlib.import_module(module_name)
    if getattr(module, "__file__", None) is None:
        raise UsageError(f"--impl {name}: its module {module_name} has no file to take from another revision")
    file = Path(str(module.__file__)).resolve()
    done = _git(file.parent, "rev-parse", "--show-toplevel")
    if done.returncode != 0:
        raise UsageError(
            f"--impl {name}: its module {file} is not in a git repository (install it editable from its clone)"
        )
    repo = Path(done.stdout.decode().strip()).resolve()
    if _git(repo, "ls-files", "--error-unmatch", str(file)).returncode != 0:
        if _git(repo, "check-ignore", "-q", str(file)).returncode != 0:  # a new module of the author's, not added
            raise UsageError(
                f"--impl {name}: its module {file} is untracked in the git repository {repo}, so no revision has "
                f"a version of it to compare with; commit it and give a --base that has it, or compare two "
                f"registered contenders with --a and --b"
            )
        raise UsageError(  # e.g. a plain install into a venv inside a clone
            f"--impl {name}: its module {file} is not in a git repository that tracks it (it lies inside {repo}, "
            "ignored by git; install it editable from its clone)"
        )
    root, root_path = _package_root(module_name, file)
    if repo not in root_path.parents:
        raise UsageError(f"--impl {name}: its package {root} ({root_path}) lies outside the repository {repo}")
    return Located(module_name, attr, root, root_path, repo)


def resolve(repo: Path, rev: str) -> str:
    """The full commit id REV names in ``repo``; UsageError when it names none."""
    done = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode != 0 or not rev:
        raise UsageError(f"--base {rev!r}: not a commit of the repository {repo}")
    return done.stdout.decode().strip()


def extract(located: Located, commit: str, into: Path) -> Path:
    """The package root's files as they were at ``commit``, written under ``into``; returns the root's path."""
    relative = located.root_path.relative_to(located.repo)
    done = _git(located.repo, "archive", "--format=tar", commit, "--", relative.as_posix())
    if done.returncode != 0:
        raise UsageError(f"--base {commit[:12]}: {relative} does not exist at that commit of {located.repo}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        if hasattr(tarfile, "data_filter"):  # Python ≥ 3.10.12: refuse links and paths out of the folder
            archive.extractall(into, filter="data")
        else:  # pragma: no cover - older Pythons; git archive writes only the repository's own paths
            archive.extractall(into)
    return into / relative


def copy_built_extensions(located: Located, base_root: Path) -> list[str]:
    """Copy into the extracted root the extension modules (``.so``, ``.pyd``) of the working tree's root that
    git does not track — built in place, so no revision has them — and return their paths, relative to the
    repository: the base version runs the working tree's build of them."""
    if not located.root_path.is_dir():
        return []
    tracked = _git(located.repo, "ls-files", "-z", "--", located.root_path.relative_to(located.repo).as_posix())
    known = {located.repo / name for name in tracked.stdout.decode().split("\0") if name}
    copied = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for built in sorted(located.root_path.rglob(f"*{suffix}")):
            if built in known or any(part.startswith(".") for part in built.relative_to(located.root_path).parts):
                continue
            target = base_root / built.relative_to(located.root_path)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, target)
                copied.append(built.relative_to(located.repo).as_posix())
    return copied


def _under(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


class _Overlay(types.ModuleType):
    """A package above the root as the base code sees it: the real one, but for the one attribute on the
    way to the root (``attnbench`` whose ``impls`` is the base's), so ``import attnbench.impls.x`` followed
    by ``attnbench.impls.x.f`` reaches the base's ``x``."""

    def __init__(self, real: types.ModuleType, child: str, value: types.ModuleType) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_overlay_real"] = real
        self.__dict__[child] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_overlay_real"], name)


HELPER = "__attnbench_base_module__"  # the name the rewritten imports call, in each base module's globals


class _Router:
    """Where the base version's imports go: names under ``root`` to ``alias``, the rest where they were."""

    def __init__(self, root: str, alias: str) -> None:
        self.root, self.alias = root, alias
        self._overlays: dict[str, types.ModuleType] = {}

    def real(self, name: str) -> str:
        return self.root + name[len(self.alias) :] if _under(name, self.alias) else name

    def mapped(self, name: str) -> str:
        return self.alias + name[len(self.root) :] if _under(name, self.root) else name

    def above(self, name: str) -> bool:
        """Whether ``name`` is a package the root lies in (``attnbench`` for ``attnbench.impls``)."""
        return self.root.startswith(name + ".")

    def module(self, name: str, whole: bool) -> types.ModuleType:
        """What an import statement the rewrite could not express binds, at run time: ``import NAME`` binds
        NAME's top package (``whole=False``); ``import NAME as x`` and ``from A import n`` bind NAME itself.
        A package the root lies in comes as an :class:`_Overlay`, the root as the base's module."""
        importlib.import_module(self.mapped(name))
        return self.overlay(name if whole else name.partition(".")[0])

    def overlay(self, name: str) -> types.ModuleType:
        if _under(name, self.root):
            return sys.modules[self.mapped(name)]
        if not self.above(name):
            return sys.modules[name]
        if name not in self._overlays:
            child = self.root[len(name) + 1 :].partition(".")[0]
            self._overlays[name] = _Overlay(sys.modules[name], child, self.overlay(f"{name}.{child}"))
        return self._overlays[name]


class _Rewrite(ast.NodeTransformer):
    """A base module's import statements, rewritten before it is compiled so that the interpreter's own import
    does the routing — nothing of ours runs when the statement does, so a call costs what it cost:

    * ``from root.x import f`` → ``from _attnbench_base_N.x import f``; ``import root.x as m`` likewise;
    * a relative import that stays inside the root is left as it is (it resolves against the module's own
      package, under the base name); one that climbs above the root becomes the absolute import it meant;
    * what binds a package the root lies in, or binds the root's top name (``import attnbench.impls.x``,
      ``from attnbench import impls``), becomes an assignment from ``HELPER`` (:meth:`_Router.module`)."""

    def __init__(self, router: _Router, package: str) -> None:
        self.router, self.package = router, package  # the module's package, by its real name

    def _helper(self, bound: str, name: str, whole: bool, node: ast.stmt) -> ast.stmt:
        call = ast.Call(ast.Name(HELPER, ast.Load()), [ast.Constant(name), ast.Constant(whole)], [])
        return ast.copy_location(ast.Assign([ast.Name(bound, ast.Store())], call), node)

    def visit_Import(self, node: ast.Import) -> list[ast.stmt]:
        router, kept, out = self.router, [], []
        for name in node.names:
            top = name.name.partition(".")[0]
            if name.asname and _under(name.name, router.root):
                kept.append(ast.alias(router.mapped(name.name), name.asname))
            elif name.asname and router.above(name.name):
                out.append(self._helper(name.asname, name.name, True, node))
            elif not name.asname and (_under(name.name, router.root) or router.above(top) or top == router.root):
                out.append(self._helper(top, name.name, False, node))
            else:
                kept.append(name)
        if kept:
            out.insert(0, ast.copy_location(ast.Import(kept), node))
        return out

    def visit_ImportFrom(self, node: ast.ImportFrom) -> list[ast.stmt] | ast.ImportFrom:
        router = self.router
        if node.level:
            parts = self.package.split(".") if self.package else []
            if node.level > len(parts):
                return node  # beyond the top package: let the import say so
            target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if _under(target, router.root):
            if node.level:
                return node  # resolves inside the base's package by itself
            return ast.copy_location(ast.ImportFrom(router.mapped(target), node.names, 0), node)
        if not router.above(target):
            return node if not node.level else ast.copy_location(ast.ImportFrom(target, node.names, 0), node)
        kept, out = [], []  # `from attnbench import impls, kv_cache`: impls is the base's, kv_cache as it was
        for name in node.names:
            full = f"{target}.{name.name}"
            if name.name != "*" and (_under(full, router.root) or router.above(full)):
                out.append(self._helper(name.asname or name.name, full, True, node))
            else:
                kept.append(name)
        if kept:
            out.insert(0, ast.copy_location(ast.ImportFrom(target, kept, 0), node))
        return out


class _BaseLoader(importlib.machinery.SourceFileLoader):
    """A base module's loader: its source compiled with its imports rewritten (:class:`_Rewrite`), never
    from or into a bytecode cache, and the helper they call put in its globals."""

    def __init__(self, fullname: str, path: str, router: _Router) -> None:
        super().__init__(fullname, path)
        self.router = router

    def get_code(self, fullname: str) -> types.CodeType:
        path = self.get_filename(fullname)
        package = fullname if self.is_package(fullname) else fullname.rpartition(".")[0]
        tree = _Rewrite(self.router, self.router.real(package)).visit(ast.parse(self.get_data(path), path))
        return compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__[HELPER] = self.router.module
        super().exec_module(module)


_routers: dict[str, _Router] = {}  # alias → its router


class _BaseFinder(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path``: finds ``_attnbench_base_N…`` modules in their extracted folder, as the path finder
    does, and loads their sources with :class:`_BaseLoader`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        router = _routers.get(fullname.partition(".")[0])
        if router is None or path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _BaseLoader(fullname, str(spec.origin), router)
        return spec


_finder = _BaseFinder()


def _load_root(router: _Router, path: Path) -> types.ModuleType:
    """Import the base's root from ``path`` (a package folder, or a module file) under ``router.alias``."""
    alias = router.alias
    if path.is_dir() and not (path / "__init__.py").is_file():  # a namespace package: a search path is enough
        sys.modules[alias] = module = types.ModuleType(alias)
        module.__path__ = [str(path)]
        return module
    file = path / "__init__.py" if path.is_dir() else path
    search = [str(path)] if path.is_dir() else None
    loader = _BaseLoader(alias, str(file), router)
    spec = importlib.util.spec_from_file_location(alias, file, loader=loader, submodule_search_locations=search)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(alias, None)
        raise
    return module


def _gone_core_module(exc: BaseException) -> str | None:
    """The attnbench module an old revision imports that this attnbench no longer has (``attnbench.kv_cache``,
    from before the core moved into rooms), or None when the import failed for another reason."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.startswith("attnbench."):
        return exc.name
    missing = re.match(r"cannot import name '(\w+)' from 'attnbench' ", str(exc))
    if isinstance(exc, ImportError) and exc.name == "attnbench" and missing:  # `from attnbench import kv_cache`
        return f"attnbench.{missing.group(1)}"
    return None


def import_base(name: str, located: Located, base_root: Path) -> Contender:
    """Contender ``name`` built from the package extracted at ``base_root`` (see the module docstring)."""
    alias = f"{ALIAS_PREFIX}{next(_counter)}"
    router = _Router(located.root, alias)
    _routers[alias] = router
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    try:
        _load_root(router, base_root)
        found: object = importlib.import_module(alias + located.module[len(located.root) :])
        for part in located.attr.split("."):
            found = getattr(found, part)
    except Exception as exc:  # the old code may fail to import in any way; say so in one line
        gone = _gone_core_module(exc)
        if gone is not None:
            raise UsageError(
                f"--impl {name}: its base version imports {gone}, a module this attnbench does not have "
                "(the core's modules moved into rooms: see the Layout section of the README)"
            ) from exc
        why = one_line(f"{type(exc).__name__}: {readable(str(exc))}")
        raise UsageError(f"--impl {name}: its base version did not import: {why}") from exc
    try:
        return as_contender(found, name)
    except TypeError as exc:
        raise UsageError(f"--impl {name}: its base version is not a contender: {exc}") from exc


def real_module_name(module_name: str) -> str:
    """``_attnbench_base_1.kernel`` as the package names it (``myplugin.kernel``); other names unchanged."""
    router = _routers.get(module_name.partition(".")[0])
    return router.real(module_name) if router is not None else module_name


def readable(text: str) -> str:
    """A message about base modules with their package's names (``No module named 'myplugin.x'``)."""
    for alias, router in _routers.items():
        text = re.sub(rf"\b{alias}\b", router.root, text)
    return text


def unchanged(located: Located, commit: str) -> bool:
    """Whether the package root's files are the same at ``commit`` and in the working tree: no tracked file
    differs (staged or not) and no untracked one (not ignored) was added — bytecode caches and built extensions
    aside (the base runs the working tree's build, :func:`copy_built_extensions`)."""
    relative = located.root_path.relative_to(located.repo).as_posix()
    if _git(located.repo, "diff", "--quiet", commit, "--", relative).returncode != 0:
        return False
    added = _git(located.repo, "ls-files", "--others", "--exclude-standard", "-z", "--", relative)
    built = (".pyc", *importlib.machinery.EXTENSION_SUFFIXES)
    sources = [name for name in added.stdout.decode().split("\0") if name and not name.endswith(built)]
    return added.returncode == 0 and not sources


def orientation(name: str, located: Located, commit: str, rev: str) -> list[str]:
    """What REV resolved to (the repository and the commit the base version comes from), and, when the package's
    files are the same there as in the working tree, that the run is an A/A: one line each."""
    relative = located.root_path.relative_to(located.repo).as_posix()
    said = [f"A = {name}@{rev}: {located.root} ({relative}) at commit {commit[:12]} ({rev}) of {located.repo}"]
    if unchanged(located, commit):
        said.append(
            f"{name}'s files are the same at {rev} and in the working tree: this run is an A/A (nothing in "
            f"{relative} differs from commit {commit[:12]}; edit the working tree or give another --base to compare)"
        )
    return said


def notes(located: Located, commit: str, rev: str, copied: list[str]) -> list[str]:
    """One line each for what of the base version is not the base revision's: the built extensions copied
    from the working tree, and the files outside the package root that this process loaded and that changed
    between REV and the working tree (the base runs them as they are now)."""
    said = []
    if copied:
        said.append(f"{rev}: {', '.join(copied)} not in git; the base version uses the working tree's build of it")
    relative = located.root_path.relative_to(located.repo).as_posix()
    done = _git(located.repo, "diff", "--name-only", "-z", commit, "--", ".", f":(exclude){relative}")
    changed = {located.repo / name for name in done.stdout.decode().split("\0") if name}
    loaded = {Path(str(m.__file__)).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    outside = sorted(path.relative_to(located.repo).as_posix() for path in changed & loaded)
    if outside:
        shown = ", ".join(outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
        said.append(f"{rev}: outside {relative}/, the base version runs the working tree's {shown} (changed since)")
    return said
