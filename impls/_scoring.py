"""The scoring-function contenders (suites/scoring.toml): attention weights from another score function.

out = softmax(score(q, k) + mask)·v, with score one of the source documents' variants: dot (q·k), scaled
dot (q·k/√d), bilinear (q·W·kᵀ) and additive (wᵀ·tanh(W_q·q + W_k·k)). Each is its own kind of
contender, checked against the float64 reference run with its own score formula written independently
(einsum in float64); parameters are seeded and shared between the two.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contenders.contract import Capabilities, Contender
from attnbench.impls._grouped import masked_softmax, materialised_bytes
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.reference import reference_output

ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ScoringContender(Contender):
    kind = "scoring"
    capabilities = Capabilities(backward=False)

    def scores(self, inputs: AttentionInputs) -> ScoreFn:
        """(q (B, Hq, Sq, D), k (B, Hq, Sk, D)) -> scores (B, Hq, Sq, Sk), in the workload's dtype."""
        raise NotImplementedError

    def scores64(self, inputs: AttentionInputs) -> ScoreFn:
        """The same in float64 for one batch element: (q (Hq, R, D), k (Hq, Sk, D)) -> (Hq, R, Sk)."""
        raise NotImplementedError

    def reference_output(self, inputs: AttentionInputs, rows: torch.Tensor) -> torch.Tensor:
        return reference_output(inputs, rows, self.scores64(inputs))

    def predicted_extra_bytes(self, workload: Workload) -> float:
        return materialised_bytes(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        q = inputs.q.detach()
        k, v = (t.detach() for t in inputs.kv_expanded())  # GQA: repeated once, before timing
        hidden = None if inputs.bool_mask is None else ~inputs.bool_mask
        empty = inputs.empty_rows
        score = self.scores(inputs)

        def run() -> torch.Tensor:
            return masked_softmax(score(q, k), hidden, empty) @ v

        return run
