"""Yardsticks: short reference kernels timed in every round of a run, whose speed only the machine changes.

A comparison across runs (``compare``, ``history``) cannot tell a slower kernel from a slower minute of a
shared machine. So each interleaved round (``measure.time_cpu_rounds``) also times two kernels of
``hardware_kernels.cpp`` that never change, and every row keeps their rates measured in the same rounds as
its own samples:

* ``fma_gflops`` — the FMA-throughput kernel (the widest fp32 FMA this CPU has, as ``_hardware.py``'s
  compute roof uses), one call of about ``FMA_S`` on the run's threads: what a compute-bound case sees;
* ``stream_gbps`` — the read-stream kernel over one ``STREAM_CHUNK_BYTES`` chunk of an array of
  ``hardware.triad_array_bytes()`` (≥ 4 × the last-level cache), the next chunk each round, so the chunk
  read was evicted since its last visit and comes from memory: what a memory-bound case sees.

Both are short (a call of about ``FMA_S``, a read of ``STREAM_CHUNK_BYTES``), so they add little to a round. Their
figures are not roofs (one call, not the best of many): they move with the machine, which is the point. A
machine where the kernels cannot be built has no yardsticks; the rows' columns stay empty.

A stalled machine (a VM descheduled, another process hogging the cores) shows in them: a gpt-oss decode row
read 55.97 ms with an IQR of 0.32 ms while its FMA yardstick ran at 0.033 GFLOP/s, against 41 in a run where
the same case took 0.27 ms. A round's FMA call either runs near the quiet rate or collapses (its process
waited out another's time slice), so :meth:`Yardsticks.stalled` counts the rounds whose FMA rate fell below
``STALL_FRACTION`` of the best rate this process has seen (``quiet``: the sizing's best of three calls, then
every clean group's median): ``STALL_SHARE`` of a case's rounds or more, and at least ``STALL_ROUNDS``, is a
stall. The median rate is not the signal: a 0.5 ms call is hit less often than a contender's longer sample.
The runner (``runner._stalled``) also reads how long the case's threads waited for a core
(attnbench.measure._cpu_wait), the direct measure where Linux gives it; the yardsticks are what sees a hypervisor's
steal. Then it times the group again, and a case still stalled gets the status ``stalled`` — its time kept,
never ranked, as ``incorrect``. The stream rate is not used: memory bandwidth on a shared VM moves 24–83 GB/s
within minutes without anything stalling.

`nox -s timing_checks -- -k stall -s` (tests/test_stall.py) plants it on the 2-core Zen 4 VM, nothing else
running, two runs:
with busy loops on every core at the same priority, 29 % and 51 % of the rounds' FMA calls collapsed, the
threads waited 65–70 % of their time and every row was `stalled` (times up to 52× quiet); with the loops
niced to 19, 0–1 % of the rounds collapsed, the threads waited 0 % and every row was `ok` within 4 % of quiet.
"""

from __future__ import annotations

import ctypes
import functools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from attnbench.measure import _hardware as hardware
from attnbench.measure.native_build import BuildError, cpu_flags

FMA_S = 0.5e-3  # one FMA yardstick call lasts about this long
STREAM_CHUNK_BYTES = 4 * 2**20  # one stream yardstick call reads this much
STALL_FRACTION = 0.5  # a round whose FMA yardstick ran below this share of the quiet rate was stalled …
STALL_SHARE = 0.1  # … and a case with this share of its rounds stalled or more was timed on a stalled machine,
STALL_ROUNDS = 3  # … and no fewer than this many of them (or all, with fewer rounds): one preempted round is not it


@dataclass
class Yardsticks:
    """The two kernels, sized once for this process and thread count."""

    library: ctypes.CDLL
    fma_code: int
    fma_iters: int
    threads: int
    array: torch.Tensor  # float32, touched before timing
    chunk: int  # elements per stream call
    offset: int = 0
    quiet: dict[str, float] = field(default_factory=dict)  # the best rate seen: sizing, then clean groups

    def stalled(self, rounds: Mapping[str, list[float]]) -> str | None:
        """Why a case whose rounds gave these yardstick rates was timed on a stalled machine, or None: its FMA
        rate fell below ``STALL_FRACTION`` of the quiet one in ``STALL_SHARE`` of its rounds or more, and in at
        least ``STALL_ROUNDS`` of them (all, when it had fewer)."""
        rates, quiet = rounds.get("fma_gflops"), self.quiet.get("fma_gflops")
        if not rates or not quiet:
            return None
        low = sum(rate < STALL_FRACTION * quiet for rate in rates)
        if low < max(STALL_SHARE * len(rates), min(STALL_ROUNDS, len(rates))):
            return None
        median = statistics.median(rates)
        return (
            f"the machine stalled while it was timed (twice): its FMA yardstick ran below {STALL_FRACTION:.0%} "
            f"of its quiet {quiet:.3g} GFLOP/s in {low} of {len(rates)} rounds (median {median:.3g}); "
            "time kept, not ranked"
        )

    def saw(self, rates: Mapping[str, float]) -> None:
        """A clean case's rates raise the quiet ones."""
        for name, rate in rates.items():
            self.quiet[name] = max(self.quiet.get(name, 0.0), rate)

    def fma_gflops(self) -> float:
        sink = ctypes.c_double(0.0)
        start = time.perf_counter()
        flops = self.library.attnbench_hw_flops(self.fma_code, self.fma_iters, self.threads, ctypes.byref(sink))
        return flops / (time.perf_counter() - start) / 1e9

    def stream_gbps(self) -> float:
        sink = ctypes.c_double(0.0)
        pointer = self.array.data_ptr() + 4 * self.offset
        start = time.perf_counter()
        self.library.attnbench_hw_read(pointer, self.chunk, self.threads, ctypes.byref(sink))
        seconds = time.perf_counter() - start
        self.offset = (self.offset + self.chunk) % (self.array.numel() - self.chunk + 1)
        return 4 * self.chunk / seconds / 1e9

    def callables(self) -> dict[str, Callable[[], float]]:
        """Name → a call that times the kernel once and returns its rate (GFLOP/s or GB/s)."""
        return {"fma_gflops": self.fma_gflops, "stream_gbps": self.stream_gbps}


def _fma_iters(library: ctypes.CDLL, code: int, threads: int) -> int:
    """Iterations for a call of about FMA_S on ``threads`` threads (the least of 3 calls, to skip preemption)."""
    sink = ctypes.c_double(0.0)

    def seconds(iters: int) -> float:
        start = time.perf_counter()
        library.attnbench_hw_flops(code, iters, threads, ctypes.byref(sink))
        return time.perf_counter() - start

    iters = 256
    while iters < 1 << 30:
        fastest = min(seconds(iters) for _ in range(3))
        if fastest >= FMA_S / 2:
            break
        iters *= 2
    return iters


@functools.cache
def for_threads(threads: int, array_bytes: int | None = None) -> Yardsticks | None:
    """This process's yardsticks on ``threads`` threads (built once), or None where the kernels can't be built or
    their array does not fit (a memory cap)."""
    try:
        built = hardware.load()
    except BuildError:
        return None
    library = built.library
    compiled = {name for name, k in hardware.KERNELS.items() if library.attnbench_hw_compiled(k.code)}
    name, _ = hardware.choose_kernel("float32", cpu_flags(), hardware.isa_cap(), compiled)
    code = hardware.KERNELS[name].code
    elements = (array_bytes or hardware.triad_array_bytes()) // 4
    chunk = min(STREAM_CHUNK_BYTES // 4, elements)
    try:
        array = torch.full((elements,), 0.5)  # every page touched before timing
    except (RuntimeError, MemoryError):  # 4× a large last-level cache past an address-space cap (RLIMIT_AS): the
        return None  # case runs without yardsticks (a cgroup's cap kills the process on touching pages instead)
    sticks = Yardsticks(library, code, _fma_iters(library, code, threads), threads, array, chunk)
    sticks.saw({"fma_gflops": max(sticks.fma_gflops() for _ in range(3))})
    return sticks
