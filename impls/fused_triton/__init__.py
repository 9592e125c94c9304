"""``fused_triton`` — attnbench's own FlashAttention-2 kernels, forward and backward, written in Triton (CUDA).

This package holds them: the kernels in ``kernels.py`` (design: masks as per-row key ranges with fully
masked blocks skipped, GQA by head index, the head dim padded to a power of two, a backward that recomputes
P from the saved log-sum-exp); the attention function, its plan and the autograd wrapper in ``flash.py``;
tile candidates and tuning in ``tiles.py``; ``smoke.py``, ``nox -s gpu_smoke``'s check of every tile on a
GPU. This module (the package's ``__init__``, the entry point) is the contender around them: ``prepare``
builds the plan (padding lengths on the device) and tunes every kernel the pass needs once, so the timed
callable launches the chosen tiles directly. It reads ``inputs.q``, ``k`` and ``v`` at call time and passes
their strides, so nothing is copied and the mha module's in-place projections are seen. ``bwd`` and
``fwd_bwd`` go through torch.autograd into the backward kernels (``backward=True``).

Every mask and score modifier of the harness runs in the kernel (``_mask_options``): ``sliding_window`` as
its bottom-right ``window``, ``document`` as ``cu_seqlens`` from ``masks.document_lengths`` (the lengths
every contender uses), ``softcap`` and ``alibi`` inside the score tile. A paged KV cache is not read
natively: the harness gathers the pages back into contiguous k and v at the start of the timed call
(``paged="gather"``).

Without a GPU, ``TRITON_INTERPRET=1`` (set before Triton defines the kernel, i.e. in the environment of
the process) runs the same kernel in Triton's CPU interpreter; the contender then also accepts CPU
workloads, so the whole harness can check its correctness on any machine. Its times mean nothing there;
its time model then counts the interpreter's steps instead of FLOPs, so that the harness skips cases too
long to interpret (with the prediction as the reason) instead of letting them time out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from attnbench.contender import ALL_MASKS, ALL_SCORE_MODS, Capabilities, Contender
from attnbench.inputs import AttentionInputs
from attnbench.masks import document_lengths, key_ranges
from attnbench.workload import Workload

NEEDS_CUDA = "needs a CUDA GPU (set TRITON_INTERPRET=1 to run it in Triton's CPU interpreter, for correctness only)"
# Triton's interpreter runs the grid in Python. Measured with Triton 3.9 on a 2-core x86 machine, whatever
# the head dim: about 2 ms per (tile, key block) step and 4.5 ms more per tile; the backward's steps (dK/dV
# and dQ together) cost 1.8–3.5 times the forward's (measured on three shapes): BACKWARD_STEPS.
INTERPRETER_SECONDS_PER_BLOCK = 2e-3
INTERPRETER_SECONDS_PER_TILE = 4.5e-3
BACKWARD_STEPS = 3.0


def _kernels() -> ModuleType:
    """The kernel module, imported on first use: Triton is optional, and it decides at this import
    whether the kernel is compiled for the GPU or interpreted on the CPU."""
    from attnbench.impls.fused_triton import flash

    return flash


def _interpreted() -> bool:
    try:
        return bool(_kernels().INTERPRETED)
    except Exception:  # no usable Triton: availability() reports why
        return False


def _interpreter_seconds(w: Workload) -> float:
    """One call in Triton's interpreter: count the tiles and the key blocks the kernel visits (the same
    bounds as its loops: from the block holding the tile's first row's lowest key up to its last row's key
    limit), from the harness's per-row key ranges."""
    kernels = _kernels()
    tile = kernels.INTERPRETER_TILES["fwd"]
    block_m, block_n = tile.block_m, tile.block_n
    lo, hi = key_ranges(w)  # (B|1, Sq) each
    first = torch.arange(0, w.seq_q, block_m)
    last = (first + block_m).clamp(max=w.seq_q) - 1
    start = lo[:, first].div(block_n, rounding_mode="floor") * block_n
    blocks = int((torch.maximum(hi[:, last], start) - start).add(block_n - 1).div(block_n, rounding_mode="floor").sum())
    blocks *= w.batch // lo.shape[0]
    tiles = w.batch * len(first)
    forward = w.heads * (INTERPRETER_SECONDS_PER_TILE * tiles + INTERPRETER_SECONDS_PER_BLOCK * blocks)
    return forward * {"fwd": 1.0, "bwd": BACKWARD_STEPS, "fwd_bwd": 1.0 + BACKWARD_STEPS}[w.pass_]


def _mask_options(inputs: AttentionInputs, w: Workload) -> dict[str, Any]:
    """The kernel's keyword arguments for the workload's mask and score modifier, as the harness defines
    them (``attnbench.masks``): a sliding window is the kernel's bottom-right ``window``; documents are
    ``cu_seqlens`` from the harness's own document lengths; softcap its value; alibi the kernel's slopes
    2^(−8(h+1)/H) over the query heads."""
    device = inputs.q.device
    options: dict[str, Any] = {"mask": w.mask}
    if w.mask == "padding":
        assert inputs.lengths is not None
        options["lengths"] = torch.tensor(inputs.lengths, dtype=torch.int32, device=device)  # (B,)
    elif w.mask == "sliding_window":
        options.update(mask="none", window=w.window)
    elif w.mask == "document":
        offsets = [0, *itertools.accumulate(document_lengths(w.seq_q, w.documents))]
        options.update(mask="none", cu_seqlens=torch.tensor(offsets, dtype=torch.int32))
    if w.score_mod == "softcap":
        options["softcap"] = w.softcap
    elif w.score_mod == "alibi":
        options["alibi"] = True
    return options


class FusedTriton(Contender):
    name = "fused_triton"
    description = (
        "our Triton FlashAttention-2 kernels, forward and backward (CUDA; tiles tuned once, masked blocks skipped; "
        "windows, documents, softcap and ALiBi in the kernel; a paged cache is gathered inside the timed call)"
    )
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({"float16", "bfloat16", "float32"}),
        min_head_dim=16,
        max_head_dim=256,
        masks=ALL_MASKS - {"mixed", "chunked"},  # chunked: the kernel's own support is issue 23
        score_mods=ALL_SCORE_MODS,
        paged="gather",
        gqa=True,
        cross=True,
        backward=True,
    )
    # What Triton's CPU interpreter can run: the same, on CPU tensors too.
    interpreter_capabilities = dataclasses.replace(capabilities, devices=frozenset({"cpu", "cuda"}))

    def availability(self) -> str | None:
        try:
            kernels = _kernels()
        except Exception as exc:  # ImportError, or a Triton too old or broken to define the kernel
            return f"triton is not installed or failed to import ({type(exc).__name__}: {exc})"
        if not kernels.INTERPRETED and not torch.cuda.is_available():
            return NEEDS_CUDA
        return None

    def unsupported_reason(self, workload: Workload) -> str | None:
        if workload.device == "cpu" and _interpreted():
            return self.interpreter_capabilities.unsupported_reason(workload)
        return super().unsupported_reason(workload)

    def predicted_seconds(self, workload: Workload, flops_per_s: float, bytes_per_s: float) -> float:
        if workload.device == "cpu" and _interpreted():
            return _interpreter_seconds(workload)  # the interpreter's steps, not FLOPs, set its time
        return super().predicted_seconds(workload, flops_per_s, bytes_per_s)

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        kernels = _kernels()
        q, k, v = inputs.q, inputs.k, inputs.v
        plan = kernels.make_plan(q, k, v, scale=inputs.scale, **_mask_options(inputs, workload))
        plan.tune(q.detach(), k.detach(), v.detach(), backward=workload.pass_ != "fwd")  # once, untimed
        attend = kernels.attend

        def run() -> torch.Tensor:
            return attend(inputs.q, inputs.k, inputs.v, plan)

        run.plan = plan  # type: ignore[attr-defined]  # the tiles it launches, for tests and reports
        return run


contender = FusedTriton()
