import math

import torch

from attnbench import Workload, make_inputs
from attnbench.runner.cases import prepare_checked
from attnbench.workload.check import check_grads, check_output, spans
from attnbench.workload.masks import document_lengths
from attnbench.workload.reference import (
    MAX_CHECKED_ROWS,
    checked_rows,
    reference_grads,
    reference_output,
    sample_rows,
)


def _correct(inputs):
    w = inputs.workload
    return reference_output(inputs, sample_rows(w.seq_q)).to(w.torch_dtype)


def test_correct_output_passes_and_records_error():
    inputs = make_inputs(Workload(1, 2, 2, 32, 32, 16, mask="causal"))
    result = check_output(inputs, _correct(inputs))
    assert result.ok and result.max_abs_err < 1e-6 and result.checked_rows == 32


def test_scale_divided_by_d_instead_of_sqrt_d_is_caught():
    inputs = make_inputs(Workload(1, 2, 2, 32, 32, 16))
    q, k, v = inputs.q, inputs.k, inputs.v
    wrong = torch.softmax(q @ k.transpose(-1, -2) / 16, dim=-1) @ v
    result = check_output(inputs, wrong)
    assert not result.ok and result.max_abs_err > 1e-2
    assert "over tolerance" in result.reason


def test_nan_shape_and_type_are_caught():
    inputs = make_inputs(Workload(1, 2, 2, 8, 8, 4))
    bad = _correct(inputs)
    bad[0, 0, 0, 0] = float("nan")
    assert check_output(inputs, bad).reason == "output holds NaN or inf in row 0 (1 of 8 checked), head 0 (of 2)"
    assert check_output(inputs, torch.zeros(1, 2, 8, 5)).reason == (
        "output shape (1, 2, 8, 5), expected (1, 2, 8, 4) = (batch, heads, seq_q, head_dim_v)"
    )
    # a kernel written for flash-attn's layout returns (batch, seq_q, heads, head_dim_v): told to transpose
    assert check_output(inputs, _correct(inputs).transpose(1, 2)).reason == (
        "output shape (1, 8, 2, 4), expected (1, 2, 8, 4) = (batch, heads, seq_q, head_dim_v); it is "
        "(batch, seq_q, heads, head_dim_v), flash-attn's layout: return out.transpose(1, 2)"
    )
    result = check_output(inputs, [1, 2])
    assert not result.ok and math.isinf(result.max_abs_err) and "not a tensor" in result.reason


def test_bf16_tolerance_accepts_rounding_but_not_a_wrong_mask():
    inputs = make_inputs(Workload(1, 2, 2, 64, 64, 32, dtype="bfloat16", mask="causal"))
    assert check_output(inputs, _correct(inputs)).ok
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    unmasked = torch.softmax(q @ k.transpose(-1, -2) * inputs.scale, dim=-1) @ v
    assert not check_output(inputs, unmasked.bfloat16()).ok


def test_a_wrong_output_says_which_rows_heads_and_batch_elements_are_wrong():
    """A kernel that skips the last, partial query tile (Sq = 100, 64-row tiles) is told where it is wrong: the
    rows, every head, and the worst element with its value and the reference's, not only a max error."""
    inputs = make_inputs(Workload(2, 4, 4, 100, 100, 16, mask="causal"))
    out = reference_output(inputs, torch.arange(100)).float()
    out[:, :, 64:] = 0
    reason = check_output(inputs, out).reason
    assert (
        reason.startswith("max_abs_err ") and "rtol=0.0001 (float32); wrong in rows 64–99 (36 of 100 checked)" in reason
    )
    assert "every head (4), every batch element (2); the worst at batch " in reason
    worst_row = int(reason.split(" row ")[-1].split()[0])
    assert 64 <= worst_row <= 99 and reason.split(": ")[-1].startswith("0, expected ")
    out = reference_output(inputs, torch.arange(100)).float()
    out[1, 2, [3, 7, 8, 9]] += 1  # one head of one batch element, a few rows
    reason = check_output(inputs, out).reason
    assert (
        "wrong in rows 3, 7–9 (4 of 100 checked), head 2 (of 4), batch element 1 (of 2); the worst at batch 1 head 2"
        in reason
    )


def test_where_names_the_checked_rows_when_only_some_are_checked():
    """At long sequences only some rows are checked: the rows named are the checked ones, counted as such."""
    w = Workload(1, 2, 2, 1000, 1000, 8)
    inputs = make_inputs(w)
    checked = checked_rows(w).tolist()
    out = reference_output(inputs, torch.arange(1000)).float()
    out[:, :, 500:] *= 2
    first = next(row for row in checked if row >= 500)
    wrong = sum(row >= 500 for row in checked)
    assert (
        f"wrong in rows {first}–999 ({wrong} of {len(checked)} checked), every head (2);"
        in check_output(inputs, out).reason
    )
    assert spans([1, 2, 3, 5, 9, 11, 20, 30], list(range(31))) == "1–3, 5, 9, 11, …"


def test_a_wrong_gradient_says_which_keys_are_wrong():
    """A backward that drops dk for the second 64-key block says so: dk's keys 64–99, every kv head."""
    inputs = make_inputs(Workload(1, 4, 2, 100, 100, 16), requires_grad=True)
    dq, dk, dv = (g.float() for g in reference_grads(inputs))
    dk[:, :, 64:] = 0
    check = check_grads(inputs, (dq, dk, dv))
    assert not check.ok and check.reason.startswith("dk error ")
    assert check.reason.endswith("; wrong in keys 64–99 (36 of 100), every kv head (2)")
    dq[0, 3, 10] = float("nan")
    assert check_grads(inputs, (dq, dk, dv)).reason == "dq holds NaN or inf in query row 10 (1 of 100), head 3 (of 4)"


def _attention(inputs, lo, hi, k=None, v=None):
    """float32 softmax(q·kᵀ·scale)·v with query row i seeing keys lo[i] <= j < hi[i] ((Sq,) each): a kernel's output,
    its mask given as key ranges (k and v: the ones it reads, by default the inputs')."""
    w = inputs.workload
    k, v = (inputs.k if k is None else k).float(), (inputs.v if v is None else v).float()
    group = w.heads // w.kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = inputs.q.float() @ k.transpose(-1, -2) * w.softmax_scale
    j = torch.arange(w.seq_k)
    visible = (j >= lo.view(-1, 1)) & (j < hi.view(-1, 1))
    return (torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v).to(w.torch_dtype)


def test_a_document_start_taken_for_the_previous_documents_row_is_caught():
    """A packed-documents kernel that looks up a query row's document with bucketize(right=False) gives each
    document's first row (past the first document's) the previous document's keys: a few rows of hundreds, none of
    them evenly spaced ones. The check looks at the rows at the mask's edges (reference.mask_edge_rows)."""
    w = Workload(1, 2, 2, 2000, 2000, 16, mask="document", documents=4)
    inputs = make_inputs(w)
    lengths = torch.tensor(document_lengths(2000, 4))
    ends, rows = lengths.cumsum(0), torch.arange(2000)
    starts = ends - lengths
    assert starts[1:].tolist() == [355, 995, 1165] and not {355, 995, 1165} & set(sample_rows(2000).tolist())
    right = _attention(inputs, starts.repeat_interleave(lengths), rows + 1)
    assert check_output(inputs, right).ok
    wrong = _attention(inputs, starts[torch.bucketize(rows, ends, right=False).clamp(max=3)], rows + 1)
    result = check_output(inputs, wrong)
    assert not result.ok and result.reason.startswith("max_abs_err")
    assert f"wrong in rows 355, 995, 1165 (3 of {result.checked_rows} checked)" in result.reason


def test_a_chunks_first_row_taken_for_the_previous_chunks_is_caught():
    """Llama 4's chunked mask with each row's chunk start taken from position p − 1: a chunk's first row sees the
    whole previous chunk too, one row per chunk, and evenly spaced rows miss every one of them at S 1024."""
    w = Workload(1, 2, 2, 1024, 1024, 16, mask="chunked", chunk=256)
    inputs = make_inputs(w)
    rows = torch.arange(1024)
    assert not {256, 512, 768} & set(sample_rows(1024).tolist())
    assert check_output(inputs, _attention(inputs, rows // 256 * 256, rows + 1)).ok
    result = check_output(inputs, _attention(inputs, (rows - 1).clamp(min=0) // 256 * 256, rows + 1))
    assert not result.ok and "wrong in rows 256, 512, 768 (3 of " in result.reason


def test_a_kernel_wrong_in_the_last_row_of_each_full_tile_is_caught():
    """A store off by one at a tile's last row (it gets the row above's output) in every full 64-row tile, the
    partial last tile right: at S 511 not one evenly spaced row is a tile's last; the tiles' edge rows are checked."""
    w = Workload(1, 2, 2, 511, 511, 16, dtype="bfloat16")
    inputs = make_inputs(w)
    tile_ends = list(range(63, 511, 64))
    assert not set(tile_ends) & set(sample_rows(511).tolist())
    out = reference_output(inputs, torch.arange(511)).to(torch.bfloat16)
    assert check_output(inputs, out).ok
    out[:, :, tile_ends] = out[:, :, [row - 1 for row in tile_ends]]
    result = check_output(inputs, out)
    assert not result.ok and "wrong in rows 63, 127, 191, 255, …" in result.reason


def test_checked_rows_at_most_double_the_evenly_spaced_ones():
    """The edge rows cost at most MAX_CHECKED_ROWS more: a 64k-row case of a thousand documents checks at most 512."""
    for w in (
        Workload(1, 1, 1, 65536, 65536, 8, mask="document", documents=1000),
        Workload(64, 1, 1, 4096, 4096, 8, mask="causal", lengths="uniform"),
        Workload(1, 1, 1, 16384, 16384, 8),
    ):
        rows = checked_rows(w)
        assert MAX_CHECKED_ROWS < len(rows) <= 2 * MAX_CHECKED_ROWS
        assert set(sample_rows(w.seq_q).tolist()) <= set(rows.tolist()) and torch.equal(rows, rows.unique())
    assert torch.equal(checked_rows(Workload(1, 1, 1, 256, 256, 8, mask="document", documents=9)), torch.arange(256))


def _page_late(t: torch.Tensor, page: int) -> torch.Tensor:
    """A cache read through a page table one entry late: position j from j + page, the last page from the next
    sequence's first (the pool's order)."""
    batch, heads, seq, dim = t.shape
    pool = t.transpose(0, 1).reshape(heads, batch * seq, dim).roll(-page, dims=1)
    return pool.reshape(heads, batch, seq, dim).transpose(0, 1)


def test_a_bf16_decode_reading_its_pages_one_off_is_caught_on_average():
    """Decode over 16k keys read one page late: 16 keys of each sequence lost, 16 doubled. Every bf16 element is
    within atol (outputs ≈ 0.01 there, the errors ≈ 1e-3), but each row is off by ~5 % of its size — 20× what
    rounding costs bmm's bf16 here. The rows' relative RMS error must be within rtol as well."""
    w = Workload(2, 8, 2, 1, 16384, 64, dtype="bfloat16", mask="causal_bottom_right", page_size=16)
    inputs = make_inputs(w)
    everything, nothing = torch.zeros(1, dtype=torch.long), torch.full((1,), 16384)
    right = prepare_checked("bmm", w, inputs=inputs).check
    assert right.ok and right.rms_err < 5e-3
    wrong = _attention(inputs, everything, nothing, _page_late(inputs.k, 16), _page_late(inputs.v, 16))
    result = check_output(inputs, wrong)
    assert not result.ok and result.max_abs_err < 0.5 * result.atol and result.rms_err > 1.5 * result.rtol
    assert (
        result.reason.startswith("relative RMS error ") and " over 0.024 (bfloat16); every element is" in result.reason
    )
    assert "; rows off by more than 0.024 of their size in every row checked (1), every head (8)" in result.reason
