"""attnbench — benchmark and profile attention implementations: correct kernels only, honest numbers.

The public API is small: describe a problem with :class:`Workload`, write a :class:`Contender` (declare
:class:`Capabilities`, return a zero-argument callable from ``prepare``), expose it through the
``attnbench.impls`` entry point or :func:`register`, and run sweeps with the ``attnbench`` CLI or, from
Python, with :func:`run` (the results come back as a pandas DataFrame).
"""

from attnbench.api import run
from attnbench.contenders.contract import Capabilities, Contender, Unsupported
from attnbench.contenders.registry import register
from attnbench.errors import UsageError
from attnbench.measure.environment import attnbench_version
from attnbench.workload import MASKS, PASSES, Workload
from attnbench.workload.inputs import AttentionInputs, make_inputs

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

__version__ = attnbench_version()  # pyproject.toml is the one place the version is written
