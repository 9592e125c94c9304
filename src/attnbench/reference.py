"""The float64 reference every contender is checked against.

It re-implements each mask rule from its definition (see ``attnbench.masks`` for the rules), expands
GQA heads by index, and works on a sample of query rows at long sequence lengths so that checking a
16k-token case costs a few hundred rows, not the whole S×S score matrix.
"""

from __future__ import annotations

import torch

from attnbench.inputs import AttentionInputs
from attnbench.masks import padding_lengths

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
    raise ValueError(f"reference has no rule for mask {w.mask!r}")


def reference_output(inputs: AttentionInputs, rows: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v in float64 for the given query rows: (B, Hq, R, D).

    Rows that see no key give zeros.
    """
    w = inputs.workload
    rows = rows.to(inputs.q.device)
    kv_head = torch.arange(w.heads, device=rows.device) // w.gqa_group  # query head -> kv head
    outputs = []
    for b in range(w.batch):  # one batch element at a time bounds the float64 score memory
        q = inputs.q.detach()[b][:, rows].double()  # (Hq, R, D)
        k = inputs.k.detach()[b][kv_head].double()  # (Hq, Sk, D)
        v = inputs.v.detach()[b][kv_head].double()  # (Hq, Sk, D)
        scores = torch.matmul(q, k.transpose(-1, -2)) * w.softmax_scale  # (Hq, R, Sk)
        visible = _visible(inputs, b, rows)
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        weights = torch.exp(scores - row_max)
        total = weights.sum(dim=-1, keepdim=True)
        probs = torch.where(total > 0, weights / total.clamp_min(1e-300), torch.zeros_like(weights))
        outputs.append(torch.matmul(probs, v))  # (Hq, R, D)
    return torch.stack(outputs)
