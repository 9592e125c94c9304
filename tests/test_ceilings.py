"""Hardware ceilings: the FMA/dot-product and triad kernels, their fallbacks, GPU datasheets, pct_of_peak."""

import json

import pandas as pd
import pytest
import torch

from attnbench.errors import UsageError
from attnbench.measure import _hardware as hardware
from attnbench.measure._ceilings import CACHE_VERSION, cache_dir, load_ceilings
from attnbench.measure._datasheet import lookup
from attnbench.measure.native_build import BuildError, cpu_flags, load_library
from attnbench.runner._noise import result_warnings
from attnbench.runner.cases import RunOptions, run_case
from attnbench.workload import Workload

FLAGS = cpu_flags()
try:
    hardware.load()
    NO_COMPILER = None
except BuildError as exc:
    NO_COMPILER = str(exc)
needs_compiler = pytest.mark.skipif(NO_COMPILER is not None, reason=f"kernels can't be built here: {NO_COMPILER}")


@pytest.fixture
def quick(monkeypatch):
    """Kernels timed for a few hundredths of a second and a small triad: the figures are rough, fast."""
    monkeypatch.setattr(hardware, "MEASURE_S", 0.02)
    monkeypatch.setattr(hardware, "MIN_CALLS", 3)
    monkeypatch.setattr(hardware, "TRIAD_REPEATS", 2)
    monkeypatch.setattr(hardware, "triad_array_bytes", lambda: 2**22)
    monkeypatch.delenv(hardware.ISA_ENV, raising=False)


def _expected_fp32() -> str:
    if "avx512f" in FLAGS:
        return "avx512f fma fp32 (16 lanes"
    if {"avx2", "fma"} <= FLAGS:
        return "avx2 fma fp32 (8 lanes"
    return "generic c++ fp32"


@needs_compiler
def test_fp32_fma_rate_is_sane_and_names_this_cpus_instructions(quick):
    found = hardware.compute_tflops(["float32", "bfloat16", "float64"], 1)
    rate, isa = found["float32"]
    assert 1e-3 < rate < 10  # 1 GFLOP/s … 10 TFLOP/s on one thread
    assert isa.startswith(_expected_fp32()) and "1 thread" in isa
    bf16_rate, bf16_isa = found["bfloat16"]
    if "avx512_bf16" in FLAGS:
        assert bf16_isa.startswith("avx512_bf16 vdpbf16ps") and 1e-3 < bf16_rate < 20
    else:
        assert bf16_isa.startswith(_expected_fp32()) and "the fp32 rate: no avx512_bf16 on this CPU" in bf16_isa
        assert bf16_rate == rate
    fp64_rate, fp64_isa = found["float64"]
    assert "fp64" in fp64_isa and 1e-4 < fp64_rate < 10


def test_half_precision_kernel_is_chosen_from_the_cpu_flags():
    every = set(hardware.KERNELS)
    sapphire = frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"})
    zen4 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})
    older = frozenset({"avx2", "fma", "avx512f"})
    assert hardware.choose_kernel("bfloat16", zen4, "avx512_fp16", every) == ("avx512_bf16", "")
    assert hardware.choose_kernel("float16", sapphire, "avx512_fp16", every) == ("avx512_fp16", "")
    assert hardware.choose_kernel("float16", zen4, "avx512_fp16", every) == (
        "avx512_f32",
        "the fp32 rate: no avx512_fp16 on this CPU",
    )
    assert hardware.choose_kernel("bfloat16", older, "avx512_fp16", every) == (
        "avx512_f32",
        "the fp32 rate: no avx512_bf16 on this CPU",
    )
    assert hardware.choose_kernel("bfloat16", zen4, "avx2", every) == (
        "avx2_f32",
        "the fp32 rate: ATTNBENCH_CPU_ISA=avx2",
    )
    assert hardware.choose_kernel("bfloat16", zen4, "avx512_fp16", every - {"avx512_bf16"}) == (
        "avx512_f32",
        "the fp32 rate: the compiler has no avx512_bf16",
    )
    assert hardware.choose_kernel("float32", frozenset(), "avx512_fp16", every) == ("generic_f32", "")
    assert hardware.choose_kernel("float64", older, "generic", every) == ("generic_f64", "")


@needs_compiler
@pytest.mark.skipif(not {"avx2", "fma"} <= FLAGS, reason="needs AVX2")
def test_forced_fallback_takes_the_fp32_rate_and_says_so(quick, monkeypatch):
    monkeypatch.setenv(hardware.ISA_ENV, "avx2")
    found = hardware.compute_tflops(["float32", "bfloat16"], 1)
    assert found["float32"][1].startswith("avx2 fma fp32 (8 lanes")
    assert found["bfloat16"][0] == found["float32"][0]  # the same measurement
    assert found["bfloat16"][1].endswith("; the fp32 rate: ATTNBENCH_CPU_ISA=avx2")


def test_unknown_isa_cap_is_a_usage_error(cli, monkeypatch):
    monkeypatch.setenv(hardware.ISA_ENV, "avx1024")
    with pytest.raises(UsageError, match="ATTNBENCH_CPU_ISA='avx1024' is not known; allowed: generic, avx2"):
        hardware.isa_cap()
    code, out, err = cli("env")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "attnbench: error: ATTNBENCH_CPU_ISA='avx1024' is not known; allowed: "
        "generic, avx2, avx512, avx512_bf16, avx512_fp16"
    ]


@needs_compiler
def test_triad_bandwidth(quick):
    (gbps, method), _ = hardware.streams_gbps(2, array_bytes=2**22)
    assert gbps > 0.1
    assert method.startswith("triad a = b + s·c, 3 × 4 MiB float32, 12 B/element (no write-allocate), 2 threads")
    assert hardware.triad_array_bytes.__name__ == "<lambda>"  # the fixture's; the real one:
    assert hardware.last_level_cache_bytes() > 0


def test_triad_arrays_dwarf_the_last_level_cache():
    assert hardware.triad_array_bytes() >= max(hardware.MIN_TRIAD_ARRAY_BYTES, 4 * hardware.last_level_cache_bytes())


def test_no_compiler_falls_back_to_the_library_rates_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setattr("attnbench.measure._ceilings.MATMUL_N", {"cpu": 256, "cuda": 256})
    monkeypatch.setattr("attnbench.measure._ceilings.COPY_BYTES", {"cpu": 2**22, "cuda": 2**22})
    with pytest.raises(BuildError, match="no C\\+\\+ compiler: '/nonexistent/c\\+\\+' not found"):
        load_library("hardware_kernels", hardware.SOURCE)
    c = load_ceilings("cpu", ["float32"], 1)
    assert c.roof_tflops["float32"] == c.matmul_tflops["float32"] > 0
    assert (
        c.roof_source["float32"] == "fallback: matmul (no C++ compiler: '/nonexistent/c++' not found "
        "(install g++ or set $CXX))"
    )
    assert c.roof_gbps == c.copy_gbps > 0 and c.bandwidth_source.startswith("fallback: copy (no C++ compiler")
    assert c.kernel_tflops == {} and c.triad_gbps is None


@needs_compiler
def test_an_isa_cap_has_its_own_cache_entry(quick, monkeypatch):
    monkeypatch.setattr("attnbench.measure._ceilings.MATMUL_N", {"cpu": 64, "cuda": 64})
    monkeypatch.setattr("attnbench.measure._ceilings.COPY_BYTES", {"cpu": 2**20, "cuda": 2**20})
    monkeypatch.setenv(hardware.ISA_ENV, "generic")
    capped = load_ceilings("cpu", ["bfloat16"], 1)
    assert capped.roof_source["bfloat16"].startswith(("measured fma kernel: generic c++ fp32", "measured matmul"))
    assert "ATTNBENCH_CPU_ISA=generic" in capped.roof_source["bfloat16"]
    keys = json.loads((cache_dir() / "ceilings.json").read_text())
    assert [
        key
        for key in keys
        if key.startswith("cpu|")
        and key.endswith("|threads=1|torch=" + torch.__version__ + f"|v{CACHE_VERSION}|isa=generic")
    ]


@needs_compiler
def test_real_rows_stay_under_the_hardware_roof(quick, monkeypatch):
    monkeypatch.setattr(hardware, "MEASURE_S", 0.2)  # a roof measured too briefly could be low
    ceilings = load_ceilings("cpu", ["float32"], 2)
    assert ceilings.roof_source["float32"].startswith(("measured fma kernel: ", "measured matmul: faster"))
    options = RunOptions(budget_s=0.05, threads=2, ceilings={"cpu": ceilings}, measure_memory=False)
    for impl in ("bmm", "fused_cpu"):
        row = run_case(impl, Workload(1, 4, 4, 256, 256, 64), options)
        if row["status"] == "unavailable":
            continue
        # a shared VM may stall a repeat ("threads waited for a core"): the row is timed all the same
        assert row["status"] in ("ok", "stalled"), row["reason"]
        assert 0 < row["pct_of_peak"] <= 100, (impl, row["pct_of_peak"])
        assert row["pct_of_peak"] <= row["pct_of_matmul"]  # the hardware roof is at least the library's


def test_a_row_over_the_hardware_roof_is_named_in_the_warnings():
    case = dict(
        device="cpu",
        dtype="float32",
        batch=1,
        heads=8,
        kv_heads=8,
        seq_q=4096,
        seq_k=4096,
        head_dim=64,
        mask="causal",
        **{"pass": "fwd"},
    )
    frame = pd.DataFrame(
        [
            {"impl": "fused_cpu", "status": "ok", "unstable": False, "n_samples": 20, "pct_of_peak": 131.0, **case},
            {"impl": "bmm", "status": "ok", "unstable": False, "n_samples": 20, "pct_of_peak": 40.0, **case},
            {"impl": "naive", "status": "error", "unstable": None, "n_samples": None, "pct_of_peak": None, **case},
        ]
    )
    (warning,) = [w for w in result_warnings(frame) if "hardware roof" in w]
    assert warning == (
        "1 row(s) above 100 % of the hardware roof (pct_of_peak), a measurement defect: "
        "fused_cpu at cpu float32 B1 H8 S4096 D64 causal fwd (131 %)"
    )


def test_a_memory_bound_row_over_the_roof_from_cache_is_said_apart_from_a_defect():
    """models-cpu's decode steps over 1k keys (16 MiB of K and V, in a 32 MiB L3) ran at 120–184 % of the DRAM
    roof and were called a measurement defect: their warm calls read the cache. Such a row is cache_resident and
    warned of on its own; a compute-bound row or one whose bytes exceed the cache is not."""
    from attnbench.measure._ceilings import Ceilings

    ceilings = Ceilings("cpu", "test", 2, "x", roof_tflops={"float32": 1.0}, roof_gbps=50.0, cache_bytes=32 * 2**20)
    assert ceilings.cache_resident(16 * 2**20, "float32", 1.0)
    assert not ceilings.cache_resident(64 * 2**20, "float32", 1.0)  # larger than the cache: memory
    assert not ceilings.cache_resident(16 * 2**20, "float32", 100.0)  # compute-bound: the FMA roof bounds it
    case = dict(device="cpu", dtype="float32", batch=2, heads=32, kv_heads=8, seq_q=1, seq_k=1024, head_dim=128)
    case.update(mask="causal_bottom_right", **{"pass": "fwd"})
    ok = {"status": "ok", "unstable": False, "n_samples": 20, **case}
    frame = pd.DataFrame(
        [
            {"impl": "fused_cpu", "pct_of_peak": 141.0, "cache_resident": True, **ok},
            {"impl": "bmm", "pct_of_peak": 120.0, "cache_resident": False, **ok},
        ]
    )
    warnings = result_warnings(frame)
    (defect,) = [w for w in warnings if "measurement defect" in w]
    (cached,) = [w for w in warnings if "cache_resident" in w]
    assert "bmm at" in defect and "fused_cpu" not in defect
    assert cached.startswith("1 memory-bound row(s) above 100 % of the bandwidth roof") and cached.endswith(
        ": fused_cpu"
    )


def test_a_cache_resident_row_is_judged_by_its_cold_median_too():
    """A row that reads its bytes from the cache warm says what it reads from memory (its cold median, the
    caches flushed before each call); one above the roof even cold is a defect no cache explains."""
    case = dict(device="cpu", dtype="float32", batch=2, heads=32, kv_heads=8, seq_q=1, seq_k=1024, head_dim=128)
    case.update(mask="causal_bottom_right", **{"pass": "fwd"})
    ok = {"status": "ok", "unstable": False, "n_samples": 20, "iqr_ms": 0.01, "cache_resident": True, **case}
    frame = pd.DataFrame(
        [
            {"impl": "fused_cpu", "pct_of_peak": 150.0, "median_ms": 0.2, "cold_median_ms": 0.4, **ok},
            {"impl": "bmm", "pct_of_peak": 120.0, "median_ms": 0.2, "cold_median_ms": 0.3, **ok},
            {"impl": "einsum", "pct_of_peak": 180.0, "median_ms": 0.2, "cold_median_ms": 0.21, **ok},
        ]
    )
    warnings = result_warnings(frame)
    (defect,) = [w for w in warnings if "measurement defect" in w]
    (cached,) = [w for w in warnings if "cache_resident" in w]
    assert "einsum at" in defect and "(180 %)" in defect and "bmm" not in defect
    assert cached.startswith("2 memory-bound row(s)")
    assert "(with the caches flushed before each call, cold_median_ms: 75–80 % of the roof)" in cached


def test_datasheet_lookup_by_device_name():
    assert lookup("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert lookup("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert lookup("NVIDIA H100 NVL").name == "H100 NVL"
    assert lookup("NVIDIA H200").name == "H200 SXM"
    assert lookup("NVIDIA A100-SXM4-40GB").name == "A100 SXM 40GB"
    assert lookup("NVIDIA A100-SXM4-80GB").name == "A100 SXM 80GB"
    assert lookup("NVIDIA A100 80GB PCIe").name == "A100 PCIe 80GB"
    assert lookup("NVIDIA A100-PCIE-40GB").name == "A100 PCIe 40GB"
    assert lookup("NVIDIA L40S").name == "L40S" and lookup("NVIDIA L4").name == "L4"
    assert lookup("NVIDIA GeForce RTX 4090").name == "RTX 4090"
    assert lookup("AMD Instinct MI300X").name == "MI300X"
    assert lookup("NVIDIA GH200 480GB") is None and lookup("NVIDIA A10G") is None and lookup("Mystery GPU") is None
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert h100.tflops["bfloat16"] == 989.4 and h100.gbps == 3350  # dense, not the sparsity figure


def _fake_gpu(monkeypatch, tmp_path, name):
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    monkeypatch.setattr("attnbench.measure._ceilings.measure_matmul_tflops", lambda device, dtype, threads: 600.0)
    monkeypatch.setattr("attnbench.measure._ceilings.measure_copy_gbps", lambda device, threads: 2900.0)


def test_gpu_roof_is_the_datasheet_where_the_device_is_known(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch, tmp_path, "NVIDIA H100 80GB HBM3")
    c = load_ceilings("cuda", ["bfloat16", "float32"], 1)
    assert c.roof_tflops == {"bfloat16": 989.4, "float32": 494.7} and c.roof_gbps == 3350
    assert c.roof_source["bfloat16"] == "datasheet H100 SXM (dense bfloat16)"
    assert c.bandwidth_source == "datasheet H100 SXM"
    assert c.matmul_tflops == {"bfloat16": 600.0, "float32": 600.0} and c.copy_gbps == 2900.0  # both recorded
    assert c.roofline_tflops("bfloat16", 1000) == 989.4 and c.matmul_roofline_tflops("bfloat16", 1000) == 600.0
    cached = json.loads((tmp_path / "ceilings.json").read_text())
    assert next(iter(cached.values()))["roof_source"]["float32"] == "datasheet H100 SXM (dense float32)"


def test_unknown_gpu_roof_is_the_measured_rates(monkeypatch, tmp_path):
    _fake_gpu(monkeypatch, tmp_path, "Mystery GPU 9000")
    c = load_ceilings("cuda", ["float16"], 1)
    assert c.roof_tflops == {"float16": 600.0} and c.roof_gbps == 2900.0
    assert c.roof_source["float16"] == "measured matmul (device not in the datasheet table)"
    assert c.bandwidth_source == "measured copy (device not in the datasheet table)"


def test_roofline_figure_draws_the_hardware_roof_solid_and_the_library_dashed():
    from attnbench.reports.plots import Roofs, palette, roofline

    ok = pd.DataFrame(
        {
            "machine": ["m", "m"],
            "device": ["cpu", "cpu"],
            "dtype": ["float32"] * 2,
            "impl": ["bmm", "fused_cpu"],
            "intensity": [10.0, 100.0],
            "tflops": [0.05, 0.3],
        }
    )
    figure = roofline(ok, palette(["bmm", "fused_cpu"]), {("m", "cpu", "float32"): Roofs(0.48, 15.0, 0.19, 10.0)})
    lines = {line.get_label(): line.get_linestyle() for line in figure.axes[0].get_lines()}
    assert lines["hardware roof (0.48 TFLOP/s, 15 GB/s)"] == "-"
    assert lines["torch matmul (0.19 TFLOP/s) and copy"] == "--"


def test_roofline_x_axis_reaches_past_the_ridge_for_decode_points():
    """Decode's points sit near 1 FLOP/byte, far left of an H100's ridge (989 TFLOP/s over 3350 GB/s: 295); the
    x axis used to end at 4× the points, so the roof's bend and its flat part were off the panel."""
    from attnbench.reports.plots import Roofs, palette, roofline

    ok = pd.DataFrame(
        {
            "machine": ["m"],
            "device": ["cuda"],
            "dtype": ["bfloat16"],
            "impl": ["bmm"],
            "intensity": [1.0],
            "tflops": [2.0],
        }
    )
    figure = roofline(ok, palette(["bmm"]), {("m", "cuda", "bfloat16"): Roofs(989.0, 3350.0, 700.0, 3000.0)})
    low, high = figure.axes[0].get_xlim()
    assert low <= 0.25 and high >= 2 * 989e3 / 3350


def test_report_environment_block_shows_both_ceilings():
    from attnbench.reports.html import _ceilings

    meta = {
        "ceilings": {
            "cpu": {
                "matmul_tflops": {"float32": 0.19},
                "copy_gbps": 10.0,
                "roof_tflops": {"float32": 0.48},
                "roof_gbps": 15.0,
                "roof_source": {"float32": "measured fma kernel: avx512f fma fp32"},
                "bandwidth_source": "measured triad",
            }
        }
    }
    assert _ceilings(meta) == [
        {
            "device": "cpu",
            "dtype": "float32",
            "roof": "0.48",
            "roof_source": "measured fma kernel: avx512f fma fp32",
            "matmul": "0.19",
            "roof_gbps": "15",
            "bandwidth_source": "measured triad",
            "copy_gbps": "10",
            "during_run": "",
        }
    ]


def test_read_stream_bandwidth_and_the_roof_bounds_both_streams(quick):
    _, (gbps, method) = hardware.streams_gbps(2, array_bytes=2**22)
    assert gbps > 0 and method.startswith("read stream Σ a, 8 MiB float32, 4 B/element, 2 threads")
    c = load_ceilings("cpu", ["float32"], 2)
    assert c.read_gbps and c.triad_gbps and c.roof_gbps >= max(c.read_gbps, c.triad_gbps)
    assert "read stream" in c.bandwidth_source and "triad" in c.bandwidth_source  # the other one named beside


@pytest.mark.parametrize("copy_gbps", [10.0, 50.0])  # below both streams, then above both
def test_the_bandwidth_source_names_both_streams_whichever_wins(monkeypatch, copy_gbps):
    from attnbench.measure._ceilings import Ceilings, _cpu_bandwidth_roof

    streams = (30.0, "triad a = b + s·c"), (25.0, "read stream Σ a")
    monkeypatch.setattr(hardware, "streams_gbps", lambda threads: streams)
    c = Ceilings("cpu", "test cpu", 2, "0", copy_gbps=copy_gbps)
    _cpu_bandwidth_roof(c)
    assert c.roof_gbps == max(copy_gbps, 30.0)
    assert "read stream Σ a: 25 GB/s" in c.bandwidth_source and "triad a = b + s·c" in c.bandwidth_source
    assert c.bandwidth_source.startswith("measured copy" if copy_gbps > 30 else "measured triad")
