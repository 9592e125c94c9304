"""``flex`` — torch FlexAttention, compiled with torch.compile.

Every mask is a ``mask_mod`` (key ranges as index rules; documents by a document-id lookup; a ragged or mixed
batch's sequences by lookups of their (B,) query and key lengths) turned into a
block mask in ``prepare`` — so its cost is part of ``setup_ms`` — and the score modifiers are its
``score_mod`` (softcap's tanh, alibi's −slope_h·|i + offset − j|). A paged KV cache is read natively, as
attention-gym's paged attention does: the pool is laid out per head once in ``prepare`` as one long
(1, Hkv, N·P, D) key sequence shared by the batch, and the mask maps each physical key back to its
sequence and logical position through the inverse page table, with one block per page, so each sequence
visits only its own pages. Learned sinks go through the kernel's log-sum-exp, as FlexAttention users add
them: flex_attention(return_aux=AuxRequest(lse=True)), then out · sigmoid(lse − sink_h) outside the compiled kernel
(``attnbench.impls._sinks``); gradients reach the sink logits through the lse (torch 2.13's flex backward
takes the lse's gradient). GPU only: on CPU torch 2.13 compiles flex for inference without the lse.
A cache in another kv_dtype is dequantized to the dtype at the start of each call (flex_attention takes q, k,
v of one dtype), an fp8 pool with each page's own scale.

flex_attention takes v with its own head dim Dv; a latent (MLA) cache's values go in as the strided view of
its first Dv channels (paged: the same view of the one page pool), not a copy.

Dynamo's cache is reset in ``prepare``, so the first timed call carries the compilation; the harness
reports that call as ``first_call_ms`` and keeps it out of the timing samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnbench import errors
from attnbench.contenders.contract import (
    ALL_MASKS,
    ALL_SCORE_MODS,
    Capabilities,
    Contender,
    Unsupported,
    score_matrix_bytes,
)
from attnbench.impls._sinks import rescaled_by_sink
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.kv_cache import kv_loader
from attnbench.workload.masks import alibi_slopes, document_lengths, padding_lengths
from attnbench.workload.sequences import is_ragged, sequence_lengths, sequence_offsets

Rule = Callable[[Any, Any, Any], Any]  # (b, q_idx, logical kv_idx) -> visible


def _rule(w: Workload, device: torch.device) -> Rule | None:
    """The mask as an index rule on logical key positions; None for ``none``. A ragged or mixed batch reads each
    sequence's lengths from (B,) tensors: its own rows and keys, bottom-right causal within it."""
    offset = w.offset
    ragged = sequence_lengths(w)
    if ragged is not None:
        q_len, kv_len = (torch.tensor(column, device=device) for column in zip(*ragged, strict=True))
        shift, window, causal = kv_len - q_len, w.window, w.mask != "none"

        def in_sequence(b: Any, q_idx: Any, kv_idx: Any) -> Any:
            seen = (q_idx < q_len[b]) & (kv_idx < kv_len[b])
            if causal:
                seen = seen & (q_idx + shift[b] >= kv_idx)
            if w.mask == "sliding_window":
                seen = seen & (q_idx + shift[b] - window < kv_idx)
            return seen

        return in_sequence
    if w.mask == "causal":
        return lambda b, q_idx, kv_idx: q_idx >= kv_idx
    if w.mask == "causal_bottom_right":
        return lambda b, q_idx, kv_idx: q_idx + offset >= kv_idx
    if w.mask == "padding":
        lengths = torch.tensor(padding_lengths(w.batch, w.seq_k), device=device)
        return lambda b, q_idx, kv_idx: kv_idx < lengths[b]
    if w.mask == "sliding_window":
        window = w.window
        return lambda b, q_idx, kv_idx: (q_idx + offset >= kv_idx) & (q_idx + offset - window < kv_idx)
    if w.mask == "document":
        lengths = torch.tensor(document_lengths(w.seq_q, w.documents, w.lengths), device=device)
        document = torch.arange(w.documents, device=device).repeat_interleave(lengths)  # (S,)
        return lambda b, q_idx, kv_idx: (document[q_idx] == document[kv_idx]) & (q_idx >= kv_idx)
    if w.mask == "chunked":
        chunk = w.chunk
        return lambda b, q_idx, kv_idx: (q_idx + offset >= kv_idx) & ((q_idx + offset) // chunk == kv_idx // chunk)
    return None


def _score_mod(w: Workload, device: torch.device, logical: Callable[[Any, Any], Any]) -> Callable[..., Any] | None:
    if w.score_mod == "softcap":
        cap = w.softcap
        return lambda score, b, h, q_idx, kv_idx: torch.tanh(score / cap) * cap
    if w.score_mod == "alibi":
        slopes, offset = alibi_slopes(w.heads).to(device=device, dtype=torch.float32), sequence_offsets(w, device)
        return lambda score, b, h, q_idx, kv_idx: score - slopes[h] * (q_idx + offset[b] - logical(b, kv_idx)).abs()
    return None


class FlexAttention(Contender):
    name = "flex"
    description = "torch.nn.attention.flex_attention under torch.compile (block-sparse masks, reads KV pages natively)"
    capabilities = Capabilities(
        masks=ALL_MASKS,
        score_mods=ALL_SCORE_MODS,
        paged="native",
        backward=True,
        min_head_dim=16,
        features=frozenset({"sinks", "head_dim_v", "kv_layout", "kv_dtype", "lengths", "shared_prefix"}),
    )

    def availability(self) -> str | None:
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as exc:
            return f"torch {torch.__version__} has no FlexAttention ({exc})"
        return None

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.pass_ != "fwd" and workload.device == "cpu":
            return f"FlexAttention has no backward on CPU (torch {torch.__version__} raises NotImplementedError)"
        if workload.sinks != "none" and workload.device == "cpu":
            return (
                f"sinks {workload.sinks}: the sink rescales by the log-sum-exp, which compiled FlexAttention on CPU "
                f"does not return (torch {torch.__version__}: 'return_lse is not supported yet')"
            )
        return super().unsupported_reason(workload)

    def predicted_extra_bytes(self, workload: Workload) -> float:
        if workload.device == "cuda":
            return super().predicted_extra_bytes(workload)
        # Measured on CPU (torch 2.13): peak grows with Sq·Sk at about half a score matrix. Sinks add the
        # float32 lse and its rescaling factor per query row.
        sink_rows = 8.0 * workload.batch * workload.heads * workload.seq_q if workload.sinks != "none" else 0.0
        return score_matrix_bytes(workload, 0.6) + sink_rows

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

        w, device = workload, inputs.q.device
        rule = _rule(w, device)
        paged = inputs.paged
        batch = w.batch if w.mask == "padding" or is_ragged(w) else None
        kv_len = w.seq_k
        block: dict[str, Any] = {}
        if paged is None:
            load = inputs.kv_loader()  # k, v in the dtype (dequantized in the call when the cache is narrower)
            logical: Callable[[Any, Any], Any] = lambda b, kv_idx: kv_idx  # noqa: E731
            mask_mod = None if rule is None else (lambda b, h, q_idx, kv_idx: rule(b, q_idx, kv_idx))
        else:
            size, owner, position, seq_k = paged.page_size, paged.page_owner, paged.page_position, w.seq_k
            pages = paged.k_pages.shape[0]
            # (N, Hkv, P, D) -> (1, Hkv, N·P, D): the pool, per head, pages in pool order
            k, v = (
                t.permute(1, 0, 2, 3).reshape(1, w.kv_heads, pages * size, t.shape[-1])
                for t in (paged.k_pages, paged.v_pages)
            )
            # an fp8 pool's scales (N, Hkv, 1, 1) -> (1, Hkv, N·P, 1): each slot its page's scale
            slots = (1, w.kv_heads, pages * size, 1)
            k_scale, v_scale = (
                None if s is None else s.transpose(0, 1).expand(-1, -1, size, -1).reshape(slots)
                for s in (paged.k_scale, paged.v_scale)
            )
            load = kv_loader(k, v, k_scale, v_scale, w.torch_dtype)

            def logical(b: Any, kv_idx: Any) -> Any:
                return position[kv_idx // size] * size + kv_idx % size

            def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
                j = logical(b, kv_idx)
                mine = ((owner[kv_idx // size] == b) | (owner[kv_idx // size] < 0)) & (j < seq_k)  # <0: shared
                return mine if rule is None else mine & rule(b, q_idx, j)

            batch, kv_len, block = w.batch, pages * size, {"BLOCK_SIZE": (128, size)}
        block_mask = None
        if mask_mod is not None:
            try:
                block_mask = create_block_mask(mask_mod, batch, None, w.seq_q, kv_len, device=w.device, **block)
            except Exception as exc:  # e.g. a page size the block mask cannot take
                raise Unsupported(f"create_block_mask failed ({errors.reason(exc)})") from None
        score_mod = _score_mod(w, device, logical)
        torch._dynamo.reset()  # fresh compile per case: comparable first_call_ms, no recompile limit
        compiled: Callable[..., Any] = torch.compile(flex_attention, dynamic=False)  # its overloads vary by request
        q, scale, gqa, sinks = inputs.q, inputs.scale, w.kv_heads != w.heads, inputs.sinks

        def run() -> torch.Tensor:
            k, v = load()
            if sinks is not None:
                out, aux = compiled(
                    q,
                    k,
                    v,
                    score_mod=score_mod,
                    block_mask=block_mask,
                    scale=scale,
                    enable_gqa=gqa,
                    return_aux=AuxRequest(lse=True),
                )
                return rescaled_by_sink(out, aux.lse, sinks)
            return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)

        return run


contender = FlexAttention()
