"""fused_cpu on issue 13's workloads through the harness: sliding_window and document masks (key ranges per
row), softcap and alibi score modifiers, a paged KV cache (read in place for decode, gathered by the harness
otherwise),
each checked against the float64 reference as ``attnbench run`` checks it; and decode with one query head per
kv head (an odd number of rows per work item), whose scratch once overran its per-thread block."""

from __future__ import annotations

import ctypes

import pytest
import torch

from attnbench.impls.fused_cpu import bindings as _cpu_kernel
from attnbench.impls.fused_cpu import contender, reads_pages_in_place, score_options
from attnbench.runner._predict import predict
from attnbench.runner.cases import RunOptions, prepare_checked, run_case
from attnbench.workload import Workload
from attnbench.workload import paged as paged_module
from attnbench.workload.paged import gather_bytes, gather_pages

pytestmark = pytest.mark.skipif(_cpu_kernel.unavailable_reason() is not None, reason="no C++ compiler here")

FORWARD = {  # (batch, heads, kv_heads, seq_q, seq_k, head_dim), features; GQA 4/2 unless said
    "window": ((2, 4, 2, 256, 256, 32), {"mask": "sliding_window", "window": 48}),
    "window_sq_lt_sk": ((2, 4, 2, 200, 300, 32), {"mask": "sliding_window", "window": 48}),
    "window_two_blocks": ((1, 2, 2, 600, 600, 40), {"mask": "sliding_window", "window": 300}),
    "document": ((2, 4, 2, 256, 256, 32), {"mask": "document", "documents": 5}),
    "softcap": ((2, 4, 2, 256, 256, 32), {"score_mod": "softcap", "softcap": 20.0}),
    "softcap_window": (
        (1, 4, 1, 130, 300, 24),
        {"score_mod": "softcap", "softcap": 5.0, "mask": "sliding_window", "window": 70},
    ),
    "alibi_causal": ((2, 4, 2, 256, 256, 32), {"score_mod": "alibi", "mask": "causal"}),
    "alibi_bottom_right": ((2, 4, 4, 100, 260, 32), {"score_mod": "alibi", "mask": "causal_bottom_right"}),
}


@pytest.mark.parametrize("case", FORWARD.values(), ids=FORWARD.keys())
def test_new_workloads_match_float64(case):
    shape, features = case
    prepared = prepare_checked("fused_cpu", Workload(*shape, **features))
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.max_abs_err < 1e-5


def test_bfloat16_window_with_softcap_matches_float64():
    features = {"mask": "sliding_window", "window": 48, "score_mod": "softcap", "softcap": 20.0}
    prepared = prepare_checked("fused_cpu", Workload(2, 4, 2, 256, 256, 32, dtype="bfloat16", **features))
    assert prepared.check.ok, prepared.check.reason


def test_key_ranges_are_the_harness_definition():
    w = Workload(2, 4, 2, 6, 10, 32, mask="sliding_window", window=3)  # offset 4: row i sees i + 2 … i + 4
    mask, options = score_options(w)
    assert mask == "ranges" and options is not None and options.ranges is not None
    lo, hi = options.ranges
    assert lo.tolist() == [[2, 3, 4, 5, 6, 7]] * 2 and hi.tolist() == [[5, 6, 7, 8, 9, 10]] * 2
    doc = Workload(1, 2, 2, 8, 8, 32, mask="document", documents=1)
    assert score_options(doc)[1].ranges[0].tolist() == [[0] * 8]  # type: ignore[union-attr]
    alibi = score_options(Workload(1, 4, 2, 8, 8, 32, score_mod="alibi"))[1]
    assert alibi is not None and alibi.alibi is not None
    assert alibi.alibi.tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    assert score_options(Workload(1, 4, 2, 8, 8, 32, mask="causal")) == ("causal", None)


@pytest.mark.parametrize("kind", ["window", "window_sq_lt_sk", "document"])
def test_gradients_with_key_ranges_match_float64(kind):
    shape, features = FORWARD[kind]
    prepared = prepare_checked("fused_cpu", Workload(*shape, **features, pass_="fwd_bwd"))
    assert prepared.check.ok and prepared.grad_check is not None and prepared.grad_check.ok, prepared.reason
    assert prepared.grad_check.grad_err < 1e-5


@pytest.mark.parametrize(("score_mod", "value"), [("softcap", 20.0), ("alibi", 0.0)])
def test_score_mods_backward_is_unsupported_with_the_reason(score_mod, value):
    w = Workload(2, 4, 2, 64, 64, 32, score_mod=score_mod, softcap=value, pass_="fwd_bwd")
    row = run_case("fused_cpu", w, RunOptions(budget_s=0.05))
    assert row["status"] == "unsupported"
    assert row["reason"] == (
        f"score_mod {score_mod} is forward only in fused_cpu: its backward recomputes the probabilities with key "
        "ranges, but not yet with softcap's tanh or ALiBi's bias"
    )


@pytest.fixture
def no_gather(monkeypatch):
    """Fail any gather of the page pool: the case must read the pages in place."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("gathered the pages")

    monkeypatch.setattr(paged_module, "gather_pages", refuse)


@pytest.mark.parametrize(
    ("seq_k", "page_size", "mask"),
    [(256, 64, "causal_bottom_right"), (256, 16, "causal_bottom_right"), (200, 16, "none"), (250, 32, "padding")],
)
def test_paged_decode_reads_pages_in_place(no_gather, seq_k, page_size, mask):
    w = Workload(2, 4, 2, 1, seq_k, 32, mask=mask, page_size=page_size)  # 200 and 250: the last page partly used
    assert reads_pages_in_place(w) and contender.reads_pages(w)
    prepared = prepare_checked("fused_cpu", w)
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.max_abs_err < 1e-5
    assert predict(contender, w, None).extra_bytes == contender.predicted_extra_bytes(w)  # no gather counted


def test_paged_decode_rows_with_bottom_right_alignment_in_place(no_gather):
    prepared = prepare_checked("fused_cpu", Workload(1, 4, 1, 16, 300, 32, mask="causal_bottom_right", page_size=32))
    assert prepared.check.ok, prepared.check.reason


@pytest.mark.parametrize(
    "features",
    [
        {"seq_q": 1, "page_size": 8, "mask": "causal_bottom_right"},  # pages of fewer than 16 keys
        {"seq_q": 1, "page_size": 64, "mask": "sliding_window", "window": 40},  # a mask the decode kernel lacks
        {"seq_q": 64, "page_size": 16, "mask": "causal_bottom_right", "score_mod": "alibi"},  # prefill rows
    ],
)
def test_other_paged_cases_gather_the_pages_and_match_float64(monkeypatch, features):
    gathered = []

    def gather(*args: object, **kwargs: object) -> object:
        gathered.append(1)
        return gather_pages(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(paged_module, "gather_pages", gather)
    seq_q = features.pop("seq_q")
    w = Workload(2, 4, 2, seq_q, 256, 32, **features)
    assert not reads_pages_in_place(w) and not contender.reads_pages(w)
    prepared = prepare_checked("fused_cpu", w)
    assert prepared.check.ok, prepared.check.reason
    assert gathered == [1, 1]  # k and v, by the harness, in the one (timed) call
    assert gather_bytes(w) == 2 * 2 * 256 * 32 * 4  # the pages of k (then of v) picked, counted once
    assert predict(contender, w, None).extra_bytes == max(contender.predicted_extra_bytes(w), gather_bytes(w))


def test_declared_capabilities():
    caps = contender.capabilities
    assert {"sliding_window", "document"} <= caps.masks and {"softcap", "alibi"} <= caps.score_mods
    assert caps.paged == "native"


@pytest.fixture(params=[1, 2], ids=lambda n: f"threads{n}")
def threads(request):
    """torch's (and so fused_cpu's) thread count for one test, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


# (batch, heads, kv_heads, seq_k, head_dim): GQA group 1 at Sq 1, one row per work item; with one thread every
# case splits its keys (≥ 512 each), so a scratch overrun corrupted the first split's partial output
GROUP_ONE_DECODE = [(2, 8, 8, 4096, 64), (1, 1, 1, 2048, 64), (1, 1, 1, 2048, 128), (1, 2, 2, 1536, 64)]


@pytest.mark.parametrize("page_size", [0, 64], ids=["contiguous", "paged"])
@pytest.mark.parametrize("shape", GROUP_ONE_DECODE, ids=lambda s: "B{}-H{}of{}-Sk{}-D{}".format(*s))
def test_group_one_decode_at_long_keys_matches_float64(threads, shape, page_size):
    batch, heads, kv_heads, seq_k, head_dim = shape
    w = Workload(batch, heads, kv_heads, 1, seq_k, head_dim, mask="causal_bottom_right", page_size=page_size)
    prepared = prepare_checked("fused_cpu", w)
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.max_abs_err < 1e-5


@pytest.mark.parametrize("seq_q", [1, 3])
def test_decode_stays_inside_the_scratch_it_asks_for(seq_q):
    """One thread and no key split: the scratch is that thread's block alone, so an overrun of it (by one
    float, with an odd row count) lands in the floats right after; they must be untouched, the output right."""
    kernel = _cpu_kernel.load()
    batch, heads, seq_k, head_dim = 2, 2, 1024, 64
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq_q, head_dim)
    k, v = torch.randn(batch, heads, seq_k, head_dim), torch.randn(batch, heads, seq_k, head_dim)
    out = torch.empty(batch, heads, seq_q, head_dim)
    asked = kernel.library.attnbench_fused_decode_scratch_floats(batch, heads, heads, seq_q, seq_k, head_dim, 1)
    assert asked % 2 == 0  # every thread's block starts 8-byte aligned (its int64 key limits too)
    scratch = torch.full((asked + 16,), 7.0)
    splits = ctypes.c_int64(0)
    status = kernel.library.attnbench_fused_decode(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        None,
        batch,
        heads,
        heads,
        seq_q,
        seq_k,
        head_dim,
        head_dim,
        0.125,
        2,
        None,
        None,
        0,
        0,
        1,
        scratch.data_ptr(),
        None,
        ctypes.byref(splits),
    )
    assert status == 0 and splits.value == 1
    assert scratch[asked:].tolist() == [7.0] * 16
    visible = torch.arange(seq_k)[None, :] <= torch.arange(seq_q)[:, None] + seq_k - seq_q  # bottom-right causal
    scores = (q.double() @ k.double().transpose(-1, -2) * 0.125).masked_fill(~visible, float("-inf"))
    assert (out.double() - torch.softmax(scores, -1) @ v.double()).abs().max() < 1e-5
