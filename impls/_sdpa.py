"""torch.nn.functional.scaled_dot_product_attention forced to one backend, called as a user calls it.

Each backend is its own contender (sdpa_math.py, sdpa_flash.py, …) so that a silent fallback cannot
masquerade as another: the call runs under ``sdpa_kernel([backend])`` alone, and when that backend has
no kernel for the workload torch raises, which we report as ``unsupported`` with torch's own reasons for
that backend (``_sdpa_reasons``).

How each backend is called — what a competent user passes it (torch 2.5 to 2.13):

* **Masks.** Top-left causal is ``is_causal=True`` (torch's definition), and so is bottom-right when Sq = Sk
  (the two agree there). A mask that hides nothing is no mask at all: decode's one query row, bottom-right,
  sees every key (flash refuses any ``attn_mask``). Bottom-right causal with Sq ≠ Sk goes to flash and
  efficient as ``torch.nn.attention.bias.causal_lower_right(Sq, Sk)``, torch's own form of it: on CUDA it runs
  flash's causal kernel (bottom-right aligned) or the efficient kernel's lower-right mask, and where neither
  can run (CPU) torch builds the dense mask in the call. Math and cuDNN have no kernel of their own for it
  in torch (``causal_lower_right`` would only build the dense mask in every call), so they get the dense
  boolean mask built in ``prepare``. Every other mask goes in as SDPA users pass it: a dense boolean
  ``attn_mask`` (a ragged or mixed batch's per sequence, (B, 1, Sq, Sk), as users pad a varlen batch for
  SDPA), or an additive float one carrying alibi's bias with −inf where the mask hides a key; that mask is
  built in ``prepare`` and its memory is part of the memory model.
* **GQA/MQA** (Hq ≠ Hkv): ``enable_gqa=True``, torch's own grouped-query attention: flash and cuDNN read kv
  head h // G themselves (no copy; math repeats k and v inside torch, which its memory model counts). Where
  the efficient kernel refuses it — up to torch 2.11 its constraint list has no grouped-query check, so
  unequal head counts are "no kernel" — k and v are repeated to Hq heads as a user of that backend repeats
  them (transformers' ``repeat_kv``): ``k[:, :, None].expand(B, Hkv, G, Sk, D).reshape(B,
  Hq, Sk, D)`` (:func:`repeat_heads`), a view for MQA (the reshape folds a one-long kv-head dim into a stride-0
  head dim) and a copy of G times the cache otherwise (``repeat_interleave`` copies alike). For the forward
  of a contiguous cache in the dtype the copy is made once in ``prepare``, outside the timed call, as by a
  user who keeps the cache repeated at Hq heads (its memory is in the memory model); a paged or narrower
  cache (gathered or dequantized into k and v in the call) and backward passes (the gradients of k and v
  flow through it) repeat in the call.
* **Rows that see no key** (bottom-right, a window or chunks with Sq > Sk; a ragged batch's rows past a
  sequence's query length): by definition zeros. torch documents no value for them in its fused kernels
  (``causal_lower_right`` warns they come out NaN; cuDNN was measured 1.7 off in bf16 there), so the output
  of every backend has those rows zeroed in the call — one ``masked_fill`` of the output, what a user who
  knows of them does. A wrong value in any other row still fails the correctness check (``incorrect``).

softcap has no place in SDPA (it would need the scores), so it is unsupported, and so are learned sinks
(SDPA's softmax denominator sums the keys only, and it returns no log-sum-exp to rescale by); a paged cache
is gathered back into contiguous k and v by the harness inside the timed call; a cache in another kv_dtype
(SDPA takes q, k, v of one dtype) is dequantized in the call.

Values with their own head dim Dv (torch documents value (…, S, Ev)) go in as they are, and a latent (MLA)
cache's values as the view of its first Dv channels. Where the backend has no kernel for Ev ≠ E (CPU flash
needs one head dim), the call does what vLLM does for such kernels (:func:`_one_head_dim`): zero-pads the
narrower side to one head dim inside the timed call and slices the output to Dv — for a latent cache's
forward it passes the whole cache as v instead (no copy; the extra output channels are sliced away).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attnbench.contenders.contract import (
    ALL_MASKS,
    Capabilities,
    Contender,
    Unsupported,
    output_bytes,
    score_matrix_bytes,
)
from attnbench.impls._sdpa_reasons import probe
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.kv_cache import KvLoad
from attnbench.workload.masks import has_empty_rows, workload_pairs
from attnbench.workload.sequences import is_ragged

SOFTCAP = "score_mod softcap not supported: SDPA takes a mask, not a function of the scores (softcap needs tanh)"
SINKS = (
    "sinks learned not supported: SDPA's softmax has no sink term (its denominator sums the keys only, and "
    "it returns no log-sum-exp to rescale by)"
)
# The backends torch.nn.attention.bias.causal_lower_right has a kernel of: flash (its causal is bottom-right
# aligned) and efficient (custom_mask_type lower-right). For the others it builds the dense mask in the call.
LOWER_RIGHT = frozenset({"FLASH_ATTENTION", "EFFICIENT_ATTENTION"})
# The backends that refuse enable_gqa up to torch 2.11 (check_batch_size_and_num_heads_dense<false> in the
# efficient kernel's constraints): where torch refuses it, their k and v are repeated to Hq heads, and the
# memory model counts that copy. The others take enable_gqa or the row says why not: a repeat tried on the
# off chance would be G times the cache, more than their memory model says (the case was not skipped for it).
REPEATS_KV = frozenset({"EFFICIENT_ATTENTION"})


def mask_bytes(w: Workload, form: str) -> float:
    """The mask SDPA is given in ``form`` (:func:`mask_form`): the additive float one (one per head), the
    boolean one (causal_lower_right builds it in the call off CUDA, where torch has no kernel for it), or none;
    per batch element for padding and for a ragged or mixed batch."""
    per_batch = w.batch if w.mask == "padding" or is_ragged(w) else 1
    if form == "additive":
        return float(per_batch * w.heads * w.seq_q * w.seq_k * w.torch_dtype.itemsize)
    if form == "dense" or (form == "lower_right" and w.device != "cuda"):
        return float(per_batch * w.seq_q * w.seq_k)
    return 0.0


def mask_form(member: str, w: Workload) -> str:
    """How backend ``member`` is given the workload's mask: "additive" (alibi's bias, −inf where the mask
    hides a key), "is_causal", "none" (a mask that hides nothing), "lower_right" (torch's causal_lower_right)
    or "dense" (the boolean mask, True = visible)."""
    if w.score_mod == "alibi":
        return "additive"
    square_bottom_right = w.mask == "causal_bottom_right" and w.seq_q == w.seq_k
    if not is_ragged(w) and (w.mask == "causal" or square_bottom_right):
        return "is_causal"  # top-left, torch's definition; bottom-right is the same square
    if workload_pairs(w) == w.batch * w.seq_q * w.seq_k:  # closed form, no dense mask built to find out
        return "none"
    if w.mask == "causal_bottom_right" and not is_ragged(w) and member in LOWER_RIGHT:
        return "lower_right"
    return "dense"


def mask_arguments(form: str, inputs: AttentionInputs) -> dict[str, Any]:
    """The keyword arguments SDPA takes for a :func:`mask_form`."""
    w = inputs.workload
    if form == "additive":
        additive = inputs.alibi_bias  # (1, H, Sq, Sk)
        assert additive is not None
        if inputs.bool_mask is not None:
            additive = additive.masked_fill(~inputs.bool_mask, float("-inf"))
        return {"attn_mask": additive}
    if form == "is_causal":
        return {"is_causal": True}
    if form == "lower_right":
        from torch.nn.attention.bias import causal_lower_right

        with warnings.catch_warnings():  # "will produce NaNs … when seq_len_q > seq_len_kv": those rows are zeroed
            warnings.simplefilter("ignore")
            return {"attn_mask": causal_lower_right(w.seq_q, w.seq_k)}
    if form == "dense":
        return {"attn_mask": inputs.bool_mask}  # (B|1, 1, Sq, Sk) bool
    return {}


def repeat_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hkv, S, E) → (B, heads, S, E), query head h reading kv head h // G: a view when Hkv is 1 (a
    stride-0 head dim), else a copy (a strided view cannot map h to h // G)."""
    batch, kv_heads, seq, dim = t.shape
    return t[:, :, None].expand(batch, kv_heads, heads // kv_heads, seq, dim).reshape(batch, heads, seq, dim)


def repeats_in_prepare(w: Workload) -> bool:
    """Whether repeated k and v can be made once in ``prepare``: a forward over a contiguous cache in the dtype
    (a paged cache is gathered into k and v, a narrower one dequantized, in every call; backward passes need
    the gradients of k and v through the repeat; the mha module writes k and v in every call)."""
    return w.pass_ == "fwd" and not w.page_size and w.kv_dtype == w.dtype and w.module == "core"


def _backend(member: str) -> Any:
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, member)


Operands = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class SdpaBackend(Contender):
    """One SDPA backend. ``member`` is the torch.nn.attention.SDPBackend name."""

    def __init__(self, name: str, member: str, devices: frozenset[str], description: str) -> None:
        self.name = name
        self.member = member
        self.description = description
        self.capabilities = Capabilities(
            devices=devices,
            masks=ALL_MASKS,
            score_mods=frozenset({"none", "alibi"}),
            paged="gather",
            backward=True,
            features=frozenset({"head_dim_v", "kv_layout", "kv_dtype", "lengths", "shared_prefix"}),
        )

    def availability(self) -> str | None:
        try:
            _backend(self.member)
        except (ImportError, AttributeError):
            return f"torch {torch.__version__} has no SDPBackend.{self.member}"
        if self.capabilities.devices == frozenset({"cuda"}) and not torch.cuda.is_available():
            return f"SDPA {self.member} is a CUDA-only backend and torch.cuda.is_available() is False"
        return None

    def predicted_extra_bytes(self, workload: Workload) -> float:
        w = workload
        zeroed = output_bytes(w) if has_empty_rows(w.mask, w.seq_q, w.seq_k) or is_ragged(w) else 0.0
        mask = mask_bytes(w, mask_form(self.member, w))
        if self.member != "MATH":
            repeated = 0.0
            if self.member in REPEATS_KV and 1 < w.kv_heads < w.heads:  # MQA's repeat is a view
                repeated = w.batch * w.heads * w.seq_k * (w.head_dim + w.head_dim_v) * w.torch_dtype.itemsize
            fused = super().predicted_extra_bytes(w) + mask + padding_bytes(w)
            return fused + repeated + zeroed
        # The math backend materialises scores, probabilities and a masked copy, in at least fp32, and copies
        # k (measured on CPU, torch 2.13: one (B, Hq, Sk, D) copy; with GQA four: k and v expanded to Hq heads,
        # and copies of them; decode at B 8, 16k keys: 7.7 GiB at its peak RSS).
        element = max(4, w.torch_dtype.itemsize)
        channels = 2 * (w.head_dim + w.head_dim_v) if w.kv_heads != w.heads else w.head_dim
        copies = channels * w.batch * w.heads * w.seq_k * element
        return score_matrix_bytes(w, 3, element=element) + copies + mask + zeroed

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.score_mod == "softcap":
            return SOFTCAP
        if workload.sinks != "none":
            return SINKS
        return super().unsupported_reason(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        """The first call that torch has a kernel for, in this order: enable_gqa (when Hq ≠ Hkv), then, for the
        backends of ``REPEATS_KV``, k and v repeated to Hq heads; for each, the operands as they are, then at
        one head dim (when Dv ≠ D). Unsupported, with the last call's reasons, when none runs."""
        w = workload
        kwargs = {"scale": inputs.scale, **mask_arguments(mask_form(self.member, w), inputs)}
        grouped = ("enable_gqa", "repeat") if self.member in REPEATS_KV else ("enable_gqa",)
        grouped = grouped if w.kv_heads != w.heads else ("",)
        dims = (False, True) if w.head_dim_v != w.head_dim else (False,)
        refused: Unsupported | None = None
        for gqa in grouped:
            load = self._kv(inputs, gqa)
            for one_head_dim in dims:
                run = self._call(
                    inputs,
                    load,
                    {**kwargs, "enable_gqa": True} if gqa == "enable_gqa" else kwargs,
                    _one_head_dim(w) if one_head_dim else None,
                )
                try:
                    probe(run, self.member)
                except Unsupported as exc:
                    refused = exc
                    continue
                return run
        assert refused is not None
        raise refused

    def _kv(self, inputs: AttentionInputs, gqa: str) -> KvLoad:
        """What the call reads k and v with: the inputs' own (dequantized in the call when the cache is
        narrower), or repeated to Hq heads — once here when the workload allows (:func:`repeats_in_prepare`)."""
        load, heads = inputs.kv_loader(), inputs.workload.heads
        if gqa != "repeat":
            return load
        if repeats_in_prepare(inputs.workload):
            k, v = (repeat_heads(t, heads) for t in load())
            return lambda: (k, v)

        def repeated() -> tuple[torch.Tensor, torch.Tensor]:
            k, v = load()
            return repeat_heads(k, heads), repeat_heads(v, heads)

        return repeated

    def _call(
        self, inputs: AttentionInputs, load: KvLoad, kwargs: dict[str, Any], operands: Operands | None
    ) -> Callable[[], torch.Tensor]:
        """The timed call: read k and v, SDPA under this backend alone, the output sliced back to Dv when the
        operands were brought to one head dim, and the rows that see no key zeroed."""
        from torch.nn.attention import sdpa_kernel

        backend, q, empty, head_dim_v = _backend(self.member), inputs.q, inputs.empty_rows, inputs.workload.head_dim_v

        def run() -> torch.Tensor:
            k, v = load()
            with sdpa_kernel([backend]):
                if operands is None:
                    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
                else:
                    out = F.scaled_dot_product_attention(*operands(q, k, v), **kwargs)[..., :head_dim_v]
            return out if empty is None else out.masked_fill(empty, 0.0)

        return run


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
