"""Seeded inputs for a workload: random normals (never zeros), plus the mask in the forms contenders use.

Everything here is built before timing; contenders read these fields inside ``prepare`` so that mask
construction and layout changes stay out of the timed callable.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.measure.allocator import uncached
from attnbench.workload import kv_cache
from attnbench.workload._problem import Workload
from attnbench.workload.masks import alibi_bias, dense_mask_of, has_empty_rows, padding_lengths
from attnbench.workload.paged import PagedKV, make_paged
from attnbench.workload.prefix import prefix_views, share_prefix, shared_pages
from attnbench.workload.sequences import is_ragged

DEFAULT_SEED = 0
# Learned sink logits: normal with this spread, like the scaled scores' own (unit normal q and k give scores
# of spread 1 and a row's log-sum-exp of a few units), so a sink takes a share of a short row's softmax mass
# that shows and a visible one of a long row's (sinks of size ±2 to ±4 decide a check at fp32 tolerances).
SINK_STD = 2.0


def workload_seed(workload: Workload, seed: int = DEFAULT_SEED) -> int:
    """A stable per-workload seed, so each case gets different but reproducible data."""
    return (seed * 1_000_003 + zlib.crc32(workload.label().encode())) % (2**63)


@dataclass(frozen=True, eq=False)
class AttentionInputs:
    """q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv), in the workload's dtype and device (k and v in
    its kv_dtype: an fp8 cache with its float32 scales, see ``attnbench.workload.kv_cache``). With kv_layout latent
    (MLA) k is the one cache (B, 1, Sk, D) and v the view of its first Dv channels (and v_scale is k_scale)."""

    workload: Workload
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor  # (B, Hq, Sq, Dv), the fixed upstream gradient for backward passes
    k_scale: torch.Tensor | None = None  # fp8 cache: (B, Hkv, blocks, 1) float32, a block per sequence or page
    v_scale: torch.Tensor | None = None
    q_scale: torch.Tensor | None = None  # an fp8 forward's q (q_dtype): (B, Hq, 1, 1) float32, one per (sequence, head)

    @property
    def scale(self) -> float:
        return self.workload.softmax_scale

    @property
    def lengths(self) -> list[int] | None:
        """Valid key lengths per batch element for the ``padding`` mask, else None."""
        w = self.workload
        return padding_lengths(w.batch, w.seq_k) if w.mask == "padding" else None

    @functools.cached_property
    def bool_mask(self) -> torch.Tensor | None:
        """(B or 1, 1, Sq, Sk) bool, True = visible; None when the mask is ``none``."""
        w = self.workload
        return dense_mask_of(w, self.q.device)

    @functools.cached_property
    def alibi_bias(self) -> torch.Tensor | None:
        """(1, Hq, Sq, Sk) in the workload's dtype: the alibi modifier's additive bias; None without alibi."""
        w = self.workload
        return alibi_bias(w, self.q.device, w.torch_dtype) if w.score_mod == "alibi" else None

    @functools.cached_property
    def paged(self) -> PagedKV | None:
        """k and v in a shuffled page pool with a page table (see ``attnbench.workload.paged``); None when the
        workload's KV cache is contiguous (page_size 0)."""
        w = self.workload
        if not w.page_size:
            return None
        with uncached():  # its transient copies leave no fragments in the allocator's cache
            latent, scales, shared = w.kv_layout == "latent", (self.k_scale, self.v_scale), shared_pages(w)
            return make_paged(self.k, self.v, w.page_size, workload_seed(w) + 1, latent, scales, shared=shared)

    @property
    def prefix_kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The shared prefix's one copy, k (Hkv, P, D) and v (Hkv, P, Dv) — views of sequence 0's first P
        positions, so a paged cache gathered into k and v refreshes them — or None without a shared prefix
        (attnbench.workload.prefix)."""
        prefix = self.workload.shared_prefix
        return prefix_views(self.k, self.v, prefix) if prefix else None

    def kv_loader(self) -> kv_cache.KvLoad:
        """What a contender calls first in its timed callable to read k and v (these tensors, where a paged
        cache's gather writes) in the dtype: themselves, or dequantized (``attnbench.workload.kv_cache``)."""
        w = self.workload
        k_scale, v_scale = (
            None if s is None else kv_cache.position_scales(s, kv_cache.scale_block(w), w.seq_k)
            for s in (self.k_scale, self.v_scale)
        )
        return kv_cache.kv_loader(self.k, self.v, k_scale, v_scale, w.torch_dtype)

    def query_loader(self) -> Callable[[], torch.Tensor]:
        """What a contender calls in its timed callable to read q in the dtype: q, or an fp8 forward's q
        dequantized (``attnbench.workload.kv_cache.query_loader``)."""
        return kv_cache.query_loader(self.q, self.q_scale, self.workload.torch_dtype)

    @functools.cached_property
    def empty_rows(self) -> torch.Tensor | None:
        """(1, 1, Sq, 1) bool of query rows that see no key (their output must be zeros), or None; (B, 1, Sq, 1)
        for a ragged or mixed batch (a sequence's rows past its own query length)."""
        w = self.workload
        if not has_empty_rows(w.mask, w.seq_q, w.seq_k) and not is_ragged(w):
            return None
        mask = self.bool_mask
        assert mask is not None
        empty = ~mask.any(dim=-1, keepdim=True)
        return empty if bool(empty.any()) else None

    @functools.cached_property
    def sinks(self) -> torch.Tensor | None:
        """(Hq,) float32 learned sink logits, one per query head (gpt-oss), or None without sinks (``sinks``
        none). Each query row's softmax denominator gains exp(sink_h); the sink contributes no value. Seeded
        like ``parameter``; a leaf that requires grad when q does (backward passes check its gradient)."""
        w = self.workload
        if w.sinks == "none":
            return None
        logits = self.parameter("sinks", w.heads, std=SINK_STD, dtype=torch.float32)
        return logits.detach().clone().requires_grad_(self.q.requires_grad)

    def parameter(self, name: str, *shape: int, std: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A named, seeded random parameter (a projection matrix, a scoring vector) in the workload's dtype
        (or ``dtype``): the same tensor for the contender that uses it and for its float64 reference."""
        cache = self.__dict__.setdefault("_parameters", {})
        if name not in cache:
            w = self.workload
            seed = (workload_seed(w) + zlib.crc32(name.encode())) % (2**63)
            generator = torch.Generator(device=w.device).manual_seed(seed)
            values = torch.randn(*shape, generator=generator, device=w.device, dtype=torch.float32) * std
            cache[name] = values.to(dtype or w.torch_dtype)
        tensor: torch.Tensor = cache[name]
        return tensor

    def kv_expanded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v repeated to Hq heads (query head h reads kv head h // group, as torch enable_gqa)."""
        group = self.workload.gqa_group
        if group == 1:
            return self.k, self.v
        return self.k.repeat_interleave(group, dim=1), self.v.repeat_interleave(group, dim=1)


def make_inputs(workload: Workload, seed: int = DEFAULT_SEED, requires_grad: bool = False) -> AttentionInputs:
    """Random normal q, k, v and upstream gradient for ``workload`` (deterministic per seed). Made outside
    the allocator's cache (allocator.uncached): the float32 draws converted to the dtype would leave holes
    in it, and inputs mapped on their own go back to the system as soon as they are freed."""
    with uncached():
        return _make_inputs(workload, seed, requires_grad)


def _make_inputs(workload: Workload, seed: int, requires_grad: bool) -> AttentionInputs:
    w = workload
    generator = torch.Generator(device=w.device).manual_seed(workload_seed(w, seed))

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=w.device, dtype=torch.float32)

    def randn(*shape: int) -> torch.Tensor:
        return draw(*shape).to(w.torch_dtype).requires_grad_(requires_grad)

    def cache(*shape: int) -> tuple[torch.Tensor, torch.Tensor | None]:  # a narrowed cache is not trained
        values = draw(*shape)
        share_prefix(values, w.shared_prefix)  # every sequence's first shared_prefix positions: sequence 0's
        if w.kv_dtype == w.dtype:
            return values.to(w.torch_dtype).requires_grad_(requires_grad), None
        return kv_cache.quantize(values, w)

    q_scale = None
    if w.q_dtype == w.dtype:
        q = randn(w.batch, w.heads, w.seq_q, w.head_dim)
    else:  # an fp8 forward: the same draw, stored in fp8 with its scales (not trained)
        q, q_scale = kv_cache.quantize_query(draw(w.batch, w.heads, w.seq_q, w.head_dim), w)
    k, k_scale = cache(w.batch, w.kv_heads, w.seq_k, w.head_dim)
    # latent (MLA): values are the first Dv channels of the one cache — a view, no second tensor, k's scales
    latent = w.kv_layout == "latent"
    v, v_scale = (k[..., : w.head_dim_v], k_scale) if latent else cache(w.batch, w.kv_heads, w.seq_k, w.head_dim_v)
    grad_out = randn(w.batch, w.heads, w.seq_q, w.head_dim_v).detach()
    return AttentionInputs(w, q, k, v, grad_out, k_scale=k_scale, v_scale=v_scale, q_scale=q_scale)
