"""fused_triton's tuner compiles its candidate tiles side by side in threads before timing them (``precompile``):
checked on a machine without a GPU by compiling for sm_90 behind a stand-in Triton driver."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

from attnbench.impls.fused_triton import compile_report, precompile  # noqa: E402
from attnbench.impls.fused_triton import decode_kernels as _decode_kernels  # noqa: E402
from attnbench.impls.fused_triton import tiles as _tiles  # noqa: E402
from attnbench.impls.fused_triton.tiles import Tile  # noqa: E402


@pytest.mark.parametrize(("setting", "threads"), [("0", 0), ("5", 5), ("many", None)])
def test_the_thread_count_is_the_setting_else_the_cpus(monkeypatch, setting, threads):
    monkeypatch.setenv(precompile.ENV_THREADS, setting)
    expected = threads if threads is not None else min(len(os.sched_getaffinity(0)), precompile.MAX_THREADS)
    assert precompile.thread_count() == expected
    monkeypatch.setenv(precompile.ENV_THREADS, "1")
    assert precompile.compile_ahead(lambda tile: pytest.fail("launched"), [Tile(16, 64, 4, 2)] * 4) == 0


def test_the_tuner_compiles_ahead_then_times_each_candidate(monkeypatch):
    order: list[Any] = []
    monkeypatch.setattr(precompile, "compile_ahead", lambda launch, tiles: order.append(("ahead", list(tiles))))
    monkeypatch.setattr(_tiles, "time_tile", lambda launch, tile: order.append(tile) or float(tile.block_m))
    candidates = [Tile(64, 64, 4, 2), Tile(32, 64, 4, 2), Tile(128, 64, 8, 2)]
    key = _tiles.TuningKey("fwd", 1024, 1024, 64, 1, "torch.float32", (), "a GPU", "")
    _tiles.clear_cache()
    assert _tiles.choose(key, candidates, lambda tile: None) == Tile(32, 64, 4, 2)
    assert order == [("ahead", candidates), *candidates]
    _tiles.clear_cache()


@pytest.mark.slow
def test_threads_compile_what_the_tuners_launches_would_and_its_launches_find_them(monkeypatch, tmp_path):
    """Llama-3.1-8B's decode step, three of its candidate tiles and one that fails to launch: their launches
    recorded, not run (4 kernels: a split kernel each and the merge); two threads compile them for sm_90; each
    launch's own compile then finds its kernel compiled (nothing new in Triton's disk cache)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(triton.runtime.driver, "_active", compile_report.HopperDriver())
    try:
        with compile_report.compiling([]):
            launch, candidates, _ = compile_report._case("decode", 128, "none", torch.bfloat16)
            every = list(dict.fromkeys(candidates))
            assert len(precompile.record(launch, every)) < len(every)  # tiles differing in waves share a kernel
            tiles = list({dataclasses.replace(tile, waves=0): tile for tile in every}.values())[:3]

            def launch_or_fail(tile: Tile) -> None:
                if tile.block_m == 0:
                    raise RuntimeError("out of resources")
                launch(tile)

            tiles.append(Tile(0, 64, 4, 2))
            wanted = precompile.record(launch_or_fail, tiles)
            names = [specialisation.kernel.__name__ for specialisation in wanted]
            assert sorted(names) == ["_decode_merge_kernel"] + ["_decode_split_kernel"] * 3
            assert precompile.compile_ahead(launch_or_fail, tiles, threads=2) == 4
            entries = sorted(path.name for path in (tmp_path / "triton").iterdir())
            assert len(entries) == 4
            for specialisation in wanted:  # what the tuner's first launch of each tile compiles
                specialisation.kernel.preload(specialisation.data)
            assert sorted(path.name for path in (tmp_path / "triton").iterdir()) == entries
    finally:
        for name in ("_decode_split_kernel", "_decode_merge_kernel"):  # forget the stand-in's sm_90
            getattr(_decode_kernels, name).device_caches.clear()
