import pytest
import torch

from attnbench import UsageError, Workload
from attnbench.workload.flops import attention_flops
from attnbench.workload.masks import dense_mask_of, padding_lengths, visible_pairs


def test_workload_defaults_and_label():
    w = Workload(2, 8, 2, 128, 256, 64, "bf16")
    assert w.dtype == "bfloat16" and w.gqa_group == 4
    assert w.softmax_scale == pytest.approx(1 / 8)
    assert w.label() == "B2 H8/2 S128x256 D64 bfloat16 cpu none fwd"
    row = w.as_row()
    assert row["pass"] == "fwd" and "pass_" not in row and row["scale"] == pytest.approx(0.125)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": 0}, "batch must be a positive integer"),
        ({"head_dim": -3}, "head_dim must be a positive integer"),
        ({"heads": 6, "kv_heads": 4}, "heads 6 is not divisible by kv_heads 4"),
        ({"dtype": "int8"}, "dtype 'int8' is not known; allowed: float32"),
        ({"device": "tpu"}, "device 'tpu' is not known; allowed: cpu, cuda"),
        ({"mask": "sliding"}, "mask 'sliding' is not known; allowed: none, causal"),
        ({"pass_": "bwd2"}, "pass 'bwd2' is not known; allowed: fwd, bwd, fwd_bwd"),
        ({"scale": 0.0}, "scale must be a positive finite number"),
    ],
)
def test_workload_rejects_bad_values(kwargs, message):
    fields = {"batch": 1, "heads": 8, "kv_heads": 8, "seq_q": 16, "seq_k": 16, "head_dim": 8, **kwargs}
    with pytest.raises(UsageError, match=message):
        Workload(**fields)


def test_padding_lengths_have_a_full_and_a_short_sequence():
    assert padding_lengths(4, 100) == [100, 75, 50, 25]
    assert padding_lengths(2, 7) == [7, 1]
    assert padding_lengths(1, 100) == [75]  # one sequence: still masks something


def dense_mask(mask: str, batch: int, seq_q: int, seq_k: int) -> torch.Tensor | None:
    return dense_mask_of(Workload(batch, 1, 1, seq_q, seq_k, 1, mask=mask), "cpu")


@pytest.mark.parametrize("mask", ["none", "causal", "causal_bottom_right", "padding"])
@pytest.mark.parametrize(("seq_q", "seq_k"), [(5, 5), (3, 8), (8, 3)])
def test_visible_pairs_match_the_dense_mask(mask, seq_q, seq_k):
    dense = dense_mask(mask, 3, seq_q, seq_k)
    expected = 3 * seq_q * seq_k if dense is None else int(dense.expand(3, 1, seq_q, seq_k).sum())
    assert visible_pairs(mask, 3, seq_q, seq_k) == expected


def test_causal_flops_with_sq_not_sk_use_exact_pair_count():
    # Top-left causal, Sq=1024 < Sk=4096: row i sees i+1 keys, so P = 1024·1025/2 (not Sq·Sk/2).
    w = Workload(1, 8, 8, 1024, 4096, 64, mask="causal")
    assert attention_flops(w) == 2 * 8 * (64 + 64) * (1024 * 1025 // 2)
    # Bottom-right: row i sees i + 3073 keys.
    w = Workload(1, 8, 8, 1024, 4096, 64, mask="causal_bottom_right")
    assert attention_flops(w) == 2 * 8 * 128 * sum(i + 3073 for i in range(1024))


def test_bottom_right_with_more_queries_than_keys_has_empty_rows():
    dense = dense_mask("causal_bottom_right", 1, 6, 4)
    assert dense is not None
    assert dense[0, 0].any(dim=-1).tolist() == [False, False, True, True, True, True]
    assert torch.equal(dense[0, 0, -1], torch.ones(4, dtype=torch.bool))
