"""The Workload: one attention problem, frozen, hashable, and validated on creation.

Shapes follow torch SDPA: q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), output (B, Hq, Sq, D).

Workload features (see ``attnbench.masks`` for their definitions): the ``sliding_window`` mask with its
``window``, the ``document`` mask with its number of ``documents``, a ``score_mod`` (``softcap`` with its
``softcap`` value, or ``alibi``), the KV cache's ``page_size`` (0: contiguous) and the ``model`` preset a
case came from. A value that does not apply to the case (a window without the sliding_window mask) is
stored as its neutral value (0, "none", ""), so equal cases compare equal.

Every size has a sane upper bound (``LIMITS``): past it a value is bad input, said in one line, so an
absurd size never reaches the planner (counts and predictions are closed forms, so anything within the
bounds is priced in microseconds and skipped when it would not fit).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.errors import UsageError

BASIC_MASKS = ("none", "causal", "causal_bottom_right", "padding")
MASKS = (*BASIC_MASKS, "sliding_window", "document")
SCORE_MODS = ("none", "softcap", "alibi")
# Sane upper bounds on sizes: 2^24 tokens is beyond any context length in use; the others likewise.
LIMITS: dict[str, int] = {
    "batch": 2**16,
    "heads": 2**12,
    "kv_heads": 2**12,
    "seq_q": 2**24,
    "seq_k": 2**24,
    "head_dim": 2**12,
    "hidden": 2**16,
    "window": 2**24,
    "documents": 2**16,
    "page_size": 2**16,
}
MAX_SOFTCAP = 1e6
PASSES = ("fwd", "bwd", "fwd_bwd")
MODULES = ("core", "mha")  # the attention core alone, or inside a multi-head attention module
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
DEVICES = ("cpu", "cuda")
DTYPE_ALIASES = {
    "fp32": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
}


def canonical_dtype(name: str) -> str:
    """'bf16' -> 'bfloat16'; unknown names raise a UsageError listing what is allowed."""
    canonical = DTYPE_ALIASES.get(name, name)
    if canonical not in DTYPES:
        raise UsageError(f"dtype {name!r} is not known; allowed: {', '.join(DTYPES)} (or fp32, fp16, bf16)")
    return canonical


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

    def __post_init__(self) -> None:
        for field in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{field} must be a positive integer, got {value!r}")
            check_bound(field, value, field)
        if self.heads % self.kv_heads:
            raise UsageError(
                f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}; "
                "allowed: kv_heads that divide heads (GQA/MQA)"
            )
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.device not in DEVICES:
            raise UsageError(f"device {self.device!r} is not known; allowed: {', '.join(DEVICES)}")
        if self.mask not in MASKS:
            raise UsageError(f"mask {self.mask!r} is not known; allowed: {', '.join(MASKS)}")
        if self.pass_ not in PASSES:
            raise UsageError(f"pass {self.pass_!r} is not known; allowed: {', '.join(PASSES)}")
        if self.hidden is not None and (
            isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 1
        ):
            raise UsageError(f"hidden must be a positive integer, got {self.hidden!r}")
        if self.module not in MODULES:
            raise UsageError(f"module {self.module!r} is not known; allowed: {', '.join(MODULES)}")
        if self.module == "mha" and self.kv_heads != self.heads:
            raise UsageError(f"module mha needs kv_heads == heads (got {self.kv_heads} and {self.heads})")
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise UsageError(f"scale must be a positive finite number, got {self.scale!r}")
        if self.hidden is not None:
            check_bound("hidden", self.hidden, "hidden")
        self._validate_features()

    def _validate_features(self) -> None:
        """The feature fields: checked where they apply, set to their neutral value where they don't."""
        for field in ("window", "documents", "page_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UsageError(f"{field} must be a non-negative integer, got {value!r}")
            check_bound(field, value, field)
        if self.mask == "sliding_window":
            if self.window < 1:
                raise UsageError(f"mask sliding_window needs window ≥ 1 (--window), got {self.window}")
        else:
            object.__setattr__(self, "window", 0)
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
        else:
            object.__setattr__(self, "documents", 0)
        if self.score_mod not in SCORE_MODS:
            raise UsageError(f"score_mod {self.score_mod!r} is not known; allowed: {', '.join(SCORE_MODS)}")
        if self.score_mod == "softcap":
            check_softcap(self.softcap, "softcap")
            object.__setattr__(self, "softcap", float(self.softcap))
        else:
            object.__setattr__(self, "softcap", 0.0)
        check_page_size(self.page_size, "page_size")
        if not isinstance(self.model, str):
            raise UsageError(f"model must be a preset name (a string), got {self.model!r}")

    @property
    def offset(self) -> int:
        """Sk − Sq: where the bottom-right diagonal sits (query i's own position among the keys is i + offset)."""
        return self.seq_k - self.seq_q

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

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
        row["pass"] = row.pop("pass_")
        row["scale"] = self.softmax_scale  # the scale actually used, also when it is the 1/sqrt(D) default
        return row

    def label(self) -> str:
        """A short, stable description, e.g. 'B2 H8/2 S128x256 D64 float32 cpu causal fwd'."""
        heads = f"H{self.heads}" if self.kv_heads == self.heads else f"H{self.heads}/{self.kv_heads}"
        seq = f"S{self.seq_q}" if self.seq_q == self.seq_k else f"S{self.seq_q}x{self.seq_k}"
        rest = (
            f"{self.dtype} {self.device} {self.mask} {self.pass_}"
            + (f" h{self.hidden}" if self.hidden else "")
            + (" mha" if self.module == "mha" else "")
            + self.features_label()
        )
        return f"B{self.batch} {heads} {seq} D{self.head_dim} {rest}"

    def features_label(self) -> str:
        """' w48', ' docs5', ' softcap20', ' alibi', ' page64', ' [llama3.1-8b]' — empty without features."""
        parts = [f"w{self.window}" if self.window else "", f"docs{self.documents}" if self.documents else ""]
        if self.score_mod == "softcap":
            parts.append(f"softcap{self.softcap:g}")
        elif self.score_mod == "alibi":
            parts.append("alibi")
        parts += [f"page{self.page_size}" if self.page_size else "", f"[{self.model}]" if self.model else ""]
        return "".join(f" {p}" for p in parts if p)


def check_bound(name: str, value: int, label: str) -> None:
    """A size past its sane upper bound is bad input; the message names the value and the bound."""
    limit = LIMITS[name]
    if value > limit:
        raise UsageError(f"{label} {value} is past the sane upper bound for {name}; allowed: 1 to {limit}")


def check_softcap(value: object, label: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value <= MAX_SOFTCAP):
        raise UsageError(f"{label} {value!r} is not allowed; allowed: a positive number up to {MAX_SOFTCAP:g}")


def check_page_size(value: int, label: str) -> None:
    if value < 0 or (value & (value - 1)) or value > LIMITS["page_size"]:
        raise UsageError(
            f"{label} {value} is not allowed; allowed: 0 (contiguous KV) or a power of two up to {LIMITS['page_size']}"
        )
