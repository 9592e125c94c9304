"""fused_cpu's cascade for a batch whose sequences share a cached prefix: the prefix read once for the whole
batch, each sequence's suffix on its own, the two partial results merged by their log-sum-exp (FlashInfer's
cascade attention, here with our forward kernel for both levels).

1. prefix: per kv head, the B·G·Sq query rows of every sequence (G query heads per kv head) as one problem of
   B·G·Sq rows against the prefix's P keys — the prefix's one stored copy (``inputs.prefix_kv``, a view of
   sequence 0's first P positions, read in place). Decode's 32 sequences × 4 heads become 128 rows sharing
   every key block: a compute-bound product instead of 32 bandwidth-bound passes over the same keys.
2. suffix: each sequence's rows against its own keys P … Sk − 1 (a view, read in place);
3. merge: lse = log(e^lse₁ + e^lse₂ (+ e^sink)), out = out₁·e^(lse₁ − lse) + out₂·e^(lse₂ − lse).

Each level takes the case's mask as per-row key ranges cut at the prefix (``masks.key_ranges``), so a row
that sees no key of a level adds nothing there; a row that sees none at all outputs zeros. Forward only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.impls._sinks import rescaled_by_sink
from attnbench.impls.fused_cpu.bindings import ScoreOptions


def cascade_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix: int,
    ranges: tuple[torch.Tensor, torch.Tensor],
    *,
    scale: float,
    threads: int,
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None, int]],
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q (B, H, Sq, D); k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv) whose first ``prefix`` positions are the same
    for every sequence (sequence 0's are read); ``ranges`` (lo, hi), each (B or 1, Sq) int64, the keys [lo, hi)
    row i of sequence b sees; ``forward`` the package's forward kernel call (``fused_cpu._forward``: passed in,
    not imported here, since the package imports this module); ``sinks`` (H,) float32 learned sink logits or
    None. Returns (B, H, Sq, Dv) in q's dtype."""

    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k, value_dim = k.shape[1], k.shape[2], v.shape[-1]
    group = heads // kv_heads
    lo, hi = (bound.expand(batch, seq_q) for bound in ranges)

    def level(
        rows: torch.Tensor, keys: slice, level_batch: slice, mask: str, options: ScoreOptions | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        k_level, v_level = k[level_batch, :, keys], v[level_batch, :, keys]
        return forward(
            rows,
            k_level,
            v_level,
            scale=scale,
            mask=mask,
            lengths=None,
            threads=threads,
            keep_lse=True,
            options=options,
        )

    # 1. the prefix, once: rows (b, g, i) of kv head h, against sequence 0's first P keys
    rows = q.view(batch, kv_heads, group, seq_q, head_dim).transpose(0, 1).reshape(1, kv_heads, -1, head_dim)
    p_lo, p_hi = (bound.clamp(0, prefix).unsqueeze(1).expand(batch, group, seq_q).reshape(1, -1) for bound in (lo, hi))
    mask, options = _level_ranges(p_lo, p_hi, prefix)
    out1, lse1, _ = level(rows, slice(0, prefix), slice(0, 1), mask, options)
    out1 = out1.view(kv_heads, batch, group, seq_q, -1).transpose(0, 1).reshape(batch, heads, seq_q, -1)
    assert lse1 is not None
    lse1 = lse1.view(kv_heads, batch, group, seq_q).transpose(0, 1).reshape(batch, heads, seq_q)
    if seq_k == prefix:
        out, lse = out1, lse1
    else:  # 2. each sequence's suffix: rows (g, i) of kv head h, against keys P …
        suffix = seq_k - prefix
        folded = q.reshape(batch, kv_heads, group * seq_q, head_dim)
        s_lo, s_hi = ((bound - prefix).clamp(0, suffix) for bound in (lo, hi))
        mask, options = _level_ranges(s_lo.repeat(1, group), s_hi.repeat(1, group), suffix)
        out2, lse2, _ = level(folded, slice(prefix, None), slice(None), mask, options)
        assert lse2 is not None
        out, lse = _merge(out1, lse1, out2.view(batch, heads, seq_q, -1), lse2.view(batch, heads, seq_q))
    if sinks is not None:  # the sink joins the merged denominator (no value): out · 1/(1 + e^(sink − lse))
        out = rescaled_by_sink(out, lse, sinks)
    return out[..., :value_dim].to(q.dtype)


def _level_ranges(lo: torch.Tensor, hi: torch.Tensor, keys: int) -> tuple[str, ScoreOptions | None]:
    """The kernel's mask for one level, given each of its rows' key range (its problem's (batch, rows)):
    "none" when every row sees all the level's ``keys``, else the ranges."""
    if bool((lo == 0).all()) and bool((hi == keys).all()):
        return "none", None
    return "ranges", ScoreOptions(ranges=(lo.contiguous(), hi.contiguous()))


def _merge(
    out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two normalised partial results over disjoint keys as one (FlashInfer's merge_state); a level whose row
    saw no key has lse −∞ and weight 0; a row that saw none in either stays zero."""
    lse = torch.logaddexp(lse1, lse2)
    finite = torch.isfinite(lse)
    safe = torch.where(finite, lse, 0.0)
    w1, w2 = (torch.where(finite, torch.exp(part - safe), 0.0).unsqueeze(-1) for part in (lse1, lse2))
    return out1 * w1 + out2 * w2, lse
