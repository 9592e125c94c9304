"""``flex`` — torch FlexAttention, compiled with torch.compile.

The block mask is built in ``prepare`` and dynamo's cache is reset there, so the first timed call
carries the compilation; the harness reports that call as ``first_call_ms`` and keeps it out of the
timing samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnbench.contender import Capabilities, Contender, score_matrix_bytes
from attnbench.inputs import AttentionInputs
from attnbench.workload import Workload


def _mask_mod(inputs: AttentionInputs) -> Callable[..., Any] | None:
    w = inputs.workload
    if w.mask == "causal":
        return lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
    if w.mask == "causal_bottom_right":
        offset = w.seq_k - w.seq_q
        return lambda b, h, q_idx, kv_idx: q_idx + offset >= kv_idx
    if w.mask == "padding":
        lengths = torch.tensor(inputs.lengths, device=inputs.q.device)
        return lambda b, h, q_idx, kv_idx: kv_idx < lengths[b]
    return None


class FlexAttention(Contender):
    name = "flex"
    description = "torch.nn.attention.flex_attention under torch.compile (block-sparse masks)"
    capabilities = Capabilities(backward=True, min_head_dim=16)

    def availability(self) -> str | None:
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as exc:
            return f"torch {torch.__version__} has no FlexAttention ({exc})"
        return None

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.pass_ != "fwd" and workload.device == "cpu":
            return f"FlexAttention has no backward on CPU (torch {torch.__version__} raises NotImplementedError)"
        return super().unsupported_reason(workload)

    def predicted_extra_bytes(self, workload: Workload) -> float:
        if workload.device == "cuda":
            return super().predicted_extra_bytes(workload)
        # Measured on CPU (torch 2.13): peak grows with Sq·Sk at about half a score matrix.
        return score_matrix_bytes(workload, 0.6)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        w = workload
        mask_mod = _mask_mod(inputs)
        block_mask = None
        if mask_mod is not None:
            batch = w.batch if w.mask == "padding" else None
            block_mask = create_block_mask(mask_mod, batch, None, w.seq_q, w.seq_k, device=w.device)
        torch._dynamo.reset()  # fresh compile per case: comparable first_call_ms, no recompile limit
        compiled = torch.compile(flex_attention, dynamic=False)
        q, k, v, scale, gqa = inputs.q, inputs.k, inputs.v, inputs.scale, w.kv_heads != w.heads

        def run() -> torch.Tensor:
            return compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)

        return run


contender = FlexAttention()
