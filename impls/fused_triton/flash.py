"""fused_triton's Python side: the attention function, its plan, the launches and the autograd wrapper.

``flash_attention(q, k, v, ...)`` computes softmax(q·kᵀ·scale + mask [+ score modifiers])·v with the
kernels of ``kernels`` (their docstring has the algorithm) and, when q, k or v require grad,
records a backward that runs the FlashAttention-2 backward kernels. Its keyword arguments:

* ``mask``: one of attnbench's masks (``none``, ``causal`` top-left, ``causal_bottom_right``,
  ``padding`` with ``lengths``, an int32 (B,) tensor of valid key counts);
* ``window=W``: a sliding window, key j visible to row i iff i + (Sk − Sq) − W < j ≤ i + (Sk − Sq);
* ``document_ids`` (B, S) or ``cu_seqlens`` (n + 1,) offsets shared by the batch: row i sees key j iff
  both lie in the same document and j ≤ i (Sq = Sk); documents are runs of equal ids;
* ``softcap=c``: scores ← c·tanh(scores/c), before the mask;
* ``alibi=True``: score += −slope_h·|i + (Sk − Sq) − j|, slope_h = 2^(−8(h+1)/H).

A :class:`Plan` holds everything about a call that does not change between calls (mask tables built on
the device, flags, scale) and the tile chosen for each kernel; fused_triton builds it and tunes it in
``prepare`` (``plan.tune``), so each timed call launches ``kernel[grid](..., BLOCK_M=…, num_warps=…)``
directly. Tile choice, pruning and the tuning cache are in ``tiles``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import torch
import triton

from attnbench.impls.fused_triton import kernels
from attnbench.impls.fused_triton.tiles import (
    CUDA_TILES,
    INTERPRETER_TILES,
    Tile,
    choose,
    max_shared_memory,
    prune,
    tuning_key,
)
from attnbench.workload import MASKS

LOG2_E = 1.4426950408889634
# fp32 dots on CUDA: three TF32 passes give fp32-level products (plain TF32 misses attnbench's 1e-4).
FP32_CUDA_PRECISION = "tf32x3"
PREPROCESS_BLOCK_M = 32


def _interpreting() -> bool:
    """Whether ``triton.jit`` (at this module's import) made interpreted functions: Triton's own switch."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in {"1", "true", "on", "yes"}


INTERPRETED = _interpreting()
KERNELS = ("fwd", "dkdv", "dq")


def causal_offset(mask: str, seq_q: int, seq_k: int) -> int | None:
    """The diagonal offset of a causal mask (row i sees keys j <= i + offset), or None for other masks."""
    if mask == "causal":
        return 0
    if mask == "causal_bottom_right":
        return seq_k - seq_q
    return None


def alibi_slopes(heads: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """ALiBi's slopes 2^(−8(h+1)/H), h = 0 … H − 1, fp32 (H,)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32, device=device)


def document_bounds(
    document_ids: torch.Tensor | None, cu_seqlens: torch.Tensor | None, batch: int, seq: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (start, end) of its document, int32 (B, S) each, from ids (B, S) or offsets (n + 1,)."""
    if cu_seqlens is not None:
        offsets = cu_seqlens.to("cpu", torch.int64)
        if offsets[0] != 0 or offsets[-1] != seq or bool((offsets[1:] < offsets[:-1]).any()):
            raise ValueError(f"cu_seqlens must rise from 0 to the sequence length {seq}, got {offsets.tolist()}")
        document_ids = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff()).expand(batch, seq)
    assert document_ids is not None
    ids = document_ids.to("cpu", torch.int64)
    if ids.shape != (batch, seq):
        raise ValueError(f"document_ids must have shape {(batch, seq)}, got {tuple(ids.shape)}")
    starts, ends = torch.empty(batch, seq, dtype=torch.int32), torch.empty(batch, seq, dtype=torch.int32)
    for b in range(batch):
        values, counts = torch.unique_consecutive(ids[b], return_counts=True)
        if len(values) != len(torch.unique(values)):
            raise ValueError("document_ids: each document must be one run of equal ids")
        ends_b = torch.cumsum(counts, 0)
        starts[b] = torch.repeat_interleave(ends_b - counts, counts).to(torch.int32)
        ends[b] = torch.repeat_interleave(ends_b, counts).to(torch.int32)
    return starts.to(device), ends.to(device)


@dataclasses.dataclass
class Plan:
    """What a call needs besides q, k, v: flags, scalars, device tables, and the chosen tiles."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    scale: float
    causal_offset: int | None = None
    window: int = 0
    lengths: torch.Tensor | None = None  # int32 (B,)
    doc_start: torch.Tensor | None = None  # int32 (B, S)
    doc_end: torch.Tensor | None = None
    softcap: float = 0.0
    slopes: torch.Tensor | None = None  # fp32 (Hq,)
    tiles: dict[str, Tile] = dataclasses.field(default_factory=dict)

    @property
    def block_d(self) -> int:
        return max(16, triton.next_power_of_2(self.head_dim))

    def features(self) -> tuple[Any, ...]:
        """The mask family and score modifiers: part of the tuning key."""
        return (self.causal_offset is not None, self.window > 0, self.lengths is not None,
                self.doc_start is not None, self.softcap > 0, self.slopes is not None)  # fmt: skip

    def constants(self) -> dict[str, Any]:
        """The constexpr arguments every kernel shares."""
        interpreted_bf16 = INTERPRETED and self.dtype == torch.bfloat16
        fp32 = "ieee" if INTERPRETED else FP32_CUDA_PRECISION
        return {
            "HEAD_DIM": self.head_dim,
            "BLOCK_D": self.block_d,
            "EVEN_D": self.block_d == self.head_dim,
            "CAUSAL": self.causal_offset is not None,
            "WINDOW": self.window > 0,
            "PADDED": self.lengths is not None,
            "DOCS": self.doc_start is not None,
            "SOFTCAP": self.softcap > 0,
            "ALIBI": self.slopes is not None,
            "INPUT_PRECISION": fp32 if self.dtype == torch.float32 else "tf32",
            "UPCAST": interpreted_bf16,
        }

    def scalars(self) -> tuple[Any, ...]:
        return (self.scale, self.scale * LOG2_E, self.softcap or 1.0)

    def tables(self) -> tuple[Any, ...]:
        return (self.lengths, self.doc_start, self.doc_end, self.slopes)

    def candidates(self, kernel: str) -> list[Tile]:
        if INTERPRETED:
            return [INTERPRETER_TILES[kernel]]
        return prune(kernel, CUDA_TILES[kernel], seq_q=self.seq_q, seq_k=self.seq_k, head_dim=self.head_dim,
                     itemsize=self.dtype.itemsize, shared_cap=max_shared_memory(self.device))  # fmt: skip

    def tile(self, kernel: str, q: torch.Tensor, k: torch.Tensor, launch: Any) -> Tile:
        """The tile of ``kernel``: the one chosen already, or chosen now (timed once per tuning key)."""
        if kernel not in self.tiles:
            key = tuning_key(kernel, q, k, self.features())
            self.tiles[kernel] = choose(key, self.candidates(kernel), launch)
        return self.tiles[kernel]

    def tune(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool = False) -> None:
        """Choose every tile now (outside any timed region), running the kernels once when there is a
        choice to time (not in the interpreter, where each kernel has one tile)."""
        kernels = KERNELS if backward else ("fwd",)
        single = {kernel: self.candidates(kernel) for kernel in kernels}
        if all(len(tiles) == 1 for tiles in single.values()):
            self.tiles.update({kernel: tiles[0] for kernel, tiles in single.items()})
            return
        with torch.no_grad():
            out, lse = forward(q, k, v, self, store_lse=backward)
        if backward:
            assert lse is not None
            backward_grads(q, k, v, out, lse, torch.ones_like(out), self)


def make_plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    mask: str = "none",
    lengths: torch.Tensor | None = None,
    window: int | None = None,
    document_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    softcap: float | None = None,
    alibi: bool = False,
) -> Plan:
    """Validate a call's arguments and build its plan (tables on q's device)."""
    B, Hq, Sq, D = q.shape
    _, Hkv, Sk, _ = k.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or Hq % Hkv:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if mask not in MASKS:
        raise ValueError(f"unknown mask {mask!r}; known: {', '.join(MASKS)}")
    if mask == "padding" and (lengths is None or lengths.shape != (B,) or lengths.dtype != torch.int32):
        raise ValueError("mask 'padding' needs lengths: an int32 tensor of shape (B,)")
    plan = Plan(B, Hq, Hkv, Sq, Sk, D, q.dtype, q.device, 1.0 / math.sqrt(D) if scale is None else scale)
    plan.causal_offset = causal_offset(mask, Sq, Sk)
    plan.lengths = lengths if mask == "padding" else None
    if window is not None:
        if window < 1 or mask not in ("none", "causal_bottom_right"):
            raise ValueError(f"window must be ≥ 1 with mask none or causal_bottom_right, got {window} with {mask}")
        plan.causal_offset, plan.window = Sk - Sq, window
    if document_ids is not None or cu_seqlens is not None:
        if Sq != Sk or mask not in ("none", "causal") or window is not None:
            raise ValueError("documents need Sq == Sk, mask none or causal, and no window")
        plan.causal_offset = 0
        plan.doc_start, plan.doc_end = document_bounds(document_ids, cu_seqlens, B, Sq, q.device)
    if softcap is not None:
        if not softcap > 0:
            raise ValueError(f"softcap must be > 0, got {softcap}")
        plan.softcap = float(softcap)
    if alibi:
        plan.slopes = alibi_slopes(Hq, q.device)
    return plan


def _row_grid(plan: Plan, heads: int, block: int, length: int) -> tuple[int, int]:
    return heads * plan.batch, triton.cdiv(length, block)  # batch·heads on axis 0: axis 1 caps at 65535


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: Plan,
    store_lse: bool = False,
    visited: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """O (B, Hq, Sq, D) and, with ``store_lse``, the row log-sum-exp (B, Hq, Sq) fp32 in log2 units.
    ``visited`` (tests): an int32 (B·Hq, row tiles, 2) tensor that receives, per program, the number of
    key blocks it visits and how many of them are unmasked."""
    out = q.new_empty(plan.batch, plan.heads, plan.seq_q, plan.head_dim)
    lse = torch.empty(plan.batch, plan.heads, plan.seq_q, dtype=torch.float32, device=q.device) if store_lse else None
    doc_stride = plan.doc_start.stride(0) if plan.doc_start is not None else 0

    def launch(tile: Tile) -> None:
        kernels._forward_kernel[_row_grid(plan, plan.heads, tile.block_m, plan.seq_q)](
            q, k, v, out, lse, *plan.tables(), visited, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            doc_stride, *plan.scalars(), plan.heads, plan.heads // plan.kv_heads, plan.seq_q, plan.seq_k,
            plan.causal_offset or 0, plan.window, **plan.constants(), STORE_LSE=store_lse,
            COUNT_BLOCKS=visited is not None, **tile.launch_kwargs(),
        )  # fmt: skip

    launch(plan.tile("fwd", q, k, launch))
    return out, lse


def backward_grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
    plan: Plan,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) for upstream gradient ``grad_out``, from the forward's output and log-sum-exp."""
    delta = torch.empty_like(lse)
    kernels._preprocess_kernel[_row_grid(plan, plan.heads, PREPROCESS_BLOCK_M, plan.seq_q)](
        out, grad_out, delta, *out.stride(), *grad_out.stride(), plan.heads, plan.seq_q,
        HEAD_DIM=plan.head_dim, BLOCK_D=plan.block_d, BLOCK_M=PREPROCESS_BLOCK_M,
    )  # fmt: skip
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    doc_stride = plan.doc_start.stride(0) if plan.doc_start is not None else 0
    shared = (*plan.scalars(),)
    group = plan.heads // plan.kv_heads

    def launch_dkdv(tile: Tile) -> None:
        kernels._dkdv_kernel[_row_grid(plan, plan.kv_heads, tile.block_n, plan.seq_k)](
            q, k, v, grad_out, lse, delta, dk, dv, *plan.tables(), *q.stride(), *k.stride(), *v.stride(),
            *grad_out.stride(), *dk.stride(), *dv.stride(), doc_stride, *shared, plan.heads, plan.kv_heads, group,
            plan.seq_q, plan.seq_k, plan.causal_offset or 0, plan.window, **plan.constants(), **tile.launch_kwargs(),
        )  # fmt: skip

    def launch_dq(tile: Tile) -> None:
        kernels._dq_kernel[_row_grid(plan, plan.heads, tile.block_m, plan.seq_q)](
            q, k, v, grad_out, lse, delta, dq, *plan.tables(), *q.stride(), *k.stride(), *v.stride(),
            *grad_out.stride(), *dq.stride(), doc_stride, *shared, plan.heads, group, plan.seq_q, plan.seq_k,
            plan.causal_offset or 0, plan.window, **plan.constants(), **tile.launch_kwargs(),
        )  # fmt: skip

    launch_dkdv(plan.tile("dkdv", q, k, launch_dkdv))
    launch_dq(plan.tile("dq", q, k, launch_dq))
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    """Forward saves q, k, v, O and the log-sum-exp; backward runs the FlashAttention-2 kernels."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan) -> torch.Tensor:
        out, lse = forward(q, k, v, plan, store_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        return (*backward_grads(q, k, v, out, lse, grad_out, ctx.plan), None)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Attention with a ready plan: through autograd when a gradient is wanted, else the forward alone."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out: torch.Tensor = _FlashAttention.apply(q, k, v, plan)
        return out
    return forward(q, k, v, plan)[0]


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v for q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), any strides; a new
    (B, Hq, Sq, D) tensor in q's dtype, differentiable. ``options``: see the module docstring."""
    return attend(q, k, v, make_plan(q, k, v, **options))


__all__ = [
    "INTERPRETED",
    "INTERPRETER_TILES",
    "Plan",
    "alibi_slopes",
    "attend",
    "causal_offset",
    "document_bounds",
    "flash_attention",
    "make_plan",
]
