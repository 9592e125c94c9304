"""Learned attention sinks (gpt-oss, ``--sinks learned``): the reference from the definition, the contenders
that run them forward and backward against it (the sink logits' gradient included), the reasons of those that
do not, and bad input."""

import math

import pytest
import torch

from attnbench.contenders import registry
from attnbench.impls._grouped import materialised_bytes
from attnbench.impls._sinks import rescaled_by_sink
from attnbench.runner.cases import not_runnable, prepare_checked
from attnbench.workload import Workload
from attnbench.workload.check import check_grads, check_output
from attnbench.workload.flops import attention_bytes, attention_flops
from attnbench.workload.inputs import AttentionInputs, make_inputs
from attnbench.workload.reference import reference_grads, reference_output

from conftest import CHECKED, attnbench_cmd, run_subprocess

# Odd shapes: Sq ≠ Sk, GQA (6 query heads on 2 kv heads), an odd head dim; decode: Sq 1 against 300 keys.
SHAPES = {
    "causal": dict(batch=2, heads=6, kv_heads=2, seq_q=13, seq_k=29, head_dim=17, mask="causal"),
    "sliding_window": dict(
        batch=2, heads=6, kv_heads=2, seq_q=13, seq_k=29, head_dim=17, mask="sliding_window", window=7
    ),
    "decode": dict(batch=2, heads=6, kv_heads=2, seq_q=1, seq_k=300, head_dim=17, mask="causal_bottom_right"),
}
FORWARD = ("bmm", "einsum", "naive")
BACKWARD = ("bmm", "einsum")  # naive has no backward; flex has none on CPU


def _workload(shape: str, **more: object) -> Workload:
    return Workload(**SHAPES[shape], sinks="learned", **more)


def _by_definition(w: Workload) -> torch.Tensor:
    """(B, Hq, Sq, D) in float64, written out from the definition for each row on its own: visible keys j,
    out = Σ_j exp(s_j)·v_j / (exp(sink_h) + Σ_j exp(s_j)), zeros for a row that sees no key."""
    inputs = make_inputs(w)
    q, k, v, sinks = inputs.q.double(), inputs.k.double(), inputs.v.double(), inputs.sinks.double()
    out = torch.zeros(w.batch, w.heads, w.seq_q, w.head_dim, dtype=torch.float64)
    for b in range(w.batch):
        for h in range(w.heads):
            for i in range(w.seq_q):
                diagonal = i + (w.seq_k - w.seq_q) if w.mask != "causal" else i  # the last key row i sees
                first = diagonal - w.window + 1 if w.mask == "sliding_window" else 0
                keys = range(max(first, 0), min(diagonal + 1, w.seq_k))
                if not keys:
                    continue
                kv = h // w.gqa_group
                scores = torch.stack([q[b, h, i] @ k[b, kv, j] for j in keys]) / math.sqrt(w.head_dim)
                weights = torch.exp(scores)
                out[b, h, i] = (weights @ v[b, kv, keys.start : keys.stop]) / (torch.exp(sinks[h]) + weights.sum())
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_the_reference_is_the_definition(shape):
    w = _workload(shape)
    inputs = make_inputs(w)
    assert inputs.sinks.shape == (w.heads,) and inputs.sinks.dtype == torch.float32
    assert float(inputs.sinks.abs().max()) > 1.0  # the order of the scores, not a rounding error
    assert torch.allclose(reference_output(inputs, torch.arange(w.seq_q)), _by_definition(w), atol=1e-12, rtol=1e-12)


def test_a_row_that_sees_no_key_gives_zeros_with_sinks():
    """Bottom-right causal with Sq 9 > Sk 4: rows 0–4 see no key; the sum above the line is empty, so zeros."""
    w = Workload(1, 2, 1, 9, 4, 8, mask="causal_bottom_right", sinks="learned")
    out = reference_output(make_inputs(w), torch.arange(9))
    assert torch.equal(out[:, :, :5], torch.zeros_like(out[:, :, :5]))
    assert float(out[:, :, 5:].abs().amax(-1).min()) > 0
    for impl in ("bmm", "naive"):
        prepared = prepare_checked(impl, w)
        assert prepared.ok, (impl, prepared.reason)
    backward = prepare_checked(
        "einsum", Workload(1, 2, 1, 9, 4, 8, mask="causal_bottom_right", sinks="learned", pass_="fwd_bwd")
    )
    assert backward.ok, backward.reason


@pytest.mark.parametrize("impl", FORWARD)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_ok_against_float64(impl, shape):
    prepared = prepare_checked(impl, _workload(shape))
    assert prepared.ok, prepared.reason
    assert prepared.check.max_abs_err < 1e-5 and prepared.check.checked_rows == SHAPES[shape]["seq_q"]


@pytest.mark.parametrize("impl", BACKWARD)
@pytest.mark.parametrize("shape", SHAPES)
def test_fwd_bwd_ok_with_the_sink_gradient_checked(impl, shape):
    prepared = prepare_checked(impl, _workload(shape, pass_="fwd_bwd"))
    assert prepared.ok, prepared.reason
    assert prepared.grad_check is not None and prepared.grad_check.grad_err < 1e-5


def test_the_sink_gradient_is_the_closed_form_and_a_wrong_one_is_caught():
    """d⟨out, g⟩/d sink_h = −Σ_rows p_sink·(g·out), p_sink = exp(sink)/denominator = sigmoid(sink − lse of the
    row's visible scores); the check names dsinks when it is off by 1 %, and wants four gradients, not three."""
    w = _workload("causal", pass_="fwd_bwd")  # top-left causal: row i sees keys 0..i
    inputs = make_inputs(w, requires_grad=True)
    dq, dk, dv, dsinks = reference_grads(inputs)
    q, k = inputs.q.detach().double(), inputs.k.detach().double().repeat_interleave(w.gqa_group, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(w.head_dim)  # (B, Hq, Sq, Sk)
    hidden = torch.ones(w.seq_q, w.seq_k, dtype=torch.bool).triu(1)
    lse = scores.masked_fill(hidden, float("-inf")).logsumexp(-1)  # (B, Hq, Sq)
    p_sink = torch.sigmoid(inputs.sinks.detach().double().view(1, -1, 1) - lse)
    out = reference_output(inputs, torch.arange(w.seq_q))
    closed = -(p_sink * (inputs.grad_out.double() * out).sum(-1)).sum(dim=(0, 2))
    assert torch.allclose(dsinks, closed, atol=1e-10, rtol=1e-10)
    good = check_grads(inputs, tuple(g.float() for g in (dq, dk, dv, dsinks)))
    assert good.ok, good.reason
    wrong = dsinks.float().clone()
    wrong[int(dsinks.abs().argmax())] *= 1.01
    bad = check_grads(inputs, (dq.float(), dk.float(), dv.float(), wrong))
    assert not bad.ok and bad.reason.startswith("dsinks error"), bad.reason
    missing = check_grads(inputs, (dq.float(), dk.float(), dv.float()))
    assert not missing.ok and missing.reason == "backward did not give the gradient tensors dq, dk, dv, dsinks"


def test_a_contender_that_ignores_the_sink_is_incorrect():
    """bmm on the same q, k, v without sinks, checked against the reference with them: over tolerance."""
    plain = make_inputs(Workload(**SHAPES["decode"]))
    w = _workload("decode")
    with_sinks = AttentionInputs(w, plain.q, plain.k, plain.v, plain.grad_out)
    output = registry.get("bmm").contender.prepare(plain, plain.workload)()
    result = check_output(with_sinks, output)
    assert not result.ok and result.max_abs_err > 1e-3, result


@pytest.mark.parametrize("impl", ["sdpa_math", "sdpa_flash", "flex", "naive"])  # fused_cpu runs it: features tests
def test_the_others_say_why_not(impl):
    verdict = not_runnable(impl, _workload("decode", pass_="fwd_bwd"))
    assert verdict is not None and verdict[0] in ("unsupported", "unavailable")
    if verdict[0] == "unavailable":
        return
    reason = verdict[1]
    expected = {
        "sdpa_math": "sinks learned not supported: SDPA's softmax has no sink term",
        "sdpa_flash": "sinks learned not supported: SDPA's softmax has no sink term",
        "flex": "FlexAttention has no backward on CPU",
        "naive": "pass fwd_bwd needs backward support",
    }[impl]
    assert reason.startswith(expected), reason


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_on_cpu_says_why_and_its_rescaling_is_right():
    """Compiled flex on CPU returns no lse (unsupported, with torch's words); the rescaling it uses on a GPU,
    out · sigmoid(lse − sink), is checked here on eager flex's forward (which does return the lse)."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    verdict = not_runnable("flex", _workload("causal"))
    assert verdict is not None and "return_lse is not supported yet" in verdict[1]
    w = Workload(1, 4, 4, 32, 32, 16, mask="none", sinks="learned")
    inputs = make_inputs(w)
    out, aux = flex_attention(inputs.q, inputs.k, inputs.v, return_aux=AuxRequest(lse=True))
    got = rescaled_by_sink(out, aux.lse, inputs.sinks)
    assert torch.allclose(got.double(), reference_output(inputs, torch.arange(32)), atol=1e-5)


def test_counts_and_memory():
    """FLOPs and bytes do not count the sink (O(Hq·Sq)); the materialising contenders hold one more score
    matrix (the scores with the sink column concatenated)."""
    plain, sinks = Workload(**SHAPES["causal"]), _workload("causal")
    assert attention_flops(sinks) == attention_flops(plain) and attention_bytes(sinks) == attention_bytes(plain)
    score = 2 * 6 * 13 * 29 * 4
    assert materialised_bytes(sinks) - materialised_bytes(plain) == score


@pytest.mark.slow
def test_the_label_and_a_cli_run(tmp_path):
    out = tmp_path / "runs"
    args = [
        "run",
        "--impl",
        "bmm,sdpa_math",
        "--seq",
        "64",
        "--seq-kv",
        "300",
        "--heads",
        "6",
        "--kv-heads",
        "2",
        "--head-dim",
        "17",
        "--batch",
        "2",
        "--mask",
        "sliding_window",
        "--window",
        "32",
        "--sinks",
        "learned",
        "--budget-s",
        "0.02",
        "--out",
        str(out),
    ]
    result = run_subprocess(*attnbench_cmd(*args), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    import pandas as pd

    (csv,) = out.rglob("results.csv")
    rows = pd.read_csv(csv).set_index("impl")  # one case, two contenders
    assert rows.loc["bmm", "status"] in CHECKED and rows.loc["bmm", "sinks"] == "learned"
    assert rows.loc["sdpa_math", "status"] == "unsupported"
    assert "SDPA's softmax has no sink term" in rows.loc["sdpa_math", "reason"]
    assert "sinks" in _workload("causal").label().split()


def test_sinks_bogus_is_one_line_exit_2_nothing_written(tmp_path):
    result = run_subprocess(*attnbench_cmd("run", "--sinks", "bogus", "--out", str(tmp_path / "runs")), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "bogus" in result.stderr and "none, learned" in result.stderr
    assert list(tmp_path.iterdir()) == []
