"""fused_triton on the newest workloads (issue 23), in Triton's CPU interpreter against float64.

Each case goes through the harness's own gates (``prepare_checked``: the output on every row, and for
bwd / fwd_bwd the gradients of q, k, v — and of the sink logits with learned sinks) in one
TRITON_INTERPRET=1 process. Shapes are odd on purpose: head dims 40 and 72 with Dv ≠ D, lengths that are
no multiple of the interpreter's tiles (forward and dQ 32 rows × 16 keys, dK/dV 16 × 32), GQA 4/2 and 4/1,
batch 3. What the cases add to the gate:

* value head dim Dv ≠ D, forward and backward (v, O, dO, dV Dv wide);
* learned sinks, forward and backward, each gradient's error on its own (dsinks among them), also for
  rows that see no key (their output stays zero while the sink's log-sum-exp is finite);
* the chunked and mixed masks and ragged ``lengths`` as per-row key ranges: rows past a sequence's query
  length are exactly zero, keys past its length are never read (NaN there changes nothing), and each row
  tile visits exactly the key blocks its rows' ranges touch;
* a KV cache stored as bf16 or fp8 (e4m3, e5m2, with float32 scales per sequence or per page), read in its
  stored type by the kernel (no dequantized copy: the plan holds the fp8 tensors);
* MLA's latent cache: v the view of k's first Dv channels, read through k's pointer (the key tile itself
  when as wide); 576 / 512 with the head dim split 512 + 64 (forward); narrower latent caches also backward;
* a shared prefix (cascade, forward): one prefix-kernel program per kv head holds rows of every sequence
  (its grid is recorded) and reads only the prefix's one copy (NaN in the other sequences' copies changes
  nothing), and the forward kernel continues each row from that state (``MERGE``).

Each forward launch's specialisation flags are recorded, so each case is known to take its feature's path.

The sm_90 compiles at the end check that the new specialisations (fp8 loads, Dv ≠ D, sinks, range
tables) also compile for a GPU, which this machine does not have.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnbench.impls.fused_triton import (
    SHARED_PREFIX_BACKWARD,
    SHARED_PREFIX_FP8,
    WIDE_LATENT_BACKWARD,
    contender,
)
from attnbench.workload import Workload
from attnbench.workload.check import GRAD_TOLERANCES, TOLERANCES

from conftest import run_cases_split

INTERPRETER = {"TRITON_INTERPRET": "1"}

_CHECK = """
import json, sys
import torch
from attnbench.workload.check import check_output
from attnbench.impls.fused_triton import contender
from attnbench.impls.fused_triton.flash import INTERPRETER_TILES, forward
from attnbench.workload.inputs import AttentionInputs, make_inputs
from attnbench.workload.masks import key_ranges
from attnbench.workload.reference import reference_grads
from attnbench.runner.cases import prepare_checked
from attnbench.workload import Workload

def grad_errors(w, prepared):  # each gradient's error relative to its own scale, as check_grads measures it
    inputs = make_inputs(w, requires_grad=True)  # the same seeded data as the prepared case
    names = ("dq", "dk", "dv", "dsinks")
    expected = reference_grads(inputs)
    got = prepared.fn()
    return {n: float((g.double() - e).abs().max() / e.abs().max()) for n, g, e in zip(names, got, expected)}

def visited_blocks(w, run, inputs):  # per (batch, row tile): key blocks visited, and the blocks the rows touch
    plan, tile = run.plan, INTERPRETER_TILES["fwd"]
    tiles = -(-w.seq_q // tile.block_m)
    counted = torch.zeros(w.batch * w.heads, tiles, 2, dtype=torch.int32)
    forward(inputs.q, inputs.k, inputs.v, plan, visited=counted, sinks=inputs.sinks)
    lo, hi = (t.expand(w.batch, -1) for t in key_ranges(w))
    expected = []
    for b in range(w.batch):
        for t in range(tiles):
            rows = slice(t * tile.block_m, (t + 1) * tile.block_m)
            seen = lo[b, rows] < hi[b, rows]
            if not bool(seen.any()):
                expected.append(0)
                continue
            first, last = int(lo[b, rows][seen].min()), int(hi[b, rows][seen].max()) - 1
            expected.append(last // tile.block_n - first // tile.block_n + 1)
    return counted[:: w.heads, :, 0].flatten().tolist(), expected

from attnbench.impls.fused_triton import decode_kernels, forward_kernels
launched = []  # the forward's (or the decode kernel's) specialisation flags, per launch
kernels_run = []  # which of the two, per launch

class Recorded:
    def __init__(self, kernel, name):
        self.kernel, self.name = kernel, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            flags = ("SPLIT_D", "V_FROM_K", "KV_SCALED", "RANGES", "SINKS", "MERGE", "PREFIX", "PAGED", "KEYS_MAJOR",
                     "VALUE_PARTS")
            launched.append({flag: kwargs[flag] for flag in flags if flag in kwargs})
            kernels_run.append(self.name)
            if kwargs.get("PREFIX"):  # the decode kernels' prefix level
                prefix_grids.append(list(grid))
            return self.kernel[grid](*args, **kwargs)
        return launch

forward_kernels._forward_kernel = Recorded(forward_kernels._forward_kernel, "fwd")
decode_kernels._decode_split_kernel = Recorded(decode_kernels._decode_split_kernel, "decode")
prefix_grids = []

class RecordedGrid:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        prefix_grids.append(list(grid))
        return self.kernel[grid]

forward_kernels._prefix_kernel = RecordedGrid(forward_kernels._prefix_kernel)

results = {}
for name, spec in json.loads(sys.argv[1]).items():
    w = Workload(**spec)
    launched.clear(), prefix_grids.clear(), kernels_run.clear()
    prepared = prepare_checked("fused_triton", w)
    result = {"ok": prepared.ok, "max_abs_err": prepared.check.max_abs_err, "reason": prepared.reason}
    result["flags"], result["kernel"] = launched[0], kernels_run[0]
    if w.pass_ != "fwd":
        result["grad_err"] = prepared.grad_check.grad_err
        result["grads"] = grad_errors(w, prepared)
    else:
        inputs = make_inputs(w)
        run = contender.prepare(inputs, w)
        out = run()
        result["plan_kv_dtype"] = str(run.plan.kv_dtype)
        result["scaled"] = run.plan.k_scale is not None
        empty = inputs.empty_rows
        result["empty_rows"] = 0 if empty is None else int(empty.sum())
        result["empty_rows_max"] = None if empty is None else float(out.masked_select(empty).abs().max())
        if inputs.bool_mask is not None and w.kv_dtype == w.dtype and not w.page_size:
            unseen = ~inputs.bool_mask.any(dim=2).unsqueeze(-1)  # (B|1, 1, Sk, 1): keys no row sees
            k, v = inputs.k.masked_fill(unseen, float("nan")), inputs.v.masked_fill(unseen, float("nan"))
            poisoned = AttentionInputs(w, inputs.q, k, v, inputs.grad_out)
            result["unseen_keys"] = int(unseen.sum())
            result["unchanged_by_nan"] = torch.equal(contender.prepare(poisoned, w)(), out)
        if w.mask in ("mixed", "chunked") or w.lengths != "equal":
            result["visited"], result["expected_visited"] = visited_blocks(w, run, inputs)
        if w.head_dim > 256:  # a split head dim: its value halves (a tile of parts 2) forced, against float64 too
            from attnbench.impls.fused_triton.tiles import Tile
            halves = contender.prepare(inputs, w)
            halves.plan.tiles["decode"] = Tile(16, 16, 1, 1, parts=2)
            launched.clear()
            check = check_output(inputs, halves())
            result["halves"] = {"ok": check.ok, "err": check.max_abs_err, "splits": halves.plan.splits,
                                "flags": list(launched)}
        if w.shared_prefix:  # only the one copy (sequence 0's) of the prefix is read: NaN in the others' is not
            result["prefix_grid"] = prefix_grids[0]
            P = w.shared_prefix
            k, v = inputs.k.detach().clone(), inputs.v.detach().clone()
            k[1:, :, :P], v[1:, :, :P] = float("nan"), float("nan")
            if w.kv_layout == "latent":
                v = k[..., : w.head_dim_v]
            others = AttentionInputs(w, inputs.q, k, v, inputs.grad_out)
            result["other_prefixes_unread"] = torch.equal(contender.prepare(others, w)(), out)
    results[name] = result

# gpu_smoke's forced-tile loop on tiny feature cases (Dv ≠ D, sinks, a mixed batch; a paged fp8 cache; a prefix)
from attnbench.impls.fused_triton.smoke import smoke
from attnbench.impls.fused_triton.tiles import Tile
tiny = [Workload(2, 4, 2, 20, 40, 40, head_dim_v=24, mask="mixed", decode_share=0.5, sinks="learned",
                 pass_="fwd_bwd"),
        Workload(1, 2, 1, 4, 40, 24, kv_dtype="float8_e4m3fn", page_size=16, mask="causal_bottom_right"),
        Workload(2, 2, 1, 3, 40, 24, mask="causal_bottom_right", shared_prefix=17)]
forced = {"fwd": [Tile(16, 32, 1, 1)], "dkdv": [Tile(32, 16, 1, 1)], "dq": [Tile(16, 16, 1, 1)]}
import contextlib, io
printed = io.StringIO()
if sys.argv[2:] == ["tail"]:
    with contextlib.redirect_stdout(printed):
        failures = smoke("cpu", cases=tiny, tiles=forced)
    results["smoke"] = {"failures": failures, "lines": printed.getvalue().splitlines()}
print(json.dumps(results))
"""


def _case(**spec: Any) -> dict[str, Any]:
    base = {"batch": 3, "heads": 4, "kv_heads": 2, "seq_q": 37, "seq_k": 45, "head_dim": 40, "dtype": "float32"}
    return {**base, "device": "cpu", **spec}


LATENT = {"kv_heads": 1, "kv_layout": "latent"}
CASES: dict[str, dict[str, Any]] = {
    # 1. value head dim
    "dv72-bottom-right-bwd": _case(head_dim_v=72, mask="causal_bottom_right", pass_="fwd_bwd"),
    "d72-dv40-mqa-float16-bwd": _case(
        batch=1, kv_heads=1, seq_q=40, seq_k=24, head_dim=72, head_dim_v=40, dtype="float16", pass_="bwd"
    ),
    # 2. learned sinks (with Dv ≠ D; with a window whose first 26 rows see no key; bf16 with softcap)
    "sinks-dv72-causal-bwd": _case(head_dim_v=72, mask="causal", sinks="learned", pass_="fwd_bwd"),
    "sinks-window-empty-rows-bwd": _case(
        seq_q=50, seq_k=24, mask="sliding_window", window=8, sinks="learned", pass_="fwd_bwd"
    ),
    "sinks-window-empty-rows": _case(seq_q=50, seq_k=24, mask="sliding_window", window=8, sinks="learned"),
    "sinks-softcap-bfloat16-bwd": _case(
        batch=1, head_dim=72, score_mod="softcap", softcap=2.0, sinks="learned", dtype="bfloat16", pass_="fwd_bwd"
    ),
    # 3. chunked, mixed, ragged lengths (per-row key ranges)
    "chunked-6-D72": _case(head_dim=72, mask="chunked", chunk=6),
    "chunked-8-S50x30-empty-rows-bwd": _case(seq_q=50, seq_k=30, mask="chunked", chunk=8, pass_="fwd_bwd"),
    "mixed-dv72-sinks-bwd": _case(head_dim_v=72, mask="mixed", decode_share=0.4, sinks="learned", pass_="fwd_bwd"),
    "mixed-B4-S40x70-uniform": _case(
        batch=4, seq_q=40, seq_k=70, kv_heads=1, mask="mixed", decode_share=0.5, lengths="uniform"
    ),
    "ragged-uniform-causal-alibi-bwd": _case(mask="causal", lengths="uniform", score_mod="alibi", pass_="fwd_bwd"),
    "ragged-longtail-window-S20x70": _case(seq_q=20, seq_k=70, mask="sliding_window", window=10, lengths="longtail"),
    "ragged-bimodal-none-float16": _case(batch=4, seq_q=24, seq_k=70, lengths="bimodal", dtype="float16"),
    "document-3-bimodal-lengths": _case(seq_q=45, mask="document", documents=3, lengths="bimodal"),
    # 4. a narrowed KV cache (forward)
    "kv-e4m3-dv72-bottom-right": _case(head_dim_v=72, mask="causal_bottom_right", kv_dtype="float8_e4m3fn"),
    "kv-e5m2-bfloat16-paged-decode": _case(
        seq_q=4, seq_k=70, mask="causal_bottom_right", dtype="bfloat16", kv_dtype="float8_e5m2", page_size=16
    ),
    "kv-bfloat16-float32-mixed-sinks": _case(mask="mixed", decode_share=0.4, kv_dtype="bfloat16", sinks="learned"),
    "kv-e4m3-float16-ragged-gqa41": _case(
        kv_heads=1, lengths="uniform", mask="causal", kv_dtype="float8_e4m3fn", dtype="float16"
    ),
    # 5. MLA's latent cache: v the view of k's first Dv channels (576 / 512 split 512 + 64, forward)
    "latent-576-512-decode": _case(**LATENT, seq_q=3, head_dim=576, head_dim_v=512, mask="causal_bottom_right"),
    "latent-576-512-bfloat16-decode": _case(
        **LATENT,
        batch=2,
        seq_q=1,
        seq_k=100,
        head_dim=576,
        head_dim_v=512,
        dtype="bfloat16",
        mask="causal_bottom_right",
    ),
    "latent-576-500-e4m3-paged-sinks-bfloat16": _case(
        **LATENT,
        batch=2,
        seq_q=2,
        seq_k=40,
        head_dim=576,
        head_dim_v=500,
        dtype="bfloat16",
        kv_dtype="float8_e4m3fn",
        page_size=16,
        sinks="learned",
        mask="causal_bottom_right",
    ),
    "latent-D72-Dv40-bwd": _case(**LATENT, head_dim=72, head_dim_v=40, mask="causal", pass_="fwd_bwd"),
    # 6. a shared prefix (cascade, forward): read once for the batch, each suffix after it, merged by LSE
    "prefix-20-decode": _case(seq_q=5, mask="causal_bottom_right", shared_prefix=20),
    "prefix-20-dv72-sinks-causal": _case(head_dim_v=72, mask="causal", sinks="learned", shared_prefix=20),
    "prefix-9-ragged-window-alibi": _case(
        seq_q=12, lengths="uniform", mask="sliding_window", window=12, score_mod="alibi", shared_prefix=9
    ),
    "prefix-33-chunked-mqa-float16": _case(
        kv_heads=1, seq_q=30, mask="chunked", chunk=8, dtype="float16", shared_prefix=33
    ),
    "prefix-24-latent-576": _case(
        **LATENT, seq_q=2, head_dim=576, head_dim_v=512, mask="causal_bottom_right", shared_prefix=24
    ),
    "latent-D40-Dv36-sinks-bwd": _case(
        **LATENT, head_dim=40, head_dim_v=36, sinks="learned", mask="causal_bottom_right", pass_="fwd_bwd"
    ),
}

RAGGED = ("mixed-B4-S40x70-uniform", "ragged-longtail-window-S20x70", "ragged-bimodal-none-float16")


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    """Every case of CASES, checked in the interpreter (one process per core), and gpu_smoke's tiny cases."""
    pytest.importorskip("triton")
    return run_cases_split(_CHECK, CASES, INTERPRETER, "tail")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_float64_reference_in_the_interpreter(interpreted, name):
    spec, result = CASES[name], interpreted[name]
    assert result["ok"], result["reason"]
    assert result["max_abs_err"] <= TOLERANCES[spec["dtype"]][0]
    if spec.get("pass_", "fwd") != "fwd":
        tolerance = GRAD_TOLERANCES[spec["dtype"]]
        assert result["grad_err"] <= tolerance
        expected = {"dq", "dk", "dv", "dsinks"} if spec.get("sinks") else {"dq", "dk", "dv"}
        assert set(result["grads"]) == expected
        assert max(result["grads"].values()) <= tolerance


def test_gpu_smokes_feature_cases_pass_in_the_interpreter(interpreted):
    assert interpreted["smoke"]["failures"] == []
    # every forced tile ran (a tile that raised would read "unfit"): the fp8 and prefix cases are decode steps
    # (the decode kernels, every candidate tile of theirs), the mixed case forward and backward
    assert interpreted["smoke"]["lines"] == [
        "fwd Tile(block_m=16, block_n=32, num_warps=1, num_stages=1): 1 cases checked, 0 wrong",
        "dkdv Tile(block_m=32, block_n=16, num_warps=1, num_stages=1): 1 cases checked, 0 wrong",
        "dq Tile(block_m=16, block_n=16, num_warps=1, num_stages=1): 1 cases checked, 0 wrong",
        "decode on B1 H2/1 S4x40 D24 float32 cpu causal_bottom_right fwd kv-float8_e4m3fn page16: 1 tiles checked",
        "decode on B2 H2/1 S3x40 D24 float32 cpu causal_bottom_right fwd prefix17: 1 tiles checked",
        "64-bit offsets: ok",
    ]


def test_the_sink_gradient_is_checked_on_its_own(interpreted):
    for name in ("sinks-dv72-causal-bwd", "sinks-window-empty-rows-bwd", "mixed-dv72-sinks-bwd"):
        assert interpreted[name]["grads"]["dsinks"] <= GRAD_TOLERANCES["float32"], name
    assert interpreted["sinks-softcap-bfloat16-bwd"]["grads"]["dsinks"] <= GRAD_TOLERANCES["bfloat16"]


def test_rows_that_see_no_key_are_exactly_zero(interpreted):
    # a window of 8 bottom-right with Sq 50 > Sk 24: rows 0-25 see no key (in every sequence), with sinks too
    assert interpreted["sinks-window-empty-rows"]["empty_rows"] == 26
    assert interpreted["sinks-window-empty-rows"]["empty_rows_max"] == 0.0
    # mixed, B 4, decode share 0.5: two decode steps, each with 39 padding rows (and shorter prefills)
    assert interpreted["mixed-B4-S40x70-uniform"]["empty_rows"] >= 2 * 39
    for name in ("mixed-B4-S40x70-uniform", "ragged-bimodal-none-float16", "kv-bfloat16-float32-mixed-sinks"):
        assert interpreted[name]["empty_rows"] > 0 and interpreted[name]["empty_rows_max"] == 0.0, name


def test_keys_past_a_sequence_are_never_read(interpreted):
    for name in (*RAGGED, "chunked-6-D72"):
        result = interpreted[name]
        assert result["unseen_keys"] > 0 and result["unchanged_by_nan"], name


def test_each_row_tile_visits_only_the_key_blocks_its_rows_see(interpreted):
    for name in ("chunked-6-D72", *RAGGED):
        result = interpreted[name]
        assert result["visited"] == result["expected_visited"], name
    # mixed B 4: the decode steps' second tile (rows 32-39, all padding) visits nothing
    assert interpreted["mixed-B4-S40x70-uniform"]["visited"][1] == 0
    # chunks of 6 keys, Sq 37 < Sk 45 (positions 8-44): rows 32-36 (positions 40-44) see keys 36-44 only,
    # one 16-key block where bottom-right causal would visit all three
    assert interpreted["chunked-6-D72"]["visited"] == [3, 1] * 3


def test_the_narrowed_cache_is_read_in_its_stored_type(interpreted):
    assert interpreted["kv-e4m3-dv72-bottom-right"]["plan_kv_dtype"] == "torch.float8_e4m3fn"
    assert interpreted["kv-e5m2-bfloat16-paged-decode"]["plan_kv_dtype"] == "torch.float8_e5m2"
    assert interpreted["kv-bfloat16-float32-mixed-sinks"]["plan_kv_dtype"] == "torch.bfloat16"
    assert interpreted["kv-e4m3-dv72-bottom-right"]["scaled"] is True
    assert interpreted["kv-bfloat16-float32-mixed-sinks"]["scaled"] is False


PREFIXES = [name for name in CASES if name.startswith("prefix-")]


def test_a_shared_prefix_is_read_once_for_the_batch(interpreted):
    for name in PREFIXES:
        result, spec = interpreted[name], CASES[name]
        assert result["other_prefixes_unread"], name  # NaN in sequences 1, 2's copies changes nothing
        rows = spec["batch"] * spec["heads"] // spec["kv_heads"] * spec["seq_q"]
        if result["kernel"] == "decode":  # ≤ 8 rows a sequence: the decode kernels' prefix level comes first
            assert result["flags"]["PREFIX"], name
            assert result["prefix_grid"][0] == spec["kv_heads"] * -(-rows // 16), name  # 16-row blocks of all rows
        else:
            assert result["flags"]["MERGE"], name  # the suffix level starts from the prefix level's state
            assert result["prefix_grid"] == [spec["kv_heads"] * -(-rows // 32)], name  # 32-row tiles per kv head
    # the decode case: 3 sequences × 2 query heads × 5 rows = 30 rows: two 16-row programs per kv head
    assert interpreted["prefix-20-decode"]["kernel"] == "decode"
    assert interpreted["prefix-20-decode"]["prefix_grid"][0] == 2 * 2


def test_each_feature_takes_its_kernel_specialisation(interpreted):
    flags = {name: result["flags"] for name, result in interpreted.items() if "flags" in result}
    assert flags["dv72-bottom-right-bwd"] == dict.fromkeys(flags["dv72-bottom-right-bwd"], False)
    assert flags["sinks-dv72-causal-bwd"]["SINKS"] and flags["chunked-6-D72"]["RANGES"]
    assert flags["mixed-dv72-sinks-bwd"]["RANGES"] and flags["ragged-uniform-causal-alibi-bwd"]["RANGES"]
    assert flags["kv-e4m3-dv72-bottom-right"]["KV_SCALED"] and not flags["kv-bfloat16-float32-mixed-sinks"]["KV_SCALED"]
    # MLA 576/512: the head dim split 512 + 64, the values taken from the key tile (v is k's view); 576/500 too
    # (its channels 500-511 zeroed); D 40 / Dv 36 pads both to 64: the key tile again; D 72 / Dv 40 (128 / 64)
    # loads v through its own (strided) view of k
    for name in ("latent-576-512-decode", "latent-576-500-e4m3-paged-sinks-bfloat16"):
        assert flags[name]["SPLIT_D"] and flags[name]["V_FROM_K"], name
    # decode over the bf16 latent cache keys-major (measured faster on an H200); over the fp8 one not (unmeasured)
    assert flags["latent-576-512-decode"]["KEYS_MAJOR"]
    assert not flags["latent-576-500-e4m3-paged-sinks-bfloat16"]["KEYS_MAJOR"]
    assert flags["latent-576-512-decode"]["VALUE_PARTS"] == 1  # the interpreter's tile: the values whole
    assert flags["latent-D40-Dv36-sinks-bwd"]["V_FROM_K"] and not flags["latent-D40-Dv36-sinks-bwd"]["SPLIT_D"]
    assert not flags["latent-D72-Dv40-bwd"]["V_FROM_K"]


@pytest.mark.parametrize(
    "name",
    [
        "latent-576-512-decode",
        "latent-576-512-bfloat16-decode",
        "latent-576-500-e4m3-paged-sinks-bfloat16",
        "prefix-24-latent-576",
    ],
)
def test_mlas_value_halves_match_the_float64_reference(interpreted, name):
    """A tile of ``parts`` 2 (decode.HALF_TILES): two programs a block of rows, each the scores over all 576
    channels and the output over half the values, rows-major (keys-major is for whole values); fp32 and bf16
    latent caches (the bf16 one over 100 keys: several splits merged), a paged fp8 one under bf16 q with sinks and
    Dv 500 (the second half's last 12 channels masked), a shared prefix's two levels (several splits merged)."""
    spec, halves = CASES[name], interpreted[name]["halves"]
    assert halves["ok"] and halves["err"] <= TOLERANCES[spec["dtype"]][0]
    assert halves["flags"] and {flags["VALUE_PARTS"] for flags in halves["flags"]} == {2}
    assert not any(flags["KEYS_MAJOR"] for flags in halves["flags"])
    if spec.get("shared_prefix"):
        assert halves["splits"] > 1 and [flags["PREFIX"] for flags in halves["flags"]] == [True, False]
    if spec["dtype"] == "bfloat16" and "kv_dtype" not in spec:
        assert halves["splits"] > 1


def test_declared_features_and_the_reasons_for_the_rest(monkeypatch):
    from attnbench.impls import fused_triton

    caps = contender.capabilities
    assert caps.features == {"head_dim_v", "sinks", "lengths", "kv_dtype", "q_dtype", "kv_layout", "shared_prefix"}
    assert {"mixed", "chunked"} <= caps.masks and caps.max_head_dim == 256
    assert contender.interpreter_capabilities.features == caps.features
    monkeypatch.setattr(fused_triton, "_interpreted", lambda: True)  # judged as CPU rows in the interpreter
    cpu = {"batch": 2, "heads": 4, "kv_heads": 1, "seq_q": 1, "seq_k": 64, "device": "cpu"}
    mla = {**cpu, "head_dim": 576, "head_dim_v": 512, "kv_layout": "latent", "mask": "causal_bottom_right"}
    assert contender.unsupported_reason(Workload(**mla)) is None
    assert contender.unsupported_reason(Workload(**mla, pass_="bwd")) == WIDE_LATENT_BACKWARD
    assert contender.unsupported_reason(Workload(**{**mla, "head_dim": 640})) == "head_dim 640 outside [16, 576]"
    assert contender.unsupported_reason(Workload(**{**cpu, "head_dim": 576})) == "head_dim 576 outside [16, 256]"
    latent = Workload(**{**cpu, "head_dim": 128, "head_dim_v": 96, "kv_layout": "latent", "pass_": "fwd_bwd"})
    assert contender.unsupported_reason(latent) is None
    prefix = {**cpu, "head_dim": 64, "shared_prefix": 16}
    assert contender.unsupported_reason(Workload(**prefix)) is None
    assert contender.unsupported_reason(Workload(**prefix, pass_="fwd_bwd")) == SHARED_PREFIX_BACKWARD
    assert contender.unsupported_reason(Workload(**prefix, kv_dtype="float8_e5m2")) == SHARED_PREFIX_FP8
    assert contender.unsupported_reason(Workload(**prefix, kv_dtype="bfloat16")) is None
    # a decode step: the decode kernels' fp32 partial output and log-sum-exp per row and split — here one split
    # of the prefix and one of the suffix (the interpreter's split sizes: 32 keys at least)
    rows = 2 * 4 * 1
    assert contender.predicted_extra_bytes(Workload(**prefix)) == 4 * 2 * rows * (64 + 1)
    # a prefill chunk: the prefix level's fp32 output and log-sum-exp per row, besides the statistics
    rows = 2 * 4 * 16
    assert contender.predicted_extra_bytes(Workload(**{**prefix, "seq_q": 16})) == 8 * rows + 4 * rows * (64 + 1)
    wide_v = Workload(**cpu, head_dim=64, head_dim_v=512)
    assert contender.unsupported_reason(wide_v) == "head_dim_v 512 outside [16, 256]"
    fp8_bwd = Workload(**cpu, head_dim=64, kv_dtype="float8_e4m3fn", pass_="bwd")
    assert contender.unsupported_reason(fp8_bwd) == (
        "kv_dtype float8_e4m3fn is a serving cache's storage, not trained: forward only"
    )
    runs = Workload(
        **{**cpu, "seq_q": 8},
        head_dim=40,
        head_dim_v=72,
        sinks="learned",
        pass_="bwd",
        mask="mixed",
        decode_share=0.5,
        lengths="longtail",
    )
    assert contender.unsupported_reason(runs) is None
    chunked = Workload(**cpu, head_dim=40, mask="chunked", chunk=16, kv_dtype="float8_e5m2")
    assert contender.unsupported_reason(chunked) is None


def test_bad_feature_arguments_are_refused_before_launch():
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton.flash import flash_attention, make_plan, range_tables

    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 12, 16)
    fp8 = k.to(torch.float8_e4m3fn)
    for options, message in (
        ({"mask": "chunked"}, "mask 'chunked' needs chunk ≥ 1"),
        ({"mask": "mixed"}, "mask 'mixed' needs row_ranges"),
        ({"sinks": torch.zeros(2)}, r"sinks must have shape \(4,\)"),
        ({"row_ranges": (torch.zeros(1, 8), torch.ones(1, 8)), "window": 2}, "row_ranges are the whole mask"),
    ):
        with pytest.raises(ValueError, match=message):
            make_plan(q, k, k, **options)
    with pytest.raises(ValueError, match="needs its float32 scales"):
        make_plan(q, fp8, fp8)
    with pytest.raises(ValueError, match="must be narrower"):
        make_plan(q.half(), k, k)
    # rows that see keys in two runs, or ranges that step back, have no one key-side range
    gap = torch.tensor([[0, 0, 0, 0]]), torch.tensor([[2, 0, 3, 4]])
    with pytest.raises(ValueError, match="one run"):
        range_tables(*gap, 1, 4, 6, torch.device("cpu"))
    back = torch.tensor([[0, 2, 1, 1]]), torch.tensor([[3, 4, 4, 4]])
    with pytest.raises(ValueError, match="lo must not decrease"):
        range_tables(*back, 1, 4, 6, torch.device("cpu"))
    fp8_q = torch.randn(2, 4, 8, 16, requires_grad=True)
    scales = torch.ones(2, 2, 1, 1)
    with pytest.raises(ValueError, match="forward only"):
        torch.autograd.grad(flash_attention(fp8_q, fp8, fp8, k_scale=scales, v_scale=scales).sum(), fp8_q)


def test_key_side_ranges_are_the_rows_that_see_each_key():
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton.flash import chunked_ranges, range_tables

    cases = [
        chunked_ranges(7, 11, 3),
        (torch.tensor([[0, 0, 0, 0, 0], [0, 1, 1, 1, 2]]), torch.tensor([[3, 4, 4, 0, 0], [0, 2, 5, 5, 6]])),
    ]
    for lo, hi in cases:
        batch, seq_q = lo.shape
        seq_k = 11 if seq_q == 7 else 6
        row_lo, row_hi, key_lo, key_hi = range_tables(lo, hi, batch, seq_q, seq_k, torch.device("cpu"))
        j = torch.arange(seq_k).view(1, 1, -1)
        visible = (j >= lo.unsqueeze(-1)) & (j < hi.unsqueeze(-1))  # (B, Sq, Sk)
        i = torch.arange(seq_q).view(1, -1, 1)
        from_keys = (i >= key_lo.unsqueeze(1)) & (i < key_hi.unsqueeze(1))
        assert torch.equal(visible, from_keys)
        assert torch.equal(row_lo < row_hi, visible.any(-1))


@pytest.fixture()
def sm90(monkeypatch):
    """Launches become sm_90 compiles (``compile_report.CompiledLaunch``): {kernel name: compiled kernel}."""
    pytest.importorskip("triton")
    from attnbench.impls.fused_triton import backward_kernels, decode_kernels, flash, forward_kernels
    from attnbench.impls.fused_triton.compile_report import CompiledLaunch

    compiled: dict[str, Any] = {}
    for module, names in (
        (forward_kernels, ("_forward_kernel", "_prefix_kernel")),
        (backward_kernels, ("_preprocess_kernel", "_dkdv_kernel", "_dq_kernel")),
        (decode_kernels, ("_decode_split_kernel", "_decode_merge_kernel")),
    ):
        for name in names:
            monkeypatch.setattr(module, name, CompiledLaunch(getattr(module, name), compiled))
    monkeypatch.setattr(flash, "INTERPRETED", False)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud
    return compiled


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dtype", "kv_dtype", "options"),
    [
        (torch.bfloat16, torch.float8_e4m3fn, {"mask": "chunked", "chunk": 256}),
        (torch.float16, torch.float8_e5m2, {"mask": "causal_bottom_right", "softcap": 20.0}),
    ],
    ids=["e4m3-chunked", "e5m2-bottom-right-softcap"],
)
def test_the_new_forward_specialisations_compile_for_sm90(sm90, dtype, kv_dtype, options):
    from attnbench.impls.fused_triton import flash
    from attnbench.impls.fused_triton.tiles import Tile

    q = torch.empty(2, 8, 512, 192, dtype=dtype)
    k, v = torch.empty(2, 2, 512, 192, dtype=kv_dtype), torch.empty(2, 2, 512, 128, dtype=kv_dtype)
    scales = {"k_scale": torch.ones(2, 2, 1, 1), "v_scale": torch.ones(2, 2, 1, 1)} if kv_dtype.itemsize == 1 else {}
    sinks = torch.zeros(8)
    plan = flash.make_plan(q, k, v, sinks=sinks, **scales, **options)
    plan.tiles["fwd"] = Tile(64, 64, 4, 2)
    flash.forward(q, k, v, plan, store_lse=True, sinks=sinks)
    assert set(sm90) == {"_forward_kernel"}


@pytest.mark.slow
def test_the_mla_forward_compiles_for_sm90(sm90):
    from attnbench.impls.fused_triton import flash

    cache = torch.empty(4, 1, 1024, 576, dtype=torch.float8_e4m3fn)
    scales = torch.ones(4, 1, 16, 1)
    for rows in (2, 16):  # a decode step (the decode kernels), a prefill chunk (the forward kernel)
        q = torch.empty(4, 16, rows, 576, dtype=torch.bfloat16)
        plan = flash.make_plan(
            q, cache, cache[..., :512], mask="causal_bottom_right", k_scale=scales, v_scale=scales, scale_block=64
        )
        kernel = "decode" if plan.decode else "fwd"
        assert plan.candidates(kernel) and {t.block_m for t in plan.candidates(kernel)} <= {16, 32, 64}
        plan.tiles[kernel] = plan.candidates(kernel)[0]
        flash.forward(q, cache, cache[..., :512], plan)
    assert set(sm90) == {"_forward_kernel", "_decode_split_kernel", "_decode_merge_kernel"}


@pytest.mark.slow
def test_the_cascade_kernels_compile_for_sm90(sm90):
    from attnbench.impls.fused_triton import flash
    from attnbench.impls.fused_triton.tiles import Tile

    k = torch.empty(8, 2, 2048, 128, dtype=torch.bfloat16)
    for rows in (1, 16):  # a decode step (the decode kernels' two levels), a prefill chunk (prefix + forward)
        q = torch.empty(8, 8, rows, 128, dtype=torch.bfloat16)
        plan = flash.make_plan(q, k, k.clone(), mask="causal_bottom_right", shared_prefix=1536)
        plan.tiles.update({"fwd": Tile(64, 64, 4, 2), "prefix": Tile(64, 64, 4, 2), "decode": Tile(64, 64, 4, 2)})
        flash.forward(q, k, k.clone(), plan)
    split_levels = {"_decode_split_kernel", "_decode_split_kernel[PREFIX]"}  # the sequences' and the prefix's
    assert set(sm90) == {"_prefix_kernel", "_forward_kernel", "_decode_merge_kernel", *split_levels}


@pytest.mark.slow
def test_the_new_backward_specialisations_compile_for_sm90(sm90):
    from attnbench.impls.fused_triton import flash
    from attnbench.impls.fused_triton.tiles import Tile

    q = torch.empty(2, 8, 300, 192, dtype=torch.bfloat16)
    k, v = torch.empty(2, 2, 700, 192, dtype=torch.bfloat16), torch.empty(2, 2, 700, 128, dtype=torch.bfloat16)
    rows = torch.arange(300)
    lo = torch.zeros(2, 300, dtype=torch.int64)  # a prefill chunk of 300 rows at the end of 700 keys; a decode step
    hi = torch.stack([rows + 401, torch.where(rows == 0, 100, 0)])
    sinks = torch.zeros(8)
    plan = flash.make_plan(q, k, v, mask="mixed", row_ranges=(lo, hi), sinks=sinks, alibi=True)
    plan.tiles.update({"dkdv": Tile(32, 64, 4, 2), "dq": Tile(64, 32, 4, 2)})
    out, lse = torch.empty(2, 8, 300, 128, dtype=torch.bfloat16), torch.empty(2, 8, 300)
    flash.backward_grads(q, k, v, out, lse, out, plan, sinks=sinks)
    assert set(sm90) == {"_preprocess_kernel", "_dkdv_kernel", "_dq_kernel"}
