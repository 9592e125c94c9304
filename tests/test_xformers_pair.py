"""xformers runs, or says exactly why not (issue 37): its C++/CUDA extension loads only under the torch it was
built for, while `import xformers.ops` succeeds under any.

xformers here is a fake package on sys.path, laid out as the real wheel is (cpp_lib.json beside the package,
`_cpp_lib._cpp_library_load_exception`, `_has_cpp_library`, a dist-info), and torch's version and CUDA are
faked, so the CUDA paths run on this CPU machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from attnbench.impls import _xformers_build as build
from attnbench.impls.xformers import contender

# Why the real xformers' extension did not load (_cpp_lib.xFormersInvalidLibException), and the warning it logs.
LOAD_FAILURE = """xFormers can't load C++/CUDA extensions. xFormers was built for:
    PyTorch 2.10.0+cu128 with CUDA 1208 (you have 2.11.0+cu130)
    Python  3.10.19 (you have 3.12.3)
  Please reinstall xformers (see https://github.com/facebookresearch/xformers#installing-xformers)
  Memory-efficient attention, SwiGLU, sparse and more won't be available."""
LOAD_WARNING = f"WARNING[XFORMERS]: {LOAD_FAILURE}\n  Set XFORMERS_MORE_DETAILS=1 for more details"
NO_CPU = "xformers 0.0.35 has no CPU operator for memory_efficient_attention; it needs CUDA"


@pytest.fixture
def fake_xformers(tmp_path, monkeypatch):
    """make(built, loaded): an installed xformers 0.0.35 whose cpp_lib.json says it was built for torch
    `built` and whose import, like the real one's, prints a warning and keeps the load failure when not
    `loaded`. Any xformers already imported is set aside for the test."""
    for name in [m for m in sys.modules if m == "xformers" or m.startswith("xformers.")]:
        monkeypatch.delitem(sys.modules, name)

    def make(built: str | None, loaded: bool = True) -> Path:
        site = tmp_path / "site"
        package = site / "xformers"
        (package / "ops").mkdir(parents=True)
        (package / "ops" / "__init__.py").write_text("")
        (package / "__init__.py").write_text(
            '__version__ = "0.0.35"\nfrom . import _cpp_lib\n'
            "_has_cpp_library = _cpp_lib._cpp_library_load_exception is None\n"
        )
        failure = f"xFormersInvalidLibException({LOAD_FAILURE!r})" if not loaded else "None"
        (package / "_cpp_lib.py").write_text(
            "import sys\nclass xFormersInvalidLibException(Exception):\n    pass\n"
            f"_cpp_library_load_exception = {failure}\n"
            + (f"print({LOAD_WARNING!r}, file=sys.stderr)\n" if not loaded else "")
        )
        if built is not None:
            (package / "cpp_lib.json").write_text(json.dumps({"version": {"cuda": 1208, "torch": built}, "env": {}}))
        dist = site / "xformers-0.0.35.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.35\n")
        monkeypatch.syspath_prepend(str(site))
        return package

    yield make
    for name in [m for m in sys.modules if m == "xformers" or m.startswith("xformers.")]:
        del sys.modules[name]  # the fake; monkeypatch then puts back what was there


def _torch(monkeypatch, version: str, cuda: bool) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)


def test_without_cuda_the_mismatched_pair_is_read_from_the_build_without_importing_it(fake_xformers, monkeypatch):
    fake_xformers("2.10.0+cu128", loaded=False)
    _torch(monkeypatch, "2.11.0+cu130", cuda=False)
    assert build.built_for() == "2.10.0+cu128"
    assert contender.availability() == (
        f"{NO_CPU} and torch 2.10.0+cu128, "
        "the torch it was built for (this is 2.11.0+cu130) — install a matching pair (see README)"
    )
    assert "xformers" not in sys.modules  # read, not imported
    for same in ("2.10.0+cu128", "2.10.1+cu128", "2.10.0+cpu"):  # the pair, a patch release, a CPU build of it
        _torch(monkeypatch, same, cuda=False)
        assert contender.availability() == NO_CPU


def test_on_cuda_an_extension_that_did_not_load_names_both_torches_in_one_line(fake_xformers, monkeypatch, capfd):
    fake_xformers("2.10.0+cu128", loaded=False)
    _torch(monkeypatch, "2.11.0+cu130", cuda=True)
    assert contender.availability() == (
        "xformers 0.0.35 was built for torch 2.10.0+cu128; this is torch 2.11.0+cu130 — install a matching pair "
        "(see README)"
    )
    assert sys.modules["xformers"]._has_cpp_library is False  # the fake was imported, as the real one is on CUDA
    assert "WARNING[XFORMERS]" not in capfd.readouterr().err  # its import warning kept off the user's screen


def test_on_cuda_the_matched_pair_is_available(fake_xformers, monkeypatch):
    fake_xformers("2.11.0+cu130", loaded=True)
    _torch(monkeypatch, "2.11.0+cu130", cuda=True)
    assert contender.availability() is None


def test_on_cuda_a_patch_release_that_loaded_is_available(fake_xformers, monkeypatch):
    """xformers' own word beats the versions: built for 2.10.0, under 2.10.1, and the extension loaded."""
    fake_xformers("2.10.0+cu128", loaded=True)
    _torch(monkeypatch, "2.10.1+cu128", cuda=True)
    assert contender.availability() is None


def test_on_cuda_the_same_torch_that_did_not_load_says_xformers_error(fake_xformers, monkeypatch):
    fake_xformers("2.11.0+cu130", loaded=False)
    _torch(monkeypatch, "2.11.0+cu130", cuda=True)
    assert contender.availability() == (
        "xformers 0.0.35's C++/CUDA extension did not load (xFormersInvalidLibException: xFormers can't load "
        "C++/CUDA extensions. xFormers was built for: PyTorch 2.10.0+cu128 with CUDA 1208 (you have 2.11.0+cu130); "
        "Python 3.10.19 (you have 3.12.3); Please reinstall xformers (see "
        "https://github.com/facebookresearch/xformers#installing-xformers); Memory-efficient attention, SwiGLU, "
        "sparse and more won't be available.)"
    )


def test_without_a_build_record_nothing_is_guessed(fake_xformers, monkeypatch):
    """A source checkout has no cpp_lib.json: no pair is claimed; on CUDA xformers' own error says why."""
    fake_xformers(None, loaded=False)
    assert build.built_for() is None
    _torch(monkeypatch, "2.11.0+cu130", cuda=False)
    assert contender.availability() == NO_CPU
    _torch(monkeypatch, "2.11.0+cu130", cuda=True)
    said = contender.availability() or ""
    assert said.startswith("xformers 0.0.35's C++/CUDA extension did not load (xFormersInvalidLibException: ")
    monkeypatch.setitem(sys.modules, "xformers", None)  # not importable: no spec to read beside
    assert build.built_for() is None


def test_versions_that_mismatch():
    assert build.mismatch("2.10.0+cu128", "2.11.0+cu130") and build.mismatch("2.10.0+cu128", "2.10.0+cu130")
    assert not build.mismatch("2.10.0+cu128", "2.10.1+cu128") and not build.mismatch("2.10.0+cu128", "2.10.0+cpu")
    assert not build.mismatch("2.10.0+cu128", "2.10.0")
