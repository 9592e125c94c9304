"""fused_cpu's decode kernel on issue 23's cache workloads: a KV cache in bfloat16 or fp8 (e4m3fn, e5m2, with
their float32 scales) read as stored and widened in registers, a value head dim of its own (narrower and wider
than the keys'), a latent cache (values a view of the keys), learned sinks and ragged lengths — contiguous and
paged, each against the float64 reference as ``attnbench run`` checks it; the kernel handed the narrow tensors
themselves (no float32 copy of the cache); fp8 values (subnormals included) widened exactly; sinks joined once,
after the split merge, and in the lse; and the one-line reasons for what only the decode kernel takes."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import pytest
import torch

from attnbench.impls.fused_cpu import (
    DECODE_FEATURES,
    bindings,
    contender,
    decode_attention,
    paged_decode,
    reads_pages_in_place,
)
from attnbench.runner.cases import RunOptions, prepare_checked, run_case
from attnbench.workload import Workload
from attnbench.workload import paged as paged_module
from attnbench.workload.check import check_output
from attnbench.workload.inputs import make_inputs

from conftest import CHECKED

pytestmark = pytest.mark.skipif(bindings.unavailable_reason() is not None, reason="no C++ compiler here")

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
# (batch, heads, kv_heads, seq_q, seq_k, head_dim) and features: odd head dims (72, 80, 48), Dv below and above D,
# Sk not a multiple of 16, batch 3, GQA, pages of 16 and 32 (and 8: gathered by the harness, the fp8 scale blocks
# then narrower than a tile), padding, ragged lengths, sinks, a latent cache, bfloat16 workloads (P·V by vdpbf16ps)
# with 3 and 5 rows per kv head (the scores' row blocks of 4, 2 and 1)
CASES = {
    "e4m3-D72-B3-padding": ((3, 8, 2, 1, 203, 72), {"kv_dtype": E4M3, "mask": "padding"}),
    "e4m3-paged32-padding-Dv56": (
        (3, 8, 2, 1, 300, 72),
        {"kv_dtype": E4M3, "mask": "padding", "page_size": 32, "head_dim_v": 56},
    ),
    "e5m2-D80-Dv40-paged16-sinks": (
        (2, 8, 2, 4, 250, 80),
        {"kv_dtype": E5M2, "head_dim_v": 40, "page_size": 16, "sinks": "learned", "mask": "causal_bottom_right"},
    ),
    "bf16-Dv160-paged32-uniform": (
        (3, 6, 3, 2, 301, 64),
        {
            "kv_dtype": "bfloat16",
            "head_dim_v": 160,
            "page_size": 32,
            "lengths": "uniform",
            "mask": "causal_bottom_right",
        },
    ),
    "e4m3-paged8-gathered-sinks": ((2, 4, 1, 1, 100, 48), {"kv_dtype": E4M3, "page_size": 8, "sinks": "learned"}),
    "e4m3-split-sinks-uniform": (
        (3, 4, 1, 1, 1100, 128),
        {"kv_dtype": E4M3, "sinks": "learned", "lengths": "uniform", "mask": "causal_bottom_right"},
    ),
    "latent-e5m2-paged16": (
        (2, 8, 1, 2, 170, 72),
        {"kv_dtype": E5M2, "head_dim_v": 64, "kv_layout": "latent", "page_size": 16, "mask": "causal_bottom_right"},
    ),
    "fp32-Dv96-sinks-uniform": (
        (3, 4, 2, 1, 333, 80),
        {"head_dim_v": 96, "sinks": "learned", "lengths": "uniform", "mask": "causal_bottom_right"},
    ),
    "bf16-dtype-e4m3-Dv32-sinks": (
        (2, 4, 2, 3, 150, 64),
        {"dtype": "bfloat16", "kv_dtype": E4M3, "head_dim_v": 32, "sinks": "learned", "mask": "causal_bottom_right"},
    ),
    "bf16-dtype-e5m2-D96-3rows-paged16": (
        (2, 6, 2, 1, 277, 96),
        {"dtype": "bfloat16", "kv_dtype": E5M2, "page_size": 16, "mask": "padding"},
    ),
    "bf16-dtype-bf16-5rows": ((1, 5, 1, 1, 77, 64), {"dtype": "bfloat16", "kv_dtype": "bfloat16"}),
}


@dataclass
class Call:
    """One call of the decode kernel: the pointers it got and its cache description."""

    k: int
    v: int
    kv_type: int
    k_scale: int | None
    sinks: int | None
    head_dim_v: int
    v_row: int


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every call of the C entry attnbench_fused_decode_kv, recorded, then made."""
    library = bindings.load().library
    real = library.attnbench_fused_decode_kv
    seen: list[Call] = []

    def spy(*args: object) -> int:
        cache = args[17]._obj  # type: ignore[attr-defined]  # ctypes.byref(DecodeCache)
        seen.append(Call(args[1], args[2], cache.kv_type, cache.k_scale, cache.sinks, cache.head_dim_v, cache.v_row))  # type: ignore[arg-type]
        return int(real(*args))

    monkeypatch.setattr(library, "attnbench_fused_decode_kv", spy)
    return seen


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_cache_workloads_match_float64_through_the_decode_kernel(case, calls):
    shape, features = case
    w = Workload(*shape, **features)
    assert contender.unsupported_reason(w) is None
    prepared = prepare_checked("fused_cpu", w)
    assert prepared.check is not None and prepared.check.ok, prepared.reason
    assert prepared.check.max_abs_err < (1e-5 if w.dtype == "float32" else 2e-2)
    assert calls and {c.kv_type for c in calls} == {bindings.KV_TYPES[w.kv_torch_dtype]}  # read as stored
    assert {c.head_dim_v for c in calls} == {w.head_dim_v}
    assert {c.v_row for c in calls} == {w.head_dim if w.kv_layout == "latent" else w.head_dim_v}
    assert all((c.sinks is not None) == (w.sinks != "none") for c in calls)


@pytest.mark.parametrize(
    "features",
    [
        {"kv_dtype": E4M3, "page_size": 16, "sinks": "learned", "head_dim_v": 40},
        {"kv_dtype": "bfloat16", "lengths": "uniform", "head_dim_v": 80},
    ],
    ids=["fp8-paged-sinks", "bf16-uniform"],
)
def test_a_run_of_the_harness_says_ok(features):
    w = Workload(3, 8, 2, 1, 200, 72, mask="causal_bottom_right", **features)
    row = run_case("fused_cpu", w, RunOptions(budget_s=0.02))
    assert row["status"] in CHECKED, row.get("reason")


@pytest.fixture
def no_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("gathered the pages")

    monkeypatch.setattr(paged_module, "gather_pages", refuse)


@pytest.mark.parametrize("kv_dtype", [E4M3, E5M2, "bfloat16"])
@pytest.mark.parametrize("page_size", [0, 16])
def test_the_kernel_gets_the_narrow_cache_itself(kv_dtype, page_size, calls, no_gather):
    """No float32 copy of the cache: the kernel is handed the fp8/bf16 tensors' (or page pools') own data
    pointers and the scales' own, and what it returns passes the check."""
    w = Workload(2, 4, 2, 1, 160, 64, mask="causal_bottom_right", kv_dtype=kv_dtype, page_size=page_size)
    assert not page_size or reads_pages_in_place(w)
    inputs = make_inputs(w)
    out = contender.prepare(inputs, w)()
    assert check_output(inputs, out).ok
    paged = inputs.paged
    k, v, k_scale = (
        (inputs.k, inputs.v, inputs.k_scale) if paged is None else (paged.k_pages, paged.v_pages, paged.k_scale)
    )
    assert [(c.k, c.v, c.kv_type) for c in calls] == [(k.data_ptr(), v.data_ptr(), bindings.KV_TYPES[k.dtype])]
    assert k.dtype == w.kv_torch_dtype and calls[0].k_scale == (None if k_scale is None else k_scale.data_ptr())


def test_prediction_counts_no_widened_cache():
    w = Workload(1, 32, 8, 1, 32768, 128, mask="causal_bottom_right", kv_dtype=E4M3)
    float32_cache = 2 * w.batch * w.kv_heads * w.seq_k * w.head_dim * 4
    assert contender.predicted_extra_bytes(w) < float32_cache / 20  # scratch and the float32 output only


def _finite_fp8(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of an fp8 type (subnormals, ±0 and the largest included), as that type."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    return values[values.float().isfinite()]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_every_fp8_value_widens_exactly(dtype):
    """One key: the output is its value row times the v scale (p = 1), and each row's lse its score — so every
    finite fp8 value of v and of k (one query head per k channel, its q one-hot) is read exactly."""
    values = _finite_fp8(dtype)
    n = values.numel()
    k = values.view(1, 1, 1, n)
    v = values[torch.arange(n - 1, -1, -1)].view(1, 1, 1, n)
    q = torch.eye(n).view(1, n, 1, n)  # head h picks channel h of the key
    k_scale, v_scale = torch.tensor([[[[0.375]]]]), torch.tensor([[[[1.0 / 3.0]]]])
    kernel = bindings.load()
    out, lse = torch.empty(1, n, 1, -(-n // 16) * 16), torch.empty(1, n, 1)
    cache = bindings.CacheOptions(k_scale=k_scale, v_scale=v_scale)
    kernel.decode(q, k, v, out, lse, scale=0.5, mask="none", lengths=None, threads=1, cache=cache)
    assert torch.equal(out[0, :, 0, :n], (v.float() * v_scale).view(1, n).expand(n, n))
    expected = k.double().view(n) * 0.375 * 0.5
    assert torch.allclose(lse.double().view(n), expected, rtol=1e-6, atol=1e-30)


@pytest.mark.skipif(not bindings.load().has_bf16(), reason="no AVX512-BF16 here: scores are float32 FMAs")
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32])
def test_scores_by_bf16_dot_products_keep_q_as_documented(q_dtype):
    """One bf16 key of 64 channels: each row's lse is its score. With vdpbf16ps a bf16 q is exact (one term) and
    a float32 q keeps its 16 leading bits (hi + lo, 2^-17 of each element); float32 arithmetic is 2^-24."""
    torch.manual_seed(0)
    q = torch.randn(1, 16, 1, 64).to(q_dtype)
    k = torch.randn(1, 1, 1, 64).bfloat16()
    out, lse = torch.empty(1, 16, 1, 64), torch.empty(1, 16, 1)
    bindings.load().decode(q, k, k, out, lse, scale=0.125, mask="none", lengths=None, threads=1)
    terms = q.double() * k.double()
    score = terms.sum(-1).view(16) * 0.125
    bound = (terms.abs().sum(-1).view(16) * 0.125) * (2.0**-16 if q_dtype == torch.float32 else 2.0**-21)
    assert ((lse.double().view(16) - score).abs() <= bound).all()
    assert torch.equal(out[0, :, 0], k[0, 0].float().expand(16, 64))  # one key: p = 1


def _reference64(q, k, v, scale, visible, sinks):
    """float64 (out, natural lse) with GQA by index, the sink logit of each query head in the denominator."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    column = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    with_sink = torch.cat([scores, column], dim=-1)
    return torch.softmax(with_sink, dim=-1)[..., :-1] @ v, torch.logsumexp(with_sink, dim=-1)


def test_sinks_join_once_after_the_split_merge_and_the_lse_includes_them():
    """Keys split across items (each a partial max and sum): a sink added per split would count several times.
    A sequence with no visible key outputs zeros, and its lse is its sink alone."""
    torch.manual_seed(0)
    batch, heads, kv_heads, seq_q, seq_k, head_dim, head_dim_v = 3, 4, 1, 2, 2100, 40, 24
    q = torch.randn(batch, heads, seq_q, head_dim)
    k, v = torch.randn(batch, kv_heads, seq_k, head_dim), torch.randn(batch, kv_heads, seq_k, head_dim_v)
    sinks = torch.tensor([3.0, -2.0, 0.5, 9.0])  # one above every score: it dominates the denominator
    lengths = torch.tensor([seq_k, 700, 0])
    out, lse = torch.empty(batch, heads, seq_q, 32), torch.empty(batch, heads, seq_q)
    cache = bindings.CacheOptions(sinks=sinks)
    _, splits = bindings.load().decode(
        q, k, v, out, lse, scale=0.2, mask="padding", lengths=lengths, threads=2, cache=cache
    )
    assert splits > 1
    visible = (torch.arange(seq_k) < lengths.view(-1, 1))[:, None, None, :].expand(batch, 1, seq_q, seq_k)
    expected, expected_lse = _reference64(q, k, v, 0.2, visible, sinks)
    assert (out[..., :head_dim_v].double() - expected).abs().max() < 1e-6
    assert torch.allclose(lse.double(), expected_lse, atol=1e-5)
    assert out[2].abs().max() == 0 and torch.allclose(lse[2], sinks.view(heads, 1).expand(heads, seq_q))


def test_decode_attention_and_paged_decode_agree_on_a_paged_fp8_cache():
    """The two Python entries over one cache: paged_decode reads the pool through the table, decode_attention
    the same pages laid out contiguously, scales one per page (scale_block = page_size)."""
    torch.manual_seed(1)
    batch, kv_heads, page_size, pages, head_dim, head_dim_v = 2, 2, 16, 7, 80, 48
    pool = batch * pages
    k_pages = (torch.randn(pool, kv_heads, page_size, head_dim) * 40).to(torch.float8_e4m3fn)
    v_pages = (torch.randn(pool, kv_heads, page_size, head_dim_v) * 40).to(torch.float8_e4m3fn)
    k_scale, v_scale = (torch.rand(pool, kv_heads, 1, 1) + 0.5) / 40, (torch.rand(pool, kv_heads, 1, 1) + 0.5) / 40
    table = torch.randperm(pool).view(batch, pages).to(torch.int32)
    q, sinks = torch.randn(batch, 8, 1, head_dim), torch.randn(8)
    seq_k = pages * page_size - 5
    paged_out, _ = paged_decode(
        q, k_pages, v_pages, table, scale=0.1, seq_k=seq_k, k_scale=k_scale, v_scale=v_scale, sinks=sinks
    )

    def contiguous(pool_tensor: torch.Tensor) -> torch.Tensor:  # (B, Hkv, pages·P, ·)
        return pool_tensor[table.long()].transpose(1, 2).flatten(2, 3)[:, :, :seq_k].contiguous()

    def per_sequence(scale: torch.Tensor) -> torch.Tensor:  # (B, Hkv, pages, 1)
        return scale[table.long()].view(batch, pages, kv_heads, 1).transpose(1, 2).contiguous()

    out, _ = decode_attention(
        q,
        contiguous(k_pages),
        contiguous(v_pages),
        scale=0.1,
        k_scale=per_sequence(k_scale),
        v_scale=per_sequence(v_scale),
        scale_block=page_size,
        sinks=sinks,
    )
    assert paged_out.shape == (batch, 8, 1, head_dim_v)
    assert (paged_out - out).abs().max() < 1e-6
    k64 = contiguous(k_pages).double() * per_sequence(k_scale).double().repeat_interleave(page_size, 2)[:, :, :seq_k]
    v64 = contiguous(v_pages).double() * per_sequence(v_scale).double().repeat_interleave(page_size, 2)[:, :, :seq_k]
    expected, _ = _reference64(q, k64, v64, 0.1, torch.ones(1, 1, 1, seq_k, dtype=torch.bool), sinks)
    assert (out.double() - expected).abs().max() < 1e-5


def test_bindings_refuse_what_the_kernel_cannot_read():
    kernel = bindings.load()
    q, out = torch.randn(1, 2, 1, 16), torch.empty(1, 2, 1, 16)
    k = torch.randn(1, 1, 32, 16).to(torch.float8_e4m3fn)
    options = {"scale": 0.25, "mask": "none", "lengths": None, "threads": 1}
    with pytest.raises(ValueError, match="an fp8 cache needs its k_scale and v_scale"):
        kernel.decode(q, k, k, out, None, **options)
    with pytest.raises(ValueError, match="k and v must be CPU tensors of one cache type"):
        kernel.decode(q, k, torch.randn(1, 1, 32, 16), out, None, **options)
    scales = bindings.CacheOptions(k_scale=torch.ones(3), v_scale=torch.ones(1))
    with pytest.raises(ValueError, match="k_scale must be contiguous float32 with 1 scales"):
        kernel.decode(q, k, k, out, None, cache=scales, **options)
    with pytest.raises(ValueError, match="sinks must be contiguous float32 of shape \\(2,\\)"):
        kernel.decode(q, k.float(), k.float(), out, None, cache=bindings.CacheOptions(sinks=torch.ones(3)), **options)
    with pytest.raises(ValueError, match="mask 'ranges' needs row_hi"):
        kernel.decode(q, k.float(), k.float(), out, None, **{**options, "mask": "ranges"})


PREFILL = "(prefill: the decode kernel takes at most 16 query rows)"


@pytest.mark.parametrize(
    ("features", "reason"),
    [
        (
            {"seq_q": 17, "kv_dtype": E4M3},
            f"kv_dtype float8_e4m3fn not supported with seq_q 17 {PREFILL}: "
            "fused_cpu takes it in its decode kernel only",
        ),
        (
            {"seq_q": 1, "kv_dtype": "bfloat16", "pass_": "fwd_bwd"},
            "kv_dtype bfloat16 is a serving cache's storage, not trained: forward only",
        ),
        (
            {"seq_q": 1, "kv_dtype": "bfloat16", "mask": "sliding_window", "window": 32},
            "kv_dtype bfloat16 not supported with mask sliding_window (the decode kernel applies causal, "
            "causal_bottom_right, none, padding): fused_cpu takes it in its decode kernel only",
        ),
        (
            {"seq_q": 1, "kv_dtype": E5M2, "score_mod": "softcap", "softcap": 5.0},
            "kv_dtype float8_e5m2 not supported with score_mod softcap (the decode kernel has no score modifier): "
            "fused_cpu takes it in its decode kernel only",
        ),
    ],
    ids=["prefill-fp8", "backward", "window", "softcap"],
)
def test_what_only_the_decode_kernel_takes_is_refused_elsewhere_in_one_line(features, reason):
    seq_q = features.pop("seq_q")
    w = Workload(2, 4, 2, seq_q, 64, 32, **features)
    assert contender.unsupported_reason(w) == reason
    row = run_case("fused_cpu", w, RunOptions(budget_s=0.01))
    assert (row["status"], row["reason"]) == ("unsupported", reason)


def test_declared_features():
    assert {"kv_dtype"} == DECODE_FEATURES  # the others run in the forward kernel too (test_fused_cpu_features)
    assert contender.capabilities.features >= DECODE_FEATURES
    assert contender.unsupported_reason(Workload(1, 4, 1, 16, 64, 32, kv_dtype=E5M2, sinks="learned")) is None
    assert contender.unsupported_reason(Workload(1, 4, 1, 1, 64, 32, mask="padding", kv_layout="latent")) is None


def test_old_entry_still_takes_padded_float32_values():
    """attnbench_fused_decode (float32, v padded to dp) runs on the same kernel."""
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 1, 20), torch.randn(1, 1, 50, 20), torch.randn(1, 1, 50, 32)
    out = torch.empty(1, 2, 1, 32)
    library = bindings.load().library
    rows = library.attnbench_fused_decode_scratch_floats(1, 2, 1, 1, 50, 32, 1)
    scratch = torch.empty(rows)
    status = library.attnbench_fused_decode(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        out.data_ptr(),
        None,
        1,
        2,
        1,
        1,
        50,
        20,
        32,
        0.3,
        0,
        None,
        None,
        0,
        0,
        1,
        scratch.data_ptr(),
        None,
        ctypes.byref(ctypes.c_int64(0)),
    )
    assert status == 0
    expected, _ = _reference64(q, k, v, 0.3, torch.ones(1, 1, 1, 50, dtype=torch.bool), torch.full((2,), -torch.inf))
    assert (out.double() - expected).abs().max() < 1e-6
