"""Tile choice for fused_triton's kernels: the candidate tiles, pruning by shared memory, and tuning once.

Definitions:

* A **tile** is (BLOCK_M query rows, BLOCK_N keys, num_warps, num_stages) for one kernel ("fwd", "dkdv",
  "dq"). BLOCK_D (the head dim padded to a power of two; past 256 split into a power of two and a tail,
  ``head_dim_blocks``) and BLOCK_DV (the values') follow from the inputs. The forward's 16-row tiles are for
  split head dims only (MLA's 576: a 16 × 512 fp32 accumulator), and a split head dim takes only them.
* The **shared-memory estimate** of a tile counts what one program keeps in shared memory: its resident
  operand tiles once (twice for fp32, whose tf32x3 dots keep a high and a low part) and its streamed
  ones once per pipeline stage (``shared_bytes``). Against ``triton.compile`` for sm_90 (Triton 3.9,
  launch-like specialisation) it is exact for the forward (bf16 and fp32) and within 0–35 % above for the
  backward kernels; tests/test_fused_triton_compile.py checks it. The cap is the
  device's own per-block limit (``max_shared_memory``: 227 KiB on an H100, 163 KiB on an A100), read from
  the driver, not a fixed number.
* The **tuning key** (``tuning_key``) buckets the sequence lengths to their next power of two, so a sweep
  over S = 1000, 1500, 2000 tunes twice, not three times; kernel, head dim (the values' is in
  ``features``), GQA group, dtype, mask family and score modifiers (``features``), the GPU's name (not its
  index: two of a kind share) and the hash of the kernels' source stay exact.
* **Tuning once per machine.** ``choose`` times every pruned candidate with ``triton.testing.do_bench`` the
  first time a key is seen and keeps the fastest in memory and on disk (``tile_cache``: one JSON file per
  key under ``tile_cache.folder()``, shared by worker processes and runs). The stored key adds the
  candidate list and the torch and Triton versions to the tuning key, so a new tile table, compiler or
  kernel source tunes afresh instead of reusing a stale choice. Before the timing, the candidates' kernels
  are compiled side by side in threads (``precompile``), so a fresh machine's tuning is not one compile
  after another. fused_triton tunes in ``prepare``, so the time lands in the ``setup_ms`` of the case that
  paid for it; ``cached`` is the look-up without timing (``Plan.tune`` launches nothing when every tile is
  known), and the timed callable launches the chosen tile directly: no autotuner dispatch per call. Under
  ``TRITON_INTERPRET=1`` there is one small tile per kernel, nothing is timed and nothing is written.
* **Fewer candidates where the GPU is known** (``is_hopper``: compute capability 9.x, H100/H200/H800/GH200).
  The full table stays for every other GPU. On Hopper the forward's candidates (the prefix kernel's too)
  drop two kinds of tile not expected to win, so a fresh machine compiles and times fewer: 8 warps on a
  tile smaller than 128 × 128 (the filter of Triton's own fused-attention tutorial, ``keep``, written for
  Hopper-class GPUs), and a shallower pipeline when a deeper one of the same block and warps is also a
  candidate and fits as many programs on an SM (by shared memory: the same occupancy, so the shallower one
  only prefetches less). Both are rules of thumb, not measurements of these kernels: which tile wins is
  still timed among the rest, and the backward kernels keep their full tables. On an H100 at D 128 in bf16
  that is 9 forward candidates instead of 13.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from attnbench.impls.fused_triton import precompile, tile_cache


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # the decode kernels only: programs per SM their keys are split for (0: ``decode.WAVES``); a launch
    # parameter, not a compiled one, so tiles differing only here share one kernel
    waves: int = 0
    # the decode kernel only: programs a block of rows and split, each with its share of the value channels
    # (``decode_kernels``' ``VALUE_PARTS``: 2 for a head dim split past 256, MLA's)
    parts: int = 1

    def __repr__(self) -> str:  # as the dataclass's, ``waves`` and ``parts`` only where set
        names = ("block_m", "block_n", "num_warps", "num_stages", "waves", "parts")[: len(self.fields())]
        return f"Tile({', '.join(f'{name}={getattr(self, name)}' for name in names)})"

    def fields(self) -> tuple[int, ...]:
        """The tile as stored: its numbers, ``waves`` and ``parts`` only where set (so other kernels' files read
        as before)."""
        numbers = dataclasses.astuple(self)
        if self.parts != 1:
            return numbers
        return numbers[:5] if self.waves else numbers[:4]

    def launch_kwargs(self) -> dict[str, int]:
        return {
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


def _tiles(*specs: tuple[int, int, int, int]) -> tuple[Tile, ...]:
    return tuple(Tile(*spec) for spec in specs)


# Forward: FlashAttention-2's tiles on Ampere, plus Hopper's deeper pipelines (128×128 with 3 stages fits an
# H100's 227 KiB at D 128 in bf16, 4 stages at D 64) and single-stage tiles for the widest rows (D 256).
# fmt: off
CUDA_TILES: dict[str, tuple[Tile, ...]] = {
    "fwd": _tiles(
        (128, 128, 8, 4), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4),
        (64, 128, 4, 3), (64, 128, 4, 2), (128, 32, 4, 4), (64, 64, 4, 3), (64, 32, 4, 4), (32, 32, 2, 4),
        (64, 32, 4, 1), (32, 16, 2, 1),
        (16, 64, 4, 2), (16, 32, 4, 1),  # 16 rows: only for head dims split past 256 (MLA's 576)
    ),
    # dK/dV: a program owns BLOCK_N keys and streams BLOCK_M query rows (narrow query blocks, as FA-2).
    "dkdv": _tiles(
        (32, 128, 4, 3), (32, 128, 8, 2), (64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 2),
        (16, 64, 4, 2), (16, 32, 2, 1),
    ),
    # dQ: a program owns BLOCK_M query rows and streams BLOCK_N keys.
    "dq": _tiles(
        (128, 32, 4, 3), (128, 32, 8, 2), (128, 64, 8, 2), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 2),
        (64, 16, 4, 2), (32, 16, 2, 1),
    ),
}
# fmt: on
# Under TRITON_INTERPRET=1: one tile per kernel whose row and key blocks don't line up, so the tests
# exercise partial tiles and boundary blocks from both sides.
INTERPRETER_TILES: dict[str, Tile] = {
    "fwd": Tile(32, 16, 1, 1),
    "dkdv": Tile(16, 32, 1, 1),
    "dq": Tile(32, 16, 1, 1),
}
# The operand tiles one program keeps in shared memory: (rows: "m" BLOCK_M or "n" BLOCK_N, width: "d" the
# head dim or "dv" the values', resident or streamed). fwd keeps q and streams k, v; dkdv keeps k, v and
# streams q, dO; dq keeps q, dO and streams k, v.
_OPERANDS = {
    "fwd": (("m", "d", True), ("n", "d", False), ("n", "dv", False)),
    "dkdv": (("n", "d", True), ("n", "dv", True), ("m", "d", False), ("m", "dv", False)),
    "dq": (("m", "d", True), ("m", "dv", True), ("n", "d", False), ("n", "dv", False)),
}
FALLBACK_SHARED_MEMORY = 160 * 1024  # only when no device can be asked (tests, the interpreter)


SPLIT_HEAD_DIM = 256  # past it a head dim that is no power of two is split: a power-of-two part and a tail


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for the launchers: ``triton.cdiv`` is a jit function, a few µs a host call (a decode step
    made nine)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two ≥ n (0 for 0), as ``triton.next_power_of_2`` without its host call's cost."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def head_dim_blocks(head_dim: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_DT): the head dim's padded main tile and the tail tile after it (0: none). A head dim
    up to 256 (or a power of two) is one tile padded to a power of two ≥ 16; a wider one (MLA's 576) is its
    largest power of two (512) and a tail padded to a power of two ≥ 16 (64): 576 wide, not 1024."""
    padded = max(16, 1 << (head_dim - 1).bit_length())
    if head_dim <= SPLIT_HEAD_DIM or padded == head_dim:
        return padded, 0
    main = 1 << (head_dim.bit_length() - 1)
    return main, max(16, 1 << (head_dim - main - 1).bit_length())


# A forward reading k and v by tensor descriptors also keeps its copies' barriers: one 1 KiB-aligned slot
# (sm_90 compiles, Triton 3.9: tests/test_fused_triton_compile.py).
DESCRIPTOR_BARRIERS = 1024


def shared_bytes(
    kernel: str, tile: Tile, block_d: int, itemsize: int, block_dv: int | None = None, descriptors: bool = False
) -> int:
    """Shared memory one program of ``kernel`` needs with ``tile``, roughly (see the module docstring);
    ``block_dv``: the values' padded head dim when it differs from ``block_d``; ``descriptors``: a forward
    that reads k and v by tensor descriptors (``flash.takes_descriptors``)."""
    widths = {"d": block_d, "dv": block_dv or block_d}
    total = 0
    for rows, width, resident in _OPERANDS[kernel]:
        copies = (2 if itemsize == 4 else 1) if resident else max(1, tile.num_stages)
        total += (tile.block_m if rows == "m" else tile.block_n) * widths[width] * copies
    return itemsize * total + (DESCRIPTOR_BARRIERS if descriptors else 0)


def max_shared_memory(device: torch.device) -> int:
    """The per-block shared-memory limit of ``device`` (opt-in maximum), from Triton's driver or torch."""
    if device.type != "cuda":
        return FALLBACK_SHARED_MEMORY
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        import triton

        return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # an older Triton: torch knows it too
        props = torch.cuda.get_device_properties(index)
        return int(getattr(props, "shared_memory_per_block_optin", FALLBACK_SHARED_MEMORY))


def prune(
    kernel: str,
    tiles: Sequence[Tile],
    *,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    itemsize: int,
    shared_cap: int,
    head_dim_v: int | None = None,
    hopper: bool = False,
) -> list[Tile]:
    """Drop tiles that can't win or can't run before timing them: blocks far longer than their sequence
    (only masked-out rows or keys), 128-wide streamed blocks at head dims (D or Dv) over 128 (registers
    spill), and tiles over the shared-memory cap; with ``hopper``, the forward's tiles Hopper makes no use
    of (``hopper_forward``). Never empty: the smallest tile that suits the head dim stays if nothing fits."""
    head_dim_v = head_dim_v or head_dim
    block_d = sum(head_dim_blocks(head_dim))
    block_dv = max(16, 1 << (head_dim_v - 1).bit_length())
    rows, keys = max(16, 1 << (seq_q - 1).bit_length()), max(16, 1 << (seq_k - 1).bit_length())
    wide = 64 if max(head_dim, head_dim_v) > 128 else 128
    # on Hopper a 16-bit forward may read k and v by tensor descriptors: count their barriers
    descriptors = hopper and kernel == "fwd" and itemsize == 2

    split = head_dim_blocks(head_dim)[1] > 0

    def fits(t: Tile) -> bool:
        streamed = t.block_n if kernel in ("fwd", "dq") else t.block_m
        if split != (t.block_m == 16 and kernel == "fwd"):  # a split head dim: 16-row tiles, and only those
            return False
        return (
            t.block_m <= max(32, rows)
            and t.block_n <= max(32, keys)
            and streamed <= wide
            and shared_bytes(kernel, t, block_d, itemsize, block_dv, descriptors) <= shared_cap
        )

    kept = [t for t in tiles if fits(t)]
    if hopper and kernel == "fwd":
        kept = hopper_forward(
            kept, lambda t: shared_bytes(kernel, t, block_d, itemsize, block_dv, descriptors), shared_cap
        )
    suited = [t for t in tiles if split == (t.block_m == 16 and kernel == "fwd")] or list(tiles)
    return kept or [min(suited, key=lambda t: shared_bytes(kernel, t, block_d, itemsize, block_dv))]


def hopper_forward(tiles: Sequence[Tile], bytes_of: Callable[[Tile], int], shared_cap: int) -> list[Tile]:
    """The forward's candidates on Hopper (see the module docstring): ``tiles`` less the 8-warp tiles smaller
    than 128 × 128, and less a tile when a deeper pipeline of the same block and warps is among them and fits
    as many programs on an SM (``shared_cap // bytes``, the per-block cap standing for the SM's)."""

    def programs(t: Tile) -> int:
        return shared_cap // max(1, bytes_of(t))

    def dominated(t: Tile) -> bool:
        return any(
            (o.block_m, o.block_n, o.num_warps) == (t.block_m, t.block_n, t.num_warps)
            and o.num_stages > t.num_stages
            and programs(o) == programs(t)
            for o in tiles
        )

    return [t for t in tiles if not (t.num_warps == 8 and t.block_m * t.block_n < 128 * 128) and not dominated(t)]


def is_hopper(device: torch.device) -> bool:
    """Whether ``device`` is a Hopper GPU (compute capability 9.x: H100, H200, H800, GH200)."""
    if device.type != "cuda":
        return False
    try:
        return torch.cuda.get_device_capability(device)[0] == 9
    except Exception:  # no driver to ask: assume nothing
        return False


def length_bucket(length: int) -> int:
    """The next power of two ≥ ``length``: lengths in one bucket share a tuned tile."""
    return 1 << max(0, length - 1).bit_length()


class TuningKey(NamedTuple):
    """What a tuned tile is reused for (``tuning_key``)."""

    kernel: str
    seq_q_bucket: int
    seq_k_bucket: int
    head_dim: int
    group: int
    dtype: str
    features: Hashable  # mask family, score modifiers, the values' head dim, the cache's type
    gpu: str  # torch.cuda.get_device_name, or the device type off CUDA
    source: str  # hash of the kernels' source file (tile_cache.source_hash); '' keeps the tile off disk


def device_name(device: torch.device) -> str:
    """The GPU's name (``NVIDIA H100 80GB HBM3``), or the device type ('cpu') off CUDA."""
    if device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device)


def tuning_key(kernel: str, q: torch.Tensor, k: torch.Tensor, features: Hashable, source: str) -> TuningKey:
    """What a tuned tile is reused for: kernel, bucketed lengths, exact head dim, GQA group, dtype, mask
    family and score modifiers (``features``, the decode kernel's with its bucketed sequences × kv heads:
    ``Plan.key``), the GPU's name and the kernels' ``source`` hash. q is (B, Hq, Sq, D) and k (B, Hkv, Sk, D)."""
    return TuningKey(
        kernel,
        length_bucket(q.shape[2]),
        length_bucket(k.shape[2]),
        q.shape[3],
        q.shape[1] // k.shape[1],
        str(q.dtype),
        features,
        device_name(q.device),
        source,
    )


_CHOSEN: dict[str, Tile] = {}  # in front of the disk: canonical stored key → tile


@functools.cache
def _versions() -> dict[str, str]:
    """The torch and Triton versions, part of every stored key (a new compiler may pick another tile)."""
    try:
        import triton

        triton_version = str(triton.__version__)
    except Exception:
        triton_version = ""
    return {"torch": str(torch.__version__), "triton": triton_version}


def stored_key(key: TuningKey, candidates: Sequence[Tile]) -> dict[str, Any]:
    """The key a tuned tile is kept under, in memory and on disk: the tuning key, the candidates timed and
    the torch and Triton versions."""
    return {"tuning": key._asdict(), "candidates": [t.fields() for t in candidates], **_versions()}


def time_tile(launch: Callable[[Tile], object], tile: Tile) -> float:
    """Median milliseconds of ``launch(tile)`` on the GPU; inf if the tile fails to compile or run."""
    import triton

    try:
        return float(triton.testing.do_bench(lambda: launch(tile), warmup=5, rep=20, return_mode="median"))
    except Exception:  # OutOfResources and the like: this tile simply can't run here
        return math.inf


def cached(key: TuningKey, candidates: Sequence[Tile]) -> Tile | None:
    """The tile for ``key`` without timing anything: the only candidate, or one tuned before (in this process
    or, on disk, in any other); None when it must be tuned."""
    if len(candidates) == 1:
        return candidates[0]
    stored = stored_key(key, candidates)
    name = tile_cache.canonical(stored)
    if name in _CHOSEN:
        return _CHOSEN[name]
    if not key.source:
        return None
    value = tile_cache.read(stored, key.kernel)
    try:
        tile = Tile(*value["tile"])
    except (TypeError, KeyError, ValueError):
        return None  # nothing stored, or not a tile
    if tile not in candidates:
        return None
    _CHOSEN[name] = tile
    return tile


def choose(key: TuningKey, candidates: Sequence[Tile], launch: Callable[[Tile], object]) -> Tile:
    """The tile for ``key``: kept from before (``cached``), or the fastest candidate, timed now and kept in
    memory and on disk. A choice where every candidate failed is kept in memory only."""
    found = cached(key, candidates)
    if found is not None:
        return found
    precompile.compile_ahead(launch, candidates)  # their compiles side by side first: the timing loads them
    timings = {tile: time_tile(launch, tile) for tile in candidates}
    best = min(candidates, key=lambda t: timings[t])
    stored = stored_key(key, candidates)
    _CHOSEN[tile_cache.canonical(stored)] = best
    if key.source and math.isfinite(timings[best]):
        times = {",".join(map(str, t.fields())): ms if math.isfinite(ms) else None for t, ms in timings.items()}
        record = {"tile": best.fields(), "timings_ms": times}  # for a reader: what each tile took
        tile_cache.write(stored, key.kernel, record)
    return best


def clear_cache(disk: bool = False) -> None:
    """Forget every tuned tile in this process; with ``disk``, the ones kept on disk too."""
    _CHOSEN.clear()
    if disk:
        tile_cache.clear()


__all__ = [
    "CUDA_TILES",
    "INTERPRETER_TILES",
    "Tile",
    "TuningKey",
    "cached",
    "choose",
    "clear_cache",
    "device_name",
    "head_dim_blocks",
    "hopper_forward",
    "is_hopper",
    "length_bucket",
    "max_shared_memory",
    "prune",
    "shared_bytes",
    "stored_key",
    "time_tile",
    "tuning_key",
]
