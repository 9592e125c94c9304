"""Backward passes: gradients of q, k, v against float64 reference gradients; nothing accumulates."""

from dataclasses import replace

import pytest
import torch

from attnbench import Workload, make_inputs
from attnbench.runner.cases import RunOptions, prepare_checked, run_case
from attnbench.workload.check import check_grads
from attnbench.workload.flops import attention_bytes, attention_flops
from attnbench.workload.reference import reference_grads

from conftest import CHECKED

AUTOGRAD_CPU = ["bmm", "einsum", "sdpa_math", "sdpa_flash"]


def test_reference_grads_match_autograd_of_the_dense_formula():
    w = Workload(2, 4, 2, 7, 9, 8, mask="causal_bottom_right")
    inputs = make_inputs(w)
    q, k, v = (t.double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * w.softmax_scale
    visible = torch.arange(9).view(1, 9) <= torch.arange(7).view(7, 1) + 2
    out = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v.repeat_interleave(2, dim=1)
    expected = torch.autograd.grad(out, (q, k, v), inputs.grad_out.double())
    for got, want in zip(reference_grads(inputs), expected, strict=True):
        assert torch.allclose(got, want, atol=1e-12)


def test_reference_grads_in_chunks_equal_one_chunk(monkeypatch):
    inputs = make_inputs(Workload(1, 2, 1, 40, 24, 8, mask="padding"))
    whole = reference_grads(inputs)
    monkeypatch.setattr("attnbench.workload.reference.GRAD_CHUNK_ELEMENTS", 2 * 24 * 3)  # 3 rows per chunk
    for got, want in zip(reference_grads(inputs), whole, strict=True):
        assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("impl", AUTOGRAD_CPU)
@pytest.mark.parametrize("pass_", ["bwd", "fwd_bwd"])
@pytest.mark.parametrize("mask", ["none", "causal", "causal_bottom_right", "padding"])
def test_gradients_match_reference(impl, pass_, mask):
    prepared = prepare_checked(impl, Workload(2, 4, 2, 24, 40, 16, mask=mask, pass_=pass_))
    assert prepared.ok, prepared.reason
    assert prepared.grad_check is not None and prepared.grad_check.grad_err < 1e-5


def test_wrong_gradients_are_caught():
    inputs = make_inputs(Workload(1, 2, 2, 8, 8, 4, pass_="bwd"))
    good = reference_grads(inputs)
    assert check_grads(inputs, tuple(g.float() for g in good)).ok
    bad = (good[0], good[1] * 1.1, good[2])
    result = check_grads(inputs, bad)
    assert not result.ok and result.reason.startswith("dk error")


def test_repeated_backward_calls_give_the_same_gradients():
    prepared = prepare_checked("bmm", Workload(1, 2, 2, 16, 16, 8, pass_="bwd"))
    first, second = prepared.fn(), prepared.fn()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)  # no accumulation between samples


def test_backward_rows_and_flops(cli, tmp_path):
    row = run_case("sdpa_flash", Workload(1, 4, 4, 64, 64, 16, pass_="fwd_bwd"), RunOptions(budget_s=0.02))
    assert row["status"] in CHECKED and row["grad_err"] < row["grad_tol"]
    assert row["flops"] == 3.5 * attention_flops(Workload(1, 4, 4, 64, 64, 16))
    row = run_case("flex", Workload(1, 4, 4, 64, 64, 16, pass_="bwd"), RunOptions(budget_s=0.02))
    assert row["status"] == "unsupported" and "no backward on CPU" in row["reason"]
    row = run_case("naive", Workload(1, 4, 4, 64, 64, 16, pass_="bwd"), RunOptions(budget_s=0.02))
    assert row["status"] == "unsupported" and "backward" in row["reason"]


@pytest.mark.parametrize(
    ("mask", "extra", "visible"),
    [
        ("padding", {}, lambda b, i, j: j < (10, 10 // 4)[b]),  # batch 0 full, the last Sk // 4
        ("causal", {}, lambda b, i, j: j <= i),  # top-left: keys 6 … 9 unseen
        ("sliding_window", {"window": 3}, lambda b, i, j: (j <= i + 4) & (j > i + 4 - 3)),  # keys 0, 1 unseen
        ("none", {}, lambda b, i, j: j >= 0),
    ],
)
def test_backward_bytes_read_the_keys_some_row_sees_and_write_every_gradient(mask, extra, visible):
    """Backward reads q, o, dO and the keys and values some query row sees (as the forward does), and writes dq and
    dk, dv for every key (zeros where no row sees it): counted here from a dense mask built by hand."""
    w = Workload(2, 4, 2, 6, 10, 8, mask=mask, head_dim_v=4, pass_="bwd", **extra)
    i, j = torch.arange(6).view(6, 1), torch.arange(10).view(1, 10)
    seen = sum(int(visible(b, i, j).expand(6, 10).any(0).sum()) for b in range(2))
    q, o = 2 * 4 * 6 * 8, 2 * 4 * 6 * 4  # also dq; o and dO
    read, written = seen * 2 * (8 + 4), 2 * 10 * 2 * (8 + 4)
    assert attention_bytes(w) == 4 * (2 * q + 2 * o + read + written)
    forward = replace(w, pass_="fwd")
    assert attention_bytes(replace(w, pass_="fwd_bwd")) == attention_bytes(forward) + attention_bytes(w)
    assert attention_bytes(forward) == 4 * (q + o + read)


def test_bf16_backward_within_tolerance():
    prepared = prepare_checked(
        "sdpa_flash", Workload(2, 4, 2, 33, 47, 24, dtype="bfloat16", mask="padding", pass_="fwd_bwd")
    )
    assert prepared.ok, prepared.reason
