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
  matmul rate, whichever is higher (see ceilings.py).

Bandwidth roof (GB/s): STREAM's triad, a[i] = b[i] + s·c[i], on three float32 arrays of
``triad_array_bytes()`` each (at least four times the last-level cache, so ≥ 12× it in all), split over
the run's threads; 12 bytes per element (two reads, one write, no write-allocate: STREAM's convention, and
the one attnbench's ``bytes`` column uses: minimum traffic, q, k, v read once, o written once).

Each figure is the best of ``REPEATS`` timed calls of about ``CALL_S`` seconds after a warm-up: a roof is
an upper bound, and on a shared machine the median would understate it (and push rows over 100 %).

``ATTNBENCH_CPU_ISA`` caps the instruction sets used, one of ``TIERS`` (e.g. ``avx2``: AVX2 FMA for
float32, and the float32 rate for half precision; ``avx512``: AVX-512 FMA but no bf16/fp16 instruction):
for testing the fallbacks, or to compare with a CPU that lacks them.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from attnbench.errors import UsageError
from attnbench.native_build import Library, cpu_flags, load_library

SOURCE = Path(__file__).with_name("hardware_kernels.cpp")
ISA_ENV = "ATTNBENCH_CPU_ISA"
TIERS = ("generic", "avx2", "avx512", "avx512_bf16", "avx512_fp16")  # each allows the ones before it
CALL_S = 0.1  # one timed call of a compute kernel
REPEATS = 5
TRIAD_REPEATS = 10
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


def _flops_rate(lib: ctypes.CDLL, code: int, threads: int) -> float:
    """FLOP/s of kernel ``code`` on ``threads`` threads: iterations sized to ~CALL_S, best of REPEATS."""
    sink = ctypes.c_double(0.0)
    iters = 1 << 12
    while True:  # calibrate (and warm up: clocks, the thread team)
        start = time.perf_counter()
        lib.attnbench_hw_flops(code, iters, threads, ctypes.byref(sink))
        seconds = time.perf_counter() - start
        if seconds >= CALL_S / 4:
            break
        iters *= 4
    iters = max(1, int(iters * CALL_S / seconds))
    best = 0.0
    for _ in range(REPEATS):
        start = time.perf_counter()
        flops = lib.attnbench_hw_flops(code, iters, threads, ctypes.byref(sink))
        best = max(best, flops / (time.perf_counter() - start))
    return best


def compute_tflops(dtypes: list[str], threads: int) -> dict[str, tuple[float, str]]:
    """Per dtype: (TFLOP/s, instruction set used) from this CPU's kernel; raises BuildError."""
    built = load()
    flags, cap = cpu_flags(), isa_cap()
    compiled = {name for name, k in KERNELS.items() if built.library.attnbench_hw_compiled(k.code)}
    rates: dict[str, float] = {}  # by kernel: bf16 without its instruction reuses the fp32 figure
    found = {}
    for dtype in dtypes:
        name, note = choose_kernel(dtype, flags, cap, compiled)
        if name not in rates:
            rates[name] = _flops_rate(built.library, KERNELS[name].code, threads) / 1e12
        threading = f"{threads} thread{'s' if threads > 1 else ''}" + ("" if built.openmp else ", no OpenMP")
        label = f"{KERNELS[name].label}, {threading}" + (f"; {note}" if note else "")
        found[dtype] = (rates[name], label)
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


def triad_array_bytes() -> int:
    return max(MIN_TRIAD_ARRAY_BYTES, 4 * last_level_cache_bytes())


def triad_gbps(threads: int, array_bytes: int | None = None) -> tuple[float, str]:
    """(GB/s, method) of the triad on three float32 arrays of ``array_bytes`` each; raises BuildError."""
    built = load()
    array_bytes = array_bytes or triad_array_bytes()
    n = array_bytes // 4
    a, b, c = torch.zeros(n), torch.full((n,), 1.0), torch.full((n,), 2.0)  # every page touched before timing
    best = 0.0
    for repeat in range(TRIAD_REPEATS + 1):  # the first call warms up
        start = time.perf_counter()
        built.library.attnbench_hw_triad(a.data_ptr(), b.data_ptr(), c.data_ptr(), 3.0, n, threads)
        seconds = time.perf_counter() - start
        if repeat > 0:
            best = max(best, 12 * n / seconds / 1e9)
    if a[n // 2].item() != 7.0:
        raise RuntimeError("the triad kernel computed a wrong result")
    threading = f"{threads} thread{'s' if threads > 1 else ''}" + ("" if built.openmp else ", no OpenMP")
    method = (
        f"triad a = b + s·c, 3 × {array_bytes / 2**20:g} MiB float32, 12 B/element (no write-allocate), {threading}"
    )
    return best, method
