"""Ragged and mixed batches (issue 22 items 5 and 6): per-sequence lengths drawn from a distribution with
seq_kv the maximum, prefill chunks and decode steps in one batch; counts, contenders, CLI and bad input."""

import dataclasses
import statistics

import pandas as pd
import pytest
import torch

from attnbench import UsageError, Workload
from attnbench.contenders import registry
from attnbench.runner.cases import not_runnable, prepare_checked
from attnbench.workload.axes import case_label, reproduce_flags
from attnbench.workload.flops import attention_bytes, attention_flops, kv_positions_read
from attnbench.workload.masks import dense_mask_of, document_lengths, key_span, workload_pairs
from attnbench.workload.sequences import decode_count, draw_lengths, packed_document_lengths, sequence_lengths
from attnbench.workload.suite import expand, model_suite

from conftest import CHECKED

DISTRIBUTIONS = ("uniform", "longtail", "bimodal")


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_each_distribution_is_seeded_within_bounds_and_padded_to_its_longest(distribution):
    lengths = draw_lengths(distribution, 64, 1000)
    assert lengths == draw_lengths(distribution, 64, 1000)  # deterministic
    assert len(lengths) == 64 and min(lengths) >= 1 and max(lengths) == 1000  # the maximum is the padded size
    assert len(set(lengths)) > 10  # drawn, not constant
    assert draw_lengths(distribution, 64, 999) != lengths  # another case, another draw
    assert draw_lengths(distribution, 1, 77) == [77] and draw_lengths(distribution, 3, 1) == [1, 1, 1]


def test_the_distributions_have_their_documented_shapes():
    assert draw_lengths("equal", 5, 300) == [300] * 5
    uniform = draw_lengths("uniform", 400, 1000)
    assert 400 < statistics.median(uniform) < 600 and min(uniform) < 50
    longtail = draw_lengths("longtail", 400, 1000)
    assert statistics.median(longtail) < 1000 / 4  # most short (about max / 9) …
    assert 0 < sum(length > 500 for length in longtail) < 400 / 5  # … a few past max / 2
    bimodal = draw_lengths("bimodal", 400, 1000)
    short, long = [x for x in bimodal if x <= 1000 // 8], [x for x in bimodal if x >= 750]
    assert len(short) + len(long) == 400 and len(long) == 100  # two clusters, a quarter long, nothing between


def test_document_lengths_drawn_from_a_distribution_sum_to_the_sequence():
    for distribution in DISTRIBUTIONS:
        lengths = packed_document_lengths(1000, 7, distribution)
        assert sum(lengths) == 1000 and min(lengths) >= 1 and len(lengths) == 7
        assert document_lengths(1000, 7, distribution) == lengths
    assert packed_document_lengths(9, 9, "longtail") == [1] * 9
    longtail = packed_document_lengths(4096, 32, "longtail")
    assert statistics.median(longtail) < 4096 / 32  # most documents shorter than the even share


def test_mixed_batches_put_their_decode_steps_first():
    assert [decode_count(8, s) for s in (0.01, 0.25, 0.5, 0.99)] == [1, 2, 4, 7]  # at least 1, at most B − 1
    w = Workload(5, 4, 2, 9, 13, 16, mask="mixed", decode_share=0.4)
    assert sequence_lengths(w) == ((1, 13), (1, 13), (9, 13), (9, 13), (9, 13))
    drawn = Workload(6, 4, 2, 9, 40, 16, mask="mixed", decode_share=0.5, lengths="uniform")
    kv = draw_lengths("uniform", 6, 40)
    assert sequence_lengths(drawn) == tuple((1 if b < 3 else min(9, k), k) for b, k in enumerate(kv))
    assert case_label(w) == "B5 H4/2 S9x13 D16 float32 cpu mixed fwd decode0.4"


ODD = [
    dict(batch=5, heads=6, kv_heads=2, seq_q=1, seq_k=37, mask="causal_bottom_right", lengths="longtail"),
    dict(batch=4, heads=3, kv_heads=1, seq_q=11, seq_k=29, mask="sliding_window", window=5, lengths="bimodal"),
    dict(batch=3, heads=2, kv_heads=2, seq_q=17, seq_k=17, mask="causal", lengths="uniform"),
    dict(batch=3, heads=2, kv_heads=1, seq_q=7, seq_k=23, mask="none", lengths="uniform"),
    dict(batch=5, heads=4, kv_heads=2, seq_q=9, seq_k=31, mask="mixed", decode_share=0.3, lengths="longtail"),
    dict(batch=3, heads=2, kv_heads=1, seq_q=40, seq_k=13, mask="mixed", decode_share=0.7),  # chunk > cache
    dict(batch=2, heads=2, kv_heads=1, seq_q=33, seq_k=33, mask="document", documents=4, lengths="bimodal"),
]


@pytest.mark.parametrize("shape", ODD, ids=lambda s: f"{s['mask']}-{s.get('lengths', 'equal')}")
def test_counts_equal_a_brute_force_count_from_the_dense_mask(shape):
    w = Workload(head_dim=24, **shape)
    visible = dense_mask_of(w, "cpu")
    assert visible is not None
    visible = visible.expand(w.batch, 1, w.seq_q, w.seq_k)[:, 0]  # (B, Sq, Sk)
    assert workload_pairs(w) == int(visible.sum())
    assert attention_flops(w) == 2 * w.heads * 2 * w.head_dim * int(visible.sum())
    seen = visible.any(dim=1)  # (B, Sk): the keys some row of the sequence sees
    for b, (first, end) in enumerate(key_span(w)):
        keys = seen[b].nonzero().flatten()
        assert (first, end) == ((int(keys.min()), int(keys.max()) + 1) if len(keys) else (0, 0))
    rows = int(visible.any(dim=2).sum()) if w.mask != "document" else w.batch * w.seq_q  # rows that see a key
    read = sum(end - first for first, end in key_span(w))
    assert attention_bytes(w) == 4 * (2 * rows * w.heads * w.head_dim + 2 * read * w.kv_heads * w.head_dim)


def test_decode_bytes_carry_the_real_total_of_cached_tokens_and_pages_up_to_each_length():
    w = Workload(16, 32, 8, 1, 1024, 128, mask="causal_bottom_right", lengths="longtail")
    kv = draw_lengths("longtail", 16, 1024)
    cached = sum(kv)
    assert cached < 16 * 1024 / 2  # long-tailed: far less than the padded cache
    assert attention_bytes(w) == 4 * (2 * 16 * 32 * 128 + 2 * cached * 8 * 128)
    paged = Workload(16, 32, 8, 1, 1024, 128, mask="causal_bottom_right", lengths="longtail", page_size=64)
    pages = sum(-(-k // 64) for k in kv)
    assert kv_positions_read(paged) == 64 * pages < 16 * 1024
    assert attention_bytes(paged) == 4 * (2 * 16 * 32 * 128 + 2 * 64 * pages * 8 * 128) + 4 * pages


CASES = [
    dict(mask="causal_bottom_right", lengths="longtail", seq_q=2),
    dict(mask="sliding_window", window=4, lengths="bimodal", score_mod="alibi"),
    dict(mask="none", lengths="uniform", score_mod="softcap", softcap=2.0),
    dict(mask="mixed", decode_share=0.4, lengths="uniform"),
    dict(mask="mixed", decode_share=0.6, score_mod="alibi"),
    dict(mask="document", documents=3, lengths="longtail", seq_q=19),
    dict(mask="causal", lengths="bimodal", page_size=4),
    dict(mask="mixed", decode_share=0.5, lengths="longtail", sinks="learned"),  # gpt-oss in a mixed batch
    dict(mask="mixed", decode_share=0.5, lengths="longtail", head_dim_v=12, kv_dtype="float8_e4m3fn"),
]


@pytest.mark.parametrize("impl", ["bmm", "einsum", "naive", "sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("pass_", ["fwd", "fwd_bwd"])
def test_contenders_agree_with_the_reference_on_ragged_and_mixed_batches(impl, case, pass_):
    fields = {"seq_q": 9, **case}
    w = Workload(5, 4, 2, seq_k=19, head_dim=20, pass_=pass_, **fields)
    verdict = not_runnable(impl, w)
    if verdict is not None:  # naive has no backward; softcap is no SDPA mask; a paged cache is forward only
        assert verdict[0] == "unsupported"
        expected = ("softcap", "paged", "sinks", "forward only", *(["backward"] if impl == "naive" else []))
        assert any(word in verdict[1] for word in expected), verdict
        return
    prepared = prepare_checked(impl, w)
    assert prepared.check is not None and prepared.check.ok, prepared.reason
    if pass_ == "fwd_bwd":
        assert prepared.grad_check is not None and prepared.grad_check.ok, prepared.reason


def test_padded_rows_come_out_zero():
    w = Workload(4, 2, 1, 6, 10, 16, mask="mixed", decode_share=0.5)  # two decode steps: rows 1 … 5 padding
    prepared = prepare_checked("bmm", w)
    out = prepared.fn()
    assert isinstance(out, torch.Tensor)
    assert torch.count_nonzero(out[:2, :, 1:]) == 0 and torch.count_nonzero(out[2:]) == out[2:].numel()


@pytest.mark.parametrize("impl", ["xformers"])  # fused_cpu and fused_triton run them (their features tests)
def test_contenders_without_per_sequence_lengths_say_why(impl):
    contender = registry.get(impl).contender
    assert contender is not None  # declared even where it cannot run (xformers without CUDA)
    ragged = Workload(2, 2, 2, 1, 16, 16, mask="causal_bottom_right", lengths="uniform")
    mixed = Workload(2, 2, 2, 4, 16, 16, mask="mixed", decode_share=0.5)
    capabilities = dataclasses.replace(contender.capabilities, devices=frozenset({"cpu"}))  # judged on CPU rows
    assert capabilities.unsupported_reason(ragged) == "lengths uniform not supported (declares no lengths support)"
    assert (capabilities.unsupported_reason(mixed) or "").startswith("mask mixed not supported")


@pytest.mark.slow  # FlexAttention compiles for each case (tens of seconds on 2 cores)
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[6]], ids=str)
def test_flex_reads_per_sequence_lengths_in_its_mask_mod(case):
    w = Workload(5, 4, 2, seq_k=19, head_dim=16, **{"seq_q": 9, **case})
    prepared = prepare_checked("flex", w)
    assert prepared.check is not None and prepared.check.ok, prepared.reason


def test_phase_mixed_builds_a_mixed_batch_from_a_preset():
    cases = expand(model_suite(), {"model": ["llama3.1-8b", "gemma2-9b"], "phase": ["mixed"], "impl": ["bmm"]}, ["bmm"])
    shapes = {(w.model, w.batch, w.seq_q, w.seq_k, w.mask, w.decode_share, w.window) for _, w in cases}
    assert shapes == {("llama3.1-8b", 8, 512, 4096, "mixed", 0.5, 0), ("gemma2-9b", 8, 512, 4096, "mixed", 0.5, 0)}
    default = expand(model_suite(), {"model": ["gpt2"], "impl": ["bmm"]}, ["bmm"])
    assert {w.mask for _, w in default} == {"causal", "causal_bottom_right"}  # --model alone: prefill and decode
    given = {
        "model": ["gpt2"],
        "phase": ["mixed"],
        "seq": [8],
        "seq_kv": [32],
        "batch": [4],
        "impl": ["bmm"],
        "decode_share": [0.25],
        "lengths": ["bimodal"],
    }
    [(_, w)] = expand(model_suite(), given, ["bmm"])
    assert reproduce_flags(w) == [
        "--model",
        "gpt2",
        "--phase",
        "mixed",
        "--batch",
        "4",
        "--seq",
        "8",
        "--seq-kv",
        "32",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--pass",
        "fwd",
        "--module",
        "core",
        "--decode-share",
        "0.25",
        "--lengths",
        "bimodal",
    ]
    two_kinds = expand(model_suite(), {"model": ["gpt-oss-20b"], "phase": ["mixed"], "impl": ["bmm"]}, ["bmm"])
    assert [(w.layer, w.mask, w.sinks) for _, w in two_kinds] == [("full", "mixed", "learned")]  # its full layers


def test_the_longtail_decode_command_gives_ok_rows_with_the_real_cache_in_their_bytes(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli(
        "run",
        "--impl",
        "bmm,sdpa_flash",
        "--lengths",
        "longtail",
        "--batch",
        "16",
        "--phase",
        "decode",
        "--model",
        "llama3.1-8b",
        "--seq-kv",
        "1024",
        "--budget-s",
        "0.02",
        "--out",
        str(out),
    )
    assert code == 0, err
    rows = pd.read_parquet(out / "results.parquet")
    assert rows.status.isin(CHECKED).all() and len(rows) == 2 and set(rows.lengths) == {"longtail"}
    cached = sum(draw_lengths("longtail", 16, 1024))
    assert set(rows.bytes) == {4 * (2 * 16 * 32 * 128 + 2 * cached * 8 * 128)}
    assert (rows.gbps > 0).all()


def test_a_mixed_phase_run_gives_ok_rows(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli(
        "run",
        "--impl",
        "bmm,naive,sdpa_math",
        "--model",
        "gpt2",
        "--phase",
        "mixed",
        "--seq",
        "8",
        "--seq-kv",
        "24",
        "--batch",
        "3",
        "--decode-share",
        "0.3",
        "--budget-s",
        "0.02",
        "--out",
        str(out),
    )
    assert code == 0, err
    rows = pd.read_parquet(out / "results.parquet")
    assert (
        rows.status.isin(CHECKED).all()
        and len(rows) == 3
        and set(rows["mask"]) == {"mixed"}
        and set(rows.decode_share) == {0.3}
    )
    w = Workload(3, 12, 12, 8, 24, 64, mask="mixed", decode_share=0.3)
    assert set(rows.flops) == {attention_flops(w)} and (rows.max_abs_err <= rows.atol).all()


BAD = [
    (["--lengths", "gaussian"], "lengths 'gaussian' is not known; allowed: equal, uniform, longtail, bimodal"),
    (["--mask", "mixed", "--decode-share", "0"], "--decode-share value 0.0 is not allowed; allowed: a number strictly"),
    (["--decode-share", "1.5"], "--decode-share value 1.5 is not allowed; allowed: a number strictly between 0 and 1"),
    (["--mask", "mixed", "--batch", "1"], "mask mixed holds prefill chunks and decode steps in one batch, so it needs"),
    (["--phase", "mixed", "--model", "gpt2", "--batch", "1"], "so it needs batch ≥ 2; got 1"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("run", "--impl", "bmm", *args, "--out", "x")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert out == "" and list(tmp_path.iterdir()) == []


def test_a_workload_refuses_bad_shares_and_a_mixed_batch_of_one():
    with pytest.raises(UsageError, match=r"decode_share 1\.0 is not allowed"):
        Workload(4, 1, 1, 8, 8, 8, mask="mixed", decode_share=1.0)
    with pytest.raises(UsageError, match="needs batch ≥ 2"):
        Workload(1, 1, 1, 8, 8, 8, mask="mixed", decode_share=0.5)
    assert Workload(2, 1, 1, 8, 8, 8, decode_share=0.9).decode_share == 0.0  # not mixed: the neutral value
