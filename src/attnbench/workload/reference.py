"""The float64 reference every contender is checked against.

It re-implements each mask rule and score modifier from its definition (see ``attnbench.workload.masks`` for the
rules: it shares only the data — padding, document and per-sequence lengths — never the code that builds masks), expands
GQA heads by index, reads an fp8 KV cache as its stored values times their scales (``attnbench.workload.kv_cache``
says what is stored; the dequantization is written here again, in float64), and works on a sample of
query rows at long sequence lengths so that checking a 16k-token case costs a few hundred rows, not the
whole S×S score matrix: :func:`checked_rows` — evenly spaced rows, and the rows where kernels go wrong, the
edges of query tiles and of the mask's structure (the row ranges come from ``masks.key_ranges``, which only
chooses which rows are checked; what a row should see is re-derived here).

Learned sinks (gpt-oss) from their definition: with m a row's largest logit (sink included),
out_i = Σ_j exp(s_ij − m)·v_j / (exp(sink_h − m) + Σ_j exp(s_ij − m)) over the visible keys j. A row that
sees no key has an empty sum above the line, so its output is zeros — the same as without sinks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.workload._problem import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import document_lengths, key_ranges, padding_lengths
from attnbench.workload.sequences import sequence_lengths

MAX_CHECKED_ROWS = 256  # evenly spaced query rows checked at long sequences (every row when there are fewer)
# ... and at most this many more, where kernels go wrong in a row or two that evenly spaced rows step over: the
# last and first rows of query tiles, and the rows at the mask's edges (a document's or chunk's first row, …).
TILE_EDGE_ROWS = 128
MASK_EDGE_ROWS = 128
TILE_QUANTUM = 16  # tiles of 16 to 256 rows (MMA fragments, warps' rows, CTA tiles) start at multiples of 16 ...
NEAR_END = 256  # ... checked at every multiple of 16 within this many rows of either end
MIDDLE_TILE = 64  # and between, at a spread of multiples of 64: every residue mod 256 (64-, 128- and 256-row tiles)


def sample_rows(seq_q: int, max_rows: int = MAX_CHECKED_ROWS) -> torch.Tensor:
    """Evenly spaced query row indices: all rows when few, else ``max_rows`` including the first and last."""
    if seq_q <= max_rows:
        return torch.arange(seq_q)
    return torch.linspace(0, seq_q - 1, max_rows).round().long().unique()


def tile_edge_rows(seq_q: int) -> list[int]:
    """The last and first rows of query tiles (b − 1 and b at a tile boundary b): at every multiple of 16 within
    256 rows of either end, so the first and last tiles of every size from 16 to 256 rows, and at 32 multiples of
    64 spread between them, a quarter of them each residue of b / 64 mod 4 (edges of 64-row tiles that are and are
    not edges of 128- and 256-row tiles). A kernel wrong in one row of each tile (a store or mask off by one at a
    tile's edge) is wrong in some of them: at most ``TILE_EDGE_ROWS`` rows."""
    near = [b for b in range(TILE_QUANTUM, seq_q, TILE_QUANTUM) if b <= NEAR_END or b > seq_q - NEAR_END]
    middle = [b // MIDDLE_TILE for b in range(NEAR_END + MIDDLE_TILE, seq_q - NEAR_END + 1, MIDDLE_TILE)]
    spread = TILE_EDGE_ROWS // 2 - len(near)
    if len(middle) > spread:  # evenly spaced, each moved within its 4 tiles to the residue its turn asks for
        picks = [middle[round(n * (len(middle) - 1) / (spread - 1))] for n in range(spread)]
        middle = sorted({min(max(t - t % 4 + n % 4, middle[0]), middle[-1]) for n, t in enumerate(picks)})
    edges = near + [t * MIDDLE_TILE for t in middle]
    return sorted({row for b in edges for row in (b - 1, b)})


def mask_edge_rows(w: Workload) -> list[int]:
    """Rows at the edges of the mask's structure: where a row's visible key range [lo, hi) moves by a different
    step than its neighbour's (``masks.key_ranges``, any batch element) — a document's or chunk's first row and
    the row before, the first row a sliding window leaves key 0 out of, the first row that sees a key (Sq > Sk),
    a ragged sequence's last query row and first padding row — with the rows either side. Masks none, causal
    and padding have none. At most ``MASK_EDGE_ROWS`` rows (evenly spaced edges when there are more)."""
    lo, hi = key_ranges(w)
    steps = torch.stack((lo.diff(dim=1), hi.diff(dim=1)))  # (2, B or 1, Sq − 1): from row i to row i + 1
    edges = (steps[:, :, 1:] != steps[:, :, :-1]).any(0).any(0).nonzero().flatten() + 1
    most = MASK_EDGE_ROWS // 3
    if len(edges) > most:
        edges = edges[torch.linspace(0, len(edges) - 1, most).round().long().unique()]
    rows = (edges.view(-1, 1) + torch.tensor([-1, 0, 1])).flatten().clamp(0, w.seq_q - 1)
    return sorted(set(rows.tolist()))


def checked_rows(w: Workload) -> torch.Tensor:
    """The query rows the correctness check compares (sorted): every row up to ``MAX_CHECKED_ROWS``; past that,
    the evenly spaced ones (:func:`sample_rows`), the tiles' edge rows (:func:`tile_edge_rows`) and the mask's
    (:func:`mask_edge_rows`) — at most twice ``MAX_CHECKED_ROWS``."""
    if w.seq_q <= MAX_CHECKED_ROWS:
        return torch.arange(w.seq_q)
    edges = torch.tensor(tile_edge_rows(w.seq_q) + mask_edge_rows(w), dtype=torch.long)
    return torch.cat((sample_rows(w.seq_q), edges)).unique()


def checked_row_count(w: Workload) -> int:
    """At most how many query rows :func:`checked_rows` gives (a closed form, for the memory model)."""
    return min(w.seq_q, MAX_CHECKED_ROWS + TILE_EDGE_ROWS + MASK_EDGE_ROWS)


def _visible(inputs: AttentionInputs, batch_index: int, rows: torch.Tensor) -> torch.Tensor | None:
    """(R, Sk) bool: which keys each sampled query row of one batch element may see."""
    w = inputs.workload
    i = rows.view(-1, 1)
    j = torch.arange(w.seq_k, device=rows.device).view(1, -1)
    ragged = sequence_lengths(w)
    if ragged is not None:  # its own rows and keys; bottom-right within the sequence (all its keys for none)
        q_len, kv_len = ragged[batch_index]
        visible = (i < q_len) & (j < kv_len)
        if w.mask != "none":
            visible &= (q_len - 1 - i) <= (kv_len - 1 - j)
        if w.mask == "sliding_window":
            visible &= j > i + (kv_len - q_len) - w.window
        return visible
    if w.mask == "none":
        return None
    if w.mask == "causal":  # top-left: key index never past the query index
        return j <= i
    if w.mask == "causal_bottom_right":  # the last query row sees the last key
        return (w.seq_q - 1 - i) <= (w.seq_k - 1 - j)
    if w.mask == "padding":
        return (j < padding_lengths(w.batch, w.seq_k)[batch_index]).expand(len(rows), w.seq_k)
    if w.mask == "sliding_window":  # the last `window` keys up to the bottom-right diagonal
        diagonal = i + (w.seq_k - w.seq_q)
        return (j <= diagonal) & (j > diagonal - w.window)
    if w.mask == "document":  # same document, and not in the future
        ends = torch.tensor(document_lengths(w.seq_q, w.documents, w.lengths), device=rows.device).cumsum(0)
        document_of = torch.bucketize(torch.arange(w.seq_k, device=rows.device), ends, right=True)
        return (document_of[i] == document_of[j]) & (j <= i)
    if w.mask == "chunked":  # not in the future, and in the same chunk as the query's own position
        position = i + (w.seq_k - w.seq_q)
        return (j <= position) & (j // w.chunk == position // w.chunk)
    raise ValueError(f"reference has no rule for mask {w.mask!r}")


def _modified(inputs: AttentionInputs, scores: torch.Tensor, rows: torch.Tensor, b: int) -> torch.Tensor:
    """(Hq, R, Sk) scaled scores of batch element ``b`` with the workload's score modifier applied, from its
    definition (alibi's distance from the query's own key position, the sequence's own in a ragged batch)."""
    w = inputs.workload
    ragged = sequence_lengths(w)
    offset = w.seq_k - w.seq_q if ragged is None else ragged[b][1] - ragged[b][0]
    if w.score_mod == "softcap":
        return w.softcap * torch.tanh(scores / w.softcap)
    if w.score_mod == "alibi":
        slopes = [2.0 ** (-8.0 * (h + 1) / w.heads) for h in range(w.heads)]
        slope = torch.tensor(slopes, dtype=torch.float64, device=rows.device).view(-1, 1, 1)
        i = rows.view(1, -1, 1).double()
        j = torch.arange(w.seq_k, device=rows.device).view(1, 1, -1).double()
        return scores - slope * (i + offset - j).abs()
    return scores


Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (Hq, R, D), (Hq, Sk, D) -> (Hq, R, Sk)


def reference_attention(
    inputs: AttentionInputs,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: torch.Tensor,
    score: Score | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v in float64, differentiable: q (B, Hq, R, D) holds the given query rows,
    k (B, Hkv, Sk, D) and v (B, Hkv, Sk, Dv). Rows that see no key give zeros. One batch element at a time,
    each in a call of its own, so the float64 copies of one element's k and v are gone before the next's are
    made. ``sinks`` (Hq,): the sink logits to differentiate; by default the inputs' own (none without sinks)."""
    w = inputs.workload
    if sinks is None and inputs.sinks is not None:
        sinks = inputs.sinks.detach()
    return torch.stack([_one_sequence(inputs, q[b], k[b], v[b], b, rows, score, sinks) for b in range(w.batch)])


def _one_sequence(
    inputs: AttentionInputs,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: int,
    rows: torch.Tensor,
    score: Score | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """(Hq, R, Dv) for batch element ``b``: q (Hq, R, D), k (Hkv, Sk, D), v (Hkv, Sk, Dv); sinks (Hq,) or None."""
    w = inputs.workload
    group, count = w.gqa_group, len(rows)
    keys, values = _cached64(w, k, inputs.k_scale, b), _cached64(w, v, inputs.v_scale, b)  # (Hkv, Sk, D)
    if score is None:  # query head h = kv head h // G: (Hkv, G·R, D) rows against their own kv head, no copies
        grouped = q.double().reshape(w.kv_heads, group * count, -1)
        scores = torch.matmul(grouped, keys.transpose(-1, -2)).view(w.heads, count, w.seq_k) * w.softmax_scale
    else:  # the scoring suite's function, on keys repeated to Hq heads
        kv_head = torch.arange(w.heads, device=rows.device) // group  # query head -> kv head
        scores = score(q.double(), keys[kv_head])
    scores = _modified(inputs, scores, rows, b)
    visible = _visible(inputs, b, rows)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    sink = None if sinks is None else sinks.double().view(-1, 1, 1)  # (Hq, 1, 1)
    if sink is not None:  # the largest logit of the row, the sink's among them
        row_max = torch.maximum(row_max, sink.detach())
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    total = weights.sum(dim=-1, keepdim=True)
    if sink is not None:  # the sink joins the denominator only; it has no value
        total = total + torch.exp(sink - row_max)
    probs = torch.where(total > 0, weights / total.clamp_min(1e-300), torch.zeros_like(weights))
    grouped_probs = probs.reshape(w.kv_heads, group * count, w.seq_k)
    return torch.matmul(grouped_probs, values).reshape(w.heads, count, -1)  # (Hq, R, Dv)


def values_of(w: Workload, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The values attention weighs: v, or with kv_layout latent (MLA) by definition the first head_dim_v
    channels of the one cache k — taken here from k itself, whatever the inputs' v is."""
    return k[..., : w.head_dim_v] if w.kv_layout == "latent" else v


def _cached64(w: Workload, stored: torch.Tensor, scale: torch.Tensor | None, b: int) -> torch.Tensor:
    """Batch element ``b``'s k or v as the cache holds it, in float64: the stored values, times the scale of
    their block (an fp8 cache: one per sequence and kv head, or per page of ``page_size`` positions)."""
    values = stored.double()
    if scale is None:
        return values
    per_block = scale[b].double()  # (Hkv, blocks, 1)
    block = w.page_size if per_block.shape[1] > 1 else w.seq_k
    return values * per_block.repeat_interleave(block, dim=1)[:, : w.seq_k]


def reference_output(inputs: AttentionInputs, rows: torch.Tensor, score: Score | None = None) -> torch.Tensor:
    """The float64 output for the given query rows: (B, Hq, R, Dv). ``score`` replaces the scaled dot
    product (for the scoring suite's functions); the mask, softmax and weighting stay this module's."""
    rows = rows.to(inputs.q.device)
    q = inputs.q.detach()[:, :, rows].double()
    if inputs.q_scale is not None:  # an fp8 forward's q: its stored values times their (sequence, head) scales
        q = q * inputs.q_scale.double()
    k = inputs.k.detach()
    return reference_attention(inputs, q, k, values_of(inputs.workload, k, inputs.v.detach()), rows, score)


GRAD_CHUNK_ELEMENTS = 2**25  # float64 scores per chunk of query rows, all batch elements (256 MiB)


def reference_grads(inputs: AttentionInputs) -> tuple[torch.Tensor, ...]:
    """Float64 gradients of ⟨output, grad_out⟩ with respect to q, k and v — and, with learned sinks, a
    fourth: the sink logits' (Hq,).

    Every query row contributes to dk and dv (and to the sinks' gradient), so no sampling here: query rows
    go through in chunks sized to bound memory, dq chunk by chunk and dk, dv summed over the chunks. With
    kv_layout latent v is the view of k's first Dv channels, so dk is the whole cache's gradient (through
    keys and values) and dv the values' part, as autograd gives them for a contender's (q, k, v).
    """
    w = inputs.workload
    q = inputs.q.detach().double()
    k = inputs.k.detach().double().requires_grad_()
    v = values_of(w, k, inputs.v.detach().double().requires_grad_())
    upstream = inputs.grad_out.double()
    sinks = None if inputs.sinks is None else inputs.sinks.detach().double().requires_grad_()
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dsinks = None if sinks is None else torch.zeros_like(sinks)
    chunk = max(1, GRAD_CHUNK_ELEMENTS // (w.batch * w.heads * w.seq_k))  # the graph holds every batch element
    for start in range(0, w.seq_q, chunk):
        rows = torch.arange(start, min(start + chunk, w.seq_q), device=q.device)
        q_rows = q[:, :, rows].clone().requires_grad_()
        out = reference_attention(inputs, q_rows, k, v, rows, sinks=sinks)
        leaves = (q_rows, k, v) if sinks is None else (q_rows, k, v, sinks)
        g_q, g_k, g_v, *g_sinks = torch.autograd.grad(out, leaves, upstream[:, :, rows])
        dq[:, :, rows] = g_q
        dk += g_k
        dv += g_v
        if dsinks is not None:
            dsinks += g_sinks[0]
    return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)


SCORE_COPIES = 6  # (Hq, R, Sk) float64 tensors alive at once in _one_sequence: scores, weights, probs, temporaries
MODIFIER_COPIES = 2  # more for softcap's tanh or alibi's bias
GRAD_SCORE_COPIES = 10  # saved for backward and their gradients, per chunk


def reference_bytes(w: Workload, rows: int, repeated_keys: bool = False) -> float:
    """Memory model of the check against this reference, at its peak, beyond the inputs: float64 k and v of
    one batch element (and k repeated to Hq heads for a scoring function, ``repeated_keys``), that element's
    score-sized temporaries for ``rows`` query rows, and the (B, Hq, rows, D) outputs, query rows and
    comparison copies. Backward passes add the float64 gradients (reference_grads): q, k, v, upstream,
    dq, dk, dv and one chunk's graph."""
    f64 = 8.0
    heads, kv_heads, seq_k, dim = w.heads, w.kv_heads, w.seq_k, max(w.head_dim, w.head_dim_v)
    copies = SCORE_COPIES + (MODIFIER_COPIES if w.score_mod != "none" else 0)
    per_sequence = f64 * (2 * kv_heads * seq_k * dim + (heads * seq_k * dim if repeated_keys else 0))
    per_sequence += f64 * copies * heads * rows * seq_k + 2.0 * rows * seq_k  # scores; visible (bool) and its not
    checked = f64 * 8 * w.batch * heads * rows * dim  # outputs, stacked; q rows; the comparison's copies
    forward = per_sequence + checked
    if w.pass_ == "fwd":
        return forward
    tensors = 2 * w.batch * heads * w.seq_q * dim + 2 * w.batch * kv_heads * seq_k * dim  # q, upstream, k, v
    chunk = max(1, GRAD_CHUNK_ELEMENTS // (w.batch * heads * seq_k))
    graph = GRAD_SCORE_COPIES * w.batch * heads * min(chunk, w.seq_q) * seq_k  # one chunk's scores, all elements
    return max(forward, f64 * (2 * tensors + graph) + per_sequence)  # float64 inputs and gradients; a chunk
