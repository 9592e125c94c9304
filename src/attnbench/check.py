"""The correctness gate: a contender's output against the float64 reference, per-dtype tolerances."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnbench.inputs import AttentionInputs
from attnbench.reference import reference_output, sample_rows

# (atol, rtol): pass when |out - ref| <= atol + rtol·|ref| everywhere. Chosen a few output ulps wide
# for the dtype at |out| ≈ 1 (outputs are averages of unit normals), so rounding passes and a wrong
# mask, scale or head mapping (errors of order 0.1–1) never does.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-9),
    "float32": (1e-4, 1e-4),
    "float16": (3e-3, 3e-3),
    "bfloat16": (2.4e-2, 2.4e-2),
}


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    max_abs_err: float
    atol: float
    rtol: float
    checked_rows: int
    reason: str = ""


def check_output(inputs: AttentionInputs, output: object) -> CheckResult:
    """Compare ``output`` (B, Hq, Sq, D) with the float64 reference on sampled query rows."""
    w = inputs.workload
    atol, rtol = TOLERANCES[w.dtype]
    expected_shape = (w.batch, w.heads, w.seq_q, w.head_dim)
    if not isinstance(output, torch.Tensor):
        return CheckResult(False, math.inf, atol, rtol, 0, f"returned {type(output).__name__}, not a tensor")
    if tuple(output.shape) != expected_shape:
        return CheckResult(
            False, math.inf, atol, rtol, 0, f"output shape {tuple(output.shape)}, expected {expected_shape}"
        )
    rows = sample_rows(w.seq_q)
    expected = reference_output(inputs, rows)
    got = output.detach()[:, :, rows.to(output.device)].double()
    diff = (got - expected).abs()
    if not torch.isfinite(got).all():
        return CheckResult(False, math.inf, atol, rtol, len(rows), "output holds NaN or inf")
    max_abs_err = float(diff.max()) if diff.numel() else 0.0
    excess = diff - (atol + rtol * expected.abs())
    if diff.numel() and float(excess.max()) > 0:
        return CheckResult(
            False,
            max_abs_err,
            atol,
            rtol,
            len(rows),
            f"max_abs_err {max_abs_err:.3g} over tolerance atol={atol:g} rtol={rtol:g} ({w.dtype})",
        )
    return CheckResult(True, max_abs_err, atol, rtol, len(rows))
