"""One command per row: the ``attnbench run …`` that reruns exactly that case, and ``--from RUN_DIR --case N``.

Every results row carries, in its ``reproduce`` column, the command that reruns its one case: the case's
axis flags (:func:`attnbench.workload.axes.reproduce_flags`, ``--impl NAME`` first), then the run's settings that
differ from what that command would get by default (``--seed``, ``--threads``, ``--budget-s``,
``--case-budget-s``, ``--timeout-s``, ``--no-memory``, ``--cpu-allocator``, ``--isolate``, ``--repeat``).
No ``--out``: the rerun makes a new run folder as usual. A case with a custom softmax scale (no flag gives
it) gets an empty command.

``attnbench run --from RUN_DIR --case N`` reruns case N of a run with that run's settings, where N is the
row's index in ``results.csv`` / ``results.parquet`` (0 for the first row; the ``case`` column of the report's
table). It builds the same request the row's command would. For a merged folder (`attnbench merge`), N is the row's
index in the merged file and the settings are those of the run the row came from (its ``run`` column), read from the
copy of that run's meta.json the merge kept (``merged_from``).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from attnbench.errors import UsageError
from attnbench.runner.request import DEFAULT_SUITE, RunRequest, RunSettings, build_request, default_timeout_s
from attnbench.runner.results import load_results
from attnbench.workload.axes import IMPL, MODEL, SWEEP_AXES, reproduce_flags
from attnbench.workload.suite import load_suite, model_suite

PROGRAM = ("attnbench", "run")
BY_FLAG = {axis.flag: axis.name for axis in SWEEP_AXES}


def _number(value: float) -> str:
    """A float as text that reads back as the same float (0.02, 3.0, 1e-05)."""
    return repr(float(value))


class Reproducer:
    """The ``reproduce`` command of a run's rows: the row's case flags plus the run's settings flags.

    ``settings`` None (a merged folder, a pytest-benchmark file): the case flags only. ``default_threads``
    is the thread count the run would have had without ``--threads`` (None: unknown, so always given)."""

    def __init__(self, settings: RunSettings | None, default_threads: int | None = None) -> None:
        self.settings = settings
        self.default_threads = default_threads
        self._extra: dict[bool, list[str]] = {}

    def settings_flags(self, model: bool) -> list[str]:
        """The settings flags; the defaults are the suite's that the command runs (presets with --model)."""
        if self.settings is None:
            return []
        if model not in self._extra:
            self._extra[model] = self._settings_flags(self.settings, model)
        return self._extra[model]

    def _settings_flags(self, settings: RunSettings, model: bool) -> list[str]:
        suite = model_suite() if model else load_suite(DEFAULT_SUITE)
        default = RunSettings.resolve(RunRequest(), suite, self.default_threads or 0)
        flags: list[str] = []
        if settings.seed != default.seed:
            flags += ["--seed", str(settings.seed)]
        if self.default_threads is None or settings.threads != default.threads:
            flags += ["--threads", str(settings.threads)]
        usual_timeout = default_timeout_s(settings.case_budget_s)  # what --case-budget-s below gives
        for flag, value, usual in (
            ("--budget-s", settings.budget_s, default.budget_s),
            ("--case-budget-s", settings.case_budget_s, default.case_budget_s),
            ("--timeout-s", settings.timeout_s, usual_timeout),
        ):
            if value != usual:
                flags += [flag, _number(value)]
        flags += ["--no-memory"] * (not settings.measure_memory)
        if settings.cpu_allocator != default.cpu_allocator:
            flags += ["--cpu-allocator", settings.cpu_allocator]
        if settings.isolate != default.isolate:
            flags += ["--isolate", settings.isolate]
        if settings.repeats > 1:
            flags += ["--repeat", str(settings.repeats)]
        return flags

    def flags(self, row: Any) -> list[str]:
        """The flags after ``attnbench run``; empty when the case has none (custom scale, no contender)."""
        impl = row.get(IMPL.name) if hasattr(row, "get") else None
        if not isinstance(impl, str) or not impl:
            return []
        try:
            case = reproduce_flags(row)
        except ValueError:  # a custom softmax scale: no flag gives it
            return []
        return [*case, *self.settings_flags(bool(MODEL.read(row)))]

    def __call__(self, row: Any) -> str:
        """The command as one line a shell reads back (``shlex.split`` gives the arguments)."""
        flags = self.flags(row)
        return shlex.join([*PROGRAM, *flags]) if flags else ""

    @classmethod
    def of_meta(cls, meta: dict[str, Any]) -> Reproducer:
        """The reproducer of a run folder's meta.json (settings missing: case flags only)."""
        settings = meta.get("settings")
        return cls(RunSettings.from_meta(settings) if isinstance(settings, dict) else None, meta.get("default_threads"))


def _case_number(text: str, run_dir: Path, count: int) -> int:
    try:
        number = int(str(text).strip())
    except ValueError:
        number = None
    if number is None or str(text).strip() not in (str(number), f"+{number}"):
        raise UsageError(
            f"--case {text!r}: expected a case number, 0 to {count - 1} (the row's index in {run_dir / 'results.csv'})"
        )
    if not 0 <= number < count:
        raise UsageError(f"--case {number}: out of range; {run_dir} has cases 0 to {count - 1}")
    return number


def _merged_part_meta(run_dir: str | Path, entries: list[Any], run: Any) -> dict[str, Any]:
    """The meta.json of the run a merged folder's row came from (``merged_from``: each run's name and whole
    meta.json, as `attnbench merge` keeps them), whose settings the row was timed with."""
    for entry in entries:
        if isinstance(entry, dict) and str(entry.get("run")) == str(run) and isinstance(entry.get("meta"), dict):
            return entry["meta"]
    raise UsageError(
        f"--from {run_dir}: a merged folder whose meta.json does not name the row's run {run!r} in merged_from; merge "
        "its runs again, or give the run folder the row came from"
    )


def from_run_request(run_dir: str | Path, case: str, **given: Any) -> RunRequest:
    """The request that reruns case ``case`` of ``run_dir`` with its settings: the request its row's
    ``reproduce`` command builds. ``given``: build_request's keywords the caller sets (``out``, ``progress``,
    ``store``, ``db``, ``command``)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UsageError(f"--from {run_dir}: not a folder; give an attnbench run folder")
    try:
        frame = load_results(path)
        meta = json.loads((path / "meta.json").read_text())
    except UsageError as exc:
        raise UsageError(f"--from {exc}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--from {run_dir}: not an attnbench run folder (meta.json unreadable: {exc})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"--from {run_dir}: not an attnbench run folder (meta.json is not an object)")
    if frame.empty:
        raise UsageError(f"--from {run_dir}: the run has no rows yet")
    row = frame.iloc[_case_number(case, path, len(frame))].to_dict()
    if isinstance(meta.get("merged_from"), list):
        meta = _merged_part_meta(run_dir, meta["merged_from"], row.get("run"))
    if not isinstance(meta.get("settings"), dict):
        raise UsageError(f"--from {run_dir}: meta.json has no run settings; give the run folder the row came from")
    try:
        flags = reproduce_flags(row)
    except ValueError as exc:
        raise UsageError(f"--case {case}: {exc}") from None
    axes = {BY_FLAG[flag]: text for flag, text in zip(flags[::2], flags[1::2], strict=True)}
    settings = RunSettings.from_meta(meta["settings"])
    return build_request(
        None,
        axes,
        repeat=settings.repeats,
        budget_s=settings.budget_s,
        case_budget_s=settings.case_budget_s,
        timeout_s=settings.timeout_s,
        threads=settings.threads,
        seed=settings.seed,
        memory=settings.measure_memory,
        cpu_allocator=settings.cpu_allocator,
        isolate=settings.isolate,
        **given,
    )
