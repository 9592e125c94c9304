"""Hostile conditions: a reader that leaves, a terminal that cannot print the output, a disk that fills, a path too
long, a store cut short, an unwritable cache, a plugin that exits, a Ctrl-C while plugins import. Each is one line
and exit 2 (or a row's reason), never a traceback or half-written results."""

import errno
import io
import json
import resource
import shutil
import signal
import sys
from pathlib import Path

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.contenders import registry

from conftest import Raising, fake_distribution, stalled_as_ok

TINY = [
    "--impl",
    "bmm",
    "--seq",
    "32",
    "--seq-kv",
    "32",
    "--head-dim",
    "16",
    "--mask",
    "none",
    "--batch",
    "1",
    "--kv-heads",
    "8",
]
QUICK = ["--budget-s", "0.02", "--no-memory", "--isolate", "none"]


class GoneReader(io.StringIO):
    """A pipe whose reader has left (`attnbench run … 2>&1 | head -1`): every write fails."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_a_reader_that_leaves_neither_stops_the_run_nor_loses_its_exit_code(planted, tmp_path, monkeypatch):
    """`attnbench run … 2>&1 | head -1`: the first progress line after the reader left raised BrokenPipeError inside
    the sweep, which stopped after one case without results.parquet, exit 0; after the table it skipped --store and
    turned --fail-on's 1 into 0."""
    import attnbench

    attnbench.register(Raising())
    planted.append(Raising.name)
    out, db = tmp_path / "run", tmp_path / "store.duckdb"
    monkeypatch.setattr(sys, "stdout", GoneReader())
    monkeypatch.setattr(sys, "stderr", GoneReader())
    args = ["run", "--impl", f"bmm,{Raising.name}", *TINY[2:], *QUICK, "--progress", "lines", "--out", str(out)]
    code = main([*args, "--fail-on", "error", "--store", "--db", str(db)])
    assert code == 1  # the gate's answer stands
    assert len(pd.read_parquet(out / "results.parquet")) == 2
    assert json.loads((out / "meta.json").read_text())["finished"] is True
    assert db.is_file()


def test_characters_the_terminal_cannot_encode_are_replaced(monkeypatch):
    """PYTHONIOENCODING=ascii (or a Latin-1 locale): the first '–' printed was a UnicodeEncodeError traceback."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert main(["suites"]) == 0
    sys.stdout.flush()
    assert "quick" in raw.getvalue().decode("ascii") and "1?2 min" in raw.getvalue().decode("ascii")


def test_a_path_too_long_is_one_line(cli, tmp_path):
    """A folder name over 255 bytes: Path.exists() raised OSError (ENAMETOOLONG) out of every command."""
    long = tmp_path / ("b" * 300)
    code, out, err = cli("run", *TINY, *QUICK, "--out", str(long))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"attnbench: error: {long}: File name too long; nothing was written")
    code, _, err = cli("history", "--db", str(long), "--out", str(tmp_path / "page"))
    assert code == 2 and err.count("\n") == 1 and "File name too long" in err, err


def _at_most(limit: int) -> tuple[int, int]:
    """Files this process writes stop at ``limit`` bytes, as a disk that fills: a write past it fails with EFBIG
    (SIGXFSZ ignored). Returns the limits to restore."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
    return before


def test_a_row_the_disk_cannot_hold_is_not_left_half_written(tmp_path):
    """The disk filled while a row was appended: rows.jsonl kept the first part of it, and `report` then refused the
    run as a corrupt results file. The line is cut back and the error names the file."""
    from attnbench.runner.results import RunWriter

    writer = RunWriter(tmp_path)
    writer.rows_path.write_text('{"impl": "bmm"}\n')
    before = _at_most(writer.rows_path.stat().st_size + 10)
    try:
        with pytest.raises(OSError) as raised:
            writer.append({"impl": "sdpa_math", "reason": "x" * 100})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
    assert raised.value.errno == errno.EFBIG and raised.value.filename == str(writer.rows_path)
    assert writer.rows_path.read_text() == '{"impl": "bmm"}\n'


def test_a_disk_that_fills_mid_run_is_one_line_and_the_run_resumes(cli, tmp_path, monkeypatch):
    """A full disk mid-sweep was an OSError traceback; now one line naming the file, exit 2, and the resume
    command, which then runs only the cases without a row."""
    from attnbench.runner.results import RunWriter

    real = RunWriter.append
    calls = []

    def fills_up(writer: RunWriter, row: dict) -> None:
        calls.append(row)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(writer.rows_path))
        real(writer, row)

    monkeypatch.setattr(RunWriter, "append", fills_up)
    out = tmp_path / "run"
    code, _, err = cli("run", *TINY, "--seq", "32,48", *QUICK, "--progress", "off", "--out", str(out))
    assert code == 2 and err.strip().splitlines()[-1] == (
        f"attnbench: error: {out / 'rows.jsonl'}: No space left on device; finished rows are saved; continue with: "
        f"attnbench run --resume {out}"
    ), err
    assert "Traceback" not in err and len((out / "rows.jsonl").read_text().splitlines()) == 1
    monkeypatch.setattr(RunWriter, "append", real)  # space freed
    code, _, err = cli("run", "--resume", str(out), "--progress", "off")
    assert code == 0, err
    assert sorted(pd.read_parquet(out / "results.parquet")["seq_q"]) == [32, 48]


def test_a_run_that_cannot_write_its_plan_leaves_no_folder(tmp_path, monkeypatch):
    """A full disk before the first case: the folder was left with .lock and rows.jsonl, and the same --out was then
    refused as a folder that is not empty."""
    from attnbench.runner import results
    from attnbench.workload import Workload

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(results, "write_text", full)
    out = tmp_path / "deeper" / "run"
    writer = results.RunWriter(out)
    with pytest.raises(OSError, match="No space left"):
        writer.start({"settings": {}}, [("bmm", Workload(1, 1, 1, 4, 4, 4))])
    assert not out.exists() and writer.lock is None


def test_ab_writes_all_of_its_files_or_none(tmp_path, monkeypatch):
    """The disk filled while `ab` wrote ab.png: ab.csv and ab_samples.csv stayed, a verdict without its figure and
    meta.json, and the error named no file."""
    from attnbench.reports import ab_report

    def full(records, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ab_report, "plot_ratios", full)
    out = tmp_path / "ab"
    with pytest.raises(OSError) as raised:
        ab_report.write_ab([], [], out, {"command_line": "attnbench ab"})
    assert raised.value.filename == str(out / "ab.png")
    assert not out.exists()


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "run"
    assert main(["run", *TINY, *QUICK, "--progress", "off", "--out", str(out)]) == 0
    return out


def test_a_store_cut_short_is_one_line(one_run, cli, tmp_path):
    """A store cut short (a copy interrupted, a disk that filled) opened, then failed to read: an IOException
    traceback from `history` and `store`."""
    from attnbench.reports.store import store_runs

    db = tmp_path / "store.duckdb"
    store_runs([one_run], db)
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])
    for args in (
        ["history", "--db", str(db), "--out", str(tmp_path / "page")],
        ["store", str(one_run), "--db", str(db)],
    ):
        code, _, err = cli(*args)
        assert code == 2 and err.count("\n") == 1, err
        assert f"--db {db}: cannot read it, the file is damaged or cut short (IO Error: " in err
    assert not (tmp_path / "page").exists()


def test_a_store_the_disk_cannot_hold_says_why_and_leaves_no_half_made_store(one_run, tmp_path):
    """The disk filled as a new store committed its first run: the failed ROLLBACK ("no transaction is active") hid
    the reason, and the store was left with tables but no columns, which `history` then failed on (a BinderError)."""
    from attnbench.errors import UsageError
    from attnbench.reports.store import store_runs

    db = tmp_path / "new" / "store.duckdb"
    db.parent.mkdir()
    # A DuckDB file opens with 12 KiB of headers, and a new store's tables go to its write-ahead log in a few hundred
    # bytes; the run's rows (its meta.json alone is several KiB) do not fit in what is left of 12.5 KiB.
    before = _at_most(12 * 1024 + 512)
    try:
        with pytest.raises(UsageError) as raised:
            store_runs([one_run], db)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
    said = str(raised.value)
    assert said.startswith(
        f"--db {db}: cannot store run (TransactionContext Error: Failed to commit: "
    ) and said.endswith("; the store keeps what it held before"), said
    assert list(db.parent.iterdir()) == []
    store_runs([one_run], db)  # room again: stored whole
    assert db.is_file()


def test_a_cache_folder_that_cannot_be_written_is_a_reason(tmp_path):
    """A read-only HOME (or a file where the cache folder goes): the worker's yardstick build raised OSError out of
    every case, and each contender's rows said only "the worker process died (exit code 1)"."""
    from attnbench.measure.native_build import compile_library

    (tmp_path / "cache").write_text("a file")
    target = tmp_path / "cache" / "kernels" / "lib.so"
    reason = compile_library("g++", (tmp_path / "k.cpp",), ("-O2",), target)
    assert reason is not None and reason.startswith(f"cannot write the cache folder {target.parent} (Not a directory)")


SIGNALLING_PLUGIN = """
import os, signal
os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while this module imports
for _ in range(1000):  # bytecode, where a KeyboardInterrupt lands
    pass
imported = True
from attnbench.impls.bmm import contender
"""

EXITING_PLUGIN = """
import sys
sys.exit(3)
"""


def test_a_plugin_that_exits_is_unavailable_and_a_ctrl_c_waits_for_the_imports(tmp_path, monkeypatch):
    """A plugin module that calls sys.exit() ended `attnbench list` with its exit code and not a word. A Ctrl-C
    while plugins imported landed inside one (Triton's: the process aborted, `terminate called after throwing an
    instance of 'nanobind::python_error'`); it is held until the imports are done."""
    fake_distribution(tmp_path, "exiting", {"exiting": "exiting_plugin:contender"}, {"exiting_plugin": EXITING_PLUGIN})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_cache", None)  # restored after the test
    entry = registry.load()["exiting"]
    assert entry.contender is None and entry.load_failure.startswith("failed to load: SystemExit: 3"), entry

    fake_distribution(tmp_path / "more", "signalling", {"signalling": "signalling_plugin:contender"}, {})
    (tmp_path / "more" / "signalling_plugin.py").write_text(SIGNALLING_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "more"))
    previous = signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # as in `attnbench` (a test runner's may differ)
    try:
        with pytest.raises(KeyboardInterrupt):
            registry.load(refresh=True)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sys.modules.pop("signalling_plugin").imported  # the import ran to its end; the interrupt came after it


def test_a_full_disk_under_a_library_names_the_output_folder(one_run, cli, tmp_path, monkeypatch):
    """matplotlib writing a figure into a full disk raises an OSError that names no file: the line said only "No
    space left on device"; it names the folder the command was writing into, and the report leaves none of it."""
    import matplotlib.figure

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    run = tmp_path / "run"
    shutil.copytree(one_run, run)
    stalled_as_ok(run)  # a figure is drawn only from ok rows: a busy machine's stalled row would draw none
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    out = tmp_path / "page"
    code, _, err = cli("report", str(run), "--out", str(out))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"attnbench: error: No space left on device (writing into {out}); nothing was written"), err
    assert not out.exists()
