"""A compile probe: the tuner's compiles of one case's candidate tiles for sm_90, one after another or in worker
processes first (``impls/fused_triton/precompile.py``), on a machine without a GPU (a stand-in Triton driver):

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=DIR python trials/probes/compile_ahead.py forward 0   # one by one
    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=DIR python trials/probes/compile_ahead.py forward 2   # 2 workers

(DIR: ``pip install --target DIR triton==3.6.0 --no-deps``, the GPU machine's Triton; a fresh cache each run.)
Arguments: a ``compile_report`` case (forward, dkdv, dq, decode, mla, prefix) and the workers (0: none). It prints
the seconds the workers took and then the tuner's own compiles (each kernel's ``preload``, what its first launch
does), and how many of those compiled instead of loading from the cache (0 when the workers named each alike).
"""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import compiler as nvidia
from triton.runtime import driver

from attnbench.impls.fused_triton import compile_report, precompile

SM90 = {"backend": "cuda", "arch": 90, "warp_size": 32}


class Driver(precompile._StandInDriver):
    def get_current_stream(self, device: Any = None) -> int:
        return 0


def main(case: str, workers: int) -> int:
    driver.set_active(Driver(GPUTarget(**SM90)))
    with compile_report.compiling([]):
        launch, candidates, _ = compile_report._case(case, 128, "none", torch.bfloat16)
        tiles = list(dict.fromkeys(candidates))
        kernels = precompile.record(launch, tiles)
        print(f"{case}: {len(tiles)} tiles, {len(kernels)} kernels", flush=True)
        start = time.perf_counter()
        if workers:
            done = precompile.compile_ahead(launch, tiles, workers=workers, target=SM90)
            print(f"{done} compiled by {workers} workers in {time.perf_counter() - start:.2f} s", flush=True)
        compiled = []
        make_ttir = nvidia.CUDABackend.make_ttir  # the first stage: run only by a compile, not by a cache hit
        nvidia.CUDABackend.make_ttir = staticmethod(lambda *a, **k: compiled.append(1) or make_ttir(*a, **k))
        start = time.perf_counter()
        for kernel in kernels:
            getattr(importlib.import_module(kernel["module"]), kernel["name"]).preload(kernel["data"])
        print(f"the tuner's compiles: {time.perf_counter() - start:.2f} s, {len(compiled)} not from the cache")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
