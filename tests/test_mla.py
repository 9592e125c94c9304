"""Issue 22 items 1 and 2: a value head dim of its own (head_dim_v) and MLA's latent cache (kv_layout latent):
inputs, the float64 reference, bytes, contenders forward and backward, unsupported reasons, bad input."""

import pytest
import torch

from attnbench import Workload, make_inputs
from attnbench.contenders import registry
from attnbench.runner._predict import input_bytes
from attnbench.runner.cases import prepare_checked
from attnbench.workload.flops import attention_bytes, attention_flops
from attnbench.workload.paged import gather_bytes, gather_pages, pool_bytes
from attnbench.workload.reference import reference_grads, reference_output

# odd head dims, Sq ≠ Sk, GQA; the latent cache (kv_heads 1) with values narrower than keys
SEPARATE = Workload(2, 6, 2, 5, 37, 40, mask="causal_bottom_right", head_dim_v=24)
WIDER_V = Workload(1, 4, 2, 3, 19, 24, mask="causal", head_dim_v=40)
LATENT = Workload(2, 6, 1, 3, 45, 40, mask="causal_bottom_right", head_dim_v=24, kv_layout="latent")
CONTENDERS = ["bmm", "einsum", "naive", "sdpa_math", "sdpa_flash"]
WITH_BACKWARD = ["bmm", "einsum", "sdpa_math", "sdpa_flash"]


def _with(w: Workload, **changes: object) -> Workload:
    fields = {**w.__dict__, **changes}
    return Workload(**fields)


def test_inputs_give_v_and_the_output_their_own_head_dim_and_latent_v_is_a_view_of_the_cache():
    inputs = make_inputs(SEPARATE)
    assert inputs.k.shape == (2, 2, 37, 40) and inputs.v.shape == (2, 2, 37, 24)
    assert inputs.grad_out.shape == (2, 6, 5, 24)
    latent = make_inputs(LATENT, requires_grad=True)
    assert latent.k.shape == (2, 1, 45, 40) and latent.v.shape == (2, 1, 45, 24)
    assert latent.v.data_ptr() == latent.k.data_ptr() and latent.v.stride() == latent.k.stride()  # no copy
    assert torch.equal(latent.v, latent.k[..., :24])


def test_the_latent_reference_takes_values_and_their_gradient_from_the_one_cache():
    """Written out independently: out = softmax(q·kᵀ·scale, bottom-right causal)·k[..., :Dv], a function of q
    and the cache alone; its gradient with respect to the cache sums the keys' and the values' parts."""
    w = LATENT
    inputs = make_inputs(w, requires_grad=True)
    q = inputs.q.detach().double().requires_grad_()
    cache = inputs.k.detach().double().requires_grad_()
    scores = q @ cache.transpose(-1, -2) * w.softmax_scale  # (B, 6, Sq, Sk): kv head 0 for every query head
    hidden = torch.ones(w.seq_q, w.seq_k, dtype=torch.bool).triu(w.seq_k - w.seq_q + 1)
    out = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1) @ cache[..., : w.head_dim_v]
    assert torch.allclose(reference_output(inputs, torch.arange(w.seq_q)), out, atol=1e-12)
    dq, dcache = torch.autograd.grad(out, (q, cache), inputs.grad_out.double())
    ref_dq, ref_dk, ref_dv = reference_grads(inputs)
    assert torch.allclose(ref_dq, dq, atol=1e-12) and torch.allclose(ref_dk, dcache, atol=1e-12)
    assert ref_dv.shape == (2, 1, 45, 24)


@pytest.mark.parametrize("impl", CONTENDERS)
@pytest.mark.parametrize("w", [SEPARATE, WIDER_V, LATENT], ids=["separate", "wider_v", "latent"])
def test_forward_is_ok_against_float64(impl, w):
    prepared = prepare_checked(impl, w)
    assert prepared.check.ok, prepared.reason
    assert prepared.check.max_abs_err < 1e-4


@pytest.mark.parametrize("impl", WITH_BACKWARD)
@pytest.mark.parametrize("w", [SEPARATE, WIDER_V, LATENT], ids=["separate", "wider_v", "latent"])
def test_forward_and_backward_are_ok_against_float64(impl, w):
    prepared = prepare_checked(impl, _with(w, pass_="fwd_bwd"))
    assert prepared.check.ok and prepared.grad_check is not None and prepared.grad_check.ok, prepared.reason
    assert prepared.grad_check.grad_err < 1e-4
    dq, dk, dv = prepared.fn()  # the shapes of q, the cache and its values
    assert (dq.shape[-1], dk.shape[-1], dv.shape[-1]) == (w.head_dim, w.head_dim, w.head_dim_v)


@pytest.mark.slow
@pytest.mark.parametrize("w", [SEPARATE, LATENT, _with(LATENT, page_size=16)], ids=["separate", "latent", "paged"])
def test_flex_takes_its_own_value_head_dim_and_the_latent_view(w):
    prepared = prepare_checked("flex", w)
    assert prepared.check.ok, prepared.reason
    assert prepared.check.max_abs_err < 1e-4


def test_a_paged_latent_cache_is_one_page_pool_gathered_once_per_call(monkeypatch):
    from attnbench.workload import paged as paged_module

    w = _with(LATENT, page_size=16)
    inputs = make_inputs(w)
    paged = inputs.paged
    assert paged is not None and paged.k_pages.shape == (2 * 3, 1, 16, 40)
    assert paged.v_pages.data_ptr() == paged.k_pages.data_ptr() and paged.v_pages.shape[-1] == 24
    assert torch.equal(gather_pages(paged.v_pages, paged.page_table, 45), inputs.v)
    assert pool_bytes(w) == 2 * 3 * 16 * 40 * 4  # the cache's pages once, not k's and v's
    assert pool_bytes(_with(SEPARATE, page_size=16)) == 2 * 2 * 3 * 16 * (40 + 24) * 4
    assert gather_bytes(w) == 2 * 3 * 16 * 40 * 4
    calls = []

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return gather_pages(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(paged_module, "gather_pages", counting)
    prepared = prepare_checked("bmm", w)
    assert prepared.check.ok, prepared.reason
    assert len(calls) == 1  # the cache's pages only: v is a view of what they were gathered into


def test_bytes_count_k_at_d_v_at_dv_and_a_latent_cache_once():
    w = SEPARATE  # no padding or window: every key is read
    q, o = 2 * 6 * 5 * 40, 2 * 6 * 5 * 24
    k, v = 2 * 2 * 37 * 40, 2 * 2 * 37 * 24
    assert attention_bytes(w) == 4 * (q + k + v + o)
    assert attention_bytes(_with(w, pass_="bwd")) == 4 * (2 * q + 2 * o + 2 * (k + v))
    assert attention_flops(w) == 2 * 6 * (40 + 24) * (2 * sum(min(37, i + 32 + 1) for i in range(5)))
    decode = Workload(1, 128, 1, 1, 1024, 576, mask="causal_bottom_right", head_dim_v=512, kv_layout="latent")
    assert attention_bytes(decode) == 4 * (128 * 576 + 1024 * 576 + 128 * 512)  # q, the cache once, o
    separate = _with(decode, kv_layout="separate")
    assert attention_bytes(separate) == 4 * (128 * 576 + 1024 * (576 + 512) + 128 * 512)
    assert input_bytes(decode) == 4 * (128 * (576 + 512) + 1024 * 576)  # q, grad_out, the cache (v a view)


def test_contenders_that_cannot_say_why():
    w = SEPARATE
    plain = registry.get("score_dot").contender  # a scoring variant: plain q·kᵀ heads, no cache features
    assert plain is not None
    narrower = "head_dim_v 24 (≠ head_dim) not supported (declares no head_dim_v support)"
    assert plain.unsupported_reason(w) == narrower and plain.unsupported_reason(LATENT) == narrower
    latent_same = _with(LATENT, head_dim_v=40)
    assert plain.unsupported_reason(latent_same) == "kv_layout latent not supported (declares no kv_layout support)"
    naive = registry.get("naive").contender
    assert naive is not None
    mha = Workload(1, 2, 2, 4, 4, 8, module="mha", head_dim_v=4)
    assert naive.unsupported_reason(mha) == (
        "the mha module projects q, k and v alike to heads·head_dim channels: no head_dim_v, no latent cache"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--head-dim-v", "0"], "--head-dim-v value 0 must be a positive integer"),
        (
            ["--kv-layout", "latent", "--kv-heads", "2"],
            "kv_layout latent stores one cache shared by all heads, so it needs kv_heads 1; got 2",
        ),
        (
            ["--kv-layout", "latent", "--kv-heads", "1", "--head-dim-v", "80"],
            "kv_layout latent reads values as the first head_dim_v channels of the head_dim-wide cache: "
            "head_dim_v 80 > head_dim 64; allowed: head_dim_v ≤ head_dim",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(cli, tmp_path, args, message):
    out = tmp_path / "out"
    code, _, stderr = cli(
        "run", "--batch", "1", "--heads", "4", "--seq", "8", "--head-dim", "64", "--out", str(out), *args
    )
    assert code == 2
    assert stderr.strip() == f"attnbench: error: {message}"
    assert not out.exists()
