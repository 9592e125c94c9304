"""Suites: named sweeps kept as TOML data in ``suites/``, expanded into (contender, Workload) cases.

A suite file has an optional ``description``, ``budget_s`` (timing budget per case, seconds),
``case_budget_s`` (a case predicted to cost more is skipped, default 60 s), a
``[defaults]`` table and one or more ``[[sweep]]`` tables. Each sweep is the Cartesian product of its
axes (defaults filled in); every axis takes one value or a list. Axes: impl, batch, heads, kv_heads,
seq, seq_kv, head_dim, dtype, device, mask, pass, hidden (additive scoring's hidden size), module
(``core``, or ``mha`` for the core inside a multi-head attention module), and the workload features:
window (sliding_window), documents (document), score_mod (none, softcap, alibi), softcap (its value,
default 50), page_size (0 = contiguous KV, else a power of two). ``model`` (preset names, see
``attnbench.models``) with ``phase`` (prefill, decode; default both) builds a sweep from model presets:
then batch, heads and seq are not required.
``impl = "all"`` means every registered attention contender (scoring ones are named explicitly),
``"available"`` those of them that can run on this machine;
kv_heads left out means kv_heads = heads, seq_kv left out means seq_kv = seq.

Command-line overrides replace an axis in every sweep.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from attnbench.errors import UsageError
from attnbench.models import PHASES, phase_axes
from attnbench.workload import LIMITS, Workload, check_page_size, check_softcap

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

INT_AXES = ("batch", "heads", "kv_heads", "seq", "seq_kv", "head_dim", "hidden", "window", "documents", "page_size")
FLOAT_AXES = ("softcap",)
STR_AXES = ("impl", "dtype", "device", "mask", "pass", "module", "score_mod", "model", "phase")
AXES = ("impl", "batch", "heads", "kv_heads", "seq", "seq_kv", "head_dim", "dtype", "device", "mask", "pass", "hidden",
        "module", "window", "documents", "score_mod", "softcap", "page_size", "model", "phase")  # fmt: skip
REQUIRED = ("batch", "heads", "seq", "head_dim")
DEFAULTS: dict[str, list[Any]] = {"impl": ["all"], "dtype": ["float32"], "device": ["cpu"], "mask": ["none"],
                                  "pass": ["fwd"], "module": ["core"]}  # fmt: skip
BOUND_NAMES = {"seq": "seq_q", "seq_kv": "seq_k"}  # axis -> its bound in workload.LIMITS
TOP_KEYS = ("description", "budget_s", "case_budget_s", "defaults", "sweep")


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    budget_s: float
    case_budget_s: float
    sweeps: tuple[dict[str, list[Any]], ...]


def suite_names() -> list[str]:
    """Names of the suites shipped in attnbench.suites."""
    folder = resources.files("attnbench.suites")
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def _read(name_or_path: str) -> tuple[str, str]:
    """(suite name, TOML text) for a shipped suite name or a path to a .toml file."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise UsageError(f"suite file {name_or_path!r} does not exist")
        return path.stem, path.read_text()
    if name_or_path not in suite_names():
        raise UsageError(f"suite {name_or_path!r} is not known; known: {', '.join(suite_names())} (or a .toml path)")
    text = resources.files("attnbench.suites").joinpath(f"{name_or_path}.toml").read_text()
    return name_or_path, text


def coerce_axis(axis: str, value: Any, label: str) -> list[Any]:
    """Validate one axis value (scalar or list) into a non-empty list of the axis' type.

    ``label`` names the value in messages: "--seq" for a flag, "suite quick sweep 1: seq" for a file.
    """
    values = value if isinstance(value, list) else [value]
    if not values:
        raise UsageError(f"{label} is an empty list; give at least one value")
    if axis in FLOAT_AXES:
        for item in values:
            check_softcap(item, f"{label} value")
        return [float(item) for item in values]
    kind = int if axis in INT_AXES else str
    for item in values:
        if isinstance(item, bool) or not isinstance(item, kind):
            raise UsageError(f"{label} value {item!r} must be {'an integer' if kind is int else 'a string'}")
        if axis == "page_size" and isinstance(item, int):
            check_page_size(item, f"{label} value")
        elif isinstance(item, int) and item < 1:
            raise UsageError(f"{label} value {item} must be a positive integer")
        bound = LIMITS.get(BOUND_NAMES.get(axis, axis))
        if isinstance(item, int) and bound is not None and item > bound:
            raise UsageError(f"{label} value {item} is past the sane upper bound; allowed: 1 to {bound}")
        if axis == "phase" and item not in PHASES:
            raise UsageError(f"{label} value {item!r} is not known; allowed: {', '.join(PHASES)}")
    return values


def _axes(table: Any, where: str) -> dict[str, list[Any]]:
    if not isinstance(table, dict):
        raise UsageError(f"{where}: must be a table of axes")
    unknown = sorted(set(table) - set(AXES))
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(AXES)}")
    return {axis: coerce_axis(axis, value, f"{where}: {axis}") for axis, value in table.items()}


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
        if isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0:
            raise UsageError(f"suite {name}: {key} must be a positive number of seconds, got {budget!r}")
    defaults = {**DEFAULTS, **_axes(data.get("defaults", {}), f"suite {name} [defaults]")}
    raw_sweeps = data.get("sweep", [{}])
    if not isinstance(raw_sweeps, list) or not raw_sweeps:
        raise UsageError(f"suite {name}: [[sweep]] must be a non-empty array of tables")
    sweeps = []
    for index, table in enumerate(raw_sweeps, start=1):
        where = f"suite {name} sweep {index}"
        sweep = {**defaults, **_axes(table, where)}
        missing = [axis for axis in REQUIRED if axis not in sweep and "model" not in sweep]
        if missing:
            raise UsageError(f"{where}: missing axis {missing[0]!r}; required: {', '.join(REQUIRED)}")
        sweeps.append(sweep)
    description = str(data.get("description", ""))
    budget_s, case_budget_s = float(budgets["budget_s"]), float(budgets["case_budget_s"])
    return Suite(name, description, budget_s, case_budget_s, tuple(sweeps))


def expand(
    suite: Suite,
    overrides: dict[str, list[Any]],
    known_impls: list[str],
    default_impls: list[str] | None = None,
    available_impls: list[str] | None = None,
) -> list[tuple[str, Workload]]:
    """All (contender, workload) cases, in sweep order, without duplicates; validates every value.

    ``impl = "all"`` stands for ``default_impls`` (default: every known contender), ``"available"`` for
    ``available_impls`` (those of them that can run on this machine; default: all of them)."""
    cases: dict[tuple[str, Workload], None] = {}
    for sweep in suite.sweeps:
        axes = {**sweep, **overrides}
        impls = _impls(axes["impl"], known_impls, default_impls, available_impls)
        if axes.get("phase") and not axes.get("model"):
            raise UsageError("phase applies to model presets: give --model too (see `attnbench models`)")
        expanded = (
            [phase_axes(model, phase, axes) for model in axes["model"] for phase in axes.get("phase") or PHASES]
            if axes.get("model")
            else [axes]
        )
        for one in expanded:
            for workload in _workloads(one):
                for impl in impls:
                    cases[(impl, workload)] = None
    return list(cases)


def _workloads(axes: dict[str, list[Any]]) -> list[Workload]:
    """The Cartesian product of one sweep's axes as workloads (features that don't apply collapse)."""
    features = [axes.get(a) or [d] for a, d in (("window", 0), ("documents", 0), ("score_mod", "none"),
                                               ("softcap", 50.0), ("page_size", 0), ("model", ""))]  # fmt: skip
    workloads: dict[Workload, None] = {}
    for batch, heads, seq, head_dim, dtype, device, mask, pass_ in itertools.product(
        axes["batch"], axes["heads"], axes["seq"], axes["head_dim"],
        axes["dtype"], axes["device"], axes["mask"], axes["pass"],
    ):  # fmt: skip
        for kv_heads, seq_k, hidden, module, *feature in itertools.product(
            axes.get("kv_heads") or [heads], axes.get("seq_kv") or [seq], axes.get("hidden") or [None],
            axes["module"], *features,
        ):  # fmt: skip
            shape = (batch, heads, kv_heads, seq, seq_k, head_dim)
            window, documents, score_mod, softcap, page_size, model = feature
            workload = Workload(*shape, dtype, device, mask, pass_, hidden=hidden, module=module, window=window,
                                documents=documents, score_mod=score_mod, softcap=softcap, page_size=page_size,
                                model=model)  # fmt: skip
            workloads[workload] = None
    return list(workloads)


def check_devices(cases: list[tuple[str, Workload]]) -> None:
    """CUDA cases on a machine without CUDA are bad input, not a sweep of `unavailable` rows."""
    import torch

    if any(w.device == "cuda" for _, w in cases) and not torch.cuda.is_available():
        raise UsageError("device cuda: torch.cuda.is_available() is False on this machine; allowed here: cpu")


def _impls(requested: list[str], known: list[str], default: list[str] | None, available: list[str] | None) -> list[str]:
    keywords = {"all": known if default is None else default}
    keywords["available"] = keywords["all"] if available is None else available
    chosen: list[str] = []
    for name in requested:
        if name in keywords:
            chosen.extend(keywords[name])
        elif name in known:
            chosen.append(name)
        else:
            raise UsageError(f"impl {name!r} is not known; known: {', '.join(known)} (or all, available)")
    return list(dict.fromkeys(chosen))


def model_suite() -> Suite:
    """The sweep ``attnbench run --model NAME`` runs when no --suite is given: every phase of the presets
    named on the command line (which replaces ``model``), with every available contender."""
    sweep = {**DEFAULTS, "impl": ["available"], "model": ["llama3.1-8b"], "phase": list(PHASES)}
    return Suite("models", "model presets, prefill and decode", 1.0, 60.0, (sweep,))
