"""The CPU's hardware roofs, measured by our own kernels (``hardware_kernels.cpp``), not by a library.

Compute roof (TFLOP/s per dtype): the rate of the widest arithmetic instruction this CPU has for that
dtype, run as many independent accumulator chains (12 on AVX2, 16 on AVX-512) on each of the run's threads
at once, so latency is hidden and the execution ports are full. FLOPs count 2 per lane per fused
multiply-add (16 fp32 / 8 fp64 lanes on AVX-512, 8 / 4 on AVX2); AVX512-BF16's ``vdpbf16ps`` adds two
bf16 products into each of 16 fp32 lanes: 4 FLOP per lane; AVX512-FP16's ``vfmadd…ph`` has 32 lanes.

- float32 / float64: AVX-512 FMA where the CPU has ``avx512f``, else AVX2 FMA (``avx2`` and ``fma``),
  else a plain loop the compiler vectorises as it can (``generic``).
- bfloat16: ``vdpbf16ps`` where the CPU has ``avx512_bf16``; float16: ``vfmadd…ph`` where it has
  ``avx512_fp16``; else the float32 kernel (a CPU without them computes half-precision in fp32). AMX
  tiles are not measured: on an AMX CPU the half-precision roof is then the dot-product rate or torch's
  matmul rate, whichever is higher (see _ceilings.py).

On more than one thread the figure is the higher of the team's rate and one thread's × the physical
cores the team spans (``physical_cores``: SMT siblings count once): FMA throughput adds up across cores,
and on a shared machine a moment when every core is free is rarer than one when a single core is.

Bandwidth roof (GB/s): STREAM's triad, a[i] = b[i] + s·c[i], on three float32 arrays of
``triad_array_bytes()`` each (at least four times the last-level cache, so ≥ 12× it in all), split over
the run's threads (or one thread, where that is faster: more threads never have less bandwidth); 12
bytes per element (two reads, one write, no write-allocate: STREAM's convention, and
the one attnbench's ``bytes`` column uses: minimum traffic, q, k, v read once, o written once). Also a
read stream (the sum of one array of twice that size, 4 bytes per element): a workload that
only reads — decode reading its KV cache — can beat the triad, and the roof is the higher of the two.

Each figure is the best of many timed calls after a warm-up (compute: calls of about ``CALL_S`` for
``MEASURE_S``; triad: ``TRIAD_REPEATS`` passes): a roof is an upper bound, and on a shared machine the
median would understate it (and push rows over 100 %).

``ATTNBENCH_CPU_ISA`` caps the instruction sets used, one of ``TIERS`` (e.g. ``avx2``: AVX2 FMA for
float32, and the float32 rate for half precision; ``avx512``: AVX-512 FMA but no bf16/fp16 instruction):
for testing the fallbacks, or to compare with a CPU that lacks them.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnbench.errors import UsageError
from attnbench.measure.native_build import Library, cpu_flags, load_library

SOURCE = Path(__file__).with_name("hardware_kernels.cpp")
ISA_ENV = "ATTNBENCH_CPU_ISA"
TIERS = ("generic", "avx2", "avx512", "avx512_bf16", "avx512_fp16")  # each allows the ones before it
CALL_S = 0.002  # one timed call of a compute kernel: shorter than a scheduler time slice
MEASURE_S = 0.5  # calls of one compute kernel are repeated for this long
MIN_CALLS = 20
TRIAD_REPEATS = 20
MIN_TRIAD_ARRAY_BYTES = 64 * 2**20
DEFAULT_LLC_BYTES = 32 * 2**20  # when the cache size can't be read


@dataclass(frozen=True)
class Kernel:
    """One compute kernel of hardware_kernels.cpp: its code there, what it is, what it needs."""

    code: int  # the Isa enum value in hardware_kernels.cpp
    label: str  # the instruction set, as recorded
    flags: frozenset[str]  # CPU flags it needs (/proc/cpuinfo names)
    tier: str  # the least ATTNBENCH_CPU_ISA that allows it


KERNELS = {
    "generic_f32": Kernel(0, "generic c++ fp32 (compiler-vectorised, 12 chains)", frozenset(), "generic"),
    "avx2_f32": Kernel(1, "avx2 fma fp32 (8 lanes, 12 chains)", frozenset({"avx2", "fma"}), "avx2"),
    "avx512_f32": Kernel(2, "avx512f fma fp32 (16 lanes, 16 chains)", frozenset({"avx512f"}), "avx512"),
    "avx512_bf16": Kernel(
        3, "avx512_bf16 vdpbf16ps (16 fp32 lanes × 2 products, 16 chains)", frozenset({"avx512_bf16"}), "avx512_bf16"
    ),
    "avx512_fp16": Kernel(4, "avx512_fp16 vfmadd ph (32 lanes, 16 chains)", frozenset({"avx512_fp16"}), "avx512_fp16"),
    "generic_f64": Kernel(5, "generic c++ fp64 (compiler-vectorised, 12 chains)", frozenset(), "generic"),
    "avx2_f64": Kernel(6, "avx2 fma fp64 (4 lanes, 12 chains)", frozenset({"avx2", "fma"}), "avx2"),
    "avx512_f64": Kernel(7, "avx512f fma fp64 (8 lanes, 16 chains)", frozenset({"avx512f"}), "avx512"),
}
FP32 = ("avx512_f32", "avx2_f32", "generic_f32")
# Per dtype, the kernels to try, best first; a half-precision dtype's own instruction, then the fp32 rate.
CHOICES = {
    "float32": FP32,
    "float64": ("avx512_f64", "avx2_f64", "generic_f64"),
    "bfloat16": ("avx512_bf16", *FP32),
    "float16": ("avx512_fp16", *FP32),
}
OWN_INSTRUCTION = {"bfloat16": "avx512_bf16", "float16": "avx512_fp16"}


def isa_cap() -> str:
    """The highest tier ``ATTNBENCH_CPU_ISA`` allows (all of them when unset)."""
    value = os.environ.get(ISA_ENV, "").strip()
    if not value:
        return TIERS[-1]
    if value not in TIERS:
        raise UsageError(f"{ISA_ENV}={value!r} is not known; allowed: {', '.join(TIERS)}")
    return value


def load() -> Library:
    """The built kernels library (BuildError with the reason when it can't be built here)."""
    built = load_library("hardware_kernels", SOURCE)
    lib = built.library
    lib.attnbench_hw_compiled.restype = ctypes.c_int
    lib.attnbench_hw_compiled.argtypes = [ctypes.c_int]
    lib.attnbench_hw_flops.restype = ctypes.c_double
    lib.attnbench_hw_flops.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_double)]
    lib.attnbench_hw_triad.restype = ctypes.c_int
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.attnbench_hw_triad.argtypes = [ptr, ptr, ptr, ctypes.c_float, i64, i64]
    lib.attnbench_hw_read.restype = ctypes.c_int
    lib.attnbench_hw_read.argtypes = [ptr, i64, i64, ctypes.POINTER(ctypes.c_double)]
    return built


def choose_kernel(dtype: str, flags: frozenset[str], cap: str, compiled: set[str]) -> tuple[str, str]:
    """(kernel name, note) for ``dtype``: the first of its choices that the CPU has, ATTNBENCH_CPU_ISA
    allows and the compiler built. The note says why a half-precision dtype got the fp32 rate."""
    allowed = set(TIERS[: TIERS.index(cap) + 1])
    for name in CHOICES[dtype]:
        kernel = KERNELS[name]
        if kernel.flags <= flags and kernel.tier in allowed and name in compiled:
            own = OWN_INSTRUCTION.get(dtype)
            if own is None or name == own:
                return name, ""
            if not KERNELS[own].flags <= flags:
                why = f"no {own} on this CPU"
            elif KERNELS[own].tier not in allowed:
                why = f"{ISA_ENV}={cap}"
            else:
                why = f"the compiler has no {own}"
            return name, f"the fp32 rate: {why}"
    raise RuntimeError(f"no compute kernel for {dtype}")  # generic is always compiled and allowed


def usable_cpus() -> int:
    """The logical CPUs this process may run on (its affinity; SMT siblings each count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def physical_cores() -> int:
    """Distinct physical cores among the CPUs this process may run on (SMT siblings counted once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            cores.add((str(cpu), ""))
    return max(1, len(cores))


def _best_rate(lib: ctypes.CDLL, code: int, iters: int, threads: int) -> float:
    """The best FLOP/s of calls of ``iters`` iterations on ``threads`` threads, made for MEASURE_S."""
    sink = ctypes.c_double(0.0)
    best, calls, deadline = 0.0, 0, time.perf_counter() + MEASURE_S
    while calls < MIN_CALLS or time.perf_counter() < deadline:
        start = time.perf_counter()
        flops = lib.attnbench_hw_flops(code, iters, threads, ctypes.byref(sink))
        best = max(best, flops / (time.perf_counter() - start))
        calls += 1
    return best


def _flops_rate(lib: ctypes.CDLL, code: int, threads: int) -> tuple[float, str]:
    """(FLOP/s, how) of kernel ``code`` on ``threads`` threads: the higher of the team's best call and one
    thread's best call × the physical cores the team spans (FMA throughput adds up across cores, and on a
    shared machine a moment when every core of a team is free is rarer than one when a single core is).
    Calls of about CALL_S, many of them: a call no other process interrupts shows the hardware's rate."""
    sink = ctypes.c_double(0.0)

    def seconds(iters: int) -> float:
        start = time.perf_counter()
        lib.attnbench_hw_flops(code, iters, 1, ctypes.byref(sink))
        return time.perf_counter() - start

    iters = 1 << 10
    while True:  # size the calls on one thread, warming up the clocks; the least of 3 ignores preemption
        fastest = min(seconds(iters) for _ in range(3))
        if fastest >= CALL_S or iters >= 1 << 40:
            break
        iters *= 2 if fastest >= CALL_S / 8 else 8
    team = _best_rate(lib, code, iters, threads)
    if threads == 1:
        return team, "1 thread"
    cores = min(threads, physical_cores())
    single = _best_rate(lib, code, iters, 1)
    how = f"{threads} threads (team {team / 1e9:.4g} GFLOP/s, one thread × {cores} cores {single * cores / 1e9:.4g})"
    return max(team, single * cores), how


def compute_tflops(dtypes: list[str], threads: int) -> dict[str, tuple[float, str]]:
    """Per dtype: (TFLOP/s, instruction set used) from this CPU's kernel; raises BuildError."""
    built = load()
    flags, cap = cpu_flags(), isa_cap()
    compiled = {name for name, k in KERNELS.items() if built.library.attnbench_hw_compiled(k.code)}
    rates: dict[str, tuple[float, str]] = {}  # by kernel: bf16 without its instruction reuses the fp32 figure
    found = {}
    for dtype in dtypes:
        name, note = choose_kernel(dtype, flags, cap, compiled)
        if name not in rates:
            rates[name] = _flops_rate(built.library, KERNELS[name].code, threads)
        rate, how = rates[name]
        omp = "" if built.openmp else ", no OpenMP"
        found[dtype] = (rate / 1e12, f"{KERNELS[name].label}, {how}{omp}" + (f"; {note}" if note else ""))
    return found


def last_level_cache_bytes() -> int:
    """The largest cache of CPU 0 (/sys/devices/system/cpu/cpu0/cache), else DEFAULT_LLC_BYTES."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=DEFAULT_LLC_BYTES)


def _last_level_sharing(cpu: int) -> str | None:
    """The CPUs that share ``cpu``'s last-level cache (sysfs' shared_cpu_list of its highest level), or None."""
    best: tuple[int, str] | None = None
    for index in Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*"):
        try:
            level, shared = int((index / "level").read_text()), (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        if best is None or level > best[0]:
            best = (level, shared)
    return best[1] if best else None


def last_level_caches_used(threads: int) -> int:
    """How many last-level caches ``threads`` threads may spread over: the distinct ones among the CPUs this
    process may run on (a server CPU has one per chiplet), at most ``threads``; 1 where sysfs does not say. A
    flush must fill every one of them: a pass split across threads fills each cache with only its threads' part."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return 1
    domains = {shared for cpu in cpus if (shared := _last_level_sharing(cpu)) is not None}
    return max(1, min(threads, len(domains)))


def triad_array_bytes() -> int:
    return max(MIN_TRIAD_ARRAY_BYTES, 4 * last_level_cache_bytes())


def _best_gbps(
    run: Callable[[int], object], bytes_per_call: int, threads: int, openmp: bool, passes: int | None = None
) -> tuple[float, str]:
    """The best GB/s of ``run(team)`` over ``passes`` (default TRIAD_REPEATS) passes after a warm-up pass, on
    ``threads`` threads and on one (more threads never have less bandwidth), and how: "N threads (one thread: …)"."""
    best = {threads: 0.0, 1: 0.0}
    for repeat in range((passes or TRIAD_REPEATS) + 1):  # the first pass warms up
        for team in best:
            start = time.perf_counter()
            run(team)
            seconds = time.perf_counter() - start
            if repeat > 0:
                best[team] = max(best[team], bytes_per_call / seconds / 1e9)
    how = f"{threads} threads (one thread: {best[1]:.3g} GB/s)" if threads > 1 else "1 thread"
    return max(best.values()), how + ("" if openmp else ", no OpenMP")


def streams_gbps(
    threads: int, array_bytes: int | None = None, passes: int | None = None
) -> tuple[tuple[float, str], tuple[float, str]]:
    """((GB/s, method) of the triad on three float32 arrays of ``array_bytes`` each, (GB/s, method) of the read
    stream), each the best of ``passes`` (default TRIAD_REPEATS); raises BuildError. One allocation: the read
    stream sums the triad's b and c, adjacent (2 × ``array_bytes``). Where the last-level cache is large (a
    server's whole L3, e.g. 260 MiB: arrays of 1 GiB), allocating and touching the arrays costs more than their
    passes; this touches 3 arrays' worth, where a buffer for each stream would touch 5."""
    built = load()
    array_bytes = array_bytes or triad_array_bytes()
    buffer = _stream_arrays(array_bytes // 4)
    return _triad(built, buffer, threads, passes), _read(built, buffer[array_bytes // 4 :], threads, passes)


def _stream_arrays(n: int) -> torch.Tensor:
    """The triad's a, b, c, ``n`` float32 each, in one buffer: 0, 1, 2 (every page touched before timing)."""
    buffer = torch.empty(3 * n)
    buffer[:n].zero_(), buffer[n : 2 * n].fill_(1.0), buffer[2 * n :].fill_(2.0)
    return buffer


def _triad(built: Library, buffer: torch.Tensor, threads: int, passes: int | None) -> tuple[float, str]:
    n = buffer.numel() // 3
    a, b, c = buffer[:n], buffer[n : 2 * n], buffer[2 * n :]
    pointers = a.data_ptr(), b.data_ptr(), c.data_ptr()
    gbps, how = _best_gbps(
        lambda team: built.library.attnbench_hw_triad(*pointers, 3.0, n, team), 12 * n, threads, built.openmp, passes
    )
    if a[n // 2].item() != 7.0:
        raise RuntimeError("the triad kernel computed a wrong result")
    return gbps, f"triad a = b + s·c, 3 × {4 * n / 2**20:g} MiB float32, 12 B/element (no write-allocate), {how}"


def _read(built: Library, array: torch.Tensor, threads: int, passes: int | None) -> tuple[float, str]:
    """The read stream over ``array``: ones, then as many twos (the triad's b and c)."""
    n, half = array.numel(), array.numel() // 2
    sink = ctypes.c_double(0.0)
    gbps, how = _best_gbps(
        lambda team: built.library.attnbench_hw_read(array.data_ptr(), n, team, ctypes.byref(sink)),
        4 * n,
        threads,
        built.openmp,
        passes,
    )
    if sink.value != half * 1.0 + (n - half) * 2.0:
        raise RuntimeError("the read kernel computed a wrong sum")
    return gbps, f"read stream Σ a, {4 * n / 2**20:g} MiB float32, 4 B/element, {how}"
