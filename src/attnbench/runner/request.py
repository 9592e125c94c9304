"""What a run is asked to do (:class:`RunRequest`) and the settings it is measured with (:class:`RunSettings`).

Both front ends build the request here and nowhere else: :func:`attnbench.run` from its arguments, the
``attnbench run`` command from its flags. :func:`build_request` checks every value once — the axes by the
axis table (``attnbench.workload.axes``), the settings below — and raises a UsageError naming the flag, so the
command and the Python call fail with the same line. ``attnbench.runner.sweep.run_sweep`` runs a request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.errors import UsageError, refuse_empty
from attnbench.measure._hardware import usable_cpus
from attnbench.measure.allocator import POLICIES
from attnbench.runner._shard import parse_shard
from attnbench.workload.axes import MODEL, SWEEP_AXES, parse_values

if TYPE_CHECKING:
    from attnbench.workload.suite import Suite

ISOLATION = ("worker", "none")
PROGRESS_BAR_MODES = ("auto", "on", "off", "lines")
DEFAULT_SUITE = "quick"


@dataclass(frozen=True)
class RunRequest:
    """A sweep to run, checked. ``None`` settings take the suite's value (budgets) or the default."""

    suite: str | Suite | None = None  # a shipped name or .toml path; a Suite; None: quick (the presets with model)
    axes: Mapping[str, list[Any]] = field(default_factory=dict)  # checked values replacing the suite's axes
    repeat: int | None = None  # processes each case runs in; None: 1, or what a resumed run had
    budget_s: float | None = None
    case_budget_s: float | None = None
    timeout_s: float | None = None
    threads: int | None = None
    seed: int = 0
    memory: bool = True
    cpu_allocator: str = "cached"
    isolate: str = "worker"
    remeasure_ceilings: bool = False
    progress: str = "auto"
    out: Path | None = None
    resume: Path | None = None
    shard: str | None = None  # 'I/N' as given (meta.json keeps it as I/N, '02/ 3' as '2/3')
    store: bool = False  # add the run to the results store (the command does, after the run)
    db: Path | None = None
    command: str = ""  # how the run was asked for, as meta.json records it

    @property
    def suite_name(self) -> str:
        """What the default run folder is named after."""
        if self.suite is None:
            return "models" if self.axes.get(MODEL.name) else DEFAULT_SUITE
        return Path(self.suite).stem if isinstance(self.suite, str) else self.suite.name

    @property
    def shard_slice(self) -> tuple[int, int] | None:
        return parse_shard(self.shard) if self.shard else None


def check_threads(threads: int | None) -> None:
    """``--threads``: a positive count no larger than the CPUs this process may run on (more would take turns on
    them, and every CPU row would time `stalled`)."""
    if threads is None:
        return
    if threads < 1:
        raise UsageError(f"--threads {threads}: must be a positive integer")
    cpus = usable_cpus()
    if threads > cpus:
        raise UsageError(
            f"--threads {threads}: more threads than the {cpus} CPUs this process may run on (its affinity): "
            f"they would take turns on them, and every row would time `stalled`; allowed: 1 to {cpus}"
        )


def build_request(
    suite: str | Suite | None = None,
    axes: Mapping[str, Any] | None = None,
    *,
    repeat: int | str | None = None,
    budget_s: float | None = None,
    case_budget_s: float | None = None,
    timeout_s: float | None = None,
    threads: int | None = None,
    seed: int = 0,
    memory: bool = True,
    cpu_allocator: str = "cached",
    isolate: str = "worker",
    remeasure_ceilings: bool = False,
    progress: str = "auto",
    out: str | Path | None = None,
    resume: str | Path | None = None,
    shard: str | None = None,
    store: bool = False,
    db: str | Path | None = None,
    command: str = "",
) -> RunRequest:
    """A checked request. ``axes`` maps axis names to one value, a list, or the flag's comma-separated text."""
    for flag, text, example in (
        ("--suite", suite, "quick"),
        ("--out", out, "runs/mine"),
        ("--resume", resume, "runs/quick-20261122-010000"),
        ("--shard", shard, "2/3"),
        ("--db", db, "runs/attnbench.duckdb"),
    ):
        refuse_empty(flag, text, example)
    checked = {name: parse_values(name, value) for name, value in (axes or {}).items() if value is not None}
    for flag, value, allowed in (
        ("--cpu-allocator", cpu_allocator, POLICIES),
        ("--isolate", isolate, ISOLATION),
        ("--progress", progress, PROGRESS_BAR_MODES),
    ):
        if value not in allowed:
            choices = ", ".join(repr(choice) for choice in allowed)
            raise UsageError(f"argument {flag}: invalid choice: {value!r} (choose from {choices})")
    check_threads(threads)
    processes = parse_repeat(repeat, isolate) if resume is None or repeat else None
    seconds = {
        flag: _seconds(flag, value)
        for flag, value in (("--budget-s", budget_s), ("--case-budget-s", case_budget_s), ("--timeout-s", timeout_s))
    }
    if shard:
        parse_shard(shard)
    if db is not None and not store:
        raise UsageError("--db is for --store: add --store to keep the run in the results store")
    if resume is not None:
        given = ["--suite"] * (suite is not None)  # even the default's name: the folder's may be another suite
        given += [axis.flag for axis in SWEEP_AXES if axis.name in checked]
        given += ["--shard"] * bool(shard) + ["--out"] * (out is not None) + ["--repeat"] * bool(processes)
        settings = (  # the run's own settings go on; a value given here would be dropped without a word
            ("--threads", threads is not None),
            *((flag, value is not None) for flag, value in seconds.items()),
            ("--seed", seed != 0),
            ("--no-memory", not memory),
            ("--cpu-allocator", cpu_allocator != "cached"),
            ("--isolate", isolate != "worker"),
            ("--remeasure-ceilings", remeasure_ceilings),
        )
        given += [flag for flag, was_given in settings if was_given]
        if given:
            raise UsageError(
                f"--resume takes the sweep and its settings from the run folder (meta.json); drop {', '.join(given)}"
            )
    return RunRequest(
        suite=suite,
        axes=checked,
        repeat=processes,
        budget_s=seconds["--budget-s"],
        case_budget_s=seconds["--case-budget-s"],
        timeout_s=seconds["--timeout-s"],
        threads=threads,
        seed=seed,
        memory=memory,
        cpu_allocator=cpu_allocator,
        isolate=isolate,
        remeasure_ceilings=remeasure_ceilings,
        progress=progress,
        out=Path(out) if out is not None else None,
        resume=Path(resume) if resume is not None else None,
        shard=shard,
        store=store,
        db=Path(db) if db is not None else None,
        command=command,
    )


def _seconds(flag: str, value: float | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"argument {flag}: invalid float value: {value!r}") from None
    if not 0 < seconds < math.inf:  # nan and inf too: a budget or a limit that never ends
        raise UsageError(f"{flag} {seconds}: must be a positive number of seconds")
    return seconds


def parse_repeat(text: str | int | None, isolate: str) -> int:
    """--repeat: a positive number of worker processes each case runs in (default 1)."""
    if text is None:
        return 1
    try:
        repeat = int(text)
    except ValueError:
        repeat = 0
    if repeat < 1 or str(text).strip() != str(repeat):
        raise UsageError(f"--repeat {text}: must be a positive integer (the number of processes each case runs in)")
    if repeat > 1 and isolate != "worker":
        raise UsageError(f"--repeat {repeat} runs each case in separate worker processes; drop --isolate none")
    return repeat


def default_timeout_s(case_budget_s: float) -> float:
    """A worker's time limit per case where ``--timeout-s`` is not given: twice the case's budget, 120 s at least."""
    return max(120.0, 2 * case_budget_s)


@dataclass(frozen=True)
class RunSettings:
    """The settings a run is measured with, resolved (the suite's budgets filled in). meta.json keeps them
    under ``settings`` with these keys; ``--resume`` reads them back from there."""

    budget_s: float
    case_budget_s: float
    threads: int
    seed: int = 0
    measure_memory: bool = True
    cpu_allocator: str = "cached"
    timeout_s: float = 120.0
    isolate: str = "worker"
    remeasure_ceilings: bool = False
    repeat: int | None = 1

    @classmethod
    def resolve(cls, request: RunRequest, suite: Suite, default_threads: int) -> RunSettings:
        budget_s, case_budget_s = request.budget_s or suite.budget_s, request.case_budget_s or suite.case_budget_s
        return cls(
            budget_s=budget_s,
            case_budget_s=case_budget_s,
            threads=request.threads or default_threads,
            seed=request.seed,
            measure_memory=request.memory,
            cpu_allocator=request.cpu_allocator,
            timeout_s=request.timeout_s or default_timeout_s(case_budget_s),
            isolate=request.isolate,
            remeasure_ceilings=request.remeasure_ceilings,
            repeat=request.repeat,
        )

    def as_meta(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_meta(cls, settings: Mapping[str, Any]) -> RunSettings:
        """The settings of a run folder's meta.json (keys a newer attnbench added take their defaults)."""
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{key: value for key, value in settings.items() if key in known})
        except TypeError as exc:  # a damaged meta.json: settings it must hold are missing
            required = [f for f in dataclasses.fields(cls) if f.default is f.default_factory is dataclasses.MISSING]
            missing = sorted(f.name for f in required if f.name not in settings)
            raise UsageError(
                f"meta.json's run settings are damaged: {', '.join(missing) or exc} missing; run the sweep again"
            ) from None

    @property
    def repeats(self) -> int:
        return int(self.repeat or 1)
