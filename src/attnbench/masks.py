"""Mask semantics shared by contenders: padding lengths, dense boolean masks, visible-pair counts.

* ``none`` — every query sees every key.
* ``causal`` — top-left aligned, as torch ``is_causal``: query i sees keys j <= i.
* ``causal_bottom_right`` — FlashAttention's alignment: query i sees keys j <= i + (Sk - Sq). When
  Sq > Sk the first Sq - Sk query rows see no key and their output is defined as zeros.
* ``padding`` — per-batch valid key lengths (the masked softmax of the source documents): batch b
  sees keys j < padding_lengths(B, Sk)[b]. Lengths are deterministic, see :func:`padding_lengths`.

The float64 reference (``attnbench.reference``) re-derives each rule on its own, so a bug here shows as
an ``incorrect`` row rather than silently agreeing with itself.
"""

from __future__ import annotations

import torch


def padding_lengths(batch: int, seq_k: int) -> list[int]:
    """Valid key lengths per batch element, deterministic.

    Batch 0 is full length and the last element is the shortest (Sk // 4, at least 1); the ones between
    are spaced linearly. With a single batch element there is nothing to contrast, so its length is
    3/4 of Sk (rounded down, at least 1) so that the mask still removes keys.
    """
    shortest = max(1, seq_k // 4)
    if batch == 1:
        return [max(1, (3 * seq_k) // 4)]
    return [seq_k - (b * (seq_k - shortest)) // (batch - 1) for b in range(batch)]


def dense_mask(mask: str, batch: int, seq_q: int, seq_k: int, device: str | torch.device) -> torch.Tensor | None:
    """Boolean mask broadcastable to (B, H, Sq, Sk), True where a key is visible; None for ``none``."""
    if mask == "none":
        return None
    rows = torch.arange(seq_q, device=device).view(seq_q, 1)
    cols = torch.arange(seq_k, device=device).view(1, seq_k)
    if mask == "causal":
        return (cols <= rows).view(1, 1, seq_q, seq_k)
    if mask == "causal_bottom_right":
        return (cols <= rows + (seq_k - seq_q)).view(1, 1, seq_q, seq_k)
    if mask == "padding":
        lengths = torch.tensor(padding_lengths(batch, seq_k), device=device).view(batch, 1, 1, 1)
        return (cols.view(1, 1, 1, seq_k) < lengths).expand(batch, 1, seq_q, seq_k)
    raise ValueError(f"unknown mask {mask!r}")


def visible_pairs(mask: str, batch: int, seq_q: int, seq_k: int) -> int:
    """Exact number of visible (query, key) pairs summed over the batch (per head)."""
    if mask == "none":
        return batch * seq_q * seq_k
    if mask == "padding":
        return seq_q * sum(padding_lengths(batch, seq_k))
    offset = 0 if mask == "causal" else seq_k - seq_q
    # Row i sees min(Sk, max(0, i + offset + 1)) keys.
    per_row = sum(min(seq_k, max(0, i + offset + 1)) for i in range(seq_q))
    return batch * per_row


def has_empty_rows(mask: str, seq_q: int, seq_k: int) -> bool:
    """True when some query row sees no key at all (bottom-right causal with Sq > Sk)."""
    return mask == "causal_bottom_right" and seq_q > seq_k
