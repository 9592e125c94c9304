"""The source documents' worked example: self-attention of a 3×4 input with 4×2 projections, scale 1."""

import pytest
import torch

from attnbench import Workload
from attnbench.contenders import registry
from attnbench.workload.inputs import AttentionInputs

INPUT = torch.tensor(
    [[0.4313, 1.3749, -0.2489, 1.3275], [-0.6467, 1.6335, 2.8923, 0.9124], [0.2326, -0.2314, 0.3554, 0.0892]]
)
W_QUERY = torch.tensor([[0.3673, -0.8505], [-0.3559, -0.3708], [-1.2093, 0.6634], [0.4042, 0.8015]])
W_KEY = torch.tensor([[-1.1617, 0.4023], [-0.1249, -0.1605], [-0.8427, 1.1002], [-1.1320, 0.4611]])
W_VALUE = torch.tensor([[-0.7675, -0.3179], [-1.1910, -0.6937], [-1.4809, -1.5502], [-0.7373, 1.0511]])
EXPECTED = torch.tensor([[-2.1390, -0.8160], [-6.4048, -4.4521], [-4.2510, -2.3272]])
WORKLOAD = Workload(batch=1, heads=1, kv_heads=1, seq_q=3, seq_k=3, head_dim=2, scale=1.0)

RUNNABLE = [
    name
    for name, entry in sorted(registry.load().items())
    if entry.available
    and entry.contender is not None
    and entry.contender.kind == "attention"  # scoring functions compute other functions by design
    and entry.contender.unsupported_reason(WORKLOAD) is None
]


def test_the_usual_contenders_can_run_it():
    assert {"naive", "bmm", "einsum", "sdpa_math", "sdpa_flash"} <= set(RUNNABLE)


@pytest.mark.parametrize("impl", RUNNABLE)
def test_contender_reproduces_the_worked_example(impl):
    q, k, v = (INPUT @ w for w in (W_QUERY, W_KEY, W_VALUE))  # (3, 2) each: self-attention projections
    shape = (1, 1, 3, 2)
    inputs = AttentionInputs(WORKLOAD, q.reshape(shape), k.reshape(shape), v.reshape(shape), torch.zeros(shape))
    out = registry.get(impl).contender.prepare(inputs, WORKLOAD)()
    assert torch.allclose(out.reshape(3, 2), EXPECTED, atol=1e-3), out


def test_flex_says_why_it_cannot():
    reason = registry.get("flex").contender.unsupported_reason(WORKLOAD)
    assert reason == "head_dim 2 outside [16, ∞]"
