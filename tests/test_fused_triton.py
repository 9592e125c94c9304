"""fused_triton, our Triton FlashAttention kernels (forward and backward), checked in Triton's CPU interpreter.

Triton decides when a kernel is defined whether it is compiled or interpreted, so the checks run in a
subprocess started with TRITON_INTERPRET=1: one process checks every case against the float64 reference
through the harness's own correctness gates (``prepare_checked``: the output, and for bwd/fwd_bwd the
gradients), another drives ``attnbench run``. Shapes are small but chosen so that the interpreter's
tiles (forward and dQ: 32 rows × 16 keys; dK/dV: 16 rows × 32 keys) are split unevenly: several row
tiles, partial last tiles, blocks skipped, unmasked and boundary blocks. Tile choice and the launch path
of the timed callable are checked in this process with the kernels mocked (no GPU needed).
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any

import pandas as pd
import pytest
import torch

from attnbench.impls.fused_triton import NEEDS_CUDA, contender
from attnbench.workload import MASKS, Workload
from attnbench.workload.check import GRAD_TOLERANCES, TOLERANCES
from attnbench.workload.masks import document_lengths

from conftest import CHECKED, attnbench_cmd, run_cases_split, run_subprocess

INTERPRETER = {"TRITON_INTERPRET": "1"}

# For each case: the harness's correctness gate (for the mha module too); for the attention core also
# the largest |output| on rows that see no key (must be exactly 0), the same check on q, k, v handed over
# as non-contiguous views, and the output again with NaN written into k and v at the keys no query row
# sees (it must not change: the kernel never reads them). Backward cases: the gradient gate, dq on rows
# that see no key and dk, dv at keys no row sees (exactly 0), and the gradients of non-contiguous views.
_CHECK_CASES = """
import json, sys
import torch
from attnbench.workload.check import check_grads, check_output
from attnbench.impls.fused_triton import contender
from attnbench.workload.inputs import AttentionInputs, make_inputs
from attnbench.workload.paged import gathered
from attnbench.runner.cases import prepare_checked
from attnbench.workload import Workload

def strided(t):  # same values in (B, S, H, D) memory order, rows D + 8 apart
    B, H, S, D = t.shape
    return torch.empty(B, S, H, D + 8, dtype=t.dtype)[..., :D].transpose(1, 2).copy_(t)

def unseen_keys(inputs):  # (B|1, 1, Sk, 1) keys that no query row sees
    return ~inputs.bool_mask.any(dim=2).unsqueeze(-1)

def backward_checks(w, spec, prepared):
    inputs = make_inputs(w, requires_grad=True)
    dq, dk, dv = prepared.fn()
    grad = prepared.grad_check
    result = {"grad_ok": grad.ok, "grad_err": grad.grad_err, "grad_tol": grad.grad_tol}
    empty = inputs.empty_rows
    result["empty_rows_dq_max"] = None if empty is None else float(dq.masked_select(empty).abs().max())
    if inputs.bool_mask is not None and bool(unseen_keys(inputs).any()):
        unseen = unseen_keys(inputs)
        result["unseen_dk_dv_max"] = max(float(g.masked_select(unseen).abs().max()) for g in (dk, dv))
    if not spec.get("strided_grads"):
        return result
    leaves = [strided(t.detach()).requires_grad_() for t in (inputs.q, inputs.k, inputs.v)]
    view = AttentionInputs(w, *leaves, inputs.grad_out)
    grads = torch.autograd.grad(contender.prepare(view, w)(), leaves, inputs.grad_out)
    check = check_grads(view, grads)
    result["strided_grad_ok"], result["strided_grad_err"] = check.ok, check.grad_err
    return result

results = {}
for name, spec in json.loads(sys.argv[1]).items():
    w = Workload(**{key: value for key, value in spec.items() if key != "strided_grads"})
    prepared = prepare_checked("fused_triton", w)
    result = {"ok": prepared.ok, "max_abs_err": prepared.check.max_abs_err, "reason": prepared.reason}
    if w.pass_ != "fwd":
        result.update(backward_checks(w, spec, prepared))
    elif w.module == "core":
        inputs = make_inputs(w)
        out = prepared.fn()
        empty = inputs.empty_rows
        result["empty_rows_max"] = None if empty is None else float(out.masked_select(empty).abs().max())
        view = AttentionInputs(w, strided(inputs.q), strided(inputs.k), strided(inputs.v), inputs.grad_out)
        assert not any(t.is_contiguous() for t in (view.q, view.k, view.v))
        check = check_output(view, contender.prepare(view, w)())
        result["strided_ok"], result["strided_err"] = check.ok, check.max_abs_err
        if inputs.bool_mask is not None:
            unseen = unseen_keys(inputs)
            k, v = inputs.k.masked_fill(unseen, float("nan")), inputs.v.masked_fill(unseen, float("nan"))
            poisoned = AttentionInputs(w, inputs.q, k, v, inputs.grad_out)
            result["unseen_keys"] = int(unseen.sum())
            result["unchanged_by_nan"] = torch.equal(contender.prepare(poisoned, w)(), out)
        if w.page_size:  # the timed call reads the page pool: NaN in the contiguous k and v changes nothing
            paged = make_inputs(w)
            run = gathered(paged.paged, paged.k, paged.v, contender.prepare(paged, w))
            paged.k.fill_(float("nan")), paged.v.fill_(float("nan"))
            result["reads_pages"] = torch.equal(run(), out)
    results[name] = result

# gpu_smoke's own checks, run here in the interpreter: its 64-bit offset case (q, k, v rows 2^26 elements
# apart, the last past 2^31: a 5 GiB buffer of address space of which only 40 rows' pages are touched) and
# its forced-tile loop on one tiny case with a few tiles.
from attnbench.impls.fused_triton.smoke import check_far_offsets, smoke
from attnbench.impls.fused_triton.tiles import Tile
if sys.argv[2:] == ["tail"]:
    results["far-offsets"] = {"reason": check_far_offsets("cpu")}
    tiny = Workload(1, 4, 2, 40, 24, 50, dtype="float32", mask="causal_bottom_right", pass_="fwd_bwd")
    forced = {"fwd": [Tile(16, 32, 1, 1)], "dkdv": [Tile(32, 16, 1, 1)], "dq": [Tile(16, 16, 1, 1)]}
    import contextlib, io
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        failures = smoke("cpu", cases=[tiny], tiles=forced)
    results["smoke"] = {"failures": failures, "lines": printed.getvalue().splitlines()}
print(json.dumps(results))
"""


def _case(**spec: Any) -> dict[str, Any]:
    return {"batch": 1, "heads": 2, "kv_heads": 2, "head_dim": 32, "dtype": "float32", "device": "cpu", **spec}


CASES: dict[str, dict[str, Any]] = {
    "none-S64": _case(seq_q=64, seq_k=64),
    "causal-S80-D64": _case(seq_q=80, seq_k=80, head_dim=64, mask="causal"),
    "causal-top-left-S48x80": _case(seq_q=48, seq_k=80, mask="causal"),
    "causal-S40x16": _case(seq_q=40, seq_k=16, mask="causal"),
    "bottom-right-S80x33-empty-rows-gqa": _case(
        seq_q=80, seq_k=33, heads=4, kv_heads=2, head_dim=50, mask="causal_bottom_right"
    ),
    "bottom-right-S20x70-mqa": _case(seq_q=20, seq_k=70, heads=4, kv_heads=1, head_dim=50, mask="causal_bottom_right"),
    "bottom-right-S1x70-decode": _case(seq_q=1, seq_k=70, mask="causal_bottom_right"),
    "padding-B3-S37x70-gqa": _case(batch=3, seq_q=37, seq_k=70, heads=4, kv_heads=2, mask="padding"),
    "padding-B1-S50": _case(seq_q=50, seq_k=50, head_dim=16, mask="padding"),
    "none-D256": _case(seq_q=24, seq_k=40, head_dim=256),
    "none-scale1-float16": _case(seq_q=40, seq_k=56, head_dim=96, dtype="float16", scale=1.0),
    "causal-float16-gqa": _case(seq_q=64, seq_k=64, heads=4, kv_heads=1, mask="causal", dtype="float16"),
    "padding-B2-float16": _case(batch=2, seq_q=33, seq_k=64, head_dim=50, mask="padding", dtype="float16"),
    "bottom-right-bfloat16": _case(
        seq_q=70, seq_k=40, heads=4, kv_heads=2, mask="causal_bottom_right", dtype="bfloat16"
    ),
    "padding-B2-bfloat16": _case(batch=2, seq_q=48, seq_k=48, head_dim=24, mask="padding", dtype="bfloat16"),
    "mha-module-causal": _case(seq_q=40, seq_k=40, head_dim=16, mask="causal", module="mha"),
    "mha-module-cross": _case(seq_q=24, seq_k=56, head_dim=16, module="mha"),
    # backward: every mask, GQA 4/2 and 4/1, head_dim 50 and 96, Sq ≠ Sk, the three dtypes
    "bwd-none-S40x24-gqa-D50": _case(
        seq_q=40, seq_k=24, heads=4, kv_heads=2, head_dim=50, pass_="bwd", strided_grads=True
    ),
    "bwd-causal-S40x70-D96": _case(seq_q=40, seq_k=70, head_dim=96, mask="causal", pass_="fwd_bwd"),
    "bwd-bottom-right-S70x33-mqa": _case(
        seq_q=70, seq_k=33, heads=4, kv_heads=1, mask="causal_bottom_right", pass_="bwd"
    ),
    "bwd-padding-B3-S33x50-gqa-D50": _case(
        batch=3,
        seq_q=33,
        seq_k=50,
        heads=4,
        kv_heads=2,
        head_dim=50,
        mask="padding",
        pass_="fwd_bwd",
        strided_grads=True,
    ),
    "bwd-causal-float16-mqa": _case(
        seq_q=48, seq_k=48, heads=4, kv_heads=1, head_dim=64, mask="causal", dtype="float16", pass_="bwd"
    ),
    "bwd-bottom-right-bfloat16-S24x56": _case(
        seq_q=24,
        seq_k=56,
        heads=4,
        kv_heads=2,
        mask="causal_bottom_right",
        dtype="bfloat16",
        pass_="fwd_bwd",
        strided_grads=True,
    ),
    "bwd-padding-float16-D96": _case(
        batch=2, seq_q=20, seq_k=40, head_dim=96, mask="padding", dtype="float16", pass_="bwd"
    ),
    # the workload features: sliding_window (Sq = Sk, Sq < Sk, Sq > Sk), document, softcap, alibi, paged KV
    "window-S64-w20-gqa": _case(seq_q=64, seq_k=64, heads=4, kv_heads=2, mask="sliding_window", window=20),
    "window-S24x56-w16": _case(seq_q=24, seq_k=56, mask="sliding_window", window=16),
    "window-S56x24-w8-empty-rows": _case(seq_q=56, seq_k=24, mask="sliding_window", window=8),
    "document-3-B2-S64-gqa": _case(batch=2, seq_q=64, seq_k=64, heads=4, kv_heads=2, mask="document", documents=3),
    "softcap-causal-S48x64-float16": _case(
        seq_q=48, seq_k=64, mask="causal", score_mod="softcap", softcap=2.0, dtype="float16"
    ),
    "alibi-causal-S64-gqa": _case(seq_q=64, seq_k=64, heads=4, kv_heads=2, mask="causal", score_mod="alibi"),
    "paged-decode-S4x64-page16-gqa": _case(
        seq_q=4, seq_k=64, heads=4, kv_heads=2, mask="causal_bottom_right", page_size=16
    ),
    "bwd-window-S40x64-w24-gqa": _case(
        seq_q=40, seq_k=64, heads=4, kv_heads=2, mask="sliding_window", window=24, pass_="fwd_bwd"
    ),
    "bwd-window-S48-w16": _case(seq_q=48, seq_k=48, mask="sliding_window", window=16, pass_="fwd_bwd"),
    "bwd-document-3-S48": _case(seq_q=48, seq_k=48, mask="document", documents=3, pass_="fwd_bwd"),
    "bwd-softcap-S40x56": _case(seq_q=40, seq_k=56, score_mod="softcap", softcap=2.0, pass_="fwd_bwd"),
    "bwd-alibi-causal-S48-gqa": _case(
        seq_q=48, seq_k=48, heads=4, kv_heads=2, mask="causal", score_mod="alibi", pass_="fwd_bwd"
    ),
}
BACKWARD = [name for name, spec in CASES.items() if spec.get("pass_", "fwd") != "fwd"]


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    """Every case of CASES, checked in the interpreter (one process per core), and gpu_smoke's own checks."""
    pytest.importorskip("triton")
    return run_cases_split(_CHECK_CASES, CASES, INTERPRETER, "tail")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_float64_reference_in_the_interpreter(interpreted, name):
    spec, result = CASES[name], interpreted[name]
    atol, _ = TOLERANCES[spec["dtype"]]
    assert result["ok"], result["reason"]
    assert result["max_abs_err"] <= atol
    if name in BACKWARD:  # the gradient gate, for contiguous (and some non-contiguous) q, k, v
        assert result["grad_ok"] and result["grad_err"] <= GRAD_TOLERANCES[spec["dtype"]]
        if spec.get("strided_grads"):
            assert result["strided_grad_ok"] and result["strided_grad_err"] <= GRAD_TOLERANCES[spec["dtype"]]
    elif spec.get("module", "core") == "core":  # the same kernel reading non-contiguous q, k, v
        assert result["strided_ok"] and result["strided_err"] <= atol


def test_offsets_past_two_to_the_31_elements_are_64_bit(interpreted):
    # the interpreter wraps int32 arithmetic like the GPU does: with 32-bit row offsets this case reads
    # outside the buffer (it crashed the process when tried)
    assert (40 - 1) << 26 > 2**31
    assert interpreted["far-offsets"]["reason"] == ""


def test_gpu_smokes_forced_tiles_pass_in_the_interpreter(interpreted):
    assert interpreted["smoke"]["failures"] == []
    checked = [line.split(": ")[1] for line in interpreted["smoke"]["lines"][:3]]
    assert checked == ["1 cases checked, 0 wrong"] * 3  # each forced tile ran (not pruned, not unfit)


def test_gradients_are_exactly_zero_where_nothing_is_seen(interpreted):
    # bottom-right Sq 70 > Sk 33: rows 0-36 see no key, so their dq is 0
    assert interpreted["bwd-bottom-right-S70x33-mqa"]["empty_rows_dq_max"] == 0.0
    # keys no row sees (causal top-left Sq 40 < Sk 70: keys 40-69; padding: keys past each length): dk = dv = 0
    unseen = {
        name: interpreted[name]["unseen_dk_dv_max"] for name in BACKWARD if "unseen_dk_dv_max" in interpreted[name]
    }
    assert {"bwd-causal-S40x70-D96", "bwd-padding-B3-S33x50-gqa-D50", "bwd-padding-float16-D96"} <= set(unseen)
    assert "bwd-window-S40x64-w24-gqa" in unseen  # key 0: below every row's window
    assert set(unseen.values()) == {0.0}


def test_rows_that_see_no_key_are_exactly_zero(interpreted):
    # bottom-right causal with Sq 80 > Sk 33: the first 47 rows see no key
    assert interpreted["bottom-right-S80x33-empty-rows-gqa"]["empty_rows_max"] == 0.0
    assert interpreted["bottom-right-bfloat16"]["empty_rows_max"] == 0.0
    assert interpreted["window-S56x24-w8-empty-rows"]["empty_rows_max"] == 0.0  # rows 0-31 see no key
    assert interpreted["none-S64"]["empty_rows_max"] is None


def test_keys_that_no_row_sees_are_never_read(interpreted):
    unseen = {name: result for name, result in interpreted.items() if result.get("unseen_keys")}
    assert {"causal-top-left-S48x80", "padding-B3-S37x70-gqa", "padding-B2-bfloat16", "window-S24x56-w16"} <= set(
        unseen
    )
    assert [name for name, result in unseen.items() if not result["unchanged_by_nan"]] == []


def test_a_paged_cache_is_gathered_from_the_pages(interpreted):
    assert interpreted["paged-decode-S4x64-page16-gqa"]["reads_pages"] is True


def test_attnbench_run_checks_forward_and_backward_on_cpu(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "run"
    # float32: its CPU ceilings are the ones the other CLI tests measure (float16's take minutes on CPU)
    args = [
        "run",
        "--impl",
        "fused_triton",
        "--device",
        "cpu",
        "--batch",
        "2",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--seq",
        "48",
        "--seq-kv",
        "40",
        "--head-dim",
        "50",
        "--mask",
        "causal_bottom_right,padding",
        "--pass",
        "fwd,bwd",
        "--budget-s",
        "0.05",
        "--threads",
        "1",
        "--no-memory",
        "--out",
        str(out),
    ]
    result = run_subprocess(*attnbench_cmd(*args), env=INTERPRETER)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = pd.read_parquet(out / "results.parquet")
    assert len(rows) == 4 and set(rows.impl) == {"fused_triton"}
    fwd, bwd = rows[rows["pass"] == "fwd"], rows[rows["pass"] == "bwd"]
    assert fwd.status.isin(CHECKED).all() and (fwd.max_abs_err <= fwd.atol).all(), fwd[["status", "reason"]]
    assert bwd.status.isin(CHECKED).all() and (bwd.grad_err <= bwd.grad_tol).all(), bwd[["status", "reason"]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter is switched on")
def test_without_cuda_or_interpreter_it_is_unavailable_with_the_reason():
    pytest.importorskip("triton")
    assert contender.availability() == NEEDS_CUDA
    assert "TRITON_INTERPRET=1" in NEEDS_CUDA
    cpu = Workload(1, 2, 2, 64, 64, 32, device="cpu")
    assert contender.unsupported_reason(cpu) == "device cpu not supported (supports cuda)"


def test_a_missing_triton_is_an_unavailable_reason(monkeypatch):
    """The package imports its kernels once, at its own import: a copy of it imported without Triton says so.
    Every submodule is imported afresh for it (one already imported would hide a module-level import of one
    that needs Triton: `decode`'s once made the entry point fail to load instead)."""
    import importlib.util

    import attnbench.impls.fused_triton

    package = attnbench.impls.fused_triton.__name__
    for name in [name for name in sys.modules if name.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
        monkeypatch.delattr(attnbench.impls.fused_triton, name.rpartition(".")[2], raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now fails as if it weren't installed
    spec = importlib.util.find_spec("attnbench.impls.fused_triton")
    assert spec is not None and spec.loader is not None
    without = importlib.util.module_from_spec(spec)  # a second copy, not put in sys.modules
    spec.loader.exec_module(without)
    assert without.contender.availability() == (
        "triton is not installed or failed to import "
        "(ModuleNotFoundError: import of triton halted; None in sys.modules)"
    )


def test_declared_capabilities():
    caps = contender.capabilities
    assert caps.devices == {"cuda"} and caps.dtypes == {"float16", "bfloat16", "float32"}
    assert (caps.min_head_dim, caps.max_head_dim, caps.gqa, caps.cross, caps.backward) == (16, 256, True, True, True)
    assert caps.masks == set(MASKS) and caps.score_mods == {"none", "softcap", "alibi"} and caps.paged == "native"
    assert caps.features == {"head_dim_v", "sinks", "lengths", "kv_dtype", "q_dtype", "kv_layout", "shared_prefix"}
    assert "paged caches read in place" in contender.description
    assert contender.interpreter_capabilities.devices == {"cpu", "cuda"}
    too_wide = Workload(1, 2, 2, 64, 64, 300, device="cuda")
    assert caps.unsupported_reason(too_wide) == "head_dim 300 outside [16, 256]"


def test_in_the_interpreter_cpu_is_supported_and_its_time_is_priced_by_steps(monkeypatch):
    pytest.importorskip("triton")
    from attnbench.impls import fused_triton

    monkeypatch.setattr(fused_triton, "_interpreted", lambda: True)
    cpu = Workload(1, 2, 2, 64, 40, 32, device="cpu", mask="causal_bottom_right")
    assert contender.unsupported_reason(cpu) is None
    bwd = Workload(1, 2, 2, 64, 40, 32, device="cpu", mask="causal_bottom_right", pass_="fwd_bwd")
    assert contender.unsupported_reason(bwd) is None
    # 32-row tiles, 16-key blocks: rows 0-31 see at most keys < 8 (1 block), rows 32-63 all 40 (3 blocks)
    tiles, blocks = 2, 1 + 3
    expected = 2 * (
        tiles * fused_triton.INTERPRETER_SECONDS_PER_TILE + blocks * fused_triton.INTERPRETER_SECONDS_PER_BLOCK
    )
    assert contender.predicted_seconds(cpu, 1e12, 1e11) == pytest.approx(expected)
    assert contender.predicted_seconds(bwd, 1e12, 1e11) == pytest.approx(expected * (1 + fused_triton.BACKWARD_STEPS))
    # a window of 8 keys, Sq 64 = Sk: rows 0-31 see keys 0-31 (2 blocks); rows 32-63 keys 25-63 (blocks 1-3: 3)
    window = Workload(1, 2, 2, 64, 64, 32, device="cpu", mask="sliding_window", window=8)
    expected = 2 * (
        2 * fused_triton.INTERPRETER_SECONDS_PER_TILE + (2 + 3) * fused_triton.INTERPRETER_SECONDS_PER_BLOCK
    )
    assert contender.predicted_seconds(window, 1e12, 1e11) == pytest.approx(expected)
    # 3 documents of S 64 (B 2): each tile starts at its first row's document start
    docs = Workload(2, 2, 2, 64, 64, 32, device="cpu", mask="document", documents=3)
    starts = [0, *itertools.accumulate(document_lengths(64, 3))]
    first = [max(s for s in starts if s <= row) // 16 for row in (0, 32)]
    blocks = 2 * ((2 - first[0]) + (4 - first[1]))
    expected = 2 * (4 * fused_triton.INTERPRETER_SECONDS_PER_TILE + blocks * fused_triton.INTERPRETER_SECONDS_PER_BLOCK)
    assert contender.predicted_seconds(docs, 1e12, 1e11) == pytest.approx(expected)


def test_padding_without_lengths_is_refused_before_launch():
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton.flash import flash_attention

    q = torch.randn(2, 2, 16, 16)
    with pytest.raises(ValueError, match="mask 'padding' needs lengths"):
        flash_attention(q, q, q, scale=0.25, mask="padding")
