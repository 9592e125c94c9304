"""fused_triton's kernel-level sliding windows, documents, softcap and ALiBi, against a float64 formula.

The harness's Workload does not carry these yet, so they are checked through the attention function's
keyword arguments (``flash_attention(q, k, v, window=…, document_ids=…, cu_seqlens=…, softcap=…,
alibi=…)``), forward and backward, in one TRITON_INTERPRET=1 process. The float64 formula is written here
from the definitions:

* window W: key j visible to row i iff i + (Sk − Sq) − W < j ≤ i + (Sk − Sq);
* documents: same document and j ≤ i;
* softcap c: scores ← c·tanh(scores/c), before the mask;
* ALiBi: score += −slope_h·|i + (Sk − Sq) − j|, slope_h = 2^(−8(h+1)/H);
* a row that sees no key gives zeros.

The forward also reports how many key blocks each row tile visits: with a window they must be exactly the
blocks between the tile's first and last visible key (the others are skipped), so the work grows with W,
not with S.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from attnbench.workload.check import GRAD_TOLERANCES, TOLERANCES

from conftest import run_subprocess

_SCRIPT = """
import json, sys
import torch
from attnbench.impls.fused_triton.flash import flash_attention, forward, make_plan

def visible_mask(Sq, Sk, B, window=None, documents=None):  # (B, 1, Sq, Sk) bool, from the definitions
    i, j = torch.arange(Sq).view(Sq, 1), torch.arange(Sk).view(1, Sk)
    mask = torch.ones(B, 1, Sq, Sk, dtype=torch.bool)
    if window is not None:
        mask &= ((i + Sk - Sq - window < j) & (j <= i + Sk - Sq)).view(1, 1, Sq, Sk)
    if documents is not None:  # (B, S) ids
        same = documents.view(B, Sq, 1) == documents.view(B, 1, Sk)
        mask &= (same & (j <= i)).view(B, 1, Sq, Sk)
    return mask

def reference(q, k, v, scale, visible, softcap=None, alibi=False):
    B, H, Sq, D = q.shape
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi:
        Sk = k.shape[2]
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
        distance = (torch.arange(Sq).view(Sq, 1) + Sk - Sq - torch.arange(Sk).view(1, Sk)).abs()
        s = s - slopes.view(1, H, 1, 1) * distance
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0)
    return p @ v

results = {}
for name, case in json.loads(sys.argv[1]).items():
    B, H, Hkv, Sq, Sk, D = case["shape"]
    dtype = getattr(torch, case.get("dtype", "float32"))
    g = torch.Generator().manual_seed(len(name))
    shapes = ((H, Sq), (Hkv, Sk), (Hkv, Sk), (H, Sq))
    q, k, v, grad_out = (torch.randn(B, h, s, D, generator=g).to(dtype) for h, s in shapes)
    options = dict(case.get("options", {}))
    documents = None
    if "document_ids" in options:
        documents = torch.tensor(options["document_ids"])
        options["document_ids"] = documents
    if "cu_seqlens" in options:
        offsets = torch.tensor(options["cu_seqlens"])
        options["cu_seqlens"] = offsets
        documents = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff()).expand(B, Sq)
    mask = options.get("mask", "none")
    visible = visible_mask(Sq, Sk, B, options.get("window"), documents)
    if mask == "causal_bottom_right":
        visible &= visible_mask(Sq, Sk, B, window=Sk + Sq)
    if mask == "causal":
        visible &= torch.ones(Sq, Sk, dtype=torch.bool).tril()
    scale = D ** -0.5
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, **options)
    grads = torch.autograd.grad(out, leaves, grad_out)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64, scale, visible, options.get("softcap"), options.get("alibi", False))
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out.double())
    result = {
        "out_err": float((out.double() - ref).abs().max()),
        "grad_err": max(float((a.double() - b).abs().max() / b.abs().max()) for a, b in zip(grads, ref_grads)),
        "empty_rows": int((~visible.any(-1)).sum()),
    }
    if case.get("count_blocks"):  # key blocks visited per row tile, against the blocks the mask touches
        plan = make_plan(q, k, v, **options)
        block_m, block_n = plan.candidates("fwd")[0].block_m, plan.candidates("fwd")[0].block_n
        tiles = -(-Sq // block_m)
        counted = torch.zeros(B * H, tiles, 2, dtype=torch.int32)
        forward(q, k, v, plan, visited=counted)
        expected = []
        for t in range(tiles):
            rows = visible[0, 0, t * block_m:(t + 1) * block_m]  # (rows, Sk)
            keys = rows.any(0).nonzero().flatten()
            blocks = 0 if len(keys) == 0 else int(keys[-1]) // block_n - int(keys[0]) // block_n + 1
            expected.append(blocks)
        result["visited"] = counted[0, :, 0].tolist()
        result["expected_visited"] = expected
        result["unmasked"] = counted[0, :, 1].tolist()
        result["blocks_without_window"] = [-(-min(Sk, (t + 1) * block_m + Sk - Sq) // block_n) for t in range(tiles)]
    results[name] = result
print(json.dumps(results))
"""

DOCS_B2 = [[0] * 10 + [1] * 35 + [2] * 25, [5] * 40 + [7] * 30]
CASES: dict[str, dict[str, Any]] = {
    "window-20-S160": {"shape": [1, 2, 2, 160, 160, 32], "options": {"window": 20}, "count_blocks": True},
    "window-24-S40x70-gqa-D50": {"shape": [1, 4, 2, 40, 70, 50], "options": {"window": 24}},
    "window-8-S60x30-empty-rows": {"shape": [1, 2, 1, 60, 30, 32], "options": {"window": 8}},
    "documents-ids-B2-mqa": {
        "shape": [2, 4, 1, 70, 70, 32],
        "options": {"document_ids": DOCS_B2},
        "count_blocks": True,
    },
    "documents-cu-seqlens-float16": {
        "shape": [1, 2, 2, 64, 64, 64],
        "dtype": "float16",
        "options": {"cu_seqlens": [0, 17, 50, 64]},
    },
    "softcap-causal": {"shape": [1, 2, 2, 48, 48, 32], "options": {"softcap": 2.0, "mask": "causal"}},
    "alibi-bottom-right-gqa": {
        "shape": [1, 4, 2, 40, 56, 32],
        "options": {"alibi": True, "mask": "causal_bottom_right"},
    },
    "softcap-alibi-window-bfloat16": {
        "shape": [1, 4, 2, 48, 48, 32],
        "dtype": "bfloat16",
        "options": {"softcap": 3.0, "alibi": True, "window": 16},
    },
}


@pytest.fixture(scope="module")
def formula_checks() -> dict[str, dict[str, Any]]:  # one process, one core: not SPLIT_FIXTURE
    pytest.importorskip("triton")
    result = run_subprocess(sys.executable, "-c", _SCRIPT, json.dumps(CASES), env={"TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    checked: dict[str, dict[str, Any]] = json.loads(result.stdout.strip().splitlines()[-1])
    return checked


@pytest.mark.parametrize("name", list(CASES))
def test_output_and_gradients_match_the_float64_formula(formula_checks, name):
    dtype, result = CASES[name].get("dtype", "float32"), formula_checks[name]
    assert result["out_err"] <= TOLERANCES[dtype][0]
    assert result["grad_err"] <= GRAD_TOLERANCES[dtype]


def test_rows_before_a_window_reaches_the_keys_are_empty(formula_checks):
    # Sq 60 > Sk 30 bottom-right: rows 0-29 see no key (and give zeros, checked against the formula)
    assert formula_checks["window-8-S60x30-empty-rows"]["empty_rows"] == 30


def test_a_window_visits_only_the_blocks_it_touches(formula_checks):
    counts = formula_checks["window-20-S160"]
    assert counts["visited"] == counts["expected_visited"]
    # 32-row tiles, 16-key blocks, W 20: 2 blocks for the first tile, then 4 per tile, whatever S; causal
    # without the window would visit 2, 4, 6, 8, 10
    assert counts["visited"] == [2, 4, 4, 4, 4]
    assert counts["blocks_without_window"] == [2, 4, 6, 8, 10]
    assert counts["unmasked"] == [0, 0, 0, 0, 0]  # every row's window edge cuts each block at W 20


def test_documents_visit_only_their_own_blocks(formula_checks):
    # batch 0's documents [0, 10), [10, 45), [45, 70): the last tile (rows 64-69) starts at key 45's block
    counts = formula_checks["documents-ids-B2-mqa"]
    assert counts["visited"] == counts["expected_visited"] == [2, 4, 3]
    assert counts["blocks_without_window"] == [2, 4, 5]  # causal alone


def test_bad_options_are_refused_before_launch():
    pytest.importorskip("triton")
    import torch

    from attnbench.impls.fused_triton.flash import flash_attention

    q = torch.randn(1, 2, 16, 16)
    for options, message in (
        ({"window": 0}, "window must be ≥ 1"),
        ({"window": 4, "mask": "causal"}, "window must be ≥ 1 with mask none or causal_bottom_right"),
        ({"softcap": -1.0}, "softcap must be > 0"),
        ({"cu_seqlens": torch.tensor([0, 5, 12])}, "cu_seqlens must rise from 0 to the sequence length 16"),
        ({"document_ids": torch.tensor([[0] * 4 + [1] * 4 + [0] * 8])}, "each document must be one run"),
        ({"document_ids": torch.zeros(2, 16)}, r"document_ids must have shape \(1, 16\)"),
    ):
        with pytest.raises(ValueError, match=message):
            flash_attention(q, q, q, **options)
