"""``xformers`` — xformers.ops.memory_efficient_attention (CUDA).

xformers has no CPU operator, so on a machine without CUDA (or without xformers installed) the contender
is unavailable with that reason. Its kernels are a C++/CUDA extension that loads only under the torch it
was built for, while ``import xformers.ops`` succeeds under any (every call would then fail with "No operator
found"): so on CUDA it is available only when xformers says the extension loaded, and otherwise the reason
names the torch it was built for and this one (read from the build's cpp_lib.json, _xformers_build.py),
which a machine without CUDA already says when they differ.

Layout is (B, S, H, D); GQA uses xformers' 5-D form (B, S, Hkv, G, D) with k and v broadcast over the
group. Masks are xformers' attention-bias types: LowerTriangularMask,
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
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from attnbench import errors
from attnbench.contenders.contract import ALL_MASKS, Capabilities, Contender
from attnbench.impls._xformers_build import PAIR_HINT, built_for, mismatch, pair_message
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import document_lengths


def _extension_reason(xformers: ModuleType) -> str | None:
    """None when xformers' C++/CUDA extension loaded (its own ``_has_cpp_library``), else why not: built for
    another torch (its build's torch against this one, as read), or the error it kept from loading it."""
    if getattr(xformers, "_has_cpp_library", True):  # trusted over the versions: a patch release may load
        return None
    version = getattr(xformers, "__version__", "?")
    built = built_for()
    if built is not None and built != torch.__version__:
        return pair_message(version, built, torch.__version__)
    failure = getattr(getattr(xformers, "_cpp_lib", None), "_cpp_library_load_exception", None)
    why = errors.reason(failure) if isinstance(failure, BaseException) else "xformers gave no reason"
    return f"xformers {version}'s C++/CUDA extension did not load ({why})"


def _ops() -> Any:
    import xformers.ops

    return xformers.ops


class XformersMemoryEfficient(Contender):
    name = "xformers"
    description = "xformers.ops.memory_efficient_attention (CUDA only; a paged cache is gathered in the call)"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        masks=ALL_MASKS - {"mixed"},
        score_mods=frozenset({"none", "alibi"}),
        paged="gather",
        backward=True,
    )

    def availability(self) -> str | None:
        if not torch.cuda.is_available():  # say so without importing it (over a second, in every process)
            try:
                version = importlib.metadata.version("xformers")
            except importlib.metadata.PackageNotFoundError:
                # Not `pip install xformers` alone: its wheel loads only under the torch it was built for.
                return (
                    f"xformers is not installed; it runs on CUDA under the torch its wheel was built for — {PAIR_HINT}"
                )
            no_cpu = f"xformers {version} has no CPU operator for memory_efficient_attention; it needs CUDA"
            built = built_for()
            if built is None or not mismatch(built, torch.__version__):
                return no_cpu
            return f"{no_cpu} and torch {built}, the torch it was built for (this is {torch.__version__}) — {PAIR_HINT}"
        try:
            # xformers logs a multi-line warning on import when its CUDA extensions don't load; the
            # reason below says what matters, so keep the warning off the user's screen.
            with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import xformers.ops  # noqa: F401  (importing it is the first check)
        except Exception as exc:  # any import failure means unavailable, with the reason
            return f"xformers is not installed or failed to import ({errors.reason(exc)})"
        return _extension_reason(sys.modules["xformers"])

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
            # xformers' kernels want the bias's rows 8-aligned (16 bytes in bf16/fp16): a padded tensor, sliced
            padded = torch.empty(*additive.shape[:-1], -(-Sk // 8) * 8, dtype=q.dtype, device=q.device)
            additive = padded[..., :Sk].copy_(additive)
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
            k, v = (
                t.transpose(1, 2).reshape(batch, keys, Hkv, 1, D).expand(batch, keys, Hkv, G, D)
                for t in (inputs.k, inputs.v)
            )
            out = ops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)  # (B, Sq, Hkv, G, D)
            return out.reshape(B, Sq, Hkv * G, D).transpose(1, 2)

        return run


contender = XformersMemoryEfficient()
