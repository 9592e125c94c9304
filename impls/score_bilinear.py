"""``score_bilinear`` — bilinear scores q·W·kᵀ with a learned (here: seeded) D×D matrix W."""

from __future__ import annotations

import math

import torch

from attnbench.impls._scoring import ScoreFn, ScoringContender
from attnbench.workload import Workload
from attnbench.workload.flops import attention_flops
from attnbench.workload.inputs import AttentionInputs


class BilinearScore(ScoringContender):
    name = "score_bilinear"
    description = "scoring: softmax(q·W·kᵀ)·v, W a D×D matrix"

    def _weight(self, inputs: AttentionInputs) -> torch.Tensor:
        d = inputs.workload.head_dim
        return inputs.parameter("bilinear_W", d, d, std=1 / math.sqrt(d))

    def flops(self, workload: Workload) -> float:
        w = workload
        return attention_flops(w) + 2.0 * w.batch * w.heads * w.seq_q * w.head_dim * w.head_dim

    def scores(self, inputs: AttentionInputs) -> ScoreFn:
        weight = self._weight(inputs)
        return lambda q, k: (q @ weight) @ k.transpose(-1, -2)

    def scores64(self, inputs: AttentionInputs) -> ScoreFn:
        weight = self._weight(inputs).double()
        return lambda q, k: torch.einsum("hrd,de,hke->hrk", q, weight, k)


contender = BilinearScore()
