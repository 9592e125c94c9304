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
from attnbench.check import check_output
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


def run_case(impl: str, workload: Workload, options: RunOptions) -> dict[str, Any]:
    """One (contender, workload) case to one row."""
    entry = registry.get(impl)
    if not entry.available:
        return make_row(impl, workload, "unavailable", entry.unavailable_reason or "not available")
    contender = entry.contender
    assert contender is not None
    reason = contender.unsupported_reason(workload)
    if reason is None and workload.pass_ != "fwd":
        reason = f"pass {workload.pass_}: timing and checking of backward passes is not in this version yet"
    if reason is not None:
        return make_row(impl, workload, "unsupported", reason)
    try:
        return _measure_case(impl, workload, contender.prepare, options)
    except Unsupported as exc:
        return make_row(impl, workload, "unsupported", str(exc))
    except Exception as exc:  # a contender may fail in any way; the sweep must go on
        status = "oom" if _is_oom(exc) else "error"
        if workload.device == "cuda":
            torch.cuda.empty_cache()
        return make_row(impl, workload, status, _first_line(exc))


def _measure_case(impl: str, workload: Workload, prepare: Callable[..., Any], options: RunOptions) -> dict[str, Any]:
    inputs = make_inputs(workload, seed=options.seed)
    start = time.perf_counter()
    fn = prepare(inputs, workload)
    setup_ms = (time.perf_counter() - start) * 1e3
    first_call_ms, output = call_once_ms(fn, workload.device)  # compilation, autotuning, lazy init
    check = check_output(inputs, output)
    del output
    warm_up(fn, workload.device, first_call_ms, options.budget_s)
    timing = time_callable(fn, workload.device, options.threads, options.budget_s)
    metrics = dict(
        median_ms=timing.median_ms, iqr_ms=timing.iqr_ms, n_samples=timing.n_samples,
        calls_per_sample=timing.calls_per_sample, samples_ms=timing.samples_ms,
        flops=attention_flops(workload), tflops=tflops(workload, timing.median_ms),
        max_abs_err=check.max_abs_err, atol=check.atol, rtol=check.rtol, checked_rows=check.checked_rows,
        setup_ms=setup_ms, first_call_ms=first_call_ms, threads=options.threads,
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
