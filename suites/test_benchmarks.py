"""The suites as pytest-benchmark cases, for people who live in pytest.

Each case is checked against the float64 reference before it is timed (an incorrect contender fails
the test); unavailable or unsupported cases skip with their reason. On CUDA the timed function
synchronises, so pytest-benchmark's wall-clock timer measures the kernel, not the launch.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from attnbench.contenders import registry
from attnbench.contenders.contract import Unsupported
from attnbench.measure._ceilings import Ceilings, load_ceilings
from attnbench.runner.cases import not_runnable, prepare_checked
from attnbench.workload import Workload
from attnbench.workload.flops import attention_bytes


@functools.cache
def _ceilings(device: str, dtypes: tuple[str, ...], threads: int) -> Ceilings:
    """This machine's roofs, as `attnbench run` measures and caches them (measured once per machine)."""
    return load_ceilings(device, list(dtypes), threads)


def _roofs(workload: Workload, flops: float, traffic: float) -> dict[str, float | None]:
    """The hardware roof and torch's matmul roof at the case's intensity, TFLOP/s: a report of the JSON file reads
    the row's ``pct_of_peak`` and ``pct_of_matmul`` from them, as a run's rows have them."""
    dots = workload.compute_dtype  # an fp8 forward: the fp8 roofs
    ceilings = _ceilings(workload.device, tuple(sorted({workload.dtype, dots})), torch.get_num_threads())
    intensity = flops / traffic
    return {
        "roof_tflops": ceilings.roofline_tflops(dots, intensity),
        "matmul_roof_tflops": ceilings.matmul_roofline_tflops(dots, intensity),
    }


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
    flops, traffic = contender.flops(workload), attention_bytes(workload)
    benchmark.extra_info.update(
        impl=impl,
        **workload.as_row(),
        flops=flops,
        bytes=traffic,  # the minimum bytes, as a run's rows count them: GB/s in a report
        **_roofs(workload, flops, traffic),
        max_abs_err=check.max_abs_err,
        rms_err=check.rms_err,
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
