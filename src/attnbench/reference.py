"""The float64 reference every contender is checked against.

It re-implements each mask rule and score modifier from its definition (see ``attnbench.masks`` for the
rules: it shares only the data — padding and document lengths — never the code that builds masks), expands
GQA heads by index, and works on a sample of query rows at long sequence lengths so that checking a
16k-token case costs a few hundred rows, not the whole S×S score matrix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.inputs import AttentionInputs
from attnbench.masks import document_lengths, padding_lengths

MAX_CHECKED_ROWS = 256


def sample_rows(seq_q: int, max_rows: int = MAX_CHECKED_ROWS) -> torch.Tensor:
    """Query row indices to check: all rows when few, else evenly spaced ones including first and last."""
    if seq_q <= max_rows:
        return torch.arange(seq_q)
    return torch.linspace(0, seq_q - 1, max_rows).round().long().unique()


def _visible(inputs: AttentionInputs, batch_index: int, rows: torch.Tensor) -> torch.Tensor | None:
    """(R, Sk) bool: which keys each sampled query row of one batch element may see."""
    w = inputs.workload
    i = rows.view(-1, 1)
    j = torch.arange(w.seq_k, device=rows.device).view(1, -1)
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
        ends = torch.tensor(document_lengths(w.seq_q, w.documents), device=rows.device).cumsum(0)
        document_of = torch.bucketize(torch.arange(w.seq_k, device=rows.device), ends, right=True)
        return (document_of[i] == document_of[j]) & (j <= i)
    raise ValueError(f"reference has no rule for mask {w.mask!r}")


def _modified(inputs: AttentionInputs, scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(Hq, R, Sk) scaled scores with the workload's score modifier applied, from its definition."""
    w = inputs.workload
    if w.score_mod == "softcap":
        return w.softcap * torch.tanh(scores / w.softcap)
    if w.score_mod == "alibi":
        slopes = [2.0 ** (-8.0 * (h + 1) / w.heads) for h in range(w.heads)]
        slope = torch.tensor(slopes, dtype=torch.float64, device=rows.device).view(-1, 1, 1)
        i = rows.view(1, -1, 1).double()
        j = torch.arange(w.seq_k, device=rows.device).view(1, 1, -1).double()
        return scores - slope * (i + (w.seq_k - w.seq_q) - j).abs()
    return scores


Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (Hq, R, D), (Hq, Sk, D) -> (Hq, R, Sk)


def reference_attention(
    inputs: AttentionInputs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
    score: Score | None = None,
) -> torch.Tensor:  # fmt: skip
    """softmax(q·kᵀ·scale + mask)·v in float64, differentiable: q (B, Hq, R, D) holds the given query rows,
    k and v (B, Hkv, Sk, D). Rows that see no key give zeros."""
    w = inputs.workload
    kv_head = torch.arange(w.heads, device=rows.device) // w.gqa_group  # query head -> kv head
    group, count = w.gqa_group, len(rows)
    outputs = []
    for b in range(w.batch):  # one batch element at a time bounds the float64 memory (k and v included)
        keys, values = k[b].double(), v[b].double()  # (Hkv, Sk, D)
        if score is None:  # query head h = kv head h // G: grouped, so k and v are never repeated
            grouped = q[b].double().reshape(w.kv_heads, group, count, -1)
            scores = torch.matmul(grouped, keys.unsqueeze(1).transpose(-1, -2)).view(w.heads, count, w.seq_k)
            scores = scores * w.softmax_scale
        else:  # the scoring suite's function, on keys repeated to Hq heads
            scores = score(q[b].double(), keys[kv_head])
        scores = _modified(inputs, scores, rows)
        visible = _visible(inputs, b, rows)
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True).detach()
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        weights = torch.exp(scores - row_max)
        total = weights.sum(dim=-1, keepdim=True)
        probs = torch.where(total > 0, weights / total.clamp_min(1e-300), torch.zeros_like(weights))
        grouped_probs = probs.reshape(w.kv_heads, group, count, w.seq_k)
        outputs.append(torch.matmul(grouped_probs, values.unsqueeze(1)).reshape(w.heads, count, -1))  # (Hq, R, Dv)
    return torch.stack(outputs)


def reference_output(inputs: AttentionInputs, rows: torch.Tensor, score: Score | None = None) -> torch.Tensor:
    """The float64 output for the given query rows: (B, Hq, R, D). ``score`` replaces the scaled dot
    product (for the scoring suite's functions); the mask, softmax and weighting stay this module's."""
    rows = rows.to(inputs.q.device)
    q = inputs.q.detach()[:, :, rows].double()
    return reference_attention(inputs, q, inputs.k.detach(), inputs.v.detach(), rows, score)


GRAD_CHUNK_ELEMENTS = 2**25  # float64 scores per chunk of query rows (256 MiB)


def reference_grads(inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 gradients of ⟨output, grad_out⟩ with respect to q, k and v.

    Every query row contributes to dk and dv, so no sampling here: query rows go through in chunks sized
    to bound memory, dq chunk by chunk and dk, dv summed over the chunks.
    """
    w = inputs.workload
    q = inputs.q.detach().double()
    k = inputs.k.detach().double().requires_grad_()
    v = inputs.v.detach().double().requires_grad_()
    upstream = inputs.grad_out.double()
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    chunk = max(1, GRAD_CHUNK_ELEMENTS // (w.heads * w.seq_k))
    for start in range(0, w.seq_q, chunk):
        rows = torch.arange(start, min(start + chunk, w.seq_q), device=q.device)
        q_rows = q[:, :, rows].clone().requires_grad_()
        out = reference_attention(inputs, q_rows, k, v, rows)
        g_q, g_k, g_v = torch.autograd.grad(out, (q_rows, k, v), upstream[:, :, rows])
        dq[:, :, rows] = g_q
        dk += g_k
        dv += g_v
    return dq, dk, dv
