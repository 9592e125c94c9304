"""Suites: named sweeps kept as TOML data in ``suites/``, expanded into (contender, Workload) cases.

A suite file has an optional ``description``, ``budget_s`` (timing budget per case, seconds),
``case_budget_s`` (a case predicted to cost more is skipped, default 60 s), a
``[defaults]`` table and one or more ``[[sweep]]`` tables. Each sweep is the Cartesian product of its
axes (defaults filled in); every axis takes one value or a list. The axes, their types, bounds and
defaults are the table in ``attnbench.workload.axes`` (the same names as ``attnbench run``'s flags). ``model``
(preset names, see ``attnbench.workload.models``) with ``phase`` (prefill, decode; default both) builds a sweep from
model presets: then batch, heads and seq are not required.
``impl = "all"`` means every registered attention contender (scoring ones are named explicitly),
``"available"`` those of them that can run on this machine;
kv_heads left out means kv_heads = heads, seq_kv left out means seq_kv = seq.

Command-line overrides replace an axis in every sweep.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from attnbench.errors import UsageError
from attnbench.workload._problem import Workload
from attnbench.workload.axes import (
    BY_NAME,
    DEFAULTS,
    DEVICE,
    DTYPE,
    IMPL,
    LAYER,
    MODEL,
    PASS,
    PHASE,
    REQUIRED,
    SWEEP_AXES,
    WORKLOAD_AXES,
    coerce_axis,
)
from attnbench.workload.models import DEFAULT_PHASES, PRESET_AXES, preset_axes, preset_dtype

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

AXES = tuple(axis.name for axis in SWEEP_AXES)  # the keys a sweep table may have
TOP_KEYS = ("description", "budget_s", "case_budget_s", "defaults", "sweep")
# What `attnbench profile`, `attnbench ab` and attnbench.run() without a suite run: one modest case per contender.
ONE_CASE: dict[str, list[Any]] = dict(batch=[1], heads=[8], seq=[1024], head_dim=[64])


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    budget_s: float
    case_budget_s: float
    sweeps: tuple[dict[str, list[Any]], ...]
    one_case: bool = False  # profile_suite's: its sizes are a start the command's flags and a preset's phase adjust


def suite_names() -> list[str]:
    """Names of the suites shipped in attnbench.suites."""
    folder = resources.files("attnbench.suites")
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def _read(name_or_path: str) -> tuple[str, str]:
    """(suite name, TOML text) for a shipped suite name or a path to a .toml file."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        if path.is_dir():
            raise UsageError(f"suite file {name_or_path!r} is a folder; give a .toml file or a suite's name")
        if not path.is_file():
            raise UsageError(f"suite file {name_or_path!r} does not exist")
        try:
            return path.stem, path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"suite {path.stem}: not valid TOML (not UTF-8 text: {exc.reason} at byte {exc.start})"
            ) from None
    if name_or_path not in suite_names():
        raise UsageError(f"suite {name_or_path!r} is not known; known: {', '.join(suite_names())} (or a .toml path)")
    text = resources.files("attnbench.suites").joinpath(f"{name_or_path}.toml").read_text()
    return name_or_path, text


def _axes(table: Any, where: str) -> dict[str, list[Any]]:
    if not isinstance(table, dict):
        raise UsageError(f"{where}: must be a table of axes")
    unknown = sorted(set(table) - set(AXES))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(AXES)}")
    axes = {}
    for axis, value in table.items():
        try:
            axes[axis] = coerce_axis(axis, value, f"{where}: {axis}")
        except UsageError as exc:  # a value's own message (a dtype's, a mask's) says where, as the others do
            raise UsageError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
    return axes


PRESET_SET = tuple(axis for axis in PRESET_AXES if axis not in (MODEL.name, LAYER.name))  # what a preset decides


def _check_preset_axes(models: list[Any] | None, given: dict[str, list[Any]], where: str | None) -> None:
    """A sweep with model presets takes its shape from them: an axis a preset sets (heads, mask, window, …) given
    beside them — ``given``, a sweep's own keys (``where`` names it) or the command's flags (``where`` None) —
    would be dropped without a word; a UsageError instead."""
    clash = [axis for axis in PRESET_SET if axis in given]
    if not models or not clash:
        return
    axis = BY_NAME[clash[0]]
    named = f"{where}: {axis.name}" if where else axis.flag
    raise UsageError(
        f"{named}: the model preset ({', '.join(models)}) sets {axis.name}, so it would be ignored; leave it out "
        "beside a model (the presets' shapes: `attnbench models`), or leave out the model to give the shape yourself"
    )


def load_suite(name_or_path: str) -> Suite:
    """Read and validate a suite; every problem is a UsageError naming the file, key and value."""
    name, text = _read(name_or_path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"suite {name}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise UsageError(f"suite {name}: unknown top-level key {unknown[0]!r}; allowed: {', '.join(TOP_KEYS)}")
    budgets = {key: data.get(key, default) for key, default in (("budget_s", 1.0), ("case_budget_s", 60.0))}
    for key, budget in budgets.items():
        if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 < budget < math.inf:
            raise UsageError(f"suite {name}: {key} must be a positive number of seconds, got {budget!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise UsageError(f"suite {name}: description must be a string, got {description!r}")
    given_defaults = _axes(data.get("defaults", {}), f"suite {name} [defaults]")
    defaults = {**DEFAULTS, **given_defaults}
    raw_sweeps = data.get("sweep", [{}])
    if not isinstance(raw_sweeps, list) or not raw_sweeps:
        raise UsageError(f"suite {name}: [[sweep]] must be a non-empty array of tables")
    sweeps = []
    for index, table in enumerate(raw_sweeps, start=1):
        where = f"suite {name} sweep {index}"
        given = {**given_defaults, **_axes(table, where)}
        _check_preset_axes(given.get(MODEL.name), given, where)
        sweep = {**defaults, **given}
        missing = [axis for axis in REQUIRED if axis not in sweep and MODEL.name not in sweep]
        if missing:
            raise UsageError(f"{where}: missing axis {missing[0]!r}; required: {', '.join(REQUIRED)}")
        if MODEL.name not in sweep:  # the rules between axes (kv_heads divides heads, a window's mask), said here
            try:
                _workloads(sweep)
            except UsageError as exc:
                raise UsageError(f"{where}: {exc}") from None
        sweeps.append(sweep)
    budget_s, case_budget_s = float(budgets["budget_s"]), float(budgets["case_budget_s"])
    return Suite(name, description, budget_s, case_budget_s, tuple(sweeps))


def expand(
    suite: Suite,
    overrides: dict[str, list[Any]],
    known_impls: list[str],
    default_impls: list[str] | None = None,
    available_impls: list[str] | Callable[[], list[str]] | None = None,
    never_applies: Callable[[str, list[Workload]], bool] | None = None,
    check_flags: bool = True,
) -> list[tuple[str, Workload]]:
    """All (contender, workload) cases, in sweep order, without duplicates; validates every value.

    ``impl = "all"`` stands for ``default_impls`` (default: every known contender), ``"available"`` for
    ``available_impls`` (those of them that can run on this machine; default: all of them; a function is
    called only where a sweep asks for them, since asking a contender whether it can run may build it). A contender
    such a keyword brings in is left out of a sweep where ``never_applies(impl, workloads)`` says it suits
    none of them (a column of `unsupported` tells nothing); one named is always planned. ``check_flags``: a
    feature flag of ``overrides`` no workload uses is refused (:func:`check_flags_apply`; a caller that expands
    a suite a sweep at a time checks once over them all)."""
    swept: list[tuple[dict[str, list[Any]], list[Workload]]] = []
    for number, sweep in enumerate(suite.sweeps, 1):
        _check_preset_axes(overrides.get(MODEL.name) or sweep.get(MODEL.name), overrides, None)
        axes = {**sweep, **overrides}
        models, phases = axes.get(MODEL.name), axes.get(PHASE.name)
        for axis in (PHASE, LAYER):
            if axes.get(axis.name) and not models:
                raise UsageError(f"{axis.name} applies to model presets: give --model too (see `attnbench models`)")
        expanded = (
            [
                by_device
                for m in models
                for phase in phases or DEFAULT_PHASES
                for one in preset_axes(
                    m, phase, _one_case_start(suite, phase, axes, overrides), phases or DEFAULT_PHASES
                )
                for by_device in _preset_dtypes(m, one)
            ]
            if models
            else [axes]
        )
        try:
            swept.append((axes, [workload for one in expanded for workload in _workloads(one)]))
        except UsageError as error:
            raise UsageError(f"{error}{_sweep_context(str(error), suite, number, sweep, overrides)}") from None
    if check_flags:
        check_flags_apply(overrides, list(dict.fromkeys(w for _, workloads in swept for w in workloads)))
    # after every sweep's workloads: bad input is said before `available` asks a contender (which may build it)
    cases: dict[tuple[str, Workload], None] = {}
    for axes, workloads in swept:
        impls, implicit = _impls(axes[IMPL.name], known_impls, default_impls, available_impls)
        if never_applies is not None:  # a contender no workload of the sweep suits, unless named, is left out
            impls = [impl for impl in impls if impl not in implicit or not never_applies(impl, workloads)]
        for workload in workloads:
            for impl in impls:
                cases[(impl, workload)] = None
    return list(cases)


def _one_case_start(
    suite: Suite, phase: str, axes: dict[str, list[Any]], overrides: dict[str, list[Any]]
) -> dict[str, list[Any]]:
    """The one case's sizes for a preset's decode phase alone: its ``seq`` (1024) is a prefill's queries, which a
    decode step refuses (`attnbench profile --model llama3.1-8b --phase decode` failed with "--seq 1024 is not a
    decode step" though no --seq was given), so it becomes the KV length and the query one token. Sizes the
    command gives, and a suite's own, stay as they are."""
    if not suite.one_case or phase != "decode" or "seq" in overrides or "prefill" in (axes.get(PHASE.name) or ()):
        return axes
    return {**axes, "seq": [1], "seq_kv": overrides.get("seq_kv") or axes["seq"]}


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_flags_apply(overrides: dict[str, list[Any]], workloads: list[Workload]) -> None:
    """A command's feature flag that applies to one value of another axis (``--window``: mask sliding_window) where
    no workload has that value: a UsageError, not a flag dropped without a word (`--mask causal --window 128`
    ran causal). Across a suite's several masks a flag may apply to some sweeps only: that is not refused."""
    if not workloads:
        return
    for name, values in overrides.items():
        axis = BY_NAME.get(name)
        if axis is None or axis.applies is None or not values:
            continue
        other, value = axis.applies
        if any(BY_NAME[other].read(w) == value for w in workloads):
            continue
        seen = ", ".join(dict.fromkeys(str(BY_NAME[other].read(w)) for w in workloads))
        given = ",".join(map(_shown, values))
        if not any(w.model for w in workloads):
            advice = f"add {BY_NAME[other].flag} {value}"
        elif (other, value) == ("mask", "mixed"):
            advice = "add --phase mixed"
        else:
            advice = f"the model preset sets {other}: pick one with {other} {value}"
        raise UsageError(
            f"{axis.flag} {given} applies to {other} {value}, which no case has (its {other}: {seen}); "
            f"{advice} or drop {axis.flag}"
        )


_FIELD = {"seq": "seq_q", "seq_kv": "seq_k"}  # how a workload's message names these axes
_SIZES = ("batch", "heads", "kv_heads", "seq", "seq_kv", "head_dim", "head_dim_v", "window", "documents", "chunk")


def _sweep_context(
    message: str, suite: Suite, number: int, sweep: dict[str, list[Any]], overrides: dict[str, list[Any]]
) -> str:
    """Where a workload the command's flags made is refused in a suite's sweep that sets sizes of its own: those
    sizes ('seq_kv 256' of quick's second sweep, which the user never wrote) and the flag of the one ``message``
    names; nothing where it names none of them."""
    own = [(axis, sweep[axis]) for axis in _SIZES if axis in sweep and axis not in overrides]
    if not own:
        return ""
    said = ", ".join(f"{axis} {','.join(map(str, values))}" for axis, values in own)
    named = [axis for axis, _ in own if re.search(rf"\b{_FIELD.get(axis, axis)}\b", message)]
    if not named:  # the problem is not one of the sweep's own sizes (a dtype, a missing window): nothing to add
        return ""
    flag = "--" + named[0].replace("_", "-")
    where = f"suite {suite.name}"  # a suite of one sweep: no "sweep 1 of 1"
    if len(suite.sweeps) > 1:
        possessive = "'" if suite.name.endswith("s") else "'s"
        where += f"{possessive} sweep {number} of {len(suite.sweeps)}"
    return f" ({where} sets {said} itself; {flag} and the like replace them)"


def _preset_dtypes(model: str, axes: dict[str, list[Any]]) -> list[dict[str, list[Any]]]:
    """A preset's sweep as it is when it names a dtype; without one, a sweep per device, each in the preset's
    dtype there (models.preset_dtype: bfloat16 on CUDA) or the axis default (float32)."""
    if axes.get(DTYPE.name):
        return [axes]
    devices = axes.get(DEVICE.name) or [DEVICE.sweep_default]
    return [
        {**axes, DEVICE.name: [device], DTYPE.name: [preset_dtype(model, device) or DTYPE.sweep_default]}
        for device in devices
    ]


def _workloads(axes: dict[str, list[Any]]) -> list[Workload]:
    """The Cartesian product of one sweep's axes as workloads (features that don't apply collapse).

    The basic case (sizes, dtype, device, mask, pass) varies slowest, then the axes that follow another
    (kv_heads: heads, seq_kv: seq) and the rest, so the cases of one shape stay together."""
    basic = WORKLOAD_AXES[: WORKLOAD_AXES.index(PASS) + 1]
    order = [a for a in basic if not a.follows] + [a for a in WORKLOAD_AXES if a.follows]
    order += [a for a in WORKLOAD_AXES if a.sweep and a not in order]
    lists = [axes.get(a.name) or ([None] if a.follows else [a.sweep_default]) for a in order]
    workloads: dict[Workload, None] = {}
    for values in itertools.product(*lists):
        given = dict(zip(order, values, strict=True))
        fields = {a.workload_field: value for a, value in given.items()}
        for axis in order:
            if axis.follows and fields[axis.workload_field] is None:
                fields[axis.workload_field] = fields[BY_NAME[axis.follows].workload_field]
        workloads[Workload(**fields)] = None
    return list(workloads)


def check_devices(cases: list[tuple[str, Workload]]) -> None:
    """CUDA cases on a machine without CUDA are bad input, not a sweep of `unavailable` rows."""
    import torch

    if any(w.device == "cuda" for _, w in cases) and not torch.cuda.is_available():
        raise UsageError("device cuda: torch.cuda.is_available() is False on this machine; allowed here: cpu")


def _impls(
    requested: list[str],
    known: list[str],
    default: list[str] | None,
    available: list[str] | Callable[[], list[str]] | None,
) -> tuple[list[str], set[str]]:
    """The contenders ``requested`` names, and those of them only a keyword (all, available) brought in."""
    every = known if default is None else default
    chosen: list[str] = []
    named: set[str] = set()
    for name in requested:
        if name == "all":
            chosen.extend(every)
        elif name == "available":
            chosen.extend(_available(every, available))
        elif name in known:
            chosen.append(name)
            named.add(name)
        else:
            raise UsageError(f"impl {name!r} is not known; known: {', '.join(known)} (or all, available)")
    chosen = list(dict.fromkeys(chosen))
    return chosen, set(chosen) - named


def _available(every: list[str], available: list[str] | Callable[[], list[str]] | None) -> list[str]:
    """``available``'s contenders: all of ``every`` without a list; a function is asked here, and only here."""
    if available is None:
        return every
    return available() if callable(available) else available


def profile_suite(name: str = "profile", description: str = "") -> Suite:
    """One modest case per contender (``ONE_CASE``: B=1, H=8, S=1024, D=64, the basic defaults): what
    ``attnbench profile``, ``attnbench ab`` and :func:`attnbench.run` without a suite start from; overrides replace
    its axes."""
    return Suite(name, description, 1.0, 60.0, ({**DEFAULTS, **ONE_CASE},), one_case=True)


# every mask once, each with the feature it needs, at the profile's size (B4 where the sequences differ)
_MASK_GALLERY: tuple[dict[str, list[Any]], ...] = (
    {"mask": ["none"]},
    {"mask": ["causal"]},
    {"mask": ["causal_bottom_right"]},
    {"mask": ["padding"], "batch": [4]},
    {"mask": ["sliding_window"], "window": [256]},
    {"mask": ["document"], "documents": [4], "lengths": ["bimodal"]},
    {"mask": ["chunked"], "chunk": [256]},
    {"mask": ["mixed"], "batch": [4], "decode_share": [0.5], "lengths": ["uniform"]},
)


def mask_suite() -> Suite:
    """Every mask once at :func:`profile_suite`'s size, each with the feature it needs (a 256-key window, 4
    documents, 256-key chunks, …): what ``attnbench masks`` shows when no --mask or --suite is given (bottom-right
    causal is causal there; --seq-kv tells them apart)."""
    return Suite("masks", "", 1.0, 60.0, tuple({**DEFAULTS, **ONE_CASE, **s} for s in _MASK_GALLERY))


def model_suite() -> Suite:
    """The sweep ``attnbench run --model NAME`` runs when no --suite is given: every phase of the presets
    named on the command line (which replaces ``model``), with every available contender."""
    sweep = {**DEFAULTS, IMPL.name: ["available"], MODEL.name: ["llama3.1-8b"], PHASE.name: list(DEFAULT_PHASES)}
    return Suite("models", "model presets, prefill and decode", 1.0, 60.0, (sweep,))
