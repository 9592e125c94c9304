"""pytest-benchmark front end options: which suite to run and axis overrides, as on the CLI.

pytest suites/ --benchmark-only --attnbench-suite quick --attnbench-set impl=bmm,sdpa_flash
"""

from __future__ import annotations

from typing import Any

import pytest

from attnbench.cli import parse_axis_overrides
from attnbench.contenders import registry
from attnbench.measure.allocator import configure_cpu_allocator
from attnbench.workload.suite import expand, load_suite


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnbench")
    group.addoption("--attnbench-suite", default="quick", help="suite name or .toml path (default quick)")
    group.addoption(
        "--attnbench-set",
        action="append",
        default=[],
        metavar="AXIS=LIST",
        help="override an axis, as the CLI's --AXIS flags: --attnbench-set seq=512,1024 (repeatable)",
    )


CASES = pytest.StashKey[list[Any]]()


def pytest_configure(config: pytest.Config) -> None:
    """Validate the options once, up front, so bad input is a usage error rather than a collection error."""
    pairs: dict[str, str] = {}
    for item in config.getoption("--attnbench-set"):
        axis, sep, value = item.partition("=")
        if not sep:
            raise pytest.UsageError(f"--attnbench-set {item!r}: expected AXIS=LIST, e.g. seq=512,1024")
        pairs[axis.strip().replace("-", "_")] = value
    configure_cpu_allocator("cached")  # as `attnbench run` does by default
    try:
        overrides = parse_axis_overrides(pairs)
        suite = load_suite(config.getoption("--attnbench-suite"))
        config.stash[CASES] = expand(
            suite, overrides, sorted(registry.load()), registry.sweep_names(), registry.available_sweep_names()
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attnbench_case" not in metafunc.fixturenames:
        return
    cases = metafunc.config.stash[CASES]
    ids = [f"{impl}-{w.label().replace(' ', '-')}" for impl, w in cases]
    metafunc.parametrize("attnbench_case", cases, ids=ids)
