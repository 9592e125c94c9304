"""A contender as it was at another git revision, imported beside the working tree's in this process.

``attnbench ab --impl NAME --base REV`` needs both versions of one contender alive at once. The steps:

1. find the module that defines the contender: its entry point's module (``module:attr``), else the
   module of its class (contenders added with ``register()``);
2. find the git repository holding that file (``git rev-parse --show-toplevel``); a contender installed
   from a wheel into site-packages has none, and that is bad input;
3. find the *package root*: the outermost package whose folder holds the module at its dotted path
   (``attnbench.impls`` for ``attnbench.impls.fused_cpu``, ``myplugin`` for ``myplugin.kernel``; the
   module itself when it is a top-level file);
4. extract that folder as it was at REV (``git archive REV -- FOLDER``) into a temporary folder;
5. import it under its own name while the working tree's copies are hidden from ``sys.modules``, so that
   every import the base code makes *at import time* of its own package — relative (``from .work import
   f``) or absolute (``from myplugin.work import f``) — gets the base file; then put the working tree's
   modules back and keep the base ones under ``_attnbench_base_N…`` names.

Native code follows by itself when the package finds its sources beside its files: attnbench's
``fused_cpu`` at REV compiles REV's C++ from the extracted folder, and ``native_build`` keys each library
by its sources' contents, so the two builds are two libraries, both loaded.

Limits: imports made later, inside functions (``prepare`` importing a sibling module lazily), resolve to
the working tree; code outside the package root (attnbench's core, another package of the repository)
is the working tree's; the module the entry point names must exist under that name at REV; the base
version's classes keep their module names (``myplugin.kernel``), so they cannot be pickled — the A/B
command times both in this one process and needs no worker.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import itertools
import subprocess
import sys
import tarfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from attnbench.contender import Contender
from attnbench.errors import UsageError
from attnbench.registry import GROUP, as_contender

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
    """The outermost package whose folder holds ``file`` at the module's dotted path, and that folder."""
    parts = module_name.split(".")
    root, root_path = module_name, file
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


def _under(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


@contextmanager
def _hidden(root: str) -> Iterator[dict[str, types.ModuleType]]:
    """Take ``root`` and its submodules out of ``sys.modules`` (and the parent's attribute) for the block;
    yields a dict that receives the modules imported under ``root`` meanwhile, then restores the originals."""
    saved = {name: module for name, module in sys.modules.items() if _under(name, root)}
    parent_name, _, child = root.rpartition(".")
    parent = sys.modules.get(parent_name) if parent_name else None
    missing = object()
    attribute = getattr(parent, child, missing) if parent is not None else missing
    for name in saved:
        del sys.modules[name]
    imported: dict[str, types.ModuleType] = {}
    try:
        yield imported
    finally:
        for name in [name for name in sys.modules if _under(name, root)]:
            imported[name] = sys.modules.pop(name)
        sys.modules.update(saved)
        if parent is not None and attribute is not missing:
            setattr(parent, child, attribute)


def _load_root(root: str, path: Path) -> None:
    """Import ``root`` from ``path`` (a package folder, or a module file) into ``sys.modules``."""
    if path.is_dir():
        init = path / "__init__.py"
        if init.is_file():
            spec = importlib.util.spec_from_file_location(root, init, submodule_search_locations=[str(path)])
        else:  # a namespace package: a module object with a search path is enough
            sys.modules[root] = module = types.ModuleType(root)
            module.__path__ = [str(path)]
            return
    else:
        spec = importlib.util.spec_from_file_location(root, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[root] = module
    spec.loader.exec_module(module)


def import_base(name: str, located: Located, base_root: Path) -> Contender:
    """Contender ``name`` built from the package extracted at ``base_root`` (see the module docstring)."""
    alias = f"_attnbench_base_{next(_counter)}"
    with _hidden(located.root) as imported:
        try:
            _load_root(located.root, base_root)
            found: object = importlib.import_module(located.module)
            for part in located.attr.split("."):
                found = getattr(found, part)
        except Exception as exc:  # the old code may fail to import in any way; say so in one line
            raise UsageError(f"--impl {name}: its base version did not import: {type(exc).__name__}: {exc}") from exc
    for module_name, module in imported.items():  # keep them alive, out of the way of the working tree's
        sys.modules[alias + module_name[len(located.root) :]] = module
    try:
        return as_contender(found, name)
    except TypeError as exc:
        raise UsageError(f"--impl {name}: its base version is not a contender: {exc}") from exc
