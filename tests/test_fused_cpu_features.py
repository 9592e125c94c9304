"""fused_cpu on the newest models' workloads (issue 23), natively: a value head dim of its own, learned sinks
(forward and backward, their gradient included), chunked and mixed masks, ragged batches, MLA's latent cache
(heads folded into the rows, values read in place from the keys), and a shared prefix (cascade: the prefix
read once for the batch). Each case is checked against the float64 reference as ``attnbench run`` checks it,
on odd shapes; and the routes are checked to be the native ones (no copy of the cache, one prefix read)."""

from __future__ import annotations

import pytest
import torch

import attnbench.impls.fused_cpu as fused
from attnbench.impls.fused_cpu import bindings, contender, folds, ragged_padding
from attnbench.runner.cases import RunOptions, prepare_checked, run_case
from attnbench.workload import Workload
from attnbench.workload.inputs import make_inputs

pytestmark = pytest.mark.skipif(bindings.unavailable_reason() is not None, reason="no C++ compiler here")

FORWARD = {  # Workload(batch, heads, kv_heads, seq_q, seq_k, head_dim, **features)
    "dv_narrower": Workload(3, 4, 2, 37, 70, 72, mask="causal_bottom_right", head_dim_v=40),
    "dv_wider_decode": Workload(2, 6, 2, 1, 90, 24, head_dim_v=64),
    "sinks": Workload(2, 4, 2, 50, 50, 40, mask="causal", sinks="learned"),
    "sinks_decode_bf16": Workload(3, 8, 2, 1, 130, 64, sinks="learned", dtype="bfloat16"),
    "chunked": Workload(2, 4, 2, 100, 100, 40, mask="chunked", chunk=32),
    "mixed": Workload(4, 4, 2, 20, 150, 40, mask="mixed", decode_share=0.5, lengths="bimodal"),
    "ragged_decode": Workload(5, 4, 2, 1, 300, 40, lengths="longtail"),
    "ragged_prefill": Workload(3, 4, 2, 40, 130, 40, mask="causal_bottom_right", lengths="uniform"),
    "mla_decode": Workload(2, 32, 1, 1, 150, 72, head_dim_v=64, kv_layout="latent"),
    "mla_decode_bf16_paged": Workload(
        2, 32, 1, 1, 150, 72, head_dim_v=64, kv_layout="latent", dtype="bfloat16", page_size=16
    ),
    "prefix": Workload(5, 8, 2, 1, 200, 72, shared_prefix=96),
    "prefix_window_sinks": Workload(
        3, 8, 2, 3, 200, 40, mask="sliding_window", window=150, shared_prefix=96, sinks="learned"
    ),
    "prefix_paged": Workload(4, 8, 2, 1, 200, 40, shared_prefix=64, page_size=32),
    "prefix_bf16_dv": Workload(
        4, 8, 2, 2, 160, 40, shared_prefix=64, head_dim_v=24, dtype="bfloat16", mask="causal_bottom_right"
    ),
}


@pytest.mark.parametrize("w", FORWARD.values(), ids=FORWARD.keys())
def test_forward_matches_float64(w):
    assert contender.unsupported_reason(w) is None
    prepared = prepare_checked("fused_cpu", w)
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.max_abs_err < (2e-2 if w.dtype == "bfloat16" else 1e-5)


BACKWARD = {
    "sinks_dv": Workload(2, 4, 2, 37, 53, 40, mask="causal_bottom_right", sinks="learned", head_dim_v=24),
    "chunked": Workload(2, 4, 2, 70, 70, 24, mask="chunked", chunk=16),
    "ragged": Workload(3, 4, 2, 30, 60, 24, mask="causal_bottom_right", lengths="uniform"),
}


@pytest.mark.parametrize("w", BACKWARD.values(), ids=BACKWARD.keys())
def test_gradients_match_float64(w):
    prepared = prepare_checked("fused_cpu", Workload(**{**w.__dict__, "pass_": "fwd_bwd"}))
    assert prepared.check.ok and prepared.grad_check is not None and prepared.grad_check.ok, prepared.reason
    assert prepared.grad_check.grad_err < 1e-5  # dsinks among them where the case has sinks


def test_sinks_gradient_is_the_kernels_not_zero():
    w = Workload(1, 2, 2, 8, 8, 16, sinks="learned", pass_="fwd_bwd")
    inputs = make_inputs(w, requires_grad=True)
    assert inputs.sinks is not None
    out, _ = fused.fused_attention(inputs.q, inputs.k, inputs.v, scale=w.softmax_scale, sinks=inputs.sinks)
    (dsinks,) = torch.autograd.grad(out, (inputs.sinks,), inputs.grad_out)
    assert dsinks.shape == (2,) and bool((dsinks != 0).all())


def _forward_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Record, for every call of the forward kernel, its k's and v's data pointers and shapes."""
    calls: list[dict[str, object]] = []
    original = bindings.Kernel.forward

    def spy(self, q, k, kt, v, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append({"k": k.data_ptr(), "v": v.data_ptr(), "k_shape": tuple(k.shape), "rows": q.shape[2]})
        return original(self, q, k, kt, v, *args, **kwargs)

    monkeypatch.setattr(bindings.Kernel, "forward", spy)
    return calls


def test_mla_folds_the_heads_and_reads_the_values_in_the_keys(monkeypatch):
    w = FORWARD["mla_decode"]
    inputs = make_inputs(w)
    assert folds(inputs.q, inputs.k, None)
    calls = _forward_calls(monkeypatch)
    contender.prepare(inputs, w)()
    assert calls == [{"k": inputs.k.data_ptr(), "v": inputs.k.data_ptr(), "k_shape": (2, 1, 150, 72), "rows": 32}]


def test_cascade_reads_the_prefix_once_for_the_batch(monkeypatch):
    w = Workload(5, 8, 2, 1, 200, 64, shared_prefix=96)  # Dv a multiple of 16: v read in place, not padded
    inputs = make_inputs(w)
    calls = _forward_calls(monkeypatch)
    contender.prepare(inputs, w)()
    prefix, *suffix = calls  # the suffix (Sq 1, 4 heads a group) may go to the decode kernel instead
    assert prefix == {"k": inputs.k.data_ptr(), "v": inputs.v.data_ptr(), "k_shape": (1, 2, 96, 64), "rows": 5 * 4}
    assert all(call["k_shape"] == (5, 2, 104, 64) for call in suffix)  # no other read of the prefix


def test_ragged_decode_is_the_padding_mask_of_the_decode_kernel():
    w = FORWARD["ragged_decode"]
    lengths = ragged_padding(w)
    assert lengths is not None and lengths.max() == 300 and lengths.min() >= 1 and len(set(lengths.tolist())) > 1
    assert fused.score_options(w) == ("padding", None)
    assert ragged_padding(FORWARD["mixed"]) is None  # prefill rows see a causal range each


def test_what_stays_unsupported_says_why():
    training_prefix = Workload(2, 4, 2, 1, 64, 32, shared_prefix=32, pass_="fwd_bwd")
    row = run_case("fused_cpu", training_prefix, RunOptions(budget_s=0.05))
    assert row["status"] == "unsupported"
    assert "forward only" in row["reason"]
