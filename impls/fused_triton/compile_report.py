"""What Triton's compiler makes of fused_triton's kernels for a Hopper GPU (sm_90), on a machine without one.

``python -m attnbench.impls.fused_triton.compile_report --case mla`` compiles the kernel a case launches with
each tile forced (default: the tiles the tuner would time on an H100) and prints, per tile, what decides its
speed before any GPU runs it:

* registers per thread and stack bytes (register spills), read from the cubin by ``cuobjdump -res-usage``
  (shipped with Triton's NVIDIA backend);
* the shared memory the compiler allots (the tuner prunes by ``tiles.shared_bytes``, an estimate);
* the tensor-core instructions: Hopper's ``wgmma`` by shape (m64nNk16: N is the product's width per
  warpgroup) and where its first operand comes from (``reg``: registers, ``smem``: a shared-memory
  descriptor), or Ampere's ``mma.sync`` where a tile is below wgmma's 64 rows;
* the ``wgmma.wait_group`` depths: 0 means each product is waited for as soon as it is issued, so no MMA
  runs beside the softmax (FlashAttention-3 keeps one in flight);
* the ``cp.async.wait_group`` depths, where k and v are copied by ``cp.async`` (not by tensor descriptors):
  how many groups of copies stay in flight while a block's copy is waited for. Only 0 means the next block's
  copy is not under way while this one is computed: with ``num_stages`` 2 Triton keeps one buffer, whose
  next copy it issues after the products that read it and waits for at the top of the next iteration, so a
  program alone on its SM (MLA's) waits out the memory's latency every block;
* how many programs an SM holds at once and what bounds it (registers, shared memory or warps), from the
  figures above and Hopper's limits (``programs_per_sm``): with one, nothing else runs while it waits.

A line ends with ptxas's performance advisories where it gives any (``ptxas -v`` on the PTX again: Triton keeps
none): ``C7514``/``C7515`` say it serialised the kernel's wgmma (an accumulator read or written between a product's
issue and its wait), so a wait depth above 0 keeps no product in flight after all. Where this Triton's ptxas cannot
assemble its own PTX (3.9's bundled one is older than its PTX), nothing is said.

The figures are the installed Triton's; the GPU may run another version (this project's GPU machine: Triton
3.6.0). To compile with that one on a CPU machine: ``pip install --target DIR triton==X --no-deps`` and run
with ``PYTHONPATH=DIR``. ``compile_for`` is also what ``tests/test_fused_triton_compile.py`` compiles with.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from attnbench.impls.fused_triton.tiles import Tile

HOPPER_SHARED = 232448  # an H100's / H200's opt-in shared memory per block (227 KiB)
# What an sm_90 SM holds at once (CUDA's occupancy rules): 64 K registers, given a warp 256 at a time; 228 KiB of
# shared memory, each resident block reserving 1 KiB of it; 64 warps; 32 blocks
SM_REGISTERS = 65536
SM_SHARED = 233472
BLOCK_RESERVED_SHARED = 1024
SM_WARPS = 64
SM_BLOCKS = 32
_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e5m2: "fp8e5",
}
CASES = ("forward", "dkdv", "dq", "decode", "mla", "prefix")
BACKWARD = {"dkdv": "_dkdv_kernel", "dq": "_dq_kernel"}  # the backward's cases and their kernels
PREFIX_LEVEL = "[PREFIX]"  # after the split kernel's name: its compile for a shared prefix's level


def compile_for(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], capability: int = 90) -> Any:
    """Compile the jitted ``fn`` for a CUDA GPU of ``capability`` (default sm_90), specialised as Triton's
    launcher would for these arguments: 16-byte aligned pointers, integers of 1 and None as constants,
    multiples of 16 marked divisible."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type
    from triton.tools.tensor_descriptor import TensorDescriptor

    options = {"num_warps": kwargs.pop("num_warps", 4), "num_stages": kwargs.pop("num_stages", 3)}
    values = {**dict(zip(fn.arg_names, args, strict=False)), **kwargs}
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for index, name in enumerate(fn.arg_names):
        value = values[name]
        if name in kwargs or value is None or (isinstance(value, int) and value == 1):
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, TensorDescriptor):  # as the launcher names it: its dtype and block shape
            signature[name] = mangle_type(value)
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


class SkippedLaunch:
    """Stands in for a jitted kernel whose launches do nothing (a kernel before or beside the one compiled)."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class CompiledLaunch:
    """Stands in for a jitted kernel: each launch (``kernel[grid](...)``) compiles it for sm_90 instead of
    running it, into ``into`` under the kernel's name (what the tests and ``compiling`` patch in); the decode
    split kernel's launch for a shared prefix's level under its name and ``PREFIX_LEVEL``."""

    def __init__(self, fn: Any, into: dict[str, Any]) -> None:
        self.fn = fn
        self.into = into

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            name = self.fn.__name__ + (PREFIX_LEVEL if kwargs.get("PREFIX") else "")
            self.into[name] = compile_for(self.fn, args, dict(kwargs))

        return launch


@contextlib.contextmanager
def compiling(targets: Sequence[tuple[Any, str]], skipped: Sequence[tuple[Any, str]] = ()) -> Iterator[dict[str, Any]]:
    """Within it, launches of the kernels ``(module, name)`` become sm_90 compiles, collected by kernel name, and
    launches of the ``skipped`` ones do nothing; fused_triton's launchers take the CUDA path (not the
    interpreter's), as on a Hopper GPU: 132 SMs, 227 KiB of shared memory per block (the tuner's candidates as
    there)."""
    from attnbench.impls.fused_triton import decode, flash

    compiled: dict[str, Any] = {}
    patches: list[tuple[Any, str, Any]] = [
        (module, name, CompiledLaunch(getattr(module, name), compiled)) for module, name in targets
    ]
    patches += [(module, name, SkippedLaunch()) for module, name in skipped]
    patches += [(flash, "INTERPRETED", False), (flash, "is_hopper", lambda device: True)]
    patches += [(decode, "sm_count", lambda device: 132)]
    patches += [(module, "max_shared_memory", lambda device: HOPPER_SHARED) for module in (flash, decode)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        yield compiled
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


class HopperDriver:
    """What a launch asks of Triton's driver, as on a Hopper GPU: device 0, a stream, the sm_90 target. Set as
    the active driver (``triton.runtime.driver.set_active``), launches of the real kernels go through Triton's
    launcher up to the compile on a machine without a GPU (``precompile.record`` and its checks)."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@dataclasses.dataclass(frozen=True)
class Report:
    """What one compiled kernel holds (``inspect``)."""

    registers: int | None  # per thread; None without cuobjdump
    stack_bytes: int | None  # register spills land here
    shared_bytes: int
    wgmma: dict[str, int]  # "m64n128k16 smem" → count
    mma_sync: int
    waits: dict[int, int]  # wgmma.wait_group depth → count
    copy_waits: dict[int, int]  # cp.async.wait_group depth (copy groups left in flight) → count
    warps: int = 4
    advisories: tuple[str, ...] = ()  # ptxas's "Potential Performance Loss" codes (C7514, …), where it gave any

    def line(self) -> str:
        products = ", ".join(f"{count}× {shape}" for shape, count in sorted(self.wgmma.items()))
        if self.mma_sync:
            products = ", ".join(filter(None, [products, f"{self.mma_sync}× mma.sync"]))
        waits = ", ".join(f"{depth}: {count}" for depth, count in sorted(self.waits.items())) or "none"
        copies = ", ".join(f"{depth}: {count}" for depth, count in sorted(self.copy_waits.items())) or "none"
        regs = "?" if self.registers is None else self.registers
        stack = "?" if self.stack_bytes is None else self.stack_bytes
        resources = f"regs {regs}, stack {stack} B, shared {self.shared_bytes} B"
        held = programs_per_sm(self.registers, self.warps, self.shared_bytes)
        an_sm = "? an SM" if held is None else f"{held[0]} an SM ({held[1]})"
        line = f"{resources} | {products} | wait_group {waits} | cp.async wait_group {copies} | {an_sm}"
        return line + (f" | ptxas: wgmma serialised ({', '.join(self.advisories)})" if self.advisories else "")


def programs_per_sm(registers: int | None, warps: int, shared_bytes: int) -> tuple[int, str] | None:
    """How many programs of a kernel (``registers`` a thread, ``warps`` warps, ``shared_bytes``) an sm_90 SM holds
    at once, and what bounds it first: 'registers', 'shared', 'warps' or 'blocks' (None without the registers)."""
    if registers is None:
        return None
    per_warp = -(-registers * 32 // 256) * 256
    limits = {
        "registers": SM_REGISTERS // (per_warp * warps),
        "shared": SM_SHARED // (shared_bytes + BLOCK_RESERVED_SHARED),
        "warps": SM_WARPS // warps,
        "blocks": SM_BLOCKS,
    }
    bound = min(limits, key=lambda name: limits[name])  # on a tie, the first named
    return limits[bound], bound


def inspect(kernel: Any) -> Report:
    """The ``Report`` of a kernel compiled by ``compile_for``."""
    ptx = kernel.asm["ptx"]
    wgmma: collections.Counter[str] = collections.Counter()
    for match in re.finditer(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\S*\s+\{[^}]*\},\s*(\{|%rd)", ptx):
        wgmma[f"{match.group(1)} {'reg' if match.group(2) == '{' else 'smem'}"] += 1
    waits = collections.Counter(int(d) for d in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx))
    copy_waits = collections.Counter(int(d) for d in re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx))
    registers, stack = _resources(kernel.asm.get("cubin"))
    return Report(
        registers,
        stack,
        int(kernel.metadata.shared),
        dict(wgmma),
        len(re.findall(r"mma\.sync\.aligned", ptx)),
        dict(waits),
        dict(copy_waits),
        int(kernel.metadata.num_warps),
        advisories(_ptxas_log(ptx)),
    )


def advisories(log: str) -> tuple[str, ...]:
    """The codes of ptxas's "Potential Performance Loss" lines in ``log`` (``ptxas -v``'s output), in order, each
    once: ``C7514``/``C7515`` are its wgmma serialisations."""
    found = re.findall(r"\((C\d+)\) Potential Performance Loss", log)
    return tuple(dict.fromkeys(found))


def _ptxas_log(ptx: str) -> str:
    """What Triton's ptxas says of ``ptx`` with -v for its target (sm_90a), '' where it cannot assemble it."""
    target = re.search(r"^\.target\s+(\S+)", ptx, flags=re.MULTILINE)
    if target is None:
        return ""
    done = _run_tool("ptxas", "kernel.ptx", ptx.encode(), [f"-arch={target.group(1)}", "-v", "-o", "kernel.cubin"])
    return done.stderr if done is not None and done.returncode == 0 else ""


def _resources(cubin: bytes | None) -> tuple[int | None, int | None]:
    """(registers, stack bytes) of the cubin's kernel from ``cuobjdump -res-usage``; (None, None) without it."""
    done = _run_tool("cuobjdump", "kernel.cubin", cubin, ["-res-usage"]) if cubin else None
    found = re.search(r"REG:(\d+) STACK:(\d+)", done.stdout) if done is not None else None
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def _run_tool(name: str, file: str, content: bytes, args: list[str]) -> subprocess.CompletedProcess[str] | None:
    """Triton's bundled NVIDIA tool ``name`` (ptxas, cuobjdump) run in a scratch folder on ``content`` written to
    ``file`` (its path last on the command line), as text; None where Triton ships no such tool."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(tool):
        return None
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, file), "wb") as handle:
            handle.write(content)
        return subprocess.run([tool, *args, file], cwd=folder, capture_output=True, text=True, check=False)


def _case(case: str, head_dim: int, mask: str, kv_dtype: torch.dtype) -> tuple[Callable[[Tile], None], Any, str]:
    """(launch with a tile forced, the plan, the kernel's name) for one of ``CASES``: the shapes the suites time
    (forward, and the backward's dkdv and dq: B8 H16 S8192 bf16; decode: Llama-3.1-8B's B8 H32/8 D128 over 8192
    keys; mla: DeepSeek-V3's 128 heads over a 576/512 latent cache of 8192 keys, B8; prefix: the serving suite's
    shared prefix, B32 H32/8 D128 over 16384 + 256 keys, the prefix's level: a kv head's rows of every
    sequence). Tensors are empty: nothing runs."""
    from attnbench.impls.fused_triton import flash

    if case == "forward":
        q = torch.empty(8, 16, 8192, head_dim, dtype=torch.bfloat16)
        k, v = torch.empty_like(q), torch.empty_like(q)
        plan, kernel, name = flash.make_plan(q, k, v, mask=mask), "fwd", "_forward_kernel"
    elif case in BACKWARD:
        q = torch.empty(8, 16, 8192, head_dim, dtype=torch.bfloat16)
        k, v = torch.empty_like(q), torch.empty_like(q)
        plan, kernel, name = flash.make_plan(q, k, v, mask=mask), case, BACKWARD[case]
        lse = torch.empty(8, 16, 8192, dtype=torch.float32)
        other = "dq" if case == "dkdv" else "dkdv"

        def backward(tile: Tile) -> None:  # the other kernel's launch is skipped: any of its tiles will do
            plan.tiles[kernel], plan.tiles[other] = tile, plan.candidates(other)[0]
            flash.backward_grads(q, k, v, q, lse, q, plan)

        return backward, plan.candidates(kernel), name
    elif case == "decode":
        q = torch.empty(8, 32, 1, 128, dtype=torch.bfloat16)
        k, v = (torch.empty(8, 8, 8192, 128, dtype=torch.bfloat16).to(kv_dtype) for _ in range(2))
        plan = flash.make_plan(q, k, v, mask="causal_bottom_right", **_cache_scales(q, k))
        kernel, name = "decode", "_decode_split_kernel"
    elif case == "prefix":
        q = torch.empty(32, 32, 1, 128, dtype=torch.bfloat16)
        k, v = (torch.empty(32, 8, 16640, 128, dtype=torch.bfloat16) for _ in range(2))
        plan = flash.make_plan(q, k, v, mask="causal_bottom_right", shared_prefix=16384)
        kernel, name = "decode", "_decode_split_kernel" + PREFIX_LEVEL
    else:
        q = torch.empty(8, 128, 1, 576, dtype=torch.bfloat16)
        k = torch.empty(8, 1, 8192, 576, dtype=torch.bfloat16).to(kv_dtype)
        v = k[..., :512]
        plan = flash.make_plan(q, k, v, mask="causal_bottom_right", **_cache_scales(q, k))
        kernel, name = "decode", "_decode_split_kernel"

    def launch(tile: Tile) -> None:
        plan.tiles[kernel] = tile
        flash.forward(q, k, v, plan)

    return launch, plan.candidates(kernel), name


def _cache_scales(q: torch.Tensor, k: torch.Tensor) -> dict[str, Any]:
    """A narrow cache's per-(sequence, kv head) scales (ones), none for a cache of q's type."""
    if k.dtype == q.dtype:
        return {}
    return {"k_scale": torch.ones(*k.shape[:2], 1, 1), "v_scale": torch.ones(*k.shape[:2], 1, 1)}


def report(
    case: str,
    tiles: Sequence[Tile] | None,
    head_dim: int = 128,
    mask: str = "none",
    kv_dtype: torch.dtype = torch.bfloat16,
) -> list[tuple[Tile, Report | str]]:
    """Each tile (default: the tuner's candidates on a Hopper GPU, one per compiled kernel) and its ``Report``,
    or why it did not compile."""
    from attnbench.impls.fused_triton import backward_kernels, decode_kernels, forward_kernels

    targets = [
        (forward_kernels, "_forward_kernel"),
        (decode_kernels, "_decode_split_kernel"),
        (decode_kernels, "_decode_merge_kernel"),
    ]
    skipped = [(backward_kernels, "_preprocess_kernel")]  # the backward's Δ = rowsum(dO∘O): no product, no tile
    if case in BACKWARD:
        targets.append((backward_kernels, BACKWARD[case]))
        skipped.append((backward_kernels, BACKWARD["dq" if case == "dkdv" else "dkdv"]))
    results: list[tuple[Tile, Report | str]] = []
    with compiling(targets, skipped) as compiled:
        launch, candidates, name = _case(case, head_dim, mask, kv_dtype)
        chosen = list(tiles) if tiles else list(dict.fromkeys(dataclasses.replace(t, waves=0) for t in candidates))
        for tile in chosen:
            try:
                launch(tile)
                results.append((tile, inspect(compiled.pop(name))))
            except Exception as exc:  # a tile the compiler rejects: said, not raised
                results.append((tile, f"does not compile ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"))
    return results


def _tile(text: str) -> Tile:
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(repr(text)) from None
    sizes, waves, parts = numbers[:4], numbers[4:5], numbers[5:]
    if len(numbers) not in (4, 5, 6) or min(sizes) < 1 or min(waves, default=0) < 0 or parts not in ([], [1], [2]):
        raise ValueError(repr(text))
    return Tile(*numbers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnbench.impls.fused_triton.compile_report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--case", choices=CASES, default="forward", help="the kernel and shape to compile (default forward)"
    )
    parser.add_argument(
        "--tiles", help='tiles "BLOCK_M,BLOCK_N,WARPS,STAGES[,WAVES[,PARTS]] …" (default: the tuner\'s candidates)'
    )
    parser.add_argument("--head-dim", type=int, choices=(64, 128), default=128, help="forward, dkdv, dq (default 128)")
    parser.add_argument("--mask", choices=("none", "causal"), default="none", help="forward, dkdv, dq (default none)")
    parser.add_argument(
        "--kv-dtype",
        choices=("bfloat16", "float8_e4m3fn", "float8_e5m2"),
        default="bfloat16",
        help="decode and mla only: the cache's type (default bfloat16)",
    )
    args = parser.parse_args(argv)
    try:
        tiles = [_tile(text) for text in args.tiles.split()] if args.tiles else None
    except ValueError as exc:
        parser.error(
            f"--tiles: {exc} is not a tile; allowed: BLOCK_M,BLOCK_N,WARPS,STAGES[,WAVES[,PARTS]] (positive integers;"
            " WAVES 0 for the default, PARTS 1 or 2)"
        )
    if tiles and args.case not in ("decode", "mla", "prefix") and any(tile.parts != 1 for tile in tiles):
        parser.error(f"--tiles: PARTS is the decode kernel's (--case decode, mla or prefix), not {args.case}'s")
    try:
        import triton
    except ImportError:
        print("compile_report: needs Triton (pip install 'attnbench[triton]')", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud (as the tests do)
    print(f"sm_90 compiles by Triton {triton.__version__}: {args.case}", flush=True)
    for tile, result in report(args.case, tiles, args.head_dim, args.mask, getattr(torch, args.kv_dtype)):
        shown = ",".join(map(str, tile.fields()))
        print(f"{shown:>14}  {result if isinstance(result, str) else result.line()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
