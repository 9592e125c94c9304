"""fused_triton's decode kernels (issue 33): split-KV, the GQA group in one tile, pages read in place.

A forward of at most 8 query rows per sequence runs ``decode_kernels`` (split kernel + merge). In Triton's
CPU interpreter (one process per core) every case goes through the harness's gate against float64
(``prepare_checked``) with odd shapes (head dims 40 and 72, lengths no multiple of the 16-key block, GQA 4
and 8, partial last pages), and the cases show what the kernels promise:

* the keys are split (more than one split, merged by log-sum-exp, sinks joining once);
* every mask and modifier through the per-row key ranges (windows, chunks, documents, ragged and mixed
  batches, ALiBi, softcap), speculative decoding's Sq 2–8;
* a paged cache is read in place: the contiguous k and v filled with NaN after ``prepare`` change nothing,
  and the harness does not gather (``reads_pages``); bf16 and fp8 pools with per-page scales;
* fp8 and bf16 caches in their stored type (one scale per sequence read once, fp16 dots under a bf16 q);
* MLA's 576/512 latent cache split 512 + 64 with the values from the key tile (its decode cases, a paged fp8
  one among them, are in tests/test_fused_triton_features.py, which runs them through these kernels);
* a shared prefix read once for the batch: a ``PREFIX`` launch over the prefix's one copy whose programs hold
  the rows of several sequences, NaN in the other sequences' copies changing nothing.

Host-side rules (split sizing, the row ranges against the harness's ``key_ranges``, tile candidates, which
workloads read pages) are checked directly, and the kernels are compiled for sm_90 in
tests/test_fused_triton_compile.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from attnbench.workload import Workload
from attnbench.workload.check import TOLERANCES

from conftest import run_cases_split

INTERPRETER = {"TRITON_INTERPRET": "1"}

_CHECK = """
import json, sys
import torch
from attnbench.impls.fused_triton import contender, decode_kernels
from attnbench.workload.inputs import AttentionInputs, make_inputs
from attnbench.runner.cases import prepare_checked
from attnbench.workload import Workload

launches = []

class Recorded:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            flags = ("PAGED", "KV_SCALED", "SCALE_ONCE", "FP16_DOTS", "PREFIX", "SPLIT_D", "V_FROM_K", "KEYS_MAJOR")
            launches.append({"grid": list(grid), **{flag: kwargs[flag] for flag in flags}})
            return self.kernel[grid](*args, **kwargs)
        return launch

decode_kernels._decode_split_kernel = Recorded(decode_kernels._decode_split_kernel)

results = {}
for name, spec in json.loads(sys.argv[1]).items():
    w = Workload(**spec)
    launches.clear()
    prepared = prepare_checked("fused_triton", w)
    result = {"ok": prepared.ok, "max_abs_err": prepared.check.max_abs_err, "reason": prepared.reason,
              "launches": list(launches), "reads_pages": contender.reads_pages(w)}
    inputs = make_inputs(w)
    run = contender.prepare(inputs, w)
    out = run()
    result["splits"] = run.plan.splits
    if w.page_size:  # the pool is read, not the contiguous k and v: NaN there changes nothing
        inputs.k.fill_(float("nan"))
        if w.kv_layout != "latent":
            inputs.v.fill_(float("nan"))
        result["contiguous_unread"] = torch.equal(run(), out)
    if w.shared_prefix:  # only sequence 0's copy of the prefix is read
        P = w.shared_prefix
        k, v = inputs.k.detach().clone(), inputs.v.detach().clone()
        k[1:, :, :P], v[1:, :, :P] = float("nan"), float("nan")
        others = AttentionInputs(w, inputs.q, k, v, inputs.grad_out)
        result["other_prefixes_unread"] = torch.equal(contender.prepare(others, w)(), out)
    results[name] = result
print(json.dumps(results))
"""


def _case(**spec: Any) -> dict[str, Any]:
    base = {
        "batch": 3,
        "heads": 8,
        "kv_heads": 2,
        "seq_q": 1,
        "seq_k": 150,
        "head_dim": 40,
        "dtype": "float32",
        "mask": "causal_bottom_right",
    }
    return {**base, "device": "cpu", **spec}


CASES: dict[str, dict[str, Any]] = {
    "gqa4-bf16-D72": _case(head_dim=72, dtype="bfloat16", seq_k=300),
    "mqa8-spec8-sinks": _case(kv_heads=1, seq_q=8, seq_k=200, sinks="learned"),
    "padding-float16": _case(mask="padding", dtype="float16", kv_heads=8),
    "window-alibi-spec3": _case(seq_q=3, seq_k=170, mask="sliding_window", window=40, score_mod="alibi"),
    "softcap-dv72": _case(head_dim_v=72, score_mod="softcap", softcap=2.0, mask="none"),
    "chunked-spec4": _case(seq_q=4, mask="chunked", chunk=32),
    "ragged-uniform-spec4": _case(seq_q=4, seq_k=120, lengths="uniform"),
    "mixed-spec6": _case(seq_q=6, seq_k=100, mask="mixed", decode_share=0.5),
    "document-8": _case(seq_q=8, seq_k=8, mask="document", documents=2, batch=2),
    "paged16-bf16-partial-page": _case(seq_k=100, dtype="bfloat16", page_size=16),
    "paged64-e4m3-sinks": _case(dtype="bfloat16", kv_dtype="float8_e4m3fn", page_size=64, sinks="learned"),
    "paged16-e5m2-spec4-float16": _case(seq_q=4, dtype="float16", kv_dtype="float8_e5m2", page_size=16),
    "kv-e4m3-bf16q": _case(dtype="bfloat16", kv_dtype="float8_e4m3fn", seq_k=200),
    "kv-bf16-float32q-ragged": _case(kv_dtype="bfloat16", lengths="longtail"),
    "prefix-40": _case(seq_k=130, shared_prefix=40),
    "prefix-30-spec4-sinks-alibi": _case(seq_q=4, seq_k=110, shared_prefix=30, sinks="learned", score_mod="alibi"),
}
PAGED = [name for name, spec in CASES.items() if spec.get("page_size")]
PREFIXES = [name for name, spec in CASES.items() if spec.get("shared_prefix")]


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    pytest.importorskip("triton")
    return run_cases_split(_CHECK, CASES, INTERPRETER, "")


@pytest.mark.parametrize("name", list(CASES))
def test_decode_matches_the_float64_reference(interpreted, name):
    result = interpreted[name]
    assert result["ok"], result["reason"]
    assert result["max_abs_err"] <= TOLERANCES[CASES[name]["dtype"]][0]
    assert result["launches"], "the decode kernels did not run"


def test_the_keys_are_split_and_merged(interpreted):
    from attnbench.impls.fused_triton.decode import INTERPRETER_MIN_SPLIT_KEYS, INTERPRETER_SMS, split_count

    split = 0
    for name, result in interpreted.items():
        spec = CASES[name]
        if spec.get("shared_prefix"):
            continue
        rows = spec["heads"] // spec["kv_heads"] * spec["seq_q"]
        programs = spec["batch"] * spec["kv_heads"] * -(-rows // 16)
        expected = split_count(programs, spec["seq_k"], 16, INTERPRETER_SMS, INTERPRETER_MIN_SPLIT_KEYS)[0]
        assert result["splits"] == expected == result["launches"][0]["grid"][1], name
        split += expected > 1
    assert split >= 10  # most cases merge several splits


def test_a_paged_cache_is_read_in_place(interpreted):
    for name in PAGED:
        result = interpreted[name]
        assert result["reads_pages"] and result["contiguous_unread"], name
        assert result["launches"][0]["PAGED"], name
    assert interpreted["paged64-e4m3-sinks"]["launches"][0]["KV_SCALED"]
    assert not interpreted["paged64-e4m3-sinks"]["launches"][0]["SCALE_ONCE"]  # per-page scales, per key


def test_narrow_caches_take_their_specialisations(interpreted):
    flags = interpreted["kv-e4m3-bf16q"]["launches"][0]
    assert flags["KV_SCALED"] and flags["SCALE_ONCE"] and flags["FP16_DOTS"]  # one scale per sequence, fp16 dots
    flags = interpreted["kv-bf16-float32q-ragged"]["launches"][0]
    assert not flags["KV_SCALED"] and not flags["FP16_DOTS"]
    # every cache here rows-major, the narrow ones included (keys-major measured slower over an fp8 cache): only
    # MLA's unconverted latent cache runs keys-major (tests/test_fused_triton_features.py)
    for name, result in interpreted.items():
        assert not any(flags["KEYS_MAJOR"] for flags in result["launches"]), name
    # MLA's 576/512 decode (SPLIT_D, V_FROM_K; bf16 and a paged fp8 cache): tests/test_fused_triton_features.py


def test_a_shared_prefix_is_read_once_for_the_batch(interpreted):
    for name in PREFIXES:
        result, spec = interpreted[name], CASES[name]
        assert result["other_prefixes_unread"], name
        prefix, suffix = result["launches"][:2]
        assert prefix["PREFIX"] and not suffix["PREFIX"], name
        # the prefix's programs: one per kv head and 16-row block of the rows of every sequence
        rows = spec["batch"] * spec["heads"] // spec["kv_heads"] * spec["seq_q"]
        assert prefix["grid"][0] == spec["kv_heads"] * -(-rows // 16), name
        assert result["splits"] == prefix["grid"][1] + suffix["grid"][1], name


# Host-side rules, no kernel launched


def test_split_count_fills_the_gpu_with_whole_key_blocks():
    from attnbench.impls.fused_triton.decode import WAVES, split_count

    splits, per_split = split_count(64, 32768, 64, 132, 256)  # B8 × Hkv8 programs on an H100's 132 SMs
    assert splits * 64 >= WAVES * 132 and per_split % 64 == 0 and (splits - 1) * per_split < 32768
    assert split_count(64, 300, 64, 132, 256) == (1, 320)  # too short to split past 256 keys
    assert split_count(4096, 8192, 32, 132, 256) == (1, 8192)  # the batch fills the GPU on its own
    splits, per_split = split_count(2, 1000, 16, 2, 32)
    assert splits == 4 and per_split == 256
    # MLA's B8 × 2 row blocks: one wave is 9 splits of 960 keys (8192 / 9 → 911 → 15 blocks of 64), four waves 32 of 256
    assert split_count(16, 8192, 64, 132, 256, waves=1) == (9, 960)
    assert split_count(16, 8192, 64, 132, 256, waves=4) == (32, 256)


@pytest.mark.parametrize(
    "spec",
    [
        {"mask": "causal_bottom_right", "seq_q": 4},
        {"mask": "padding", "seq_q": 2},
        {"mask": "sliding_window", "window": 20, "seq_q": 3},
        {"mask": "chunked", "chunk": 16, "seq_q": 5},
        {"mask": "causal_bottom_right", "lengths": "uniform", "seq_q": 4},
        {"mask": "document", "documents": 2, "seq_q": 8, "seq_k": 8},
        {"mask": "causal", "seq_q": 6},
    ],
)
def test_row_bounds_are_the_harness_key_ranges(spec):
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton import flash, plan_options
    from attnbench.workload.inputs import make_inputs
    from attnbench.workload.masks import key_ranges

    w = Workload(**{"batch": 3, "heads": 4, "kv_heads": 2, "seq_k": 60, "head_dim": 16, "device": "cpu", **spec})
    inputs = make_inputs(w)
    plan = flash.make_plan(inputs.q, inputs.k, inputs.v, **plan_options(inputs, w))
    lo, hi = plan.decode_bounds
    want_lo, want_hi = (t.expand(w.batch, -1) for t in key_ranges(w))
    seen = want_lo < want_hi
    got_lo, got_hi = lo.expand(w.batch, -1).long(), hi.expand(w.batch, -1).long()
    assert torch.equal(torch.where(seen, got_lo, 0), torch.where(seen, want_lo, 0))
    assert torch.equal(torch.where(seen, got_hi, 0), torch.where(seen, want_hi, 0))
    assert bool((got_lo[~seen] >= got_hi[~seen]).all())  # rows that see nothing: empty ranges


def test_decode_tiles_fit_the_device_and_take_the_group_rows():
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton import decode, flash
    from attnbench.impls.fused_triton.tiles import Tile, shared_bytes

    q, k = torch.empty(2, 32, 1, 128, dtype=torch.bfloat16), torch.empty(2, 8, 64, 128, dtype=torch.bfloat16)
    plan = flash.make_plan(q, k, k)
    tiles = decode.candidates(plan, interpreted=False)
    assert {t.block_m for t in tiles} == {16} and tiles  # a kv head's 4 rows: 16, tl.dot's least
    assert {(t.block_n, t.num_warps, t.num_stages) for t in tiles} <= set(decode.DECODE_TILES)
    kernels = {dataclasses.replace(t, waves=0) for t in tiles}  # each compiled tile at every tuned split count
    assert {t.waves for t in tiles} == set(decode.WAVE_CHOICES)
    assert len(tiles) == len(kernels) * len(decode.WAVE_CHOICES)
    assert all(shared_bytes("fwd", t, 128, 2) <= decode.max_shared_memory(q.device) for t in tiles)
    prefix = flash.make_plan(q, k, k, shared_prefix=32)  # the prefix level's 2 × 4 rows: no taller tile
    assert {t.block_m for t in decode.candidates(prefix, interpreted=False)} == {16}
    many = torch.empty(16, 32, 1, 128, dtype=torch.bfloat16)
    prefix = flash.make_plan(many, *(torch.empty(16, 8, 64, 128, dtype=torch.bfloat16),) * 2, shared_prefix=32)
    assert {t.block_m for t in decode.candidates(prefix, interpreted=False)} == {16, 64}
    wide = flash.make_plan(
        torch.empty(2, 128, 1, 576, dtype=torch.bfloat16), *(torch.empty(2, 1, 64, 576, dtype=torch.bfloat16),) * 2
    )
    wide_tiles = decode.candidates(wide, interpreted=False)
    assert {t.block_m for t in wide_tiles} <= {16, 32, 64}
    halves = {dataclasses.replace(t, waves=0) for t in wide_tiles if t.parts == 2}  # MLA's value halves too
    assert halves and halves <= {Tile(*spec, parts=2) for spec in decode.HALF_TILES}  # those in 160 KiB here
    spec8 = flash.make_plan(torch.empty(2, 32, 8, 128), torch.empty(2, 8, 64, 128), torch.empty(2, 8, 64, 128))
    assert decode.row_block(spec8) == 32 and spec8.decode
    assert not flash.make_plan(torch.empty(2, 4, 9, 16), torch.empty(2, 4, 9, 16), torch.empty(2, 4, 9, 16)).decode


def test_which_workloads_read_pages_and_what_they_keep():
    from attnbench.impls.fused_triton import contender

    base = {
        "batch": 8,
        "heads": 32,
        "kv_heads": 8,
        "seq_k": 4096,
        "head_dim": 128,
        "device": "cuda",
        "dtype": "bfloat16",
        "mask": "causal_bottom_right",
        "page_size": 16,
    }
    assert contender.reads_pages(Workload(**base, seq_q=1))
    assert contender.reads_pages(Workload(**base, seq_q=8))
    assert not contender.reads_pages(Workload(**base, seq_q=9))  # prefill-sized: the harness gathers
    assert contender.capabilities.paged == "native"
    # the partials: at most one split per 256 keys, each B·Hq·Sq rows of Dv + 1 floats
    w = Workload(**{**base, "page_size": 0}, seq_q=1)
    assert 0 < contender.predicted_extra_bytes(w) <= 4.0 * (4096 // 256) * 8 * 32 * (128 + 1)


def test_paged_plans_are_refused_where_the_decode_kernels_do_not_run():
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton.flash import make_plan

    q, k = torch.randn(2, 4, 16, 16), torch.randn(2, 2, 32, 16)
    with pytest.raises(ValueError, match="read by the decode kernels"):
        make_plan(q, k, k, page_size=16)
    with pytest.raises(ValueError, match="shared_prefix with a paged cache"):
        make_plan(q[:, :, :1], k, k, page_size=16, shared_prefix=8)
