"""The Workload: one attention problem, frozen, hashable, and validated on creation.

Shapes follow torch SDPA: q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), output (B, Hq, Sq, D).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.errors import UsageError

MASKS = ("none", "causal", "causal_bottom_right", "padding")
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

    def __post_init__(self) -> None:
        for field in ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{field} must be a positive integer, got {value!r}")
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
        )
        return f"B{self.batch} {heads} {seq} D{self.head_dim} {rest}"
