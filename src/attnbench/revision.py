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
  go through an ``__import__`` of the base's own: each base module is executed with a ``__builtins__``
  whose ``__import__`` maps ``root…`` to ``_attnbench_base_N…`` (a loader on ``sys.meta_path`` that
  answers only for ``_attnbench_base_`` names gives each module it). Nothing is swapped in or out of
  ``sys.modules`` around a call, so code that imports nothing costs what it cost; an import statement
  that runs inside the timed call pays one Python call more (well under a microsecond; see the test).

Native code follows by itself when the package finds its sources beside its files: attnbench's
``fused_cpu`` at REV compiles REV's C++ from the extracted folder, and ``native_build`` keys each library
by its sources' contents, so the two builds are two libraries, both loaded.

Limits, each said in one line before anything is timed (:func:`notes`): code outside the package root
(attnbench's core, another package of the repository) is the working tree's — the files of it that the
run loaded and that changed since REV are named; a built extension git does not track is the working
tree's build. ``importlib.import_module("myplugin.x")`` called by the base code is not routed (the import
statement is). The module the entry point names must exist under that name at REV. The base version's
classes live under the ``_attnbench_base_N`` names, so they cannot be pickled — the A/B command times both
in this one process and needs no worker.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import itertools
import shutil
import subprocess
import sys
import tarfile
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from attnbench.contender import Contender
from attnbench.errors import UsageError
from attnbench.registry import GROUP, as_contender

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
    if _git(repo, "ls-files", "--error-unmatch", str(file)).returncode != 0:  # e.g. a venv inside a clone
        raise UsageError(
            f"--impl {name}: its module {file} is not in a git repository that tracks it (it lies inside {repo}, "
            "untracked; install it editable from its clone)"
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


_real_import = builtins.__import__


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


class _Router:
    """The base version's ``__import__``: names under ``root`` go to ``alias``; relative imports resolve
    against the real package name first, so one that climbs above the root reaches the real parent."""

    def __init__(self, root: str, alias: str, commit: str) -> None:
        self.root, self.alias, self.commit = root, alias, commit
        self.builtins = dict(builtins.__dict__, __import__=self.import_)
        self._overlays: dict[str, types.ModuleType] = {}

    def real(self, name: str) -> str:
        return self.root + name[len(self.alias) :] if _under(name, self.alias) else name

    def _absolute(self, name: str, globals_: dict[str, Any] | None, level: int) -> str:
        globals_ = globals_ or {}
        package = globals_.get("__package__")
        if package is None:
            module_name = str(globals_.get("__name__", ""))
            package = module_name if "__path__" in globals_ else module_name.rpartition(".")[0]
        parts = self.real(package).split(".")
        if not package or level > len(parts):
            raise ImportError("attempted relative import beyond top-level package")
        base = ".".join(parts[: len(parts) - level + 1])
        return f"{base}.{name}" if name else base

    def import_(
        self,
        name: str,
        globals: dict[str, Any] | None = None,  # __import__'s own parameter names
        locals: Any = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> types.ModuleType:
        if level > 0:
            name = self._absolute(name, globals, level)
        top = name.partition(".")[0]
        if _under(name, self.root):
            try:
                module = _real_import(self.alias + name[len(self.root) :], globals, locals, fromlist, 0)
            except ModuleNotFoundError as exc:
                if exc.name is None or not _under(exc.name, self.alias):
                    raise
                missing = self.real(exc.name)
                raise ModuleNotFoundError(f"No module named {missing!r} at {self.commit[:12]}", name=missing) from None
            return module if fromlist else self.overlay(top)
        module = _real_import(name, globals, locals, fromlist, 0)
        if fromlist:
            return self.overlay(name) if self.root.startswith(name + ".") else module
        return self.overlay(top) if self.root.startswith(top + ".") else module

    def overlay(self, name: str) -> types.ModuleType:
        """The module ``name`` (the root or a package above it) as the base code must see it."""
        if name == self.root:
            return sys.modules[self.alias]
        if name not in self._overlays:
            child = self.root[len(name) + 1 :].partition(".")[0]
            self._overlays[name] = _Overlay(sys.modules[name], child, self.overlay(f"{name}.{child}"))
        return self._overlays[name]


_routers: dict[str, _Router] = {}  # alias → its router


class _RoutedLoader(importlib.abc.Loader):
    """A source loader's module, executed with its version's ``__builtins__`` (so with its ``__import__``)."""

    def __init__(self, loader: importlib.abc.Loader, router: _Router) -> None:
        self.loader, self.router = loader, router

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self.router.builtins
        self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, …: inspect and linecache use them
        return getattr(self.loader, name)


class _BaseFinder(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path``: finds ``_attnbench_base_N…`` modules in their extracted folder, as the path finder
    does, and hands their source loaders the version's builtins."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        router = _routers.get(fullname.partition(".")[0])
        if router is None or path is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _RoutedLoader(spec.loader, router)
        return spec


_finder = _BaseFinder()


def _load_root(router: _Router, path: Path) -> types.ModuleType:
    """Import the base's root from ``path`` (a package folder, or a module file) under ``router.alias``."""
    alias = router.alias
    if path.is_dir() and not (path / "__init__.py").is_file():  # a namespace package: a search path is enough
        sys.modules[alias] = module = types.ModuleType(alias)
        module.__path__ = [str(path)]
        return module
    if path.is_dir():
        init, search = path / "__init__.py", [str(path)]
        spec = importlib.util.spec_from_file_location(alias, init, submodule_search_locations=search)
    else:
        spec = importlib.util.spec_from_file_location(alias, path)
    assert spec is not None and spec.loader is not None
    spec.loader = _RoutedLoader(spec.loader, router)
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(alias, None)
        raise
    return module


@dataclass(frozen=True)
class Base:
    """The base version: its contender, the name its root was imported under, and what the user must know."""

    contender: Contender
    alias: str
    notes: list[str] = field(default_factory=list)


def import_base(name: str, located: Located, base_root: Path, commit: str = "") -> Base:
    """Contender ``name`` built from the package extracted at ``base_root`` (see the module docstring)."""
    alias = f"{ALIAS_PREFIX}{next(_counter)}"
    router = _Router(located.root, alias, commit)
    _routers[alias] = router
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    try:
        _load_root(router, base_root)
        found: object = importlib.import_module(alias + located.module[len(located.root) :])
        for part in located.attr.split("."):
            found = getattr(found, part)
    except Exception as exc:  # the old code may fail to import in any way; say so in one line
        message = str(exc).replace(alias, located.root).strip().splitlines()
        raise UsageError(
            f"--impl {name}: its base version did not import: {type(exc).__name__}: {message[0] if message else ''}"
        ) from exc
    try:
        contender = as_contender(found, name)
    except TypeError as exc:
        raise UsageError(f"--impl {name}: its base version is not a contender: {exc}") from exc
    return Base(contender, alias)


def real_module_name(module_name: str) -> str:
    """``_attnbench_base_1.kernel`` as the package names it (``myplugin.kernel``); other names unchanged."""
    router = _routers.get(module_name.partition(".")[0])
    return router.real(module_name) if router is not None else module_name


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
