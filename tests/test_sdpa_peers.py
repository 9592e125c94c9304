"""SDPA's backends called as a competent user calls them (issue #37): enable_gqa, causal_lower_right, no mask
where none hides anything, k and v repeated only where torch refuses enable_gqa; rows that see no key zero
or the row is `incorrect`; and model presets on CUDA in their own dtype.

CUDA-only decisions are checked on CPU with torch's SDPA and ``sdpa_kernel`` faked: the fake refuses what
torch 2.11 refuses (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) the way it does, warnings first."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, CausalVariant

import attnbench
from attnbench.contenders import registry
from attnbench.contenders.contract import Unsupported
from attnbench.impls import _sdpa
from attnbench.impls._sdpa_reasons import backend_reasons, clause
from attnbench.runner.cases import RunOptions, prepare_checked, run_case
from attnbench.runner.request import build_request
from attnbench.runner.sweep import plan_cases
from attnbench.workload import Workload
from attnbench.workload.inputs import make_inputs
from attnbench.workload.reference import reference_output, sample_rows
from attnbench.workload.suite import DEFAULTS, Suite, expand, load_suite

MEMBERS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_math": "MATH",
}
HEADERS = {
    "EFFICIENT_ATTENTION": "Memory efficient kernel not used because:",
    "FLASH_ATTENTION": "Flash attention kernel not used because:",
    "CUDNN_ATTENTION": "cuDNN attention kernel not used because:",
}
TRIGGERED = " (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:986.)"
GARBAGE = 0.5  # what the fake kernel writes everywhere, rows that see no key included


def _refusal(member: str, q: torch.Tensor, k: torch.Tensor, kwargs: dict) -> str | None:
    """Why torch 2.11 gives ``member`` no kernel for this call (its own words), or None."""
    mask = kwargs.get("attn_mask")
    unequal = q.shape[1] != k.shape[1]
    if member == "FLASH_ATTENTION" and mask is not None and not isinstance(mask, CausalBias):
        return "Flash Attention does not support non-null attn_mask."
    if member == "EFFICIENT_ATTENTION" and unequal:  # no grouped-query check in its constraint list
        return "For dense input, both fused kernels require query, key and value to have the same num_heads."
    if unequal and not kwargs.get("enable_gqa"):
        return "For dense input, both fused kernels require query, key and value to have the same num_heads."
    return None


class FakeTorch:
    """sdpa_kernel and scaled_dot_product_attention as torch 2.11 on a GPU behaves, recording every call."""

    def __init__(self) -> None:
        self.active: str | None = None
        self.calls: list[dict] = []

    @contextlib.contextmanager
    def sdpa_kernel(self, backends):
        (backend,) = backends
        self.active = backend.name
        try:
            yield
        finally:
            self.active = None

    def sdpa(self, q, k, v, **kwargs):
        self.calls.append({"backend": self.active, "k": k, "v": v, **kwargs})
        why = _refusal(self.active, q, k, kwargs)
        if why is not None:  # torch's select_sdp_backend: each backend's section, then the error
            for member, header in HEADERS.items():
                warnings.warn(header + TRIGGERED, stacklevel=2)
                own = why if member == self.active else f"{header.split(' kernel')[0]} has been runtime disabled."
                warnings.warn(own + TRIGGERED, stacklevel=2)
            raise RuntimeError("No available kernel. Aborting execution.")
        return torch.full((*q.shape[:-1], v.shape[-1]), GARBAGE, dtype=q.dtype)


@pytest.fixture
def fake(monkeypatch) -> FakeTorch:
    faked = FakeTorch()
    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", faked.sdpa_kernel)
    monkeypatch.setattr(F, "scaled_dot_product_attention", faked.sdpa)
    return faked


def _prepared(impl: str, workload: Workload, requires_grad: bool = False):
    contender = registry.get(impl).contender
    assert contender is not None
    inputs = make_inputs(workload, requires_grad=requires_grad)
    return inputs, contender.prepare(inputs, workload)


DECODE = dict(batch=2, heads=8, kv_heads=2, seq_q=1, seq_k=64, head_dim=16, mask="causal_bottom_right")


@pytest.mark.parametrize("impl", MEMBERS)
def test_a_gqa_decode_step_gets_no_mask_and_enable_gqa_or_kv_repeated_once_where_torch_refuses_it(fake, impl):
    inputs, run = _prepared(impl, Workload(**DECODE))
    run(), run()
    first, second = fake.calls[-2:]
    assert {first["backend"], second["backend"]} == {MEMBERS[impl]}
    assert "attn_mask" not in first and "is_causal" not in first  # one query row bottom-right sees every key
    if impl == "sdpa_efficient":  # torch 2.11 refuses enable_gqa there: k, v repeated to 8 heads, in prepare
        assert fake.calls[0]["enable_gqa"] is True  # asked torch's way first
        assert "enable_gqa" not in first and first["k"].shape[1] == first["v"].shape[1] == 8
        assert first["k"] is second["k"] and first["v"] is second["v"]  # made once, outside the timed call
        assert first["k"].untyped_storage().data_ptr() != inputs.k.untyped_storage().data_ptr()  # a copy
        assert torch.equal(first["k"][:, 5], inputs.k[:, 1])  # query head 5 reads kv head 5 // 4
    else:
        assert first["enable_gqa"] is True and first["k"] is inputs.k and first["v"] is inputs.v  # no copy


def test_mqa_repeats_k_and_v_as_a_view_and_a_backward_pass_repeats_in_the_call(fake):
    inputs, run = _prepared("sdpa_efficient", Workload(**{**DECODE, "kv_heads": 1}))
    run()
    k = fake.calls[-1]["k"]
    assert k.shape[1] == 8 and k.stride(1) == 0  # a view: one kv head read by every query head
    assert k.untyped_storage().data_ptr() == inputs.k.untyped_storage().data_ptr()
    inputs, run = _prepared("sdpa_efficient", Workload(**DECODE, pass_="fwd_bwd"), requires_grad=True)
    run(), run()
    first, second = fake.calls[-2:]
    assert first["k"] is not second["k"] and first["k"].grad_fn is not None  # repeated per call, on k's graph


@pytest.mark.parametrize("impl", MEMBERS)
def test_bottom_right_goes_as_causal_lower_right_to_flash_and_efficient_and_as_is_causal_when_square(fake, impl):
    _prepared(impl, Workload(**{**DECODE, "seq_q": 5}))[1]()
    mask = fake.calls[-1]["attn_mask"]
    if impl in ("sdpa_flash", "sdpa_efficient"):
        assert isinstance(mask, CausalBias) and mask.variant == CausalVariant.LOWER_RIGHT
        assert (mask.seq_len_q, mask.seq_len_kv) == (5, 64)
    else:  # math and cuDNN: no kernel of their own for it in torch, so the boolean mask built in prepare
        assert mask.dtype == torch.bool and torch.equal(mask[0, 0], torch.ones(5, 64, dtype=torch.bool).tril(59))
    _prepared(impl, Workload(**{**DECODE, "seq_q": 64}))[1]()
    assert fake.calls[-1]["is_causal"] is True and "attn_mask" not in fake.calls[-1]


@pytest.mark.parametrize("impl", MEMBERS)
def test_rows_that_see_no_key_are_zeroed_whatever_the_kernel_wrote_there(fake, impl):
    workload = Workload(**{**DECODE, "seq_q": 20, "seq_k": 8})  # bottom-right: rows 0 … 11 see no key
    out = _prepared(impl, workload)[1]()
    assert torch.equal(out[:, :, :12], torch.zeros_like(out[:, :, :12]))
    assert bool((out[:, :, 12:] == GARBAGE).all())  # the others are the kernel's own


def test_a_refusal_gives_the_forced_backends_clause_only(fake):
    with pytest.raises(Unsupported) as refused:
        _prepared("sdpa_flash", Workload(**{**DECODE, "seq_q": 4, "mask": "padding"}))
    assert str(refused.value) == "no kernel for this workload: Flash Attention does not support non-null attn_mask."
    assert len(fake.calls) == 1  # flash takes enable_gqa: no repeat of k and v tried (G× the cache) for the mask
    noise = "needs one head dim (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils.cpp:986.)"
    assert clause(noise + "\nthe rest") == "needs one head dim"
    assert backend_reasons("MATH", ["no viable backend", "no viable backend"]) == ["no viable backend"]  # no sections


@pytest.mark.parametrize(
    ("workload", "forms"),
    [  # flash, efficient, cuDNN, math
        (dict(DECODE), ["none"] * 4),
        ({**DECODE, "seq_q": 5}, ["lower_right", "lower_right", "dense", "dense"]),
        ({**DECODE, "seq_q": 64}, ["is_causal"] * 4),
        ({**DECODE, "seq_q": 64, "mask": "causal"}, ["is_causal"] * 4),
        ({**DECODE, "mask": "none"}, ["none"] * 4),
        ({**DECODE, "seq_q": 5, "mask": "sliding_window", "window": 8}, ["dense"] * 4),
        ({**DECODE, "seq_q": 5, "score_mod": "alibi"}, ["additive"] * 4),
        ({**DECODE, "seq_q": 16, "mask": "mixed", "decode_share": 0.5}, ["dense"] * 4),
    ],
)
def test_mask_form_per_backend(workload, forms):
    for member, form in zip(MEMBERS.values(), forms, strict=True):
        assert _sdpa.mask_form(member, Workload(**workload, device="cuda")) == form, member


def test_kv_repeated_in_prepare_only_for_a_contiguous_forward_in_the_dtype():
    plain = Workload(**DECODE)
    assert _sdpa.repeats_in_prepare(plain)
    for departing in (dict(pass_="fwd_bwd"), dict(page_size=16), dict(kv_dtype="float8_e4m3fn")):
        assert not _sdpa.repeats_in_prepare(Workload(**{**DECODE, **departing})), departing
    efficient, flash = (registry.get(name).contender for name in ("sdpa_efficient", "sdpa_flash"))
    assert efficient is not None and flash is not None
    copy = 2 * 8 * 64 * (16 + 16) * 4  # k and v at Hq = 8 heads, float32
    gqa, mqa = Workload(**DECODE), Workload(**{**DECODE, "kv_heads": 1})
    assert efficient.predicted_extra_bytes(gqa) - flash.predicted_extra_bytes(gqa) == copy  # the memory model
    assert efficient.predicted_extra_bytes(mqa) == flash.predicted_extra_bytes(mqa)  # a view


SHAPES = {  # GQA and MQA with bottom-right masks, the rows that see no key among them where Sq > Sk
    "gqa-decode": dict(DECODE),
    "gqa-cross": {**DECODE, "seq_q": 5},
    "mqa-more-queries": {**DECODE, "kv_heads": 1, "seq_q": 33, "seq_k": 20},
    "gqa-window-more-queries": {**DECODE, "seq_q": 24, "seq_k": 20, "mask": "sliding_window", "window": 6},
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("impl", ["sdpa_math", "sdpa_flash"])
def test_cpu_backends_agree_with_the_float64_reference_on_gqa_bottom_right_shapes(impl, shape, dtype):
    prepared = prepare_checked(impl, Workload(**SHAPES[shape], dtype=dtype))
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.checked_rows == SHAPES[shape]["seq_q"]


@pytest.mark.parametrize("impl", ["sdpa_math", "sdpa_flash"])
def test_cpu_backends_gradients_on_a_bottom_right_gqa_case_with_unseeing_rows(impl):
    prepared = prepare_checked(impl, Workload(**SHAPES["mqa-more-queries"], pass_="fwd_bwd"))
    assert prepared.ok, prepared.reason


@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd"])
def test_the_repeated_kv_way_is_correct_where_torch_refuses_enable_gqa(monkeypatch, pass_):
    """torch's real math backend, with enable_gqa refused as torch 2.11's efficient kernel refuses it and treated
    as that kernel is: the contender falls back to k and v repeated to Hq heads, and its output and gradients
    pass the check."""
    real, seen = F.scaled_dot_product_attention, []

    def refusing(q, k, v, **kwargs):
        seen.append(kwargs.get("enable_gqa", False))
        if kwargs.get("enable_gqa"):
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", refusing)
    monkeypatch.setattr(_sdpa, "REPEATS_KV", frozenset({"MATH"}))  # math as the efficient kernel is treated
    prepared = prepare_checked("sdpa_math", Workload(**SHAPES["gqa-window-more-queries"], pass_=pass_))
    assert prepared.ok, prepared.reason
    assert seen[0] is True and not any(seen[1:])


class UnseeingRowsWrong(attnbench.Contender):
    """bmm's attention, except on the query rows that see no key, where it writes ``value`` (NaN, or garbage)."""

    name = "planted_unseeing_rows"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}), masks=frozenset(_sdpa.ALL_MASKS))
    value = float("nan")

    def prepare(self, inputs, workload):
        forward = registry.get("bmm").contender.prepare(inputs, workload)
        empty = inputs.empty_rows
        assert empty is not None
        return lambda: forward().masked_fill(empty, self.value)


UNSEEING = {  # Sq > Sk: the first rows see no key; 300 rows > 256, so the check samples them
    "bottom-right": Workload(1, 2, 1, 300, 20, 16, mask="causal_bottom_right"),
    "window": Workload(2, 4, 2, 30, 12, 16, mask="sliding_window", window=4),
    "chunked": Workload(1, 2, 2, 40, 24, 16, mask="chunked", chunk=8),
}


@pytest.mark.parametrize("value", [float("nan"), 0.25])
@pytest.mark.parametrize("case", UNSEEING)
def test_a_contender_wrong_only_on_rows_that_see_no_key_is_incorrect(planted, monkeypatch, case, value):
    workload = UNSEEING[case]
    inputs = make_inputs(workload)
    unseeing = torch.nonzero(inputs.empty_rows[0, 0, :, 0]).flatten()
    assert set(unseeing.tolist()) & set(sample_rows(workload.seq_q).tolist())  # the check looks at them
    assert torch.equal(
        reference_output(inputs, unseeing),
        torch.zeros(workload.batch, workload.heads, len(unseeing), workload.head_dim, dtype=torch.float64),
    )
    monkeypatch.setattr(UnseeingRowsWrong, "value", value)
    attnbench.register(UnseeingRowsWrong())
    planted.append(UnseeingRowsWrong.name)
    row = run_case(UnseeingRowsWrong.name, workload, RunOptions(budget_s=0.02, measure_memory=False))
    assert row["status"] == "incorrect", row["reason"]
    assert ("NaN" in row["reason"]) if value != value else ("over tolerance" in row["reason"])
    monkeypatch.setattr(UnseeingRowsWrong, "value", 0.0)  # zeros there: the same contender is right
    assert run_case(UnseeingRowsWrong.name, workload, RunOptions(budget_s=0.02, measure_memory=False))["status"] in (
        "ok",
        "stalled",
    )


def _dtypes(axes: dict) -> set[tuple[str, str]]:
    _, cases = plan_cases(build_request(axes={"impl": "bmm", **axes}))
    return {(w.device, w.dtype) for _, w in cases}


def test_a_model_preset_on_cuda_runs_its_dtype_unless_one_is_given():
    """`attnbench run --model llama3.1-8b --phase decode --device cuda` plans bf16 cases (planning needs no GPU)."""
    decode = {"model": "llama3.1-8b", "phase": "decode"}
    assert _dtypes({**decode, "device": "cuda"}) == {("cuda", "bfloat16")}
    assert _dtypes({**decode, "device": "cuda", "dtype": "float32"}) == {("cuda", "float32")}  # --dtype wins
    assert _dtypes({**decode, "device": "cpu"}) == {("cpu", "float32")}  # the CPU keeps float32
    assert _dtypes({**decode, "device": "cpu,cuda"}) == {("cpu", "float32"), ("cuda", "bfloat16")}
    assert _dtypes({"model": "gpt2", "phase": "prefill", "device": "cuda", "seq": 128}) == {("cuda", "bfloat16")}
    plain = Suite(
        "plain",
        "",
        1.0,
        60.0,
        ({**DEFAULTS, "batch": [1], "heads": [2], "seq": [8], "head_dim": [8], "device": ["cuda"], "impl": ["bmm"]},),
    )
    assert {w.dtype for _, w in expand(plain, {}, sorted(registry.load()))} == {"float32"}  # not a preset: float32


def test_a_suite_names_the_dtype_or_its_presets_take_theirs(tmp_path: Path):
    known = sorted(registry.load())
    suite = tmp_path / "mine.toml"
    suite.write_text('[defaults]\ndevice = "cuda"\nimpl = "bmm"\n\n[[sweep]]\nmodel = "qwen3-8b"\nphase = "decode"\n')
    assert {w.dtype for _, w in expand(load_suite(str(suite)), {}, known)} == {"bfloat16"}
    suite.write_text(suite.read_text().replace('impl = "bmm"', 'impl = "bmm"\ndtype = "float32"'))
    assert {w.dtype for _, w in expand(load_suite(str(suite)), {}, known)} == {"float32"}
    assert {w.dtype for _, w in expand(load_suite("models-cpu"), {}, known)} == {"float32"}
    assert {w.dtype for _, w in expand(load_suite("models-gpu"), {}, known)} == {"bfloat16"}
