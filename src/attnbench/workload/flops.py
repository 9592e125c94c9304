"""One FLOP and byte count for every contender (see DESIGN.md).

forward FLOPs = 2·Hq·(D + Dv)·P, with P the exact number of (query, key) pairs the mask leaves visible
summed over the batch — so causal with Sq ≠ Sk and padding are counted right, and a kernel that skips
masked blocks is not credited with work it did not need to do. Backward is 2.5× forward,
forward+backward 3.5×. Learned sinks (``sinks`` learned) are not counted: one exp and add per query row,
O(Hq·Sq) against the O(Hq·Sq·Sk·D) of the count (likewise their Hq float32 logits among the bytes).

Minimum bytes: what any implementation must move at least once. Forward reads q (D wide) and writes o
(Dv wide), and reads the keys and values some query row sees (k at D and v at Dv channels, Hkv heads;
kv_layout latent: the one cache at D channels, counted once; per sequence the span of visible keys, see
``masks.key_span`` — a decode step against a padded or windowed cache reads only its part; a ragged or
mixed batch counts each sequence's own query rows and cache, ``attnbench.workload.sequences``). With a paged
cache (page_size > 0) the reads are whole pages — every page the span touches — plus one int32 page-table
entry per page, so ``gbps`` places decode rows where they belong. k and v are read at the cache's own
element type (``kv_dtype``: an fp8 cache moves a quarter of a float32 one), plus an fp8 cache's float32
scales of the blocks read (one per sequence and kv head, or per page read); q and o at the dtype. A shared
prefix (``attnbench.workload.prefix``) is read once for the whole batch, each sequence's own positions once. Backward
reads q, o, dO and, as the forward, the keys and values some query row sees; it writes dq, dk, dv — dk and dv for
every cached position (a key no row sees has a zero gradient: written, never read).
"""

from __future__ import annotations

from attnbench.workload._problem import Workload
from attnbench.workload.kv_cache import SCALE_BYTES, is_scaled
from attnbench.workload.masks import key_span, workload_pairs
from attnbench.workload.prefix import shared_positions
from attnbench.workload.sequences import cached_tokens, query_rows

PASS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def attention_flops(w: Workload) -> float:
    """Floating-point operations of one call of the workload's pass (the mha module adds its four
    d_model × d_model projections)."""
    pairs = workload_pairs(w)
    forward = 2.0 * w.heads * (w.head_dim + w.head_dim_v) * pairs
    if w.module == "mha":
        forward += 2.0 * w.d_model**2 * (2 * w.batch * w.seq_q + 2 * w.batch * w.seq_k)
    return forward * PASS_FACTOR[w.pass_]


def attention_bytes(w: Workload) -> float:
    """Minimum bytes one call of the workload's pass must read and write."""
    element, cached = w.torch_dtype.itemsize, w.kv_torch_dtype.itemsize / w.torch_dtype.itemsize
    q = query_rows(w) * w.heads * w.head_dim  # also dq (a ragged batch: its sequences' own rows)
    o = query_rows(w) * w.heads * w.head_dim_v  # also dO
    kv = cached_tokens(w) * w.kv_heads * kv_channels(w)  # dk and dv (latent: the one cache's gradient)
    narrow_q = w.q_torch_dtype.itemsize / element  # an fp8 forward reads q in fp8 (and its scales)
    scale_bytes = page_table_bytes(w) + kv_scale_bytes(w) + (4 * w.batch * w.heads if narrow_q != 1 else 0)
    forward = q * narrow_q + kv_read_elements(w) * cached + o + scale_bytes / element
    backward = 2 * q + 2 * o + kv_read_elements(w) * cached + kv  # read q, o, dO, k, v; write dq, dk, dv
    if w.module == "mha":  # reads its input(s), the four weight matrices and biases; writes the output
        forward += 4 * w.d_model**2 + 4 * w.d_model + (module_input_tokens(w) + w.batch * w.seq_q) * w.d_model
    per_pass = {"fwd": forward, "bwd": backward, "fwd_bwd": forward + backward}
    return float(per_pass[w.pass_] * element)


def module_input_tokens(w: Workload) -> int:
    """Tokens of input the mha module reads: self-attention (seq_q == seq_k) projects q, k and v from one x, read
    once; cross-attention reads the queries' input and the keys' (``attnbench.workload.mha.module_inputs``)."""
    return w.batch * w.seq_q if w.seq_q == w.seq_k else w.batch * (w.seq_q + w.seq_k)


def kv_positions_read(w: Workload) -> int:
    """Key positions read over the batch: the visible span per sequence, in whole pages when paged; of a shared
    prefix's positions, those some sequence's span holds, once."""
    shared = shared_positions(w)
    total, in_prefix = 0, []
    for first, end in key_span(w):
        total += _positions(w, max(first, shared), end)
        in_prefix.append(_pages_of(w, first, min(end, shared)))
    covered = 0  # the union of the spans' shared parts, each counted once
    for first, end in sorted(span for span in in_prefix if span[1] > span[0]):
        total += max(0, end - max(first, covered))
        covered = max(covered, end)
    return total


def _pages_of(w: Workload, first: int, end: int) -> tuple[int, int]:
    """[first, end) widened to whole pages when paged."""
    if w.page_size and end > first:
        return (first // w.page_size) * w.page_size, -(-end // w.page_size) * w.page_size
    return first, end


def _positions(w: Workload, first: int, end: int) -> int:
    first, end = _pages_of(w, first, end)
    return max(0, end - first)


def kv_channels(w: Workload) -> int:
    """Cache channels per (token, kv head): k's D and v's Dv, or D once for kv_layout latent (MLA), whose
    values are the first Dv channels of the keys' cache."""
    return w.head_dim if w.kv_layout == "latent" else w.head_dim + w.head_dim_v


def kv_read_elements(w: Workload) -> int:
    """Elements of k and v together one forward call reads (the one cache once for latent)."""
    return kv_positions_read(w) * w.kv_heads * kv_channels(w)


def kv_scale_bytes(w: Workload) -> int:
    """float32 scales of an fp8 cache read by one forward call, of k and of v: one per (sequence, kv head), or
    one per page read and kv head when paged (0 without scales)."""
    if not is_scaled(w):
        return 0
    blocks = kv_positions_read(w) // w.page_size if w.page_size else sum(end > first for first, end in key_span(w))
    return (1 if w.kv_layout == "latent" else 2) * SCALE_BYTES * blocks * w.kv_heads  # latent: one cache, one scale


def page_table_bytes(w: Workload) -> int:
    """int32 page-table entries of the pages read (0 for a contiguous cache)."""
    return 4 * kv_positions_read(w) // w.page_size if w.page_size else 0
