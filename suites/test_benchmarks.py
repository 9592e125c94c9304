"""The suites as pytest-benchmark cases, for people who live in pytest.

Each case is checked against the float64 reference before it is timed (an incorrect contender fails
the test); unavailable or unsupported cases skip with their reason. On CUDA the timed function
synchronises, so pytest-benchmark's wall-clock timer measures the kernel, not the launch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnbench.contenders import registry
from attnbench.contenders.contract import Unsupported
from attnbench.runner.cases import not_runnable, prepare_checked
from attnbench.workload import Workload
from attnbench.workload.flops import attention_bytes


def test_attention(benchmark: Any, attnbench_case: tuple[str, Workload]) -> None:
    impl, workload = attnbench_case
    verdict = not_runnable(impl, workload)
    if verdict is not None:
        pytest.skip(f"{verdict[0]}: {verdict[1]}")
    contender = registry.get(impl).contender
    assert contender is not None
    if workload.device == "cuda" and not torch.cuda.is_available():
        pytest.skip("unavailable: torch.cuda.is_available() is False")
    try:
        prepared = prepare_checked(impl, workload)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")
    check = prepared.check
    benchmark.extra_info.update(
        impl=impl,
        **workload.as_row(),
        flops=contender.flops(workload),
        bytes=attention_bytes(workload),  # the minimum bytes, as a run's rows count them: GB/s in a report
        max_abs_err=check.max_abs_err,
        atol=check.atol,
        rtol=check.rtol,
        correct=check.ok,
        first_call_ms=prepared.first_call_ms,
        threads=torch.get_num_threads(),
    )
    assert check.ok, f"{impl} is incorrect: {check.reason}"
    fn = prepared.fn
    if workload.device == "cuda":

        def timed() -> None:
            fn()
            torch.cuda.synchronize()
    else:
        timed = fn  # type: ignore[assignment]
    benchmark(timed)
