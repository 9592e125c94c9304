import math

import torch

from attnbench import Workload, make_inputs
from attnbench.workload.check import check_grads, check_output, spans
from attnbench.workload.reference import reference_grads, reference_output, sample_rows


def _correct(inputs):
    w = inputs.workload
    return reference_output(inputs, sample_rows(w.seq_q)).to(w.torch_dtype)


def test_correct_output_passes_and_records_error():
    inputs = make_inputs(Workload(1, 2, 2, 32, 32, 16, mask="causal"))
    result = check_output(inputs, _correct(inputs))
    assert result.ok and result.max_abs_err < 1e-6 and result.checked_rows == 32


def test_scale_divided_by_d_instead_of_sqrt_d_is_caught():
    inputs = make_inputs(Workload(1, 2, 2, 32, 32, 16))
    q, k, v = inputs.q, inputs.k, inputs.v
    wrong = torch.softmax(q @ k.transpose(-1, -2) / 16, dim=-1) @ v
    result = check_output(inputs, wrong)
    assert not result.ok and result.max_abs_err > 1e-2
    assert "over tolerance" in result.reason


def test_nan_shape_and_type_are_caught():
    inputs = make_inputs(Workload(1, 2, 2, 8, 8, 4))
    bad = _correct(inputs)
    bad[0, 0, 0, 0] = float("nan")
    assert check_output(inputs, bad).reason == "output holds NaN or inf in row 0 (1 of 8 checked), head 0 (of 2)"
    assert check_output(inputs, torch.zeros(1, 2, 8, 5)).reason == (
        "output shape (1, 2, 8, 5), expected (1, 2, 8, 4) = (batch, heads, seq_q, head_dim_v)"
    )
    # a kernel written for flash-attn's layout returns (batch, seq_q, heads, head_dim_v): told to transpose
    assert check_output(inputs, _correct(inputs).transpose(1, 2)).reason == (
        "output shape (1, 8, 2, 4), expected (1, 2, 8, 4) = (batch, heads, seq_q, head_dim_v); it is "
        "(batch, seq_q, heads, head_dim_v), flash-attn's layout: return out.transpose(1, 2)"
    )
    result = check_output(inputs, [1, 2])
    assert not result.ok and math.isinf(result.max_abs_err) and "not a tensor" in result.reason


def test_bf16_tolerance_accepts_rounding_but_not_a_wrong_mask():
    inputs = make_inputs(Workload(1, 2, 2, 64, 64, 32, dtype="bfloat16", mask="causal"))
    assert check_output(inputs, _correct(inputs)).ok
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    unmasked = torch.softmax(q @ k.transpose(-1, -2) * inputs.scale, dim=-1) @ v
    assert not check_output(inputs, unmasked.bfloat16()).ok


def test_a_wrong_output_says_which_rows_heads_and_batch_elements_are_wrong():
    """A kernel that skips the last, partial query tile (Sq = 100, 64-row tiles) is told where it is wrong: the
    rows, every head, and the worst element with its value and the reference's, not only a max error."""
    inputs = make_inputs(Workload(2, 4, 4, 100, 100, 16, mask="causal"))
    out = reference_output(inputs, torch.arange(100)).float()
    out[:, :, 64:] = 0
    reason = check_output(inputs, out).reason
    assert (
        reason.startswith("max_abs_err ") and "rtol=0.0001 (float32); wrong in rows 64–99 (36 of 100 checked)" in reason
    )
    assert "every head (4), every batch element (2); the worst at batch " in reason
    worst_row = int(reason.split(" row ")[-1].split()[0])
    assert 64 <= worst_row <= 99 and reason.split(": ")[-1].startswith("0, expected ")
    out = reference_output(inputs, torch.arange(100)).float()
    out[1, 2, [3, 7, 8, 9]] += 1  # one head of one batch element, a few rows
    reason = check_output(inputs, out).reason
    assert (
        "wrong in rows 3, 7–9 (4 of 100 checked), head 2 (of 4), batch element 1 (of 2); the worst at batch 1 head 2"
        in reason
    )


def test_where_names_the_checked_rows_when_only_some_are_checked():
    """At long sequences only evenly spaced rows are checked: the rows named are the checked ones, counted as such."""
    inputs = make_inputs(Workload(1, 2, 2, 1000, 1000, 8))
    checked = sample_rows(1000).tolist()
    out = reference_output(inputs, torch.arange(1000)).float()
    out[:, :, 500:] *= 2
    first = next(row for row in checked if row >= 500)
    wrong = sum(row >= 500 for row in checked)
    assert (
        f"wrong in rows {first}–999 ({wrong} of {len(checked)} checked), every head (2);"
        in check_output(inputs, out).reason
    )
    assert spans([1, 2, 3, 5, 9, 11, 20, 30], list(range(31))) == "1–3, 5, 9, 11, …"


def test_a_wrong_gradient_says_which_keys_are_wrong():
    """A backward that drops dk for the second 64-key block says so: dk's keys 64–99, every kv head."""
    inputs = make_inputs(Workload(1, 4, 2, 100, 100, 16), requires_grad=True)
    dq, dk, dv = (g.float() for g in reference_grads(inputs))
    dk[:, :, 64:] = 0
    check = check_grads(inputs, (dq, dk, dv))
    assert not check.ok and check.reason.startswith("dk error ")
    assert check.reason.endswith("; wrong in keys 64–99 (36 of 100), every kv head (2)")
    dq[0, 3, 10] = float("nan")
    assert check_grads(inputs, (dq, dk, dv)).reason == "dq holds NaN or inf in query row 10 (1 of 100), head 3 (of 4)"
