"""``score_scaled_dot`` — scaled dot-product scores q·k/√d (scoring suite; the attention contenders' score)."""

from __future__ import annotations

import torch

from attnbench.impls._scoring import ScoreFn, ScoringContender
from attnbench.workload.inputs import AttentionInputs


class ScaledDotScore(ScoringContender):
    name = "score_scaled_dot"
    description = "scoring: softmax(q·kᵀ/√d)·v"

    def scores(self, inputs: AttentionInputs) -> ScoreFn:
        scale = inputs.scale
        return lambda q, k: (q @ k.transpose(-1, -2)).mul_(scale)

    def scores64(self, inputs: AttentionInputs) -> ScoreFn:
        scale = inputs.scale
        return lambda q, k: torch.einsum("hrd,hkd->hrk", q, k) * scale


contender = ScaledDotScore()
