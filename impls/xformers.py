"""``xformers`` — xformers.ops.memory_efficient_attention (CUDA).

xformers has no CPU operator, so on a machine without CUDA (or without xformers installed) the contender
is unavailable with that reason. Layout is (B, S, H, D); GQA uses xformers' 5-D form (B, S, Hkv, G, D)
with k and v broadcast over the group, and padding uses an additive bias tensor.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import warnings
from collections.abc import Callable
from typing import Any

import torch

from attnbench.contender import Capabilities, Contender
from attnbench.inputs import AttentionInputs
from attnbench.workload import Workload


def _ops() -> Any:
    import xformers.ops

    return xformers.ops


class XformersMemoryEfficient(Contender):
    name = "xformers"
    description = "xformers.ops.memory_efficient_attention (CUDA only)"
    capabilities = Capabilities(devices=frozenset({"cuda"}), backward=True)

    def availability(self) -> str | None:
        if not torch.cuda.is_available():  # say so without importing it (over a second, in every process)
            try:
                version = importlib.metadata.version("xformers")
            except importlib.metadata.PackageNotFoundError:
                return "xformers is not installed (pip install attnbench[xformers], on a CUDA machine)"
            return f"xformers {version} has no CPU operator for memory_efficient_attention; it needs CUDA"
        try:
            # xformers logs a multi-line warning on import when its CUDA extensions don't load; the
            # reason below says what matters, so keep the warning off the user's screen.
            with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import xformers.ops  # noqa: F401  (importing it is the check)
        except Exception as exc:  # any import failure means unavailable, with the reason
            return f"xformers is not installed or failed to import ({type(exc).__name__}: {exc})"
        return None

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.module == "mha":
            return "copies q into its (B, S, H, D) layout in prepare, so it can't read the mha module's projections"
        return super().unsupported_reason(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        ops = _ops()
        w = workload
        B, Hkv, G, Sq, Sk, D = w.batch, w.kv_heads, w.gqa_group, w.seq_q, w.seq_k, w.head_dim
        # (B, H, S, D) -> (B, S, Hkv, G, D); k and v broadcast over the group without copying.
        q = inputs.q.transpose(1, 2).reshape(B, Sq, Hkv, G, D).contiguous()
        k = inputs.k.transpose(1, 2).unsqueeze(3).expand(B, Sk, Hkv, G, D)
        v = inputs.v.transpose(1, 2).unsqueeze(3).expand(B, Sk, Hkv, G, D)
        bias: Any = None
        if w.mask == "causal":
            bias = ops.LowerTriangularMask()
        elif w.mask == "causal_bottom_right":
            bias = ops.fmha.attn_bias.LowerTriangularFromBottomRightMask()
        elif w.mask == "padding":
            assert inputs.bool_mask is not None
            additive = torch.zeros(B, 1, 1, Sq, Sk, dtype=q.dtype, device=q.device)
            additive.masked_fill_(~inputs.bool_mask.unsqueeze(2), float("-inf"))
            bias = additive.expand(B, Hkv, G, Sq, Sk)
        scale = inputs.scale

        def run() -> torch.Tensor:
            out = ops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)  # (B, Sq, Hkv, G, D)
            return out.reshape(B, Sq, Hkv * G, D).transpose(1, 2)

        return run


contender = XformersMemoryEfficient()
