"""The machine's ceilings per device: the hardware roof every row is placed under, and the library's rates.

- ``roof_tflops[dtype]``, ``roof_gbps``: the hardware roofline. CPU: the throughput of this CPU's widest
  FMA or dot-product instruction and STREAM-triad bandwidth, measured by attnbench's own kernels
  (_hardware.py); GPU: the vendor's datasheet (_datasheet.py) where the device is known, else the measured
  rates below. ``roof_source`` / ``bandwidth_source`` say which, with the instruction set used, or
  ``fallback: … (reason)`` when the kernels could not be built here. A roof is an upper bound, so on CPU
  it is the higher of the kernel's and torch's matmul rate (torch may use units the kernel does not,
  such as AMX tiles); its source then says so.
- ``matmul_tflops[dtype]``, ``copy_gbps``: torch's own large matmul and device copy, measured: what "as
  fast as the library" means.

``pct_of_peak`` = achieved TFLOP/s ÷ ``roofline_tflops`` (the hardware roof: min(compute roof, intensity ×
bandwidth roof)); ``pct_of_matmul`` = achieved ÷ ``matmul_roofline_tflops`` (the same with torch's matmul
and copy rates). A row above 100 % of the hardware roof is a measurement defect — unless it is bandwidth-bound
and its bytes fit in the cache in front of memory (``cache_bytes``; the row's ``cache_resident``): its warm calls
read them from the cache.

Measured once per machine and cached (``$ATTNBENCH_CACHE_DIR`` or ``~/.cache/attnbench``), keyed by
device name, thread count and torch version; ``attnbench run --remeasure-ceilings`` measures again.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.utils.benchmark as benchmark

from attnbench.measure import _datasheet as datasheet
from attnbench.measure import _hardware as hardware
from attnbench.measure.environment import cpu_name
from attnbench.measure.native_build import BuildError, cache_dir
from attnbench.measure.stopwatch_cuda import median_ms

__all__ = ["Ceilings", "cache_dir", "load_ceilings"]

# Square matmul sizes: big enough to reach the sustained rate, small enough to measure in about a second.
MATMUL_N = {"cpu": 2048, "cuda": 8192}
COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}
CACHE_VERSION = 3  # bumped when fields are added: older entries are measured again


def _torch_dtype(name: str) -> torch.dtype:
    """torch's dtype of that name (``float32``, ``bfloat16`` …): read from torch itself, so the measure room
    needs nothing from the workload's vocabulary."""
    dtype = getattr(torch, name)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


@dataclass
class Ceilings:
    device: str
    device_name: str
    threads: int
    torch_version: str
    matmul_tflops: dict[str, float] = field(default_factory=dict)  # torch's matmul, per dtype
    copy_gbps: float = 0.0  # torch's device copy (read + write)
    roof_tflops: dict[str, float] = field(default_factory=dict)  # hardware compute roof, per dtype
    roof_gbps: float = 0.0  # hardware bandwidth roof
    roof_source: dict[str, str] = field(default_factory=dict)  # per dtype: how the compute roof was found
    bandwidth_source: str = ""
    kernel_tflops: dict[str, float] = field(default_factory=dict)  # CPU: attnbench's FMA kernel, per dtype
    triad_gbps: float | None = None  # CPU: attnbench's triad kernel
    read_gbps: float | None = None  # CPU: attnbench's read-stream kernel
    measured_at: str = ""
    # the largest cache in front of the bandwidth roof (CPU: the last level; GPU: L2), read on every load: a
    # memory-bound row whose bytes fit in it can read them from there, faster than the roof (cache_resident)
    cache_bytes: int = 0

    def cache_resident(self, traffic_bytes: float, dtype: str, intensity: float) -> bool:
        """Whether a row of ``traffic_bytes`` at ``intensity`` is bandwidth-bound on the hardware roofline and
        its bytes fit in ``cache_bytes``: warm calls then read them from the cache, not from memory."""
        roof = self.roofline_tflops(dtype, intensity)
        bound = roof is not None and roof < self.roof_tflops[dtype]  # under the bandwidth slope, left of the ridge
        return bool(bound and 0 < traffic_bytes <= self.cache_bytes)

    def roofline_tflops(self, dtype: str, intensity: float) -> float | None:
        """The hardware roof at this arithmetic intensity (FLOP/byte), in TFLOP/s; None if not measured."""
        return _roofline(self.roof_tflops.get(dtype), self.roof_gbps, intensity)

    def matmul_roofline_tflops(self, dtype: str, intensity: float) -> float | None:
        """The library's roof at this intensity: min(torch's matmul rate, intensity × torch's copy rate)."""
        return _roofline(self.matmul_tflops.get(dtype), self.copy_gbps, intensity)


def _roofline(peak: float | None, gbps: float, intensity: float) -> float | None:
    if peak is None or gbps <= 0:
        return None
    return min(peak, intensity * gbps / 1e3)


def _cache_bytes(device: str) -> int:
    """The largest cache in front of ``device``'s memory: a GPU's L2 (0 where torch does not say), else the CPU's
    last level."""
    if device != "cuda":
        return hardware.last_level_cache_bytes()
    try:
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    except (AssertionError, RuntimeError):  # no CUDA torch (a test's stand-in GPU): no cache to name
        return 0
    return int(getattr(properties, "L2_cache_size", 0) or 0)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else cpu_name()


def _seconds(fn: Any, device: str, threads: int) -> float:
    """Seconds per call: the median of CUDA events on GPU; on CPU the fastest block of torch.utils.benchmark
    (a rate the library reaches: on a shared CPU the median measures the neighbours too)."""
    if device == "cuda":
        fn()
        return median_ms(fn, 0.5) / 1e3
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return float(min(timer.blocked_autorange(min_run_time=0.5).times))


def measure_matmul_tflops(device: str, dtype: str, threads: int) -> float:
    """torch's matmul rate for ``dtype`` on ``device``, TFLOP/s. An fp8 type: ``torch._scaled_mm`` (bf16 out,
    unit scales), or 0.0 (no rate, so no roof from it) where there is none: a CPU, a GPU without fp8 tensor
    cores, a torch without the call."""
    fp8 = dtype.startswith("float8")
    if fp8 and device != "cuda":
        return 0.0
    n = MATMUL_N[device]
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(_torch_dtype(dtype))
    b = torch.randn(n, n, device=device, generator=generator).to(_torch_dtype(dtype))
    if fp8:
        one = torch.ones((), device=device)
        try:
            seconds = _seconds(
                lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device, threads
            )
        except (RuntimeError, TypeError, AttributeError):
            return 0.0
    else:
        out = torch.empty(n, n, device=device, dtype=_torch_dtype(dtype))
        seconds = _seconds(lambda: torch.matmul(a, b, out=out), device, threads)
    return 2 * n**3 / seconds / 1e12


def measure_copy_gbps(device: str, threads: int) -> float:
    count = COPY_BYTES[device] // 4
    src = torch.ones(count, device=device)
    dst = torch.empty_like(src)
    seconds = _seconds(lambda: dst.copy_(src), device, threads)
    return 2 * COPY_BYTES[device] / seconds / 1e9  # read once, write once


def _cpu_compute_roofs(ceilings: Ceilings, dtypes: list[str]) -> None:
    """roof_tflops for ``dtypes``: the FMA kernel's rate, or torch's matmul where that is higher or the
    kernel can't be built (the reason recorded)."""
    try:
        measured = hardware.compute_tflops(dtypes, ceilings.threads)
    except (BuildError, OSError, RuntimeError) as exc:
        for dtype in dtypes:
            ceilings.roof_tflops[dtype] = ceilings.matmul_tflops[dtype]
            ceilings.roof_source[dtype] = f"fallback: matmul ({exc})"
        return
    for dtype in dtypes:
        rate, isa = measured[dtype]
        ceilings.kernel_tflops[dtype] = rate
        matmul = ceilings.matmul_tflops[dtype]
        if matmul > rate:
            ceilings.roof_tflops[dtype] = matmul
            ceilings.roof_source[dtype] = f"measured matmul: faster than the fma kernel ({isa}: {rate:.3g} TFLOP/s)"
        else:
            ceilings.roof_tflops[dtype] = rate
            ceilings.roof_source[dtype] = f"measured fma kernel: {isa}"


def _cpu_bandwidth_roof(ceilings: Ceilings) -> None:
    """roof_gbps: the highest of the triad, the read stream and torch's copy (a roof bounds every workload:
    one that only reads, as decode does, beats the triad); triad_gbps kept on its own (STREAM's figure)."""
    try:
        (ceilings.triad_gbps, method), (ceilings.read_gbps, read_method) = hardware.streams_gbps(ceilings.threads)
    except (BuildError, OSError, RuntimeError) as exc:
        ceilings.roof_gbps, ceilings.bandwidth_source = ceilings.copy_gbps, f"fallback: copy ({exc})"
        return
    rates = {"triad": (ceilings.triad_gbps, method), "read": (ceilings.read_gbps, read_method)}
    best = max(rates, key=lambda name: rates[name][0])
    others = "; ".join(f"{how}: {gbps:.3g} GB/s" for name, (gbps, how) in rates.items() if name != best)
    if ceilings.copy_gbps > rates[best][0]:
        both = "; ".join(f"{how}: {gbps:.3g} GB/s" for gbps, how in rates.values())
        ceilings.roof_gbps = ceilings.copy_gbps
        ceilings.bandwidth_source = f"measured copy: faster than the triad and read streams ({both})"
    else:
        ceilings.roof_gbps = rates[best][0]
        ceilings.bandwidth_source = f"measured {rates[best][1]} ({others})"


def _gpu_roofs(ceilings: Ceilings, dtypes: list[str]) -> None:
    """The datasheet's peaks where the device is known, else the measured matmul and copy rates."""
    sheet = datasheet.lookup(ceilings.device_name)
    for dtype in dtypes:
        if sheet is not None and dtype in sheet.tflops:
            ceilings.roof_tflops[dtype] = sheet.tflops[dtype]
            ceilings.roof_source[dtype] = f"datasheet {sheet.name} (dense {dtype})"
        else:
            ceilings.roof_tflops[dtype] = ceilings.matmul_tflops[dtype]
            why = "device not in the datasheet table" if sheet is None else f"no {dtype} figure for {sheet.name}"
            ceilings.roof_source[dtype] = f"measured matmul ({why})"
    if sheet is not None:
        ceilings.roof_gbps, ceilings.bandwidth_source = sheet.gbps, f"datasheet {sheet.name}"
    else:
        ceilings.roof_gbps, ceilings.bandwidth_source = (
            ceilings.copy_gbps,
            "measured copy (device not in the datasheet table)",
        )


def _key(device: str, threads: int) -> str:
    key = f"{device}|{_device_name(device)}|threads={threads}|torch={torch.__version__}|v{CACHE_VERSION}"
    cap = hardware.isa_cap()  # a UsageError for an unknown ATTNBENCH_CPU_ISA, before anything is measured
    return key if device != "cpu" or cap == hardware.TIERS[-1] else f"{key}|isa={cap}"


def _from_cache(found: Any) -> Ceilings | None:
    try:
        return Ceilings(**found)
    except TypeError:
        return None  # written by another attnbench version: measure again


def load_ceilings(device: str, dtypes: list[str], threads: int, remeasure: bool = False) -> Ceilings:
    """Cached ceilings for ``device``, measuring what is missing (or everything when ``remeasure``)."""
    path = cache_dir() / "ceilings.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    key = _key(device, threads)
    found = cache.get(key)
    ceilings = _from_cache(found) if isinstance(found, dict) and not remeasure else None
    fresh = ceilings is None
    if ceilings is None:
        ceilings = Ceilings(device, _device_name(device), threads, torch.__version__)
    missing = [d for d in dtypes if d not in ceilings.matmul_tflops or d not in ceilings.roof_tflops]
    if missing or fresh:  # else a first run sits silent through it (about 18 s on a 2-vCPU Xeon) before any progress
        what = f"{device} ceilings" + (f" on {threads} thread{'s' * (threads != 1)}" if device == "cpu" else "")
        print(f"attnbench: measuring this machine's {what} (cached in {path}) …", file=sys.stderr)
    if fresh:
        ceilings.copy_gbps = measure_copy_gbps(device, threads)
    for dtype in missing:
        ceilings.matmul_tflops[dtype] = measure_matmul_tflops(device, dtype, threads)
    if device == "cuda":
        _gpu_roofs(ceilings, sorted(ceilings.matmul_tflops))
    elif missing:
        _cpu_compute_roofs(ceilings, missing)
    if fresh and device != "cuda":
        _cpu_bandwidth_roof(ceilings)
    ceilings.cache_bytes = _cache_bytes(device)
    if missing or fresh:
        ceilings.measured_at = dt.datetime.now().astimezone().isoformat()
        cache[key] = asdict(ceilings)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, indent=2) + "\n")
        except OSError:
            pass  # a read-only home still gets ceilings, just measured again next time
    return ceilings
