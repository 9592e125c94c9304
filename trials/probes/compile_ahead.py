"""A compile probe: the tuner's compiles of one case's candidate tiles for sm_90, one after another or side by
side in threads first (``impls/fused_triton/precompile.py``), on a machine without a GPU (a stand-in driver):

    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=DIR python trials/probes/compile_ahead.py forward 0   # one by one
    TRITON_CACHE_DIR=$(mktemp -d) PYTHONPATH=DIR python trials/probes/compile_ahead.py forward 2   # 2 threads

(DIR: ``pip install --target DIR triton==3.6.0 --no-deps``, the GPU machine's Triton; a fresh cache each run.)
Arguments: a ``compile_report`` case (forward, dkdv, dq, decode, mla, prefix) and the threads (0: none); case
``all`` runs ``compile_ahead`` over every case in one process, one line each (a test of the threads' safety). It prints
the seconds ``compile_ahead`` took, then those of the tuner's own compiles (each kernel's ``preload``, what its
first launch does) and how many of those compiled rather than finding the kernel compiled.
"""

from __future__ import annotations

import sys
import time

import torch
from triton.backends.nvidia import compiler as nvidia
from triton.runtime import driver

from attnbench.impls.fused_triton import compile_report, precompile


def every_case(threads: int) -> int:
    with compile_report.compiling([]):
        for case in compile_report.CASES:
            launch, candidates, _ = compile_report._case(case, 128, "none", torch.bfloat16)
            tiles = list(dict.fromkeys(candidates))
            start = time.perf_counter()
            wanted = len(precompile.record(launch, tiles))  # in memory already (an earlier case's): none
            done = precompile.compile_ahead(launch, tiles, threads=threads)
            print(f"{case}: {wanted} kernels, {done} compiled in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


def main(case: str, threads: int) -> int:
    driver.set_active(compile_report.HopperDriver())
    if case == "all":
        return every_case(threads)
    with compile_report.compiling([]):
        launch, candidates, _ = compile_report._case(case, 128, "none", torch.bfloat16)
        tiles = list(dict.fromkeys(candidates))
        wanted = precompile.record(launch, tiles)
        print(f"{case}: {len(tiles)} tiles, {len(wanted)} kernels", flush=True)
        start = time.perf_counter()
        if threads:
            done = precompile.compile_ahead(launch, tiles, threads=threads)
            print(f"{done} compiled ahead by {threads} threads in {time.perf_counter() - start:.2f} s", flush=True)
        compiled = []
        make_ttir = nvidia.CUDABackend.make_ttir  # the first stage: run only by a compile, not by a cache hit
        nvidia.CUDABackend.make_ttir = staticmethod(lambda *a, **k: compiled.append(1) or make_ttir(*a, **k))
        start = time.perf_counter()
        for specialisation in wanted:
            specialisation.kernel.preload(specialisation.data)
        print(f"the tuner's compiles: {time.perf_counter() - start:.2f} s, {len(compiled)} compiled there")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
