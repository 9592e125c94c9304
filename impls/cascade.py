"""``cascade`` — cascade attention for a batch whose sequences share a cached prefix (FlashInfer's cascade
attention, ``MultiLevelCascadeAttentionWrapper``; vLLM's cascade path for a common prefix): the prefix is
attended once for all the batch's queries, each sequence's own suffix separately, and the two partial results
are merged by their log-sum-exp.

1. prefix, read once: per kv head, one matmul of all B·G·Sq query rows (G query heads per kv head, every
   sequence) against the prefix's P keys (``inputs.prefix_kv``, the one stored copy), its log-sum-exp lse₁ and
   normalised output o₁;
2. suffix: per sequence, its query rows against its own Sk − P keys: lse₂ and o₂;
3. merge (FlashInfer's ``merge_state``): lse = log(e^lse₁ + e^lse₂), o = o₁·e^(lse₁ − lse) + o₂·e^(lse₂ − lse).

The mask applies to both levels: its dense form, split at the prefix, built in ``prepare``; the query rows are
laid out per kv head (one copy of q) in ``prepare`` too, so the timed call is the two levels and the merge.
Scores, statistics and the merge are float32 (the probabilities go to the dtype for the product with v, as
flash kernels do). A row that sees no key in a level carries lse −∞ there and adds nothing; a row that sees
none at all comes out zero. A paged cache is gathered into k and v by the harness; the prefix is then read
from sequence 0's copy, the pool's one set of prefix pages.

Without a shared prefix there is nothing to split (``bmm`` is the same computation in one level): such a case
is unsupported, with that reason. Forward only, as FlashInfer's cascade wrapper is. Values may have their
own head dim Dv, and an MLA latent cache's prefix values are the view of its keys' first Dv channels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contenders.contract import DEFAULT_MASKS, Capabilities, Contender, score_matrix_bytes
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs


def _level(scores: torch.Tensor, hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, lse) of float32 scores (…, keys) with the ``hidden`` keys masked out; a row that sees no
    key gets lse −∞ and probabilities 0."""
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)), lse


class Cascade(Contender):
    name = "cascade"
    description = (
        "cascade attention for a shared prefix: the prefix once for all the batch's queries (one matmul per kv "
        "head), each suffix per sequence, merged by log-sum-exp (FlashInfer's cascade); pages gathered in the call"
    )
    capabilities = Capabilities(
        masks=DEFAULT_MASKS | {"sliding_window", "chunked"},
        paged="gather",
        backward=False,
        features=frozenset({"shared_prefix", "head_dim_v", "kv_layout"}),  # latent: the prefix's v a view of its k
    )

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.shared_prefix == 0:
            return (
                "cascade splits a shared prefix from each sequence's suffix, and shared_prefix is 0 "
                "(--shared-prefix; bmm is the same computation in one level)"
            )
        return super().unsupported_reason(workload)

    def predicted_extra_bytes(self, workload: Workload) -> float:
        """Float32 scores and probabilities of both levels (together one (B, Hq, Sq, Sk) matrix each) and their
        masked copies, the per-kv-head copy of q, the two float32 partial outputs and the merged one."""
        w = workload
        rows = w.batch * w.heads * w.seq_q
        return score_matrix_bytes(w, 3, element=4) + rows * (w.head_dim * w.torch_dtype.itemsize + 3 * 4 * w.head_dim_v)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        B, Hkv, G, Sq, Sk, P = w.batch, w.kv_heads, w.gqa_group, w.seq_q, w.seq_k, w.shared_prefix
        D = w.head_dim
        assert inputs.prefix_kv is not None
        q = inputs.q.detach()
        rows = q.view(B, Hkv, G, Sq, D).transpose(0, 1).reshape(Hkv, B * G * Sq, D)  # every sequence's rows, a copy
        grouped = q.view(B, Hkv, G * Sq, D)  # head h = kv_head·G + g: a view
        k_prefix, v_prefix = (t.detach() for t in inputs.prefix_kv)  # (Hkv, P, D): sequence 0's, stored once
        k_suffix, v_suffix = inputs.k.detach()[:, :, P:], inputs.v.detach()[:, :, P:]  # (B, Hkv, Sk − P, D)
        mask = inputs.bool_mask  # (B|1, 1, Sq, Sk), True = visible
        prefix_hidden = suffix_hidden = None
        if mask is not None:
            prefix_hidden = (~mask[..., :P]).unsqueeze(0)  # (1, B|1, 1, Sq, P) against (Hkv, B, G, Sq, P)
            suffix_hidden = (~mask[..., P:]).unsqueeze(2)  # (B|1, 1, 1, Sq, Sk − P) against (B, Hkv, G, Sq, Sk − P)
        scale, dtype = inputs.scale, q.dtype

        def run() -> torch.Tensor:
            scores = torch.matmul(rows, k_prefix.transpose(-1, -2)).float().mul_(scale)  # (Hkv, B·G·Sq, P)
            probs, lse_prefix = _level(scores.view(Hkv, B, G, Sq, P), prefix_hidden)
            out_prefix = torch.matmul(probs.to(dtype).view(Hkv, B * G * Sq, P), v_prefix)  # (Hkv, B·G·Sq, Dv)
            out_prefix = out_prefix.view(Hkv, B, G, Sq, -1).transpose(0, 1)  # (B, Hkv, G, Sq, Dv)
            scores = torch.matmul(grouped, k_suffix.transpose(-1, -2)).float().mul_(scale)  # (B, Hkv, G·Sq, Sk − P)
            probs, lse_suffix = _level(scores.view(B, Hkv, G, Sq, Sk - P), suffix_hidden)
            out_suffix = torch.matmul(probs.to(dtype).view(B, Hkv, G * Sq, Sk - P), v_suffix).view(B, Hkv, G, Sq, -1)
            lse_prefix = lse_prefix.transpose(0, 1)  # (B, Hkv, G, Sq, 1)
            lse = torch.logaddexp(lse_prefix, lse_suffix)
            lse = torch.where(torch.isfinite(lse), lse, 0.0)  # rows that see no key: both weights e^−∞ = 0
            out = out_prefix * torch.exp(lse_prefix - lse) + out_suffix * torch.exp(lse_suffix - lse)
            return out.to(dtype).reshape(B, Hkv * G, Sq, -1)

        return run


contender = Cascade()
