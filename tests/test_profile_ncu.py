"""`attnbench profile --ncu` (issue 37 item 7): Nsight Compute's figures per kernel of the profiled call —
SM and DRAM throughput, tensor pipe, occupancy — read from ncu's raw CSV page, summed per kernel, joined with
torch.profiler's kernels; refused in one line where it cannot run. On CPU machines a fake `ncu` executable
stands in (it checks its arguments, runs nothing and prints a canned raw page); the last test needs a GPU."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from attnbench.runner import _ncu_profile as ncu_profile
from attnbench.runner._ncu_child import BOOTSTRAP, FAILED, ChildCase, profiled_calls
from attnbench.runner._ncu_csv import (
    COMMON_METRICS,
    DRAM,
    DURATION,
    METRICS,
    OCCUPANCY,
    SHORT_NAME_CHARS,
    SM,
    TENSOR,
    NcuOutputError,
    base_name,
    choose_metrics,
    parse_raw_csv,
    per_kernel,
    short_name,
    short_names,
)
from attnbench.runner._profiling import CaseProfile, device_kernels
from attnbench.workload import Workload

GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)"  # noqa: E501
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float *, const float *, int)"  # noqa: E501
WGMMA = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t>, true>(flash::Flash_fwd_params)"  # noqa: E501
IDENTITY = [
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
]
# ncu prints the metric columns sorted by name
COLUMNS = [DRAM[0], DURATION, TENSOR["gmma"], TENSOR["hmma"], SM[0], OCCUPANCY[0]]
UNITS = ["%", "nsecond", "%", "%", "%", "%"]


def _quote(values: list[str]) -> str:
    return ",".join('"' + v.replace('"', '""') + '"' for v in values)


def _launch(launch_id: int, name: str, values: list[str]) -> str:
    return _quote(
        [
            str(launch_id),
            "4242",
            "python3.12",
            "127.0.0.1",
            name,
            "1",
            "7",
            "(128, 1, 1)",
            "(264, 1, 1)",
            "0",
            "9.0",
            *values,
        ]
    )


# A raw page as `ncu --import R --csv --page raw --print-units base` prints it, with ncu's own lines mixed in:
# two launches of one GEMM (thousands separators), a softmax whose tensor pipes are idle and whose DRAM figure
# is n/a, a Hopper kernel on wgmma whose mma.sync pipe is n/a.
RAW_PAGE = "\n".join(
    [
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
        "==WARNING== Found outstanding GPU clock reset, trying to revert...Success.",
        _quote(IDENTITY + COLUMNS),
        _quote([""] * len(IDENTITY) + UNITS),
        _launch(0, GEMM, ["35.5", "1,500,000", "0", "62.5", "80.25", "24.9"]),
        _launch(1, SOFTMAX, ["n/a", "12,345.5", "0", "0", "12.5", "75"]),
        _launch(2, GEMM, ["45.5", "500,000", "0", "42.5", "70.25", "24.1"]),
        _launch(3, WGMMA, ["20", "2,000", "81.5", "n/a", "60", "12.5"]),
        "==PROF== Disconnected from process 4242",
    ]
)


# --- the raw page -----------------------------------------------------------------------------------------


def test_the_raw_page_gives_one_row_per_launch():
    launches = parse_raw_csv(RAW_PAGE)
    assert list(launches["id"]) == [0, 1, 2, 3]
    assert list(launches["name"]) == [GEMM, SOFTMAX, GEMM, WGMMA]  # names with commas, quoted, whole
    assert list(launches["time_ms"]) == pytest.approx([1.5, 0.0123455, 0.5, 0.002])  # "1,500,000" ns
    first = launches.iloc[0]
    assert (first.sm_pct, first.dram_pct, first.occupancy_pct) == (80.25, 35.5, 24.9)
    assert (first.tensor_pct, first.tensor_pipe) == (62.5, "hmma")
    softmax = launches.iloc[1]
    assert math.isnan(softmax.dram_pct)  # n/a is no value, not zero
    assert (softmax.tensor_pct, softmax.tensor_pipe) == (0.0, "hmma")
    assert (launches.iloc[3].tensor_pct, launches.iloc[3].tensor_pipe) == (81.5, "gmma")


def test_the_second_dram_metric_stands_in_and_time_units_convert():
    header = [*IDENTITY, DURATION, DRAM[1]]
    page = "\n".join(
        [_quote(header), _quote([""] * len(IDENTITY) + ["usecond", "%"]), _launch(7, "k(float*)", ["1,234.5", "50"])]
    )
    launches = parse_raw_csv(page)
    assert launches.iloc[0].time_ms == pytest.approx(1.2345)
    assert launches.iloc[0].dram_pct == 50.0 and math.isnan(launches.iloc[0].sm_pct)
    with pytest.raises(NcuOutputError, match="'furlong'"):
        parse_raw_csv(page.replace("usecond", "furlong"))


def test_output_without_a_header_names_ncus_error():
    text = "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n"
    with pytest.raises(NcuOutputError, match="ERR_NVGPUCTRPERM"):
        parse_raw_csv(text)


def test_launches_sum_per_kernel_with_time_weighted_percentages():
    kernels = per_kernel(parse_raw_csv(RAW_PAGE))
    assert list(kernels["name"]) == [GEMM, SOFTMAX, WGMMA]  # the longest first
    gemm = kernels.iloc[0]
    assert (gemm.launches, gemm.time_ms) == (2, pytest.approx(2.0))
    assert gemm.sm_pct == pytest.approx((80.25 * 1.5 + 70.25 * 0.5) / 2.0)
    assert gemm.tensor_pct == pytest.approx((62.5 * 1.5 + 42.5 * 0.5) / 2.0)
    assert gemm.dram_pct == pytest.approx((35.5 * 1.5 + 45.5 * 0.5) / 2.0)
    assert gemm.tensor_pipe == "hmma"
    assert math.isnan(kernels.iloc[1].dram_pct)
    assert list(kernels["kernel"]) == [
        "Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>",
        "cunn_SoftMaxForward<4, float, float, float, SoftMaxForwardEpilogue>",
        "flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, half_t>…",  # 80 characters
    ]


def test_kernel_names_are_shortened_and_kept_apart():
    assert base_name(SOFTMAX) == "cunn_SoftMaxForward" and base_name("_attn_fwd") == "_attn_fwd"
    assert base_name("void k<(int)4>(float *)") == "k"
    long = "void ns::elementwise_kernel<128, 2, " + "A" * 200 + ">(int)"
    assert len(short_name(long)) == SHORT_NAME_CHARS and short_name(long).endswith("…")
    mul = "void at::native::vectorized_elementwise_kernel<4, " + "x" * 100 + "MulFunctor<float>>(int)"
    add = mul.replace("MulFunctor", "AddFunctor")
    assert short_names([mul, add, "_attn_fwd"]) == [short_name(mul), short_name(mul) + " #2", "_attn_fwd"]


def test_the_metrics_asked_for_are_those_the_gpu_has():
    ampere = "\n".join(
        [
            "Device GA100",
            "Metric Name                    Metric Description",
            *(f"{m.split('.')[0]}   some description" for m in METRICS if "gmma" not in m),
        ]
    )
    chosen = choose_metrics(ampere)
    assert TENSOR["gmma"] not in chosen and {DURATION, SM[0], DRAM[0], TENSOR["hmma"], OCCUPANCY[0]} <= set(chosen)
    assert choose_metrics("==ERROR== unknown option") == COMMON_METRICS


# --- joining with torch.profiler ---------------------------------------------------------------------------


def _profiler_kernels(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"kernel": n, "ms_per_call": ms, "launches_per_call": k, "category": "x"} for n, ms, k in rows]
    )


def test_ncus_kernels_join_torch_profilers_by_name():
    kernels = per_kernel(parse_raw_csv(RAW_PAGE))
    spaced = SOFTMAX.replace(" *", "*")  # another demangler's spacing
    other_flash = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, half>, true>(p)"
    profiler = _profiler_kernels(
        [(GEMM, 0.9, 1.0), (spaced, 0.004, 0.5), (other_flash, 0.001, 1), ("Memcpy DtoD (Device -> Device)", 0.01, 1.0)]
    )
    joined = ncu_profile.join_kernels(kernels, profiler, calls=2).set_index("name")
    assert joined.loc[GEMM, "profiler_ms_per_call"] == 0.9
    assert joined.loc[GEMM, "ncu_ms_per_call"] == pytest.approx(1.0)  # 2 ms over 2 calls
    assert joined.loc[GEMM, "launches_per_call"] == 1.0 and joined.loc[GEMM, "category"] == "matmul"
    assert joined.loc[SOFTMAX, "profiler_name"] == spaced and joined.loc[SOFTMAX, "category"] == "softmax"
    assert joined.loc[WGMMA, "profiler_ms_per_call"] == 0.001  # one kernel of that function name on each side
    assert joined.loc[WGMMA, "category"] == "fused_attention"
    alone = ncu_profile.join_kernels(kernels, profiler[profiler.kernel != spaced], calls=2).set_index("name")
    assert math.isnan(alone.loc[SOFTMAX, "profiler_ms_per_call"]) and alone.loc[SOFTMAX, "profiler_name"] == ""
    top = pd.DataFrame(
        {
            "op": ["aten::bmm", GEMM, "cudaLaunchKernel"],
            "self_ms_per_call": [0.0, 0.9, 0.05],
            "pct": [0.0, 90.0, 5.0],
            "count_per_call": [1, 1, 3],
            "category": ["matmul", "matmul", "other"],
        }
    )
    annotated = ncu_profile.annotate_top_ops(top, joined.reset_index()).set_index("op")
    assert annotated.loc[GEMM, "sm_pct"] == pytest.approx(kernels.iloc[0].sm_pct)
    assert annotated.loc["aten::bmm", ncu_profile.NCU_COLUMNS].isna().all()
    assert len(annotated) == 3
    breakdown = pd.DataFrame(
        {"category": ["matmul", "softmax", "fused_attention", "unattributed"], "ms_per_call": [0.9, 0.1, 0.01, 0.05]}
    )
    split = ncu_profile.annotate_breakdown(breakdown, joined.reset_index()).set_index("category")
    assert split.loc["matmul", "ncu_ms_per_call"] == pytest.approx(1.0)
    assert split.loc["matmul", "tensor_pct"] == pytest.approx(kernels.iloc[0].tensor_pct)
    assert math.isnan(split.loc["softmax", "dram_pct"]) and split.loc["softmax", "occupancy_pct"] == 75.0
    assert split.loc["unattributed", ["ncu_ms_per_call", "sm_pct"]].isna().all()


def test_same_function_name_twice_is_not_guessed():
    a, b = "void k<1>(int)", "void k<2>(int)"
    assert ncu_profile.match_names([a, b], ["void k<3>(int)"]) == {}
    assert ncu_profile.match_names([a], ["void k<3>(int)", "void k<4>(int)"]) == {}
    assert ncu_profile.match_names([a, b], [b, "void k<1>(int )"]) == {b: b, a: "void k<1>(int )"}


def test_the_profilers_device_kernels_per_call():
    from torch.autograd import DeviceType

    def event(key, device, us, count):
        return SimpleNamespace(key=key, device_type=device, self_device_time_total=us, count=count)

    averages = [
        event("aten::bmm", DeviceType.CPU, 900.0, 4),
        event(GEMM, DeviceType.CUDA, 800.0, 4),
        event(SOFTMAX, DeviceType.CUDA, 1200.0, 4),
    ]
    frame = device_kernels(averages, calls=4)
    assert list(frame["kernel"]) == [SOFTMAX, GEMM]
    assert list(frame["ms_per_call"]) == [0.3, 0.2] and list(frame["launches_per_call"]) == [1.0, 1.0]
    assert list(frame["category"]) == ["softmax", "matmul"]


# --- the child process and the commands ---------------------------------------------------------------------


def test_only_the_calls_run_inside_the_profiled_range():
    events: list[str] = []
    profiled_calls(
        lambda: events.append("call"),
        3,
        lambda: events.append("sync"),
        lambda: events.append("start"),
        lambda: events.append("stop"),
    )
    assert events == ["sync", "start", "call", "call", "call", "sync", "stop"]

    def broken():
        raise RuntimeError("kernel failed")

    events.clear()
    with pytest.raises(RuntimeError):
        profiled_calls(broken, 2, lambda: None, lambda: events.append("start"), lambda: events.append("stop"))
    assert events == ["start", "stop"]


def test_the_child_makes_the_same_workload():
    workload = Workload(
        2,
        8,
        2,
        128,
        256,
        64,
        dtype="bfloat16",
        device="cuda",
        mask="sliding_window",
        window=48,
        score_mod="softcap",
        softcap=20.0,
        page_size=64,
    )
    case = ChildCase("sdpa_flash", dataclasses.asdict(workload), 3, 5, ("pkg.mod:Mine",))
    back = ChildCase.from_json(case.to_json())
    assert back == case and Workload(**back.workload) == workload


def test_the_child_says_in_one_line_why_it_cannot_run_a_case():
    import subprocess

    case = ChildCase("nosuch", dataclasses.asdict(Workload(1, 2, 2, 64, 64, 32)), 0, 2)
    done = subprocess.run(ncu_profile.child_command(case), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.startswith(FAILED + "nosuch could not be prepared: UsageError")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_ncu_command_profiles_the_range_into_a_report(tmp_path):
    case = ChildCase("bmm", {"batch": 1}, 0, 2)
    child = ncu_profile.child_command(case)
    assert child[:3] == [sys.executable, "-c", BOOTSTRAP] and json.loads(child[3]) == [str(p) for p in sys.path]
    assert ChildCase.from_json(child[4]) == case
    report = tmp_path / "bmm__case.ncu-rep"
    command = ncu_profile.profile_command("/opt/ncu", COMMON_METRICS, report, child)
    assert command[0] == "/opt/ncu" and command[-5:] == child and "--force-overwrite" in command[1:-5]
    flags = [a for a in command[1:-5] if a != "--force-overwrite"]
    options = dict(zip(flags[::2], flags[1::2], strict=True))
    assert options["--profile-from-start"] == "off" and options["--export"] == str(report)
    assert options["--metrics"].split(",") == list(COMMON_METRICS)
    assert options["--clock-control"] == "base" and options["--cache-control"] == "all"
    assert ncu_profile.import_command("ncu", report) == [
        "ncu",
        "--import",
        str(report),
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--print-kernel-base",
        "demangled",
    ]


def test_a_failed_ncu_run_is_told_in_one_line():
    child_said = f"==PROF== Connected to process 1\nTraceback …\n{FAILED}bmm is incorrect on B1: max error 3\n"
    assert ncu_profile.failure_reason(child_said, 1) == "bmm is incorrect on B1: max error 3"
    ncu_said = "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - no permission\nmore\n"
    assert ncu_profile.failure_reason(ncu_said, 1) == "==ERROR== ERR_NVGPUCTRPERM - no permission"
    assert ncu_profile.failure_reason("==PROF== x\nSegmentation fault\n", -11) == "exit code -11: Segmentation fault"


# --- through a fake ncu ----------------------------------------------------------------------------------

FAKE_NCU = """#!{python}
# A stand-in for Nsight Compute's CLI: checks what it is asked, runs nothing, answers from files.
import json, os, sys
from pathlib import Path

args, here = sys.argv[1:], Path(os.environ["FAKE_NCU_DIR"])
with (here / "calls.jsonl").open("a") as log:
    log.write(json.dumps(args) + "\\n")
if args == ["--query-metrics"]:
    print((here / "query.txt").read_text())
    sys.exit(0)
if args[0] == "--import":
    assert Path(args[1]).read_bytes() == b"report", args
    print((here / "raw.csv").read_text())
    sys.exit(0)
assert args[args.index("--profile-from-start") + 1] == "off", args
report = Path(args[args.index("--export") + 1])
app = args[args.index("--force-overwrite") + 1 :]
assert app[1] == "-c" and "attnbench.runner._ncu_child" in app[2], app
case = json.loads(app[4])
print("==PROF== Connected to process 4242 (" + app[0] + ")")
if (here / "fail").exists():
    print("{failed}" + (here / "fail").read_text(), file=sys.stderr)
    sys.exit(1)
report.write_bytes(b"report")
print("==PROF== Disconnected from process 4242")
"""


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """A fake `ncu` first on PATH; its folder (calls.jsonl: the arguments of every call)."""
    here = tmp_path / "fake-ncu"
    here.mkdir()
    script = here / "ncu"
    script.write_text(FAKE_NCU.format(python=sys.executable, failed=FAILED))
    script.chmod(0o755)
    (here / "raw.csv").write_text(RAW_PAGE)
    listed = [m.split(".")[0] for m in METRICS if "gmma" not in m]
    (here / "query.txt").write_text("Device GA100 (GA100)\n" + "\n".join(f"{m}  description" for m in listed))
    monkeypatch.setenv("FAKE_NCU_DIR", str(here))
    monkeypatch.setenv("PATH", f"{here}{os.pathsep}{os.environ['PATH']}")
    return here


def _calls(here: Path) -> list[list[str]]:
    return [json.loads(line) for line in (here / "calls.jsonl").read_text().splitlines()]


def test_a_case_through_a_fake_ncu(fake_ncu, tmp_path):
    ncu = ncu_profile.find_ncu()
    assert ncu == str(fake_ncu / "ncu")
    metrics = ncu_profile.metrics_here(ncu)
    assert TENSOR["gmma"] not in metrics and TENSOR["hmma"] in metrics  # this "GPU" has no wgmma
    workload = Workload(1, 8, 8, 1024, 1024, 64, dtype="bfloat16", device="cuda")
    profiler = _profiler_kernels([(GEMM, 0.7, 1.0), (SOFTMAX, 0.01, 1.0)])
    out = tmp_path / "prof"
    out.mkdir()
    result = ncu_profile.profile_case(ncu, metrics, "bmm", workload, out, "bmm__case", 2, 5, profiler)
    query, run, imported = _calls(fake_ncu)
    assert query == ["--query-metrics"] and run[run.index("--metrics") + 1] == ",".join(metrics)
    case = ChildCase.from_json(run[-1])
    assert (case.impl, case.seed, case.calls, Workload(**case.workload)) == ("bmm", 5, 2, workload)
    assert imported[:2] == ["--import", str(out / "bmm__case.ncu-rep")]
    assert (out / "bmm__case.ncu.csv").read_text() == RAW_PAGE + "\n"
    kernels = result.kernels.set_index("name")
    assert kernels.loc[GEMM, "ncu_ms_per_call"] == pytest.approx(1.0)
    assert kernels.loc[GEMM, "profiler_ms_per_call"] == 0.7
    text = ncu_profile.format_table(result)
    assert "ncu, per kernel per call (2 calls" in text and "cunn_SoftMaxForward<4" in text and "gmma" in text
    written = pd.read_csv(ncu_profile.write_kernels([result], out))
    assert set(written.impl) == {"bmm"} and len(written) == 3 and written.calls.eq(2).all()

    (fake_ncu / "fail").write_text("bmm could not be prepared: OutOfMemoryError: CUDA out of memory")
    with pytest.raises(ncu_profile.NcuError, match=r"^bmm could not be prepared: OutOfMemoryError"):
        ncu_profile.profile_case(ncu, metrics, "bmm", workload, out, "bmm__again", 2, 5, profiler)


# --- the command -------------------------------------------------------------------------------------------


def test_ncu_not_on_path_is_refused_before_anything_runs(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "prof"
    code, text, err = cli("profile", "--ncu", "--impl", "bmm", "--out", str(out))
    assert (code, text) == (2, "")
    assert err.strip().splitlines() == [
        "attnbench: error: profile: --ncu needs Nsight Compute's ncu on PATH (not found)"
    ]
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_ncu_without_cuda_is_refused_before_anything_runs(cli, fake_ncu, tmp_path):
    out = tmp_path / "prof"
    code, text, err = cli("profile", "--ncu", "--impl", "bmm", "--out", str(out))
    assert (code, text) == (2, "")
    assert err.strip().splitlines() == [
        "attnbench: error: profile: --ncu needs CUDA (torch.cuda.is_available() is False on this machine)"
    ]
    assert not out.exists() and not (fake_ncu / "calls.jsonl").exists()  # ncu was not even asked


def _planted_profile(impl, workload, out_dir, calls, seed, budget_s):
    """What profiling.profile_case gives on CUDA, without a GPU: one GEMM and one softmax kernel, their
    launching aten operators and the runtime call."""
    trace = out_dir / f"{impl}__planted.trace.json"
    trace.write_text("{}")
    top = pd.DataFrame(
        {
            "op": [GEMM, SOFTMAX, "aten::bmm", "cudaLaunchKernel"],
            "self_ms_per_call": [0.7, 0.01, 0.0, 0.02],
            "count_per_call": [1.0, 1.0, 2.0, 3.0],
            "pct": [70.0, 1.0, 0.0, 2.0],
            "category": ["matmul", "softmax", "matmul", "other"],
        }
    )
    breakdown = pd.DataFrame(
        {
            "category": ["matmul", "softmax"],
            "ms_per_call": [0.9, 0.1],
            "pct": [90.0, 10.0],
            "profiled_ms_per_call": [0.9, 0.1],
            "median_ms": [1.0] * 2,
            "profiled_ms": [1.0] * 2,
        }
    )
    return CaseProfile(
        impl,
        workload,
        calls,
        1.0,
        1.0,
        trace,
        top,
        breakdown,
        _profiler_kernels([(GEMM, 0.7, 1.0), (SOFTMAX, 0.01, 1.0)]),
    )


def test_the_command_shows_ncu_beside_torch_profiler(cli, fake_ncu, tmp_path, monkeypatch):
    """The command's own path with --ncu, CUDA and torch.profiler planted (this machine has neither GPU nor
    ncu): --device defaults to cuda, each case's ncu table is printed, top_ops.csv gains ncu's columns on
    the kernel rows, ncu_kernels.csv has every kernel; a case ncu fails on is one line and exit code 1."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("attnbench.runner._profiling.profile_case", _planted_profile)
    out = tmp_path / "prof"
    code, text, err = cli("profile", "--ncu", "--impl", "bmm", "--calls", "2", "--out", str(out))
    assert code == 0, err
    assert "bmm  B1 H8 S1024 D64 float32 cuda" in text and "ncu, per kernel per call (2 calls" in text
    assert "not on this GPU: " + TENSOR["gmma"] in text
    top = pd.read_csv(out / "top_ops.csv").set_index("op")
    assert top.loc[GEMM, "sm_pct"] == pytest.approx((80.25 * 1.5 + 70.25 * 0.5) / 2.0)
    assert top.loc[["aten::bmm", "cudaLaunchKernel"], "sm_pct"].isna().all()
    breakdown = pd.read_csv(out / "breakdown.csv").set_index("category")
    assert breakdown.loc["matmul", "sm_pct"] == top.loc[GEMM, "sm_pct"]
    kernels = pd.read_csv(out / "ncu_kernels.csv")
    assert list(kernels.kernel)[:2] == [short_name(GEMM), short_name(SOFTMAX)]
    assert (out / "bmm__planted.ncu-rep").is_file() and (out / "bmm__planted.ncu.csv").is_file()

    (fake_ncu / "fail").write_text("bmm is incorrect on B1: max error 3")
    code, text, err = cli("profile", "--ncu", "--impl", "bmm", "--out", str(tmp_path / "again"))
    assert code == 1 and "bmm is incorrect on B1: max error 3" in err
    assert (tmp_path / "again" / "top_ops.csv").is_file() and not (tmp_path / "again" / "ncu_kernels.csv").exists()

    code, _, err = cli("profile", "--ncu", "--impl", "bmm", "--device", "cpu", "--out", str(tmp_path / "cpu"))
    assert code == 2 and "allowed with --ncu: --device cuda" in err and not (tmp_path / "cpu").exists()


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available() or shutil.which("ncu") is None, reason="needs CUDA and Nsight Compute's ncu on PATH"
)
def test_ncu_on_a_gpu(cli, tmp_path):
    """A real GPU: SDPA's math path (a GEMM on the tensor cores, a softmax) and its flash kernel."""
    out = tmp_path / "prof"
    code, text, err = cli(
        "profile",
        "--ncu",
        "--impl",
        "sdpa_math,sdpa_flash",
        "--seq",
        "1024",
        "--dtype",
        "bfloat16",
        "--calls",
        "2",
        "--budget-s",
        "0.2",
        "--out",
        str(out),
    )
    assert code == 0, err
    kernels = pd.read_csv(out / "ncu_kernels.csv")
    assert set(kernels.impl) == {"sdpa_math", "sdpa_flash"}
    for column in ("sm_pct", "occupancy_pct", "dram_pct", "tensor_pct"):
        assert kernels[column].dropna().between(0, 100).all(), kernels[[column, "kernel"]]
    assert kernels.sm_pct.notna().all() and kernels.occupancy_pct.notna().all() and kernels.dram_pct.notna().any()
    assert (kernels.ncu_ms_per_call > 0).all() and kernels.profiler_ms_per_call.notna().mean() > 0.5
    flash = kernels[kernels.impl == "sdpa_flash"]
    assert flash.iloc[0].category == "fused_attention" and flash.iloc[0].tensor_pct > 1
    math_rows = kernels[kernels.impl == "sdpa_math"]
    assert math_rows.tensor_pct.max() > 1 and math_rows.tensor_pipe.notna().any()
    top = pd.read_csv(out / "top_ops.csv")
    assert top.sm_pct.notna().any() and "ncu, per kernel per call" in text
    breakdown = pd.read_csv(out / "breakdown.csv")
    flash_split = breakdown[breakdown.impl == "sdpa_flash"].set_index("category")
    assert flash_split.loc["fused_attention", "sm_pct"] > 0
