"""Shared helpers: run the CLI in-process or as a real subprocess, and plant contenders."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench import registry
from attnbench.cli import main

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    # One ceilings cache for the whole session (and its subprocesses), not the user's.
    if "ATTNBENCH_CACHE_DIR" not in os.environ:
        os.environ["ATTNBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnbench-test-cache-")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `attnbench ARGS` in this process; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def run_subprocess(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run a command with this interpreter's environment (plus ``env``), capturing text output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=600)


def attnbench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnbench", *args]


@pytest.fixture
def planted() -> Iterator[list[str]]:
    """Contenders registered in-process during a test are removed afterwards (append their names)."""
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


class Shifted(attnbench.Contender):
    """A deliberately wrong contender: SDPA math with scores divided by D instead of √D (the seeds' bug)."""

    name = "planted_wrong_scale"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

    def prepare(self, inputs, workload):
        q, k, v = inputs.q, inputs.k, inputs.v
        return lambda: torch.softmax(q @ k.transpose(-1, -2) / workload.head_dim, dim=-1) @ v


class Raising(attnbench.Contender):
    name = "planted_raises"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}))

    def prepare(self, inputs, workload):
        def run():
            raise RuntimeError("planted failure\nsecond line")

        return run
