"""How a workload's mask falls on a kernel's tiles: each (query block, key block) of the score matrix is
empty (no visible pair: a kernel that skips blocks never touches it), full (every pair visible: no mask to
apply) or partial (some: computed whole, then masked).

A block-skipping kernel computes every pair of each tile that is not empty, so its work at a tile size is
``computed_pairs`` and ``work_factor`` = computed / visible pairs says how much of that work the mask throws
away (1.0: none; a causal S4096 at 128 × 128: 1.03; a 256-key sliding window at 128 × 128: about 1.5). The
split of partial from full tiles is what a kernel's diagonal blocks pay for masking. Rows and keys past the
matrix's edge are not counted (a tile at the edge is clipped to it), so a short decode row is one row, not
``block_m``; a ragged batch's sequences are tiled each from its own first row, as varlen kernels do: sequence b is
its own q_len × kv_len matrix (``attnbench.workload.sequences``), so the padding past its rows and keys is no tile
at all, and a decode step of a mixed batch is one row of tiles one row high.

Counted from :func:`attnbench.workload.masks.key_ranges` (each row's one key range), a sequence at a time, in
O(rows + tiles) per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.workload._problem import Workload
from attnbench.workload.masks import key_ranges
from attnbench.workload.sequences import sequence_lengths

EMPTY, PARTIAL, FULL = 0, 1, 2


@dataclass(frozen=True)
class TileCounts:
    """One workload at one tile size, summed over the batch (per head: every head has the same mask)."""

    block_m: int
    block_n: int
    full: int
    partial: int
    empty: int
    visible_pairs: int
    computed_pairs: int  # the pairs of every tile that is not empty, clipped to the matrix

    @property
    def work_factor(self) -> float:
        """Computed pairs over visible ones (nan where no pair is visible)."""
        return self.computed_pairs / self.visible_pairs if self.visible_pairs else float("nan")


def tile_states(lo: torch.Tensor, hi: torch.Tensor, seq_k: int, block_m: int, block_n: int) -> torch.Tensor:
    """(query blocks, key blocks) int8 of EMPTY, PARTIAL, FULL for one sequence whose row i sees keys
    lo[i] <= j < hi[i] of ``seq_k`` (lo, hi: (Sq,) int64)."""
    seq_q = lo.numel()
    row_blocks, key_blocks = -(-seq_q // block_m), -(-seq_k // block_n)
    block_of_row = torch.arange(seq_q) // block_m
    seeing = lo < hi

    def rows_per_tile(first: torch.Tensor, last: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        # each row in ``rows`` counts once in key blocks first..last of its query block: a difference array
        counts = torch.zeros(row_blocks, key_blocks + 1, dtype=torch.int64)
        rows = rows & (first <= last)
        base = block_of_row[rows] * (key_blocks + 1)
        ones = torch.ones(int(rows.sum()), dtype=torch.int64)
        counts.view(-1).index_add_(0, base + first[rows], ones)
        counts.view(-1).index_add_(0, base + last[rows] + 1, -ones)
        return counts.cumsum(1)[:, :key_blocks]

    touched = rows_per_tile(lo // block_n, (hi - 1) // block_n, seeing)
    # a row covers key block c whole when lo <= c·bn and min((c+1)·bn, Sk) <= hi (the last block is clipped)
    last_whole = torch.where(hi >= seq_k, torch.full_like(hi, key_blocks - 1), hi // block_n - 1)
    covering = rows_per_tile(-(-lo // block_n), last_whole, seeing)
    rows_in_block = (seq_q - torch.arange(row_blocks) * block_m).clamp(max=block_m).view(-1, 1)
    states = torch.full((row_blocks, key_blocks), PARTIAL, dtype=torch.int8)
    states[covering == rows_in_block] = FULL
    states[touched == 0] = EMPTY
    return states


def _clipped_sizes(total: int, block: int) -> torch.Tensor:
    return (total - torch.arange(-(-total // block)) * block).clamp(max=block)


def sequence_ranges(w: Workload) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per batch element, its rows' (lo, hi) key ranges (Sq,) each — a ragged batch's sequence its own q_len rows;
    one shared pair where the mask is the same for every sequence (then :func:`count_tiles` weighs it by the
    batch)."""
    lo, hi = key_ranges(w)
    rows = [q for q, _ in lengths] if (lengths := sequence_lengths(w)) is not None else [w.seq_q] * lo.shape[0]
    return [(lo[b, : rows[b]], hi[b, : rows[b]]) for b in range(lo.shape[0])]


def _sequence_keys(w: Workload, count: int) -> list[int]:
    """Per entry of :func:`sequence_ranges` (``count`` of them), the keys of its matrix: a ragged batch's sequence
    its own kv_len."""
    lengths = sequence_lengths(w)
    return [k for _, k in lengths] if lengths is not None else [w.seq_k] * count


def sequence_states(
    w: Workload, block_m: int, block_n: int, ranges: list[tuple[torch.Tensor, torch.Tensor]] | None = None
) -> list[torch.Tensor]:
    """:func:`tile_states` of each of :func:`sequence_ranges` (``ranges``, where the caller has them)."""
    ranges = sequence_ranges(w) if ranges is None else ranges
    keys = _sequence_keys(w, len(ranges))
    return [tile_states(lo, hi, k, block_m, block_n) for (lo, hi), k in zip(ranges, keys, strict=True)]


def count_tiles(w: Workload, block_m: int, block_n: int, states: list[torch.Tensor] | None = None) -> TileCounts:
    """:class:`TileCounts` of ``w`` at ``block_m`` query rows × ``block_n`` keys (from ``states``, its
    :func:`sequence_states` at that tile, where the caller has them)."""
    if block_m < 1 or block_n < 1:
        raise ValueError(f"tile {block_m}x{block_n}: both sides must be positive")
    ranges = sequence_ranges(w)
    if states is None:
        states = sequence_states(w, block_m, block_n, ranges)
    weight = w.batch // len(ranges)  # a mask shared by the batch is counted once and weighed by it
    full = partial = empty = visible = computed = 0
    for (lo, hi), keys, tiles in zip(ranges, _sequence_keys(w, len(ranges)), states, strict=True):
        rows = _clipped_sizes(lo.numel(), block_m)  # each sequence's tiles clipped to its own matrix
        pairs_of_tile = rows.view(-1, 1) * _clipped_sizes(keys, block_n).view(1, -1)
        full += int((tiles == FULL).sum())
        partial += int((tiles == PARTIAL).sum())
        empty += int((tiles == EMPTY).sum())
        visible += int((hi - lo).clamp(min=0).sum())
        computed += int(pairs_of_tile[tiles != EMPTY].sum())
    return TileCounts(
        block_m, block_n, full * weight, partial * weight, empty * weight, visible * weight, computed * weight
    )
