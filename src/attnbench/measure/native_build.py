"""Build a C++ source into a shared library at first use, cache it, load it with ctypes: no build system.

A source with a plain C entry point needs neither torch's headers nor pybind11: one compiler call builds a
shared library that ctypes loads. It is compiled with the first of ``VARIANTS`` that works (``-march=native``
for this CPU's vectors and ``-fopenmp`` first, then without each: a compiler may lack either) and cached
under ``$ATTNBENCH_CACHE_DIR/kernels`` (default ``~/.cache/attnbench/kernels``) as ``NAME-KEY.so``, KEY
hashing the source, the compiler's version line, the flags and the CPU's feature flags, so a cache shared
between machines never hands one a binary built for another. The library is written to a temporary file
and renamed into place, so a concurrent process sees either nothing or the whole library. ``$CXX`` picks
the compiler (default ``g++``).

Whatever goes wrong (no compiler, a compile error, a library that won't load) becomes a
:class:`BuildError` whose message is the reason in one line; callers turn it into an ``unavailable``
status or a recorded fallback, never a crash. A library built with OpenMP binds to the OpenMP runtime
torch has already loaded (``libgomp.so.1``), so its threads are torch's own pool, not a second team
competing for the cores.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-pthread")
VARIANTS: tuple[tuple[str, ...], ...] = (("-march=native", "-fopenmp"), ("-fopenmp",), ("-march=native",), ())
COMPILE_TIMEOUT_S = 180


class BuildError(RuntimeError):
    """The library could not be built or loaded here; the message is the reason, in one line."""


@dataclass(frozen=True)
class Library:
    """A loaded shared library, the file it came from and the flags it was compiled with."""

    library: ctypes.CDLL
    path: Path
    flags: tuple[str, ...]

    @property
    def openmp(self) -> bool:
        return "-fopenmp" in self.flags


def cache_dir() -> Path:
    """``$ATTNBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/attnbench``, else ``~/.cache/attnbench``."""
    root = os.environ.get("ATTNBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attnbench"
    )
    return Path(root)


TUNING_DIR_ENV = "ATTNBENCH_TUNING_DIR"


def tuning_dir() -> Path:
    """Where contenders keep what they tuned (fused_triton's tiles, under ``tiles/``): ``$ATTNBENCH_TUNING_DIR``,
    else ``cache_dir()``. ``attnbench ab`` points it at a folder of its own (``fresh_tuning_dir``), so both sides
    tune in the same run instead of one reusing a choice an earlier process made."""
    return Path(os.environ.get(TUNING_DIR_ENV) or cache_dir())


@contextlib.contextmanager
def fresh_tuning_dir() -> Iterator[Path]:
    """An empty ``tuning_dir()`` for the block (``$ATTNBENCH_TUNING_DIR`` set to a temporary folder, removed
    after, the variable as it was)."""
    previous = os.environ.get(TUNING_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix="attnbench-tuning-", ignore_cleanup_errors=True) as folder:
        os.environ[TUNING_DIR_ENV] = folder
        try:
            yield Path(folder)
        finally:
            if previous is None:
                os.environ.pop(TUNING_DIR_ENV, None)
            else:
                os.environ[TUNING_DIR_ENV] = previous


def cpu_flags_line() -> str:
    """The CPU's feature-flags line from /proc/cpuinfo (``flags`` on x86, ``Features`` on ARM), else the
    processor's name: what a cached binary built with ``-march=native`` depends on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (``avx512f``, ``avx512_bf16``, ``amx_bf16`` …)."""
    line = cpu_flags_line()
    return frozenset(line.split(":", 1)[1].split()) if ":" in line else frozenset()


def compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return compiler  # the compile itself will then fail and say why
    return done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else compiler


def compile_library(compiler: str, sources: tuple[Path, ...], flags: tuple[str, ...], target: Path) -> str | None:
    """Compile ``sources`` into one library ``target``, atomically; None on success, else the compiler's first
    error line."""
    try:  # a cache folder that cannot be written (a read-only HOME, a file in the way) is a reason, not a crash
        target.parent.mkdir(parents=True, exist_ok=True)
        building = tempfile.TemporaryDirectory(dir=target.parent)
    except OSError as exc:
        return (
            f"cannot write the cache folder {target.parent} ({exc.strerror or exc}); set ATTNBENCH_CACHE_DIR to a "
            "folder you can write in"
        )
    with building as tmp:
        partial = Path(tmp) / target.name
        try:
            done = subprocess.run(
                [compiler, *flags, *map(str, sources), "-o", str(partial)],
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"{compiler} took longer than {COMPILE_TIMEOUT_S} s"
        except OSError as exc:
            return f"{compiler} could not run: {exc}"
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
            return f"{compiler} failed: {errors[0].strip() if errors else f'exit {done.returncode}'}"
        os.replace(partial, target)  # atomic: a concurrent worker sees the old state or the whole library
    return None


def load_library(name: str, sources: Path | tuple[Path, ...], headers: tuple[Path, ...] = ()) -> Library:
    """``sources`` built into one library (or found in the cache) and loaded; raises BuildError with the reason
    when it can't. ``headers`` they include are part of the build's identity.

    Built once per process per compiler (``$CXX``) and cache folder: a failure is remembered too, so a missing
    compiler is not retried for every caller."""
    files = sources if isinstance(sources, tuple) else (sources,)
    built = _build(name, files, headers, os.environ.get("CXX", "g++"), str(cache_dir()))
    if isinstance(built, str):
        raise BuildError(built)
    return built


def _say_building(name: str, compiler: str, folder: Path) -> None:
    """One line on stderr before a compile: a first run otherwise sits silent for it (fused_cpu: about 20 s on a
    2-vCPU Xeon, before a progress bar can show)."""
    print(f"attnbench: building {name} for this CPU with {compiler}, once (cached in {folder}) …", file=sys.stderr)


@functools.cache
def _build(name: str, sources: tuple[Path, ...], headers: tuple[Path, ...], compiler: str, cache: str) -> Library | str:
    if platform.system() == "Windows":
        return f"{name} is built with g++/clang++ on Linux or macOS; not on Windows"
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} not found (install g++ or set $CXX)"
    identity = [
        *(path.read_bytes() for path in sources + headers),
        compiler_version(compiler).encode(),
        cpu_flags_line().encode(),
    ]
    failures: list[str] = []
    for variant in VARIANTS:
        flags = FLAGS + variant
        key = hashlib.sha256(b"\0".join([*identity, " ".join(flags).encode()])).hexdigest()[:16]
        target = Path(cache) / "kernels" / f"{name}-{key}.so"
        if not target.exists():
            if not failures:  # said once, not again for each fallback variant
                _say_building(name, compiler, target.parent)
            failure = compile_library(compiler, sources, flags, target)
            if failure is not None:
                failures.append(failure)
                continue
        try:
            library = ctypes.CDLL(str(target))
        except OSError as exc:
            failures.append(f"built {target.name} but could not load it: {exc}")
            continue
        return Library(library, target, flags)
    return f"could not build {name} ({'; '.join(dict.fromkeys(failures))})"  # each reason once, not per variant
