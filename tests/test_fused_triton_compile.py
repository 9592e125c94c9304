"""fused_triton's kernels compiled for a Hopper GPU (sm_90) on this machine, which has none.

The interpreter runs the kernels' Python, not Triton's compiler, so it cannot see what only compiling
shows (a construct the code generator rejects, a tile that needs more shared memory than estimated).
``triton.compile`` needs no GPU: these tests capture the launches fused_triton makes (each
``kernel[grid](...)`` becomes a compile with the argument specialisation a real launch would get —
16-byte aligned pointers, strides of 1 as constants, multiples of 16 marked divisible) and check that
every kernel compiles, with every mask family and score modifier, and that the shared memory the
compiler allots matches ``shared_bytes``, the estimate that prunes tiles against the device's limit.
Compiling takes seconds per kernel, so only a few tiles are compiled; ``nox -s gpu_smoke`` runs them all.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

from attnbench.impls.fused_triton import backward_kernels as _triton_backward  # noqa: E402
from attnbench.impls.fused_triton import flash as _triton_flash  # noqa: E402
from attnbench.impls.fused_triton import forward_kernels as _triton_forward  # noqa: E402
from attnbench.impls.fused_triton.compile_report import CompiledLaunch  # noqa: E402
from attnbench.impls.fused_triton.tiles import Tile, shared_bytes  # noqa: E402


@pytest.fixture()
def compiled(monkeypatch):
    """Launches become sm_90 compiles: {kernel name: compiled kernel}, filled as fused_triton launches."""
    kernels: dict[str, Any] = {}
    for module, names in (
        (_triton_forward, ("_forward_kernel",)),
        (_triton_backward, ("_preprocess_kernel", "_dkdv_kernel", "_dq_kernel")),
    ):
        for name in names:
            monkeypatch.setattr(module, name, CompiledLaunch(getattr(module, name), kernels))
    layout = _triton_flash.layout_kernels
    monkeypatch.setattr(layout, "_transpose_kernel", CompiledLaunch(layout._transpose_kernel, kernels))
    monkeypatch.setattr(_triton_flash, "INTERPRETED", False)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud
    return kernels


def _tensors(dtype: torch.dtype, head_dim: int, seq: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(2, 8, seq, head_dim, dtype=dtype), torch.empty(2, 2, seq, head_dim, dtype=dtype)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "head_dim", "tile", "options"),
    [
        (torch.bfloat16, 128, Tile(128, 128, 8, 3), {"cu_seqlens": torch.tensor([0, 300, 1024])}),  # 224 KiB
        (torch.float32, 64, Tile(64, 64, 4, 3), {"window": 100, "softcap": 30.0, "alibi": True}),  # tf32x3
    ],
)
def test_the_forward_compiles_for_sm90_with_the_estimated_shared_memory(compiled, dtype, head_dim, tile, options):
    q, k = _tensors(dtype, head_dim)
    v = torch.empty_like(k)  # its own tensor: v = k itself would let the forward reuse the key tile (V_FROM_K)
    plan = _triton_flash.make_plan(q, k, v, **options)
    plan.tiles["fwd"] = tile
    _triton_flash.forward(q, k, v, plan, store_lse=True)
    kernel = compiled["_forward_kernel"]
    assert kernel.metadata.shared == shared_bytes("fwd", tile, head_dim, dtype.itemsize)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mask", "options", "tile"),
    [
        ("none", {}, Tile(128, 128, 8, 3)),
        ("causal_bottom_right", {"window": 300}, Tile(128, 64, 4, 3)),
        ("padding", {}, Tile(64, 128, 4, 2)),
    ],
)
def test_the_descriptor_forward_compiles_for_sm90_with_the_estimated_shared_memory(
    compiled, monkeypatch, mask, options, tile
):
    """On a Hopper GPU a 16-bit forward reads k and v by tensor descriptors (``flash.takes_descriptors``): the
    boxes compile for sm_90, unmasked and masked blocks alike, in the shared memory estimated (their barriers
    counted)."""
    monkeypatch.setattr(_triton_flash, "is_hopper", lambda device: True)
    q, k = _tensors(torch.bfloat16, 128)
    v = torch.empty_like(k)
    lengths = {"lengths": torch.tensor([1000, 700], dtype=torch.int32)} if mask == "padding" else {}
    plan = _triton_flash.make_plan(q, k, v, mask=mask, **options, **lengths)
    plan.tiles["fwd"] = tile
    assert _triton_flash.takes_descriptors(plan, k, v, False)
    _triton_flash.forward(q, k, v, plan)
    assert compiled["_forward_kernel"].metadata.shared == shared_bytes("fwd", tile, 128, 2, descriptors=True)


@pytest.mark.slow
def test_the_backward_compiles_for_sm90_within_the_estimate(compiled):
    q, k = _tensors(torch.bfloat16, 96)  # head dim 96: padded to 128, EVEN_D off
    lengths = torch.tensor([1000, 700], dtype=torch.int32)
    plan = _triton_flash.make_plan(q, k, k, mask="padding", lengths=lengths, softcap=20.0, alibi=True)
    plan.tiles.update({"dkdv": Tile(32, 128, 4, 3), "dq": Tile(128, 32, 4, 3)})
    out, lse = torch.empty_like(q), torch.empty(2, 8, 1024)
    _triton_flash.backward_grads(q, k, k, out, lse, out, plan)
    assert set(compiled) == {"_preprocess_kernel", "_dkdv_kernel", "_dq_kernel"}
    for name, kernel in (("dkdv", "_dkdv_kernel"), ("dq", "_dq_kernel")):
        used, estimate = compiled[kernel].metadata.shared, shared_bytes(name, plan.tiles[name], 128, 2)
        assert 0.6 * estimate <= used <= estimate + 1024, (name, used, estimate)  # + the row statistics


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["causal", "padding"])
def test_the_descriptor_backward_compiles_for_sm90_within_the_estimate(compiled, monkeypatch, mask):
    """On a Hopper GPU a 16-bit backward reads q and dO (dK/dV), k and v (dQ) by tensor descriptors: the boxes
    compile for sm_90 in the shared memory estimated: their barriers take a few bytes beside the row statistics
    (not the forward's 1 KiB slot), so the backward's estimate counts none."""
    monkeypatch.setattr(_triton_flash, "is_hopper", lambda device: True)
    q, k = _tensors(torch.bfloat16, 128)
    v = torch.empty_like(k)
    lengths = {"lengths": torch.tensor([1000, 700], dtype=torch.int32)} if mask == "padding" else {}
    plan = _triton_flash.make_plan(q, k, v, mask=mask, **lengths)
    plan.tiles.update({"dkdv": Tile(64, 128, 8, 2), "dq": Tile(128, 64, 8, 2)})
    out, lse = torch.empty_like(q), torch.empty(2, 8, 1024)
    _triton_flash.backward_grads(q, k, v, out, lse, torch.empty_like(q), plan)
    for name, kernel in (("dkdv", "_dkdv_kernel"), ("dq", "_dq_kernel")):
        used = compiled[kernel].metadata.shared
        estimate = shared_bytes(name, plan.tiles[name], 128, 2)
        assert estimate <= used <= estimate + 1024, (name, used, estimate)  # + the row statistics and barriers


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_the_fp8_forward_compiles_for_sm90_to_e4m3_tensor_core_dots(compiled, monkeypatch, mask):
    """An fp8 forward (q, k, v in e4m3): both dots compile to Hopper's e4m3 wgmma — P·V with v transposed to
    keys-contiguous in the call (the B operand K-major) — in the shared memory estimated for one-byte elements."""
    monkeypatch.setattr(_triton_flash, "is_hopper", lambda device: True)
    q, k = (t.to(torch.float8_e4m3fn) for t in _tensors(torch.float32, 128))
    v = torch.empty_like(k)
    scales = {"q_scale": torch.ones(2, 8), "k_scale": torch.ones(2, 2, 1, 1), "v_scale": torch.ones(2, 2, 1, 1)}
    plan = _triton_flash.make_plan(q, k, v, mask=mask, out_dtype=torch.bfloat16, **scales)
    assert not _triton_flash.takes_descriptors(plan, k, v, False)  # pointers: v is read keys-contiguous
    tile = Tile(128, 128, 8, 3)
    plan.tiles["fwd"] = tile
    out, _ = _triton_flash.forward(q, k, v, plan)
    assert out.dtype == torch.bfloat16
    assert "_transpose_kernel" in compiled  # v made keys-contiguous by our own kernel
    kernel = compiled["_forward_kernel"]
    dots = set(re.findall(r"wgmma\.mma_async\.\S+", kernel.asm["ptx"]))
    assert dots and all(".e4m3.e4m3" in dot for dot in dots), dots
    assert kernel.metadata.shared <= shared_bytes("fwd", tile, 128, 1)
