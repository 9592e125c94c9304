"""The chunked mask (issue 22 item 8, Llama 4's chunked local attention): a query sees the keys of its own
chunk up to itself, positions bottom-right aligned; closed-form counts against brute force, the reference
against the definition written out, contenders against float64, bad input in one line."""

import subprocess

import pytest
import torch

from attnbench import UsageError, Workload, make_inputs
from attnbench.contenders import registry
from attnbench.runner.cases import not_runnable, prepare_checked
from attnbench.workload.flops import attention_bytes, attention_flops, kv_positions_read
from attnbench.workload.masks import dense_mask_of, key_ranges, key_span, visible_pairs
from attnbench.workload.reference import reference_output

from conftest import attnbench_cmd

SHAPES = [(1, 1), (1, 23), (5, 23), (23, 23), (30, 23), (7, 16), (16, 7)]  # decode, Sq < Sk, Sq = Sk, Sq > Sk


def _sees(i: int, j: int, seq_q: int, seq_k: int, chunk: int) -> bool:
    """The definition: query i sits at position p = i + Sk − Sq and sees key j iff j ≤ p in p's chunk."""
    position = i + seq_k - seq_q
    return 0 <= j <= position and j // chunk == position // chunk


@pytest.mark.parametrize(("seq_q", "seq_k"), SHAPES)
@pytest.mark.parametrize("chunk", [1, 3, 5, 8, 40])
def test_pairs_ranges_and_span_match_brute_force(seq_q, seq_k, chunk):
    w = Workload(3, 1, 1, seq_q, seq_k, 1, mask="chunked", chunk=chunk)
    brute = [[_sees(i, j, seq_q, seq_k, chunk) for j in range(seq_k)] for i in range(seq_q)]
    count = sum(map(sum, brute))
    assert visible_pairs("chunked", 3, seq_q, seq_k, chunk=chunk) == 3 * count
    dense = dense_mask_of(w, "cpu")
    assert dense is not None and dense.expand(3, 1, seq_q, seq_k)[1, 0].tolist() == brute
    lo, hi = key_ranges(w)
    assert [list(range(a, b)) for a, b in zip(lo[0].tolist(), hi[0].tolist(), strict=True)] == [
        [j for j in range(seq_k) if row[j]] for row in brute
    ]
    seen = [j for j in range(seq_k) if any(row[j] for row in brute)]
    assert key_span(w) == [(seen[0], seen[-1] + 1)] * 3


def test_flops_count_the_visible_pairs_exactly_and_bytes_the_keys_read():
    w = Workload(2, 6, 2, 9, 50, 24, mask="chunked", chunk=8)
    pairs = sum(_sees(i, j, 9, 50, 8) for i in range(9) for j in range(50))
    assert pairs == 2 + 3 + 4 + 5 + 6 + 7 + 8 + 1 + 2  # positions 41 … 47 in chunk 40–47, then 48 and 49 anew
    assert attention_flops(w) == 2 * 2 * 6 * (24 + 24) * pairs
    decode = Workload(2, 8, 2, 1, 1000, 64, mask="chunked", chunk=256)
    assert kv_positions_read(decode) == 2 * (1000 - 768)  # the last chunk only: positions 768 … 999
    assert attention_bytes(decode) == 2 * 2 * 8 * 64 * 4 + 2 * 2 * 2 * 232 * 64 * 4
    huge = 2**24
    assert visible_pairs("chunked", 1, huge, huge, chunk=8192) == (huge // 8192) * 8192 * 8193 // 2


@pytest.mark.parametrize(("seq_q", "seq_k"), [(5, 23), (23, 23), (30, 23), (1, 23)])
def test_reference_matches_the_definition_written_out(seq_q, seq_k):
    w = Workload(2, 4, 2, seq_q, seq_k, 8, mask="chunked", chunk=5)
    inputs = make_inputs(w)
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    expected = torch.zeros(2, 4, seq_q, 8, dtype=torch.float64)
    for b in range(2):
        for h in range(4):
            for i in range(seq_q):
                keys = [j for j in range(seq_k) if _sees(i, j, seq_q, seq_k, 5)]
                if keys:
                    scores = torch.stack([q[b, h, i] @ k[b, h // 2, j] for j in keys]) * w.softmax_scale
                    expected[b, h, i] = torch.softmax(scores, 0) @ v[b, h // 2, keys]
    torch.testing.assert_close(reference_output(inputs, torch.arange(seq_q)), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", ["bmm", "einsum", "naive", "sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize(("seq_q", "seq_k"), [(1, 37), (9, 37), (37, 37), (40, 37)], ids=str)
def test_contenders_agree_with_float64(impl, seq_q, seq_k):
    w = Workload(2, 6, 2, seq_q, seq_k, 12, mask="chunked", chunk=8)  # GQA, odd head dim
    assert not_runnable(impl, w) is None
    prepared = prepare_checked(impl, w)
    assert prepared.check.ok, prepared.reason
    assert prepared.check.checked_rows == seq_q


def test_backward_and_bf16_agree_too():
    for w in (
        Workload(2, 4, 2, 9, 21, 8, mask="chunked", chunk=4, pass_="fwd_bwd"),
        Workload(2, 4, 2, 9, 21, 8, mask="chunked", chunk=4, dtype="bfloat16"),
    ):
        prepared = prepare_checked("bmm", w)
        assert prepared.ok, prepared.reason
        assert (prepared.grad_check is not None) == (w.pass_ == "fwd_bwd")


def test_fused_cpu_runs_it_in_its_kernel():  # as key ranges: each row's chunk up to itself (issue 23)
    contender = registry.get("fused_cpu").contender
    assert contender is not None
    w = Workload(1, 2, 2, 16, 16, 16, mask="chunked", chunk=4)
    assert contender.unsupported_reason(w) is None


def test_label_tag_and_bad_values():
    label = Workload(1, 8, 8, 1, 16384, 64, mask="chunked", chunk=8192).label()
    assert label == "B1 H8 S1x16384 D64 float32 cpu chunked fwd chunk8192"
    assert Workload(1, 1, 1, 8, 8, 8, chunk=4) == Workload(1, 1, 1, 8, 8, 8)  # no chunk without the mask
    with pytest.raises(UsageError, match=r"^mask chunked needs chunk ≥ 1 \(--chunk\), got 0$"):
        Workload(1, 1, 1, 8, 8, 8, mask="chunked")
    with pytest.raises(UsageError, match=r"^lengths uniform with mask chunked is not defined yet .*allowed .*equal$"):
        Workload(2, 1, 1, 8, 8, 8, mask="chunked", chunk=4, lengths="uniform")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--mask", "chunked", "--chunk", "0"],
            "attnbench: error: --chunk value 0 must be a positive integer (mask chunked only; other cases ignore it)",
        ),
        (["--mask", "chunked"], "attnbench: error: mask chunked needs chunk ≥ 1 (--chunk), got 0"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, message):
    command = attnbench_cmd("run", "--impl", "bmm", "--batch", "1", "--heads", "2", "--seq", "16", "--head-dim", "8")
    result = subprocess.run([*command, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (result.returncode, result.stderr.strip()) == (2, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # FlexAttention compiles per case (tens of seconds on 2 cores)
def test_flex_runs_chunked_through_its_mask_mod():
    w = Workload(2, 4, 2, 40, 67, 16, mask="chunked", chunk=16)
    prepared = prepare_checked("flex", w)
    assert prepared.check.ok, prepared.reason
