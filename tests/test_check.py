import math

import torch

from attnbench import Workload, make_inputs
from attnbench.workload.check import check_output
from attnbench.workload.reference import reference_output, sample_rows


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
    assert check_output(inputs, bad).reason == "output holds NaN or inf"
    assert "output shape (1, 2, 8, 5)" in check_output(inputs, torch.zeros(1, 2, 8, 5)).reason
    result = check_output(inputs, [1, 2])
    assert not result.ok and math.isinf(result.max_abs_err) and "not a tensor" in result.reason


def test_bf16_tolerance_accepts_rounding_but_not_a_wrong_mask():
    inputs = make_inputs(Workload(1, 2, 2, 64, 64, 32, dtype="bfloat16", mask="causal"))
    assert check_output(inputs, _correct(inputs)).ok
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    unmasked = torch.softmax(q @ k.transpose(-1, -2) * inputs.scale, dim=-1) @ v
    assert not check_output(inputs, unmasked.bfloat16()).ok
