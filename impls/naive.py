"""``naive`` — the textbook definition as Python loops: for each batch, head and query row q,
f(q) = Σᵢ softmax(q·kᵢ·scale)·vᵢ over the keys the mask leaves visible.

Every mask we support leaves a prefix of the keys visible to a query row, so the loop slices keys
[0, n) with n worked out per row before timing. It is the slow baseline that makes the others' speedups
concrete; CPU only (on a GPU it would measure kernel-launch latency, not attention).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contender import Capabilities, Contender
from attnbench.flops import attention_flops
from attnbench.inputs import AttentionInputs
from attnbench.masks import padding_lengths, visible_pairs
from attnbench.workload import Workload

SECONDS_PER_ROW = 15e-6  # Python and dispatch overhead of one row's five tensor operations


def visible_prefix(w: Workload, b: int, i: int) -> int:
    """How many leading keys query row i of batch element b may see."""
    if w.mask == "causal":
        return min(w.seq_k, i + 1)
    if w.mask == "causal_bottom_right":
        return max(0, min(w.seq_k, i + w.seq_k - w.seq_q + 1))
    if w.mask == "padding":
        return padding_lengths(w.batch, w.seq_k)[b]
    return w.seq_k


class NaiveLoop(Contender):
    name = "naive"
    description = "Python loops over batch, head and query: f(q) = Σ softmax(q·kᵢ·scale)·vᵢ"
    capabilities = Capabilities(devices=frozenset({"cpu"}), backward=False)

    def predicted_seconds(self, workload: Workload, flops_per_s: float, bytes_per_s: float) -> float:
        """Per (batch, head, query) row: Python overhead, plus reading the visible keys and values (a
        matrix-vector product is bandwidth-bound), plus the arithmetic."""
        w = workload
        rows = w.batch * w.heads * w.seq_q
        key_value_bytes = visible_pairs(w.mask, w.batch, w.seq_q, w.seq_k) * w.heads * 2 * w.head_dim
        key_value_bytes *= w.torch_dtype.itemsize
        return rows * SECONDS_PER_ROW + key_value_bytes / bytes_per_s + attention_flops(w) / flops_per_s

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        q, k, v = inputs.q.detach(), inputs.k.detach(), inputs.v.detach()
        scale, group = inputs.scale, w.gqa_group
        prefix = [[visible_prefix(w, b, i) for i in range(w.seq_q)] for b in range(w.batch)]

        def run() -> torch.Tensor:
            out = torch.zeros(w.batch, w.heads, w.seq_q, w.head_dim, dtype=q.dtype, device=q.device)
            for b in range(w.batch):
                for h in range(w.heads):
                    keys, values = k[b, h // group], v[b, h // group]  # (Sk, D)
                    for i in range(w.seq_q):
                        n = prefix[b][i]
                        if n == 0:
                            continue  # no visible key: the output row stays zero
                        weights = torch.softmax(keys[:n] @ q[b, h, i] * scale, dim=0)  # (n,)
                        out[b, h, i] = weights @ values[:n]
            return out

        return run


contender = NaiveLoop()
