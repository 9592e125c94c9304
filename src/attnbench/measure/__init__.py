"""The measure room, the lowest: the stopwatch (CPU and CUDA timing), the memory gauge, the allocator policy,
and the machine itself (its roofs, its yardsticks, its environment and the noise from other work).

It knows nothing of attention: what it times is a zero-argument callable, what it reads is the machine. It
imports only :mod:`attnbench.errors`; every other room may import it (the order is checked by import-linter,
``nox -s lint``). Modules with a leading underscore are this package's own; the others are imported by
contenders (``native_build``, ``allocator``) or by the rooms above.
"""
