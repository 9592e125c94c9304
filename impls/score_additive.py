"""``score_additive`` — additive (Bahdanau) scores wᵀ·tanh(W_q·q + W_k·k), hidden size ``hidden``.

Every (query, key) pair gets its own hidden vector, so memory grows as B·H·Sq·Sk·hidden: the memory model
says so, and cases that would not fit are skipped before they run.
"""

from __future__ import annotations

import math

import torch

from attnbench.contenders.contract import score_matrix_bytes
from attnbench.impls._scoring import ScoreFn, ScoringContender
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.masks import workload_pairs


def hidden_size(workload: Workload) -> int:
    return workload.hidden or workload.head_dim


class AdditiveScore(ScoringContender):
    name = "score_additive"
    description = "scoring: softmax(wᵀ·tanh(W_q·q + W_k·k))·v, hidden size from the `hidden` axis (default D)"

    def _parameters(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d, h = inputs.workload.head_dim, hidden_size(inputs.workload)
        return (
            inputs.parameter("additive_Wq", d, h, std=1 / math.sqrt(d)),
            inputs.parameter("additive_Wk", d, h, std=1 / math.sqrt(d)),
            inputs.parameter("additive_w", h, std=1 / math.sqrt(h)),
        )

    def flops(self, workload: Workload) -> float:
        w, h = workload, hidden_size(workload)
        pairs = w.heads * workload_pairs(w)
        projections = 2.0 * w.batch * w.heads * (w.seq_q + w.seq_k) * w.head_dim * h
        return projections + 3.0 * h * pairs + 2.0 * w.head_dim * pairs  # add, tanh, w·; then p·v

    def predicted_extra_bytes(self, workload: Workload) -> float:
        return score_matrix_bytes(workload, 2 * hidden_size(workload) + 3)  # sum and tanh per pair, scores

    def scores(self, inputs: AttentionInputs) -> ScoreFn:
        w_q, w_k, w = self._parameters(inputs)

        def score(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            features = torch.tanh((q @ w_q).unsqueeze(-2) + (k @ w_k).unsqueeze(-3))  # (B, H, Sq, Sk, h)
            return features @ w

        return score

    def scores64(self, inputs: AttentionInputs) -> ScoreFn:
        w_q, w_k, w = (p.double() for p in self._parameters(inputs))

        def score(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            query, key = torch.einsum("hrd,dc->hrc", q, w_q), torch.einsum("hkd,dc->hkc", k, w_k)
            return torch.einsum("hrkc,c->hrk", torch.tanh(query[:, :, None, :] + key[:, None, :, :]), w)

        return score


contender = AdditiveScore()
