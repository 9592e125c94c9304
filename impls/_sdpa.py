"""torch.nn.functional.scaled_dot_product_attention forced to one backend.

Each backend is its own contender (sdpa_math.py, sdpa_flash.py, …) so that a silent fallback cannot
masquerade as another: the call runs under ``sdpa_kernel([backend])`` alone, and when that backend has
no kernel for the workload torch raises, which we report as ``unsupported`` with torch's own warnings
as the reason.

Masks other than top-left causal go in as SDPA users pass them: a dense boolean ``attn_mask``, or an
additive float one carrying alibi's bias with −inf where the mask hides a key; that mask is built in
``prepare`` and its memory is part of the memory model. softcap has no place in SDPA (it would need the
scores), so it is unsupported, and so are learned sinks (SDPA's softmax denominator sums the keys only, and
it returns no log-sum-exp to rescale by); a paged cache is gathered back into contiguous k and v by the
harness inside the timed call; a cache in another kv_dtype (SDPA takes q, k, v of one dtype) is dequantized
in the call.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attnbench.contender import ALL_MASKS, Capabilities, Contender, Unsupported, score_matrix_bytes
from attnbench.inputs import AttentionInputs
from attnbench.workload import Workload

SOFTCAP = "score_mod softcap not supported: SDPA takes a mask, not a function of the scores (softcap needs tanh)"
SINKS = (
    "sinks learned not supported: SDPA's softmax has no sink term (its denominator sums the keys only, and "
    "it returns no log-sum-exp to rescale by)"
)


def mask_bytes(w: Workload) -> float:
    """The mask SDPA is given."""
    extra = 0.0
    if w.score_mod == "alibi":  # additive float mask: one per head, per batch element for padding
        extra += (w.batch if w.mask == "padding" else 1) * w.heads * w.seq_q * w.seq_k * w.torch_dtype.itemsize
    elif w.mask not in ("none", "causal"):  # boolean mask
        extra += (w.batch if w.mask == "padding" else 1) * w.seq_q * w.seq_k
    return extra


_NO_KERNEL = re.compile(r"No available kernel|No viable backend", re.IGNORECASE)


def _backend(member: str) -> Any:
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, member)


class SdpaBackend(Contender):
    """One SDPA backend. ``member`` is the torch.nn.attention.SDPBackend name."""

    def __init__(self, name: str, member: str, devices: frozenset[str], description: str) -> None:
        self.name = name
        self.member = member
        self.description = description
        self.capabilities = Capabilities(
            devices=devices, masks=ALL_MASKS, score_mods=frozenset({"none", "alibi"}), paged="gather", backward=True,
            features=frozenset({"kv_dtype"}),
        )  # fmt: skip

    def availability(self) -> str | None:
        try:
            _backend(self.member)
        except (ImportError, AttributeError):
            return f"torch {torch.__version__} has no SDPBackend.{self.member}"
        if self.capabilities.devices == frozenset({"cuda"}) and not torch.cuda.is_available():
            return f"SDPA {self.member} is a CUDA-only backend and torch.cuda.is_available() is False"
        return None

    def predicted_extra_bytes(self, workload: Workload) -> float:
        if self.member != "MATH":
            return super().predicted_extra_bytes(workload) + mask_bytes(workload)
        # The math backend materialises scores, probabilities and a masked copy, in at least fp32, and copies
        # k (measured on CPU, torch 2.13: one (B, Hq, Sk, D) copy; with GQA four: k and v expanded to Hq heads,
        # and copies of them; decode at B 8, 16k keys: 7.7 GiB at its peak RSS).
        w, element = workload, max(4, workload.torch_dtype.itemsize)
        copies = (4 if w.kv_heads != w.heads else 1) * w.batch * w.heads * w.seq_k * w.head_dim * element
        return score_matrix_bytes(w, 3, element=element) + copies + mask_bytes(w)

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.score_mod == "softcap":
            return SOFTCAP
        if workload.sinks != "none":
            return SINKS
        return super().unsupported_reason(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        from torch.nn.attention import sdpa_kernel

        backend = _backend(self.member)
        kwargs: dict[str, Any] = {"scale": inputs.scale}
        empty = None
        if inputs.alibi_bias is not None:  # additive: alibi's bias, −inf where the mask hides a key
            additive = inputs.alibi_bias  # (1, H, Sq, Sk)
            if inputs.bool_mask is not None:
                additive = additive.masked_fill(~inputs.bool_mask, float("-inf"))
            kwargs["attn_mask"] = additive
            empty = inputs.empty_rows  # rows of −inf only would come out NaN; the definition says zeros
        elif workload.mask == "causal":
            kwargs["is_causal"] = True  # top-left, which is torch's definition
        elif workload.mask != "none":
            kwargs["attn_mask"] = inputs.bool_mask  # (B|1, 1, Sq, Sk) bool, True = visible
        if workload.kv_heads != workload.heads:
            kwargs["enable_gqa"] = True
        q, load = inputs.q, inputs.kv_loader()  # k, v dequantized in the call when the cache is narrower

        def run() -> torch.Tensor:
            k, v = load()
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            return out if empty is None else out.masked_fill(empty, 0.0)

        _probe(run)
        return run


def _probe(run: Callable[[], torch.Tensor]) -> None:
    """Call once so 'no kernel for this backend' surfaces as Unsupported with torch's reasons."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except RuntimeError as exc:
            if not _NO_KERNEL.search(str(exc)):
                raise
            why = "; ".join(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in caught))
            raise Unsupported(f"no kernel for this workload: {why or str(exc).splitlines()[0]}") from None
