"""An fp8 forward (issue 32 item 3, ``q_dtype``): q, k and v in e4m3 with one float32 scale per (sequence, head),
the output in the dtype, checked against a float64 reference that reads the stored values times their scales at
the fp8 forward's own tolerance; fused_triton runs both dots in e4m3 (in Triton's interpreter here), bmm
dequantizes in the call; the rules that join q_dtype to kv_dtype; bad input in one line."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnbench import Workload, make_inputs
from attnbench.contenders import registry
from attnbench.contenders.contract import Contender
from attnbench.errors import UsageError
from attnbench.runner._predict import input_bytes
from attnbench.runner.cases import prepare_checked
from attnbench.workload.check import FP8_FORWARD_TOLERANCE, TOLERANCES, check_output, relative_rms
from attnbench.workload.flops import attention_bytes
from attnbench.workload.inputs import AttentionInputs

from conftest import attnbench_cmd, run_cases_split, run_subprocess

E4M3 = "float8_e4m3fn"


def _contender(name: str) -> Contender:
    contender = registry.get(name).contender
    assert contender is not None
    return contender


def _workload(**fields: Any) -> Workload:
    shape: dict[str, Any] = {"batch": 2, "heads": 4, "kv_heads": 2, "seq_q": 40, "seq_k": 40, "head_dim": 32}
    return Workload(**{**shape, "dtype": "bfloat16", "kv_dtype": E4M3, "q_dtype": E4M3, **fields})


def test_q_is_stored_in_e4m3_with_one_scale_per_sequence_and_head():
    w = _workload()
    inputs = make_inputs(w)
    assert inputs.q.dtype == inputs.k.dtype == inputs.v.dtype == torch.float8_e4m3fn
    assert inputs.q_scale is not None and inputs.q_scale.shape == (2, 4, 1, 1)
    stored = inputs.q.float().abs().amax(dim=(2, 3))
    assert torch.equal(stored, torch.full_like(stored, 448.0))  # each (sequence, head)'s largest lands on e4m3's
    assert not inputs.q.requires_grad and w.q_torch_dtype == torch.float8_e4m3fn


def test_the_fp8_forward_has_its_own_tolerance_and_bmm_passes_it():
    w = _workload(mask="causal")
    prepared = prepare_checked("bmm", w)
    assert prepared.check.ok, prepared.check.reason
    assert (prepared.check.atol, prepared.check.rtol) == FP8_FORWARD_TOLERANCE
    # bmm dequantizes q with its scales: the only error left is bf16's rounding, far inside the fp8 tolerance
    assert prepared.check.max_abs_err < TOLERANCES["bfloat16"][0]


def test_a_contender_that_ignores_q_scale_fails_the_check():
    w = _workload()
    inputs = make_inputs(w)
    stored = inputs.q.to(torch.bfloat16)  # q read as stored, its scale dropped: scores 1/scale too large
    unscaled = AttentionInputs(w, stored, inputs.k, inputs.v, inputs.grad_out, inputs.k_scale, inputs.v_scale)
    wrong = _contender("bmm").prepare(unscaled, w)()
    result = check_output(inputs, wrong)
    assert not result.ok and "float8_e4m3fn forward" in result.reason


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kv_dtype": "bfloat16"}, "q_dtype float8_e4m3fn with kv_dtype bfloat16 and dtype bfloat16 is not allowed"),
        ({"kv_dtype": "float8_e5m2"}, "allowed: the dtype, or float8_e4m3fn with kv_dtype float8_e4m3fn"),
    ],
)
def test_q_dtype_needs_the_same_fp8_cache(fields, message):
    with pytest.raises(UsageError, match=message):
        _workload(**fields)


def test_q_dtype_e5m2_is_not_known_and_the_cli_says_so_in_one_line(tmp_path):
    with pytest.raises(UsageError, match="q_dtype 'e5m2' is not known; allowed: the dtype, or float8_e4m3fn"):
        _workload(q_dtype="e5m2")
    out = tmp_path / "run"
    args = ("run", "--impl", "bmm", "--batch", "1", "--heads", "2", "--seq", "16", "--head-dim", "16")
    done = run_subprocess(*attnbench_cmd(*args, "--q-dtype", "fp8", "--out", str(out)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("(an fp8 forward: q, k and v in fp8, the output in the dtype)")
    assert not out.exists()


def test_peers_without_an_fp8_forward_say_so_and_it_is_forward_only():
    w = _workload()
    reason = _contender("sdpa_math").unsupported_reason(w)
    assert reason is not None and reason.startswith("q_dtype float8_e4m3fn not supported")
    backward = _contender("bmm").unsupported_reason(_workload(pass_="fwd_bwd"))
    assert backward is not None and "forward only" in backward


def test_bytes_count_q_in_one_byte_and_its_scales():
    w, plain = _workload(), _workload(q_dtype="bfloat16")
    q_elements = w.batch * w.heads * w.seq_q * w.head_dim
    assert attention_bytes(plain) - attention_bytes(w) == pytest.approx(q_elements * 2 - q_elements - 4 * 8)
    assert input_bytes(plain) - input_bytes(w) == q_elements


_CHECK = """
import json, sys
from attnbench.impls.fused_triton import contender, flash
from attnbench.runner.cases import prepare_checked
from attnbench.workload import Workload

launches = []
kernel = flash.forward_kernels._forward_kernel

class Recorded:
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            launches.append({"FP8": kwargs["FP8"], "KV_SCALED": kwargs["KV_SCALED"], "TMA": kwargs["TMA"]})
            return kernel[grid](*args, **kwargs)
        return launch

flash.forward_kernels._forward_kernel = Recorded()
results = {}
for name, spec in json.loads(sys.argv[1]).items():
    w = Workload(**spec)
    if contender.unsupported_reason(w):
        results[name] = {"unsupported": contender.unsupported_reason(w)}
        continue
    launches.clear()
    prepared = prepare_checked("fused_triton", w)
    results[name] = {"ok": prepared.ok, "max_abs_err": prepared.check.max_abs_err, "atol": prepared.check.atol,
                     "reason": prepared.reason, "launches": list(launches)}
print(json.dumps(results))
"""


def _case(**spec: Any) -> dict[str, Any]:
    base = {"batch": 2, "heads": 4, "kv_heads": 2, "seq_q": 70, "seq_k": 70, "head_dim": 64, "device": "cpu"}
    return {**base, "dtype": "bfloat16", "kv_dtype": E4M3, "q_dtype": E4M3, "mask": "none", **spec}


CASES: dict[str, dict[str, Any]] = {
    "none-gqa": _case(),
    "causal-D128": _case(mask="causal", head_dim=128, seq_q=50, seq_k=50),
    "window-softcap": _case(mask="sliding_window", window=20, score_mod="softcap", softcap=20.0),
    "bottom-right-sinks-float32-out": _case(
        seq_q=6, seq_k=90, mask="causal_bottom_right", sinks="learned", dtype="float32"
    ),
    "padding-alibi-dv48": _case(mask="padding", score_mod="alibi", head_dim_v=48),
}
PAGED = _case(seq_q=4, seq_k=64, mask="causal_bottom_right", page_size=16)


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    pytest.importorskip("triton")
    return run_cases_split(_CHECK, {**CASES, "paged": PAGED}, {"TRITON_INTERPRET": "1"}, "")


@pytest.mark.parametrize("name", list(CASES))
def test_fused_triton_runs_the_fp8_forward_in_e4m3_within_its_tolerance(interpreted, name):
    result = interpreted[name]
    assert result["ok"], result["reason"]
    assert result["atol"] == FP8_FORWARD_TOLERANCE[0] and result["max_abs_err"] <= FP8_FORWARD_TOLERANCE[0] * 2
    # the forward kernel, even for a decode-sized Sq; q's and k's scales folded (no per-key scaling), v by pointers
    assert result["launches"] and all(
        launch == {"FP8": True, "KV_SCALED": False, "TMA": False} for launch in result["launches"]
    )


def test_fused_triton_refuses_a_paged_fp8_forward_with_the_reason(interpreted):
    assert "no pages" in interpreted["paged"]["unsupported"]


def test_an_fp8_forward_is_measured_against_the_fp8_roofs():
    from attnbench.measure._ceilings import measure_matmul_tflops
    from attnbench.measure._datasheet import lookup
    from attnbench.runner.sweep import _dots

    w = _workload()
    assert w.compute_dtype == E4M3 and _workload(q_dtype="bfloat16").compute_dtype == "bfloat16"
    assert _dots(w) == {"bfloat16"} and _dots(_workload(device="cuda")) == {"bfloat16", E4M3}
    sheet = lookup("NVIDIA H100 80GB HBM3")
    assert sheet is not None  # Hopper's fp8 tensor cores: twice its bf16 rate
    assert sheet.tflops[E4M3] == pytest.approx(2 * sheet.tflops["bfloat16"], abs=0.2)
    assert measure_matmul_tflops("cpu", E4M3, 1) == 0.0  # no fp8 matmul on a CPU: no roof, pct_of_peak empty


def test_rounding_p_to_e4m3_costs_more_than_bf16_tolerance_and_less_than_the_fp8_one():
    """The fp8 forward's tolerance, reproduced: q, k, v quantized to e4m3 (read back by the reference as data),
    the scores in float32 from them, P rounded to e4m3 for P·V as the kernel does; its error against float64 on
    random normals (S 16–1024, D 64/128, none and causal, three seeds) in units of each tolerance."""
    e4m3 = torch.float8_e4m3fn

    def stored(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = x.abs().amax(dim=(-1, -2), keepdim=True) / 448
        return (x / scale).to(e4m3).float(), scale

    worst = {"bfloat16": 0.0, "fp8": 0.0}
    rms = []  # each case's relative RMS error (check.relative_rms): why an fp8 forward has no RMS bound
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        for seq, dim, causal in [(16, 64, False), (37, 64, True), (300, 128, True), (1024, 128, False)]:
            (q, sq), (k, sk), (v, sv) = (stored(torch.randn(2, 4, seq, dim, generator=generator)) for _ in range(3))
            hidden = (
                torch.ones(seq, seq, dtype=torch.bool).triu(1) if causal else torch.zeros(seq, seq, dtype=torch.bool)
            )
            exact = (q.double() * sq) @ (k.double() * sk).transpose(-1, -2) / dim**0.5
            ref = torch.softmax(exact.masked_fill(hidden, -torch.inf), -1) @ (v.double() * sv)
            scores = (q @ k.transpose(-1, -2)) * (sq * sk) / dim**0.5
            p = torch.exp(
                scores.masked_fill(hidden, -torch.inf) - scores.masked_fill(hidden, -torch.inf).amax(-1, True)
            )
            out = (p.to(e4m3).float() @ v) * sv / p.sum(-1, keepdim=True)
            error = (out.double() - ref).abs()
            rms.append(relative_rms(error, ref)[0])
            for name, (atol, rtol) in (("bfloat16", TOLERANCES["bfloat16"]), ("fp8", FP8_FORWARD_TOLERANCE)):
                worst[name] = max(worst[name], float((error / (atol + rtol * ref.abs())).max()))
    assert 1.0 < worst["bfloat16"] < 2.0 and worst["fp8"] < 0.8, worst  # bf16's would fail; 1/0.8 of margin here
    assert max(rms) > TOLERANCES["bfloat16"][1] / 2, rms  # within 2× of the rtol: an RMS bound there would flake
