"""``xformers`` — xformers.ops.memory_efficient_attention (CUDA).

xformers has no CPU operator, so on a machine without CUDA (or without xformers installed) the contender
is unavailable with that reason. Layout is (B, S, H, D); GQA uses xformers' 5-D form (B, S, Hkv, G, D)
with k and v broadcast over the group. Masks are xformers' attention-bias types: LowerTriangularMask,
LowerTriangularFromBottomRightMask, LowerTriangularFromBottomRightLocalAttentionMask(window) for the
sliding window, BlockDiagonalCausalMask over the packed documents (the batch folded into one packed
sequence, its varlen form); padding and alibi use an additive bias tensor (alibi's bias, −inf where the
mask hides a key). softcap is unsupported (no such bias); a paged cache is gathered back into contiguous
k and v by the harness inside the timed call.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import warnings
from collections.abc import Callable
from typing import Any

import torch

from attnbench.contender import ALL_MASKS, Capabilities, Contender
from attnbench.inputs import AttentionInputs
from attnbench.masks import document_lengths
from attnbench.workload import Workload


def _ops() -> Any:
    import xformers.ops

    return xformers.ops


class XformersMemoryEfficient(Contender):
    name = "xformers"
    description = "xformers.ops.memory_efficient_attention (CUDA only; a paged cache is gathered in the call)"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}), masks=ALL_MASKS - {"mixed"}, score_mods=frozenset({"none", "alibi"}),
        paged="gather", backward=True,
    )  # fmt: skip

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
        if workload.score_mod == "softcap":
            return "score_mod softcap not supported: xformers' attention biases are additive, softcap needs tanh"
        if workload.module == "mha":
            return "copies q into its (B, S, H, D) layout in prepare, so it can't read the mha module's projections"
        return super().unsupported_reason(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        ops = _ops()
        w = workload
        B, Hkv, G, Sq, Sk, D = w.batch, w.kv_heads, w.gqa_group, w.seq_q, w.seq_k, w.head_dim
        # (B, H, S, D) -> (B, S, Hkv, G, D); k and v broadcast over the group without copying.
        q = inputs.q.transpose(1, 2).reshape(B, Sq, Hkv, G, D).contiguous()
        biases = ops.fmha.attn_bias
        bias: Any = None
        packed = w.mask == "document" and w.score_mod == "none"  # the batch as one packed varlen sequence
        if w.score_mod == "alibi" or w.mask in ("padding", "chunked"):  # a dense additive bias
            additive = torch.zeros(1, w.heads, Sq, Sk, dtype=q.dtype, device=q.device)
            if inputs.alibi_bias is not None:
                additive = additive + inputs.alibi_bias
            if inputs.bool_mask is not None:
                additive = additive.masked_fill(~inputs.bool_mask, float("-inf"))
            bias = additive.expand(B, w.heads, Sq, Sk).reshape(B, Hkv, G, Sq, Sk)
        elif w.mask == "causal":
            bias = ops.LowerTriangularMask()
        elif w.mask == "causal_bottom_right":
            bias = biases.LowerTriangularFromBottomRightMask()
        elif w.mask == "sliding_window":
            bias = biases.LowerTriangularFromBottomRightLocalAttentionMask(w.window)
        elif packed:
            lengths = document_lengths(Sq, w.documents) * B
            bias = biases.BlockDiagonalCausalMask.from_seqlens(lengths, device=q.device)
            q = q.reshape(1, B * Sq, Hkv, G, D)
        scale = inputs.scale

        def run() -> torch.Tensor:
            batch, keys = (1, B * Sk) if packed else (B, Sk)
            k, v = (t.transpose(1, 2).reshape(batch, keys, Hkv, 1, D).expand(batch, keys, Hkv, G, D)
                    for t in (inputs.k, inputs.v))  # fmt: skip
            out = ops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)  # (B, Sq, Hkv, G, D)
            return out.reshape(B, Sq, Hkv * G, D).transpose(1, 2)

        return run


contender = XformersMemoryEfficient()
