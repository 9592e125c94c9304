"""The machine's measured ceilings: matmul rate per dtype and memory copy bandwidth, per device.

Measured once per machine and cached (``$ATTNBENCH_CACHE_DIR`` or ``~/.cache/attnbench``), keyed by
device name, thread count and torch version; ``attnbench run --remeasure-ceilings`` measures again.
Every result row is then placed on the roofline they define: ``pct_of_peak`` is the achieved FLOP/s as a
percentage of min(matmul rate, intensity × bandwidth).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils.benchmark as benchmark

from attnbench.machine import cpu_name
from attnbench.workload import DTYPES

# Square matmul sizes: big enough to reach the sustained rate, small enough to measure in about a second.
MATMUL_N = {"cpu": 2048, "cuda": 8192}
COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}


@dataclass
class Ceilings:
    device: str
    device_name: str
    threads: int
    torch_version: str
    matmul_tflops: dict[str, float] = field(default_factory=dict)
    copy_gbps: float = 0.0
    measured_at: str = ""

    def roofline_tflops(self, dtype: str, intensity: float) -> float | None:
        """Attainable TFLOP/s at this arithmetic intensity (FLOP/byte), or None if not measured."""
        peak = self.matmul_tflops.get(dtype)
        if peak is None or self.copy_gbps <= 0:
            return None
        return min(peak, intensity * self.copy_gbps / 1e3)


def cache_dir() -> Path:
    root = os.environ.get("ATTNBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attnbench"
    )
    return Path(root)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else cpu_name()


def _seconds(fn: Any, device: str, threads: int) -> float:
    """Median seconds per call: torch.utils.benchmark on CPU, CUDA events on GPU."""
    if device == "cuda":
        from attnbench.measure import _events_loop

        fn()
        return statistics.median(_events_loop(fn, 0.5)) / 1e3
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return float(timer.blocked_autorange(min_run_time=0.5).median)


def measure_matmul_tflops(device: str, dtype: str, threads: int) -> float:
    n = MATMUL_N[device]
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device, generator=generator).to(DTYPES[dtype])
    out = torch.empty(n, n, device=device, dtype=DTYPES[dtype])
    seconds = _seconds(lambda: torch.matmul(a, b, out=out), device, threads)
    return 2 * n**3 / seconds / 1e12


def measure_copy_gbps(device: str, threads: int) -> float:
    count = COPY_BYTES[device] // 4
    src = torch.ones(count, device=device)
    dst = torch.empty_like(src)
    seconds = _seconds(lambda: dst.copy_(src), device, threads)
    return 2 * COPY_BYTES[device] / seconds / 1e9  # read once, write once


def _key(device: str, threads: int) -> str:
    return f"{device}|{_device_name(device)}|threads={threads}|torch={torch.__version__}"


def load_ceilings(device: str, dtypes: list[str], threads: int, remeasure: bool = False) -> Ceilings:
    """Cached ceilings for ``device``, measuring what is missing (or everything when ``remeasure``)."""
    path = cache_dir() / "ceilings.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    key = _key(device, threads)
    found = cache.get(key)
    ceilings = Ceilings(**found) if found and not remeasure else None
    if ceilings is None:
        ceilings = Ceilings(device, _device_name(device), threads, torch.__version__)
        ceilings.copy_gbps = measure_copy_gbps(device, threads)
    missing = [d for d in dtypes if d not in ceilings.matmul_tflops]
    for dtype in missing:
        ceilings.matmul_tflops[dtype] = measure_matmul_tflops(device, dtype, threads)
    if missing or found is None or remeasure:
        ceilings.measured_at = dt.datetime.now().astimezone().isoformat()
        cache[key] = asdict(ceilings)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, indent=2) + "\n")
        except OSError:
            pass  # a read-only home still gets ceilings, just measured again next time
    return ceilings
