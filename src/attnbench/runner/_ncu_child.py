"""The process ``attnbench profile --ncu`` runs under Nsight Compute: one case, its calls in a profiled range.

ncu must start the process it profiles, so the profile command starts a fresh interpreter under ``ncu
--profile-from-start off`` (see :mod:`attnbench.runner._ncu_profile`) as ``python -c BOOTSTRAP PATH CASE``: the
parent's import path (so contenders registered by ``module:qualname`` import as they do there; never the
caller's main module, as for the worker) and the case as JSON. The child prepares and checks the case as a
run does (:func:`attnbench.runner.cases.prepare_checked`, same seed, same inputs), warms it up outside the range,
then makes ``calls`` calls between ``cudaProfilerStart`` and ``cudaProfilerStop``: ncu collects those calls'
kernels and nothing else (not the inputs, the reference check or the warm-up).

A case it cannot run ends it with exit code 1 and one line on stderr starting with :data:`FAILED`, which the
parent shows as the reason.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from attnbench.runner._ncu_child import main; sys.exit(main(sys.argv[2:]))"
)
FAILED = "attnbench ncu child: "
WARM_UP_BUDGET_S = 0.5  # as warm_up sizes it: three calls after the first unless one call is this long


@dataclasses.dataclass(frozen=True)
class ChildCase:
    impl: str
    workload: dict[str, Any]  # dataclasses.asdict(Workload): every field, so the child's Workload is equal
    seed: int
    calls: int
    references: tuple[str, ...] = ()  # module:qualname of contenders registered in the parent

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildCase:
        data = json.loads(text)
        return cls(data["impl"], data["workload"], int(data["seed"]), int(data["calls"]), tuple(data["references"]))


def profiled_calls(
    fn: Callable[[], object], calls: int, sync: Callable[[], None], start: Callable[[], None], stop: Callable[[], None]
) -> None:
    """``calls`` calls of ``fn`` inside the profiled range: the device idle when it opens, every call's work
    finished before it closes (so no kernel of the calls falls outside it, and nothing else falls inside)."""
    sync()
    start()
    try:
        for _ in range(calls):
            fn()
        sync()
    finally:
        stop()


def _fail(message: str) -> int:
    print(FAILED + " ".join(message.split()), file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    case = ChildCase.from_json(argv[0])
    import torch

    from attnbench.contenders.registry import load, register_reference
    from attnbench.measure.stopwatch import synchronize, warm_up
    from attnbench.runner.cases import prepare_checked
    from attnbench.workload import Workload

    load()
    for reference in case.references:
        register_reference(reference)
    workload = Workload(**case.workload)
    try:
        prepared = prepare_checked(case.impl, workload, case.seed)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        return _fail(f"{case.impl} could not be prepared: {type(exc).__name__}: {lines[0] if lines else ''}")
    if not prepared.ok:
        return _fail(f"{case.impl} is incorrect on {workload.label()}: {prepared.reason}")
    warm_up(prepared.fn, workload.device, prepared.first_call_ms, WARM_UP_BUDGET_S)
    profiled_calls(
        prepared.fn,
        case.calls,
        lambda: synchronize(workload.device),
        torch.cuda.profiler.start,
        torch.cuda.profiler.stop,
    )
    return 0
