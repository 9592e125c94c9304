"""The Workload: one attention problem, frozen, hashable, and validated on creation.

Shapes follow torch SDPA: q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), output (B, Hq, Sq, D).

Workload features (see ``attnbench.workload.masks`` for their definitions): the ``sliding_window`` mask with its
``window``, the ``document`` mask with its number of ``documents``, the ``chunked`` mask with its ``chunk``,
the ``mixed`` mask with its ``decode_share`` and the ``lengths`` distribution (``attnbench.workload.sequences``), a
``score_mod`` (``softcap`` with its
``softcap`` value, or ``alibi``), the KV cache's ``page_size`` (0: contiguous) and the ``model`` preset a
case came from. A value that does not apply to the case (a window without the sliding_window mask) is
stored as its neutral value (0, "none", ""), so equal cases compare equal.

Each field is an axis of ``attnbench.workload.axes``, which holds its type, bounds, message and neutral value: every
size has a sane upper bound, past which a value is bad input, said in one line, so an absurd size never
reaches the planner (counts and predictions are closed forms, so anything within the bounds is priced in
microseconds and skipped when it would not fit).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.errors import UsageError
from attnbench.workload import axes
from attnbench.workload.axes import DTYPES


def padding_lengths(batch: int, seq_k: int) -> list[int]:
    """Valid key lengths per batch element of the ``padding`` mask, deterministic.

    Batch 0 is full length and the last element is the shortest (Sk // 4, at least 1); the ones between
    are spaced linearly. With a single batch element there is nothing to contrast, so its length is
    3/4 of Sk (rounded down, at least 1) so that the mask still removes keys.
    """
    shortest = max(1, seq_k // 4)
    if batch == 1:
        return [max(1, (3 * seq_k) // 4)]
    return [seq_k - (b * (seq_k - shortest)) // (batch - 1) for b in range(batch)]


@dataclass(frozen=True)
class Workload:
    """One case of a sweep, without the contender. `pass_` is the `pass` column (a Python keyword)."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str = "float32"
    device: str = "cpu"
    mask: str = "none"
    pass_: str = "fwd"
    scale: float | None = None  # None means 1/sqrt(head_dim)
    hidden: int | None = None  # hidden size of additive scoring (the scoring suite); None elsewhere
    module: str = "core"  # "mha": projections, split heads, this core, merge, output projection
    window: int = 0  # sliding_window: keys per query row (0 for other masks)
    documents: int = 0  # document: packed documents in the sequence (0 for other masks)
    score_mod: str = "none"  # none, softcap or alibi
    softcap: float = 0.0  # softcap: scores -> softcap·tanh(scores / softcap) (0 for other score_mods)
    page_size: int = 0  # KV cache in pages of this many tokens; 0 = contiguous
    model: str = ""  # the model preset the case was built from ("" otherwise)
    head_dim_v: int = 0  # v's and the output's head dim Dv; 0 (or None): head_dim
    kv_dtype: str = ""  # the KV cache's element type; "" (or None): dtype (also bfloat16 or an fp8 type)
    kv_layout: str = "separate"  # latent: MLA's one cache tensor (kv_heads 1), keys and values its channels
    sinks: str = "none"  # learned: one seeded logit per query head joins each row's softmax denominator
    lengths: str = "equal"  # per-sequence lengths of the batch: equal, or drawn from a distribution
    shared_prefix: int = 0  # tokens of cached prefix every sequence of the batch shares (0: none)
    chunk: int = 0  # chunked: keys per chunk, a query sees its own chunk up to itself (0 for other masks)
    decode_share: float = 0.0  # mixed: share of the batch's sequences that are decode steps (0 for other masks)
    layer: str = ""  # which kind of layer of a two-kind preset: sliding, full or chunked ("" otherwise)
    q_dtype: str = ""  # q's element type; "" (or None): dtype (also float8_e4m3fn with that kv_dtype: fp8 forward)

    def __post_init__(self) -> None:
        """Every field checked by its axis' rule (see attnbench.workload.axes); a feature that does not apply to the
        case is set to its neutral value; then the rules that join fields."""
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise UsageError(f"scale must be a positive finite number, got {self.scale!r}")
        for axis in axes.WORKLOAD_AXES:
            value = getattr(self, axis.workload_field)
            if not axis.sweep or (value is None and axis.optional):
                continue  # scale (checked above), hidden left out
            if axis.follows and (value is None or (axis.declared and not value)):  # head_dim_v: head_dim, …
                object.__setattr__(self, axis.workload_field, getattr(self, axes.BY_NAME[axis.follows].workload_field))
                continue
            if not axes.applies(axis, self):
                object.__setattr__(self, axis.workload_field, axis.neutral)
                continue
            object.__setattr__(self, axis.workload_field, axes.check_field(axis, value))
        self._check_joined()

    def _check_joined(self) -> None:
        """The rules that tie one field to another."""
        if self.heads % self.kv_heads:
            raise UsageError(
                f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}; "
                "allowed: kv_heads that divide heads (GQA/MQA)"
            )
        if self.module == "mha" and self.kv_heads != self.heads:
            raise UsageError(f"module mha needs kv_heads == heads (got {self.kv_heads} and {self.heads})")
        if self.mask == "document":
            if self.seq_q != self.seq_k:
                raise UsageError(
                    f"mask document packs documents into one sequence, so it needs seq_q == seq_k; "
                    f"got {self.seq_q} and {self.seq_k}"
                )
            if not 1 <= self.documents <= self.seq_q:
                raise UsageError(
                    f"documents {self.documents} with sequence length {self.seq_q}: allowed 1 to {self.seq_q} "
                    "(each document holds at least one token)"
                )
        if self.mask == "mixed" and self.batch < 2:
            raise UsageError(
                "mask mixed holds prefill chunks and decode steps in one batch, so it needs batch ≥ 2; "
                f"got {self.batch}"
            )
        self._check_cache()
        for axis in axes.FEATURES:  # a feature that applies needs a value (window ≥ 1 with sliding_window)
            value = getattr(self, axis.workload_field)
            if axis.applies is not None and axes.applies(axis, self) and axis.kind is int and value == axis.neutral:
                other, needed = axis.applies
                raise UsageError(f"{other} {needed} needs {axis.name} ≥ 1 ({axis.flag}), got {value}")

    def _check_cache(self) -> None:
        """The rules of the KV cache's own axes: its type, its latent layout, its shared prefix, its lengths."""
        allowed_kv = (self.dtype, "bfloat16", *axes.FP8_DTYPES)
        if self.kv_dtype not in allowed_kv:
            raise UsageError(
                f"kv_dtype {self.kv_dtype} with dtype {self.dtype} is not allowed; allowed: "
                f"{', '.join(dict.fromkeys(allowed_kv))} (a cache is the dtype or narrower)"
            )
        if self.q_dtype not in (self.dtype, self.kv_dtype):
            raise UsageError(
                f"q_dtype {self.q_dtype} with kv_dtype {self.kv_dtype} and dtype {self.dtype} is not allowed; "
                f"allowed: the dtype, or {self.q_dtype} with kv_dtype {self.q_dtype} (an fp8 forward: q, k and v in "
                "fp8, the output in the dtype)"
            )
        if self.kv_layout == "latent":
            if self.kv_heads != 1:
                raise UsageError(
                    f"kv_layout latent stores one cache shared by all heads, so it needs kv_heads 1; "
                    f"got {self.kv_heads}"
                )
            if self.head_dim_v > self.head_dim:
                raise UsageError(
                    f"kv_layout latent reads values as the first head_dim_v channels of the head_dim-wide cache: "
                    f"head_dim_v {self.head_dim_v} > head_dim {self.head_dim}; allowed: head_dim_v ≤ head_dim"
                )
        if self.shared_prefix >= self.seq_k:
            raise UsageError(
                f"shared_prefix {self.shared_prefix} with seq_kv {self.seq_k}: allowed 0 to {self.seq_k - 1} "
                "(each sequence holds the prefix and at least one token of its own)"
            )
        shortest = min(padding_lengths(self.batch, self.seq_k)) if self.shared_prefix and self.mask == "padding" else 0
        if self.shared_prefix >= shortest > 0:
            raise UsageError(
                f"shared_prefix {self.shared_prefix} with mask padding: the shortest sequence holds {shortest} keys, "
                f"so it would not hold the prefix and a token of its own; allowed: shared_prefix below {shortest}, "
                "or ragged sequences over the prefix with --lengths (their own lengths drawn after it)"
            )
        if self.lengths != "equal" and self.mask == "padding":
            raise UsageError(
                f"lengths {self.lengths} draws each sequence's length, and mask padding has lengths of its own; "
                "allowed with padding: lengths equal"
            )
        if self.lengths != "equal" and self.mask == "chunked":
            raise UsageError(
                f"lengths {self.lengths} with mask chunked is not defined yet (each sequence's chunks would start at "
                "its own key 0); allowed with chunked: lengths equal"
            )

    @property
    def offset(self) -> int:
        """Sk − Sq: where the bottom-right diagonal sits (query i's own position among the keys is i + offset)."""
        return self.seq_k - self.seq_q

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """The KV cache's element type (the dtype unless kv_dtype narrows it)."""
        return axes.KV_DTYPES[self.kv_dtype]

    @property
    def q_torch_dtype(self) -> torch.dtype:
        """q's stored element type (the dtype unless q_dtype makes the forward an fp8 one)."""
        return axes.Q_DTYPES[self.q_dtype]

    @property
    def compute_dtype(self) -> str:
        """The type the dots run in, whose roofs a row is measured against: the dtype, or an fp8 forward's q_dtype."""
        return self.q_dtype

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def d_model(self) -> int:
        """Model width of the mha module: heads × head_dim."""
        return self.heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        """Query heads per key/value head (1 for plain multi-head attention)."""
        return self.heads // self.kv_heads

    def as_row(self) -> dict[str, Any]:
        """The workload's columns in a results row (`pass_` becomes `pass`)."""
        row = dataclasses.asdict(self)
        row[axes.PASS.column] = row.pop(axes.PASS.workload_field)
        row["scale"] = self.softmax_scale  # the scale actually used, also when it is the 1/sqrt(D) default
        return row

    def label(self) -> str:
        """A short, stable description, e.g. 'B2 H8/2 S128x256 D64 float32 cpu causal fwd' (attnbench.workload.axes)."""
        return axes.case_label(self)

    def features_label(self) -> str:
        """' w48', ' docs5', ' softcap20', ' alibi', ' page64', ' [llama3.1-8b]' — empty without features."""
        return axes.features_label(self)
