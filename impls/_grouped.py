"""Helpers shared by the matmul-based contenders (bmm, einsum): GQA by grouping, masked softmax (with learned
sinks: ``attnbench.impls._sinks``) and the score modifiers.

GQA without copies: query head h reads kv head h // G, so q viewed as (B, Hkv, G, Sq, D) lines up with
k and v as (B, Hkv, Sk, D). Masks and the alibi bias are prepared in the same 5-D layout before timing.
(A paged cache is gathered into k and v by the harness, inside the timed call: ``attnbench.workload.paged``.)
"""

from __future__ import annotations

import torch

from attnbench.contenders.contract import score_matrix_bytes
from attnbench.impls._sinks import softmax_with_sink
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs


def materialised_bytes(w: Workload) -> float:
    """Memory model of the matmul-softmax-matmul contenders: scores and probabilities, plus the masked
    copy of the scores when there is a mask, plus one more for softmax's temporaries (a CPU process that
    runs out of memory is killed, so the model errs on the high side). Learned sinks add one: the scores
    with the sink column concatenated."""
    copies = 3 if w.mask == "none" and w.score_mod == "none" else 4
    return score_matrix_bytes(w, copies + (1 if w.sinks != "none" else 0))


def grouped_bias(inputs: AttentionInputs) -> torch.Tensor | None:
    """The alibi bias as (1 or B, Hkv, G, Sq, Sk), or None without alibi."""
    bias, w = inputs.alibi_bias, inputs.workload
    return None if bias is None else bias.view(-1, w.kv_heads, w.gqa_group, w.seq_q, w.seq_k)


def grouped_masks(inputs: AttentionInputs) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(hidden, empty): hidden is (B|1, 1, 1, Sq, Sk) True where a key is masked out; empty is
    (1, 1, 1, Sq, 1) True for query rows that see no key. Either is None when not needed."""
    mask = inputs.bool_mask
    hidden = None if mask is None else (~mask).unsqueeze(2)
    empty = None if inputs.empty_rows is None else inputs.empty_rows.unsqueeze(2)
    return hidden, empty


def masked_softmax(
    scores: torch.Tensor, hidden: torch.Tensor | None, empty: torch.Tensor | None, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax over the last dim of (B, Hkv, G, Sq, Sk) scores with masked keys removed, and with learned
    sinks ((Hq,) logits, inputs.sinks) in each row's denominator when given; empty rows -> 0."""
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:  # head h = kv_head·G + g: the logits line up with (Hkv, G) as a view
        probs = softmax_with_sink(scores, sinks.view(1, *scores.shape[1:3], 1, 1))
    if empty is not None:
        probs = probs.masked_fill(empty, 0.0)
    return probs
