"""Ragged and mixed batches: each sequence of the batch with its own query length and key (cache) length.

A batch is stored padded, as its users pad it for dense kernels: q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D).
Sequence b holds its ``q_len_b`` query rows at rows 0 … q_len_b − 1 and its ``kv_len_b`` keys at positions
0 … kv_len_b − 1; its last query row is its last key (the new tokens sit at the end of the cache), so query
row i sits at key position i + kv_len_b − q_len_b. Within a sequence:

* masks ``causal``, ``causal_bottom_right`` and ``mixed`` — bottom-right causal: row i sees keys
  j ≤ i + kv_len_b − q_len_b (chunked prefill's and decode's rule; with q_len_b = kv_len_b it is causal);
* ``sliding_window`` — the last ``window`` of those keys;
* ``none`` — all kv_len_b keys;
* rows i ≥ q_len_b (padding) see no key: their output is zeros, as for any row that sees no key.

**Lengths** (axis ``lengths``): each sequence's key length kv_len_b is drawn, seeded, from a distribution with
the sweep's ``seq_kv`` as its **maximum**: the padded tensor's size and the longest sequence's length
exactly (a padded batch is padded to its longest sequence), every length within [1, seq_kv] — the
convention stated here, as flash-attention's varlen benchmark states its own. Over a shared prefix of P tokens
every sequence holds the prefix and a token of its own: the draw is of the lengths after it, in [1, seq_kv − P],
and kv_len_b = P + that (the longest still seq_kv). Query lengths follow:
q_len_b = min(seq, kv_len_b) (a decode step keeps its query rows; a square prefill has q_len_b = kv_len_b).

* ``equal`` — every length the maximum (the plain batch);
* ``uniform`` — U[1, max];
* ``longtail`` — Pareto (α 1.2) scaled to max/16, clipped to [1, max]: most sequences short (median ≈ max/9),
  a few near max (about 1 in 12 past max/2);
* ``bimodal`` — two clusters: a quarter of the sequences (at least one) long, U[¾·max, max], the others
  short, U[1, max/8].

With the ``document`` mask (prefill, packed) the distribution draws the documents' lengths instead, scaled to
sum to the sequence (:func:`packed_document_lengths`); every sequence of the batch is then full length.

**Mixed** (mask ``mixed``, ``attnbench run --phase mixed``): one batch of prefill chunks and decode steps, as
chunked prefill schedules it. The first round(decode_share · B) sequences (at least 1, at most B − 1; vLLM
orders a batch's decodes first) are decode steps, q_len 1; the others prefill chunks, q_len = min(seq,
kv_len_b); every sequence's cache is seq_kv long, or drawn by ``lengths``.

Counts here are closed forms per sequence (O(B)): ``attnbench.workload.masks`` uses them for key ranges, visible
pairs and key spans, so FLOPs and bytes count the real lengths and a paged cache reads only the pages up to
each length. The float64 reference re-derives visibility from :func:`sequence_lengths`' data on its own.
"""

from __future__ import annotations

import functools
import math
import random
import zlib

import torch

from attnbench.workload._problem import Workload

CAUSAL_MASKS = ("causal", "causal_bottom_right", "mixed", "sliding_window")  # bottom-right within each sequence
LONGTAIL_ALPHA = 1.2  # Pareto shape: P(length ≥ x·max/16) = x^−1.2
LONGTAIL_SCALE = 16  # the Pareto's smallest value is max / 16
BIMODAL_LONG_SHARE = 0.25


def draw_lengths(distribution: str, count: int, maximum: int) -> list[int]:
    """``count`` lengths in [1, ``maximum``] from the distribution, the longest exactly ``maximum``;
    deterministic (seeded by the distribution, the count and the maximum)."""
    if distribution == "equal" or count == 1:
        return [maximum] * count
    generator = random.Random(zlib.crc32(f"lengths {distribution} {count} {maximum}".encode()))
    if distribution == "uniform":
        drawn = [generator.randint(1, maximum) for _ in range(count)]
    elif distribution == "longtail":
        smallest = maximum / LONGTAIL_SCALE
        drawn = [min(maximum, max(1, round(smallest * generator.paretovariate(LONGTAIL_ALPHA)))) for _ in range(count)]
    elif distribution == "bimodal":
        longs = set(generator.sample(range(count), max(1, round(BIMODAL_LONG_SHARE * count))))
        short_top, long_bottom = max(1, maximum // 8), max(1, math.ceil(3 * maximum / 4))
        drawn = [
            generator.randint(long_bottom, maximum) if b in longs else generator.randint(1, short_top)
            for b in range(count)
        ]
    else:
        raise ValueError(f"unknown length distribution {distribution!r}")
    drawn[drawn.index(max(drawn))] = maximum  # padded to the longest sequence
    return drawn


def packed_document_lengths(seq: int, documents: int, distribution: str) -> list[int]:
    """Lengths of ``documents`` packed documents summing to ``seq``, none empty, shaped by the distribution:
    each gets 1 token plus its share of the other seq − documents in proportion to its draw (largest
    remainders first)."""
    drawn = draw_lengths(distribution, documents, seq)
    spare, total = seq - documents, sum(drawn)
    shares = [spare * d / total for d in drawn]
    lengths = [1 + math.floor(s) for s in shares]
    by_remainder = sorted(range(documents), key=lambda d: (math.floor(shares[d]) - shares[d], d))
    for d in by_remainder[: seq - sum(lengths)]:
        lengths[d] += 1
    return lengths


def decode_count(batch: int, share: float) -> int:
    """Decode steps of a mixed batch: round(share · B), at least 1 and at most B − 1 (a mixed batch has both)."""
    return min(batch - 1, max(1, math.floor(share * batch + 0.5)))


def is_ragged(w: Workload) -> bool:
    """Whether the batch's sequences have lengths of their own (a drawn distribution outside the document
    mask, whose documents take the draw, or a mixed batch)."""
    return w.mask == "mixed" or (w.lengths != "equal" and w.mask != "document")


@functools.lru_cache(maxsize=256)
def sequence_lengths(w: Workload) -> tuple[tuple[int, int], ...] | None:
    """Per sequence b, (q_len_b, kv_len_b); None for a batch whose sequences all span (Sq, Sk)."""
    if not is_ragged(w):
        return None
    prefix = w.shared_prefix  # every sequence holds the shared prefix: its own tokens are drawn after it
    kv = [prefix + own for own in draw_lengths(w.lengths, w.batch, w.seq_k - prefix)]
    decodes = decode_count(w.batch, w.decode_share) if w.mask == "mixed" else 0
    return tuple((1 if b < decodes else min(w.seq_q, k), k) for b, k in enumerate(kv))


def query_rows(w: Workload) -> int:
    """Query rows over the batch that belong to a sequence (B · Sq unless ragged)."""
    lengths = sequence_lengths(w)
    return w.batch * w.seq_q if lengths is None else sum(q for q, _ in lengths)


def cached_tokens(w: Workload) -> int:
    """Key positions over the batch that belong to a sequence (B · Sk unless ragged): the real cache."""
    lengths = sequence_lengths(w)
    return w.batch * w.seq_k if lengths is None else sum(k for _, k in lengths)


def _sum_capped(first: int, last: int, cap: int) -> int:
    """Σ min(x, cap) for x = first … last (1 ≤ first), in O(1)."""
    if last < first:
        return 0
    below = min(last, cap)
    middle = (first + below) * (below - first + 1) // 2 if below >= first else 0
    return middle + cap * (last - max(first - 1, below))


def ragged_pairs(w: Workload, lengths: tuple[tuple[int, int], ...]) -> int:
    """Visible (query, key) pairs over the batch, per head: per sequence, its rows i < q_len see
    min(kv_len − q_len + i + 1, window) keys (bottom-right causal), or kv_len (mask none)."""
    total = 0
    for q, k in lengths:
        if w.mask == "none":
            total += q * k
        else:  # row i sees x = k − q + i + 1 keys, x running over k − q + 1 … k
            total += _sum_capped(k - q + 1, k, w.window if w.mask == "sliding_window" else k)
    return total


def ragged_span(w: Workload, lengths: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Per sequence, [first, end) of the keys some row sees: up to kv_len; a window starts at the first row's."""
    if w.mask != "sliding_window":
        return [(0, k) for _, k in lengths]
    return [(max(0, k - q + 1 - w.window), k) for q, k in lengths]


def ragged_key_ranges(
    w: Workload, lengths: tuple[tuple[int, int], ...], device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), each (B, Sq) int64: the key range of every query row of every sequence (empty past q_len)."""
    q_len, kv_len = (torch.tensor(column, device=device).view(-1, 1) for column in zip(*lengths, strict=True))
    i = torch.arange(w.seq_q, device=device).view(1, -1)
    inside = i < q_len
    hi = torch.where(inside, (i + kv_len - q_len + 1) if w.mask in CAUSAL_MASKS else kv_len, 0).clamp(0, w.seq_k)
    lo = (hi - w.window).clamp(min=0) if w.mask == "sliding_window" else torch.zeros_like(hi)
    return lo.expand(w.batch, -1), hi.expand(w.batch, -1)


def sequence_offsets(w: Workload, device: str | torch.device) -> torch.Tensor:
    """(B,) int64: per sequence, where its bottom-right diagonal sits (kv_len − q_len; Sk − Sq unless ragged),
    for modifiers that need a query's own key position (alibi's distance)."""
    lengths = sequence_lengths(w)
    if lengths is None:
        return torch.full((w.batch,), w.offset, device=device, dtype=torch.int64)
    return torch.tensor([k - q for q, k in lengths], device=device, dtype=torch.int64)
