"""A compile probe: MLA decode's key loop with the 512 value channels split between two programs, rows-major.

Not a kernel of attnbench: the loop alone (no masks, splits or merge), compiled for sm_90 to weigh a design before
building it. Each program holds a 64-row block's whole q (576 channels: its own value half, the other half and
the 64-wide tail), computes the scores over all 576 (the other program recomputes them) and accumulates the
output of its own 256 value channels, read from the key tile's own half. Prints what
``compile_report.inspect`` says per tile "BLOCK_M,BLOCK_N,WARPS,STAGES":

    PYTHONPATH=DIR python trials/probes/mla_value_halves.py 64,32,4,3 64,64,4,2

(DIR: ``pip install --target DIR triton==3.6.0 --no-deps``, the GPU machine's Triton.)
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from attnbench.impls.fused_triton.compile_report import compile_for, inspect


@triton.jit
def _halves(Q, K, Out, N, stride_kn, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr):
    """Rows [BLOCK_M·pid, +BLOCK_M) of q (·, 576) against all N keys of K (N, 576); value half program_id(1)."""
    pid = tl.program_id(0)
    part = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    own = part * HALF + tl.arange(0, HALF)
    other = (1 - part) * HALF + tl.arange(0, HALF)
    tail = 2 * HALF + tl.arange(0, 64)
    q_rows = Q + pid * BLOCK_M * 576 + rows[:, None] * 576
    q_own = tl.load(q_rows + own[None, :])
    q_other = tl.load(q_rows + other[None, :])
    q_tail = tl.load(q_rows + tail[None, :])
    m_i = tl.zeros([BLOCK_M], tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HALF], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        keys = K + (start + offs_n)[None, :].to(tl.int64) * stride_kn
        k_own = tl.load(keys + own[:, None])  # (HALF, BLOCK_N)
        s = tl.dot(q_own, k_own)
        s = tl.dot(q_other, tl.load(keys + other[:, None]), s)
        s = tl.dot(q_tail, tl.load(keys + tail[:, None]), s)
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(tl.bfloat16), tl.trans(k_own), acc * alpha[:, None])
        m_i = m_new
    tl.store(Out + pid * BLOCK_M * 512 + rows[:, None] * 512 + own[None, :], acc / l_i[:, None])


def main(tiles: list[str]) -> int:
    q = torch.empty(8 * 128, 576, dtype=torch.bfloat16)
    k = torch.empty(8192, 576, dtype=torch.bfloat16)
    out = torch.empty(8 * 128, 512)
    print(f"sm_90 compiles by Triton {triton.__version__}: MLA value halves, rows-major", flush=True)
    for spec in tiles:
        block_m, block_n, warps, stages = map(int, spec.split(","))
        options = {"BLOCK_M": block_m, "BLOCK_N": block_n, "HALF": 256, "num_warps": warps, "num_stages": stages}
        print(f"{spec:>12}  {inspect(compile_for(_halves, (q, k, out, 8192, 576, 0.1), options)).line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["64,32,4,3"]))
