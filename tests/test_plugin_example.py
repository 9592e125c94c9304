"""The third-party contender example (docs/plugins.md, linked from the README), installed for real, shows up in list
and in a run."""

import re
import sys

import pandas as pd

from conftest import CHECKED, REPO, attnbench_cmd, run_subprocess

EXAMPLE = REPO / "examples" / "attnbench-chunked"


def _plugins_page_blocks(language: str) -> list[str]:
    text = (REPO / "docs" / "plugins.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_the_plugins_page_shows_the_example_files_verbatim():
    assert (EXAMPLE / "attnbench_chunked.py").read_text() in _plugins_page_blocks("python")
    assert (EXAMPLE / "pyproject.toml").read_text() in _plugins_page_blocks("toml")


def test_the_plugins_page_states_every_capabilities_default_as_the_code_has_it():
    """A plain Capabilities() claims padding, bottom-right causal, GQA and cross-attention; a plugin author learns
    that from the table in docs/plugins.md, which must hold every field with its default (review 1, finding 5)."""
    import ast
    import dataclasses

    from attnbench import Capabilities
    from attnbench.workload.axes import DECLARED

    table = (REPO / "docs" / "plugins.md").read_text().split("## What a plain `Capabilities()` claims")[1]
    rows = {
        names: (default, claim)
        for names, default, claim in re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|(.*)$", table, re.MULTILINE)
    }
    defaults = Capabilities()
    for field in dataclasses.fields(Capabilities):
        if field.name == "notes":  # free text, claims nothing
            continue
        names = next(key for key in rows if f"`{field.name}`" in key.split(", "))  # `min_head_dim`, `max_head_dim`
        written = [ast.literal_eval(value) for value in re.findall(r"`([^`]+)`", rows[names][0])]
        value = written[names.split(", ").index(f"`{field.name}`")]
        actual = getattr(defaults, field.name)
        assert (set(value) if isinstance(actual, frozenset) else value) == actual, (field.name, value, actual)
    claim = rows["`features`"][1]
    assert all(axis.name in claim for axis in DECLARED), claim  # every axis a plugin must declare is named


def test_installed_example_appears_in_list_and_runs(tmp_path):
    site = tmp_path / "site"
    install = run_subprocess(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(site),
        str(EXAMPLE),
    )
    assert install.returncode == 0, install.stderr
    env = {"PYTHONPATH": str(site)}
    listed = run_subprocess(*attnbench_cmd("list"), env=env)
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith("chunked "))
    assert "available" in line and "query chunks" in line

    out = tmp_path / "run"
    args = [
        "run",
        "--impl",
        "chunked,bmm",
        "--seq",
        "300",
        "--mask",
        "none,causal,padding",
        "--budget-s",
        "0.05",
        "--out",
        str(out),
    ]
    ran = run_subprocess(*attnbench_cmd(*args), env=env)
    assert ran.returncode == 0, ran.stderr
    frame = pd.read_parquet(out / "results.parquet").set_index(["impl", "mask", "seq_q", "seq_k"])
    assert frame.loc[("chunked", "none", 300, 300), "status"] in CHECKED
    assert frame.loc[("chunked", "causal", 300, 300), "status"] in CHECKED
    padding = frame.loc[("chunked", "padding", 300, 256)]
    assert padding["status"] == "unsupported" and "mask padding not supported" in padding["reason"]
