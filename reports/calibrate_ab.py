"""Calibrate ``attnbench ab`` on this machine: how often it cries wolf, how often it catches a slowdown.

``python -m attnbench.reports.calibrate_ab`` (part of ``nox -s calibrate``; ``nox -s calibrate_ab`` alone)
runs a small sweep (bmm and sdpa_flash at B1 H8 S256/S512 D64, none/causal: 8 cases) in one process:

* A/A — each contender against itself prepared twice (``X`` vs ``X (b)``), ``--aa-passes`` times over
  the sweep (default 13: 104 decisions); every ``faster`` or ``slower`` is a false alarm;
* detection — each contender against itself made ×1.05, ×1.10 and ×1.25 slower by *real work*
  (:class:`Slowed`: after the attention, a loop of small fp32 matmuls whose cost was measured in
  ``prepare`` to be that fraction of the attention's own median — CPU work that competes for the same
  cores and caches, as a slower kernel would; not a sleep), ``--slow-passes`` times (default 4: 32
  cases per factor); every case not called ``slower`` is a miss.

It prints the false-alarm rate, the detection rate per factor with the median ratio actually measured
(what the injected work came to), and the seconds a case took. The bars on a quiet 2-core VM: no false
alarm in ≥ 100 decisions, ×1.05 caught in ≥ 90 % of cases, ×1.10 in all, each case under 10 s. It
times things, so it is not a test; run it on a quiet machine and put its output in docs/ab.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from attnbench.contenders import registry
from attnbench.contenders.contract import Contender
from attnbench.runner.ab import DEFAULT_BUDGET_S, DEFAULT_THRESHOLD, AbOptions, Version, run_case
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs

FACTORS = (1.05, 1.10, 1.25)
CONTENDERS = ("bmm", "sdpa_flash")
WORKLOADS = [
    Workload(1, 8, 8, seq, seq, 64, "float32", "cpu", mask, "fwd") for seq in (256, 512) for mask in ("none", "causal")
]
MATMUL_SIZES = (16, 32, 64, 128)  # the extra work's square fp32 matmuls; the largest that fits 4× in the target


def _median_s(fn: Callable[[], object], samples: int = 15, least_s: float = 0.005) -> float:
    """Median seconds per call over ``samples`` blocks of back-to-back calls lasting ``least_s`` or more."""
    fn()
    times = []
    for _ in range(samples):
        calls, start, elapsed = 0, time.perf_counter(), 0.0
        while elapsed < least_s:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
        times.append(elapsed / calls)
    return statistics.median(times)


def extra_work(target_s: float) -> Callable[[], None]:
    """A loop of small matmuls lasting about ``target_s`` (measured here, corrected once)."""
    x = torch.randn(MATMUL_SIZES[0], MATMUL_SIZES[0])
    for size in MATMUL_SIZES:
        candidate = torch.randn(size, size)
        if _median_s(functools.partial(torch.mm, candidate, candidate)) * 4 > target_s:
            break
        x = candidate
    out = torch.empty_like(x)
    reps = [max(1, round(target_s / _median_s(lambda: torch.mm(x, x, out=out))))]

    def run() -> None:
        for _ in range(reps[0]):
            torch.mm(x, x, out=out)

    reps[0] = max(1, round(reps[0] * target_s / _median_s(run)))  # the loop's own overhead, corrected once
    return run


class Slowed(Contender):
    """``base`` made ``factor`` times slower by real work after each call (see the module docstring)."""

    def __init__(self, base: Contender, factor: float) -> None:
        self.base, self.factor = base, factor
        self.name = f"{base.name}_x{factor:g}"
        self.capabilities = base.capabilities
        self.description = f"{base.name}, then matmuls costing {factor - 1:.0%} of its median"

    def unsupported_reason(self, workload: Workload) -> str | None:
        return self.base.unsupported_reason(workload)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        attention = self.base.prepare(inputs, workload)
        extra = extra_work((self.factor - 1) * _median_s(attention))

        def run() -> torch.Tensor:
            out = attention()
            extra()
            return out

        return run


def decide(kind: str, factor: float, a: Version, b: Version, options: AbOptions) -> list[dict[str, object]]:
    """Every workload of the sweep once: one record per case with its verdict and how long it took."""
    records = []
    for workload in WORKLOADS:
        start = time.perf_counter()
        case = run_case(a, b, workload, options)
        seconds = time.perf_counter() - start
        ratio = case.paired.ratio if case.paired else None
        records.append(
            {
                "kind": kind,
                "factor": factor,
                "impl": a.name,
                "workload": workload.label(),
                "verdict": case.verdict,
                "ratio": ratio,
                "seconds": seconds,
                "reason": case.reason,
            }
        )
        shown = f"{ratio:.3f}" if ratio is not None else case.reason
        print(
            f"{kind} ×{factor:.2f} {a.name:<10} {workload.label():<38} {case.verdict:<8} {shown} ({seconds:.1f} s)",
            flush=True,
        )
    return records


def summarise(frame: pd.DataFrame) -> list[str]:
    """The lines docs/ab.md quotes: false alarms, detection per factor, time per case."""
    lines = []
    aa = frame[frame["kind"] == "A/A"]
    decided = aa[aa["verdict"].isin(["faster", "slower", "same", "unclear"])]
    alarms = int(decided["verdict"].isin(["faster", "slower"]).sum())
    counts = ", ".join(f"{v} {n}" for v, n in decided["verdict"].value_counts().items())
    lines.append(
        f"A/A: {len(decided)} decisions, {alarms} false alarm(s) = {alarms / max(len(decided), 1):.1%} ({counts})"
    )
    for factor in FACTORS:
        slowed = frame[(frame["kind"] == "slowed") & (frame["factor"] == factor)]
        if slowed.empty:
            continue
        caught = int((slowed["verdict"] == "slower").sum())
        measured = slowed["ratio"].median()
        lines.append(
            f"slowdown ×{factor:.2f}: {caught}/{len(slowed)} cases caught = {caught / len(slowed):.1%}; "
            f"median measured ratio {measured:.3f}"
        )
    seconds = frame["seconds"]
    lines.append(
        f"seconds per case: median {seconds.median():.1f}, max {seconds.max():.1f} "
        f"({len(frame)} cases, {torch.get_num_threads()} threads)"
    )
    return lines


def rates(frame: pd.DataFrame) -> dict[str, str]:
    """The figures of the combined calibration table (reports.calibrate): false alarms, detection per factor."""
    aa = frame[(frame["kind"] == "A/A") & frame["verdict"].isin(["faster", "slower", "same", "unclear"])]
    alarms = int(aa["verdict"].isin(["faster", "slower"]).sum())
    found = {"A/A false alarms": f"{alarms}/{len(aa)} = {alarms / max(len(aa), 1):.1%}"}
    for factor in FACTORS:
        slowed = frame[(frame["kind"] == "slowed") & (frame["factor"] == factor)]
        caught = int((slowed["verdict"] == "slower").sum())
        found[f"×{factor:.2f}"] = f"{caught}/{len(slowed)} = {caught / max(len(slowed), 1):.0%}" if len(slowed) else ""
    return found


def calibrate_ab(contenders: list[str], aa_passes: int, slow_passes: int, budget_s: float) -> pd.DataFrame:
    """Every decision of the A/A passes and the slowed passes (the module docstring), one record each."""
    options = AbOptions(DEFAULT_THRESHOLD, budget_s, torch.get_num_threads(), 0)
    records: list[dict[str, object]] = []
    for name in contenders:
        contender = registry.get(name).contender
        assert contender is not None
        same = Version(name, contender, "registered")
        for _ in range(aa_passes):
            records += decide("A/A", 1.0, same, Version(f"{name} (b)", contender, "registered"), options)
        for factor in FACTORS:
            slowed = Version(f"{name}×{factor:g}", Slowed(contender, factor), "calibration")
            for _ in range(slow_passes):
                records += decide("slowed", factor, same, slowed, options)
    return pd.DataFrame(records)


def main(argv: list[str] | None = None) -> int:
    prog, description = "python -m attnbench.reports.calibrate_ab", __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--aa-passes", type=int, default=13, help="A/A passes over the 8-case sweep (default 13)")
    parser.add_argument("--slow-passes", type=int, default=4, help="passes per slowdown factor (default 4)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="timing seconds per case")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated (default bmm,sdpa_flash)")
    parser.add_argument("--out", help="write every decision to this CSV file")
    args = parser.parse_args(argv)
    frame = calibrate_ab(args.contenders.split(","), args.aa_passes, args.slow_passes, args.budget_s)
    if args.out:
        frame.to_csv(Path(args.out), index=False)
    print()
    print("\n".join(summarise(frame)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
