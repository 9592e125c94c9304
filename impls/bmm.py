"""``bmm`` — two batched matmuls around a softmax, materialising the (B, H, Sq, Sk) score matrix.

Every mask comes as a dense boolean mask (a ragged or mixed batch's per sequence, (B, 1, Sq, Sk)), the score
modifiers act on the materialised scores (softcap's tanh, alibi's bias added), learned sinks as gpt-oss's
reference has them (a column of sink logits concatenated to the scores before the softmax, dropped after); a
paged KV cache is gathered into k and v by the harness inside the timed call (``paged="gather"``); a cache in
another kv_dtype is dequantized to the dtype first, in the call, and so is an fp8 forward's q (q_dtype). v may
have its own head dim Dv; with kv_layout latent (MLA) v is the view of the cache's first Dv channels, which the
second bmm reads in place with its row stride (no copy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contenders.contract import ALL_MASKS, ALL_SCORE_MODS, TORCH_DTYPES, Capabilities, Contender
from attnbench.impls._grouped import grouped_bias, grouped_masks, masked_softmax, materialised_bytes
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import modify_scores


class BatchedMatmul(Contender):
    name = "bmm"
    description = (
        "torch.bmm(q, kᵀ)·scale → masked softmax → torch.bmm(p, v); S² memory; a paged cache is gathered "
        "inside the timed call; a latent (MLA) cache's values read in place, strided"
    )
    capabilities = Capabilities(
        dtypes=TORCH_DTYPES,
        masks=ALL_MASKS,
        score_mods=ALL_SCORE_MODS,
        paged="gather",
        backward=True,
        features=frozenset({"sinks", "head_dim_v", "kv_layout", "kv_dtype", "q_dtype", "lengths", "shared_prefix"}),
    )

    def predicted_extra_bytes(self, workload: Workload) -> float:
        return materialised_bytes(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        B, Hkv, G, Sq, Sk, D, Dv = w.batch, w.kv_heads, w.gqa_group, w.seq_q, w.seq_k, w.head_dim, w.head_dim_v
        query = inputs.query_loader()  # q itself, or an fp8 forward's q dequantized in the call
        hidden, empty = grouped_masks(inputs)
        bias, sinks = grouped_bias(inputs), inputs.sinks
        scale, load = inputs.scale, inputs.kv_loader()  # k (B, Hkv, Sk, D), v (…, Dv), dequantized in the call

        def run() -> torch.Tensor:
            k, v = load()
            q = query().reshape(B * Hkv, G * Sq, D)  # head h = kv_head·G + g, so this is a view
            k_t = k.reshape(B * Hkv, Sk, D).transpose(1, 2)  # (B·Hkv, D, Sk)
            scores = torch.bmm(q, k_t).mul_(scale).view(B, Hkv, G, Sq, Sk)
            scores = modify_scores(scores, w, bias)
            probs = masked_softmax(scores, hidden, empty, sinks).view(B * Hkv, G * Sq, Sk)
            return torch.bmm(probs, v.reshape(B * Hkv, Sk, Dv)).view(B, Hkv * G, Sq, Dv)

        return run


contender = BatchedMatmul()
