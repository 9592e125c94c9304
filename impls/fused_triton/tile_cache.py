"""Tuned tiles kept on disk: one small JSON file per tuning key, shared by worker processes and runs.

Cases run in worker processes (one per run and per ``--repeat`` pass, a fresh one after a crash), so a choice
kept only in memory is tuned again by every process and every run (issue 37's run, H100 SXM, torch
2.11.0+cu130, triton 3.6.0: fused_triton's ``setup_ms`` was 0.4–30 s per case). This module is the store under
``tiles``' in-memory dictionary; what goes into a key, and when to tune, is ``tiles``' business.

* **Where**: ``$ATTNBENCH_TUNING_DIR/tiles/``, else ``$ATTNBENCH_CACHE_DIR/tiles/`` (default
  ``~/.cache/attnbench/tiles/``; ``attnbench.measure.native_build.tuning_dir``), one file per key,
  ``<label>-<digest>.json``: the label says which kernel (``fwd-…``, ``dq-…``), the digest is the SHA-256 of
  the key's canonical JSON. The file holds the key itself (``"key"``: read back and compared, so a digest
  collision or a stale file can't hand over another key's tile) and the value (``"value"``).
* **Writes are atomic**: the text goes to a temporary file in the same folder, then ``os.replace`` renames
  it over the target, so a reader sees the old file, the new one or none, never half of one. Two processes
  tuning one key at once both time it and the last rename wins; either tile is a measured choice.
* **Nothing here fails a run**: a file that is missing, unreadable, not JSON or for another key reads as
  absent (the caller tunes again and overwrites it); a folder that can't be written (a read-only home) keeps
  the choice in memory only.
* **Clearing**: delete the folder, or ``attnbench.impls.fused_triton.tiles.clear_cache(disk=True)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from attnbench.measure.native_build import tuning_dir

FOLDER = "tiles"


def folder() -> Path:
    """The folder the tuned tiles live in (read from the environment each time: tests and ``ab`` point it
    elsewhere)."""
    return tuning_dir() / FOLDER


def canonical(key: Any) -> str:
    """``key`` as one JSON text, keys sorted, tuples as lists: equal keys give equal texts."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


def path_for(key: Any, label: str) -> Path:
    digest = hashlib.sha256(canonical(key).encode()).hexdigest()[:32]
    return folder() / f"{label}-{digest}.json"


def source_hash(*modules: ModuleType) -> str:
    """SHA-256 (16 hex digits) of the source files of ``modules``: part of a tuning key, so editing a kernel
    invalidates the tiles tuned for it. '' when a source can't be read (then nothing is kept on disk)."""
    digest = hashlib.sha256()
    for module in modules:
        try:
            digest.update(Path(module.__file__ or "").read_bytes())
        except OSError:
            return ""
    return digest.hexdigest()[:16]


def read(key: Any, label: str) -> Any:
    """The value stored for ``key``, or None when there is none that can be trusted."""
    try:
        stored = json.loads(path_for(key, label).read_text())
        if canonical(stored["key"]) != canonical(json.loads(canonical(key))):
            return None  # another key's file under this name (or written by hand)
        return stored["value"]
    except (OSError, ValueError, KeyError, TypeError):  # missing, half-written by a crash, garbage
        return None


def write(key: Any, label: str, value: Any) -> bool:
    """Store ``value`` for ``key`` atomically; False (and nothing raised) when the folder can't be written."""
    path = path_for(key, label)
    text = json.dumps({"key": key, "value": value}, indent=1, sort_keys=True, default=str) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
        return True
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        return False


def clear() -> None:
    """Delete every stored tile (the whole folder: it holds nothing else)."""
    shutil.rmtree(folder(), ignore_errors=True)


__all__ = ["FOLDER", "canonical", "clear", "folder", "path_for", "read", "source_hash", "write"]
