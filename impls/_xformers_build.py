"""Which torch the installed xformers was built for, and how to say that this torch is another.

xformers' kernels are a C++/CUDA extension built against one exact torch (0.0.35's wheel: torch
2.10.0+cu128) that loads under no other minor release. Under another torch ``import xformers.ops`` still
succeeds — it only logs a warning — and every call then fails with "No operator found for
`memory_efficient_attention_forward` … xFormers wasn't build with CUDA support". The wheel records its build
in ``xformers/cpp_lib.json`` beside the package (``{"version": {"torch": "2.10.0+cu128", "cuda": 1208, …}}``);
:func:`built_for` reads it without importing xformers (over a second, and it loads torch's CUDA parts), so a
machine without a GPU can already tell that the pair mismatches.

Whether the extension loaded is xformers' own word (``xformers._has_cpp_library``, on a CUDA machine): the
versions compared here only predict it (:func:`mismatch`) and say why it did not (:func:`pair_message`).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

PAIR_HINT = "install a matching pair (see README)"


def built_for() -> str | None:
    """The torch version (``torch.__version__`` form) the installed xformers' extension was built for, read
    from ``cpp_lib.json`` beside the package without importing it; None when xformers is not installed or
    the file is absent or unreadable (a source checkout that was never built)."""
    try:
        spec = importlib.util.find_spec("xformers")
    except (ImportError, ValueError):  # a broken parent or a module without a spec
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        try:
            built = json.loads((Path(folder) / "cpp_lib.json").read_text())["version"]["torch"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(built, str) and built:
            return built
    return None


def _release(version: str) -> tuple[tuple[int, ...], str]:
    """("2.10.0+cu128") -> ((2, 10), "cu128"): the major and minor release, and the local build tag."""
    public, _, local = version.partition("+")
    found = re.match(r"(\d+)\.(\d+)", public)
    return (tuple(int(n) for n in found.groups()) if found else (), local)


def mismatch(built: str, running: str) -> bool:
    """Whether an extension built against torch ``built`` is expected not to load under torch ``running``:
    another minor release (torch's C++ ABI moves between 2.10 and 2.11), or both CUDA builds for different
    CUDA versions (cu128 against cu130). A patch-level difference (2.10.0 against 2.10.1) and a CPU torch's
    ``+cpu`` are not counted: there the extension may load, and on CUDA xformers itself says whether it did."""
    (built_minor, built_tag), (running_minor, running_tag) = _release(built), _release(running)
    if built_minor != running_minor:
        return True
    return built_tag.startswith("cu") and running_tag.startswith("cu") and built_tag != running_tag


def pair_message(xformers_version: str, built: str, running: str) -> str:
    """The one line that says the pair mismatches, with both versions as read."""
    return f"xformers {xformers_version} was built for torch {built}; this is torch {running} — {PAIR_HINT}"
