"""The KV cache's own element type (issue 22 item 4, ``kv_dtype``): bf16 and fp8 caches with float32 scales per
(sequence, kv head) or per page, read back by the contenders inside the timed call, checked against a float64
reference that dequantizes the stored values; bytes at the cache's type; forward only; bad input in one line."""

from __future__ import annotations

import csv
from collections.abc import Callable

import pytest
import torch

from attnbench import Workload, make_inputs
from attnbench.contenders import registry
from attnbench.contenders.contract import Capabilities, Contender
from attnbench.runner._predict import input_bytes, predict
from attnbench.runner.cases import not_runnable, prepare_checked
from attnbench.workload.check import TOLERANCES
from attnbench.workload.flops import attention_bytes, kv_scale_bytes
from attnbench.workload.inputs import AttentionInputs, workload_seed
from attnbench.workload.kv_cache import dequantize, dequantized_bytes, position_scales
from attnbench.workload.paged import gather_pages

from conftest import CHECKED

FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}

# (dtype, kv_dtype, workload fields): GQA everywhere, Sq ≠ Sk, decode Sq 1, a paged cache with a partial page
CASES = [
    ("float32", "bfloat16", {"seq_q": 13, "seq_k": 29, "mask": "causal_bottom_right"}),
    ("float32", "float8_e4m3fn", {"seq_q": 1, "seq_k": 77, "mask": "causal_bottom_right"}),
    ("float32", "float8_e5m2", {"seq_q": 21, "seq_k": 45, "mask": "none"}),
    ("bfloat16", "float8_e4m3fn", {"seq_q": 19, "seq_k": 40, "mask": "sliding_window", "window": 9}),
    ("float32", "float8_e4m3fn", {"seq_q": 2, "seq_k": 53, "mask": "causal_bottom_right", "page_size": 16}),
]


def _workload(dtype: str, kv_dtype: str, **fields: object) -> Workload:
    shape: dict[str, object] = {"batch": 2, "heads": 6, "kv_heads": 2, "head_dim": 24, **fields}
    return Workload(dtype=dtype, kv_dtype=kv_dtype, **shape)  # type: ignore[arg-type]


@pytest.mark.parametrize("impl", ["bmm", "einsum", "naive", "sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize(("dtype", "kv_dtype", "fields"), CASES, ids=lambda c: str(c))
def test_contenders_read_the_narrow_cache_and_pass_at_the_dtype_tolerance(impl, dtype, kv_dtype, fields):
    w = _workload(dtype, kv_dtype, **fields)
    inputs = make_inputs(w)
    assert inputs.k.dtype == inputs.v.dtype == w.kv_torch_dtype and inputs.q.dtype == w.torch_dtype
    prepared = prepare_checked(impl, w, inputs=inputs)
    assert prepared.check.ok, prepared.check.reason
    assert (prepared.check.atol, prepared.check.rtol) == TOLERANCES[dtype]
    assert prepared.check.max_abs_err < TOLERANCES[dtype][0]
    assert inputs.k.dtype == w.kv_torch_dtype  # the cache stays narrow: the contender dequantized a copy


@pytest.mark.parametrize(("dtype", "kv_dtype", "fields"), [CASES[1], CASES[4]], ids=["decode", "paged16"])
def test_flex_reads_an_fp8_cache_contiguous_and_from_its_page_pool(dtype, kv_dtype, fields):
    w = _workload(dtype, kv_dtype, **fields)
    prepared = prepare_checked("flex", w)
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.max_abs_err < 1e-5


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_scales_are_amax_over_fp8_max_per_sequence_and_kv_head(kv_dtype):
    w = _workload("float32", kv_dtype, seq_q=3, seq_k=50)
    inputs = make_inputs(w)
    assert inputs.k_scale is not None and inputs.v_scale is not None
    assert inputs.k_scale.shape == (2, 2, 1, 1) and inputs.k_scale.dtype == torch.float32
    stored_max = inputs.k.float().abs().amax(dim=(2, 3))  # each block's largest lands on the fp8 type's largest
    assert torch.equal(stored_max, torch.full((2, 2), FP8_MAX[kv_dtype]))
    # the draws, as make_inputs takes them (q, then k): the dequantized cache is within fp8's rounding of them
    generator = torch.Generator().manual_seed(workload_seed(w))
    torch.randn(2, 6, 3, 24, generator=generator)
    drawn_k = torch.randn(2, 2, 50, 24, generator=generator)
    assert torch.allclose(inputs.k_scale.view(2, 2), drawn_k.abs().amax(dim=(2, 3)) / FP8_MAX[kv_dtype])
    read = dequantize(inputs.k, inputs.k_scale, torch.float32)
    relative = 2.0**-4 if kv_dtype == "float8_e4m3fn" else 2.0**-3  # half an ulp at 3 or 2 mantissa bits
    subnormal = inputs.k_scale * 2.0 ** (-9 if kv_dtype == "float8_e4m3fn" else -16)  # the fixed step below
    assert ((read - drawn_k).abs() <= relative * drawn_k.abs() + subnormal).all()
    assert float((read - drawn_k).abs().max()) > 1e-3  # fp8 rounding: far over float32's tolerance


def test_a_bf16_cache_is_a_plain_cast_without_scales():
    w = _workload("float32", "bfloat16", seq_q=3, seq_k=20)
    inputs = make_inputs(w)
    assert inputs.k_scale is None and inputs.v_scale is None and inputs.k.dtype == torch.bfloat16
    assert kv_scale_bytes(w) == 0


def test_a_paged_fp8_cache_has_a_scale_per_page_kept_with_its_page_in_the_pool():
    w = _workload("float32", "float8_e4m3fn", seq_q=1, seq_k=53, mask="causal_bottom_right", page_size=16)
    inputs = make_inputs(w)
    assert inputs.k_scale is not None and inputs.k_scale.shape == (2, 2, 4, 1)  # ceil(53 / 16) pages
    assert len(set(inputs.k_scale.flatten().tolist())) == 16  # every (sequence, head, page) its own scale
    paged = inputs.paged
    assert paged is not None and paged.k_scale is not None and paged.v_scale is not None
    assert paged.k_scale.shape == (8, 2, 1, 1) and paged.k_pages.dtype == torch.float8_e4m3fn
    for b in range(2):
        for p in range(4):
            page = int(paged.page_table[b, p])
            assert torch.equal(paged.k_scale[page].view(2), inputs.k_scale[b, :, p, 0])
            assert torch.equal(paged.v_scale[page].view(2), inputs.v_scale[b, :, p, 0])  # type: ignore[index]
            stored = paged.k_pages[page, :, : min(16, 53 - 16 * p)].float().abs().amax(dim=(1, 2))
            assert torch.equal(stored, torch.full((2,), 448.0))  # each page quantized on its own amax
    gathered = gather_pages(paged.k_pages, paged.page_table, 53)
    assert torch.equal(gathered.view(torch.uint8), inputs.k.view(torch.uint8))
    per_position = position_scales(inputs.k_scale, 16, 53)
    assert per_position.shape == (2, 2, 53, 1)
    assert torch.equal(per_position[:, :, 48:], inputs.k_scale[:, :, 3:].expand(2, 2, 5, 1))  # the partial page


class _Planted(Contender):
    """bmm's arithmetic on a k and v this test chooses: to show what the check makes of other readings."""

    capabilities = Capabilities(features=frozenset({"kv_dtype"}))

    def __init__(self, read: Callable[[AttentionInputs], tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.name, self.read = "planted", read

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        k, v = (t.repeat_interleave(workload.gqa_group, dim=1) for t in self.read(inputs))
        return lambda: torch.softmax(inputs.q @ k.transpose(-1, -2) * inputs.scale, dim=-1) @ v


def test_the_check_fails_a_cache_read_without_its_scale_or_as_the_unrounded_draws():
    w = _workload("float32", "float8_e4m3fn", seq_q=5, seq_k=40)
    inputs = make_inputs(w)
    assert inputs.k_scale is not None and inputs.v_scale is not None
    right = _Planted(lambda i: (dequantize(i.k, i.k_scale, torch.float32), dequantize(i.v, i.v_scale, torch.float32)))
    assert prepare_checked("planted", w, inputs=inputs, contender=right).check.ok
    unscaled = _Planted(lambda i: (i.k.float(), i.v.float()))
    result = prepare_checked("planted", w, inputs=inputs, contender=unscaled).check
    assert not result.ok and result.reason.startswith("max_abs_err")
    generator = torch.Generator().manual_seed(workload_seed(w))  # q, k, v drawn as make_inputs draws them
    q, k, v = (torch.randn(*shape, generator=generator) for shape in [(2, 6, 5, 24), (2, 2, 40, 24), (2, 2, 40, 24)])
    assert torch.equal(q, inputs.q)
    unrounded = prepare_checked("planted", w, inputs=inputs, contender=_Planted(lambda i: (k, v))).check
    assert not unrounded.ok and unrounded.max_abs_err > 10 * TOLERANCES["float32"][0]  # fp8's rounding is data


def test_decode_bytes_count_the_fp8_cache_at_a_quarter_of_float32s_plus_its_scales():
    fields = {"seq_q": 1, "seq_k": 1024, "mask": "causal_bottom_right", "head_dim": 64}
    full, fp8, bf16 = (_workload("float32", kind, **fields) for kind in ("float32", "float8_e5m2", "bfloat16"))
    q_and_o = 2 * 2 * 6 * 1 * 64 * 4
    cache = 2 * 2 * 2 * 1024 * 64  # k and v elements
    assert attention_bytes(full) == q_and_o + 4 * cache
    assert kv_scale_bytes(fp8) == 2 * 4 * 2 * 2  # k's and v's float32 scale per (sequence, kv head)
    assert attention_bytes(fp8) == q_and_o + cache + 32
    assert attention_bytes(bf16) == q_and_o + 2 * cache
    assert (attention_bytes(fp8) - q_and_o) / (attention_bytes(full) - q_and_o) == pytest.approx(0.25, abs=1e-3)
    paged = _workload("float32", "float8_e4m3fn", **{**fields, "page_size": 16})
    assert kv_scale_bytes(paged) == 2 * 4 * (2 * 64) * 2  # a scale per page read (64 pages a sequence), per head
    assert attention_bytes(paged) == q_and_o + cache + 4 * 2 * 64 + kv_scale_bytes(paged)  # + int32 page table


def test_memory_counts_the_narrow_inputs_and_the_dequantized_copies_of_the_timed_call():
    fields = {"seq_q": 1, "seq_k": 4096, "mask": "causal_bottom_right", "head_dim": 64}
    full, fp8 = _workload("float32", "float32", **fields), _workload("float32", "float8_e4m3fn", **fields)
    copies = 2 * 2 * 2 * 4096 * 64 * 4  # k and v in float32
    assert dequantized_bytes(full) == 0 and dequantized_bytes(fp8) == copies
    assert input_bytes(full) - input_bytes(fp8) == copies - copies // 4 - 2 * 4 * 2 * 2  # k, v a byte each + scales
    bmm = registry.get("bmm").contender
    assert bmm is not None
    assert predict(bmm, fp8, None).extra_bytes == predict(bmm, full, None).extra_bytes + copies
    bf16_compute = _workload("bfloat16", "float8_e4m3fn", **fields)  # float32 product of one, then bf16 copies
    assert dequantized_bytes(bf16_compute) == copies // 2 + copies // 2


def test_backward_and_the_mha_module_are_unsupported_with_a_cache_type_and_undeclared_contenders_say_so():
    backward = _workload("float32", "float8_e4m3fn", seq_q=8, seq_k=8, pass_="fwd_bwd")
    assert not_runnable("bmm", backward) == (
        "unsupported",
        "kv_dtype float8_e4m3fn is a serving cache's storage, not trained: forward only",
    )
    mha = Workload(2, 4, 4, 8, 8, 16, module="mha", kv_dtype="bfloat16")
    verdict = not_runnable("bmm", mha)
    assert verdict is not None and "a cache's kv_dtype has no place there" in verdict[1]
    fused = not_runnable("fused_cpu", _workload("float32", "float8_e5m2", seq_q=64, seq_k=64))  # decode only
    assert fused == (
        "unsupported",
        "kv_dtype float8_e5m2 not supported with seq_q 64 (prefill: the decode kernel takes at most 16 query rows): "
        "fused_cpu takes it in its decode kernel only",
    )
    assert not_runnable("bmm", _workload("float32", "float32", seq_q=8, seq_k=8, pass_="fwd_bwd")) is None


def test_a_run_writes_ok_rows_with_the_cache_type_and_its_bytes(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli(
        "run",
        "--impl",
        "bmm,sdpa_math,einsum",
        "--batch",
        "2",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--seq",
        "1",
        "--seq-kv",
        "64",
        "--head-dim",
        "16",
        "--mask",
        "causal_bottom_right",
        "--kv-dtype",
        "float32,fp8",
        "--budget-s",
        "0.01",
        "--out",
        str(out),
    )
    assert code == 0, err
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert sorted((r["impl"], r["kv_dtype"]) for r in rows if r["status"] in CHECKED) == sorted(
        (impl, kind) for impl in ("bmm", "sdpa_math", "einsum") for kind in ("float32", "float8_e4m3fn")
    )
    bytes_of = {r["kv_dtype"]: float(r["bytes"]) for r in rows}
    q_and_o = 2 * 2 * 4 * 16 * 4
    cache = 2 * 2 * 2 * 64 * 16  # k and v elements
    assert bytes_of == {"float32": q_and_o + 4 * cache, "float8_e4m3fn": q_and_o + cache + 32}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--dtype", "float32", "--kv-dtype", "float16"],
            "attnbench: error: kv_dtype float16 with dtype float32 is not allowed; allowed: float32, bfloat16, "
            "float8_e4m3fn, float8_e5m2 (a cache is the dtype or narrower)",
        ),
        (
            ["--kv-dtype", "bogus"],
            "attnbench: error: kv_dtype 'bogus' is not known; allowed: the dtype, bfloat16, float8_e4m3fn, "
            "float8_e5m2 (or fp8, e5m2)",
        ),
    ],
)
def test_a_kv_dtype_outside_the_allowed_set_is_one_line_exit_2_nothing_written(cli, tmp_path, flags, message):
    out = tmp_path / "run"
    code, _, err = cli(
        "run",
        "--impl",
        "bmm",
        "--batch",
        "1",
        "--heads",
        "2",
        "--seq",
        "8",
        "--head-dim",
        "8",
        *flags,
        "--out",
        str(out),
    )
    assert code == 2
    assert err.strip() == message
    assert not out.exists()
