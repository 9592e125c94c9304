"""Workload features (issue 13) and bounded sizes (issue 12 item 1): sliding_window and document masks,
softcap and alibi score modifiers, the paged KV cache, model presets; closed-form counts at any size."""

import math
import resource
import subprocess
import time

import pytest
import torch

from attnbench import UsageError, Workload, make_inputs
from attnbench.contenders import registry
from attnbench.runner.cases import RunOptions, prepare_checked, run_case
from attnbench.workload.flops import attention_bytes, kv_positions_read
from attnbench.workload.masks import dense_mask_of, document_lengths, key_span, visible_pairs, workload_pairs
from attnbench.workload.models import PRESETS
from attnbench.workload.paged import gather_bytes, gather_pages, make_paged
from attnbench.workload.reference import reference_output
from attnbench.workload.suite import Suite, expand, load_suite, model_suite

from conftest import attnbench_cmd

FEATURES = [
    {"mask": "sliding_window", "window": 3},
    {"mask": "sliding_window", "window": 20},  # wider than the keys: causal_bottom_right
    {"mask": "document", "documents": 3},
    {"mask": "causal", "score_mod": "softcap", "softcap": 0.5},  # a small cap, so tanh bends the scores
    {"mask": "causal", "score_mod": "alibi"},
    {"mask": "sliding_window", "window": 4, "score_mod": "alibi"},
    {"mask": "document", "documents": 4, "score_mod": "softcap", "softcap": 2.0},
]


def _independent(w: Workload, inputs) -> torch.Tensor:
    """The definitions written out once more, element by element in float64, for a tiny workload."""
    q, k, v = (t.detach().double() for t in (inputs.q, inputs.k, inputs.v))
    offset = w.seq_k - w.seq_q
    document = []
    if w.mask == "document":
        for d, length in enumerate(document_lengths(w.seq_q, w.documents)):
            document += [d] * length
    out = torch.zeros(w.batch, w.heads, w.seq_q, w.head_dim, dtype=torch.float64)
    for b in range(w.batch):
        for h in range(w.heads):
            slope = 2 ** (-8 * (h + 1) / w.heads)
            for i in range(w.seq_q):
                scores, values = [], []
                for j in range(w.seq_k):
                    if w.mask == "sliding_window" and not (i + offset - w.window < j <= i + offset):
                        continue
                    if w.mask == "causal" and j > i:
                        continue
                    if w.mask == "document" and (document[i] != document[j] or j > i):
                        continue
                    s = float(q[b, h, i] @ k[b, h // w.gqa_group, j]) * w.softmax_scale
                    if w.score_mod == "softcap":
                        s = w.softcap * math.tanh(s / w.softcap)
                    if w.score_mod == "alibi":
                        s -= slope * abs(i + offset - j)
                    scores.append(s)
                    values.append(v[b, h // w.gqa_group, j])
                if scores:
                    top = max(scores)
                    weights = [math.exp(s - top) for s in scores]
                    total = sum(weights)
                    out[b, h, i] = sum(wt / total * value for wt, value in zip(weights, values, strict=True))
    return out


@pytest.mark.parametrize("features", FEATURES, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_reference_matches_the_definitions_written_independently(features):
    seq_q, seq_k = (9, 9) if features["mask"] != "sliding_window" else (5, 9)
    w = Workload(2, 4, 2, seq_q, seq_k, 8, **features)
    inputs = make_inputs(w)
    rows = torch.arange(w.seq_q)
    torch.testing.assert_close(reference_output(inputs, rows), _independent(w, inputs), rtol=1e-12, atol=1e-12)


def test_alibi_slopes_and_softcap_change_the_output():
    base = Workload(1, 4, 4, 8, 8, 8, mask="causal")
    plain = reference_output(make_inputs(base), torch.arange(8))
    for features in ({"score_mod": "alibi"}, {"score_mod": "softcap", "softcap": 0.5}):
        w = Workload(1, 4, 4, 8, 8, 8, mask="causal", **features)
        inputs = make_inputs(w)
        inputs.q.data.copy_(make_inputs(base).q)
        inputs.k.data.copy_(make_inputs(base).k)
        inputs.v.data.copy_(make_inputs(base).v)
        assert (reference_output(inputs, torch.arange(8)) - plain).abs().max() > 1e-3


SHAPES = [(1, 1), (5, 5), (3, 8), (8, 3), (7, 16), (16, 7)]


@pytest.mark.parametrize(("seq_q", "seq_k"), SHAPES)
@pytest.mark.parametrize("window", [1, 2, 5, 40])
def test_sliding_window_pairs_in_closed_form_match_brute_force(seq_q, seq_k, window):
    w = Workload(3, 1, 1, seq_q, seq_k, 1, mask="sliding_window", window=window)
    brute = sum(1 for i in range(seq_q) for j in range(seq_k) if i + seq_k - seq_q - window < j <= i + seq_k - seq_q)
    assert workload_pairs(w) == 3 * brute
    dense = dense_mask_of(w, "cpu")
    assert int(dense.expand(3, 1, seq_q, seq_k).sum()) == 3 * brute


@pytest.mark.parametrize(("seq", "documents"), [(1, 1), (9, 1), (9, 9), (64, 5), (100, 7)])
def test_document_lengths_and_pairs(seq, documents):
    lengths = document_lengths(seq, documents)
    assert len(lengths) == documents and sum(lengths) == seq and min(lengths) >= 1
    assert document_lengths(seq, documents) == lengths  # seeded: the same every time
    w = Workload(2, 1, 1, seq, seq, 1, mask="document", documents=documents)
    starts = [sum(lengths[:d]) for d in range(documents)]
    brute = sum(1 for s, n in zip(starts, lengths, strict=True) for i in range(s, s + n) for j in range(s, i + 1))
    assert workload_pairs(w) == 2 * brute
    assert int(dense_mask_of(w, "cpu").expand(2, 1, seq, seq).sum()) == 2 * brute


@pytest.mark.parametrize("mask", ["none", "causal", "causal_bottom_right", "padding", "sliding_window", "document"])
@pytest.mark.parametrize(("seq_q", "seq_k"), SHAPES)
def test_key_span_is_the_union_of_visible_keys(mask, seq_q, seq_k):
    if mask == "document" and seq_q != seq_k:
        pytest.skip("document needs Sq = Sk")
    w = Workload(3, 1, 1, seq_q, seq_k, 1, mask=mask, window=3, documents=min(seq_q, 2))
    dense = dense_mask_of(w, "cpu")
    dense = torch.ones(3, 1, seq_q, seq_k, dtype=torch.bool) if dense is None else dense.expand(3, 1, seq_q, seq_k)
    for b, (first, end) in enumerate(key_span(w)):
        seen = dense[b, 0].any(dim=0).nonzero().flatten().tolist()
        assert seen == list(range(first, end))


def test_counts_are_closed_forms_at_absurd_sizes():
    start = time.process_time()  # CPU time (0.18 s here), which another process on the cores does not stretch
    huge = 2**24
    assert visible_pairs("causal", 2**16, huge, huge) == 2**16 * huge * (huge + 1) // 2
    assert visible_pairs("sliding_window", 1, huge, huge, window=4096) == sum(range(1, 4097)) + (huge - 4096) * 4096
    assert visible_pairs("causal_bottom_right", 1, 16, huge) == 16 * huge - 120
    w = Workload(2**16, 2**12, 2**3, huge, huge, 2**12, mask="document", documents=2**16, page_size=64)
    assert attention_bytes(w) > 0
    assert time.process_time() - start < 1.0


def test_an_absurd_case_within_the_bounds_is_skipped_with_its_prediction_at_once():
    w = Workload(2**16, 2**12, 2**12, 2**24, 2**24, 2**12, mask="sliding_window", window=4096)
    registry.load()  # importing the contenders is not part of pricing a case
    # CPU time, not wall time: the wall clock also counts the waits for a core, and beside another test's worker and
    # a busy loop on 2 cores the pricing took 1.18-1.29 s of wall time (2 full-suite runs of 2); in a test worker
    # under that load its CPU time read 0.23-0.24 s (wall 0.47-0.62 s), alone 0.16 s. The case run for real would
    # take hours of CPU (or fail to allocate), which CPU time still shows
    start = time.process_time()
    row = run_case("bmm", w, RunOptions())
    assert time.process_time() - start < 1.0
    assert row["status"] == "skipped" and row["reason"].startswith("predicted")


def _run(cwd, *args: str) -> subprocess.CompletedProcess:
    """The command in a child process; its CPU time (importing torch included) must stay under 10 s. The
    wall-clock limit is looser, as other work on a shared machine can slow the import of torch."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(attnbench_cmd(*args), capture_output=True, text=True, cwd=cwd, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 10
    return result


def test_a_twenty_digit_seq_ends_at_once_with_exit_2_and_nothing_written(tmp_path):
    result = _run(tmp_path, "run", "--seq", "12345678901234567890")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "attnbench: error: --seq value 12345678901234567890 is past the sane upper bound; allowed: 1 to 16777216"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_suite_file_with_a_huge_value_is_refused_in_one_line(tmp_path):
    suite = tmp_path / "huge.toml"
    suite.write_text("[[sweep]]\nbatch = 1\nheads = 2\nseq = 99999999999999999999\nhead_dim = 8\n")
    result = _run(tmp_path, "run", "--suite", str(suite))
    assert result.returncode == 2
    assert "suite huge sweep 1: seq value 99999999999999999999 is past the sane upper bound" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.toml"]


def test_paged_layout_round_trips_and_is_shuffled():
    w = Workload(3, 4, 2, 1, 100, 8, mask="causal_bottom_right", page_size=16)
    inputs = make_inputs(w)
    paged = inputs.paged
    assert paged is not None and paged.k_pages.shape == (3 * 7, 2, 16, 8)  # ceil(100 / 16) = 7 pages each
    assert paged.page_table.dtype == torch.int32 and paged.page_table.shape == (3, 7)
    assert sorted(paged.page_table.flatten().tolist()) == list(range(21))
    assert paged.page_table.flatten().tolist() != list(range(21))  # shuffled, not in order
    assert torch.equal(gather_pages(paged.k_pages, paged.page_table, 100), inputs.k)
    assert torch.equal(gather_pages(paged.v_pages, paged.page_table, 100), inputs.v)
    for b in range(3):
        for p in range(7):
            page = int(paged.page_table[b, p])
            assert (int(paged.page_owner[page]), int(paged.page_position[page])) == (b, p)
    again = make_paged(inputs.k, inputs.v, 16, seed=123)
    assert torch.equal(gather_pages(again.k_pages, again.page_table, 100), inputs.k)


def test_gather_pages_writes_into_a_given_tensor_with_a_partial_last_page():
    w = Workload(2, 6, 3, 1, 70, 8, mask="causal_bottom_right", page_size=32)  # 3 pages, the last 6 keys used
    inputs = make_inputs(w)
    paged = inputs.paged
    assert paged is not None
    into = torch.full_like(inputs.k, float("nan"))
    assert gather_pages(paged.k_pages, paged.page_table, 70, out=into) is into
    assert torch.equal(into, inputs.k)
    assert gather_bytes(w) == 2 * 3 * 32 * 3 * 8 * 4  # one of k and v picked at a time, in whole pages


def test_the_harness_gathers_pages_for_a_contender_that_does_not_read_them(monkeypatch):
    """bmm declares paged="gather": the runner gathers k and v in its timed callable, twice per call, and the
    prediction counts the gather once; flex reads pages natively (no gather counted)."""
    from attnbench.contenders import registry
    from attnbench.impls._grouped import materialised_bytes
    from attnbench.runner._predict import predict
    from attnbench.workload import paged as paged_module

    calls = []

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return gather_pages(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(paged_module, "gather_pages", counting)
    w = Workload(2, 4, 2, 3, 100, 16, mask="causal_bottom_right", page_size=16)
    bmm = registry.get("bmm").contender
    assert bmm is not None and not bmm.reads_pages(w)
    prepared = prepare_checked("bmm", w)
    assert prepared.check.ok, prepared.reason
    assert len(calls) == 2  # k and v, in the first (checked) call
    prepared.fn()
    assert len(calls) == 4
    assert predict(bmm, w, None).extra_bytes == max(materialised_bytes(w), gather_bytes(w))
    flex = registry.get("flex").contender
    assert flex is not None and flex.reads_pages(w)
    assert predict(flex, w, None).extra_bytes == flex.predicted_extra_bytes(w)


def test_decode_bytes_count_the_pages_read():
    contiguous = Workload(2, 8, 2, 1, 1000, 64, mask="causal_bottom_right")
    paged = Workload(2, 8, 2, 1, 1000, 64, mask="causal_bottom_right", page_size=64)
    q_and_o = 2 * 2 * 8 * 1 * 64 * 4
    assert attention_bytes(contiguous) == q_and_o + 2 * 2 * 2 * 1000 * 64 * 4
    assert kv_positions_read(paged) == 2 * 16 * 64  # 1000 keys touch 16 pages of 64
    assert attention_bytes(paged) == q_and_o + 2 * 2 * 2 * 1024 * 64 * 4 + 4 * 2 * 16  # + int32 page table
    windowed = Workload(2, 8, 2, 1, 1000, 64, mask="sliding_window", window=100)
    assert attention_bytes(windowed) == q_and_o + 2 * 2 * 2 * 100 * 64 * 4


@pytest.mark.parametrize("impl", ["bmm", "einsum", "naive", "sdpa_math", "sdpa_flash"])
@pytest.mark.parametrize("features", [*FEATURES, {"mask": "padding", "page_size": 8}], ids=str)
def test_contenders_agree_with_the_reference_or_say_why_not(impl, features):
    seq_q, seq_k = (33, 33) if features["mask"] != "padding" else (2, 50)
    w = Workload(2, 4, 2, seq_q, seq_k, 16, **features)
    from attnbench.runner.cases import not_runnable

    verdict = not_runnable(impl, w)
    if verdict is not None:
        assert impl.startswith("sdpa") and features.get("score_mod") == "softcap"
        assert verdict == ("unsupported", verdict[1]) and "softcap" in verdict[1]
        return
    prepared = prepare_checked(impl, w)
    assert prepared.check.ok, prepared.reason


def test_fused_kernels_and_plugins_default_to_the_basic_features():
    from attnbench.contenders.contract import Capabilities

    caps = Capabilities()
    assert "sliding_window" in caps.unsupported_reason(Workload(1, 1, 1, 8, 8, 8, mask="sliding_window", window=2))
    assert "score_mod alibi" in caps.unsupported_reason(Workload(1, 1, 1, 8, 8, 8, score_mod="alibi"))
    assert "paged KV" in caps.unsupported_reason(Workload(1, 1, 1, 1, 8, 8, page_size=4))


def test_features_that_do_not_apply_collapse_to_neutral_values():
    assert Workload(1, 1, 1, 8, 8, 8, window=5, documents=3, softcap=20.0) == Workload(1, 1, 1, 8, 8, 8)
    w = Workload(1, 1, 1, 8, 8, 8, mask="sliding_window", window=5, score_mod="softcap", softcap=20)
    assert w.label() == "B1 H1 S8 D8 float32 cpu sliding_window fwd w5 softcap20"
    suite = Suite(
        "t",
        "",
        1.0,
        60.0,
        (
            {
                "impl": ["bmm"],
                "batch": [1],
                "heads": [2],
                "seq": [16],
                "head_dim": [8],
                "dtype": ["float32"],
                "device": ["cpu"],
                "mask": ["none", "sliding_window"],
                "pass": ["fwd"],
                "module": ["core"],
                "window": [4, 8],
            },
        ),
    )
    assert len(expand(suite, {}, ["bmm"])) == 3  # none once, sliding_window with each window


def test_model_presets_build_prefill_and_decode_sweeps():
    assert (PRESETS["llama3.1-70b"].heads, PRESETS["llama3.1-70b"].kv_heads, PRESETS["llama3.1-70b"].head_dim) == (
        64,
        8,
        128,
    )
    cases = expand(model_suite(), {"model": ["llama3.1-8b", "gemma2-9b"], "impl": ["bmm"]}, ["bmm"])
    workloads = [w for _, w in cases]
    prefill = [w for w in workloads if w.model == "llama3.1-8b" and w.seq_q == w.seq_k]
    decode = [w for w in workloads if w.model == "llama3.1-8b" and w.seq_q == 1]
    assert sorted(w.seq_q for w in prefill) == [512, 1024, 2048, 4096, 8192]
    assert {(w.heads, w.kv_heads, w.head_dim, w.mask) for w in prefill} == {(32, 8, 128, "causal")}
    assert sorted({w.seq_k for w in decode}) == [1024, 2048, 4096, 8192, 16384, 32768]
    assert sorted({w.batch for w in decode}) == [1, 8, 64] and {w.mask for w in decode} == {"causal_bottom_right"}
    gemma = {
        (w.layer, w.heads, w.kv_heads, w.head_dim, w.mask, w.score_mod, w.softcap)
        for w in workloads
        if w.model == "gemma2-9b"
    }
    assert gemma == {  # local and global layers alternate, every one softcapped
        ("sliding", 16, 8, 256, "sliding_window", "softcap", 50.0),
        ("full", 16, 8, 256, "causal", "softcap", 50.0),
        ("full", 16, 8, 256, "causal_bottom_right", "softcap", 50.0),
    }
    assert {w.window for w in workloads if w.model == "gemma2-9b" and w.layer == "sliding"} == {4096}
    given = {"model": ["gpt2"], "phase": ["decode"], "seq": [4], "seq_kv": [512], "batch": [2], "impl": ["bmm"]}
    assert [w.label() for _, w in expand(model_suite(), given, ["bmm"])] == [
        "B2 H12 S4x512 D64 float32 cpu causal_bottom_right fwd [gpt2]"
    ]


@pytest.mark.parametrize("name", ["models-cpu", "models-gpu"])
def test_model_suites_load_and_expand(name):
    cases = expand(load_suite(name), {}, ["bmm", "sdpa_flash", "fused_cpu", "flex", "fused_triton", "sdpa_math"])
    assert cases and all(w.model for _, w in cases)
    if name == "models-cpu":  # kept small enough for 2 cores
        assert max(w.seq_k for _, w in cases) <= 4096 and max(w.batch for _, w in cases) <= 4


def test_bad_feature_values_are_usage_errors():
    with pytest.raises(UsageError, match="window ≥ 1"):
        Workload(1, 1, 1, 8, 8, 8, mask="sliding_window")
    with pytest.raises(UsageError, match="allowed: 0 \\(contiguous KV\\) or a power of two"):
        Workload(1, 1, 1, 8, 8, 8, page_size=12)
    with pytest.raises(UsageError, match="past the sane upper bound for seq_q; allowed: 1 to 16777216"):
        Workload(1, 1, 1, 2**25, 8, 8)


@pytest.mark.slow  # FlexAttention compiles for each case (tens of seconds on 2 cores)
@pytest.mark.parametrize(
    "features",
    [
        {"mask": "document", "documents": 3, "score_mod": "softcap", "softcap": 2.0},
        {"mask": "sliding_window", "window": 40, "score_mod": "alibi", "page_size": 16},  # paged: read natively
    ],
    ids=str,
)
def test_flex_runs_the_features_through_mask_mod_score_mod_and_pages(features):
    seq_q = 128 if features["mask"] == "document" else 4
    w = Workload(2, 4, 2, seq_q, 128, 16, **features)
    prepared = prepare_checked("flex", w)
    assert prepared.check.ok, prepared.reason
