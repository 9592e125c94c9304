"""fused_cpu: correct on every mask, GQA, odd head dims, Sq ≠ Sk, across block boundaries, in fp32 and
bf16, forward and backward; skips masked blocks; small working memory; unavailable with a reason when it
cannot be built."""

import os
import stat

import pytest
import torch

from attnbench.contenders import registry
from attnbench.errors import UsageError
from attnbench.impls.fused_cpu import (
    BLOCK_K,
    BLOCK_Q,
    GROUP,
    block_q,
    contender,
    fused_attention,
    isa,
    paged_decode,
    uniform_rows,
)
from attnbench.impls.fused_cpu import bindings as _cpu_kernel
from attnbench.impls.fused_cpu.bindings import ScoreOptions
from attnbench.measure._memory import peak_memory_mb
from attnbench.runner.cases import prepare_checked
from attnbench.workload import Workload

pytestmark = pytest.mark.skipif(_cpu_kernel.unavailable_reason() is not None, reason="no C++ compiler here")

MASKS = ["none", "causal", "causal_bottom_right", "padding"]
# (batch, heads, kv_heads, seq_q, seq_k, head_dim): several work items (query blocks), key blocks (1024 keys) and
# 6-row groups, ragged ends
SHAPES = [
    (2, 4, 2, 300, 600, 64),  # GQA, Sq < Sk, three key blocks, a partial query block
    (2, 3, 1, 530, 270, 50),  # MQA, Sq > Sk (bottom-right leaves rows with no key), head_dim 50
    (1, 2, 2, 257, 257, 96),  # one row and one key past a block edge
    (3, 2, 2, 40, 40, 8),  # tiny head dim, one block
    (1, 1, 1, 20, 33, 200),  # head dim over the 64-float register tile
    (1, 1, 1, 1100, 1100, 64),  # 8 work items of 138 rows, the last with a 2-row group; 2 key blocks
]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_reference(mask, shape):
    prepared = prepare_checked("fused_cpu", Workload(*shape, dtype="float32", mask=mask))
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.max_abs_err < 1e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mask", ["causal_bottom_right", "padding"])
def test_half_precision_inputs(dtype, mask):
    prepared = prepare_checked("fused_cpu", Workload(2, 4, 2, 300, 260, 64, dtype=dtype, mask=mask))
    assert prepared.check.ok, prepared.check.reason
    output = prepared.fn()
    assert isinstance(output, torch.Tensor) and output.dtype == getattr(torch, dtype)


# (batch, heads, kv_heads, seq_q, seq_k, head_dim) for the backward: GQA 4/2 and 4/1, head_dim 50 and 96,
# Sq ≠ Sk both ways, blocks of 64 query rows and 256 keys crossed with ragged ends
BACKWARD_SHAPES = [
    (2, 4, 2, 300, 600, 64),
    (2, 4, 1, 530, 270, 50),
    (1, 2, 2, 257, 257, 96),
    (1, 1, 1, 20, 33, 200),
]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", BACKWARD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_match_float64(mask, shape):
    prepared = prepare_checked("fused_cpu", Workload(*shape, mask=mask, pass_="fwd_bwd"))
    assert prepared.check.ok and prepared.grad_check is not None and prepared.grad_check.ok, prepared.reason
    assert prepared.grad_check.grad_err < 1e-5


@pytest.mark.parametrize(("dtype", "pass_"), [("bfloat16", "bwd"), ("float16", "fwd_bwd")])
def test_half_precision_gradients(dtype, pass_):
    prepared = prepare_checked("fused_cpu", Workload(2, 4, 2, 130, 300, 64, dtype=dtype, mask="causal", pass_=pass_))
    assert prepared.ok, prepared.reason
    grads = prepared.fn()
    assert isinstance(grads, tuple) and all(g.dtype == getattr(torch, dtype) for g in grads)


def test_gradients_of_rows_and_keys_that_see_nothing_are_zero():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, s, 16, requires_grad=True) for s in (50, 20, 20))
    out, _ = fused_attention(q, k, v, scale=0.25, mask="padding", lengths=torch.tensor([20, 0]))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert torch.all(dq[1] == 0) and torch.all(dk[1] == 0) and torch.all(dv[1] == 0)  # length 0: no key
    assert dq[0].abs().sum(-1).min() > 0 and dv[0].abs().sum(-1).min() > 0
    out, _ = fused_attention(q, k, v, scale=0.25, mask="causal_bottom_right")  # rows 0-29 see no key
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert torch.all(dq[:, :, :30] == 0) and torch.all(dv.abs().sum(-1) > 0)  # row 30 sees one key: its dq is 0 too


HAS_BF16 = _cpu_kernel.unavailable_reason() is None and _cpu_kernel.load().has_bf16()


@pytest.mark.parametrize("forced", [None, "fp32"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 300, 600, 64), (1, 3, 1, 270, 130, 17)], ids=["gqa", "odd-dim"])
@pytest.mark.parametrize("mask", MASKS)
def test_bf16_native_and_forced_fallback_match_float64(monkeypatch, forced, shape, mask):
    if forced:
        monkeypatch.setenv("ATTNBENCH_FUSED_CPU_ISA", forced)
    expected = "avx512_bf16" if HAS_BF16 and forced is None else "fp32"
    assert isa(torch.bfloat16) == expected and isa(torch.float16) == "fp32" and isa(torch.float32) == "fp32"
    prepared = prepare_checked("fused_cpu", Workload(*shape, dtype="bfloat16", mask=mask))
    assert prepared.check.ok, prepared.check.reason


@pytest.mark.skipif(not HAS_BF16, reason="this CPU or compiler has no AVX512-BF16")
def test_bf16_dot_products_round_like_bf16_not_like_fp32(monkeypatch):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 64).bfloat16() for _ in range(3))
    native, _ = fused_attention(q, k, v, scale=0.125)
    monkeypatch.setenv("ATTNBENCH_FUSED_CPU_ISA", "fp32")
    widened, _ = fused_attention(q, k, v, scale=0.125)
    difference = float((native.float() - widened.float()).abs().max())
    assert 0 < difference < 2e-2  # two different paths (P rounded to bf16 in one), both within bf16's tolerance


def test_unknown_isa_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_FUSED_CPU_ISA", "avx9000")
    with pytest.raises(UsageError, match="ATTNBENCH_FUSED_CPU_ISA='avx9000' is not known; allowed: auto, fp32"):
        isa(torch.bfloat16)


def test_explicit_scale_and_one_thread():
    prepared = prepare_checked("fused_cpu", Workload(1, 2, 2, 200, 200, 32, scale=0.7, mask="causal"))
    assert prepared.check.ok, prepared.check.reason
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 200, 32) for _ in range(3))
    one, _ = fused_attention(q, k, v, scale=0.3, threads=1)
    many, _ = fused_attention(q, k, v, scale=0.3, threads=3)
    assert torch.equal(one, many)  # each row is computed by one thread in a fixed order


def test_rows_that_see_no_key_are_zero():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 50, 16), torch.randn(1, 1, 20, 16), torch.randn(1, 1, 20, 16)
    out, _ = fused_attention(q, k, v, scale=0.25, mask="causal_bottom_right")
    assert torch.all(out[0, 0, :30] == 0) and torch.all(out[0, 0, 30:].abs().sum(-1) > 0)


def _tiles(seq: int, mask: str, lengths: list[int] | None = None) -> int:
    torch.manual_seed(0)
    q, k, v = (torch.randn(len(lengths or [0]), 2, seq, 64) for _ in range(3))
    lengths_tensor = None if lengths is None else torch.tensor(lengths)
    return fused_attention(q, k, v, scale=0.125, mask=mask, lengths=lengths_tensor)[1]


def _expected_tiles(lo: torch.Tensor, hi: torch.Tensor, heads: int) -> int:
    """Score entries the forward computes, by its rule, for rows seeing keys [lo, hi) ((B, Sq) each): per work
    item (block_q rows) and block of BLOCK_K keys from the item's first visible 64-key panel, each group of
    GROUP rows scores its keys from its first visible panel to its last visible key, rounded up to 16."""
    batch, seq_q = lo.shape
    uniform = uniform_rows("ranges", None, ScoreOptions(ranges=(lo, hi)))
    rows_per_item = block_q(batch * heads, seq_q, torch.get_num_threads(), uniform)
    total = 0
    for b in range(batch):
        low, high = lo[b].tolist(), hi[b].tolist()
        for i0 in range(0, seq_q, rows_per_item):
            end = min(i0 + rows_per_item, seq_q)
            seen = [r for r in range(i0, end) if low[r] < high[r]]
            if not seen:
                continue
            begin, last = min(low[r] for r in seen) // 64 * 64, max(high[r] for r in seen)
            for c0 in range(begin, last, BLOCK_K):
                for g0 in range(i0, end, GROUP):
                    group = range(g0, min(g0 + GROUP, end))
                    visible = [r for r in group if low[r] < high[r]]
                    if not visible:
                        continue
                    start = max(c0, min(low[r] for r in visible) // 64 * 64)
                    stop = min(c0 + BLOCK_K, max(high[r] for r in visible))
                    total += len(group) * -(-(stop - start) // 16) * 16 if start < stop else 0
    return heads * total


def test_causal_skips_fully_masked_key_blocks():
    seq = 4096
    full = _tiles(seq, "none")
    assert full == 2 * seq * seq  # every score of both heads, once
    causal = _tiles(seq, "causal")
    # each group of 6 rows scores keys up to its last row only (in 64-key panels): about half of them
    rows = torch.arange(seq).expand(1, seq)
    assert causal == _expected_tiles(torch.zeros_like(rows), rows + 1, heads=2)
    assert causal / full < 0.52


def test_padding_stops_at_each_length():
    assert _tiles(1024, "padding", [1024, 256]) == 2 * 1024 * (1024 + 256)


def test_working_memory_is_a_small_fraction_of_bmm():
    workload = Workload(1, 8, 8, 1024, 1024, 64)
    fused = prepare_checked("fused_cpu", workload)
    bmm = prepare_checked("bmm", workload)
    fused_mb, bmm_mb = peak_memory_mb(fused.fn, "cpu"), peak_memory_mb(bmm.fn, "cpu")
    assert bmm_mb >= 64  # the 8 × 1024² fp32 scores are 32 MiB, and the probabilities as much again
    assert fused_mb < bmm_mb / 8
    assert fused_mb * 2**20 <= contender.predicted_extra_bytes(workload)


def test_backward_memory_stays_within_its_model():
    workload = Workload(1, 4, 2, 600, 520, 50, pass_="fwd_bwd")
    prepared = prepare_checked("fused_cpu", workload)
    assert 0 < peak_memory_mb(prepared.fn, "cpu") * 2**20 <= contender.predicted_extra_bytes(workload)


def test_registered_through_the_entry_point():
    entry = registry.load()["fused_cpu"]
    assert entry.available and entry.source.startswith("entry point fused_cpu = attnbench.impls.fused_cpu:contender")
    assert entry.contender.capabilities.backward
    reason = entry.contender.unsupported_reason(Workload(1, 1, 1, 8, 8, 8, device="cuda"))
    assert reason and "device cuda" in reason


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """An empty kernel cache and no remembered build, restored afterwards."""
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path / "cache"))
    _cpu_kernel._build.cache_clear()
    yield tmp_path
    _cpu_kernel._build.cache_clear()


def test_first_use_builds_into_the_cache_then_reuses_it(fresh_build, capsys):
    kernel = _cpu_kernel.load()
    assert kernel.path.parent == fresh_build / "cache" / "kernels" and kernel.path.exists()
    folder = fresh_build / "cache" / "kernels"
    compiler = os.environ.get("CXX", "g++")
    said = f"attnbench: building fused_cpu for this CPU with {compiler}, once (cached in {folder}) …\n"
    assert capsys.readouterr().err == said  # a first run is not silent through the build
    built = kernel.path.stat().st_mtime_ns
    _cpu_kernel._build.cache_clear()
    assert _cpu_kernel.load().path == kernel.path and kernel.path.stat().st_mtime_ns == built
    assert capsys.readouterr().err == ""  # found in the cache: nothing to say


def test_missing_compiler_makes_it_unavailable_with_the_reason(fresh_build, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    reason = contender.availability()
    assert reason == "no C++ compiler: 'no-such-compiler' not found (install g++ or set $CXX)"
    with pytest.raises(_cpu_kernel.BuildError):
        contender.prepare(None, Workload(1, 1, 1, 8, 8, 8))  # type: ignore[arg-type]


def test_failing_build_makes_it_unavailable_with_the_compiler_error(fresh_build, monkeypatch):
    compiler = fresh_build / "broken-g++"
    compiler.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo broken 1.0; exit 0; }\n'
        'echo "kernel.cpp:1:1: error: this compiler is broken" >&2\nexit 1\n'
    )
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(compiler))
    reason = contender.availability() or ""
    assert reason.startswith("could not build fused_cpu (") and "error: this compiler is broken" in reason
    assert "\n" not in reason
    assert not list((fresh_build / "cache" / "kernels").glob("*.so"))  # nothing half-written left behind
    assert os.environ["CXX"] == str(compiler)


def test_lengths_of_any_integer_type_and_mismatched_shapes():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 30, 16), torch.randn(2, 1, 40, 16), torch.randn(2, 1, 40, 16)
    wide, _ = fused_attention(q, k, v, scale=0.25, mask="padding", lengths=torch.tensor([40, 7]))
    narrow, _ = fused_attention(q, k, v, scale=0.25, mask="padding", lengths=torch.tensor([40, 7], dtype=torch.int32))
    assert torch.equal(wide, narrow)
    with pytest.raises(ValueError, match="lengths must be int64 of shape \\(2,\\)"):
        fused_attention(q, k, v, scale=0.25, mask="padding", lengths=torch.tensor([40]))
    with pytest.raises(ValueError, match="shapes don't match"):
        fused_attention(q, k[..., :8], v, scale=0.25)


def _attention64(q, k, v, scale, visible):
    """float64 softmax(q·kᵀ·scale + mask)·v with GQA by index; visible (B, 1, Sq, Sk) bool; empty rows → 0."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


# (batch, heads, kv_heads, seq_q, seq_k, head_dim, mask, lengths, splits the kernel should choose)
DECODE_CASES = [
    (1, 4, 1, 1, 3000, 128, "none", None, 5),  # one kv head: keys split 5 ways (≥ 512 keys each) and merged
    (1, 8, 2, 4, 2100, 64, "causal_bottom_right", None, 4),  # rows 0-3 see 2097-2100 keys
    (3, 4, 2, 1, 1100, 50, "padding", [1100, 333, 0], 2),  # per-sequence cache lengths, one empty
    (1, 2, 2, 16, 700, 64, "causal_bottom_right", None, 1),  # 16 rows, no split (700 keys < 2 × 512)
    (2, 32, 8, 1, 600, 96, "none", None, 1),  # B·Hkv = 16 items feed the threads: no split
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"{c[6]}-Sq{c[3]}-Sk{c[4]}-split{c[8]}")
def test_decode_splits_keys_and_matches_float64(case):
    batch, heads, kv_heads, seq_q, seq_k, head_dim, mask, lengths, splits = case
    kernel = _cpu_kernel.load()
    assert seq_q <= kernel.decode_max_rows()
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq_q, head_dim)
    k, v = torch.randn(batch, kv_heads, seq_k, head_dim), torch.randn(batch, kv_heads, seq_k, head_dim)
    padded = -(-head_dim // 16) * 16
    v_padded = torch.nn.functional.pad(v, (0, padded - head_dim))
    out, lse = torch.empty(batch, heads, seq_q, padded), torch.empty(batch, heads, seq_q)
    key_lengths = None if lengths is None else torch.tensor(lengths)
    tiles, chosen = kernel.decode(q, k, v_padded, out, lse, scale=0.1, mask=mask, lengths=key_lengths, threads=2)
    rows, keys = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    if mask == "padding":
        visible = (keys < key_lengths[:, None, None])[:, None]
    elif mask == "causal_bottom_right":
        visible = (keys <= rows + seq_k - seq_q)[None, None]
    else:
        visible = torch.ones(1, 1, seq_q, seq_k, dtype=torch.bool)
    expected = _attention64(q, k, v, 0.1, visible)
    assert chosen == splits
    assert (out[..., :head_dim].double() - expected).abs().max() < 1e-5
    assert tiles == int(visible.expand(batch, 1, seq_q, seq_k).sum()) * heads  # every visible score, once
    scores = (q.double() @ k.double().repeat_interleave(heads // kv_heads, 1).transpose(-1, -2) * 0.1).masked_fill(
        ~visible, float("-inf")
    )
    assert torch.allclose(lse.double(), torch.logsumexp(scores, -1), atol=1e-5)  # -inf for the empty sequence


@pytest.mark.parametrize("mask", ["padding", "causal_bottom_right"])
def test_decode_shapes_through_the_harness_forward_and_backward(mask):
    for pass_ in ("fwd", "fwd_bwd"):
        prepared = prepare_checked("fused_cpu", Workload(2, 8, 2, 4, 1300, 64, mask=mask, pass_=pass_))
        assert prepared.ok, prepared.reason


def _key_ranges(kind: str, batch: int, seq_q: int, seq_k: int, window: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), each (B, Sq) int64: a causal sliding window, or documents (batch element b cut at its own
    boundaries, each row seeing its document from the start up to itself)."""
    rows, offset = torch.arange(seq_q), seq_k - seq_q
    if kind == "window":
        lo, hi = (rows + offset - window + 1).clamp(min=0), (rows + offset + 1).clamp(0, seq_k)
        return lo.expand(batch, seq_q).contiguous(), hi.expand(batch, seq_q).contiguous()
    starts = []
    for b in range(batch):  # documents of 70 + 40·b tokens
        length = 70 + 40 * b
        starts.append(rows // length * length)
    lo = torch.stack(starts)
    return lo, (rows + 1).expand(batch, seq_q).contiguous()


def _modified64(q, k, v, scale, lo, hi, softcap=None, slopes=None):
    """float64 attention with per-row key ranges [lo, hi), softcap then ALiBi on the scaled scores."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    seq_q, seq_k = q.shape[2], k.shape[2]
    rows, keys = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    if slopes is not None:
        scores = scores - slopes.double()[None, :, None, None] * (rows + seq_k - seq_q - keys).abs()
    visible = (keys >= lo[:, None, :, None]) & (keys < hi[:, None, :, None])
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0) @ v


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["window", "document"])
@pytest.mark.parametrize("modifier", ["none", "softcap", "alibi", "both"])
def test_key_ranges_softcap_and_alibi_match_float64(dtype, kind, modifier):
    batch, heads, kv_heads, seq_q, seq_k, head_dim = 2, 4, 2, 300, 300 if kind == "document" else 620, 64
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq_q, head_dim).to(getattr(torch, dtype))
    k, v = (torch.randn(batch, kv_heads, seq_k, head_dim).to(getattr(torch, dtype)) for _ in range(2))
    lo, hi = _key_ranges(kind, batch, seq_q, seq_k)
    softcap = 2.0 if modifier in ("softcap", "both") else None
    slopes = 2.0 ** (-8.0 * (torch.arange(heads) + 1) / heads) if modifier in ("alibi", "both") else None
    options = ScoreOptions(ranges=(lo, hi), softcap=softcap, alibi=slopes)
    out, _ = fused_attention(q, k, v, scale=0.3, mask="ranges", options=options)
    expected = _modified64(q, k, v, 0.3, lo, hi, softcap, slopes)
    tolerance = 1e-5 if dtype == "float32" else 2.4e-2
    assert (out.double() - expected).abs().max() < tolerance


def test_window_work_is_proportional_to_the_window_not_the_sequence():
    seq, window, heads = 2048, 256, 2
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, seq, 64) for _ in range(3))
    lo, hi = _key_ranges("window", 1, seq, seq, window)
    _, tiles = fused_attention(q, k, v, scale=0.125, mask="ranges", options=ScoreOptions(ranges=(lo, hi)))
    assert tiles == _expected_tiles(lo, hi, heads)
    assert tiles <= heads * seq * (window + 64 + 16)  # per row: the window and a panel either side, not seq


def test_options_are_forward_only_and_checked():
    q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
    with pytest.raises(NotImplementedError, match="backward takes key ranges, but no softcap or ALiBi yet"):
        fused_attention(q, k, v, scale=0.25, options=ScoreOptions(softcap=5.0))
    with torch.no_grad(), pytest.raises(ValueError, match="key ranges must be contiguous int64 of shape \\(1, 40\\)"):
        fused_attention(q, k, v, scale=0.25, mask="ranges", options=ScoreOptions(ranges=(torch.zeros(40),) * 2))


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "seq_q", "page_size", "max_pages", "head_dim"),
    [(2, 8, 2, 1, 16, 40, 64), (1, 4, 1, 4, 32, 50, 50), (3, 2, 2, 16, 16, 5, 16)],
)
def test_paged_decode_reads_pages_in_place_and_matches_float64(
    batch, heads, kv_heads, seq_q, page_size, max_pages, head_dim
):
    torch.manual_seed(0)
    num_pages = batch * max_pages + 3
    k_pages, v_pages = (torch.randn(num_pages, kv_heads, page_size, head_dim) for _ in range(2))
    page_table = torch.randperm(num_pages)[: batch * max_pages].view(batch, max_pages).to(torch.int32)
    seq_k = max_pages * page_size
    lengths = torch.tensor([seq_k, seq_k // 2 + 5, 7][:batch])
    q = torch.randn(batch, heads, seq_q, head_dim)
    out, tiles = paged_decode(q, k_pages, v_pages, page_table, lengths, scale=0.2)
    # the same cache laid out contiguously, (B, Hkv, Sk, D), for the float64 formula
    k, v = (
        pages[page_table.long()].transpose(1, 2).reshape(batch, kv_heads, seq_k, head_dim)
        for pages in (k_pages, v_pages)
    )
    visible = (torch.arange(seq_k)[None, :] < lengths[:, None])[:, None, None, :].expand(batch, 1, seq_q, seq_k)
    assert (out.double() - _attention64(q, k, v, 0.2, visible)).abs().max() < 1e-5
    assert tiles == int(lengths.sum()) * heads * seq_q


@pytest.mark.parametrize("kind", ["window", "document"])
def test_key_ranges_gradients_match_float64(kind):
    batch, heads, kv_heads, seq_q, seq_k, head_dim = 2, 4, 2, 300, 300 if kind == "document" else 620, 50
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq_q, head_dim, requires_grad=True)
    k, v = (torch.randn(batch, kv_heads, seq_k, head_dim, requires_grad=True) for _ in range(2))
    lo, hi = _key_ranges(kind, batch, seq_q, seq_k)
    out, _ = fused_attention(q, k, v, scale=0.3, mask="ranges", options=ScoreOptions(ranges=(lo, hi)))
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(_modified64(*leaves64, 0.3, lo, hi), leaves64, upstream.double())
    for got, want in zip(grads, expected, strict=True):
        assert (got.double() - want).abs().max() / want.abs().max() < 1e-5


def test_uniform_sequences_stay_whole_items_where_the_threads_share_them_evenly():
    """MLA's 128 folded heads at B4 on 2 threads: one item a sequence (its keys packed and read once), not
    66 + 62 rows; per-sequence lengths (uneven costs) keep the finer split that balances the threads."""
    assert block_q(4, 128, 2, uniform=True) == 128
    assert block_q(4, 128, 2) == 66
    assert block_q(3, 128, 2, uniform=True) == 48  # 3 sequences cannot split evenly over 2 threads
    assert block_q(8, 4096, 2, uniform=True) == min(4096, BLOCK_Q)
    same = torch.tensor([[0, 0], [0, 0]]), torch.tensor([[5, 9], [5, 9]])
    differ = same[0], torch.tensor([[5, 9], [5, 8]])
    assert uniform_rows("ranges", None, ScoreOptions(ranges=same))
    assert not uniform_rows("ranges", None, ScoreOptions(ranges=differ))
    assert not uniform_rows("padding", torch.tensor([3, 4]), None)
    assert uniform_rows("causal", None, None)
