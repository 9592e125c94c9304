"""Triton's CPU interpreter under NumPy 2.4 and later, for Tritons whose interpreter predates it.

The interpreter holds each scalar of a kernel (a program id, an integer argument, a reduction's result) as a
one-element NumPy array, and gives it to Python as an index (``range(start, end, BLOCK)`` over a loaded or
reduced bound, as every key loop of the forward, backward and decode kernels has) by ``int(array)``. NumPy 2.4 turned
that conversion of an array of one or more dimensions into a ``TypeError`` ("only 0-dimensional arrays can be
converted to Python scalars"), so with Triton 3.6.0 — the GPU machine's version — every such kernel fails in the
interpreter before its first block. Triton fixed it after 3.6 by squeezing the array first (triton-lang/triton
issue 9171, pull request 9172); ``squeeze_scalar_index`` does the same for an interpreter that does not, and
nothing where the installed one does (Triton 3.9) or NumPy still converts such arrays itself. It changes no
kernel, and nothing off the interpreter: a compiled kernel never goes through it.
"""

from __future__ import annotations

import inspect
from typing import Any

PATCHED = "_attnbench_squeezes_scalar_index"  # marks the wrapper, so that a second call adds none


def numpy_refuses_arrays_as_scalars() -> bool:
    """Whether this NumPy refuses ``int()`` of a one-element array of one dimension (NumPy 2.4 and later)."""
    import numpy as np

    try:
        int(np.zeros(1, dtype=np.int32))
    except TypeError:
        return True
    return False


def interpreter_squeezes(patch_lang_tensor: Any) -> bool:
    """Whether the interpreter's ``_patch_lang_tensor`` already squeezes a scalar before ``int()`` (Triton after
    3.6); True where its source cannot be read (then it is left alone)."""
    try:
        source = inspect.getsource(patch_lang_tensor)
    except (OSError, TypeError):
        return True
    return "__index__" not in source or "squeeze" in source


def squeeze_scalar_index() -> bool:
    """Make the interpreter's tensors turn into Python ints as Triton after 3.6 does (``int(data.squeeze())``),
    where this Triton's interpreter does not and this NumPy needs it; True if it patched (or had patched)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return False
    if getattr(original, PATCHED, False):
        return True
    if not numpy_refuses_arrays_as_scalars() or interpreter_squeezes(original):
        return False

    def patch_lang_tensor(tensor: Any, scope: Any) -> None:
        original(tensor, scope)  # the scope restores this after the launch, then the interpreter's own
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    setattr(patch_lang_tensor, PATCHED, True)
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True
