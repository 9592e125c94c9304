"""The paged KV cache layout (``page_size`` > 0), as vLLM and FlashInfer store a cache.

Keys and values live in a pool of pages, k_pages and v_pages (N, Hkv, P, D) with P = page_size (the
"HND" page layout). Sequence b owns n = ceil(Sk / P) pages; ``page_table[b, p]`` (int32) is the pool
index of the page holding its positions p·P … p·P + P − 1 (the tail of the last page is unused, zeros).
An fp8 cache (``attnbench.workload.kv_cache``) was quantized page by page: each pool page carries its own float32
scale, k_scale and v_scale (N, Hkv, 1, 1), moved with it.
Pages are assigned to the pool in a seeded-shuffled order, so logically adjacent pages are scattered in
memory as in a real cache that has been filled and freed for a while.
A shared prefix's whole pages are in the pool once, and every sequence's page table points at them
(``attnbench.workload.prefix``).

A contender either reads the pool natively (through ``page_table``, or through :meth:`PagedKV.page_owner`
and :meth:`PagedKV.page_position`, the inverse map; ``Contender.reads_pages`` says for which workloads), or
the harness gathers the pages back into its contiguous k and v at the start of every timed call
(:func:`gathered`): a cache stored in pages costs a kernel that cannot read them that copy every step. The
gather is written once, here (:func:`gather_pages`), and its working memory is counted once, in the
prediction (:func:`gather_bytes`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from attnbench.workload._problem import Workload
from attnbench.workload.prefix import shared_pages

T = TypeVar("T")


def pages_per_sequence(seq_k: int, page_size: int) -> int:
    return -(-seq_k // page_size)


def pool_bytes(w: Workload) -> float:
    """The page pool of a paged workload: k_pages and v_pages, whole pages (latent: the one pool of the
    cache; a shared prefix's whole pages once); 0 for a contiguous cache."""
    if not w.page_size:
        return 0.0
    shared = shared_pages(w)
    slots = w.kv_heads * (shared + w.batch * (pages_per_sequence(w.seq_k, w.page_size) - shared)) * w.page_size
    channels = w.head_dim + (0 if w.kv_layout == "latent" else w.head_dim_v)
    return float(slots * channels * w.kv_torch_dtype.itemsize)


@dataclass(frozen=True, eq=False)
class PagedKV:
    k_pages: torch.Tensor  # (N, Hkv, P, D), N = B · pages per sequence
    v_pages: torch.Tensor  # (N, Hkv, P, Dv); with kv_layout latent the view k_pages[..., :Dv] (one pool)
    page_table: torch.Tensor  # (B, pages per sequence) int32: pool index of each logical page
    page_size: int
    seq_k: int
    k_scale: torch.Tensor | None = None  # fp8: (N, Hkv, 1, 1) float32, each pool page's scale
    v_scale: torch.Tensor | None = None
    shared_pages: int = 0  # the first logical pages, the same pool pages in every sequence's table (a shared prefix)

    @functools.cached_property
    def page_owner(self) -> torch.Tensor:
        """(N,) int64: the sequence each pool page belongs to; −1 for a page every sequence shares (a shared
        prefix's)."""
        batch, pages = self.page_table.shape
        owner = torch.empty(self.k_pages.shape[0], dtype=torch.int64, device=self.page_table.device)
        owner[self.page_table.flatten().long()] = torch.arange(batch, device=owner.device).repeat_interleave(pages)
        owner[self.page_table[0, : self.shared_pages].long()] = -1
        return owner

    @functools.cached_property
    def page_position(self) -> torch.Tensor:
        """(N,) int64: the logical page index (within its sequence) of each pool page."""
        batch, pages = self.page_table.shape
        position = torch.empty(self.k_pages.shape[0], dtype=torch.int64, device=self.page_table.device)
        position[self.page_table.flatten().long()] = torch.arange(pages, device=position.device).repeat(batch)
        return position


def make_paged(
    k: torch.Tensor,
    v: torch.Tensor,
    page_size: int,
    seed: int,
    latent: bool = False,
    scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
    shared: int = 0,
) -> PagedKV:
    """Copy contiguous k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv) into a shuffled page pool with a page table.
    ``latent`` (MLA, v the first Dv channels of k): one pool, v_pages the view of k_pages' first channels. An
    fp8 cache's per-page ``scales`` (B, Hkv, pages, 1) go to the pool with their pages. The first ``shared``
    logical pages (a shared prefix's whole pages: the same data, and scales, in every sequence) are in the pool
    once, sequence 0's, and every sequence's page table points at them."""
    batch, kv_heads, seq_k, _ = k.shape
    pages = pages_per_sequence(seq_k, page_size)
    own = pages - shared
    generator = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(shared + batch * own, generator=generator).to(k.device)
    table = torch.cat([order[:shared].expand(batch, -1), order[shared:].view(batch, own)], dim=1)

    def pool(t: torch.Tensor) -> torch.Tensor:
        head_dim = t.shape[-1]
        padded = t.new_zeros(batch, kv_heads, pages * page_size, head_dim)
        padded[:, :, :seq_k] = t.detach()
        logical = padded.view(batch, kv_heads, pages, page_size, head_dim).transpose(1, 2)  # (B, n, Hkv, P, D)
        out = t.new_empty(len(order), kv_heads, page_size, head_dim)
        out[table.flatten()] = logical.reshape(batch * pages, kv_heads, page_size, head_dim)  # shared: equal data
        return out

    def pool_scale(scale: torch.Tensor | None) -> torch.Tensor | None:
        if scale is None:
            return None
        out = scale.new_empty(len(order), kv_heads, 1, 1)
        out[table.flatten()] = scale.transpose(1, 2).reshape(batch * pages, kv_heads, 1, 1)
        return out

    k_pages = pool(k)
    v_pages = k_pages[..., : v.shape[-1]] if latent else pool(v)
    k_scale = pool_scale(scales[0])
    v_scale = k_scale if latent else pool_scale(scales[1])
    return PagedKV(k_pages, v_pages, table.to(torch.int32), page_size, seq_k, k_scale, v_scale, shared)


def gather_pages(
    pages: torch.Tensor, page_table: torch.Tensor, seq_k: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(N, Hkv, P, D) pool → (B, Hkv, Sk, D), one sequence's pages in logical order, written into ``out``
    (any (B, Hkv, Sk, D) tensor, e.g. a contender's k) or a new tensor. The pages are picked with one
    index_select (a temporary of the pages in use) and copied into place with one strided copy."""
    batch, count = page_table.shape
    _, kv_heads, page_size, head_dim = pages.shape
    if out is None:
        out = pages.new_empty(batch, kv_heads, seq_k, head_dim)
    picked = pages.index_select(0, page_table.flatten())  # (B·n, Hkv, P, D)
    logical = picked.view(batch, count, kv_heads, page_size, head_dim).transpose(1, 2)  # (B, Hkv, n, P, D)
    full, tail = divmod(seq_k, page_size)
    out[:, :, : full * page_size].unflatten(2, (full, page_size)).copy_(logical[:, :, :full])
    if tail:  # the last page partly used
        out[:, :, full * page_size :].copy_(logical[:, :, full, :tail])
    return out


def gather_bytes(w: Workload) -> float:
    """Working memory of the harness's gather at its peak: the picked pages of k (then of v), whole pages."""
    pages = w.batch * pages_per_sequence(w.seq_k, w.page_size) if w.page_size else 0
    return float(pages * w.kv_heads * w.page_size * max(w.head_dim, w.head_dim_v) * w.kv_torch_dtype.itemsize)


def gathered(paged: PagedKV, k: torch.Tensor, v: torch.Tensor, forward: Callable[[], T]) -> Callable[[], T]:
    """``forward`` preceded, in the same call, by the gather of the page pool into ``k`` and ``v`` — the
    contiguous tensors the contender was prepared with, so it computes on what was just gathered."""

    shared = v.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()  # latent: v is k's view

    def run() -> T:
        gather_pages(paged.k_pages, paged.page_table, paged.seq_k, out=k)
        if not shared:  # one cache (latent): its gather already wrote the values
            gather_pages(paged.v_pages, paged.page_table, paged.seq_k, out=v)
        return forward()

    return run
