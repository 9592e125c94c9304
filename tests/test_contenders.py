"""Every built-in contender that can run here agrees with the float64 reference on small shapes."""

import sys

import pytest

from attnbench.contenders import registry
from attnbench.runner.cases import RunOptions, not_runnable, prepare_checked, run_case
from attnbench.workload import Workload

from conftest import CHECKED

BUILTINS = [
    "naive",
    "bmm",
    "einsum",
    "sdpa_math",
    "sdpa_flash",
    "sdpa_efficient",
    "sdpa_cudnn",
    "xformers",
    "flex",
    "fused_cpu",
]
CPU_RUNNABLE = ["naive", "bmm", "einsum", "sdpa_math", "sdpa_flash", "flex", "fused_cpu"]
SHAPES = [  # (batch, heads, kv_heads, seq_q, seq_k, head_dim): plain, GQA + Sq<Sk, MQA + Sq>Sk + odd head_dim
    (1, 2, 2, 33, 33, 16),
    (2, 4, 2, 17, 40, 32),
    (3, 4, 1, 40, 17, 24),
]


def test_every_builtin_is_registered_through_the_entry_point_group():
    entries = registry.load()
    for name in BUILTINS:
        assert name in entries
        assert entries[name].source.startswith(f"entry point {name} = attnbench.impls.")


MASKS = ["none", "causal", "causal_bottom_right", "padding"]
# flex compiles each case afresh (about 5 s on CPU): on the square plain shape its three masks other than none are
# the ones the other two shapes check where they differ (Sq < Sk and Sq > Sk, GQA), so flex skips them there
COMBOS = [
    pytest.param(shape, mask, impl, id=f"{shape_id}-{mask}-{impl}")
    for shape, shape_id in zip(SHAPES, ["plain", "gqa-cross", "mqa-more-queries"], strict=True)
    for mask in MASKS
    for impl in CPU_RUNNABLE
    if not (impl == "flex" and shape_id == "plain" and mask != "none")
]


@pytest.mark.parametrize(("shape", "mask", "impl"), COMBOS)
def test_contender_matches_reference(impl, mask, shape):
    workload = Workload(*shape, dtype="float32", device="cpu", mask=mask)
    assert not_runnable(impl, workload) is None
    prepared = prepare_checked(impl, workload)
    assert prepared.check.ok, prepared.check.reason
    assert prepared.check.max_abs_err < 1e-5


@pytest.mark.parametrize("impl", ["bmm", "sdpa_math", "sdpa_flash"])
def test_bf16_contenders_within_tolerance(impl):
    prepared = prepare_checked(impl, Workload(1, 4, 2, 64, 96, 64, dtype="bfloat16", mask="causal"))
    assert prepared.check.ok, prepared.check.reason


def test_explicit_scale_is_honoured():
    workload = Workload(1, 2, 2, 8, 8, 4, scale=1.0)
    for impl in CPU_RUNNABLE:
        prepared = prepare_checked(impl, workload)
        assert prepared.check.ok, (impl, prepared.check.reason)


@pytest.mark.parametrize("impl", ["sdpa_efficient", "sdpa_cudnn"])
def test_cuda_only_sdpa_backends_say_why_on_cpu(impl, monkeypatch):
    entry = registry.load()[impl]
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert not entry.available
    assert "CUDA-only backend" in (entry.unavailable_reason or "")


def test_xformers_unavailable_without_cuda_names_the_reason(monkeypatch):
    import importlib.metadata

    from attnbench.impls.xformers import contender

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert (
        contender.availability().startswith("xformers is not installed; it runs on CUDA")
        and "matching pair" in contender.availability()
    )
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.35")
    monkeypatch.setattr("attnbench.impls.xformers.built_for", lambda: None)  # its build's torch: test_xformers_pair
    assert contender.availability() == (
        "xformers 0.0.35 has no CPU operator for memory_efficient_attention; it needs CUDA"
    )
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "xformers", None)  # on a CUDA machine the import decides
    assert "xformers is not installed or failed to import" in contender.availability()


def test_installed_xformers_without_cuda_says_it_has_no_cpu_operator():
    import torch

    pytest.importorskip("xformers")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    entry = registry.load()["xformers"]
    assert not entry.available
    reason = entry.unavailable_reason or ""
    assert "has no CPU operator for memory_efficient_attention; it needs CUDA" in reason


def test_naive_is_cpu_only():
    row = run_case("naive", Workload(1, 1, 1, 4, 4, 4, device="cuda"), RunOptions())
    assert row["status"] == "unsupported" and "device cuda not supported" in row["reason"]


def test_flex_first_call_carries_the_compile():
    prepared = prepare_checked("flex", Workload(1, 2, 2, 64, 64, 16, mask="causal"))
    assert prepared.check.ok
    import time

    start = time.perf_counter()
    prepared.fn()
    steady_ms = (time.perf_counter() - start) * 1e3
    assert prepared.first_call_ms > 10 * steady_ms


@pytest.mark.slow
def test_masks_cross_and_gqa_sweep_has_no_error_rows(cli, tmp_path):
    out = tmp_path / "run"
    args = [
        "--mask",
        "none,causal,causal_bottom_right,padding",
        "--seq",
        "48",
        "--seq-kv",
        "72",
        "--batch",  # with every axis of quick's two sweeps given, they are one: 4 workloads, not 8
        "2",
        "--heads",
        "8",
        "--kv-heads",
        "2",
        "--head-dim",
        "50",
        "--budget-s",
        "0.02",
        "--no-memory",
    ]
    code, _, _ = cli("run", "--isolate", "none", *args, "--out", str(out))
    assert code == 0
    import pandas as pd

    frame = pd.read_parquet(out / "results.parquet")
    assert set(frame.status) <= {*CHECKED, "unsupported", "unavailable"}, frame[frame.status == "error"].reason.tolist()
    assert (frame[frame.status != "ok"].reason.str.len() > 0).all()
    ok = frame[frame.status.isin(CHECKED)]
    assert {"naive", "bmm", "einsum", "sdpa_math", "sdpa_flash", "flex"} <= set(ok.impl)
    assert (ok.max_abs_err <= ok.atol).all()


def test_float64_runs_in_the_plain_torch_contenders():
    """`--dtype float64` is offered, so the contenders made of plain torch ops run it (and pass the gate)."""
    for impl in ("bmm", "einsum", "naive"):
        row = run_case(
            impl,
            Workload(1, 2, 2, 33, 40, 16, "float64", mask="causal"),
            RunOptions(budget_s=0.02, measure_memory=False),
        )
        assert row["status"] in ("ok", "stalled") and row["max_abs_err"] <= row["atol"], row
