"""``attnbench.run()``: a sweep from Python (a notebook, a script), returning the results frame.

It is ``attnbench run`` without the shell: the arguments build the same :class:`attnbench.runner.request.RunRequest`
the command builds from its flags, checked by the same code, so a bad value raises
:class:`attnbench.UsageError` with the message the command prints. Every axis of ``attnbench.workload.axes`` is a
keyword: one value, a list (``seq=[256, 512]``) or the flag's comma-separated text; ``pass_`` is the ``pass``
axis (``pass`` is a Python keyword), as in :class:`attnbench.Workload`.

``suite=None`` runs one sweep of the axes given, the rest defaulting as ``attnbench profile`` does
(B=1, H=8, S=1024, D=64, float32, cpu, no mask, forward; every contender), with a 1 s timing budget per
case; ``suite="quick"`` (or a .toml path) runs that suite with the axes given replacing its own.

A run folder is written only when ``out`` is given; otherwise the sweep runs in a temporary folder that is
removed before the call returns. Contenders added with :func:`attnbench.register` run in the worker
process too when their class can be imported as ``module:qualname``; otherwise the call raises a
UsageError saying why, and ``isolate="none"`` runs them in this process.
"""

from __future__ import annotations

import difflib
import inspect
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.workload.axes import MODEL, SWEEP_AXES

if TYPE_CHECKING:
    import pandas as pd

Axis = Any  # one value, a list of them, or comma-separated text; checked by the axis table
BY_KEYWORD = {axis.keyword: axis for axis in SWEEP_AXES}


def run(
    suite: str | None = None,
    *,
    threads: int | None = None,
    budget_s: float | None = None,
    case_budget_s: float | None = None,
    timeout_s: float | None = None,
    repeat: int = 1,
    seed: int = 0,
    memory: bool = True,
    cpu_allocator: str = "cached",
    out: str | Path | None = None,
    isolate: str = "worker",
    progress: str = "auto",
    **axes: Axis,
) -> pd.DataFrame:
    """Run a sweep and return its results: the run's columns (``attnbench.runner.results.COLUMNS``), one row per case.

    Arguments are those of ``attnbench run`` (``memory=False`` is ``--no-memory``); see the module docstring.
    Raises :class:`attnbench.UsageError` on bad input, before anything runs or is written, and
    KeyboardInterrupt after saving the finished rows when the sweep is interrupted.
    """
    from attnbench.runner import sweep
    from attnbench.runner.request import build_request
    from attnbench.workload.suite import profile_suite

    for name in axes:
        if name not in BY_KEYWORD:
            raise TypeError(f"run() got an unexpected keyword argument {name!r}{_meant(name)}")
    axes = {name: plain(value) for name, value in axes.items()}
    given = {BY_KEYWORD[name].name: value for name, value in axes.items() if value is not None}
    settings: dict[str, Any] = {
        "threads": plain(threads),
        "budget_s": plain(budget_s),
        "case_budget_s": plain(case_budget_s),
        "timeout_s": plain(timeout_s),
        "repeat": plain(repeat),
        "seed": plain(seed),
        "cpu_allocator": cpu_allocator,
        "isolate": isolate,
        "progress": progress,
    }
    memory = plain(memory)
    named = {
        "suite": suite,
        **{a.keyword: axes.get(a.keyword) for a in SWEEP_AXES},
        **settings,
        "memory": memory,
        "out": out,
    }
    command = f"attnbench.run({', '.join(f'{k}={v!r}' for k, v in named.items() if v is not None)})"
    blank = suite is None and MODEL.name not in given
    with tempfile.TemporaryDirectory(prefix="attnbench-run-") as scratch:
        target = Path(out) if out is not None else Path(scratch) / "run"
        request = build_request(
            profile_suite("notebook", "attnbench.run() without a suite") if blank else suite,
            given,
            memory=memory,
            out=target,
            command=command,
            **settings,
        )
        finished = sweep.run_sweep(request, target)
        said = len(finished.warnings)  # run_sweep said these; the results' own (stalled, unstable…) follow
        for warning in sweep.late_warnings(finished)[said:]:  # and go into meta.json, as `attnbench run` does
            print(f"warning: {warning}", file=sys.stderr)
    if finished.interrupted:
        saved = f"; finished rows are saved in {target}" if out is not None else ""
        raise KeyboardInterrupt(f"attnbench.run was interrupted{saved}")
    return finished.frame


def _meant(name: str) -> str:
    """What an unknown keyword may have meant: the axis whose results column it is (``seq_q`` is ``seq``'s), or
    a keyword close to it; else the keywords."""
    by_column = {axis.workload_field: axis.keyword for axis in SWEEP_AXES if axis.workload_field != axis.keyword}
    if name in by_column:
        return f": the results column {name} is set by {by_column[name]}= (e.g. {by_column[name]}=[256, 512])"
    settings = [p for p in inspect.signature(run).parameters if p not in ("suite", "axes")]
    close = difflib.get_close_matches(name, [*BY_KEYWORD, *settings], n=1)
    if close:
        return f"; did you mean {close[0]}=?"
    return f"; the axes: {', '.join(BY_KEYWORD)}"


def plain(value: Any) -> Any:
    """A notebook's values as the request takes them: a numpy (or torch) scalar as its Python number, any other
    iterable but text as a list (``seq=np.arange(256, 1025, 256)``, ``seq=range(…)``, ``threads=np.int64(4)``: the
    first two were refused as not integers, the last failed mid-run writing rows.jsonl, leaving half a run folder)."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return value
    return [plain(item) for item in value]


# help(attnbench.run) and editors show every axis as a keyword, as the table has them.
_signature = inspect.signature(run)
_parameters = list(_signature.parameters.values())
_axis_parameters = [
    inspect.Parameter(a.keyword, inspect.Parameter.KEYWORD_ONLY, default=None, annotation="Axis") for a in SWEEP_AXES
]
run.__signature__ = _signature.replace(  # type: ignore[attr-defined]
    parameters=[_parameters[0], *_axis_parameters, *_parameters[1:-1]]
)
