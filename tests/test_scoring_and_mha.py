"""The scoring suite (four score functions, each against its own float64 reference) and the mha suite
(a multi-head attention module around every core, against torch.nn.MultiheadAttention)."""

import pandas as pd
import pytest
import torch

from attnbench import Workload, make_inputs
from attnbench.contenders import registry
from attnbench.runner.cases import RunOptions, prepare_checked, run_case
from attnbench.workload.flops import attention_bytes
from attnbench.workload.mha import module_inputs, reference_module_output

from conftest import CHECKED

SCORING = ["score_dot", "score_scaled_dot", "score_bilinear", "score_additive"]


@pytest.mark.parametrize("impl", SCORING)
@pytest.mark.parametrize("mask", ["none", "causal_bottom_right", "padding"])
def test_scoring_contenders_match_their_own_reference(impl, mask):
    prepared = prepare_checked(impl, Workload(2, 4, 2, 20, 28, 16, mask=mask, hidden=8))
    assert prepared.ok, prepared.reason


def test_scoring_references_are_the_documents_formulas():
    w = Workload(1, 1, 1, 3, 4, 2, hidden=3)
    inputs = make_inputs(w)
    q, k, v = inputs.q[0, 0].double(), inputs.k[0, 0].double(), inputs.v[0, 0].double()
    rows = torch.arange(3)

    def out(scores):
        return (torch.softmax(scores, dim=-1) @ v).view(1, 1, 3, 2)

    expected = {
        "score_dot": out(q @ k.T),
        "score_scaled_dot": out(q @ k.T / 2**0.5),
        "score_bilinear": out(q @ inputs.parameter("bilinear_W", 2, 2).double() @ k.T),
    }
    w_q, w_k, w_vec = (
        inputs.parameter(n, *s).double()
        for n, s in (("additive_Wq", (2, 3)), ("additive_Wk", (2, 3)), ("additive_w", (3,)))
    )
    additive = torch.tensor([[float(w_vec @ torch.tanh(q[i] @ w_q + k[j] @ w_k)) for j in range(4)] for i in range(3)])
    expected["score_additive"] = out(additive.double())
    for name, want in expected.items():
        got = registry.get(name).contender.reference_output(inputs, rows)
        assert torch.allclose(got, want, atol=1e-12), name


def test_additive_memory_is_predicted_and_skipped():
    row = run_case("score_additive", Workload(2, 4, 4, 16384, 16384, 64, hidden=64), RunOptions())
    assert row["status"] == "skipped" and "GiB free" in row["reason"]
    assert row["predicted_mem_mb"] > 2 * 4 * 16384 * 16384 * 64 * 4 * 2 / 2**20 * 0.99


def test_scoring_contenders_are_not_in_all():
    assert not set(SCORING) & set(registry.sweep_names())
    assert "bmm" in registry.sweep_names() and "torch_mha" not in registry.sweep_names()


MHA_SELF = Workload(4, 6, 6, 12, 12, 50, module="mha")
MHA_CROSS = Workload(4, 6, 6, 12, 10, 50, module="mha", mask="padding")


def test_mha_reference_matches_torch_multihead_attention_in_float64():
    inputs = make_inputs(MHA_CROSS)
    m = module_inputs(inputs)
    p = {name: t.double() for name, t in m.weights.items()}
    module = torch.nn.MultiheadAttention(300, 6, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([p["w_q"].T, p["w_k"].T, p["w_v"].T]))
        module.in_proj_bias.copy_(torch.cat([p["b_q"], p["b_k"], p["b_v"]]))
        module.out_proj.weight.copy_(p["w_o"].T)
        module.out_proj.bias.copy_(p["b_o"])
        padding = ~inputs.bool_mask[:, 0, 0, :]
        expected, _ = module(m.x_q.double(), m.x_kv.double(), m.x_kv.double(), key_padding_mask=padding)
    assert torch.allclose(reference_module_output(inputs), expected, atol=1e-10)


@pytest.mark.parametrize("impl", ["torch_mha", "naive", "bmm", "einsum", "sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize("workload", [MHA_SELF, MHA_CROSS], ids=["self", "cross"])
def test_every_core_in_the_mha_module_matches(impl, workload):
    prepared = prepare_checked(impl, workload)
    assert prepared.ok, prepared.reason


@pytest.mark.parametrize("seq_k", [12, 10], ids=["self", "cross"])
def test_mha_bytes_read_each_input_and_weight_once(seq_k):
    """The module's minimum bytes, counted from the tensors it is given: each distinct input (self-attention's one
    x is q's, k's and v's input: read once), the weights and biases, the output; plus the core's q, k, v and o."""
    w = Workload(4, 6, 6, 12, seq_k, 50, module="mha")
    inputs = make_inputs(w)
    m = module_inputs(inputs)
    distinct = {t.data_ptr(): t for t in (m.x_q, m.x_kv, *m.weights.values())}.values()
    module = sum(t.numel() * t.element_size() for t in distinct) + 4 * 12 * 300 * 4  # + the output (B, Sq, E)
    core = sum(t.numel() * t.element_size() for t in (inputs.q, inputs.k, inputs.v)) + inputs.q.numel() * 4  # + o
    assert attention_bytes(w) == module + core


def test_mha_rules():
    assert "mha suite" in registry.get("torch_mha").contender.unsupported_reason(Workload(1, 2, 2, 8, 8, 4))
    reason = registry.get("bmm").contender.unsupported_reason(Workload(1, 2, 2, 8, 8, 4, module="mha", pass_="bwd"))
    assert reason == "the mha module is timed forward only"
    with pytest.raises(ValueError, match="module mha needs kv_heads == heads"):
        Workload(1, 4, 2, 8, 8, 4, module="mha")


@pytest.mark.slow
def test_scoring_and_mha_suites_finish_with_ok_or_skipped_rows(cli, tmp_path):
    for suite, overrides in (("scoring", ["--seq", "64,16384"]), ("mha", ["--batch", "8"])):
        out = tmp_path / suite
        code, _, _ = cli("run", "--suite", suite, *overrides, "--budget-s", "0.02", "--out", str(out))
        assert code == 0
        frame = pd.read_parquet(out / "results.parquet")
        # every core that can run the module does (cascade runs shared prefixes only, which mha has none of)
        other = frame[~frame.status.isin([*CHECKED, "skipped"])]
        assert set(other.impl) <= {"cascade"} and other.reason.str.contains("shared_prefix").all(), other
        assert (frame[frame.status != "ok"].reason.str.len() > 0).all()
        assert frame.status.isin(CHECKED).sum() >= 8
