"""Mask and score-modifier semantics shared by contenders, in the forms they use.

Masks (``offset`` = Sk − Sq, so that query i sits at key position i + offset):

* ``none`` — every query sees every key.
* ``causal`` — top-left aligned, as torch ``is_causal``: query i sees keys j <= i.
* ``causal_bottom_right`` — FlashAttention's alignment: query i sees keys j <= i + offset. When
  Sq > Sk the first Sq - Sk query rows see no key and their output is defined as zeros. Decode (a short
  query against a long KV cache) is this mask.
* ``padding`` — per-batch valid key lengths (the masked softmax of the source documents; a KV cache of
  per-sequence lengths): batch b sees keys j < padding_lengths(B, Sk)[b]. See :func:`padding_lengths`.
* ``sliding_window`` — query i sees key j iff i + offset − window < j <= i + offset: the last ``window``
  keys up to the bottom-right diagonal (flash-attention's ``window_size=(window − 1, 0)``).
* ``document`` — packed documents (Sq = Sk, flash-attention's varlen / ``cu_seqlens``): query i sees key
  j iff both lie in the same document and j <= i. Document lengths: :func:`document_lengths`.
* ``chunked`` — Llama 4's chunked local attention: positions cut into chunks of ``chunk`` keys from key 0;
  query i (at position p = i + offset, bottom-right aligned) sees key j iff j <= p and j lies in p's chunk,
  ⌊j / chunk⌋ = ⌊p / chunk⌋. Rows with p < 0 (Sq > Sk) see no key.
* ``mixed`` — prefill chunks and decode steps in one batch, bottom-right causal within each sequence.
  It, and the ``lengths`` axis, give each sequence its own query and key lengths: ``attnbench.workload.sequences``.

Every mask gives each query row one key range [lo, hi) (:func:`key_ranges`); kernels skip what is outside.

Score modifiers, applied to the scaled scores s = q·k·scale before the mask:

* ``softcap`` — s → softcap · tanh(s / softcap) (Gemma-2).
* ``alibi`` — s → s − slope_h · |i + offset − j| with slope_h = 2^(−8(h+1)/H) (:func:`alibi_slopes`).

Counts (:func:`visible_pairs`, :func:`key_span`) are closed forms — no loop over rows — so any size is
priced in microseconds. The float64 reference (``attnbench.workload.reference``) re-derives each rule on its own,
so a bug here shows as an ``incorrect`` row rather than silently agreeing with itself.
"""

from __future__ import annotations

import random
import zlib

import torch

from attnbench.workload._problem import Workload, padding_lengths
from attnbench.workload.sequences import (
    packed_document_lengths,
    ragged_key_ranges,
    ragged_pairs,
    ragged_span,
    sequence_lengths,
    sequence_offsets,
)


def document_lengths(seq: int, documents: int, lengths: str = "equal") -> list[int]:
    """Lengths of ``documents`` packed documents, none empty, summing to ``seq``: seeded-random cut points
    (the seed is the pair (seq, documents)), drawn in O(documents), never O(seq); with a ``lengths``
    distribution other than equal, drawn from it (``sequences.packed_document_lengths``)."""
    if lengths != "equal":
        return packed_document_lengths(seq, documents, lengths)
    generator = random.Random(zlib.crc32(f"documents {seq} {documents}".encode()))
    cuts = sorted(generator.sample(range(1, seq), documents - 1))
    bounds = [0, *cuts, seq]
    return [bounds[d + 1] - bounds[d] for d in range(documents)]


def alibi_slopes(heads: int) -> torch.Tensor:
    """(H,) float64: slope_h = 2^(−8(h+1)/H), the geometric ALiBi slopes (flash-attention's definition)."""
    return torch.pow(2.0, -8.0 * torch.arange(1, heads + 1, dtype=torch.float64) / heads)


def unseeing_share(w: Workload) -> float:
    """The share of query rows (over the batch) that see no key at all: they output zeros and do no work, so
    a case where most rows are such (a 4096-row prompt bottom-right against 1024 keys: 75 %) measures little
    of what its shape says."""
    lo, hi = key_ranges(w)
    return float((lo >= hi).float().mean())


def key_ranges(w: Workload, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), each (B or 1, Sq) int64: query row i of batch b sees exactly keys lo <= j < hi."""
    if (ragged := sequence_lengths(w)) is not None:
        return ragged_key_ranges(w, ragged, device)
    i = torch.arange(w.seq_q, device=device).view(1, -1)
    zeros = torch.zeros_like(i)
    full = torch.full_like(i, w.seq_k)
    if w.mask == "none":
        return zeros, full
    if w.mask == "causal":
        return zeros, (i + 1).clamp(0, w.seq_k)
    if w.mask == "causal_bottom_right":
        return zeros, (i + w.offset + 1).clamp(0, w.seq_k)
    if w.mask == "padding":
        lengths = torch.tensor(padding_lengths(w.batch, w.seq_k), device=device).view(-1, 1)
        return zeros.expand(w.batch, -1), lengths.expand(-1, w.seq_q)
    if w.mask == "sliding_window":
        hi = (i + w.offset + 1).clamp(0, w.seq_k)
        return (i + w.offset + 1 - w.window).clamp(0, w.seq_k).clamp(max=hi), hi
    if w.mask == "document":
        lengths = torch.tensor(document_lengths(w.seq_q, w.documents, w.lengths), device=device)
        starts = torch.cumsum(lengths, 0) - lengths  # (documents,)
        return starts.repeat_interleave(lengths).view(1, -1), i + 1
    if w.mask == "chunked":  # from the start of the position's chunk up to the position
        position = i + w.offset
        chunk_start = torch.div(position, w.chunk, rounding_mode="floor") * w.chunk
        return chunk_start.clamp(0, w.seq_k), (position + 1).clamp(0, w.seq_k)
    raise ValueError(f"unknown mask {w.mask!r}")


def dense_mask_of(w: Workload, device: str | torch.device) -> torch.Tensor | None:
    """Boolean mask broadcastable to (B, H, Sq, Sk), True where a key is visible; None for ``none`` (unless the
    batch is ragged: then each sequence's own rows and keys)."""
    if w.mask == "none" and sequence_lengths(w) is None:
        return None
    lo, hi = key_ranges(w, device)
    j = torch.arange(w.seq_k, device=device).view(1, 1, -1)
    visible = (j >= lo.unsqueeze(-1)) & (j < hi.unsqueeze(-1))  # (B|1, Sq, Sk)
    return visible.unsqueeze(1)


def alibi_bias(w: Workload, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(1, H, Sq, Sk): −slope_h · |i + offset − j|, the additive form of the alibi modifier; (B, H, Sq, Sk) for
    a ragged or mixed batch, each sequence with its own offset (``sequences.sequence_offsets``)."""
    i = torch.arange(w.seq_q, device=device, dtype=torch.float64).view(1, 1, -1, 1)
    j = torch.arange(w.seq_k, device=device, dtype=torch.float64).view(1, 1, 1, -1)
    ragged = sequence_lengths(w) is not None
    offset = sequence_offsets(w, device).view(-1, 1, 1, 1).double() if ragged else torch.tensor(float(w.offset))
    distance = (i + offset - j).abs()  # (1 or B, 1, Sq, Sk)
    return (-alibi_slopes(w.heads).to(device).view(1, -1, 1, 1) * distance).to(dtype)


def modify_scores(scores: torch.Tensor, w: Workload, bias: torch.Tensor | None) -> torch.Tensor:
    """The score modifier on scaled scores: softcap's tanh, or alibi's ``bias`` (from :func:`alibi_bias`,
    broadcastable to ``scores``) added."""
    if w.score_mod == "softcap":
        return torch.tanh(scores / w.softcap) * w.softcap
    if w.score_mod == "alibi":
        assert bias is not None
        return scores + bias
    return scores


def _clamped_sum(count: int, first: int, cap: int) -> int:
    """Σ clamp(x, 0, cap) for x = first, first + 1, …, first + count − 1, in O(1)."""
    last = first + count - 1
    low, high = max(first, 0), min(last, cap)
    middle = (low + high) * (high - low + 1) // 2 if high >= low else 0
    above = max(0, last - max(first, cap + 1) + 1)
    return middle + cap * above


def visible_pairs(
    mask: str,
    batch: int,
    seq_q: int,
    seq_k: int,
    *,
    window: int = 0,
    documents: int = 0,
    lengths: str = "equal",
    chunk: int = 0,
) -> int:
    """Exact number of visible (query, key) pairs summed over the batch (per head), in closed form (for a
    ragged or mixed batch see :func:`workload_pairs`)."""
    if mask == "none":
        return batch * seq_q * seq_k
    if mask == "padding":
        return seq_q * sum(padding_lengths(batch, seq_k))
    if mask == "document":
        return batch * sum(n * (n + 1) // 2 for n in document_lengths(seq_q, documents, lengths))
    if mask == "chunked":  # the row at position p sees (p mod chunk) + 1 keys; positions max(0, Sk − Sq) … Sk − 1
        return batch * (_chunked_prefix_sum(seq_k, chunk) - _chunked_prefix_sum(max(0, seq_k - seq_q), chunk))
    offset = 0 if mask == "causal" else seq_k - seq_q
    # Row i sees clamp(i + offset + 1, 0, Sk) keys; a window removes the clamp(i + offset + 1 − window, 0, Sk) before.
    per_batch = _clamped_sum(seq_q, offset + 1, seq_k)
    if mask == "sliding_window":
        per_batch -= _clamped_sum(seq_q, offset + 1 - window, seq_k)
    elif mask != "causal_bottom_right" and mask != "causal":
        raise ValueError(f"unknown mask {mask!r}")
    return batch * per_batch


def _chunked_prefix_sum(positions: int, chunk: int) -> int:
    """Σ (p mod chunk) + 1 over p = 0 … positions − 1, in O(1): whole chunks, then the partial one."""
    whole, rest = divmod(positions, chunk)
    return whole * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2


def workload_pairs(w: Workload) -> int:
    """:func:`visible_pairs` of a workload; a ragged or mixed batch's sequence by sequence."""
    if (ragged := sequence_lengths(w)) is not None:
        return ragged_pairs(w, ragged)
    return visible_pairs(
        w.mask, w.batch, w.seq_q, w.seq_k, window=w.window, documents=w.documents, lengths=w.lengths, chunk=w.chunk
    )


def key_span(w: Workload) -> list[tuple[int, int]]:
    """Per batch element, [first, end) of the key positions some query row sees — the keys and values a
    kernel must read. Rows' ranges overlap or adjoin, so the span is their union. Closed form."""
    if (ragged := sequence_lengths(w)) is not None:
        return ragged_span(w, ragged)
    if w.mask == "padding":
        return [(0, length) for length in padding_lengths(w.batch, w.seq_k)]
    first, end = 0, w.seq_k
    if w.mask == "causal":
        end = min(w.seq_k, w.seq_q)
    elif w.mask == "sliding_window":  # the first row that sees a key is max(0, −offset)
        first = max(0, min(w.seq_k, max(w.offset, 0) + 1 - w.window))
    elif w.mask == "chunked":  # the first row that sees a key starts at its chunk's first key
        first = max(w.offset, 0) // w.chunk * w.chunk
    return [(first, end)] * w.batch


def has_empty_rows(mask: str, seq_q: int, seq_k: int) -> bool:
    """True when some query row sees no key at all (bottom-right alignment with Sq > Sk)."""
    return mask in ("causal_bottom_right", "sliding_window", "chunked") and seq_q > seq_k
