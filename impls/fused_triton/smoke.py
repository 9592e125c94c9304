"""``nox -s gpu_smoke``: every fused_triton tile forced once, forward and backward, against float64.

Autotuning only ever runs the fastest tile of each kernel, so a tile that computes garbage could hide
until some shape makes it the fastest. This forces each candidate tile of each kernel ("fwd", "dkdv",
"dq") in turn on a few small cases chosen to cross block edges (Sq ≠ Sk, GQA, head dims 64 and 96,
every mask, bf16 and fp32, the latter with the tf32x3 dots) and on the newest workloads' cases
(``FEATURE_CASES``: a value head dim of its own with learned sinks, a mixed batch with ragged lengths,
chunked attention, fp8 KV caches with per-sequence and per-page scales, forward only; MLA's latent cache,
576 wide, forward, and a narrower latent cache forward and backward; shared prefixes, forward: the
prefix kernel runs the forward's forced tile; the fp8 forward, a prefill and a decode-sized step, both in the
forward kernel), checks the output
and the gradients (the sinks' among them) with the harness's own gates (``check_output``,
``check_grads``), and runs one case whose q, k, v rows lie past 2^31 elements (64-bit offsets). The
backward kernels' tiles skip the forward-only cases, and the forward kernel's the cases of ≤ 8 query rows,
which the decode kernels take: each of those (``DECODE_CASES`` and the feature cases' decode steps) is run
with every decode tile the tuner would consider for it (its rows set the tile's height). Tiles the tuner
would not consider on this device (its shared memory, or on a Hopper GPU the forward's shorter list) are
listed as pruned, tiles that fail to compile as unfit (the tuner skips those); a wrong result makes the exit
status 1.

``--jobs N`` runs it as N processes side by side, each a shard of the work (``--shard i/N``): nearly all of
its time is compiling, one process a core; ``nox -s gpu_smoke`` asks for 8. Each wrong result is said as it
is found (``FAILED …``), so a run cut short by a time limit still shows what it found.

Without CUDA (and without ``TRITON_INTERPRET=1``) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnbench.impls.fused_triton.decode import INTERPRETER_TILE, decodes
from attnbench.impls.fused_triton.tiles import CUDA_TILES, Tile
from attnbench.workload import Workload
from attnbench.workload.check import check_grads, check_output
from attnbench.workload.inputs import make_inputs

BASIC_CASES = (
    Workload(2, 4, 2, 190, 257, 64, dtype="bfloat16", mask="causal_bottom_right", pass_="fwd_bwd"),
    Workload(2, 4, 1, 257, 257, 96, dtype="bfloat16", mask="causal", pass_="fwd_bwd"),
    Workload(3, 2, 2, 130, 200, 64, dtype="float32", mask="padding", pass_="fwd_bwd"),
    Workload(1, 2, 2, 100, 70, 96, dtype="float32", mask="none", pass_="fwd_bwd"),
)
# fmt: off
FEATURE_CASES = (
    Workload(2, 8, 2, 190, 257, 192, head_dim_v=128, dtype="bfloat16", mask="causal_bottom_right", sinks="learned",
             pass_="fwd_bwd"),
    Workload(3, 4, 2, 130, 300, 64, dtype="bfloat16", mask="mixed", decode_share=0.5, lengths="uniform",
             pass_="fwd_bwd"),
    Workload(2, 4, 1, 200, 200, 96, head_dim_v=64, dtype="float32", mask="chunked", chunk=48, pass_="fwd_bwd"),
    Workload(2, 8, 2, 16, 300, 128, dtype="bfloat16", kv_dtype="float8_e4m3fn", mask="causal_bottom_right",
             page_size=64, sinks="learned"),
    Workload(3, 4, 2, 100, 170, 96, dtype="float16", kv_dtype="float8_e5m2", mask="causal", lengths="longtail"),
    Workload(2, 16, 1, 2, 300, 576, head_dim_v=512, dtype="bfloat16", kv_layout="latent", mask="causal_bottom_right"),
    Workload(2, 4, 1, 70, 130, 96, head_dim_v=64, dtype="float16", kv_layout="latent", mask="causal", pass_="fwd_bwd"),
    Workload(4, 8, 2, 1, 600, 128, dtype="bfloat16", mask="causal_bottom_right", shared_prefix=400),
    Workload(3, 4, 2, 64, 300, 64, dtype="float16", mask="causal", shared_prefix=200, sinks="learned"),
    Workload(2, 8, 2, 190, 257, 128, dtype="bfloat16", kv_dtype="float8_e4m3fn", q_dtype="float8_e4m3fn",
             mask="causal_bottom_right", sinks="learned"),
    Workload(3, 4, 2, 3, 300, 64, dtype="float16", kv_dtype="float8_e4m3fn", q_dtype="float8_e4m3fn",
             mask="sliding_window", window=100),
)
# The decode kernels (≤ 8 query rows): a GQA group in one tile, a paged fp8 cache with speculative rows and sinks,
# a window with ALiBi, a shared prefix whose level holds 64 rows (its taller tiles among the candidates)
DECODE_CASES = (
    Workload(3, 32, 8, 1, 3000, 128, dtype="bfloat16", mask="causal_bottom_right"),
    Workload(2, 32, 8, 4, 2000, 128, dtype="bfloat16", kv_dtype="float8_e4m3fn", page_size=16, sinks="learned",
             mask="causal_bottom_right"),
    Workload(3, 16, 2, 8, 1000, 64, dtype="float16", mask="sliding_window", window=300, score_mod="alibi"),
    Workload(16, 8, 2, 1, 1200, 128, dtype="bfloat16", mask="causal_bottom_right", shared_prefix=1000),
)
# fmt: on
SMOKE_CASES = BASIC_CASES + FEATURE_CASES + DECODE_CASES


def runs(kernel: str, case: Workload) -> bool:
    """Whether ``case`` exercises ``kernel``: the backward kernels only backward cases, the forward kernel the
    cases the decode kernels don't take (``decodes``), and those only the decode kernel."""
    if kernel == "decode":
        return decodes(case)
    return (kernel == "fwd" and not decodes(case)) or case.pass_ != "fwd"


def check_case(w: Workload, forced: dict[str, Tile]) -> str:
    """'' when fused_triton with the ``forced`` tiles passes both gates on ``w`` (the output; the gradients,
    the sink logits' among them, for a backward case), else the reason."""
    from attnbench.impls.fused_triton import contender, flash, plan_options

    backward = w.pass_ != "fwd"
    inputs = make_inputs(w, requires_grad=backward)
    options, pages = plan_options(inputs, w), None
    paged = inputs.paged if contender.reads_pages(w) else None
    if paged is not None:  # read in place, as the contender does
        pages = flash.Pages(
            paged.k_pages, paged.v_pages, paged.page_table, paged.page_size, paged.k_scale, paged.v_scale
        )
        options["page_size"] = paged.page_size
    plan = flash.make_plan(inputs.q, inputs.k, inputs.v, **options)
    kernels = ("fwd", "dkdv", "dq") + (("decode",) if plan.decode else ())
    for kernel in kernels:  # the kernels not forced take their first candidate: nothing is timed
        plan.tiles[kernel] = forced.get(kernel) or plan.candidates(kernel)[0]
    plan.tiles["prefix"] = plan.tiles["fwd"]  # a shared prefix's kernel: the forward's tiles
    out = flash.attend(inputs.q, inputs.k, inputs.v, plan, inputs.sinks, inputs.prefix_kv, pages)
    output = check_output(inputs, out)
    if not backward:
        return output.reason
    leaves = (inputs.q, inputs.k, inputs.v) + ((inputs.sinks,) if inputs.sinks is not None else ())
    gradients = check_grads(inputs, torch.autograd.grad(out, leaves, inputs.grad_out))
    return "; ".join(reason for reason in (output.reason, gradients.reason) if reason)


def check_far_offsets(device: str) -> str:
    """'' when a causal fwd+bwd on fp16 views whose rows lie 2^26 elements apart (the last past 2^31
    elements) matches float64, else the reason."""
    from attnbench.impls.fused_triton import flash

    rows, dim = 40, 32
    buffer = torch.empty(rows << 26, dtype=torch.float16, device=device)
    generator = torch.Generator().manual_seed(0)
    views = []
    for column in range(3):
        view = buffer.as_strided((1, 1, rows, dim), (0, 0, 1 << 26, 1), column * dim)
        view.copy_(torch.randn(1, 1, rows, dim, generator=generator))
        views.append(view)
    q, k, v = views
    plan = flash.make_plan(q, k, v, mask="causal")
    out, lse = flash.forward(q, k, v, plan, store_lse=True)
    assert lse is not None
    grads = flash.backward_grads(q, k, v, out, lse, torch.ones_like(out), plan)
    q64, k64, v64 = (t.double().requires_grad_() for t in views)
    visible = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    scores = (q64 @ k64.transpose(-1, -2) * dim**-0.5).masked_fill(~visible, float("-inf"))
    ref = torch.softmax(scores, -1) @ v64
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), torch.ones_like(ref))
    out_err = float((out.double() - ref).abs().max())
    grad_err = max(float((g.double() - r).abs().max() / r.abs().max()) for g, r in zip(grads, ref_grads, strict=True))
    if out_err > 3e-3 or grad_err > 1e-2:
        return f"offsets past 2^31: max_abs_err {out_err:.3g}, grad error {grad_err:.3g}"
    return ""


def _candidates(case: Workload, kernel: str) -> list[Tile] | None:
    """The tiles the tuner would consider for ``case`` on its device; None in the interpreter, which runs any
    tile (no shared memory to prune by)."""
    from attnbench.impls.fused_triton import flash

    if flash.INTERPRETED:
        return None
    q = torch.empty(case.batch, case.heads, case.seq_q, case.head_dim, dtype=case.torch_dtype, device=case.device)
    k = torch.empty(case.batch, case.kv_heads, case.seq_k, case.head_dim, dtype=case.torch_dtype, device=case.device)
    plan = flash.make_plan(q, k, k[..., : case.head_dim_v], shared_prefix=case.shared_prefix)
    return plan.candidates(kernel)


def _compiled(tiles: Sequence[Tile]) -> list[Tile]:
    """One tile per compiled kernel (tiles that differ only in ``waves`` launch the same one), each at its
    most waves: the most splits, the most partials merged."""
    kept: dict[Tile, Tile] = {}
    for tile in tiles:
        kernel = dataclasses.replace(tile, waves=0)
        if kernel not in kept or tile.waves > kept[kernel].waves:
            kept[kernel] = tile
    return list(kept.values())


def _forced(
    case: Workload, kernel: str, tile: Tile, unfit: list[str], failures: list[str], named: bool = False
) -> str | None:
    """``check_case`` with ``kernel``'s tile forced: its reason ('' when right), a failure appended when wrong;
    None when the tile could not run (e.g. OutOfResources: the tuner times such a tile as inf), said in
    ``unfit`` (with the tile when ``named``)."""
    try:
        reason = check_case(case, {kernel: tile})
    except Exception as exc:
        unfit.append(f"{f'{tile} ' if named else ''}unfit ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        return None
    if reason:  # said at once: a run cut short by a time limit still shows what it found wrong
        failures.append(f"{kernel} {tile} on {case.label()}: {reason}")
        print("FAILED", failures[-1], flush=True)
    return reason


def _items(cases: Sequence[Workload], tiles: dict[str, Sequence[Tile]] | None) -> list[tuple[Any, ...]]:
    """The smoke's units of work, in order: each (kernel, tile) forced on the cases that run the kernel, each
    decode case with its decode tiles, and the 64-bit-offsets case (``--shard`` deals them out)."""
    forced = [("tile", kernel, tile) for kernel, kernel_tiles in (tiles or CUDA_TILES).items() for tile in kernel_tiles]
    return forced + [("decode", case) for case in cases if decodes(case)] + [("far",)]


def smoke(
    device: str,
    cases: Sequence[Workload] = SMOKE_CASES,
    tiles: dict[str, Sequence[Tile]] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> list[str]:
    """Force each tile of each kernel (default: all of CUDA_TILES) on every case that runs the kernel; print
    one line per tile; return the failures. ``shard`` (i, n): only the units of work i, i + n, … (``_items``).

    A tile named in ``tiles`` that checks no case (each one pruned, or raising: a launch or compile error) is a
    failure: the check asked for did not happen, and a trial's new kernel that cannot run must not read as
    green. Of the default tiles, such a one is said (the tuner would time it as inf) but not failed."""
    failures: list[str] = []
    index, count = shard
    named_decode = {t: 0 for t in _compiled((tiles or {}).get("decode") or [])}
    decode_items = 0
    for item in _items(cases, tiles)[index::count]:
        if item[:2] == ("tile", "decode"):  # named decode tiles: forced case by case (below), not twice
            continue
        if item[0] == "tile":
            _, kernel, tile = item
            ran, wrong, skipped = 0, 0, list[str]()
            for case in (dataclasses.replace(w, device=device) for w in cases if runs(kernel, w)):
                candidates = _candidates(case, kernel)
                if candidates is not None and tile not in candidates:
                    skipped.append(f"pruned for {case.dtype} D{case.head_dim}/{case.head_dim_v}")
                    continue
                reason = _forced(case, kernel, tile, skipped, failures)
                ran, wrong = ran + (reason is not None), wrong + bool(reason)
            said = f"{kernel} {tile}: {ran} cases checked, {wrong} wrong"
            print(said + (f"; {', '.join(skipped)}" if skipped else ""), flush=True)
            if tiles is not None and not ran:
                _unchecked(f"{kernel} {tile}", skipped, failures)
        elif item[0] == "decode":
            # the decode kernel's tiles depend on the case (its rows): each case's own candidates, every one forced
            case = dataclasses.replace(item[1], device=device)
            decode_tiles = _compiled((tiles or {}).get("decode") or _candidates(case, "decode") or [INTERPRETER_TILE])
            ran, unfit = 0, list[str]()
            decode_items += 1
            for tile in decode_tiles:
                checked = _forced(case, "decode", tile, unfit, failures, named=True) is not None
                ran += checked
                if tile in named_decode:
                    named_decode[tile] += checked
            print(
                f"decode on {case.label()}: {ran} tiles checked" + (f"; {', '.join(unfit)}" if unfit else ""),
                flush=True,
            )
        else:
            far = check_far_offsets(device)
            print("64-bit offsets: " + (far or "ok"), flush=True)
            failures += [far] if far else []
    for tile, tile_runs in named_decode.items():
        if decode_items and not tile_runs:
            _unchecked(f"decode {tile}", [f"on {decode_items} decode cases"], failures)
    return failures


def _unchecked(named: str, why: Sequence[str], failures: list[str]) -> None:
    failures.append(f"{named}: named, but checked on no case ({', '.join(why) or 'no case runs it'})")
    print("FAILED", failures[-1], flush=True)


def _shard_command(i: int, jobs: int) -> list[str]:
    return [sys.executable, "-m", "attnbench.impls.fused_triton.smoke", "--shard", f"{i}/{jobs}"]


def _in_parallel(jobs: int, command: Callable[[int, int], list[str]] = _shard_command) -> int:
    """Run the smoke as ``jobs`` processes, one shard each (the compiles, most of its time, run side by side),
    echoing their lines as they come; the failures counted from their FAILED lines and exit codes."""
    children = [
        subprocess.Popen(
            command(i, jobs),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(jobs)
    ]
    lock, failed = threading.Lock(), [0] * jobs

    def echo(i: int) -> None:
        stdout = children[i].stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith("gpu_smoke: "):
                continue  # the shard's own total: the sum is said once below
            failed[i] += line.startswith("FAILED ")
            with lock:
                print(line, end="", flush=True)

    readers = [threading.Thread(target=echo, args=(i,)) for i in range(jobs)]
    for reader in readers:
        reader.start()
    for i, (child, reader) in enumerate(zip(children, readers, strict=True)):
        reader.join()
        if child.wait() != 0 and failed[i] == 0:  # a shard that died before saying why
            failed[i] = 1
            print(f"FAILED shard {i}/{jobs} exited with status {child.returncode}", flush=True)
    print(f"gpu_smoke: {sum(failed)} failure(s)")
    return 1 if any(failed) else 0


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_smoke", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="processes side by side, each a shard (default 1)")
    parser.add_argument("--shard", default="0/1", help="i/n: only this shard of the work (what --jobs runs)")
    args = parser.parse_args(argv)
    index, _, count = args.shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)) or args.jobs < 1:
        parser.error(f"--shard takes i/n with 0 ≤ i < n (got {args.shard}); --jobs a count ≥ 1 (got {args.jobs})")
    args.shard = (int(index), int(count))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from attnbench.impls.fused_triton import flash

    args = _parse(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available() and not flash.INTERPRETED:
        print("gpu_smoke: no CUDA device here, nothing to check (fused_triton's configs need a GPU)")
        return 0
    if args.jobs > 1:
        return _in_parallel(args.jobs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    failures = smoke(device, shard=args.shard)  # each said (FAILED …) as it was found
    print(f"gpu_smoke: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
