"""``einsum`` — the same computation as ``bmm`` written with torch.einsum."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contender import Capabilities, Contender
from attnbench.impls._grouped import grouped_masks, masked_softmax, materialised_bytes
from attnbench.inputs import AttentionInputs
from attnbench.workload import Workload


class Einsum(Contender):
    name = "einsum"
    description = "torch.einsum scores → masked softmax → torch.einsum with v; S² memory"
    capabilities = Capabilities(backward=True)

    def predicted_extra_bytes(self, workload: Workload) -> float:
        return materialised_bytes(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        q = inputs.q.view(w.batch, w.kv_heads, w.gqa_group, w.seq_q, w.head_dim)  # (B, Hkv, G, Sq, D)
        k, v = inputs.k, inputs.v  # (B, Hkv, Sk, D)
        hidden, empty = grouped_masks(inputs)
        scale = inputs.scale

        def run() -> torch.Tensor:
            scores = torch.einsum("bhgqd,bhkd->bhgqk", q, k) * scale
            probs = masked_softmax(scores, hidden, empty)
            out = torch.einsum("bhgqk,bhkd->bhgqd", probs, v)
            return out.reshape(w.batch, w.heads, w.seq_q, w.head_dim)

        return run


contender = Einsum()
