"""A compile probe: the SASS instruction counts of a fused_triton kernel, the whole kernel and each loop.

``compile_report`` reads registers, shared memory and the PTX's products; this reads the machine code
(``cuobjdump -sass``, shipped with Triton's NVIDIA backend) of the same compile: the kernel's instruction count,
then each loop (a backward branch's range) with its count and the opcodes named, e.g. the byte-wise shared
loads (``LDS.U8``) an fp8 cache's decode made of its value tile (docs/kernels.md, session 23):

    PYTHONPATH=DIR python trials/probes/sass_counts.py decode float8_e4m3fn 16,64,4,2 16,128,4,3

(DIR: ``pip install --target DIR triton==3.6.0 --no-deps``, the GPU machine's Triton.) Arguments: a
``compile_report`` case (decode, mla, prefix, forward), the cache's dtype, then tiles "BLOCK_M,BLOCK_N,WARPS,STAGES".
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton

from attnbench.impls.fused_triton import compile_report, decode_kernels, forward_kernels

NAMED = ("LDS.U8", "LDS.64", "LDS.128", "STS.128", "LDSM.16.M88.4", "LDSM.16.MT88.4", "SEL", "F2FP.F16.E4M3.UNPACK_B")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,5})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);")


def sass(cubin: bytes) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each instruction of the cubin's kernel."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        text = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _INSTRUCTION.finditer(text)]


def loops(code: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last) addresses of each backward branch's range, in the kernel's order."""
    spans = []
    for address, opcode, operands in code:
        target = re.search(r"0x([0-9a-f]+)", operands) if opcode == "BRA" else None
        if target and int(target.group(1), 16) < address:
            spans.append((int(target.group(1), 16), address))
    return spans


def line(counts: collections.Counter[str]) -> str:
    named = ", ".join(f"{op} {counts[op]}" for op in NAMED if counts[op])
    return f"{sum(counts.values())} instructions" + (f" ({named})" if named else "")


def main(argv: list[str]) -> int:
    case, dtype, tiles = argv[0], getattr(torch, argv[1]), argv[2:] or ["16,64,4,2"]
    targets = [
        (forward_kernels, "_forward_kernel"),
        (decode_kernels, "_decode_split_kernel"),
        (decode_kernels, "_decode_merge_kernel"),
    ]
    print(f"sm_90 SASS by Triton {triton.__version__}: {case}, {argv[1]}", flush=True)
    for spec in tiles:
        with compile_report.compiling(targets) as compiled:
            launch, _, name = compile_report._case(case, 128, "none", dtype)
            launch(compile_report._tile(spec))
            code = sass(compiled.pop(name).asm["cubin"])
        print(f"{spec:>12}  kernel: {line(collections.Counter(op for _, op, _ in code))}")
        for first, last in loops(code):
            body = collections.Counter(op for address, op, _ in code if first <= address <= last)
            print(f"{'':>12}  loop {first:#x}-{last:#x}: {line(body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
