"""attnbench — benchmark and profile attention implementations: correct kernels only, honest numbers.

The public API is small: describe a problem with :class:`Workload`, write a :class:`Contender` (declare
:class:`Capabilities`, return a zero-argument callable from ``prepare``), expose it through the
``attnbench.impls`` entry point or :func:`register`, and run sweeps with the ``attnbench`` CLI or, from
Python, with :func:`run` (the results come back as a pandas DataFrame).
"""

__version__ = "0.1.0"

from attnbench.api import run
from attnbench.contender import Capabilities, Contender, Unsupported
from attnbench.errors import UsageError
from attnbench.inputs import AttentionInputs, make_inputs
from attnbench.registry import register
from attnbench.workload import MASKS, PASSES, Workload

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
