"""A prefix shared by the whole batch (issue 22 item 7): the inputs share it (contiguous: repeated, one copy
exposed; paged: the prefix's pages in the pool once), bytes read it once, the per-sequence contenders and the
cascade contender agree with float64, bad input in one line."""

import subprocess

import pytest
import torch

from attnbench import Workload, make_inputs
from attnbench.contenders import registry
from attnbench.errors import UsageError
from attnbench.runner.cases import not_runnable, prepare_checked
from attnbench.workload.flops import attention_bytes, kv_positions_read
from attnbench.workload.paged import gather_pages, pool_bytes
from attnbench.workload.prefix import shared_positions
from attnbench.workload.sequences import draw_lengths, sequence_lengths

from conftest import attnbench_cmd

PER_SEQUENCE = ["bmm", "einsum", "naive", "sdpa_math", "sdpa_flash"]
BOTTOM_RIGHT = "causal_bottom_right"
CASES = [  # (B, Hq, Hkv, Sq, Sk, features): decode, Sq < Sk, Sq = Sk, MQA, Sq > Sk, chunked, paged
    (3, 6, 2, 1, 37, {"mask": BOTTOM_RIGHT, "shared_prefix": 20}),
    (3, 6, 2, 5, 37, {"mask": BOTTOM_RIGHT, "shared_prefix": 31}),
    (2, 4, 4, 37, 37, {"mask": "causal", "shared_prefix": 30}),
    (2, 4, 1, 9, 37, {"mask": "none", "shared_prefix": 36}),
    (2, 4, 2, 40, 37, {"mask": BOTTOM_RIGHT, "shared_prefix": 9}),
    (2, 4, 2, 6, 37, {"mask": "chunked", "chunk": 8, "shared_prefix": 17}),
    (3, 4, 2, 3, 37, {"mask": BOTTOM_RIGHT, "shared_prefix": 17, "page_size": 8}),
]


def _workload(case: tuple, **more: object) -> Workload:
    batch, heads, kv_heads, seq_q, seq_k, features = case
    return Workload(batch, heads, kv_heads, seq_q, seq_k, 12, **{**features, **more})  # an odd head dim


@pytest.mark.parametrize("case", CASES, ids=lambda c: _workload(c).label())
def test_every_sequence_holds_the_same_prefix_and_its_own_suffix(case):
    w = _workload(case)
    inputs = make_inputs(w, requires_grad=True)
    prefix = w.shared_prefix
    for t in (inputs.k, inputs.v):
        assert all(torch.equal(t[b, :, :prefix], t[0, :, :prefix]) for b in range(w.batch))
        assert not any(torch.equal(t[b, :, prefix:], t[0, :, prefix:]) for b in range(1, w.batch))
    assert inputs.k.is_leaf and inputs.k.requires_grad
    assert inputs.prefix_kv is not None
    k_prefix, v_prefix = inputs.prefix_kv  # the one copy: views of sequence 0's prefix
    assert k_prefix.shape == v_prefix.shape == (w.kv_heads, prefix, 12)
    assert k_prefix.data_ptr() == inputs.k.data_ptr() and v_prefix.data_ptr() == inputs.v.data_ptr()
    assert make_inputs(_workload(case, shared_prefix=0)).prefix_kv is None


@pytest.mark.parametrize("impl", ["cascade", *PER_SEQUENCE])
@pytest.mark.parametrize("case", CASES, ids=lambda c: _workload(c).label())
def test_contenders_agree_with_float64(impl, case):
    w = _workload(case)
    assert not_runnable(impl, w) is None
    prepared = prepare_checked(impl, w)
    assert prepared.ok, prepared.reason
    assert prepared.check.max_abs_err < 1e-5


def test_cascade_in_bfloat16_and_backward_of_the_per_sequence_ones():
    prepared = prepare_checked("cascade", _workload(CASES[1], dtype="bfloat16"))
    assert prepared.ok, prepared.reason
    prepared = prepare_checked("bmm", _workload(CASES[1], pass_="fwd_bwd"))
    assert prepared.ok and prepared.grad_check is not None, prepared.reason


@pytest.mark.parametrize(
    "features",
    [
        {"head_dim_v": 8},
        {"kv_heads": 1, "head_dim_v": 8, "kv_layout": "latent"},
        {"kv_heads": 1, "head_dim_v": 8, "kv_layout": "latent", "page_size": 8},
    ],
    ids=str,
)
def test_cascade_with_a_value_head_dim_and_mla_latent_cache(features):
    w = Workload(3, 4, features.pop("kv_heads", 2), 2, 37, 20, mask=BOTTOM_RIGHT, shared_prefix=20, **features)
    inputs = make_inputs(w)
    assert inputs.prefix_kv is not None and inputs.prefix_kv[1].shape == (w.kv_heads, 20, 8)
    prepared = prepare_checked("cascade", w, inputs=inputs)
    assert prepared.ok and prepared.check.max_abs_err < 1e-5, prepared.reason


def test_cascade_reads_the_one_copy_so_a_prefix_that_is_not_shared_fails_the_check():
    """The reference works per sequence from each sequence's own keys; cascade reads sequence 0's prefix for
    every sequence. Data whose prefix differs in sequence 1 makes them disagree: the check has teeth."""
    w = _workload(CASES[0])
    inputs = make_inputs(w)
    inputs.k[1, :, :5] += 1.0
    assert not prepare_checked("cascade", w, inputs=inputs).check.ok
    assert prepare_checked("bmm", w, inputs=inputs).check.ok


def test_cascade_says_why_not_without_a_prefix_and_in_the_mha_module():
    cascade = registry.get("cascade").contender
    assert cascade is not None
    assert cascade.unsupported_reason(Workload(2, 4, 2, 1, 64, 16, mask="causal_bottom_right")) == (
        "cascade splits a shared prefix from each sequence's suffix, and shared_prefix is 0 "
        "(--shared-prefix; bmm is the same computation in one level)"
    )
    assert cascade.unsupported_reason(Workload(2, 4, 4, 8, 8, 16, shared_prefix=4, pass_="bwd")) == (
        "pass bwd needs backward support, which this contender does not declare"
    )
    mha = Workload(2, 4, 4, 8, 8, 16, module="mha", shared_prefix=4)
    assert registry.get("bmm").contender.unsupported_reason(mha) == (
        "the mha module projects k and v from its input each call, so no cached prefix is shared there"
    )
    plain = registry.get("score_dot").contender  # a scoring variant: no cache features
    assert plain.unsupported_reason(_workload(CASES[0])) == (
        "shared_prefix 20 not supported (declares no shared_prefix support)"
    )


def test_bytes_count_the_prefix_once_and_each_suffix_once():
    w = Workload(4, 8, 2, 1, 300, 16, mask="causal_bottom_right", shared_prefix=256)
    q_and_o = 2 * 4 * 8 * 1 * 16 * 4
    assert kv_positions_read(w) == 256 + 4 * 44
    assert attention_bytes(w) == q_and_o + 2 * (256 + 4 * 44) * 2 * 16 * 4  # k and v, Hkv 2, D 16, float32
    unshared = Workload(4, 8, 2, 1, 300, 16, mask="causal_bottom_right")
    assert attention_bytes(unshared) == q_and_o + 2 * 4 * 300 * 2 * 16 * 4
    # paged, pages of 64: the prefix's 3 whole pages (192 positions) once; positions 192 … 299 in 2 pages each
    paged = Workload(4, 8, 2, 1, 300, 16, mask="causal_bottom_right", shared_prefix=200, page_size=64)
    assert shared_positions(paged) == 192
    assert kv_positions_read(paged) == 192 + 4 * 128
    assert attention_bytes(paged) == q_and_o + 2 * (192 + 4 * 128) * 2 * 16 * 4 + 4 * (3 + 4 * 2)
    # a window that starts after the prefix reads none of it; padding's shortest sequences read less of it
    windowed = Workload(4, 8, 2, 1, 300, 16, mask="sliding_window", window=40, shared_prefix=256)
    assert kv_positions_read(windowed) == 4 * 40
    padded = Workload(4, 8, 2, 1, 200, 16, mask="padding", shared_prefix=40)  # lengths 200, 150, 100, 50
    assert kv_positions_read(padded) == 40 + (160 + 110 + 60 + 10)


def test_every_sequence_holds_the_prefix_and_a_token_of_its_own():
    """A shared prefix longer than a sequence was accepted: `--lengths uniform` drew caches of 2 keys beside a prefix
    of 8, padding's shortest sequence held 50 keys of a 100-key prefix. Ragged lengths are now drawn after the
    prefix (the longest still seq_kv), and a padding mask whose shortest sequence cannot hold the prefix is refused."""
    for distribution in ("uniform", "longtail", "bimodal"):
        w = Workload(16, 4, 2, 1, 64, 8, mask="causal_bottom_right", lengths=distribution, shared_prefix=48)
        lengths = sequence_lengths(w)
        assert lengths is not None
        kv = [k for _, k in lengths]
        assert min(kv) > 48 and max(kv) == 64, (distribution, kv)
        assert kv == [48 + own for own in draw_lengths(distribution, 16, 64 - 48)]
    with pytest.raises(UsageError, match="the shortest sequence holds 50 keys"):
        Workload(4, 8, 2, 1, 200, 16, mask="padding", shared_prefix=50)
    assert Workload(4, 8, 2, 1, 200, 16, mask="padding", shared_prefix=49).shared_prefix == 49


def test_paged_tables_point_at_one_set_of_prefix_pages():
    w = Workload(3, 4, 2, 1, 100, 8, mask="causal_bottom_right", shared_prefix=40, page_size=16)
    inputs = make_inputs(w)
    paged = inputs.paged
    assert paged is not None
    # 7 pages a sequence; the first 2 (positions 0 … 31) shared; the page holding 32 … 47 is each one's own
    assert paged.k_pages.shape == (2 + 3 * 5, 2, 16, 8)
    table = paged.page_table.tolist()
    assert table[0][:2] == table[1][:2] == table[2][:2]
    own = [page for row in table for page in row[2:]]
    assert sorted(own + table[0][:2]) == list(range(17))
    assert torch.equal(gather_pages(paged.k_pages, paged.page_table, 100), inputs.k)
    assert torch.equal(gather_pages(paged.v_pages, paged.page_table, 100), inputs.v)
    assert paged.page_owner[table[0][:2]].tolist() == [-1, -1]
    assert [int(paged.page_owner[row[3]]) for row in table] == [0, 1, 2]
    assert paged.page_position[table[1]].tolist() == list(range(7))
    assert pool_bytes(w) == paged.k_pages.nbytes + paged.v_pages.nbytes == 2 * 17 * 2 * 16 * 8 * 4


def test_the_flag_labels_and_bounds(tmp_path):
    assert _workload(CASES[0]).label() == "B3 H6/2 S1x37 D12 float32 cpu causal_bottom_right fwd prefix20"
    command = attnbench_cmd(
        "run",
        "--impl",
        "cascade",
        "--batch",
        "2",
        "--heads",
        "2",
        "--seq",
        "1",
        "--seq-kv",
        "64",
        "--head-dim",
        "8",
        "--shared-prefix",
        "64",
    )
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "attnbench: error: shared_prefix 64 with seq_kv 64: allowed 0 to 63 "
        "(each sequence holds the prefix and at least one token of its own)",
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # FlexAttention compiles per case (tens of seconds on 2 cores)
def test_flex_reads_the_shared_pages_natively():
    w = Workload(2, 4, 2, 3, 67, 16, mask="causal_bottom_right", shared_prefix=40, page_size=16)
    flex = registry.get("flex").contender
    assert flex is not None and flex.reads_pages(w)
    prepared = prepare_checked("flex", w)
    assert prepared.ok, prepared.reason
