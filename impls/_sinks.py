"""Learned attention sinks (gpt-oss) in the two forms contenders use them.

A sink is one logit per query head that joins every row's softmax denominator and contributes no value:
out_i = Σ_j exp(s_ij − m)·v_j / (exp(sink_h − m) + Σ_j exp(s_ij − m)). The logits are ``inputs.sinks``
((Hq,) float32, a leaf that requires grad in backward passes); both forms are differentiable in them.

- On materialised scores, gpt-oss's own reference (``gpt_oss/torch/model.py``, ``sdpa``): one column of sink
  logits concatenated to the scores before the softmax, its probability dropped after.
- On a fused kernel's output and log-sum-exp (flex_attention(return_aux=AuxRequest(lse=True))): the kernel's output was
  normalised by Σ_j exp(s_ij) = exp(lse), the sink's denominator is exp(lse) + exp(sink), so the output is
  rescaled by exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse − sink). A row that sees no key has lse −inf
  and output zeros, and stays zeros.
"""

from __future__ import annotations

import torch


def softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim of ``scores`` (…, Sk) with the sink as one more logit per row, its weight
    dropped: (…, Sk), rows summing to less than one. ``sink`` broadcasts to scores[..., :1] (one per head);
    masked keys are −inf in ``scores`` already, so a row that sees no key gives all zeros."""
    column = sink.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


def rescaled_by_sink(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """A kernel's (B, Hq, Sq, Dv) output normalised without the sink, given its (B, Hq, Sq) natural-log
    log-sum-exp, rescaled to the sink's denominator: out · 1/(1 + exp(sink_h − lse))."""
    factor = torch.sigmoid(lse.float() - sinks.view(1, -1, 1))  # (B, Hq, Sq) float32
    return out * factor.unsqueeze(-1).to(out.dtype)
