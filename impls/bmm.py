"""``bmm`` — two batched matmuls around a softmax, materialising the (B, H, Sq, Sk) score matrix."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contender import Capabilities, Contender
from attnbench.impls._grouped import grouped_masks, masked_softmax, materialised_bytes
from attnbench.inputs import AttentionInputs
from attnbench.workload import Workload


class BatchedMatmul(Contender):
    name = "bmm"
    description = "torch.bmm(q, kᵀ)·scale → masked softmax → torch.bmm(p, v); S² memory"
    capabilities = Capabilities(backward=True)

    def predicted_extra_bytes(self, workload: Workload) -> float:
        return materialised_bytes(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        B, Hkv, G, Sq, Sk, D = w.batch, w.kv_heads, w.gqa_group, w.seq_q, w.seq_k, w.head_dim
        q = inputs.q.reshape(B * Hkv, G * Sq, D)  # head h = kv_head·G + g, so this is a view
        k_t = inputs.k.reshape(B * Hkv, Sk, D).transpose(1, 2)  # (B·Hkv, D, Sk)
        v = inputs.v.reshape(B * Hkv, Sk, D)
        hidden, empty = grouped_masks(inputs)
        scale = inputs.scale

        def run() -> torch.Tensor:
            scores = torch.bmm(q, k_t).mul_(scale).view(B, Hkv, G, Sq, Sk)
            probs = masked_softmax(scores, hidden, empty).view(B * Hkv, G * Sq, Sk)
            return torch.bmm(probs, v).view(B, Hkv * G, Sq, D)

        return run


contender = BatchedMatmul()
