"""The contract a contender (ours or a plugin's) fulfils.

A contender declares what it supports in :class:`Capabilities`, says whether it can run on this
machine at all (:meth:`Contender.availability`), and, given inputs and a workload, returns a
**zero-argument callable** from :meth:`Contender.prepare`. Only that callable is timed: layout changes,
mask building and compilation belong in ``prepare``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnbench.workload import BASIC_MASKS, DTYPES, MASKS, PASSES, SCORE_MODS, Workload
from attnbench.workload.axes import DECLARED
from attnbench.workload.flops import attention_bytes, attention_flops
from attnbench.workload.inputs import AttentionInputs

ALL_DEVICES = frozenset({"cpu", "cuda"})
ALL_DTYPES = frozenset(DTYPES) - {"float64"}
# Plain torch ops run float64 too (the reference's own precision: a float64 row checks the formula, not a kernel).
TORCH_DTYPES = frozenset(DTYPES)
ALL_MASKS = frozenset(MASKS)
# What a contender supports unless it declares more: the four masks every attention kernel knows.
DEFAULT_MASKS = frozenset(BASIC_MASKS)
ALL_SCORE_MODS = frozenset(SCORE_MODS)
PAGED_WAYS = ("", "native", "gather")  # "": contiguous KV only


@dataclass(frozen=True)
class Capabilities:
    """What a contender can run; anything else becomes an ``unsupported`` row with the reason."""

    devices: frozenset[str] = ALL_DEVICES
    dtypes: frozenset[str] = ALL_DTYPES
    masks: frozenset[str] = DEFAULT_MASKS  # ALL_MASKS adds sliding_window and document
    score_mods: frozenset[str] = frozenset({"none"})  # ALL_SCORE_MODS adds softcap and alibi
    # Paged KV (page_size > 0): "native" reads the page pool through the page table (for the workloads
    # Contender.reads_pages accepts); "gather": the harness gathers the pages into the contender's k and v
    # at the start of each timed call (attnbench.workload.paged.gathered); "": contiguous k and v only (unsupported).
    paged: str = ""
    gqa: bool = True
    cross: bool = True  # seq_q != seq_k
    min_head_dim: int = 1
    max_head_dim: int | None = None
    backward: bool = False
    # The cache and batch features of attnbench.workload.axes.DECLARED (head_dim_v, kv_dtype, kv_layout, sinks, lengths,
    # shared_prefix) a contender runs: an axis' name for all its values ("sinks"), or one value
    # ("kv_dtype=bfloat16"). A case asking for one not named here is unsupported, with the reason.
    features: frozenset[str] = frozenset()
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.paged not in PAGED_WAYS:
            raise ValueError(f"Capabilities.paged {self.paged!r}: allowed {', '.join(map(repr, PAGED_WAYS))}")

    def unsupported_reason(self, w: Workload) -> str | None:
        if w.device not in self.devices:
            return f"device {w.device} not supported (supports {', '.join(sorted(self.devices))})"
        if w.dtype not in self.dtypes:
            return f"dtype {w.dtype} not supported (supports {', '.join(sorted(self.dtypes))})"
        if w.mask not in self.masks:
            return f"mask {w.mask} not supported (supports {', '.join(sorted(self.masks))})"
        if w.score_mod not in self.score_mods:
            return f"score_mod {w.score_mod} not supported (supports {', '.join(sorted(self.score_mods))})"
        if w.page_size and not self.paged:
            return f"paged KV (page_size {w.page_size}) not supported: this contender reads contiguous k and v only"
        if w.page_size and w.pass_ != "fwd":
            return "paged KV is the decode-time cache layout: forward only"
        if w.kv_dtype != w.dtype and w.pass_ != "fwd":
            return f"kv_dtype {w.kv_dtype} is a serving cache's storage, not trained: forward only"
        for axis in DECLARED:
            value = getattr(w, axis.workload_field)
            if axis.departs(w) and axis.name not in self.features and f"{axis.name}={value}" not in self.features:
                named = sorted(f for f in self.features if f.split("=")[0] == axis.name)
                supports = f"supports {', '.join(named)}" if named else f"declares no {axis.name} support"
                return f"{axis.asks(value) if axis.asks else axis.name} not supported ({supports})"
        if w.kv_heads != w.heads and not self.gqa:
            return "GQA/MQA (kv_heads < heads) not supported"
        if w.seq_q != w.seq_k and not self.cross:
            return "seq_q != seq_k not supported"
        if w.head_dim < self.min_head_dim or (self.max_head_dim is not None and w.head_dim > self.max_head_dim):
            return f"head_dim {w.head_dim} outside [{self.min_head_dim}, {self.max_head_dim or '∞'}]"
        if w.pass_ != "fwd" and not self.backward:
            return f"pass {w.pass_} needs backward support, which this contender does not declare"
        if w.device == "cuda" and not torch.cuda.is_available():
            return "device cuda: torch.cuda.is_available() is False"
        return None


def output_bytes(w: Workload) -> float:
    return float(w.batch * w.heads * w.seq_q * w.head_dim_v * w.torch_dtype.itemsize)


def score_matrix_bytes(w: Workload, copies: float, element: int | None = None) -> float:
    """``copies`` (B, Hq, Sq, Sk) matrices, in ``element`` bytes each (default the workload's dtype)."""
    return copies * w.batch * w.heads * w.seq_q * w.seq_k * (element or w.torch_dtype.itemsize)


class Unsupported(Exception):
    """Raised from ``prepare`` when a workload turns out unsupported only once tried (e.g. no kernel)."""


class Contender(abc.ABC):
    """Subclass, set ``name`` and ``capabilities``, implement ``prepare``; expose an instance."""

    name: str = ""
    description: str = ""
    capabilities: Capabilities = Capabilities()
    # "attention": softmax(q·kᵀ·scale + mask)·v; "scoring": another score function; "module": a whole
    # multi-head attention module (projections included), compared with the mha module around a core
    kind: str = "attention"

    def flops(self, workload: Workload) -> float:
        """Floating-point operations of one call; attention contenders all share one count (flops.py)."""
        return attention_flops(workload)

    def reference_output(self, inputs: AttentionInputs, rows: torch.Tensor) -> torch.Tensor:
        """The float64 output this contender must reproduce, for the given query rows (B, Hq, R, Dv).
        Attention contenders share ``attnbench.workload.reference``; other kinds bring their own formula."""
        from attnbench.workload.reference import reference_output

        return reference_output(inputs, rows)

    def availability(self) -> str | None:
        """None when the contender can run here, else the reason it cannot (missing library, …)."""
        return None

    def unsupported_reason(self, workload: Workload) -> str | None:
        """Why this workload cannot run here (None if it can). Extend for rules Capabilities can't say."""
        if workload.module == "mha" and self.kind == "scoring":
            return "a scoring function is not an attention core for the mha module"
        if workload.module == "core" and self.kind == "module":
            return "a whole multi-head attention module: it runs in the mha suite (module mha)"
        if workload.module == "mha" and workload.pass_ != "fwd":
            return "the mha module is timed forward only"
        if workload.module == "mha" and (workload.head_dim_v != workload.head_dim or workload.kv_layout != "separate"):
            return "the mha module projects q, k and v alike to heads·head_dim channels: no head_dim_v, no latent cache"
        if workload.module == "mha" and workload.page_size:
            return "the mha module projects k and v into contiguous buffers each call; a paged cache has no place there"
        if workload.module == "mha" and workload.shared_prefix:
            return "the mha module projects k and v from its input each call, so no cached prefix is shared there"
        if workload.module == "mha" and workload.kv_dtype != workload.dtype:
            return "the mha module projects k and v in the dtype each call; a cache's kv_dtype has no place there"
        if self.kind == "scoring" and workload.score_mod != "none":
            return f"a scoring function replaces the scaled dot product that score_mod {workload.score_mod} modifies"
        return self.capabilities.unsupported_reason(workload)

    def reads_pages(self, workload: Workload) -> bool:
        """Whether this contender reads a paged workload's page pool itself (``inputs.paged``). When it does
        not, the harness gathers the pages into ``inputs.k`` and ``inputs.v`` at the start of every timed
        call, and counts that gather's memory in the prediction. Default: ``capabilities.paged == "native"``;
        override where the answer depends on the case (fused_cpu reads pages only in its decode kernel)."""
        return self.capabilities.paged == "native"

    def predicted_extra_bytes(self, workload: Workload) -> float:
        """Memory model: working memory one call needs at its peak beyond its inputs and its output
        (what ``peak_mem_mb`` measures; used to skip cases that would not fit). Default, a fused
        kernel: fp32 softmax statistics per query row."""
        return 8.0 * workload.batch * workload.heads * workload.seq_q

    def predicted_seconds(self, workload: Workload, flops_per_s: float, bytes_per_s: float) -> float:
        """Time model for one call, given the machine's measured matmul rate and copy bandwidth.
        Default, the roofline: the FLOPs at the matmul rate or the minimum bytes at the bandwidth."""
        return max(attention_flops(workload) / flops_per_s, attention_bytes(workload) / bytes_per_s)

    @abc.abstractmethod
    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        """Do all set-up, then return the zero-argument callable that computes the (B, Hq, Sq, Dv) output.
        The callable reads ``inputs.k`` and ``inputs.v`` (those tensors, not copies made here): for a paged
        workload this contender does not read natively, the harness writes the gathered pages into them
        before each call.

        The callable may carry a ``choice``: a string, or a zero-argument callable giving one, saying what the
        contender chose for this workload (a tuned tile, a backend), read after its first call
        (``choice_of``); results keep it in their ``choice`` column and ``ab`` beside each side's time."""


def choice_of(fn: Callable[[], object]) -> str:
    """What a prepared callable says it chose (its ``choice``, called if callable); '' where it says nothing.
    A ``choice`` that raises says nothing either: the column informs, it never fails a case."""
    try:
        choice = getattr(fn, "choice", None)
        if callable(choice):
            choice = choice()
        return "" if choice is None else str(choice)
    except Exception:
        return ""


__all__ = [
    "ALL_DEVICES",
    "ALL_DTYPES",
    "ALL_MASKS",
    "ALL_SCORE_MODS",
    "DEFAULT_MASKS",
    "PASSES",
    "Capabilities",
    "Contender",
    "Unsupported",
    "choice_of",
    "output_bytes",
    "score_matrix_bytes",
]
