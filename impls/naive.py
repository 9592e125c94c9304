"""``naive`` — the textbook definition as Python loops: for each batch, head and query row q,
f(q) = Σᵢ softmax(s(q·kᵢ·scale))·vᵢ over the keys the mask leaves visible, s the score modifier.

Every mask we support leaves each query row one range of keys [lo, hi) (``masks.key_ranges``; a ragged or
mixed batch's rows each their own sequence's), so the
loop slices keys lo:hi, with the ranges worked out before timing; alibi's bias row is a slice of a bias
built before timing, softcap a tanh on the row's scores; learned sinks join each row's softmax as one more
logit whose weight is dropped (``attnbench.impls._sinks``). A paged cache is gathered back into contiguous
k and v by the harness at the start of each call, and a cache in another kv_dtype dequantized whole (as its
users would before looping) at the start of each call. It is the slow baseline that makes the others' speedups
concrete; CPU only (on a GPU it would measure kernel-launch latency, not attention).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contenders.contract import ALL_MASKS, ALL_SCORE_MODS, TORCH_DTYPES, Capabilities, Contender
from attnbench.impls._sinks import softmax_with_sink
from attnbench.workload import Workload
from attnbench.workload.flops import attention_flops
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import key_ranges, workload_pairs

SECONDS_PER_ROW = 15e-6  # Python and dispatch overhead of one row's five tensor operations


class NaiveLoop(Contender):
    name = "naive"
    description = "Python loops over batch, head and query: f(q) = Σ softmax(q·kᵢ·scale)·vᵢ (pages gathered first)"
    capabilities = Capabilities(
        devices=frozenset({"cpu"}),
        dtypes=TORCH_DTYPES,
        masks=ALL_MASKS,
        score_mods=ALL_SCORE_MODS,
        paged="gather",
        backward=False,
        # latent: v's rows slice the cache's
        features=frozenset({"sinks", "head_dim_v", "kv_layout", "kv_dtype", "lengths", "shared_prefix"}),
    )

    def predicted_seconds(self, workload: Workload, flops_per_s: float, bytes_per_s: float) -> float:
        """Per (batch, head, query) row: Python overhead, plus reading the visible keys and values (a
        matrix-vector product is bandwidth-bound), plus the arithmetic."""
        w = workload
        rows = w.batch * w.heads * w.seq_q
        key_value_bytes = workload_pairs(w) * w.heads * (w.head_dim + w.head_dim_v) * w.torch_dtype.itemsize
        return rows * SECONDS_PER_ROW + key_value_bytes / bytes_per_s + attention_flops(w) / flops_per_s

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        q = inputs.q.detach()
        scale, group = inputs.scale, w.gqa_group
        load = inputs.kv_loader()  # reads the tensors a paged cache is gathered into; dequantizes a narrowed one
        lo, hi = (t.expand(w.batch, w.seq_q).tolist() for t in key_ranges(w))
        bias = inputs.alibi_bias  # (1 or B, H, Sq, Sk) or None
        softcap = w.softcap if w.score_mod == "softcap" else None
        sinks = None if inputs.sinks is None else inputs.sinks.detach()  # (Hq,)

        def run() -> torch.Tensor:
            out = torch.zeros(w.batch, w.heads, w.seq_q, w.head_dim_v, dtype=q.dtype, device=q.device)
            k, v = (t.detach() for t in load())
            for b in range(w.batch):
                for h in range(w.heads):
                    keys, values = k[b, h // group], v[b, h // group]  # (Sk, D), (Sk, Dv)
                    for i in range(w.seq_q):
                        start, end = lo[b][i], hi[b][i]
                        if end <= start:
                            continue  # no visible key: the output row stays zero
                        scores = keys[start:end] @ q[b, h, i] * scale  # (n,)
                        if softcap is not None:
                            scores = torch.tanh(scores / softcap) * softcap
                        if bias is not None:
                            scores = scores + bias[b if len(bias) > 1 else 0, h, i, start:end]
                        if sinks is None:
                            weights = torch.softmax(scores, dim=0)
                        else:
                            weights = softmax_with_sink(scores, sinks[h : h + 1])
                        out[b, h, i] = weights @ values[start:end]
            return out

        return run


contender = NaiveLoop()
