"""``einsum`` — the same computation as ``bmm`` written with torch.einsum (same masks, score modifiers,
learned sinks and paged-cache gather by the harness, same dequantization of a narrowed cache in the call; v's
own head dim Dv, and a latent (MLA) cache's values as the strided view einsum's bmm reads in place)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contenders.contract import ALL_MASKS, ALL_SCORE_MODS, TORCH_DTYPES, Capabilities, Contender
from attnbench.impls._grouped import grouped_bias, grouped_masks, masked_softmax, materialised_bytes
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import modify_scores


class Einsum(Contender):
    name = "einsum"
    description = "torch.einsum scores → masked softmax → torch.einsum with v; S² memory; pages gathered in the call"
    capabilities = Capabilities(
        dtypes=TORCH_DTYPES,
        masks=ALL_MASKS,
        score_mods=ALL_SCORE_MODS,
        paged="gather",
        backward=True,
        features=frozenset({"sinks", "head_dim_v", "kv_layout", "kv_dtype", "lengths", "shared_prefix"}),
    )

    def predicted_extra_bytes(self, workload: Workload) -> float:
        return materialised_bytes(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        q = inputs.q.view(w.batch, w.kv_heads, w.gqa_group, w.seq_q, w.head_dim)  # (B, Hkv, G, Sq, D)
        hidden, empty = grouped_masks(inputs)
        bias, sinks = grouped_bias(inputs), inputs.sinks
        scale, load = inputs.scale, inputs.kv_loader()  # k (B, Hkv, Sk, D), v (…, Dv), dequantized in the call

        def run() -> torch.Tensor:
            k, v = load()
            scores = modify_scores(torch.einsum("bhgqd,bhkd->bhgqk", q, k) * scale, w, bias)
            probs = masked_softmax(scores, hidden, empty, sinks)
            out = torch.einsum("bhgqk,bhkd->bhgqd", probs, v)
            return out.reshape(w.batch, w.heads, w.seq_q, w.head_dim_v)

        return run


contender = Einsum()
