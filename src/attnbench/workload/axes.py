"""The axis table: every axis of a sweep written once, and everything that reads axes reads it here.

An axis (``seq``, ``mask``, ``page_size`` …) is one :class:`Axis` row of :data:`AXES`: its name (the suite
TOML key, the ``--flag`` of ``attnbench run`` and ``profile``, the keyword of :func:`attnbench.run`), its
type, its bounds and the message for a value outside them, the value a row shows where it does not apply
(its *neutral* value, e.g. ``window`` 0 without the sliding_window mask), when it applies, the Workload field
and results column it fills, the few characters it adds to a case's label, and the feature a report names
for it. Suite coercion (:func:`coerce_axis`), flag and keyword parsing (:func:`parse_values`),
:class:`attnbench.Workload` validation (:func:`check_field`), the results columns, the labels
(:func:`case_label`) and the reports' feature filter (:func:`features_asked`) are all derived from the table.

A value is checked by one rule per axis. Where it came from only changes how the message names it: a flag
or a suite key says ``--seq value 0 must be a positive integer``, a Workload field ``seq_q must be a positive
integer, got 0``.

What an axis *means* lives elsewhere: masks.py gives contenders its forms, reference.py re-derives it,
flops.py counts it, contenders declare it in their Capabilities; models.py builds sweeps from presets.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.errors import UsageError
from attnbench.workload.models import LAYER_KINDS, MAX_DECODE_QUERY, PHASES, PRESET_AXES, PRESETS, get_model

BASIC_MASKS = ("none", "causal", "causal_bottom_right", "padding")
MASKS = (*BASIC_MASKS, "sliding_window", "document", "mixed", "chunked")  # mixed: prefill and decode in one batch
SCORE_MODS = ("none", "softcap", "alibi")
PASSES = ("fwd", "bwd", "fwd_bwd")
MODULES = ("core", "mha")  # the attention core alone, or inside a multi-head attention module
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp64": "float64"}
# A KV cache may be stored in a narrower type than the workload's dtype (q and the output stay in dtype): these
# two besides bfloat16. fp8 caches carry one float32 scale per (sequence, kv head), or per page when paged.
FP8_DTYPES: dict[str, torch.dtype] = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
KV_DTYPES: dict[str, torch.dtype] = {**DTYPES, **FP8_DTYPES}
KV_DTYPE_ALIASES = {
    **DTYPE_ALIASES,
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
}
# An fp8 forward (FlashAttention-3's and cuDNN's): q stored in e4m3 too, with one float32 scale per (sequence,
# head), beside an e4m3 cache; the output stays in the dtype.
Q_DTYPES: dict[str, torch.dtype] = {**DTYPES, "float8_e4m3fn": torch.float8_e4m3fn}
KV_LAYOUTS = ("separate", "latent")  # latent: MLA's one cache per token shared by all heads, keys and values in it
SINKS = ("none", "learned")  # learned: one logit per query head joins every row's softmax denominator
LENGTH_DISTRIBUTIONS = ("equal", "uniform", "longtail", "bimodal")  # per-sequence lengths of a ragged batch
DEVICES = ("cpu", "cuda")
MAX_SOFTCAP = 1e6
# Sane upper bounds: 2^24 tokens is beyond any context length in use; the others likewise. Past a bound a
# value is bad input, said in one line, so an absurd size never reaches the planner.
TOKENS, SIZE, WIDTH = 2**24, 2**16, 2**12


def canonical_dtype(name: str) -> str:
    """'bf16' -> 'bfloat16'; unknown names raise a UsageError listing what is allowed."""
    canonical = DTYPE_ALIASES.get(name, name)
    if canonical not in DTYPES:
        raise UsageError(f"dtype {name!r} is not known; allowed: {', '.join(DTYPES)} (or fp32, fp16, bf16)")
    return canonical


def canonical_kv_dtype(name: str) -> str:
    """'fp8' -> 'float8_e4m3fn', 'bf16' -> 'bfloat16'; unknown names raise a UsageError listing what is allowed.
    Which of them a case may use depends on its dtype (Workload's joined rules)."""
    canonical = KV_DTYPE_ALIASES.get(name, name)
    if canonical not in KV_DTYPES:
        raise UsageError(
            f"kv_dtype {name!r} is not known; allowed: the dtype, bfloat16, {', '.join(FP8_DTYPES)} (or fp8, e5m2)"
        )
    return canonical


def canonical_q_dtype(name: str) -> str:
    """'fp8' -> 'float8_e4m3fn'; unknown names raise a UsageError listing what is allowed (with which kv_dtype:
    Workload's joined rules)."""
    canonical = KV_DTYPE_ALIASES.get(name, name)
    if canonical not in Q_DTYPES:
        raise UsageError(f"q_dtype {name!r} is not known; allowed: the dtype, or float8_e4m3fn (or fp8, e4m3)")
    return canonical


def _share_problem(value: float) -> str | None:
    if not 0 < value < 1:
        return "is not allowed; allowed: a number strictly between 0 and 1 (the share of decode sequences)"
    return None


def _page_size_problem(value: int) -> str | None:
    if value < 0 or (value & (value - 1)) or value > SIZE:
        return f"is not allowed; allowed: 0 (contiguous KV) or a power of two up to {SIZE}"
    return None


def _softcap_problem(value: float) -> str | None:
    if not 0 < value <= MAX_SOFTCAP:
        return f"is not allowed; allowed: a positive number up to {MAX_SOFTCAP:g}"
    return None


# The axes every label shows in full (case_label: 'B2 H8/2 S128x256 D64/32 float32 cpu causal fwd'); any other
# axis of a case needs a label part of its own (tag, or within another's).
LABELLED_IN_FULL = (
    "batch",
    "heads",
    "kv_heads",
    "seq",
    "seq_kv",
    "head_dim",
    "head_dim_v",
    "dtype",
    "device",
    "mask",
    "pass",
)
# The features contenders declare by a Capabilities field of their own rather than Capabilities.features (masks,
# score_mods, paged), and a preset's names (its axes are each declared or gated); a feature that applies only
# with one of these (window: mask sliding_window) is gated by it too.
GATED = ("mask", "score_mod", "page_size", "model", "layer")


@dataclass(frozen=True)
class Axis:
    """One axis. ``field`` is its :class:`attnbench.Workload` field (None: a sweep-only axis, ``impl`` and
    ``phase``); ``sweep`` False: a Workload field with no flag or suite key (``scale``)."""

    name: str
    kind: type  # int, float or str
    doc: str  # what it is, one line
    field: str | None = ""  # "" means the same as name
    sweep: bool = True
    high: int | None = None  # largest value allowed (ints)
    low: int = 1  # smallest value a flag or suite key may give (ints)
    choices: tuple[str, ...] = ()  # allowed values (strings); empty: any
    unknown: str = "{name} {value!r} is not known; allowed: {allowed}"  # the message for a value outside choices
    rule: Callable[[Any], str | None] | None = None  # a rule beyond the bounds: the problem, or None
    parse: Callable[[str], str] | None = None  # text -> canonical value (dtype aliases), raising on bad input
    default: Any = None  # the value a sweep takes when the axis is not given (None: see follows / neutral)
    neutral: Any = None  # the value a row shows where the axis does not apply
    applies: tuple[str, str] | None = None  # (axis, value): applies only where that axis has that value
    follows: str | None = None  # not given: the value of this other axis (kv_heads follows heads)
    required: bool = False  # a suite sweep must give it (unless it is built from model presets)
    optional: bool = False  # a Workload may leave it None (hidden)
    tag: Callable[[Any], str] | None = None  # the label part for a value ('' for none)
    asks: Callable[[Any], str] | None = None  # the feature a report names for a value ('' for none)
    # A contender runs a value other than the neutral one (for a follows axis: other than the followed axis'
    # value) only when its Capabilities.features name the axis ("sinks") or the value ("kv_dtype=bfloat16").
    declared: bool = False
    within: str | None = None  # its label part shows inside this axis' ('layer': '[gpt-oss-20b sliding]')

    def __post_init__(self) -> None:
        """The table's own rules, so a new row that breaks one fails at import, naming the fix."""
        labelled = self.tag is not None or self.within or self.name in LABELLED_IN_FULL
        if self.field is not None and self.sweep and not labelled:
            raise ValueError(
                f"axis {self.name}: no label part; give it tag= (two cases that differ only in {self.name} would "
                "get one label, and the tables and figures would merge them)"
            )
        gated = self.name in GATED or (self.applies is not None and self.applies[0] in GATED)
        if self.neutral is not None and not self.declared and not gated:
            raise ValueError(
                f"axis {self.name}: a feature no contender declares; set declared=True and name it in the "
                "Capabilities.features of the contenders that run it (else every contender, a plugin's plain "
                "Capabilities() too, is timed on it)"
            )

    @property
    def workload_field(self) -> str:
        return self.field or self.name

    @property
    def column(self) -> str:
        """The results column: the field's name, ``pass`` for ``pass_`` (a Python keyword)."""
        return self.workload_field.rstrip("_")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def keyword(self) -> str:
        """The keyword of :func:`attnbench.run` (``pass_``: ``pass`` is a Python keyword)."""
        return self.name + "_" if keyword.iskeyword(self.name) else self.name

    @property
    def sweep_default(self) -> Any:
        return self.default if self.default is not None else self.neutral

    def read(self, row: Any) -> Any:
        """This axis' value in a results row (a dict or Series) or a Workload; missing or NaN: neutral (for an
        axis that follows another, the other's value: a row written before head_dim_v existed has Dv = D)."""
        value = getattr(row, self.workload_field, None) if not hasattr(row, "get") else row.get(self.column)
        missing = value is None or type(value).__name__ == "NAType"  # pandas' NA, without importing pandas
        if missing or (isinstance(value, float) and math.isnan(value)):
            return BY_NAME[self.follows].read(row) if self.follows else self.neutral
        return value

    def departs(self, row: Any) -> bool:
        """Whether a row or Workload asks this axis for more than the plain case: a feature away from its
        neutral value, an axis that follows another away from the other's value (head_dim_v ≠ head_dim)."""
        value = self.read(row)
        if self.follows:
            return bool(value != BY_NAME[self.follows].read(row))
        return self.neutral is not None and value != self.neutral


# fmt: off
AXES: tuple[Axis, ...] = (
    Axis("impl", str, "contenders: names, `all` or `available`", field=None, default="all"),
    Axis("batch", int, "batch size B", high=SIZE, required=True),
    Axis("heads", int, "query heads Hq", high=WIDTH, required=True),
    Axis("kv_heads", int, "key/value heads Hkv (GQA/MQA); default: heads", high=WIDTH, follows="heads"),
    Axis("seq", int, "query length Sq", field="seq_q", high=TOKENS, required=True),
    Axis("seq_kv", int, "key/value length Sk; default: seq", field="seq_k", high=TOKENS, follows="seq"),
    Axis("head_dim", int, "head dim D", high=WIDTH, required=True),
    Axis("head_dim_v", int, "value (and output) head dim Dv; default: head_dim", high=WIDTH, follows="head_dim",
         declared=True, asks=lambda v: f"head_dim_v {v} (≠ head_dim)"),
    Axis("dtype", str, "element type", choices=tuple(DTYPES), parse=canonical_dtype, default="float32"),
    Axis("kv_dtype", str, "KV cache element type: the dtype, bfloat16 or fp8 (scaled); default: dtype",
         choices=tuple(KV_DTYPES), parse=canonical_kv_dtype, follows="dtype", declared=True,
         tag=lambda v: f"kv-{v}", asks=lambda v: f"kv_dtype {v}"),
    Axis("q_dtype", str, "query element type: the dtype, or float8_e4m3fn (scaled) with that kv_dtype: an fp8 "
         "forward; default: dtype", choices=tuple(Q_DTYPES), parse=canonical_q_dtype, follows="dtype",
         declared=True, tag=lambda v: f"q-{v}", asks=lambda v: f"q_dtype {v}"),
    Axis("device", str, "cpu or cuda", choices=DEVICES, default="cpu",
         unknown="{label} {value!r} is not known; allowed: {allowed}"),
    Axis("mask", str, "which (query, key) pairs are visible", choices=MASKS, default="none",
         asks=lambda v: f"mask {v}" if v not in BASIC_MASKS else ""),
    Axis("pass", str, "forward, backward or both", field="pass_", choices=PASSES, default="fwd"),
    Axis("hidden", int, "hidden size of additive scoring (the scoring suite)", high=SIZE, optional=True,
         tag=lambda v: f"h{int(v)}" if v else ""),
    Axis("module", str, "core, or mha: the core inside a multi-head attention module", choices=MODULES,
         default="core", tag=lambda v: "mha" if v == "mha" else ""),
    Axis("scale", float, "softmax scale; None means 1/sqrt(head_dim)", sweep=False),
    Axis("window", int, "sliding_window: keys per query row", high=TOKENS, neutral=0,
         applies=("mask", "sliding_window"), tag=lambda v: f"w{int(v)}" if v else ""),
    Axis("documents", int, "document: packed documents in the sequence", high=SIZE, neutral=0,
         applies=("mask", "document"), tag=lambda v: f"docs{int(v)}" if v else ""),
    Axis("chunk", int, "chunked: keys per chunk (Llama 4's local attention)", high=TOKENS, neutral=0,
         applies=("mask", "chunked"), tag=lambda v: f"chunk{int(v)}" if v else ""),
    Axis("decode_share", float, "mixed: share of the batch's sequences that are decode steps (query length 1)",
         rule=_share_problem, default=0.5, neutral=0.0, applies=("mask", "mixed"),
         tag=lambda v: f"decode{float(v):g}" if v else ""),
    Axis("score_mod", str, "none, softcap or alibi", choices=SCORE_MODS, neutral="none",
         tag=lambda v: v if v not in ("none", "softcap") else "",  # softcap shows with its value
         asks=lambda v: f"score_mod {v}" if v != "none" else ""),
    Axis("softcap", float, "softcap: scores -> softcap·tanh(scores / softcap)", rule=_softcap_problem,
         default=50.0, neutral=0.0, applies=("score_mod", "softcap"),
         tag=lambda v: f"softcap{float(v):g}" if v else ""),
    Axis("page_size", int, "KV cache in pages of this many tokens; 0: contiguous", low=0, rule=_page_size_problem,
         neutral=0, tag=lambda v: f"page{int(v)}" if v else "", asks=lambda v: "paged KV" if v else ""),
    Axis("kv_layout", str, "separate k and v, or latent: one cache per token for all heads (MLA)",
         choices=KV_LAYOUTS, neutral="separate", declared=True, tag=lambda v: "latent" if v == "latent" else "",
         asks=lambda v: f"kv_layout {v}" if v != "separate" else ""),
    Axis("sinks", str, "none, or learned: one logit per query head joins each softmax denominator",
         choices=SINKS, neutral="none", declared=True, tag=lambda v: "sinks" if v != "none" else "",
         asks=lambda v: f"sinks {v}" if v != "none" else ""),
    Axis("lengths", str, "per-sequence lengths: equal, or drawn (seeded) from a distribution",
         choices=LENGTH_DISTRIBUTIONS, neutral="equal", declared=True,
         tag=lambda v: f"len-{v}" if v != "equal" else "", asks=lambda v: f"lengths {v}" if v != "equal" else ""),
    Axis("shared_prefix", int, "tokens of cached prefix every sequence of the batch shares; 0: none", high=TOKENS,
         low=0, neutral=0, declared=True, tag=lambda v: f"prefix{int(v)}" if v else "",
         asks=lambda v: f"shared_prefix {v}" if v else ""),
    Axis("model", str, "the model preset a case is built from (see `attnbench models`)", choices=tuple(PRESETS),
         neutral="", tag=lambda v: f"[{v}]" if v else ""),
    Axis("layer", str, "which kind of layer of a preset with two: sliding, full or chunked (default: each)",
         choices=LAYER_KINDS, neutral="", within="model"),
    Axis("phase", str, "prefill, decode or mixed, with model presets (default prefill and decode)", field=None,
         choices=PHASES, unknown="{label} value {value!r} is not known; allowed: {allowed}"),
)
# fmt: on
BY_NAME = {axis.name: axis for axis in AXES}
SWEEP_AXES = tuple(axis for axis in AXES if axis.sweep)  # suite keys and flags, in this order
WORKLOAD_AXES = tuple(axis for axis in AXES if axis.field is not None)  # Workload fields
BY_COLUMN = {axis.column: axis for axis in WORKLOAD_AXES}
FEATURES = tuple(a for a in WORKLOAD_AXES if a.neutral is not None)  # what a row may have or not
DECLARED = tuple(a for a in WORKLOAD_AXES if a.declared)  # what a contender must declare to run
# Results columns: device and dtype lead (they name the machine's side), then the table's order.
WORKLOAD_COLUMNS = [
    *(a.column for a in (BY_NAME["device"], BY_NAME["dtype"])),
    *(a.column for a in WORKLOAD_AXES if a.name not in ("device", "dtype")),
]
# The suite values filled into every sweep that does not give them. Not dtype: a sweep without one takes the
# axis' default (float32) when its workloads are made, unless it is a model preset's on CUDA, which takes the
# preset's dtype (models.preset_dtype) — so a dtype a sweep holds was given (a flag, a suite, run()).
DEFAULTS: dict[str, list[Any]] = {
    a.name: [a.default] for a in SWEEP_AXES if a.default is not None and a.neutral is None and a.name != "dtype"
}
REQUIRED = tuple(a.name for a in SWEEP_AXES if a.required)
# Named here so other modules use the axis, not its name.
IMPL, MODEL, PHASE, PASS, SEQ, SEQ_KV = (BY_NAME[n] for n in ("impl", "model", "phase", "pass", "seq", "seq_kv"))
DEVICE, DTYPE = BY_NAME["device"], BY_NAME["dtype"]
LAYER = BY_NAME["layer"]


def _allowed(axis: Axis) -> str:
    return ", ".join(axis.choices)


# --- values from flags, suite files and attnbench.run() --------------------------------------------------


def coerce_axis(name: str, value: Any, label: str) -> list[Any]:
    """A suite value (scalar or list) as a non-empty list of the axis' type, every item checked.

    ``label`` names the value in messages: "--seq" for a flag, "suite quick sweep 1: seq" for a file."""
    axis = BY_NAME[name]
    values = value if isinstance(value, list) else [value]
    if not values:
        raise UsageError(f"{label} is an empty list; give at least one value")
    return [_checked(axis, item, label) for item in values]


def _checked(axis: Axis, item: Any, label: str) -> Any:
    """One value from a flag or a file: its type, its bounds, its choices; the canonical value back."""
    if axis.kind is float:
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise UsageError(f"{label} value {item!r} must be a number")
        item = float(item)
    elif isinstance(item, bool) or not isinstance(item, axis.kind):
        raise UsageError(f"{label} value {item!r} must be {'an integer' if axis.kind is int else 'a string'}")
    if isinstance(item, int) and axis.rule is None and item < axis.low:
        # an axis of one mask (--window 0): its column reads 0 where it does not apply, which no flag need give
        unused = f" ({axis.applies[0]} {axis.applies[1]} only; other cases ignore it)" if axis.applies else ""
        raise UsageError(
            f"{label} value {item} must be {'a positive' if axis.low else 'a non-negative'} integer{unused}"
        )
    if isinstance(item, int) and axis.high is not None and item > axis.high:
        raise UsageError(f"{label} value {item} is past the sane upper bound; allowed: {axis.low} to {axis.high}")
    problem = axis.rule(item) if axis.rule is not None else None
    if problem:
        raise UsageError(f"{label} value {item!r} {problem}")
    if isinstance(item, str):
        if axis.parse is not None:
            item = axis.parse(item)
        elif axis is MODEL:
            get_model(item)  # its message lists the presets
        elif axis.choices and item not in axis.choices:
            raise UsageError(axis.unknown.format(name=axis.name, label=label, value=item, allowed=_allowed(axis)))
    return item


_EXAMPLES = {
    "batch": "1,8",
    "heads": "8,32",
    "kv_heads": "1,8",
    "documents": "1,4",
    "head_dim": "64,128",
    "head_dim_v": "64,128",
    "page_size": "0,16",
    "decode_share": "0.25,0.5",
    "softcap": "30,50",
}


def _example(axis: Axis) -> str:
    """Two values the flag takes, for a message: the axis' own, sizes, or the first two of its choices."""
    if axis.name in _EXAMPLES:
        return _EXAMPLES[axis.name]
    if axis.choices:
        return ",".join(axis.choices[:2])
    return "512,1024" if axis.kind is int else "0.25,0.5" if axis.kind is float else "a,b"


def parse_text(name: str, text: str) -> list[Any]:
    """A comma-separated flag value ('512,1024') as the axis' checked values."""
    axis = BY_NAME[name]
    flag = axis.flag
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        gap = "no value" if not text.strip() else "an empty value (a comma at an end, or two together)"
        raise UsageError(f"{flag} {text!r}: {gap}; give a comma-separated list, e.g. {flag} {_example(axis)}")
    try:
        values: list[Any] = [axis.kind(item) for item in items]
    except ValueError:
        expected = "positive integers" if axis.kind is int else "positive numbers"
        raise UsageError(f"{flag} {text!r}: expected {expected}, e.g. {flag} {_example(axis)}") from None
    return coerce_axis(name, values, flag)


def parse_values(name: str, value: Any) -> list[Any]:
    """A value of :func:`attnbench.run` (one value, a list, or the flag's comma-separated text) as the axis'
    checked values; messages name the flag, as the command does."""
    axis = BY_NAME[name]
    if isinstance(value, str):
        return parse_text(name, value)
    items = list(value) if isinstance(value, list | tuple) else [value]
    typed = items and all(
        not isinstance(item, bool) and isinstance(item, (int, float) if axis.kind is float else axis.kind)
        for item in items
    )
    if not typed:  # strings among numbers, a float for an int: read as the flag's text would be
        return parse_text(name, ",".join(str(item) for item in items))
    return coerce_axis(name, items, axis.flag)


def parse_overrides(texts: Mapping[str, str]) -> dict[str, list[Any]]:
    """{axis: 'a,b'} from flags (or pytest options) into checked value lists."""
    overrides = {}
    for name, text in texts.items():
        if name not in BY_NAME or not BY_NAME[name].sweep:
            raise UsageError(f"axis {name!r} is not known; allowed: {', '.join(a.name for a in SWEEP_AXES)}")
        overrides[name] = parse_text(name, text)
    return overrides


# --- Workload fields ----------------------------------------------------------------------------------------


def check_field(axis: Axis, value: Any) -> Any:
    """A Workload field's value checked by the axis' rule; the canonical value back (dtype aliases).

    Integer sizes are positive; a feature's integer may be 0, its neutral value."""
    field = axis.workload_field
    if axis.kind is int:
        smallest = 0 if axis.neutral == 0 else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            kind = "a non-negative integer" if smallest == 0 else "a positive integer"
            raise UsageError(f"{field} must be {kind}, got {value!r}")
        if axis.high is not None and value > axis.high:
            raise UsageError(
                f"{field} {value} is past the sane upper bound for {field}; allowed: {axis.low} to {axis.high}"
            )
        problem = axis.rule(value) if axis.rule is not None else None
        if problem:
            raise UsageError(f"{field} {value} {problem}")
        return value
    if axis.kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{field} {value!r} must be a number")
        problem = axis.rule(value) if axis.rule is not None else None
        if problem:
            raise UsageError(f"{field} {value!r} {problem}")
        return float(value)
    if axis.parse is not None:
        return axis.parse(value)
    if axis.choices and axis is not MODEL and value != axis.neutral and value not in axis.choices:
        raise UsageError(axis.unknown.format(name=axis.column, label=field, value=value, allowed=_allowed(axis)))
    if not isinstance(value, str):
        raise UsageError(f"{field} must be a string, got {value!r}")
    return value


def applies(axis: Axis, workload: Any) -> bool:
    """Whether the axis applies to a case (``window`` only with the sliding_window mask)."""
    if axis.applies is None:
        return True
    other, value = axis.applies
    return bool(getattr(workload, BY_NAME[other].workload_field) == value)


# --- labels and report filters -------------------------------------------------------------------------------


def case_label(row: Any, *, with_seq: bool = True, device_first: bool = False) -> str:
    """A case's short, stable description from a results row (dict or Series) or a Workload.

    'B2 H8/2 S128x256 D64 float32 cpu causal fwd w48 [gpt2]' (a Workload's label), or with ``device_first``
    'cpu float32 B2 H8/2 S128x256 D64 causal fwd w48 [gpt2]' (the reports' label); ``with_seq`` False leaves
    the lengths out (a figure's x axis)."""
    v = {axis.name: axis.read(row) for axis in WORKLOAD_AXES}
    heads = f"H{v['heads']}" if v["heads"] == v["kv_heads"] else f"H{v['heads']}/{v['kv_heads']}"
    seq = f"S{v['seq']}" if v["seq"] == v["seq_kv"] else f"S{v['seq']}x{v['seq_kv']}"
    dims = f"D{v['head_dim']}" if v["head_dim"] == v["head_dim_v"] else f"D{v['head_dim']}/{v['head_dim_v']}"
    sizes = [f"B{v['batch']}", heads, *([seq] if with_seq else []), dims]
    machine = [v["device"], v["dtype"]] if device_first else [v["dtype"], v["device"]]
    parts = [*machine, *sizes] if device_first else [*sizes, *machine]
    return " ".join(str(p) for p in [*parts, v["mask"], v["pass"]]) + tags(row)


def tags(row: Any, axes: Iterable[Axis] = WORKLOAD_AXES) -> str:
    """' h64 mha w48 docs5 softcap20 alibi page64 [llama3.1-8b]': the label parts of the axes that have
    them ('' when none applies); older rows without a column show its neutral value, i.e. nothing."""
    parts = [_tag(axis, row) for axis in axes if not axis.follows or axis.departs(row)]
    return "".join(f" {p}" for p in parts if p)


def _tag(axis: Axis, row: Any) -> str:
    if axis.tag is None:
        return ""
    value = axis.read(row)
    inside = [str(other.read(row)) for other in AXES if other.within == axis.name and other.read(row)]
    return axis.tag(" ".join([str(value), *inside]) if value and inside else value)


def features_label(row: Any) -> str:
    """The workload features' label parts: ' w48 docs5 softcap20 alibi page64 [llama3.1-8b]'."""
    return tags(row, (*FEATURES, *(a for a in DECLARED if a.follows)))


LABELLED_COLUMNS = ("impl", *(a.column for a in WORKLOAD_AXES if a.tag is not None or a.neutral is None or a.within))


def features_asked(row: Any) -> list[str]:
    """What a case asks of a contender beyond the basic ones: 'mask sliding_window', 'score_mod alibi',
    'paged KV' (the words of Capabilities' reasons)."""
    found = [
        axis.asks(axis.read(row))
        for axis in WORKLOAD_AXES
        if axis.asks is not None and (not axis.follows or axis.departs(row))
    ]
    return [f for f in found if f]


def is_decode(row: Any) -> bool:
    """A decode step: a few queries (at most ``MAX_DECODE_QUERY``) against a longer KV cache."""
    seq_q, seq_k = SEQ.read(row), SEQ_KV.read(row)
    return bool(seq_q <= MAX_DECODE_QUERY < seq_k)


# --- the flags that reproduce a case ------------------------------------------------------------------------


def reproduce_flags(row: Any) -> list[str]:
    """The ``attnbench run`` flags that run exactly this case (a Workload or a results row; a row's
    ``impl`` becomes ``--impl``), e.g. ``--batch 2 --heads 8 --kv-heads 2 --seq 128 --seq-kv 256 …``.

    Every axis a suite may vary is given; a feature at its neutral value is left out (it adds no case);
    a model preset's case is given as ``--model`` and ``--phase`` with the sizes the phase takes."""
    values = {axis.name: axis.read(row) for axis in WORKLOAD_AXES}
    scale = values.pop("scale")
    if scale is not None and not math.isclose(scale, 1 / math.sqrt(values["head_dim"]), rel_tol=1e-6):
        raise ValueError(f"scale {scale} has no flag: only the default 1/sqrt(head_dim) can be reproduced")
    impl = row.get(IMPL.name) if hasattr(row, "get") else None
    given: dict[str, Any] = {IMPL.name: impl} if impl else {}
    if values["model"]:
        given.update(_model_flags(values, row))
    else:
        plain = [a for a in SWEEP_AXES if a.name in values and a.neutral is None]
        given.update({a.name: values[a.name] for a in plain if not (a.declared and not a.departs(row))})
        given.update({a.name: values[a.name] for a in FEATURES if values[a.name] != a.neutral})
    flags = []
    for name, value in given.items():
        if value is not None:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            flags += [BY_NAME[name].flag, text]
    return flags


def _model_flags(values: dict[str, Any], row: Any) -> dict[str, Any]:
    """A preset's case: the preset gives heads, head dims, mask and its features (``PRESET_AXES``) and the
    phase the rest; ``--layer`` names a two-kind preset's layer, and every other axis is given as the plain
    case gives it (dtype, device, pass, module, hidden; a feature it departs in: paged KV, a narrower KV cache …)."""
    phase = "decode" if is_decode({SEQ.column: values["seq"], SEQ_KV.column: values["seq_kv"]}) else "prefill"
    phase = "mixed" if values["mask"] == "mixed" else phase
    given = {"model": values["model"], "phase": phase, "batch": values["batch"], "seq": values["seq"]}
    if values["layer"]:
        given["layer"] = values["layer"]
    # prefill without --seq-kv is square and causal; with it, bottom-right causal (or the preset's window)
    if phase != "prefill" or values["seq_kv"] != values["seq"] or values["mask"] == "causal_bottom_right":
        given["seq_kv"] = values["seq_kv"]
    # every other axis as the plain case gives it: a plain one always (dtype, hidden …), a feature where it departs
    rest = [a for a in SWEEP_AXES if a.name in values and a.name not in (*PRESET_AXES, *given, SEQ_KV.name)]
    featured = [a for a in rest if a.neutral is not None or a.declared]
    given.update({a.name: values[a.name] for a in rest if a not in featured and not a.follows})
    given.update({a.name: values[a.name] for a in featured if a.departs(row)})
    return given
