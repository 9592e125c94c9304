"""fused_triton's tuner compiles its candidate tiles side by side in worker processes before timing them
(``precompile``): checked on a machine without a GPU by compiling for sm_90 behind a stand-in Triton driver."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402

from attnbench.impls.fused_triton import compile_report, precompile  # noqa: E402
from attnbench.impls.fused_triton import tiles as _tiles  # noqa: E402
from attnbench.impls.fused_triton.tiles import Tile  # noqa: E402

HERE = Path(__file__).parent
SM90 = {"backend": "cuda", "arch": 90, "warp_size": 32}


class _Driver(precompile._StandInDriver):
    """The tuner's process on a Hopper GPU, as far as a launch asks: device 0, a stream, sm_90."""

    def get_current_stream(self, device: Any = None) -> int:
        return 0


@pytest.mark.parametrize(("setting", "workers"), [("0", 0), ("5", 5), ("many", None)])
def test_the_worker_count_is_the_setting_else_the_cpus(monkeypatch, setting, workers):
    monkeypatch.setenv(precompile.ENV_WORKERS, setting)
    expected = workers if workers is not None else min(len(__import__("os").sched_getaffinity(0)), 16)
    assert precompile.worker_count() == expected
    monkeypatch.setenv(precompile.ENV_WORKERS, "0")
    assert precompile.compile_ahead(lambda tile: pytest.fail("launched"), [Tile(16, 64, 4, 2)] * 4) == 0


def test_a_worker_compiles_only_what_a_fresh_process_can_import(monkeypatch):
    assert precompile.importable("attnbench.impls.fused_triton.kernels")  # editable or not
    copy = types.ModuleType("_attnbench_base_1")  # ab --base's copy of a contender: its own importer
    copy.__spec__ = importlib.machinery.ModuleSpec("_attnbench_base_1", loader=_OwnImporter())
    monkeypatch.setitem(sys.modules, "_attnbench_base_1", copy)
    assert not precompile.importable("_attnbench_base_1.impls.fused_triton.kernels")
    assert not precompile.importable("not_imported_here.kernels")


class _OwnImporter:
    """An importer only this process has."""


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
def test_workers_compile_what_the_tuners_launches_would_and_the_tuner_finds_it_cached(monkeypatch, tmp_path):
    """The decode tuning's candidates (Llama-3.1-8B's decode step): their launches recorded, not run; two
    workers compile the kernels for sm_90 into Triton's disk cache; the tuner's own compile of each then names
    the same entry (no new one is written: nothing compiled twice)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(triton.runtime.driver, "_active", _Driver(GPUTarget(**SM90)))
    with compile_report.compiling([]):
        launch, candidates, _ = compile_report._case("decode", 128, "none", torch.bfloat16)
        every = list(dict.fromkeys(candidates))
        assert len(precompile.record(launch, every)) < len(every)  # tiles differing only in waves share a kernel
        tiles = list({dataclasses.replace(tile, waves=0): tile for tile in every}.values())[:3]  # 3 kernels + merge
        kernels = precompile.record(launch, tiles)
        try:
            names = {kernel["name"] for kernel in kernels}
            assert names == {"_decode_split_kernel", "_decode_merge_kernel"} and len(kernels) == 4
            assert precompile.compile_ahead(launch, tiles, workers=2, target=SM90) == len(kernels)
            entries = sorted(path.name for path in (tmp_path / "triton").iterdir())
            assert len(entries) == len(kernels)
            for kernel in kernels:  # what the tuner's first launch of each tile does: compile, from the cache
                getattr(importlib.import_module(kernel["module"]), kernel["name"]).preload(kernel["data"])
            assert sorted(path.name for path in (tmp_path / "triton").iterdir()) == entries
        finally:
            for name in ("_decode_split_kernel", "_decode_merge_kernel"):
                getattr(
                    importlib.import_module("attnbench.impls.fused_triton.decode_kernels"), name
                ).device_caches.clear()


@pytest.mark.slow
def test_a_kernel_has_one_cache_name_whatever_was_compiled_before_it():
    """Triton 3.6 took a helper's constants into its caller's hash only if the helper had been hashed first, so
    a kernel's name in the disk cache followed what its process compiled before; ``flash`` settles every hash
    at import, and a worker imports it first."""
    script = (
        "import sys\n"
        "from attnbench.impls.fused_triton import flash, kernels\n"
        "for name in sys.argv[1:]: getattr(kernels, name).cache_key\n"
        "print(kernels._dq_kernel.cache_key)\n"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", script, *first],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout
        for first in ([], ["_dkdv_kernel"])
    }
    assert len(keys) == 1 and keys != {""}
