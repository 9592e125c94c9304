import pytest
import torch

from attnbench import Workload, make_inputs
from attnbench.workload.reference import reference_output, sample_rows


def _dense_reference(inputs):
    """Straight from the definition with explicit loops over the mask rule, for a tiny case."""
    w = inputs.workload
    q, k, v = inputs.q.double(), inputs.k.double(), inputs.v.double()
    out = torch.zeros(w.batch, w.heads, w.seq_q, w.head_dim, dtype=torch.float64)
    lengths = inputs.lengths
    for b in range(w.batch):
        for h in range(w.heads):
            kv = h // w.gqa_group
            for i in range(w.seq_q):
                keys = [
                    j
                    for j in range(w.seq_k)
                    if (w.mask == "none")
                    or (w.mask == "causal" and j <= i)
                    or (w.mask == "causal_bottom_right" and j - i <= w.seq_k - w.seq_q)
                    or (w.mask == "padding" and j < lengths[b])
                ]
                if not keys:
                    continue
                scores = torch.stack([q[b, h, i] @ k[b, kv, j] * w.softmax_scale for j in keys])
                weights = torch.softmax(scores, dim=0)
                out[b, h, i] = sum(weights[n] * v[b, kv, j] for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("mask", ["none", "causal", "causal_bottom_right", "padding"])
@pytest.mark.parametrize(("seq_q", "seq_k"), [(6, 6), (4, 7), (7, 4)])
def test_reference_matches_the_definition(mask, seq_q, seq_k):
    inputs = make_inputs(Workload(2, 4, 2, seq_q, seq_k, 8, mask=mask))
    rows = sample_rows(seq_q)
    got = reference_output(inputs, rows)
    assert torch.allclose(got, _dense_reference(inputs), atol=1e-12)


def test_rows_without_keys_are_zero():
    inputs = make_inputs(Workload(1, 2, 2, 6, 4, 8, mask="causal_bottom_right"))
    out = reference_output(inputs, sample_rows(6))
    assert torch.count_nonzero(out[:, :, :2]) == 0
    assert torch.count_nonzero(out[:, :, 2:]) == out[:, :, 2:].numel()


def test_sampled_rows_cover_first_and_last():
    rows = sample_rows(10_000)
    assert len(rows) <= 256 and rows[0] == 0 and rows[-1] == 9_999
    assert torch.equal(sample_rows(100), torch.arange(100))


def test_inputs_are_seeded_normals_not_zeros():
    w = Workload(1, 2, 2, 64, 64, 16)
    a, b = make_inputs(w), make_inputs(w)
    assert torch.equal(a.q, b.q) and not torch.equal(a.q, a.k)
    assert abs(float(a.q.std()) - 1) < 0.2 and bool((a.q != 0).all())
    assert not torch.equal(make_inputs(w, seed=1).q, a.q)
