"""`python -m attnbench.impls.fused_triton.compile_report`: fused_triton's kernels compiled for sm_90 on a machine
without a GPU, and what each tile compiled to."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from attnbench.impls.fused_triton import compile_report
from attnbench.impls.fused_triton.tiles import Tile


@pytest.mark.slow
def test_the_mla_decode_tile_is_reported_with_its_products_resources_and_copies(capsys):
    """MLA's 64-row tile over 8 warps, keys-major (``decode_kernels._decode_block``'s ``KEYS_MAJOR``): Sᵀ =
    k·qᵀ over 32 keys is below wgmma's 64 rows (mma.sync), Oᵀ += vᵀ·Pᵀ over the 512 value channels is wgmma,
    each product waited for at once; registers and stack come from the cubin, and nothing spills (rows-major,
    this tile spilled). With 2 stages every copy of a key block is waited for with none in flight (one
    buffer); with 3 the next block's copy stays in flight while this one is computed."""
    assert compile_report.main(["--case", "mla", "--tiles", "64,32,8,2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sm_90 compiles by Triton ") and lines[0].endswith(": mla")
    (line,) = lines[1:]
    assert line.split()[0] == "64,32,8,2" and " smem" in line and " reg" in line and "wait_group 0: " in line
    assert line.endswith(" | cp.async wait_group 0: 6 | 1 an SM (registers)")
    (tile, report), (_, deeper) = compile_report.report("mla", [Tile(64, 32, 8, 2), Tile(64, 32, 8, 3)])
    assert isinstance(report, compile_report.Report) and tile == Tile(64, 32, 8, 2)
    assert report.mma_sync > 0 and set(report.wgmma) == {"m64n64k16 smem"} and set(report.waits) == {0}
    assert report.shared_bytes > 64 * 576 * 2
    assert report.registers is None or 0 < report.registers <= 255
    assert report.stack_bytes in (None, 0)
    assert set(report.copy_waits) == {0}  # each loop's block waited for with no copy under way
    assert isinstance(deeper, compile_report.Report) and max(deeper.copy_waits) > 0
    assert deeper.shared_bytes - report.shared_bytes == 32 * 576 * 2  # the second buffer of a 32-key block


@pytest.mark.parametrize(
    ("registers", "warps", "shared", "held"),
    [
        (218, 8, 114944, (1, "registers")),  # MLA's 64×32×8×2: alone on its SM
        (141, 4, 38912, (3, "registers")),  # the GQA decode's 16×64×4×2
        (168, 4, 81920, (2, "shared")),  # a prefix level's 64×32×4×4
        (40, 8, 0, (6, "registers")),
        (16, 8, 0, (8, "warps")),
        (16, 1, 0, (32, "blocks")),  # small programs: the block count's cap
        (None, 4, 0, None),
    ],
)
def test_programs_an_sm_holds_follow_hoppers_limits(registers, warps, shared, held):
    assert compile_report.programs_per_sm(registers, warps, shared) == held


@pytest.mark.parametrize(
    "bad",
    [
        ["--tiles", "64,32,x,2"],
        ["--tiles", "64,32,8"],
        ["--tiles", "64,32,4,3,0,3"],
        ["--case", "dkdv", "--tiles", "64,128,8,2,0,2"],
        ["--case", "prefill"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as raised:
        compile_report.main(bad)
    assert raised.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("python -m attnbench.impls.fused_triton.compile_report: error: ")


def test_the_default_tiles_are_the_tuners_on_a_hopper_gpu():
    """Without --tiles, the candidates the tuner times on an H100/H200 (227 KiB of shared memory: Hopper's
    128×128 three-stage forward tile among them), found without compiling anything; afterwards the module is
    as before (the CPU's fallback limit)."""
    import torch

    from attnbench.impls.fused_triton import flash

    with compile_report.compiling([]):
        _, forward, name = compile_report._case("forward", 128, "none", torch.bfloat16)
        _, mla, _ = compile_report._case("mla", 128, "none", torch.bfloat16)
        _, fp8_mla, _ = compile_report._case("mla", 128, "none", torch.float8_e4m3fn)  # with its scales
    assert name == "_forward_kernel" and Tile(128, 128, 8, 3) in forward and len(forward) == 9
    assert {t.block_m for t in mla} <= {16, 32, 64} and {t.waves for t in mla} == {1, 2, 4, 8}
    assert fp8_mla == mla  # an fp8 latent cache: the same tiles, sized by q's bf16
    assert flash.max_shared_memory(torch.device("cpu")) < compile_report.HOPPER_SHARED and not flash.is_hopper(
        torch.device("cpu")
    )


@pytest.mark.slow
def test_a_shared_prefixs_level_is_compiled_on_its_own(capsys):
    """--case prefix reports the split kernel as launched for a shared prefix's level (``PREFIX``: a kv head's rows of
    every sequence in 64-row tiles), not the sequences' own level launched after it."""
    assert compile_report.main(["--case", "prefix", "--tiles", "64,64,4,2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(": prefix") and lines[1].split()[0] == "64,64,4,2"
    ((_, report),) = compile_report.report("prefix", [Tile(64, 64, 4, 2)])
    assert isinstance(report, compile_report.Report) and set(report.copy_waits) == {0}  # one buffer: none in flight
    assert report.shared_bytes >= 64 * 128 * 2 + 64 * 256 * 2  # q and one block of k and v


def test_ptxas_advisories_are_read_from_its_log_and_said_only_where_there_are_some():
    """ptxas -v's "Potential Performance Loss" codes, each once (C7514/C7515: the kernel's wgmma serialised, so a
    wait depth above 0 keeps nothing in flight after all); the report's line names them, and says nothing without."""
    log = (
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non"
        " wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage"
        " in the function '_mla_split'\nptxas info    : Used 190 registers, used 1 barriers\n"
        "ptxas info    : (C7514) Potential Performance Loss: again\n"
    )
    assert compile_report.advisories(log) == ("C7514",)
    assert compile_report.advisories("ptxas info    : Used 64 registers") == ()
    report = compile_report.Report(190, 0, 1024, {"m64n64k16 smem": 8}, 0, {0: 1, 1: 1}, {}, 8)
    assert "ptxas" not in report.line()
    assert report.line().endswith(" | 1 an SM (registers)")
    serialised = compile_report.Report(
        190, 0, 1024, {"m64n64k16 smem": 8}, 0, {1: 1}, {}, 8, advisories=("C7514", "C7515")
    )
    assert serialised.line().endswith(" | 1 an SM (registers) | ptxas: wgmma serialised (C7514, C7515)")


@pytest.mark.slow
def test_ptxas_is_asked_about_the_kernel_it_compiled():
    """Triton's own ptxas reassembles a compiled kernel's PTX with -v for its target: its log names the kernel
    (Triton 3.6's, the GPU machine's; 3.9's bundled ptxas is older than its PTX, and says nothing); the forward
    has no advisory."""
    import torch
    import triton

    ((_, report),) = compile_report.report("forward", [Tile(128, 64, 8, 3)])
    assert isinstance(report, compile_report.Report) and report.advisories == ()
    q = torch.empty(16, 16, dtype=torch.float16)
    kernel = compile_report.compile_for(_scale_kernel(), (q, q, 16), {"BLOCK": 16})
    log = compile_report._ptxas_log(kernel.asm["ptx"])
    assert "_scale" in log or not log
    if triton.__version__.startswith("3.6."):
        assert "Compiling entry function '_scale'" in log


def _scale_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _scale(x, out, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)

    return _scale


@pytest.mark.slow
@pytest.mark.parametrize(("case", "tile"), [("dkdv", "64,128,8,2"), ("dq", "128,64,8,2")])
def test_each_backward_kernel_is_compiled_alone(case, tile, capsys):
    """--case dkdv / dq compile the backward's kernel of that name with the tile forced, the preprocess and the
    other kernel skipped (launched as no-ops): one report line, wgmma products waited for; the scores (dK/dV's
    k·qᵀ over 128 keys, dQ's q·kᵀ over 64) as m64n64k16 from shared memory, the gradients' m64n128k16 with their
    first operand (P, dS) in registers."""
    assert compile_report.main(["--case", case, "--tiles", tile]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f": {case}") and len(lines) == 2 and lines[1].split()[0] == tile
    assert "m64n64k16 smem" in lines[1] and "m64n128k16 reg" in lines[1] and "wait_group 0: " in lines[1]
    assert lines[1].endswith(" an SM (registers)")


@pytest.mark.slow
def test_mlas_value_halves_compile_rows_major_on_one_warp_group(capsys):
    """A tile of ``parts`` 2 (``decode.HALF_TILES``): each program's 64 rows in one warp group (wgmma's height),
    q·kᵀ over all 576 channels and P·V over its 256 value channels both wgmma (no mma.sync, no 16-key slices
    between two groups), in the shared memory estimated: q's 576 channels and two 16-key blocks, no value buffer."""
    assert compile_report.main(["--case", "mla", "--tiles", "64,16,4,2,0,2"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.split()[0] == "64,16,4,2,0,2" and "mma.sync" not in line
    ((_, report),) = compile_report.report("mla", [Tile(64, 16, 4, 2, parts=2)])
    assert isinstance(report, compile_report.Report) and report.mma_sync == 0
    assert set(report.wgmma) == {"m64n16k16 smem", "m64n256k16 reg"}
    assert report.shared_bytes == 64 * 576 * 2 + 2 * 16 * 576 * 2
