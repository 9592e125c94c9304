"""fused_triton's tuned tiles kept on disk (``tiles.choose`` over ``tile_cache``), checked without a GPU.

The timing of a candidate is a fake that counts its calls, so "tuned again" and "read from disk" are seen
directly; a fresh process is simulated by forgetting the in-memory dictionary only (and, once, by real
processes sharing one cache folder). Each test keeps its tiles in a folder of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from attnbench.impls.fused_triton import tile_cache
from attnbench.impls.fused_triton import tiles as _tiles
from attnbench.impls.fused_triton.tiles import CUDA_TILES, Tile, TuningKey, prune, shared_bytes

H100_SHARED = 227 * 1024
CANDIDATES = [Tile(128, 64, 8, 3), Tile(64, 64, 4, 3), Tile(64, 32, 4, 4)]
FASTEST = Tile(64, 64, 4, 3)


@pytest.fixture()
def timed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Tile]:
    """The tiles timed, in order (FASTEST takes 1 ms, the others 2 ms); tiles kept under tmp_path."""
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    log: list[Tile] = []

    def fake_time(launch: Callable[[Tile], object], tile: Tile) -> float:
        log.append(tile)
        return 1.0 if tile == FASTEST else 2.0

    monkeypatch.setattr(_tiles, "time_tile", fake_time)
    _tiles.clear_cache()
    yield log
    _tiles.clear_cache()


def key(seq: int = 1000, source: str = "src-1", head_dim: int = 64) -> TuningKey:
    q, k = torch.empty(1, 8, seq, head_dim), torch.empty(1, 2, seq, head_dim)
    return _tiles.tuning_key("fwd", q, k, (True, False, head_dim), source)


def launch(tile: Tile) -> None:  # never called: the timing is faked
    raise AssertionError("a fake timer launches nothing")


def new_process() -> None:
    """What a new worker process starts with: an empty memory, the same disk."""
    _tiles.clear_cache()


def stored_files() -> list[Path]:
    return sorted(tile_cache.folder().glob("*.json"))


def test_a_new_process_reads_the_disk_and_times_nothing(timed):
    assert _tiles.choose(key(), CANDIDATES, launch) == FASTEST and timed == CANDIDATES
    (path,) = stored_files()
    assert path.name.startswith("fwd-")
    stored = json.loads(path.read_text())
    assert stored["value"]["tile"] == [64, 64, 4, 3] and stored["key"]["tuning"]["gpu"] == "cpu"
    assert stored["value"]["timings_ms"]["128,64,8,3"] == 2.0

    timed.clear()
    new_process()
    assert _tiles.cached(key(), CANDIDATES) == FASTEST  # the look-up alone, as Plan.tune makes it
    assert _tiles.choose(key(), CANDIDATES, launch) == FASTEST and timed == []
    _tiles.clear_cache(disk=True)
    assert stored_files() == [] and _tiles.cached(key(), CANDIDATES) is None


def test_lengths_of_one_bucket_share_the_stored_tile(timed):
    _tiles.choose(key(seq=1000), CANDIDATES, launch)
    new_process()
    timed.clear()
    assert _tiles.choose(key(seq=600), CANDIDATES, launch) == FASTEST and timed == []  # both in 1024
    _tiles.choose(key(seq=1100), CANDIDATES, launch)
    assert timed == CANDIDATES and len(stored_files()) == 2  # 2048: a bucket of its own


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda mp: key(source="src-2"), id="kernel source"),
        pytest.param(lambda mp: mp.setattr(_tiles, "device_name", lambda device: "NVIDIA H200") or key(), id="gpu"),
        pytest.param(lambda mp: key(head_dim=80), id="head dim"),
    ],
)
def test_a_changed_source_gpu_or_shape_tunes_again(timed, monkeypatch, change):
    _tiles.choose(key(), CANDIDATES, launch)
    new_process()
    timed.clear()
    assert _tiles.choose(change(monkeypatch), CANDIDATES, launch) == FASTEST and timed == CANDIDATES
    assert len(stored_files()) == 2


def test_a_changed_candidate_list_or_compiler_tunes_again(timed, monkeypatch):
    _tiles.choose(key(), CANDIDATES, launch)
    new_process()
    timed.clear()
    fewer = CANDIDATES[1:]
    assert _tiles.choose(key(), fewer, launch) == FASTEST and timed == fewer
    new_process()
    timed.clear()
    monkeypatch.setattr(_tiles, "_versions", lambda: {"torch": "2.11.0+cu130", "triton": "3.7.0"})
    _tiles.choose(key(), CANDIDATES, launch)
    assert timed == CANDIDATES


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda text: "", id="empty"),
        pytest.param(lambda text: text[: len(text) // 2], id="cut short"),
        pytest.param(lambda text: "\x00\xff garbage", id="garbage"),
        pytest.param(lambda text: json.dumps([1, 2, 3]), id="not an object"),
        pytest.param(lambda text: text.replace('"src-1"', '"src-0"'), id="another key"),
        pytest.param(lambda text: text.replace("[\n   64,\n   64,", "[\n   16,\n   16,"), id="not a candidate"),
    ],
)
def test_a_damaged_file_is_tuned_again_and_rewritten(timed, damage):
    _tiles.choose(key(), CANDIDATES, launch)
    (path,) = stored_files()
    path.write_text(damage(path.read_text()))
    new_process()
    timed.clear()
    assert _tiles.choose(key(), CANDIDATES, launch) == FASTEST and timed == CANDIDATES
    assert json.loads(path.read_text())["value"]["tile"] == [64, 64, 4, 3]


def test_an_unwritable_cache_keeps_the_tile_in_memory(timed, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(blocker))  # its tiles/ folder can't be made
    assert _tiles.choose(key(), CANDIDATES, launch) == FASTEST and len(timed) == 3
    assert _tiles.choose(key(), CANDIDATES, launch) == FASTEST and len(timed) == 3


def test_nothing_reaches_the_disk_without_a_choice_or_a_source(timed, monkeypatch):
    assert _tiles.choose(key(), CANDIDATES[:1], launch) == CANDIDATES[0] and timed == []  # the interpreter's case
    _tiles.choose(key(source=""), CANDIDATES, launch)  # a source that couldn't be read: memory only
    monkeypatch.setattr(_tiles, "time_tile", lambda launch, tile: float("inf"))  # every tile failed to run
    _tiles.choose(key(seq=5000), CANDIDATES, launch)
    assert stored_files() == []


def test_interleaved_writers_leave_one_whole_file(timed, monkeypatch):
    """Two processes tune one key at once: A writes its temporary file, B writes and renames, A renames last.
    Readers in between see a whole file every time, and the last writer's tile is the one kept."""
    stored = _tiles.stored_key(key(), CANDIDATES)
    real_replace = os.replace
    held: list[tuple[str, str]] = []
    monkeypatch.setattr(os, "replace", lambda src, dst: held.append((src, dst)))
    assert tile_cache.write(stored, "fwd", {"tile": [128, 64, 8, 3]})  # A: written, not yet renamed
    monkeypatch.setattr(os, "replace", real_replace)
    assert tile_cache.read(stored, "fwd") is None  # nothing there yet: A's text is in its temporary file
    assert tile_cache.write(stored, "fwd", {"tile": [64, 32, 4, 4]})  # B, whole
    assert tile_cache.read(stored, "fwd") == {"tile": [64, 32, 4, 4]}
    os.replace(*held[0])  # A renames last
    assert tile_cache.read(stored, "fwd") == {"tile": [128, 64, 8, 3]}
    assert [p.suffix for p in tile_cache.folder().iterdir()] == [".json"]  # no temporary file left behind
    timed.clear()
    assert _tiles.choose(key(), CANDIDATES, launch) == Tile(128, 64, 8, 3) and timed == []


PROCESS = textwrap.dedent(
    """
    import sys, torch
    from attnbench.impls.fused_triton import tiles
    timed = []
    def fake_time(launch, tile):
        timed.append(tile)
        return 1.0 if tile == tiles.Tile(64, 64, 4, 3) else 2.0
    tiles.time_tile = fake_time
    q, k = torch.empty(1, 8, 1000, 64), torch.empty(1, 2, 1000, 64)
    key = tiles.tuning_key("fwd", q, k, (True,), "src-1")
    candidates = [tiles.Tile(128, 64, 8, 3), tiles.Tile(64, 64, 4, 3), tiles.Tile(64, 32, 4, 4)]
    chosen = tiles.choose(key, candidates, None)
    print(len(timed), chosen.block_m, chosen.block_n)
    """
)


def test_processes_share_the_tiles_through_the_cache_folder(tmp_path):
    env = {**os.environ, "ATTNBENCH_CACHE_DIR": str(tmp_path)}

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", PROCESS], env=env, stdout=subprocess.PIPE, text=True)

    def result(process: subprocess.Popen[str]) -> str:
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0
        return out.strip()

    first = [start(), start()]  # two at once: each may tune, both must finish and leave a readable file
    outputs = [result(p) for p in first]
    assert all(out.split()[1:] == ["64", "64"] for out in outputs), outputs
    assert {out.split()[0] for out in outputs} <= {"0", "3"}
    (path,) = (tmp_path / tile_cache.FOLDER).glob("*.json")
    assert json.loads(path.read_text())["value"]["tile"] == [64, 64, 4, 3]
    assert result(start()) == "0 64 64"  # a later process times nothing


def test_hopper_is_told_by_the_compute_capability(monkeypatch):
    capability: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability[-1])
    for cc, hopper in (((9, 0), True), ((8, 0), False), ((10, 0), False), ((8, 9), False)):
        capability.append(cc)
        assert _tiles.is_hopper(torch.device("cuda", 0)) is hopper
    assert _tiles.is_hopper(torch.device("cpu")) is False


def _pruned(head_dim: int, itemsize: int, seq: int, hopper: bool, kernel: str = "fwd") -> list[Tile]:
    return prune(
        kernel,
        CUDA_TILES[kernel],
        seq_q=seq,
        seq_k=seq,
        head_dim=head_dim,
        itemsize=itemsize,
        shared_cap=H100_SHARED,
        hopper=hopper,
    )


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256, 576])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("seq", [16, 300, 4096])
def test_hopper_drops_only_forward_tiles_it_cannot_use(head_dim, itemsize, seq):
    full, hopper = _pruned(head_dim, itemsize, seq, False), _pruned(head_dim, itemsize, seq, True)
    assert hopper and set(hopper) <= set(full)

    def used(t: Tile) -> int:  # on Hopper a 16-bit forward counts its descriptors' barriers too
        block_d, block_dv = sum(_tiles.head_dim_blocks(head_dim)), max(16, 1 << (head_dim - 1).bit_length())
        return shared_bytes("fwd", t, block_d, itemsize, block_dv, descriptors=itemsize == 2)

    for dropped in set(full) - set(hopper):
        wide_8_warps = dropped.num_warps == 8 and dropped.block_m * dropped.block_n < 128 * 128
        deeper = [
            t
            for t in full
            if (t.block_m, t.block_n, t.num_warps) == (dropped.block_m, dropped.block_n, dropped.num_warps)
            and t.num_stages > dropped.num_stages
            and H100_SHARED // used(t) == H100_SHARED // used(dropped)
        ]
        assert wide_8_warps or deeper, dropped
    for kernel in ("dkdv", "dq"):  # the backward kernels keep the full table
        assert _pruned(head_dim, itemsize, seq, True, kernel) == _pruned(head_dim, itemsize, seq, False, kernel)


def test_the_plan_asks_for_hopper_tiles_on_a_hopper(monkeypatch):
    flash = pytest.importorskip("attnbench.impls.fused_triton.flash")
    monkeypatch.setattr(flash, "INTERPRETED", False)
    q = torch.empty(1, 4, 4096, 128, dtype=torch.bfloat16)
    plan = flash.make_plan(q, q, q)
    seen: list[Any] = []
    monkeypatch.setattr(flash, "max_shared_memory", lambda device: H100_SHARED)
    monkeypatch.setattr(flash, "is_hopper", lambda device: seen.append(device) or True)
    hopper = {kernel: plan.candidates(kernel) for kernel in ("fwd", "dkdv", "prefix")}
    monkeypatch.setattr(flash, "is_hopper", lambda device: False)
    full = {kernel: plan.candidates(kernel) for kernel in ("fwd", "dkdv", "prefix")}
    assert seen and seen[0] == plan.device
    assert set(hopper["fwd"]) < set(full["fwd"]) and hopper["prefix"] == hopper["fwd"]
    assert hopper["dkdv"] == full["dkdv"]


def test_a_decode_tile_keeps_its_waves_on_disk(timed, monkeypatch):
    """A decode candidate's split count (``Tile.waves``) is stored with it and read back; other kernels' tiles
    are stored as four numbers, as before it existed."""
    candidates = [Tile(16, 64, 4, 2, waves=w) for w in (1, 2, 4, 8)]
    best = candidates[2]
    monkeypatch.setattr(_tiles, "time_tile", lambda launch, tile: 1.0 if tile == best else 2.0)
    assert _tiles.choose(key(), candidates, launch) == best
    (path,) = stored_files()
    value = json.loads(path.read_text())["value"]
    assert value["tile"] == [16, 64, 4, 2, 4] and set(value["timings_ms"]) == {f"16,64,4,2,{w}" for w in (1, 2, 4, 8)}
    new_process()
    assert _tiles.cached(key(), candidates) == best
    assert Tile(64, 64, 4, 3).fields() == (64, 64, 4, 3)
    assert repr(Tile(64, 64, 4, 3)) == "Tile(block_m=64, block_n=64, num_warps=4, num_stages=3)"  # as gpu_smoke says
    assert repr(best) == "Tile(block_m=16, block_n=64, num_warps=4, num_stages=2, waves=4)"
    halves = Tile(64, 32, 4, 3, waves=2, parts=2)  # MLA's value halves: all six numbers, read back as stored
    assert halves.fields() == (64, 32, 4, 3, 2, 2) and Tile(*halves.fields()) == halves
    assert repr(halves) == "Tile(block_m=64, block_n=32, num_warps=4, num_stages=3, waves=2, parts=2)"


def test_the_tuning_keys_cover_the_launchers_too():
    """A tile is tuned for a kernel as launched: the decode key hashes its launcher (split sizing, candidates) and
    the prefill keys flash's, so a change to either tunes afresh instead of reusing a tile tuned under the old."""
    flash = pytest.importorskip("attnbench.impls.fused_triton.flash")  # imports triton
    from attnbench.impls.fused_triton import backward_kernels, decode, decode_kernels, forward_kernels, shared_kernels

    assert (
        flash.KERNEL_SOURCE
        == tile_cache.source_hash(shared_kernels, forward_kernels, backward_kernels, flash)
        != tile_cache.source_hash(shared_kernels, forward_kernels, backward_kernels)
    )
    assert tile_cache.source_hash(shared_kernels, decode_kernels, decode, flash) == flash.DECODE_SOURCE
    assert tile_cache.source_hash(shared_kernels, decode_kernels, flash) != flash.DECODE_SOURCE


def test_the_tiles_live_under_the_tuning_folder_where_one_is_set(monkeypatch, tmp_path):
    """$ATTNBENCH_TUNING_DIR (what `attnbench ab` sets, a folder of its own) before $ATTNBENCH_CACHE_DIR."""
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNBENCH_TUNING_DIR", raising=False)
    assert tile_cache.folder() == tmp_path / "cache" / "tiles"
    monkeypatch.setenv("ATTNBENCH_TUNING_DIR", str(tmp_path / "ab"))
    assert tile_cache.folder() == tmp_path / "ab" / "tiles"
