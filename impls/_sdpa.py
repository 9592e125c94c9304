"""torch.nn.functional.scaled_dot_product_attention forced to one backend.

Each backend is its own contender (sdpa_math.py, sdpa_flash.py, …) so that a silent fallback cannot
masquerade as another: the call runs under ``sdpa_kernel([backend])`` alone, and when that backend has
no kernel for the workload torch raises, which we report as ``unsupported`` with torch's own warnings
as the reason.

Masks other than top-left causal go in as SDPA users pass them: a dense boolean ``attn_mask`` (a ragged or
mixed batch's per sequence, (B, 1, Sq, Sk), as users pad a varlen batch for SDPA), or an
additive float one carrying alibi's bias with −inf where the mask hides a key; that mask is built in
``prepare`` and its memory is part of the memory model. softcap has no place in SDPA (it would need the
scores), so it is unsupported, and so are learned sinks (SDPA's softmax denominator sums the keys only, and
it returns no log-sum-exp to rescale by); a paged cache is gathered back into contiguous k and v by the
harness inside the timed call; a cache in another kv_dtype (SDPA takes q, k, v of one dtype) is dequantized
in the call.

Values with their own head dim Dv (torch documents value (…, S, Ev)) go in as they are, and a latent (MLA)
cache's values as the view of its first Dv channels. Where the backend has no kernel for Ev ≠ E (CPU flash
needs one head dim), the call does what vLLM does for such kernels (:func:`_one_head_dim`): zero-pads the
narrower side to one head dim inside the timed call and slices the output to Dv — for a latent cache's
forward it passes the whole cache as v instead (no copy; the extra output channels are sliced away).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attnbench.contender import ALL_MASKS, Capabilities, Contender, Unsupported, score_matrix_bytes
from attnbench.errors import one_line
from attnbench.inputs import AttentionInputs
from attnbench.sequences import is_ragged
from attnbench.workload import Workload

SOFTCAP = "score_mod softcap not supported: SDPA takes a mask, not a function of the scores (softcap needs tanh)"
SINKS = (
    "sinks learned not supported: SDPA's softmax has no sink term (its denominator sums the keys only, and "
    "it returns no log-sum-exp to rescale by)"
)


def mask_bytes(w: Workload) -> float:
    """The mask SDPA is given (per batch element for padding and for a ragged or mixed batch)."""
    extra, per_batch = 0.0, w.mask == "padding" or is_ragged(w)
    if w.score_mod == "alibi":  # additive float mask: one per head
        extra += (w.batch if per_batch else 1) * w.heads * w.seq_q * w.seq_k * w.torch_dtype.itemsize
    elif w.mask not in ("none", "causal") or is_ragged(w):  # boolean mask
        extra += (w.batch if per_batch else 1) * w.seq_q * w.seq_k
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
            features=frozenset({"head_dim_v", "kv_layout", "kv_dtype", "lengths", "shared_prefix"}),
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
            return super().predicted_extra_bytes(workload) + mask_bytes(workload) + padding_bytes(workload)
        # The math backend materialises scores, probabilities and a masked copy, in at least fp32, and copies
        # k (measured on CPU, torch 2.13: one (B, Hq, Sk, D) copy; with GQA four: k and v expanded to Hq heads,
        # and copies of them; decode at B 8, 16k keys: 7.7 GiB at its peak RSS).
        w, element = workload, max(4, workload.torch_dtype.itemsize)
        channels = 2 * (w.head_dim + w.head_dim_v) if w.kv_heads != w.heads else w.head_dim
        copies = channels * w.batch * w.heads * w.seq_k * element
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
        elif workload.mask == "causal" and not is_ragged(workload):
            kwargs["is_causal"] = True  # top-left, which is torch's definition
        elif inputs.bool_mask is not None and not bool(inputs.bool_mask.all()):
            kwargs["attn_mask"] = inputs.bool_mask  # (B|1, 1, Sq, Sk) bool, True = visible
        # else a mask that hides nothing (decode's one query bottom-right sees every key) is no mask at all:
        # what a user passes, and what flash, efficient and cuDNN take
        if workload.kv_heads != workload.heads:
            kwargs["enable_gqa"] = True
        q, load = inputs.q, inputs.kv_loader()  # k, v dequantized in the call when the cache is narrower

        def call(operands: Operands, head_dim_v: int | None = None) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                k, v = load()
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(*operands(q, k, v), **kwargs)
                out = out if head_dim_v is None else out[..., :head_dim_v]
                return out if empty is None else out.masked_fill(empty, 0.0)

            return run

        run = call(lambda q, k, v: (q, k, v))
        if workload.head_dim_v == workload.head_dim:
            _probe(run)
            return run
        try:
            _probe(run)  # the backend may take Ev ≠ E itself
        except Unsupported:
            run = call(_one_head_dim(workload), workload.head_dim_v)
            _probe(run)
        return run


Operands = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _one_head_dim(w: Workload) -> Operands:
    """q, k, v brought to one head dim, in the timed call, for a backend without a kernel for Ev ≠ E: a
    latent cache's forward passes the whole cache as v (no copy); otherwise the narrower side is
    zero-padded (zero channels add nothing to q·kᵀ; v's zero channels give output channels sliced away)."""
    narrower = w.head_dim - w.head_dim_v
    if w.kv_layout == "latent" and w.pass_ == "fwd":
        return lambda q, k, v: (q, k, k)
    if narrower > 0:
        return lambda q, k, v: (q, k, F.pad(v, (0, narrower)))
    return lambda q, k, v: (F.pad(q, (0, -narrower)), F.pad(k, (0, -narrower)), v)


def padding_bytes(w: Workload) -> float:
    """Memory model of :func:`_one_head_dim` (an upper bound: the backend may take Ev ≠ E itself): the padded
    copies and the output at the wider head dim."""
    if w.head_dim_v == w.head_dim:
        return 0.0
    wide = max(w.head_dim, w.head_dim_v)
    padded = w.batch * w.kv_heads * w.seq_k * wide  # v padded
    if w.head_dim_v > w.head_dim:  # q and k padded
        padded = (w.batch * w.heads * w.seq_q + w.batch * w.kv_heads * w.seq_k) * wide
    return float((padded + w.batch * w.heads * w.seq_q * wide) * w.torch_dtype.itemsize)


def _probe(run: Callable[[], torch.Tensor]) -> None:
    """Call once so 'no kernel for this backend' surfaces as Unsupported with torch's reasons: its warnings
    ("Flash attention kernel not used because:" and the line that says why), or its error when it warned
    nothing, as one line without torch's "(Triggered internally at …/sdp_utils.cpp:986.)" (errors.one_line)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except RuntimeError as exc:
            if not _NO_KERNEL.search(str(exc)):
                raise
            said = [str(w.message) for w in caught] or [str(exc)]
            raise Unsupported(one_line("no kernel for this workload:\n" + "\n".join(said))) from None
