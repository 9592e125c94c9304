"""fused_triton's GPU-facing host side, checked without a GPU: tile pruning by the device's shared memory,
tuning once per length bucket in ``prepare``, and a timed callable that launches the chosen tile directly.

The kernels are replaced by recorders (``kernel[grid](*args, **kwargs)`` is logged, nothing runs) and the
timing of a candidate by a fake, so these tests see exactly what a CUDA machine would launch. That the
kernels compute the right thing is checked in the interpreter (tests/test_fused_triton.py) and, on a
GPU, by ``nox -s gpu_smoke``.
"""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

from attnbench.impls.fused_triton import backward_kernels as _triton_backward  # noqa: E402
from attnbench.impls.fused_triton import contender  # noqa: E402
from attnbench.impls.fused_triton import decode_kernels as _triton_decode_kernels  # noqa: E402
from attnbench.impls.fused_triton import flash as _triton_flash  # noqa: E402
from attnbench.impls.fused_triton import forward_kernels as _triton_forward  # noqa: E402
from attnbench.impls.fused_triton import smoke as _triton_smoke  # noqa: E402
from attnbench.impls.fused_triton import tiles as _triton_tiles  # noqa: E402
from attnbench.impls.fused_triton.tiles import CUDA_TILES, Tile, prune, shared_bytes  # noqa: E402
from attnbench.workload import Workload  # noqa: E402
from attnbench.workload.inputs import make_inputs  # noqa: E402

H100_SHARED, A100_SHARED = 227 * 1024, 163 * 1024


def _fwd(seq: int, head_dim: int, cap: int, dtype: torch.dtype = torch.bfloat16) -> set[Tile]:
    return set(
        prune(
            "fwd", CUDA_TILES["fwd"], seq_q=seq, seq_k=seq, head_dim=head_dim, itemsize=dtype.itemsize, shared_cap=cap
        )
    )


def test_pruning_follows_the_devices_shared_memory():
    hopper, ampere = _fwd(4096, 128, H100_SHARED), _fwd(4096, 128, A100_SHARED)
    # 128×128 with 3 stages at D128 bf16: q tile + 3 k/v stages = 2·128·(128 + 3·256) B = 224 KiB (what
    # triton.compile reports for sm_90, tests/test_fused_triton_compile.py); with 4 stages 288 KiB
    assert shared_bytes("fwd", Tile(128, 128, 8, 3), 128, 2) == 224 * 1024
    assert Tile(128, 128, 8, 3) in hopper and Tile(128, 128, 8, 3) not in ampere
    assert Tile(128, 128, 8, 4) not in hopper and Tile(128, 128, 8, 4) in _fwd(4096, 64, H100_SHARED)
    assert {Tile(128, 64, 8, 3), Tile(64, 128, 4, 2), Tile(128, 128, 8, 2)} <= hopper & ampere
    for cap, kept in ((H100_SHARED, hopper), (A100_SHARED, ampere)):
        assert all(shared_bytes("fwd", t, 128, 2) <= cap for t in kept)
        narrow = {t for t in CUDA_TILES["fwd"] if t.block_m > 16}  # 16-row tiles: split head dims only
        assert all(shared_bytes("fwd", t, 128, 2) > cap for t in narrow - kept)
    # fp32 at head dim 256: only single-stage tiles fit, and on an A100 only the smallest
    assert _fwd(4096, 256, H100_SHARED, torch.float32) == {Tile(64, 32, 4, 1), Tile(32, 16, 2, 1)}
    assert _fwd(4096, 256, A100_SHARED, torch.float32) == {Tile(32, 16, 2, 1)}
    assert {t.block_m for t in _fwd(16, 64, H100_SHARED)} == {32}  # taller tiles would be masked-out rows
    assert _fwd(4096, 64, 1024) == {Tile(32, 16, 2, 1)}  # nothing fits: the smallest tile stays
    # MLA's 576 (split 512 + 64): the 16-row tiles, and only those
    assert {t.block_m for t in _fwd(4096, 576, H100_SHARED)} == {16}
    dkdv = prune("dkdv", CUDA_TILES["dkdv"], seq_q=4096, seq_k=4096, head_dim=256, itemsize=2, shared_cap=A100_SHARED)
    assert dkdv and all(t.block_m <= 64 and shared_bytes("dkdv", t, 256, 2) <= A100_SHARED for t in dkdv)


def test_the_shared_memory_cap_is_read_from_the_device(monkeypatch):
    asked = []

    def properties(index: int) -> dict[str, int]:
        asked.append(index)
        return {"max_shared_mem": H100_SHARED}

    fake = SimpleNamespace(utils=SimpleNamespace(get_device_properties=properties))
    monkeypatch.setattr(triton.runtime.driver, "_active", fake)
    assert _triton_tiles.max_shared_memory(torch.device("cuda", 1)) == H100_SHARED and asked == [1]
    assert _triton_tiles.max_shared_memory(torch.device("cpu")) == _triton_tiles.FALLBACK_SHARED_MEMORY


def test_lengths_share_a_tuned_tile_within_a_power_of_two_bucket():
    def key(seq_q: int, seq_k: int, head_dim: int = 64) -> tuple[Any, ...]:
        q, k = torch.empty(1, 8, seq_q, head_dim), torch.empty(1, 2, seq_k, head_dim)
        return _triton_tiles.tuning_key("fwd", q, k, ("causal",), "source")

    assert [_triton_tiles.length_bucket(n) for n in (1, 100, 128, 129, 3000)] == [1, 128, 128, 256, 4096]
    assert key(100, 1000) == key(120, 600) != key(300, 1000)
    assert key(100, 1000) != key(100, 1000, head_dim=80)  # the head dim stays exact


def test_a_decode_tile_is_tuned_per_bucket_of_sequences_times_kv_heads():
    """MLA decode at B8 and B64 (one kv head) split their keys differently: each tunes its own tile; the
    forward's grid grows with the batch, so its key does not hold it."""

    def key(kernel: str, batch: int, kv_heads: int = 1) -> tuple[Any, ...]:
        q, k = torch.empty(batch, 128, 1, 576), torch.empty(batch, kv_heads, 8192, 576)
        return _triton_flash.make_plan(q, k, k[..., :512]).key(kernel, q, k)

    assert key("decode", 8) != key("decode", 64) == key("decode", 40)
    assert key("decode", 5).features[-1] == 8 and key("decode", 8, kv_heads=8).features[-1] == 64
    assert key("fwd", 8) == key("fwd", 64)
    stored = _triton_tiles.stored_key(key("decode", 8), [])["tuning"]
    assert stored["features"][-1] == 8 and set(stored) == set(_triton_tiles.TuningKey._fields)


class _Recorder:
    """Stands in for a @triton.jit kernel: ``kernel[grid](*args, **kwargs)`` is logged, nothing runs."""

    def __init__(self, name: str, log: list[tuple[str, Any, dict[str, Any]]]) -> None:
        self.name, self.log = name, log

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.log.append((self.name, grid, kwargs))


@pytest.fixture()
def mocked_gpu(monkeypatch, tmp_path):
    """Kernels replaced by recorders, the CUDA tile lists in force, candidate timing faked and counted, tiles
    kept on disk in a folder of the test's own: (launch log, list of timed tiles)."""
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    log: list[tuple[str, Any, dict[str, Any]]] = []
    timed: list[Tile] = []
    for module, names in (
        (_triton_forward, ("_forward_kernel", "_prefix_kernel")),
        (_triton_backward, ("_preprocess_kernel", "_dkdv_kernel", "_dq_kernel")),
    ):
        for name in names:
            monkeypatch.setattr(module, name, _Recorder(name, log))
    for name in ("_decode_split_kernel", "_decode_merge_kernel"):
        monkeypatch.setattr(_triton_decode_kernels, name, _Recorder(name, log))
    monkeypatch.setattr(_triton_flash, "INTERPRETED", False)
    fastest = {Tile(128, 64, 8, 3), Tile(64, 128, 8, 2), Tile(128, 64, 8, 2)}  # one per kernel

    def fake_time(launch: Any, tile: Tile) -> float:
        timed.append(tile)
        return 1.0 if tile in fastest else 2.0

    monkeypatch.setattr(_triton_tiles, "time_tile", fake_time)
    _triton_tiles.clear_cache()
    yield log, timed
    _triton_tiles.clear_cache()


def test_prepare_tunes_once_and_the_timed_call_launches_the_chosen_tile(mocked_gpu):
    log, timed = mocked_gpu
    w = Workload(2, 4, 2, 1000, 1000, 64, dtype="bfloat16", mask="causal", pass_="fwd_bwd")
    inputs = make_inputs(w, requires_grad=True)
    run = contender.prepare(inputs, w)
    plan = run.plan
    assert plan.tiles == {"fwd": Tile(128, 64, 8, 3), "dkdv": Tile(64, 128, 8, 2), "dq": Tile(128, 64, 8, 2)}
    assert len(timed) == sum(len(plan.candidates(kernel)) for kernel in ("fwd", "dkdv", "dq")) > 3

    timed.clear()
    log.clear()
    for _ in range(3):  # the timed callable of fwd_bwd
        torch.autograd.grad(run(), (inputs.q, inputs.k, inputs.v), inputs.grad_out)
    assert timed == []  # no tuning, no autotuner: straight to kernel[grid]
    assert [name for name, _, _ in log] == ["_forward_kernel", "_preprocess_kernel", "_dkdv_kernel", "_dq_kernel"] * 3
    launched = {name: (grid, kwargs) for name, grid, kwargs in log}
    for name, kernel in (("_forward_kernel", "fwd"), ("_dkdv_kernel", "dkdv"), ("_dq_kernel", "dq")):
        _, kwargs = launched[name]
        tile = plan.tiles[kernel]
        assert (kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"]) == (
            tile.block_m,
            tile.block_n,
            tile.num_warps,
            tile.num_stages,
        )
        assert kwargs["EVEN_D"] is True and kwargs["BLOCK_D"] == 64 and kwargs["CAUSAL"] is True
    # one grid axis of batch·heads·tiles (tiles fastest: a head's tiles share its k, v in L2); dK/dV per kv head
    assert launched["_forward_kernel"][0] == (2 * 4 * triton.cdiv(1000, 128),)
    assert launched["_dkdv_kernel"][0] == (2 * 2 * triton.cdiv(1000, 128),)

    # another length in the same power-of-two bucket reuses the tiles: nothing timed
    w2 = Workload(2, 4, 2, 900, 1000, 64, dtype="bfloat16", mask="causal")
    assert contender.prepare(make_inputs(w2), w2).plan.tiles["fwd"] == Tile(128, 64, 8, 3) and timed == []
    w3 = Workload(2, 4, 2, 3000, 3000, 64, dtype="bfloat16", mask="causal")
    contender.prepare(make_inputs(w3), w3)
    assert timed and {t.block_m for t in timed} == {t.block_m for t in CUDA_TILES["fwd"]} - {16}  # 16: split D only


@pytest.mark.parametrize(
    "w",
    [
        Workload(2, 4, 2, 1000, 1000, 64, dtype="bfloat16", mask="causal", pass_="fwd_bwd"),
        Workload(4, 8, 2, 1, 600, 128, dtype="bfloat16", mask="causal_bottom_right", shared_prefix=400),
    ],
    ids=["fwd_bwd", "shared prefix"],
)
def test_a_new_process_prepares_from_the_disk_without_launching(mocked_gpu, w):
    """The tiles tuned in one worker are on disk: the next worker's prepare (an empty memory) times nothing
    and launches nothing, so its setup_ms is a few file reads; its timed call launches the same tiles."""
    log, timed = mocked_gpu
    first = dict(contender.prepare(make_inputs(w, requires_grad=w.pass_ != "fwd"), w).plan.tiles)
    kernels = {"fwd", "dkdv", "dq"} if w.pass_ != "fwd" else {"decode"}  # a decode step: the decode kernels
    assert set(first) == kernels and timed
    _triton_tiles.clear_cache()  # a new process: memory empty, the disk kept
    log.clear()
    timed.clear()
    inputs = make_inputs(w, requires_grad=w.pass_ != "fwd")
    run = contender.prepare(inputs, w)
    assert run.plan.tiles == first and timed == [] and log == []
    out = run()
    if w.pass_ != "fwd":
        torch.autograd.grad(out, (inputs.q, inputs.k, inputs.v), inputs.grad_out)
    kernel = "_forward_kernel" if w.pass_ != "fwd" else "_decode_split_kernel"
    assert timed == [] and kernel in {name for name, _, _ in log}


def test_head_dims_and_precision_chosen_per_call(mocked_gpu):
    log, _ = mocked_gpu
    for head_dim, dtype, even, block_d, precision in (
        (64, "float32", True, 64, "tf32x3"),  # fp32 on CUDA: three TF32 passes
        (50, "float16", False, 64, "tf32"),  # not a power of two: loads masked on the head dim
        (16, "bfloat16", True, 16, "tf32"),
        (96, "float32", False, 128, "tf32x3"),
    ):
        log.clear()
        w = Workload(1, 2, 2, 64, 64, head_dim, dtype=dtype)
        contender.prepare(make_inputs(w), w)()
        kwargs = log[-1][2]
        assert (kwargs["EVEN_D"], kwargs["BLOCK_D"], kwargs["INPUT_PRECISION"]) == (even, block_d, precision)


def test_in_the_interpreter_fp32_dots_are_ieee(monkeypatch):
    monkeypatch.setattr(_triton_flash, "INTERPRETED", True)
    q = torch.empty(1, 2, 8, 32)
    assert _triton_flash.make_plan(q, q, q).constants()["INPUT_PRECISION"] == "ieee"
    assert _triton_flash.make_plan(q, q, q).candidates("fwd") == [_triton_tiles.INTERPRETER_TILES["fwd"]]


def test_gpu_smoke_without_cuda_says_so_and_exits_0(monkeypatch, capsys):
    from attnbench.impls.fused_triton import smoke as _triton_smoke

    monkeypatch.setattr(_triton_flash, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _triton_smoke.main([]) == 0
    assert capsys.readouterr().out == (
        "gpu_smoke: no CUDA device here, nothing to check (fused_triton's configs need a GPU)\n"
    )


def test_gpu_smoke_forces_every_tile_and_fails_on_a_wrong_one(monkeypatch, capsys):
    from attnbench.impls.fused_triton import smoke as _triton_smoke

    forced: list[tuple[str, Tile]] = []
    bad = CUDA_TILES["dq"][2]
    # the decode kernel's: each case's own candidates, each compiled tile at several split counts (waves),
    # forced once per compiled tile at its most splits
    decode_tiles = [Tile(16, 64, 4, 2), Tile(64, 32, 8, 2)]
    decode_waves = [dataclasses.replace(t, waves=w) for t in decode_tiles for w in (8, 1, 2)]

    def check_case(case: Workload, tiles: dict[str, Tile]) -> str:
        ((kernel, tile),) = tiles.items()
        forced.append((kernel, tile))
        return "dq error 0.5 of its scale, over 0.06" if tile == bad else ""

    def candidates(case: Workload, kernel: str) -> list[Tile]:
        return decode_waves if kernel == "decode" else list(CUDA_TILES[kernel])

    monkeypatch.setattr(_triton_smoke, "check_case", check_case)
    monkeypatch.setattr(_triton_smoke, "check_far_offsets", lambda device: "")
    monkeypatch.setattr(_triton_smoke, "_candidates", candidates)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _triton_smoke.main([]) == 1
    cases = _triton_smoke.SMOKE_CASES  # the backward kernels' tiles on the backward cases only; decode steps
    decode = [case for case in cases if _triton_smoke.decodes(case)]  # (≤ 8 rows, forward) in the decode kernels
    assert forced == [
        (kernel, tile)
        for kernel, tiles in CUDA_TILES.items()
        for tile in tiles
        for case in cases
        if (kernel == "fwd" and case not in decode) or case.pass_ != "fwd"
    ] + [("decode", dataclasses.replace(tile, waves=8)) for case in decode for tile in decode_tiles]
    backward = sum(case.pass_ != "fwd" for case in cases)
    assert 0 < backward < len(cases) and len(decode) >= 5
    out = capsys.readouterr().out
    assert f"FAILED dq {bad} on " in out and f"gpu_smoke: {backward} failure(s)" in out
    # each failure said as found (before its tile's line): a run cut short by a time limit still shows it
    assert out.index(f"FAILED dq {bad} on ") < out.index(f"dq {bad}: {backward} cases checked, {backward} wrong")
    assert out.count("FAILED") == backward


def test_gpu_smoke_fails_a_named_tile_that_checks_no_case(monkeypatch, capsys):
    """A trial forces its new kernel's tiles by name: one that raises on every case (a launch or compile
    error) or is pruned from each must fail the smoke, not read as 0 cases checked and green. A default tile
    that raises is only said (the tuner times it as inf)."""
    from attnbench.impls.fused_triton import smoke as _triton_smoke

    broken, fine, decode_broken = Tile(128, 128, 8, 3), Tile(64, 64, 4, 2), Tile(64, 64, 8, 2, waves=8)

    def check_case(case: Workload, tiles: dict[str, Tile]) -> str:
        if broken in tiles.values() or decode_broken in tiles.values():
            raise RuntimeError("PassManager::run failed\nmore lines")
        return ""

    monkeypatch.setattr(_triton_smoke, "check_case", check_case)
    monkeypatch.setattr(_triton_smoke, "check_far_offsets", lambda device: "")
    monkeypatch.setattr(_triton_smoke, "_candidates", lambda case, kernel: None)
    cases = [_triton_smoke.BASIC_CASES[0], _triton_smoke.DECODE_CASES[0]]
    failures = _triton_smoke.smoke("cuda", cases=cases, tiles={"fwd": [broken, fine], "decode": [decode_broken]})
    assert failures == [
        f"fwd {broken}: named, but checked on no case (unfit (RuntimeError: PassManager::run failed))",
        f"decode {decode_broken}: named, but checked on no case (on 1 decode cases)",
    ]
    out = capsys.readouterr().out
    assert f"fwd {fine}: 1 cases checked, 0 wrong" in out and out.count("FAILED") == 2
    # the default tiles (none named): a tile that raises is said as unfit, no failure
    monkeypatch.setattr(_triton_smoke, "CUDA_TILES", {"fwd": (broken, fine)})
    decode_only = lambda case, kernel: [decode_broken] if kernel == "decode" else None  # noqa: E731
    monkeypatch.setattr(_triton_smoke, "_candidates", decode_only)
    assert _triton_smoke.smoke("cuda", cases=cases) == []
    assert f"fwd {broken}: 0 cases checked, 0 wrong; unfit (RuntimeError" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("dtype", "head_dim", "narrow", "view", "expected"),
    [
        (torch.bfloat16, 64, False, "contiguous", True),
        (torch.float16, 128, False, "strided", True),  # (B, S, H, D) memory order: strides still 16-byte
        (torch.float32, 64, False, "contiguous", False),  # fp32 keeps the pointer loads (tf32x3 dots)
        (torch.bfloat16, 96, False, "contiguous", False),  # a head dim that does not fill its 128-wide tile
        (torch.bfloat16, 64, True, "contiguous", False),  # an fp8 cache converted in registers
        (torch.bfloat16, 64, False, "odd", False),  # rows 66 elements apart: not 16-byte strides
        (torch.bfloat16, 64, False, "expanded", False),  # one kv head expanded over two: a stride of 0
        (torch.bfloat16, 64, False, "latent", False),  # v read out of k's tile
    ],
)
def test_hopper_reads_k_and_v_by_tensor_descriptors_where_they_can_address_them(
    monkeypatch, dtype, head_dim, narrow, view, expected
):
    monkeypatch.setattr(_triton_flash, "is_hopper", lambda device: True)
    q = torch.zeros(1, 2, 8, head_dim, dtype=dtype)
    if view == "odd":
        k = torch.zeros(1, 2, 8, head_dim + 2, dtype=dtype)[..., :head_dim]
    elif view == "expanded":
        k = torch.zeros(1, 1, 8, head_dim, dtype=dtype).expand(1, 2, 8, head_dim)
    elif view == "strided":
        k = torch.zeros(1, 8, 2, head_dim, dtype=dtype).transpose(1, 2)
    else:
        k = torch.zeros(1, 2, 8, head_dim, dtype=dtype)
    v = k[..., :head_dim] if view == "latent" else k.clone()  # latent: v is k itself, read from its tile
    if narrow:
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    scales = {"k_scale": torch.ones(1, 2, 1, 1), "v_scale": torch.ones(1, 2, 1, 1)} if narrow else {}
    plan = _triton_flash.make_plan(q, k, v, **scales)
    v_from_k = _triton_flash.is_view_of(v, k) and plan.block_dv == plan.block_d
    assert _triton_flash.takes_descriptors(plan, k, v, v_from_k) is expected
    monkeypatch.setattr(_triton_flash, "is_hopper", lambda device: False)  # an Ampere GPU: pointers throughout
    assert not _triton_flash.takes_descriptors(plan, k, v, v_from_k)


def test_gpu_smoke_in_parallel_echoes_each_shard_and_counts_its_failures(capsys):
    said = {  # what each shard's process prints and its exit status
        0: ("print('fwd T: 2 cases checked, 0 wrong'); print('gpu_smoke: 0 failure(s)')", 0),
        1: ("print('FAILED dq T on B1: wrong'); print('dq T: 1 cases checked, 1 wrong')", 1),
        2: ("import sys; print('decode on B2: 1 tiles checked'); sys.exit(3)", 3),  # died without saying why
    }

    def command(i, jobs):
        assert jobs == 3
        code, status = said[i]
        return [sys.executable, "-c", f"{code}; raise SystemExit({status})"]

    assert _triton_smoke._in_parallel(3, command) == 1
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines[:-2]) == sorted(
        [
            "fwd T: 2 cases checked, 0 wrong",
            "FAILED dq T on B1: wrong",
            "dq T: 1 cases checked, 1 wrong",
            "decode on B2: 1 tiles checked",
        ]
    )
    assert lines[-2:] == ["FAILED shard 2/3 exited with status 3", "gpu_smoke: 2 failure(s)"]


def test_gpu_smoke_shards_deal_out_every_unit_of_work_once():
    items = _triton_smoke._items(_triton_smoke.SMOKE_CASES, None)
    dealt = [item for i in range(3) for item in items[i::3]]
    assert sorted(map(repr, dealt)) == sorted(map(repr, items)) and len(items) > 3
    assert _triton_smoke._parse(["--jobs", "8"]).shard == (0, 1)
    assert _triton_smoke._parse(["--shard", "2/3"]).shard == (2, 3)
    for bad in (["--shard", "3/3"], ["--shard", "x"], ["--jobs", "0"]):
        with pytest.raises(SystemExit) as exited:
            _triton_smoke._parse(bad)
        assert exited.value.code == 2


def test_tile_times_without_cuda_says_so_and_refuses_bad_flags(capsys):
    from attnbench.impls.fused_triton import tile_times

    assert tile_times.main(["--seq", "64"]) == 0
    assert capsys.readouterr().out == "tile_times: no CUDA device here, nothing to time\n"
    assert tile_times._parse(["--mask", "causal"]).mask == ["causal"]
    for bad in (["--mask", "window"], ["--seq", "0"]):
        with pytest.raises(SystemExit) as exited:
            tile_times._parse(bad)
        assert exited.value.code == 2


def test_the_launchers_integer_helpers_are_tritons_without_a_jit_call():
    """``tiles.cdiv`` / ``tiles.next_power_of_2``: the same numbers as Triton's, which are jit functions (some
    microseconds a host call; a decode step made nine)."""
    for a in range(0, 600):
        assert _triton_tiles.next_power_of_2(a) == triton.next_power_of_2(a), a
        assert all(_triton_tiles.cdiv(a, b) == triton.cdiv(a, b) for b in (1, 2, 3, 16, 64, 128, 1000)), a


def test_the_run_says_the_tiles_it_chose(mocked_gpu):
    """run.choice, what a results row's ``choice`` column and ``ab``'s choice_a/choice_b say: each kernel's tile."""
    w = Workload(2, 4, 2, 1000, 1000, 64, dtype="bfloat16", mask="causal", pass_="fwd_bwd")
    run = contender.prepare(make_inputs(w, requires_grad=True), w)
    said = dict(part.split(" ") for part in run.choice().split("; "))
    assert said == {"fwd": "128,64,8,3", "dkdv": "64,128,8,2", "dq": "128,64,8,2"}
