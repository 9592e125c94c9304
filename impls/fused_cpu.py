"""``fused_cpu`` — our fused, memory-efficient attention for the CPU (FlashAttention's recurrence in C++).

The kernel (``fused_cpu_kernel.cpp``, built at first use, see ``_cpu_kernel.py``) walks blocks of
BLOCK_Q query rows against blocks of BLOCK_K keys with the online softmax, so its working memory is a
BLOCK_Q × BLOCK_K score tile per thread instead of the S×S matrix, and it never visits a key block the
mask hides completely (causal does about half the work of none). Each thread's tiles — 256 query rows
× 256 keys, the q rows, the output accumulator — fit its L2 cache; the inner products are register
tiles of 6 rows × 64 floats, the exponential is AVX-512's scalef on a polynomial.

Everything here is done in float32: bfloat16 and float16 inputs are widened on the way in (an O(S·D)
copy) and the output narrowed on the way out. Besides that, the kernel packs kᵀ into panels of 64 keys
in scratch memory this file allocates, and v is padded when head_dim is not a multiple of 16 — O(S·D)
too. All of it happens inside the timed call, because the mha module rewrites q, k and v before each call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contender import Capabilities, Contender
from attnbench.impls import _cpu_kernel
from attnbench.inputs import AttentionInputs
from attnbench.workload import Workload

BLOCK_Q = 256
BLOCK_K = 256


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: str = "none",
    lengths: torch.Tensor | None = None,
    threads: int | None = None,
) -> tuple[torch.Tensor, int]:
    """softmax(q·kᵀ·scale + mask)·v for q (B, H, Sq, D) and k, v (B, Hkv, Sk, D) on the CPU, H a multiple of
    Hkv; ``lengths`` (int64, one per batch element) for the padding mask. Returns the output, in q's dtype,
    and the number of score entries the kernel computed (how block skipping shows)."""
    kernel = _cpu_kernel.load()
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    padded_dim = _round_up(head_dim, _cpu_kernel.VECTOR)
    block_q = min(BLOCK_Q, seq_q)
    threads = threads or torch.get_num_threads()
    if lengths is not None:
        lengths = lengths.to(torch.int64).contiguous()  # any integer tensor; the kernel reads int64

    q32 = q.detach().to(torch.float32).contiguous()
    k32 = k.detach().to(torch.float32).contiguous()
    kt = torch.empty(batch * kv_heads * kernel.packed_keys(seq_k) * head_dim)  # the kernel packs kᵀ here
    if padded_dim == head_dim:
        v32 = v.detach().to(torch.float32).contiguous()
    else:
        v32 = torch.zeros(batch, kv_heads, seq_k, padded_dim, dtype=torch.float32)
        v32[..., :head_dim].copy_(v.detach())
    out = torch.empty(batch, heads, seq_q, padded_dim, dtype=torch.float32)
    scratch = torch.empty(threads * kernel.scratch_floats(block_q, BLOCK_K, head_dim, padded_dim))
    tiles = kernel.forward(
        q32,
        k32,
        kt,
        v32,
        out,
        scale=scale,
        mask=mask,
        lengths=lengths,
        block_q=block_q,
        block_k=BLOCK_K,
        threads=threads,
        scratch=scratch,
    )
    result = out if padded_dim == head_dim else out[..., :head_dim]
    return result.to(q.dtype), tiles


class FusedCpu(Contender):
    name = "fused_cpu"
    description = "ours: C++ online-softmax attention, 256×256 tiles, skips masked blocks, no S² memory"
    capabilities = Capabilities(devices=frozenset({"cpu"}))

    def availability(self) -> str | None:
        return _cpu_kernel.unavailable_reason()

    def predicted_extra_bytes(self, workload: Workload) -> float:
        w = workload
        kernel = _cpu_kernel.load()  # predictions are made only for available contenders
        padded_dim = _round_up(w.head_dim, _cpu_kernel.VECTOR)
        widened = w.torch_dtype != torch.float32
        q_rows = w.batch * w.heads * w.seq_q
        kv_rows = w.batch * w.kv_heads * w.seq_k
        floats = w.batch * w.kv_heads * kernel.packed_keys(w.seq_k) * w.head_dim  # packed kᵀ
        floats += kv_rows * padded_dim if widened or padded_dim != w.head_dim else 0  # v in float32
        floats += (q_rows + kv_rows) * w.head_dim if widened else 0  # q and k in float32
        floats += q_rows * padded_dim if widened or padded_dim != w.head_dim else 0  # the float32 output
        per_thread = kernel.scratch_floats(min(BLOCK_Q, w.seq_q), BLOCK_K, w.head_dim, padded_dim)
        return 4.0 * (floats + torch.get_num_threads() * per_thread)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        _cpu_kernel.load()
        lengths = None if inputs.lengths is None else torch.tensor(inputs.lengths, dtype=torch.int64)
        scale, mask = inputs.scale, workload.mask

        def run() -> torch.Tensor:
            out, _ = fused_attention(inputs.q, inputs.k, inputs.v, scale=scale, mask=mask, lengths=lengths)
            return out

        return run


contender = FusedCpu()
