"""``score_dot`` — dot-product scores q·k, no scaling (scoring suite)."""

from __future__ import annotations

import torch

from attnbench.impls._scoring import ScoreFn, ScoringContender
from attnbench.workload.inputs import AttentionInputs


class DotScore(ScoringContender):
    name = "score_dot"
    description = "scoring: softmax(q·kᵀ)·v, unscaled dot product"

    def scores(self, inputs: AttentionInputs) -> ScoreFn:
        return lambda q, k: q @ k.transpose(-1, -2)

    def scores64(self, inputs: AttentionInputs) -> ScoreFn:
        return lambda q, k: torch.einsum("hrd,hkd->hrk", q, k)


contender = DotScore()
