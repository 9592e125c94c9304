"""fused_triton's layout kernel: a tensor's last two dims transposed into a new buffer, tile by tile.

An fp8 forward reads v keys-contiguous (Hopper's fp8 MMA takes its second operand K-major only; see
``flash.forward``). torch's copy of a transposed view moves one-byte elements with strided reads or writes;
this kernel reads a (BLOCK_S, BLOCK_D) tile along its rows and writes it along the keys, both coalesced (the
compiler turns the transposed registers around through shared memory).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _transpose_kernel(
    X,
    Y,
    seq,
    dim,
    stride_xb,
    stride_xs,
    stride_xd,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Y[b, d, s] = X[b, s, d] for one (b, BLOCK_S keys) tile over every channel; Y is (B, D, S) contiguous."""
    b = tl.program_id(0)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    ok = (s[:, None] < seq) & (d[None, :] < dim)
    x_at = X + tl.cast(b, tl.int64) * stride_xb + tl.cast(s, tl.int64)[:, None] * stride_xs + d[None, :] * stride_xd
    tile = tl.load(x_at, mask=ok)
    y_at = Y + tl.cast(b, tl.int64) * dim * seq + d[:, None] * seq + tl.cast(s, tl.int64)[None, :]
    tl.store(y_at, tl.trans(tile), mask=tl.trans(ok))


def keys_contiguous(v: torch.Tensor, block_s: int = 128) -> torch.Tensor:
    """v (B, H, S, D) with the keys contiguous (strides (H·D·S, D·S, 1, S)): a new buffer, the same values."""
    B, H, S, D = v.shape
    flat = v.reshape(B * H, S, D)  # a view where v's batch and head strides allow it, else a copy
    out = torch.empty(B * H, D, S, dtype=v.dtype, device=v.device)
    block_d = max(16, triton.next_power_of_2(D))
    _transpose_kernel[(B * H, triton.cdiv(S, block_s))](
        flat, out, S, D, *flat.stride(), BLOCK_S=block_s, BLOCK_D=block_d, num_warps=4
    )
    return out.view(B, H, D, S).transpose(2, 3)
