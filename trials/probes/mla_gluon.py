"""A probe: MLA decode written in Gluon (Triton's lower-level language), FlashMLA's structure, for an H100/H200.

Not a kernel of attnbench: the decode alone (bf16, H 128 over one 576-wide latent cache, values its first 512
channels, no mask but the split's end), to weigh a design the Triton language can't express before building it.
Triton's own layouts left fused_triton's MLA at 13.5–17 % of the case's roofline on an H200 (docs/kernels.md):
one block's copies at a time, every product waited for as soon as issued, q·kᵀ in 16- or 32-key slices. Here:

- a program per (split of the keys, 64 query heads, sequence), 8 warps (two warp groups); q's 64 × 576 read once
  into shared memory by TMA, then the key blocks (64 keys × 576) through a ring of shared-memory stages, each
  filled by TMA on an mbarrier, the next block's copy in flight while this one is computed;
- S = q·kᵀ as wgmma from shared memory, each warp group 32 of the 64 keys (512 + 64 channels);
- the online softmax in base 2 (the scale folded in), then O += P·V as wgmma with P in registers and V the same
  key tile's first 512 channels, each warp group 256 of them (the 64 × 512 fp32 accumulator: 128 registers a
  thread), issued asynchronously and waited for only when the next block's scores are;
- each split writes its normalised 64 × 512 partial and log-sum-exp; a small Triton kernel merges the splits.

Without a GPU (Triton 3.6, the GPU machine's, beside ours: ``pip install --target DIR triton==3.6.0 --no-deps``):

    PYTHONPATH=DIR python trials/probes/mla_gluon.py --compile [--stages 2]

compiles the split kernel for sm_90 and prints registers, spills, shared memory, the wgmma shapes and waits, and
the TMA copies. On a Hopper GPU:

    python trials/probes/mla_gluon.py --check --time [--batch 8,64] [--splits N]

checks it against float64 (the split kernel and merge, several lengths including a partial last block and a
partial last split) and times it against the `bmm` contender's computation (torch.matmul, softmax, matmul) and
attnbench's fused_triton MLA decode on the same inputs, warm, by CUDA events, printing each time, the ratio to
bmm and the share of the case's roofline (its FLOPs at the dense bf16 peak, 989 TFLOP/s, or its bytes at the
copy bandwidth measured beside it, whichever is longer).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from attnbench import AttentionInputs, Capabilities, Contender, Workload

# Triton 3.6 (the GPU machine's) names the TMA load async_copy_global_to_shared; later ones async_load.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

HEADS = 128  # deepseek-v3's query heads, all against one latent cache
D_LATENT = 576  # the product's width: 512 value channels and a 64-wide rotary tail
D_VALUE = 512
D_TAIL = D_LATENT - D_VALUE
BLOCK_M = 64  # query heads a program
LOG2E = 1.4426950408889634


@gluon.jit
def _mla_split(
    q_desc,
    qt_desc,
    k_desc,
    kt_desc,
    partial,
    lse,
    N,
    keys_per_split,
    splits,
    qk_scale,
    HEADS: gl.constexpr,
    STAGES: gl.constexpr,
):
    """One split of one sequence's keys for 64 query heads: partial[(b·H + h)·splits + split] (normalised, fp32)
    and its log-sum-exp (base 2) in lse at the same row."""
    split = gl.program_id(0)
    block = gl.program_id(1)
    b = gl.program_id(2)
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    DV: gl.constexpr = q_desc.block_type.shape[1]
    DT: gl.constexpr = qt_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    KV_BYTES: gl.constexpr = k_desc.block_type.nbytes + kt_desc.block_type.nbytes

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, DV // 2, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    qt_smem = gl.allocate_shared_memory(qt_desc.dtype, qt_desc.block_type.shape, qt_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, DV], k_desc.layout)
    kt_smem = gl.allocate_shared_memory(kt_desc.dtype, [STAGES, BLOCK_N, DT], kt_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.init(q_bar, count=1)

    start = split * keys_per_split
    end = gl.minimum(start + keys_per_split, N)
    n_blocks = gl.cdiv(end - start, BLOCK_N)
    q_row = b * HEADS + block * BLOCK_M
    kv_row = b * N + start

    mbarrier.expect(q_bar, q_desc.block_type.nbytes + qt_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    _tma_load(qt_desc, [q_row, DV], q_bar, qt_smem)
    for i in gl.static_range(STAGES - 1):  # the first blocks' copies, one stage left for the next
        mbarrier.expect(ready.index(i), KV_BYTES, pred=i < n_blocks)
        _tma_load(
            k_desc, [kv_row + i * BLOCK_N, 0], ready.index(i), k_smem.index(i), pred=i < n_blocks
        )
        _tma_load(
            kt_desc, [kv_row + i * BLOCK_N, DV], ready.index(i), kt_smem.index(i), pred=i < n_blocks
        )
    mbarrier.wait(q_bar, 0)

    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_s)
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, DV], gl.float32, o_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    offs_n = gl.arange(0, BLOCK_N, col_s)
    for j in range(n_blocks):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        k_cur = k_smem.index(stage)
        s = warpgroup_mma(q_smem, k_cur.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qt_smem, kt_smem.index(stage).permute((1, 0)), s, is_async=True)
        # The scores, and with them the last block's P·V (wgmma groups finish in order): its stage is free.
        s, acc = warpgroup_mma_wait(0, deps=(s, acc))
        ahead = j + STAGES - 1
        fill = ahead % STAGES
        mbarrier.expect(ready.index(fill), KV_BYTES, pred=ahead < n_blocks)
        _tma_load(
            k_desc, [kv_row + ahead * BLOCK_N, 0], ready.index(fill), k_smem.index(fill), pred=ahead < n_blocks
        )
        _tma_load(
            kt_desc, [kv_row + ahead * BLOCK_N, DV], ready.index(fill), kt_smem.index(fill), pred=ahead < n_blocks
        )

        keys = start + j * BLOCK_N + offs_n
        s = gl.where(gl.expand_dims(keys < end, 0), s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        acc = warpgroup_mma(p_op, k_cur, acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    mbarrier.invalidate(q_bar)

    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    rows_o = q_row + gl.arange(0, BLOCK_M, row_o)
    cols = gl.arange(0, DV, col_o)
    gl.store(partial + gl.expand_dims((rows_o * splits + split) * DV, 1) + gl.expand_dims(cols, 0), out)
    rows_s = q_row + gl.arange(0, BLOCK_M, row_s)
    gl.store(lse + rows_s * splits + split, m_i + gl.log2(l_i))


@triton.jit
def _merge(partial, lse, out, splits, DV: tl.constexpr, SPLITS: tl.constexpr):
    """Row program_id(0) of out (bf16): its splits' partials weighted by their log-sum-exps (base 2)."""
    row = tl.program_id(0)
    offs_s = tl.arange(0, SPLITS)
    valid = offs_s < splits
    logs = tl.load(lse + row * splits + offs_s, mask=valid, other=-float("inf"))
    weights = tl.exp2(logs - tl.max(logs, 0))
    weights = weights / tl.sum(weights, 0)
    cols = tl.arange(0, DV)
    parts = tl.load(partial + (row * splits + offs_s)[:, None] * DV + cols[None, :], mask=valid[:, None], other=0.0)
    tl.store(out + row * DV + cols, tl.sum(parts * weights[:, None], 0).to(out.dtype.element_ty))


def _layouts(block_n: int) -> tuple[object, object, object]:
    wide = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_VALUE], gl.bfloat16)
    tail = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_TAIL], gl.bfloat16)
    keys = gl.NVMMASharedLayout.get_default_for([block_n, D_VALUE], gl.bfloat16)
    return wide, tail, keys


def split_plan(batch: int, n: int, sms: int, block_n: int, splits: int | None) -> tuple[int, int]:
    """(splits, keys a split): whole key blocks a split, enough programs (batch × 2 head blocks × splits) to fill
    ``sms`` once unless ``splits`` is given; no split empty."""
    blocks = triton.cdiv(n, block_n)
    want = splits or max(1, sms // (batch * (HEADS // BLOCK_M)))
    per = triton.cdiv(blocks, min(want, blocks)) * block_n
    return triton.cdiv(n, per), per


def descriptors(q: torch.Tensor, kv: torch.Tensor, block_n: int) -> tuple[TensorDescriptor, ...]:
    """q (B, 128, 576) and kv (B, N, 576), bf16 and contiguous: the four descriptors the split kernel reads."""
    wide, tail, keys = _layouts(block_n)
    q2 = q.reshape(-1, D_LATENT)
    kv2 = kv.reshape(-1, D_LATENT)
    return (
        TensorDescriptor.from_tensor(q2, [BLOCK_M, D_VALUE], wide),
        TensorDescriptor.from_tensor(q2, [BLOCK_M, D_TAIL], tail),
        TensorDescriptor.from_tensor(kv2, [block_n, D_VALUE], keys),
        TensorDescriptor.from_tensor(kv2, [block_n, D_TAIL], tail),
    )


def mla_decoder(
    q: torch.Tensor,
    kv: torch.Tensor,
    splits: int | None = None,
    block_n: int = 64,
    stages: int = 2,
    scale: float | None = None,
) -> Callable[[], torch.Tensor]:
    """A call computing softmax(q·kvᵀ·scale)·kv[..., :512] per sequence (scale 1/√576 unless given): q (B, 128,
    576), kv (B, N, 576), bf16 → (B, 128, 512). The plan, descriptors and buffers are made here, once; the call
    launches the split kernel and the merge."""
    batch, heads, width = q.shape
    assert heads == HEADS and width == D_LATENT and kv.shape[2] == D_LATENT and kv.shape[0] == batch
    assert q.is_contiguous() and kv.is_contiguous() and q.dtype == kv.dtype == torch.bfloat16
    n = kv.shape[1]
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    splits, per = split_plan(batch, n, sms, block_n, splits)
    partial = torch.empty(batch * HEADS * splits, D_VALUE, device=q.device, dtype=torch.float32)
    lse = torch.empty(batch * HEADS * splits, device=q.device, dtype=torch.float32)
    out = torch.empty(batch, HEADS, D_VALUE, device=q.device, dtype=q.dtype)
    qk_scale = LOG2E * (scale if scale is not None else 1 / math.sqrt(D_LATENT))
    split_args = (*descriptors(q, kv, block_n), partial, lse, n, per, splits, qk_scale, HEADS, stages)
    grid = (splits, HEADS // BLOCK_M, batch)
    merge_grid = (batch * HEADS,)
    merge_width = triton.next_power_of_2(splits)

    def call() -> torch.Tensor:
        _mla_split[grid](*split_args, num_warps=8)
        _merge[merge_grid](partial, lse, out, splits, D_VALUE, merge_width, num_warps=4)
        return out

    return call


def emulate_split(q: torch.Tensor, kv: torch.Tensor, splits: int | None, block_n: int = 64, sms: int = 132):
    """What ``_mla_split`` computes, in torch on any device (block by block, its base-2 softmax, P rounded to bf16,
    the partial last block masked), then ``_merge`` itself: the host's split plan and the merge checked where
    Gluon can't run (Triton's interpreter runs the merge, not Gluon)."""
    batch, n = q.shape[0], kv.shape[1]
    splits, per = split_plan(batch, n, sms, block_n, splits)
    qk_scale = LOG2E / math.sqrt(D_LATENT)
    partial = torch.empty(batch, HEADS, splits, D_VALUE, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, HEADS, splits, dtype=torch.float32, device=q.device)
    for b in range(batch):
        for split in range(splits):
            start, end = split * per, min(split * per + per, n)
            m_i = torch.full((HEADS,), -math.inf, device=q.device)
            l_i = torch.zeros(HEADS, device=q.device)
            acc = torch.zeros(HEADS, D_VALUE, device=q.device)
            for first in range(start, end, block_n):
                block = kv[b, first : first + block_n].float()  # TMA: the rows past the split are read too
                s = q[b].float() @ block.T
                s[:, end - first :] = -math.inf
                m_new = torch.maximum(m_i, s.amax(1) * qk_scale)
                p = torch.exp2(s * qk_scale - m_new[:, None])
                alpha = torch.exp2(m_i - m_new)
                l_i = l_i * alpha + p.sum(1)
                m_i = m_new
                acc = acc * alpha[:, None] + p.to(torch.bfloat16).float() @ block[:, :D_VALUE]
            partial[b, :, split] = acc / l_i[:, None]
            lse[b, :, split] = m_i + torch.log2(l_i)
    out = torch.empty(batch, HEADS, D_VALUE, dtype=q.dtype, device=q.device)
    _merge[(batch * HEADS,)](partial, lse, out, splits, D_VALUE, triton.next_power_of_2(splits))
    return out


def emulate(args: argparse.Namespace) -> int:
    """``emulate_split`` against float64 on the CPU (run under TRITON_INTERPRET=1)."""
    torch.manual_seed(0)
    failures = 0
    for batch, n, splits in ((2, 64, None), (1, 1000, 3), (2, 4133, 5), (1, 700, 1)):
        q = torch.randn(batch, HEADS, D_LATENT, dtype=torch.bfloat16)
        kv = torch.randn(batch, n, D_LATENT, dtype=torch.bfloat16)
        failures += _compare(f"emulated B{batch} N{n} splits {splits}", emulate_split(q, kv, splits), reference(q, kv))
    return failures


def _compare(what: str, got: torch.Tensor, want: torch.Tensor) -> int:
    """Print the largest error against float64 and its bound (bf16's rounding of P and of the output); 1 if past it."""
    error = (got.double() - want).abs().max().item()
    bound = 2e-2 * want.abs().max().item() + 2e-3
    ok = math.isfinite(error) and error <= bound
    print(f"{what}: max error {error:.2e} (bound {bound:.2e})", "ok" if ok else "WRONG", flush=True)
    return int(not ok)


def reference(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The same in float64."""
    q64, kv64 = q.double(), kv.double()
    scores = q64 @ kv64.transpose(1, 2) / math.sqrt(D_LATENT)
    return torch.softmax(scores, dim=-1) @ kv64[..., :D_VALUE]


def bmm_way(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """The `bmm` contender's computation: scores by matmul, softmax in fp32, values by matmul."""
    scores = torch.matmul(q, kv.transpose(1, 2)) * (1 / math.sqrt(D_LATENT))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), kv[..., :D_VALUE])


def check(args: argparse.Namespace) -> int:
    """The Gluon kernel and merge against float64 on the GPU: lengths with a partial last block, a partial last
    split, one split, several."""
    torch.manual_seed(0)
    failures = 0
    for batch, n, splits in ((2, 64, None), (2, 1000, None), (3, 4133, 5), (1, 8192, 1), (2, 8192, 7)):
        q = torch.randn(batch, HEADS, D_LATENT, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(batch, n, D_LATENT, device="cuda", dtype=torch.bfloat16)
        got = mla_decoder(q, kv, splits, stages=args.stages)()
        failures += _compare(f"check B{batch} N{n} splits {splits}", got, reference(q, kv))
    return failures


class MlaGluon(Contender):
    """The probe as an attnbench contender (registered by ``--time`` only), so `attnbench.run` times it beside
    fused_triton and bmm in the same rounds and checks it against float64 as it checks them."""

    name = "mla_gluon"
    description = "trials/probes/mla_gluon.py: MLA decode in Gluon (TMA ring, async wgmma); not a kernel of attnbench"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({"bfloat16"}),
        masks=frozenset({"none", "causal_bottom_right"}),
        features=frozenset({"head_dim_v", "kv_layout"}),
    )

    def unsupported_reason(self, workload: Workload) -> str | None:
        w = workload
        shape = (w.kv_layout, w.heads, w.kv_heads, w.seq_q, w.head_dim, w.head_dim_v, w.page_size, w.pass_)
        if shape != ("latent", HEADS, 1, 1, D_LATENT, D_VALUE, 0, "fwd"):
            return "the probe runs MLA decode only: a contiguous latent cache, H128/1, Sq 1, 576/512, forward"
        return super().unsupported_reason(w)

    def prepare(self, inputs: AttentionInputs, workload: Workload):
        q = inputs.q.reshape(workload.batch, HEADS, D_LATENT).contiguous()
        kv = inputs.k.reshape(workload.batch, workload.seq_k, D_LATENT).contiguous()
        call = mla_decoder(q, kv, scale=inputs.scale)
        return lambda: call().view(workload.batch, HEADS, 1, D_VALUE)


def time_cases(args: argparse.Namespace) -> None:
    """One `attnbench.run` of the probe, fused_triton and bmm on the MLA decode cases (the harness's rounds, its
    float64 gate), printed as a table."""
    import attnbench

    attnbench.register(MlaGluon())
    frame = attnbench.run(
        impl="mla_gluon,fused_triton,bmm",
        batch=args.batch,
        heads=HEADS,
        kv_heads=1,
        seq=1,
        seq_kv=args.keys,
        head_dim=D_LATENT,
        head_dim_v=D_VALUE,
        kv_layout="latent",
        mask="causal_bottom_right",
        dtype="bfloat16",
        device="cuda",
        isolate="none",
        budget_s=args.budget_s,
        out=args.out,
    )
    columns = [
        c
        for c in ("impl", "batch", "status", "median_ms", "tflops", "gbps", "pct_of_peak", "max_abs_err", "choice")
        if c in frame.columns
    ]
    print(frame[columns].to_string(index=False))


def compile_only(args: argparse.Namespace) -> int:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from attnbench.impls.fused_triton.compile_report import inspect

    q = torch.empty(8 * HEADS, D_LATENT, dtype=torch.bfloat16)
    kv = torch.empty(8 * 8192, D_LATENT, dtype=torch.bfloat16)
    wide, tail, keys = _layouts(args.block_n)
    descs = (
        TensorDescriptor.from_tensor(q, [BLOCK_M, D_VALUE], wide),
        TensorDescriptor.from_tensor(q, [BLOCK_M, D_TAIL], tail),
        TensorDescriptor.from_tensor(kv, [args.block_n, D_VALUE], keys),
        TensorDescriptor.from_tensor(kv, [args.block_n, D_TAIL], tail),
    )
    signature = {
        name: mangle_type(desc) for name, desc in zip(("q_desc", "qt_desc", "k_desc", "kt_desc"), descs, strict=True)
    }
    signature.update(partial="*fp32", lse="*fp32", N="i32", keys_per_split="i32", splits="i32", qk_scale="fp32")
    signature.update(HEADS="constexpr", STAGES="constexpr")
    source = GluonASTSource(_mla_split, signature, {"HEADS": HEADS, "STAGES": args.stages}, {})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    tile = f"64×{args.block_n}, 8 warps, {args.stages} stages"
    print(f"sm_90 compile by Triton {triton.__version__}: Gluon MLA decode, {tile}")
    print(f"  {inspect(kernel).line()}")
    ptx = kernel.asm["ptx"]
    print(f"  TMA copies in the PTX: {ptx.count('cp.async.bulk.tensor')}; boxes {kernel.metadata.tensordesc_meta}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="compile for sm_90 and report (no GPU needed)")
    parser.add_argument("--check", action="store_true", help="check against float64 on the GPU")
    parser.add_argument("--emulate", action="store_true", help="the host's plan and merge, emulated, on the CPU")
    parser.add_argument("--time", action="store_true", help="time against bmm and fused_triton on the GPU")
    parser.add_argument("--batch", type=lambda text: [int(x) for x in text.split(",")], default=[8, 64])
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--splits", type=int, default=None)
    parser.add_argument("--block-n", type=int, default=64)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=1.0, help="the harness's timing budget a case (--time)")
    parser.add_argument("--out", default=None, help="keep the --time run's folder here")
    args = parser.parse_args(argv)
    if args.compile:
        return compile_only(args)
    if args.emulate:
        return 1 if emulate(args) else 0
    failures = check(args) if args.check else 0
    if args.time and not failures:
        time_cases(args)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
