"""A shared prefix (``shared_prefix`` P > 0): every sequence of the batch begins with the same P cached
positions — a system prompt or few-shot examples served to many requests (vLLM's prefix caching, FlashInfer's
cascade attention, SGLang's radix cache).

How the inputs hold it:

* contiguous cache: k and v keep their (B, Hkv, Sk, D) shape with the prefix repeated in every sequence —
  what a contender that reads per sequence reads — and the one shared copy is sequence 0's first P positions
  (:func:`prefix_views`, views, no copy), which a contender that reads the prefix once for the batch (``cascade``)
  reads instead; each sequence's own suffix is k[:, :, P:].
* paged cache: the pages wholly inside the prefix, ⌊P / page_size⌋ of them (:func:`shared_pages`), are in the
  pool once and every sequence's page table points at them; the page where the prefix ends and the suffix begins
  is each sequence's own, as vLLM shares full blocks only (``attnbench.workload.paged.make_paged``).

The prefix is shared in the values drawn, before a narrowed cache (``kv_dtype``) stores them: with fp8 per
page the shared pages and their scales are one; a contiguous fp8 cache has one scale per (sequence, kv head),
so each sequence's copy of the prefix is rounded with its own scale (``cascade`` does not run fp8 caches).

What must be read (:func:`shared_positions`, counted in ``attnbench.workload.flops``): the shared positions once for the
whole batch, each sequence's other positions once — whatever a contender actually reads, as every byte count.
"""

from __future__ import annotations

import torch

from attnbench.workload._problem import Workload


def shared_pages(w: Workload) -> int:
    """Pages every sequence's page table shares: the pages wholly inside the prefix (0 when contiguous)."""
    return w.shared_prefix // w.page_size if w.page_size else 0


def shared_positions(w: Workload) -> int:
    """Key positions stored once for the whole batch: the prefix (contiguous), its whole pages (paged)."""
    return shared_pages(w) * w.page_size if w.page_size else w.shared_prefix


def share_prefix(t: torch.Tensor, prefix: int) -> None:
    """Make every sequence's first ``prefix`` positions of t (B, Hkv, Sk, D) sequence 0's, in place (seeded data
    drawn per sequence, then the prefix copied over: the suffixes keep their own draws)."""
    if prefix:
        with torch.no_grad():  # t may be a leaf that requires grad; this is how it is made, not computed
            t[1:, :, :prefix] = t[0, :, :prefix]


def prefix_views(k: torch.Tensor, v: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix's one copy, k and v (Hkv, P, D): views of sequence 0's first ``prefix`` positions."""
    return k[0, :, :prefix], v[0, :, :prefix]
