"""Run planned cases: availability → support → prepare → first call → correctness gate → timing → row.

Every case ends as exactly one row, whatever happens inside it; rows are appended to the run folder as
each case finishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from attnbench import registry
from attnbench.check import CheckResult, check_output
from attnbench.contender import Unsupported
from attnbench.flops import attention_flops, tflops
from attnbench.inputs import make_inputs
from attnbench.measure import call_once_ms, time_callable, warm_up
from attnbench.results import make_row
from attnbench.workload import Workload


@dataclass(frozen=True)
class RunOptions:
    budget_s: float = 1.0  # timing budget per case
    threads: int = 1
    seed: int = 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def not_runnable(impl: str, workload: Workload) -> tuple[str, str] | None:
    """(status, reason) when a case can't run here — unavailable contender or unsupported workload."""
    entry = registry.get(impl)
    if not entry.available or entry.contender is None:
        return "unavailable", entry.unavailable_reason or "not available"
    reason = entry.contender.unsupported_reason(workload)
    if reason is None and workload.pass_ != "fwd":
        reason = f"pass {workload.pass_}: timing and checking of backward passes is not in this version yet"
    return None if reason is None else ("unsupported", reason)


@dataclass(frozen=True)
class Prepared:
    """A case made ready to time: the callable, its correctness verdict and set-up costs."""

    fn: Callable[[], object]
    check: CheckResult
    setup_ms: float
    first_call_ms: float


def prepare_checked(impl: str, workload: Workload, seed: int = 0) -> Prepared:
    """Make inputs, prepare the contender, make its first call and check it against the reference.

    Raises :class:`Unsupported` or whatever the contender raises.
    """
    contender = registry.get(impl).contender
    assert contender is not None
    inputs = make_inputs(workload, seed=seed)
    start = time.perf_counter()
    fn = contender.prepare(inputs, workload)
    setup_ms = (time.perf_counter() - start) * 1e3
    first_call_ms, output = call_once_ms(fn, workload.device)  # compilation, autotuning, lazy init
    check = check_output(inputs, output)
    return Prepared(fn, check, setup_ms, first_call_ms)


def run_case(impl: str, workload: Workload, options: RunOptions) -> dict[str, Any]:
    """One (contender, workload) case to exactly one row, whatever happens inside it."""
    verdict = not_runnable(impl, workload)
    if verdict is not None:
        return make_row(impl, workload, *verdict)
    try:
        return _measure_case(impl, workload, options)
    except Unsupported as exc:
        return make_row(impl, workload, "unsupported", str(exc))
    except Exception as exc:  # a contender may fail in any way; the sweep must go on
        status = "oom" if _is_oom(exc) else "error"
        if workload.device == "cuda":
            torch.cuda.empty_cache()
        return make_row(impl, workload, status, _first_line(exc))


def _measure_case(impl: str, workload: Workload, options: RunOptions) -> dict[str, Any]:
    prepared = prepare_checked(impl, workload, options.seed)
    check = prepared.check
    warm_up(prepared.fn, workload.device, prepared.first_call_ms, options.budget_s)
    timing = time_callable(prepared.fn, workload.device, options.threads, options.budget_s)
    metrics = dict(
        median_ms=timing.median_ms, iqr_ms=timing.iqr_ms, n_samples=timing.n_samples,
        calls_per_sample=timing.calls_per_sample, samples_ms=timing.samples_ms,
        flops=attention_flops(workload), tflops=tflops(workload, timing.median_ms),
        max_abs_err=check.max_abs_err, atol=check.atol, rtol=check.rtol, checked_rows=check.checked_rows,
        setup_ms=prepared.setup_ms, first_call_ms=prepared.first_call_ms, threads=options.threads,
    )  # fmt: skip
    status = "ok" if check.ok else "incorrect"
    return make_row(impl, workload, status, check.reason, **metrics)


def run_cases(
    cases: Iterable[tuple[str, Workload]],
    options: RunOptions,
    on_row: Callable[[dict[str, Any]], None],
    on_start: Callable[[str, Workload], None] | None = None,
) -> None:
    """Run each case in order, handing every finished row to ``on_row`` at once."""
    torch.set_num_threads(options.threads)
    for impl, workload in cases:
        if on_start is not None:
            on_start(impl, workload)
        on_row(run_case(impl, workload, options))
