"""fused_triton in Triton's interpreter under NumPy 2.4, whatever Triton: ``interpreter_compat``.

Triton 3.6.0's interpreter (the GPU machine's Triton) turns a kernel's scalar into a Python int by ``int()`` of a
one-element array, which NumPy 2.4 refuses, so every key loop failed there before its first block (Triton 3.9
squeezes first). The subprocess runs a causal forward and a decode step in the interpreter against float64 — with
Triton 3.6.0 beside the venv's (``PYTHONPATH=DIR``, docs/kernels.md) it is the check that this keeps working.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import run_subprocess

_SCRIPT = """
import json
import torch
import triton
from attnbench.impls.fused_triton import interpreter_compat
from attnbench.impls.fused_triton.flash import INTERPRETED, flash_attention

def reference(q, k, v, offset):
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    i, j = torch.arange(q.shape[2]).view(-1, 1), torch.arange(k.shape[2]).view(1, -1)
    return torch.softmax(s.masked_fill(j > i + offset, float("-inf")), -1) @ v

g = torch.Generator().manual_seed(0)
errors = {}
for name, (sq, sk) in {"forward": (40, 40), "decode": (1, 70)}.items():
    q, k, v = (torch.randn(1, 2, s, 32, generator=g) for s in (sq, sk, sk))
    mask = "causal" if sq == sk else "causal_bottom_right"
    out = flash_attention(q, k, v, mask=mask)
    errors[name] = (out.double() - reference(q, k, v, sk - sq)).abs().max().item()
print(json.dumps({"interpreted": INTERPRETED, "triton": triton.__version__, "errors": errors,
                  "numpy_refuses": interpreter_compat.numpy_refuses_arrays_as_scalars()}))
"""


def test_a_tensor_bounded_loop_runs_in_the_interpreter_with_this_numpy():
    pytest.importorskip("triton")
    done = run_subprocess(sys.executable, "-c", _SCRIPT, env={"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["interpreted"]
    assert all(error < 1e-4 for error in said["errors"].values()), said


def test_the_patch_is_taken_only_where_the_interpreter_does_not_squeeze():
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton import interpreter_compat

    def old(tensor, scope):  # Triton 3.6.0's line
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    def new(tensor, scope):  # Triton 3.9's
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    assert not interpreter_compat.interpreter_squeezes(old)
    assert interpreter_compat.interpreter_squeezes(new)
    assert interpreter_compat.interpreter_squeezes(len)  # no Python source: left alone


def test_the_patched_index_squeezes_and_the_scope_takes_it_back(monkeypatch):
    pytest.importorskip("triton")
    import numpy as np
    from triton.runtime import interpreter

    from attnbench.impls.fused_triton import interpreter_compat

    class Scope:  # the interpreter's _LangPatchScope, as far as the patch uses it
        def __init__(self):
            self.changes = []

        def set_attr(self, obj, name, value):
            self.changes.append((obj, name, getattr(obj, name, None)))
            setattr(obj, name, value)

    def old(tensor, scope):
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", old)
    monkeypatch.setattr(interpreter_compat, "numpy_refuses_arrays_as_scalars", lambda: True)
    assert interpreter_compat.squeeze_scalar_index()
    patched = interpreter._patch_lang_tensor
    assert patched is not old and interpreter_compat.squeeze_scalar_index()  # a second call wraps nothing more
    assert interpreter._patch_lang_tensor is patched

    class Handle:
        data = np.array([7], dtype=np.int32)

    class Tensor:
        handle = Handle()

    scope = Scope()
    patched(Tensor, scope)
    assert list(range(Tensor(), 9)) == [7, 8]
    assert [name for _, name, _ in scope.changes] == ["__index__", "__index__"]  # restored in reverse: the original
