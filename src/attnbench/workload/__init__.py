"""The workload room: the problem's definition — the axis table, :class:`Workload`, masks and score modifiers,
ragged sequences, paged and narrow KV caches, shared prefixes, model presets and suites — with what follows from
the definition alone: seeded inputs, the float64 reference, the correctness check and the FLOP count.

It imports only the measure room and :mod:`attnbench.errors` (import-linter checks it, ``nox -s lint``).
``Workload`` and its vocabulary are re-exported here, as ``from attnbench.workload import Workload``.
"""

from attnbench.workload._problem import Workload
from attnbench.workload.axes import (
    BASIC_MASKS,
    DEVICES,
    DTYPE_ALIASES,
    DTYPES,
    MASKS,
    MAX_SOFTCAP,
    MODULES,
    PASSES,
    SCORE_MODS,
    canonical_dtype,
)

__all__ = [
    "BASIC_MASKS",
    "DEVICES",
    "DTYPES",
    "DTYPE_ALIASES",
    "MASKS",
    "MAX_SOFTCAP",
    "MODULES",
    "PASSES",
    "SCORE_MODS",
    "Workload",
    "canonical_dtype",
]
