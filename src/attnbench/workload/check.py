"""The correctness gate: a contender's output against the float64 reference, per-dtype tolerances."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.measure.allocator import uncached
from attnbench.workload._problem import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.reference import checked_rows, reference_grads, reference_output

# (atol, rtol): pass when |out - ref| <= atol + rtol·|ref| everywhere. Chosen a few output ulps wide
# for the dtype at |out| ≈ 1 (outputs are averages of unit normals), so rounding passes and a wrong
# mask, scale or head mapping (errors of order 0.1–1) never does. A KV cache narrower than the dtype
# (kv_dtype: bf16, or fp8 with scales) keeps the dtype's tolerance: the reference reads the stored values
# times their scales, so fp8's rounding of k and v (up to 2^-4 of a value in e4m3, 2^-3 in e5m2) is in the
# data both sides see; a contender adds at most one rounding of the dequantized k and v to the dtype, the
# size of its compute's own (tests/test_kv_dtype.py measures both, and that reading the draws instead fails).
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-9),
    "float32": (1e-4, 1e-4),
    "float16": (3e-3, 3e-3),
    "bfloat16": (2.4e-2, 2.4e-2),
}
# Element-wise, a bf16 row of a long sequence (|out| ≈ 0.02) may be off by far more than its rounding: a key too
# many or too few in a row of thousands, or a page read from the wrong place, errs by well under atol everywhere
# and yet by several percent of the row. So the checked rows must also agree on average: their RMS error relative
# to each row's own size, sqrt(mean over rows of |out − ref|² / |ref|²), at most the dtype's rtol. Correct kernels
# sit far inside it: `attnbench run --suite edges --dtype float32,float16,bfloat16 --budget-s 0.01 --no-memory` on
# the 2-vCPU AMD EPYC (Zen 5) VM, 1,290 ok rows of bmm, einsum, flex, fused_cpu, naive, sdpa_flash and sdpa_math
# over every mask and feature at odd shapes (its `rms_err` column), read at most 5.3e-3 in bf16 (bmm, einsum and
# naive: their scores and probabilities rounded to bf16), 6.5e-4 in fp16, 3.3e-7 in fp32; fused_triton the same
# suite in Triton's interpreter (TRITON_INTERPRET=1, --dtype float16,bfloat16: 124 rows) 5.3e-3 and 2.7e-4 — while
# a decode step over 32k keys that reads the page table one page off errs by 3.2e-2 in bf16 (tests/test_check.py).
# An fp8 forward has none: rounding P to e4m3 alone costs it 1.9–2.5e-2 on random normals, about bf16's rtol and
# too near its own (S 16–1024, emulated: tests/test_fp8_forward.py::test_rounding_p_to_e4m3_costs_more_than_bf16…).
#
# An fp8 forward (q_dtype float8_e4m3fn: q, k and v in e4m3 with their scales, read by the reference as stored)
# rounds the probabilities to e4m3 for P·V, as FlashAttention-3 and cuDNN do: up to 2^-4 of each p. Emulated in
# float32 on random normals (S 16–1024, D 64/128, none and causal, tests/test_fp8_forward.py) that costs up to
# 1.8× bf16's tolerance, in rows that see few keys; this one is 2.5× bf16's (a wrong scale or mask still errs by
# 0.1–1 at |out| ≈ 1).
FP8_FORWARD_TOLERANCE = (6e-2, 6e-2)


def tolerance(w: Workload) -> tuple[float, float]:
    """(atol, rtol) of a case's output: its dtype's, or an fp8 forward's."""
    return FP8_FORWARD_TOLERANCE if w.q_dtype != w.dtype else TOLERANCES[w.dtype]


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    max_abs_err: float
    atol: float
    rtol: float
    checked_rows: int
    reason: str = ""
    rms_err: float | None = None  # the checked rows' RMS error relative to each row's size (relative_rms); None
    # where no output could be compared (not a tensor, the wrong shape, NaN or inf)


def relative_rms(diff: torch.Tensor, expected: torch.Tensor) -> tuple[float, torch.Tensor]:
    """sqrt(mean over rows of |got − expected|² / |expected|²) from ``diff`` = |got − expected|, a row the last
    dimension, over the rows whose expected value is not zero (a row that sees no key is all zeros: the element-wise
    check covers it); and each row's relative error (zeros where skipped), the shape of ``expected`` without its
    last dimension."""
    size = expected.norm(dim=-1)
    seen = size > 0
    per_row = torch.where(seen, diff.norm(dim=-1) / size.clamp_min(1e-300), torch.zeros_like(size))
    return (float(per_row[seen].square().mean().sqrt()) if bool(seen.any()) else 0.0), per_row


def spans(picked: list[int], among: list[int], most: int = 4) -> str:
    """The indices ``picked`` (sorted, a subset of ``among``) as runs of neighbours in ``among``: ``64–99`` where
    every checked index from 64 to 99 is picked, ``0, 5–7`` …, the first ``most`` runs and ``…`` after them."""
    position = {index: n for n, index in enumerate(among)}
    runs: list[list[int]] = []
    for index in picked:
        if runs and position[index] == position[runs[-1][-1]] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    text = ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}" for run in runs[:most])
    return text + (", …" if len(runs) > most else "")


def where_wrong(
    wrong: torch.Tensor, rows: list[int], unit: str = "row", heads: str = "head", checked: str = " checked"
) -> str:
    """Where the elements flagged in ``wrong`` (B, H, N, D) lie: the ``rows`` (the N indices: the query rows checked,
    or a gradient's keys, ``unit`` names them and ``checked`` follows their count) with a wrong element, the heads
    and, where B > 1, the batch elements — what a kernel author reads to find the tile, the mask edge or the head
    mapping at fault (``rows 64–99 (36 of 100 checked), every head (8)``)."""
    batches, all_heads, n = wrong.shape[:3]
    flat = wrong.reshape(batches, all_heads, n, -1).any(-1)
    clauses = []
    for name, found, every, among in (
        (unit, flat.any(1).any(0), n, rows),
        (heads, flat.any(2).any(0), all_heads, list(range(all_heads))),
        ("batch element", flat.any(2).any(1), batches, list(range(batches))),
    ):
        if name == "batch element" and batches == 1:
            continue
        picked = [among[i] for i in found.nonzero().flatten().tolist()]
        if len(picked) == every:
            clauses.append(f"every {name}{checked if name == unit else ''} ({every})")
        else:
            of = f"{len(picked)} of {every}{checked}" if name == unit else f"of {every}"
            clauses.append(f"{name}{'s' if len(picked) > 1 else ''} {spans(picked, among)} ({of})")
    return ", ".join(clauses)


def compare(
    output: object,
    expected: torch.Tensor,
    expected_shape: tuple[int, ...],
    atol: float,
    rtol: float,
    rows: int,
    row_index: list[int] | None = None,
    rms_limit: float | None = None,
) -> CheckResult:
    """``output`` (sliced to the checked rows) against ``expected`` in float64: pass when
    |out − ref| ≤ atol + rtol·|ref| everywhere and, given ``rms_limit``, the rows' relative RMS error
    (:func:`relative_rms`) is at most it. Given ``row_index`` (the query rows checked, of a (B, H, rows, D)
    output), the reason of a failed check says where the wrong elements (or rows) lie (:func:`where_wrong`) and
    the worst."""
    if not isinstance(output, torch.Tensor):
        return CheckResult(False, math.inf, atol, rtol, 0, f"returned {type(output).__name__}, not a tensor")
    if tuple(output.shape) != expected_shape:
        return CheckResult(
            False, math.inf, atol, rtol, 0, f"output shape {tuple(output.shape)}, expected {expected_shape}"
        )
    got = output.detach().double()
    finite = torch.isfinite(got)
    if not finite.all():
        at = f" in {where_wrong(~finite, row_index)}" if row_index is not None else ""
        return CheckResult(False, math.inf, atol, rtol, rows, f"output holds NaN or inf{at}")
    diff = (got - expected).abs()
    max_abs_err = float(diff.max()) if diff.numel() else 0.0
    rms_err, per_row = relative_rms(diff, expected) if expected.numel() else (0.0, expected)
    wrong = diff > atol + rtol * expected.abs()
    if diff.numel() and bool(wrong.any()):
        reason = f"max_abs_err {max_abs_err:.3g} over tolerance atol={atol:g} rtol={rtol:g}"
        if row_index is not None:
            worst = int(diff.argmax())
            batch, head, row, column = (int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape))
            reason += (
                f"; wrong in {where_wrong(wrong, row_index)}; the worst at batch {batch} head {head} "
                f"row {row_index[row]} column {column}: {float(got.flatten()[worst]):.4g}, "
                f"expected {float(expected.flatten()[worst]):.4g}"
            )
        return CheckResult(False, max_abs_err, atol, rtol, rows, reason, rms_err)
    if rms_limit is not None and rms_err > rms_limit:
        reason = (
            f"relative RMS error {rms_err:.3g} over {rms_limit:g}; every element is within atol={atol:g} "
            f"rtol={rtol:g}, but the rows are off on average (a key too many or too few, a block or page read from "
            "the wrong place)"
        )
        if row_index is not None:
            worst = int(per_row.argmax())
            batch, head, row = (int(i) for i in torch.unravel_index(torch.tensor(worst), per_row.shape))
            off = where_wrong((per_row > rms_limit)[..., None], row_index)
            reason += (
                f"; rows off by more than {rms_limit:g} of their size in {off}; the worst at batch {batch} head {head} "
                f"row {row_index[row]}: {float(per_row.flatten()[worst]):.3g}"
            )
        return CheckResult(False, max_abs_err, atol, rtol, rows, reason, rms_err)
    return CheckResult(True, max_abs_err, atol, rtol, rows, rms_err=rms_err)


def check_output(
    inputs: AttentionInputs,
    output: object,
    reference: Callable[[AttentionInputs, torch.Tensor], torch.Tensor] = reference_output,
) -> CheckResult:
    """Compare ``output`` (B, Hq, Sq, Dv) with the float64 reference on the checked query rows
    (:func:`attnbench.workload.reference.checked_rows`): element-wise within the tolerance, and on average within
    rtol of each row's size (none for an fp8 forward: see the tolerances above)."""
    w = inputs.workload
    atol, rtol = tolerance(w)
    rms_limit = rtol if w.q_dtype == w.dtype else None
    rows = checked_rows(w)
    expected_shape = (w.batch, w.heads, w.seq_q, w.head_dim_v)
    if isinstance(output, torch.Tensor) and tuple(output.shape) == expected_shape:
        output = output[:, :, rows.to(output.device)]
        expected_shape = (w.batch, w.heads, len(rows), w.head_dim_v)
    with uncached():  # the float64 temporaries leave no fragments in the allocator's cache
        checked = rows.tolist()
        result = compare(output, reference(inputs, rows), expected_shape, atol, rtol, len(rows), checked, rms_limit)
    kind = w.dtype if w.q_dtype == w.dtype else f"{w.q_dtype} forward"
    reason = result.reason
    if reason.startswith(("max_abs_err", "relative RMS")):  # the dtype names the tolerance: "… (float32); wrong in …"
        head, _, where = reason.partition(";")
        reason = f"{head} ({kind})" + (f";{where}" if where else "")
    if isinstance(output, torch.Tensor) and reason.startswith("output shape"):
        reason += " = (batch, heads, seq_q, head_dim_v)"
        if tuple(output.shape) == (w.batch, w.seq_q, w.heads, w.head_dim_v):  # flash-attn's and xformers' layout
            reason += "; it is (batch, seq_q, heads, head_dim_v), flash-attn's layout: return out.transpose(1, 2)"
    return CheckResult(result.ok, result.max_abs_err, atol, rtol, result.checked_rows, reason, result.rms_err)


# Gradients are compared relative to their own largest magnitude (their scale depends on the shapes:
# dk and dv sum over every query row), so the tolerance is a fraction of max|reference gradient|.
GRAD_TOLERANCES: dict[str, float] = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}


@dataclass(frozen=True)
class GradCheck:
    ok: bool
    grad_err: float  # max over dq, dk, dv (and dsinks with learned sinks) of max|g − g_ref| / max|g_ref|
    grad_tol: float
    reason: str = ""


def check_grads(inputs: AttentionInputs, grads: object) -> GradCheck:
    """Compare a contender's (dq, dk, dv) — and dsinks, the sink logits' gradient, with learned sinks — with
    the float64 reference gradients."""
    tolerance = GRAD_TOLERANCES[inputs.workload.dtype]
    names = ("dq", "dk", "dv") if inputs.sinks is None else ("dq", "dk", "dv", "dsinks")
    if not (
        isinstance(grads, tuple | list) and len(grads) == len(names) and all(isinstance(g, torch.Tensor) for g in grads)
    ):
        return GradCheck(False, math.inf, tolerance, f"backward did not give the gradient tensors {', '.join(names)}")
    with uncached():  # the float64 temporaries leave no fragments in the allocator's cache
        expected_grads = reference_grads(inputs)
    worst, worst_name, worst_where = 0.0, "", ""
    for name, got, expected in zip(names, grads, expected_grads, strict=True):
        if tuple(got.shape) != tuple(expected.shape):
            shapes = f"{name} shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
            return GradCheck(False, math.inf, tolerance, shapes)
        got64 = got.detach().double()
        finite = torch.isfinite(got64)
        if not finite.all():
            where = _grad_where(name, ~finite)
            return GradCheck(False, math.inf, tolerance, f"{name} holds NaN or inf" + (f" in {where}" if where else ""))
        diff = (got64 - expected).abs()
        gradient_scale = max(float(expected.abs().max()), 1e-30)
        error = float(diff.max()) / gradient_scale
        if error > worst:
            worst, worst_name = error, name
            worst_where = _grad_where(name, diff > tolerance * gradient_scale)
    if worst > tolerance:
        reason = f"{worst_name} error {worst:.3g} of its scale, over {tolerance:g}"
        reason += f"; wrong in {worst_where}" if worst_where else ""
        return GradCheck(False, worst, tolerance, reason)
    return GradCheck(True, worst, tolerance)


def _grad_where(name: str, wrong: torch.Tensor) -> str:
    """Where a gradient is wrong (:func:`where_wrong`), for one of q (B, Hq, Sq, D: query rows) or of k and v
    (B, Hkv, Sk, D: keys); empty for the sinks' (one value per head)."""
    if wrong.dim() != 4:
        return ""
    unit, heads = ("query row", "head") if name == "dq" else ("key", "kv head")
    return where_wrong(wrong, list(range(wrong.shape[2])), unit, heads, checked="")
