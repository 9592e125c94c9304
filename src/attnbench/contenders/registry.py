"""One registry for built-in and third-party contenders.

Both come through the entry-point group ``attnbench.impls`` (the built-ins are listed in attnbench's own
pyproject). :func:`register` adds one in-process — handy in a notebook or a test — and goes through the
same validation. A plugin that fails to import, or whose object is not a contender, is listed as
unavailable with its error; it does not disturb the others. Two contenders with one name are an error
naming both sources.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TypeVar

from attnbench import errors
from attnbench.contenders.contract import Contender
from attnbench.errors import UsageError

GROUP = "attnbench.impls"


class RegistryError(UsageError):
    """Two contenders share a name, or a name cannot be used."""


@dataclass(frozen=True)
class Entry:
    """A registered contender, or the reason it could not be loaded or cannot run here.

    Whether a loaded contender can run here is asked of it (``availability()``) the first time that matters,
    not when the registry loads: a probe can cost much (fused_cpu's probe builds its C++ library, about 20 s
    the first time on a machine), and a run or an error that does not involve the contender should not wait for it.
    """

    name: str
    source: str
    contender: Contender | None
    load_failure: str | None = None

    @functools.cached_property
    def unavailable_reason(self) -> str | None:
        if self.contender is None:
            return self.load_failure or "failed to load"
        try:
            return self.contender.availability()
        except Exception as exc:  # an availability probe that raises means "not available", with why
            return f"availability check raised {errors.reason(exc)}"

    @property
    def available(self) -> bool:
        return self.contender is not None and self.unavailable_reason is None


_registered: dict[str, Entry] = {}  # from register(), kept across reloads
_cache: dict[str, Entry] | None = None


def _check_name(name: str, source: str) -> None:
    if not name or any(c.isspace() or c == "," for c in name):
        raise RegistryError(f"contender name {name!r} from {source} is not allowed: no commas or spaces, not empty")


def _as_contender(obj: object, name: str) -> Contender:
    """Accept a Contender instance or a Contender subclass (instantiated); else raise TypeError."""
    if inspect.isclass(obj) and issubclass(obj, Contender):
        obj = obj()
    if not isinstance(obj, Contender):
        raise TypeError(f"{name}: expected an attnbench.Contender instance or subclass, got {type(obj).__name__}")
    if obj.name != name:
        raise TypeError(f"entry-point name {name!r} differs from the contender's name {obj.name!r}")
    return obj


as_contender = _as_contender  # public: the A/B command checks a contender taken from another git revision


def _folder_without_code(module: str, exc: BaseException) -> str | None:
    """Where the entry point's module, or a package above it, was imported as a folder without code (a namespace
    package: no ``__init__.py``, no ``__file__``) — how a plugin's project folder in the current directory
    shadows the installed plugin of the same name under ``python -m`` — and the failure is that folder's (no
    attribute of it, no module under it), said in a clause; else None: a namespace package is also a plain way to
    ship plugins, and one that fails for its own reason (a missing dependency) is shadowed by nothing."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        found = sys.modules.get(name)
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        its_own = (isinstance(exc, AttributeError) and f"module {name!r} has no attribute" in str(exc)) or (
            missing is not None and missing.startswith(f"{name}.")
        )
        if found is not None and getattr(found, "__file__", None) is None and hasattr(found, "__path__") and its_own:
            folders = ", ".join(str(Path(folder).resolve()) for folder in found.__path__)
            return (
                f"module {name!r} resolved to a folder without code, {folders} (a namespace package: a folder of "
                f"that name in the current directory or on sys.path shadows the installed {name}; run from "
                "another directory)"
            )
    return None


def _make_entry(name: str, source: str, loader: Callable[[], object], module: str | None = None) -> Entry:
    """Build an Entry, turning any failure to load into an unavailable reason (a failed probe becomes one
    when it is first asked). ``module``: the entry point's, to say when it resolved to a folder without code."""
    try:
        contender = _as_contender(loader(), name)
    except (Exception, SystemExit) as exc:  # a plugin's import can fail in any way, sys.exit() too (a script's
        # module): it must not take the others down, nor end attnbench without a word
        shadowed = _folder_without_code(module, exc) if module else None
        said = errors.reason(exc, code=module)  # with the line of the plugin's own code that failed, if any
        why = f"{shadowed} — {said}" if shadowed else said
        return Entry(name, source, None, f"failed to load: {why}")
    return Entry(name, source, contender)


def _source(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f" ({dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {ep.name} = {ep.value}{where}"


def _add(entries: dict[str, Entry], entry: Entry) -> None:
    _check_name(entry.name, entry.source)
    if entry.name in entries:
        raise RegistryError(
            f"contender name {entry.name!r} is registered twice: by {entries[entry.name].source} and by {entry.source}"
        )
    entries[entry.name] = entry


HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held while the plugins import, and delivered once they are done. A
    KeyboardInterrupt raised inside an extension's import cannot unwind through its C++ frames: a Ctrl-C in the
    second Triton took to import (nanobind calling back into Python) aborted the process (``terminate called after
    throwing an instance of 'nanobind::python_error'``, exit 134, a core dump) instead of saying "interrupted".
    Main thread only (``signal`` allows no other); a signal ignored, or handled outside Python, is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    for signum in HELD_SIGNALS:
        if signal.getsignal(signum) not in (signal.SIG_IGN, None):
            previous[signum] = signal.signal(signum, lambda received, frame: pending.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:  # as it would have landed: KeyboardInterrupt, or the default's exit for SIGTERM
            signal.raise_signal(pending[0])


def load(refresh: bool = False) -> dict[str, Entry]:
    """All contenders by name (a copy), loading entry points on first use."""
    global _cache
    if _cache is None or refresh:
        entries: dict[str, Entry] = {}
        with _signals_held():
            for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
                _add(entries, _make_entry(ep.name, _source(ep), ep.load, ep.module))
        for entry in _registered.values():
            _add(entries, entry)
        _cache = entries
    return dict(_cache)


def declared_names() -> list[str]:
    """The names of the installed contenders' entry points, in the registry's order, without loading them."""
    return sorted({ep.name for ep in metadata.entry_points(group=GROUP)})


C = TypeVar("C", bound="Contender | type[Contender]")


def register(obj: C) -> C:
    """Register a contender in this process: decorate a Contender class, or call with an instance.

    Registering a class of the same module and name again replaces the earlier one — a notebook cell run again,
    the class edited — where any other second contender of a name is an error naming both."""
    contender = _as_contender(obj, obj.name)
    module = getattr(obj, "__module__", "?")
    entry = _make_entry(contender.name, f"register() in {module}", lambda: contender)
    existing = load()
    earlier = _registered.get(entry.name)
    if earlier is not None and earlier.contender is not None and _same_class(earlier.contender, contender):
        existing.pop(entry.name)
    _add(existing, entry)  # raises on a duplicate name before anything is kept
    _registered[entry.name] = entry
    if _cache is not None:
        _cache[entry.name] = entry
    return obj


def _same_class(old: Contender, new: Contender) -> bool:
    """Whether two contenders' classes have one module and qualified name (a class defined again)."""
    return (type(old).__module__, type(old).__qualname__) == (type(new).__module__, type(new).__qualname__)


def class_reference(contender: Contender) -> tuple[str | None, str]:
    """``("module:qualname", "")`` for the contender's class when another process can import it by that
    reference, else ``(None, why not)``: a class defined in ``__main__`` (a notebook, a script) or inside a
    function has no such reference. The worker process re-creates the contender from it (no arguments)."""
    cls = type(contender)
    module, qualname = cls.__module__, cls.__qualname__
    if module == "__main__":
        return None, f"its class {qualname} is defined in __main__ (a notebook or a script)"
    if "<locals>" in qualname:
        return None, f"its class {module}.{qualname} is defined inside a function"
    try:
        found: object = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        return None, f"its class cannot be imported as {module}:{qualname} ({errors.reason(exc)})"
    if found is not cls:
        return None, f"{module}:{qualname} names another object than its class"
    return f"{module}:{qualname}", ""


def in_process_references() -> tuple[dict[str, str], dict[str, str]]:
    """Contenders added with :func:`register`, split into ``({name: "module:qualname"}, {name: why not})``."""
    references, problems = {}, {}
    for name, entry in _registered.items():
        if entry.contender is None:
            continue
        reference, why = class_reference(entry.contender)
        if reference is None:
            problems[name] = why
        else:
            references[name] = reference
    return references, problems


def register_reference(reference: str) -> None:
    """Import ``module:qualname`` and register the class (used in the worker process)."""
    module, _, qualname = reference.partition(":")
    found: object = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not (inspect.isclass(found) and issubclass(found, Contender)):
        raise TypeError(f"{reference} is not an attnbench.Contender subclass")
    if found.name not in load():  # already there when the module registers it on import
        register(found)


def unregister(name: str) -> None:
    """Remove an in-process registration (tests use this to clean up)."""
    _registered.pop(name, None)
    if _cache is not None:
        _cache.pop(name, None)


def sweep_names() -> list[str]:
    """What ``impl = "all"`` means: every attention contender, and every plugin that failed to load (so
    its failure shows). Contenders of another kind (scoring functions) are named explicitly."""
    return sorted(n for n, e in load().items() if e.contender is None or e.contender.kind == "attention")


def available_sweep_names() -> list[str]:
    """What ``impl = "available"`` means: the attention contenders that can run on this machine."""
    entries = load()
    return [n for n in sweep_names() if entries[n].available]


def get(name: str) -> Entry:
    """One contender by name; unknown names are a UsageError listing the known ones."""
    entries = load()
    if name not in entries:
        raise UsageError(f"contender {name!r} is not known; known: {', '.join(sorted(entries))}")
    return entries[name]
