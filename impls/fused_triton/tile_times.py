"""``python -m attnbench.impls.fused_triton.tile_times``: the forward's time with each tile, k and v read by
pointers and by tensor descriptors, beside cuDNN — what the tuner chooses from, for a kernel author.

The tuner keeps only the fastest of its candidate tiles (``tiles.choose``); this prints every candidate (for
this case on this GPU: ``Plan.candidates``), for both ways of reading k and v (``flash.takes_descriptors``:
forced off for "pointers"; "descriptors" only where they can address the inputs, on a Hopper GPU), each
checked against SDPA's cuDNN backend once (max |error| on the output) and timed with
``triton.testing.do_bench`` (warm-up 50 ms, 300 ms of repeats). bf16, random inputs (``--fp8``: also the fp8
forward on the same inputs in e4m3 with per-(sequence, head) scales, against cuDNN's bf16 time: "fp8" with v as
stored, transposed in the call, "fp8 vT" with v keys-contiguous already, the kernel alone); TFLOP/s
count 4·B·H·Sq·Sk·D (halved for causal). Needs CUDA: without it, it says so and exits 0.

    python -m attnbench.impls.fused_triton.tile_times --seq 8192 --head-dim 128 --mask none,causal
    python -m attnbench.impls.fused_triton.tile_times --seq 16384 --mask none --fp8
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import torch

from attnbench.impls.fused_triton.tiles import Tile


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tile_times", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--mask", default="none,causal", help="none, causal or both (comma-separated)")
    parser.add_argument("--fp8", action="store_true", help="also the fp8 forward (q, k, v in e4m3)")
    args = parser.parse_args(argv)
    args.mask = args.mask.split(",")
    if not set(args.mask) <= {"none", "causal"} or min(args.batch, args.heads, args.seq, args.head_dim) < 1:
        parser.error(f"--mask takes none and causal (got {','.join(args.mask)}); sizes ≥ 1")
    return args


def _e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x in e4m3 with its (B, H) float32 scales, one per (sequence, head), as attnbench's inputs hold it."""
    scale = x.float().abs().amax(dim=(2, 3), keepdim=True) / torch.finfo(torch.float8_e4m3fn).max
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def tile_times(
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    mask: str,
    tiles: Sequence[Tile] | None = None,
    fp8: bool = False,
) -> list[str]:
    """One line for cuDNN, then one per (way, tile): ms, TFLOP/s, ratio to cuDNN, max |error|. ``tiles``:
    default the tuner's own candidates for this case on this GPU (``Plan.candidates``)."""
    from triton.testing import do_bench

    from attnbench.impls.fused_triton import flash

    causal = mask == "causal"
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        ref = sdpa(q, k, v, is_causal=causal)
        cudnn = do_bench(lambda: sdpa(q, k, v, is_causal=causal), warmup=50, rep=300)
    lines = [f"B{batch} H{heads} S{seq} D{head_dim} {mask}: cudnn {cudnn:.3f} ms, {flops / cudnn / 1e9:.0f} TFLOP/s"]
    real = flash.takes_descriptors
    # (name, flash.takes_descriptors, an fp8 forward's (q, k, v) or None); pointers: descriptors refused
    ways: list[tuple[str, Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]] = [
        ("pointers", lambda *args: False, None),
        ("descriptors", real, None),
    ]
    (q8, q_scale), (k8, k_scale), (v8, v_scale) = (_e4m3(x) for x in (q, k, v)) if fp8 else ((q, None),) * 3
    if fp8:  # k and v by pointers (``flash.takes_descriptors``); v as stored (the forward transposes it in the
        # call), and v already keys-contiguous: the kernel alone
        v8t = v8.transpose(2, 3).contiguous().transpose(2, 3)
        ways += [("fp8", real, (q8, k8, v8)), ("fp8 vT", real, (q8, k8, v8t))]
    scales: dict[str, Any] = {"q_scale": q_scale, "k_scale": k_scale, "v_scale": v_scale, "out_dtype": torch.bfloat16}
    try:
        for way, takes, narrow in ways:
            flash.takes_descriptors = takes
            args = narrow or (q, k, v)
            plan = flash.make_plan(*args, mask=mask, **(scales if narrow else {}))
            for tile in tiles or plan.candidates("fwd"):
                plan.tiles["fwd"] = tile
                name = f"  {way:11s} {tile.block_m}x{tile.block_n} {tile.num_warps} warps {tile.num_stages} stages"
                try:
                    out, _ = flash.forward(*args, plan)
                    error = float((out.float() - ref.float()).abs().max())
                    ms = do_bench(lambda: flash.forward(*args, plan), warmup=50, rep=300)  # noqa: B023 - called here
                except Exception as exc:  # a tile that does not fit this GPU (shared memory): said, not fatal
                    lines.append(f"{name}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                    continue
                lines.append(
                    f"{name}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s, {ms / cudnn:.3f}× cudnn, "
                    f"max error {error:.4f}"
                )
    finally:
        flash.takes_descriptors = real
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("tile_times: no CUDA device here, nothing to time")
        return 0
    for mask in args.mask:
        for line in tile_times(args.batch, args.heads, args.seq, args.head_dim, mask, fp8=args.fp8):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
