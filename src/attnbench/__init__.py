"""attnbench — benchmark and profile attention implementations: correct kernels only, honest numbers.

The public API is small: describe a problem with :class:`Workload`, write a :class:`Contender` (declare
:class:`Capabilities`, return a zero-argument callable from ``prepare``), expose it through the
``attnbench.impls`` entry point or :func:`register`, and run sweeps with the ``attnbench`` CLI or, from
Python, with :func:`run` (the results come back as a pandas DataFrame).

Its names are imported when first used (PEP 562), so that ``import attnbench`` itself imports neither torch nor
pandas: the ``attnbench`` command (``__main__.entry``) imports them inside its own handler, where a Ctrl-C in
that first second is one line, not Python's traceback.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnbench.api import run
    from attnbench.contenders.contract import Capabilities, Contender, Unsupported
    from attnbench.contenders.registry import register
    from attnbench.errors import UsageError
    from attnbench.workload import MASKS, PASSES, Workload
    from attnbench.workload.inputs import AttentionInputs, make_inputs

    __version__: str

_WHERE = {
    "run": "attnbench.api",
    "Capabilities": "attnbench.contenders.contract",
    "Contender": "attnbench.contenders.contract",
    "Unsupported": "attnbench.contenders.contract",
    "register": "attnbench.contenders.registry",
    "UsageError": "attnbench.errors",
    "MASKS": "attnbench.workload",
    "PASSES": "attnbench.workload",
    "Workload": "attnbench.workload",
    "AttentionInputs": "attnbench.workload.inputs",
    "make_inputs": "attnbench.workload.inputs",
}

__all__ = [
    "MASKS",
    "PASSES",
    "AttentionInputs",
    "Capabilities",
    "Contender",
    "Unsupported",
    "UsageError",
    "Workload",
    "__version__",
    "make_inputs",
    "register",
    "run",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from attnbench.measure.environment import attnbench_version

        value: Any = attnbench_version()  # pyproject.toml is the one place the version is written
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'attnbench' has no attribute {name!r}")
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
