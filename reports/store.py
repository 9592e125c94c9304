"""The results store: every run kept in one DuckDB file, queryable with SQL.

Definitions first:

* **run_id** — a stable id of a run: the first 16 hex digits of SHA-256 over its meta.json start time,
  command and machine (a pytest-benchmark file, which has no start time, is hashed by its bytes). Storing
  a folder again finds the same id: a run whose row count is unchanged adds nothing; one that grew (it was
  resumed) has its rows replaced.
* **a merged folder** (``attnbench merge``) is stored as the runs it was made of (its meta.json's
  ``merged_from``: each one's rows under its own run_id, machine, commit and start time), never as a run of its
  own: a merged folder has no start time, commit or single machine, and it repeats rows its shards hold. Storing
  it after its shards (or a copy of it) adds nothing.
* **runs** — one row per stored run: ``run_id``, ``name`` (folder name), ``path``, ``source``,
  ``machine``, ``git_commit`` and ``git_dirty`` (the working directory's commit recorded at run time,
  else attnbench's own), ``started_at`` (UTC), ``attnbench_version``, ``torch_version``, ``suite``,
  ``command``, ``n_rows``, ``stored_at``, ``meta_json`` (meta.json as it was).
* **rows** — ``run_id`` plus every results column of that run (``attnbench.runner.results.COLUMNS``, and
  ``run``, ``machine``, ``source`` from ``reports.frames``). A column a newer attnbench adds is added to
  the table when the first run that has it is stored; older runs read NULL there. A column whose type
  changes is widened (integer to DOUBLE, else VARCHAR), never narrowed.
* **meta** — ``key``/``value`` pairs; ``schema_version`` is :data:`SCHEMA_VERSION`. Version 1 kept runs
  without ``git_dirty``, the versions, ``name``, ``source``, ``n_rows``, ``stored_at`` and ``meta_json``;
  opening it for writing migrates it forward in place, reading migrates an in-memory copy (reading never
  writes the file).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

import attnbench
from attnbench.errors import UsageError, check_can_make
from attnbench.reports.frames import Run, load_run, machine_label, parts

SCHEMA_VERSION = 2
DEFAULT_DB = Path("runs") / "attnbench.duckdb"

RUNS_COLUMNS = {
    "run_id": "VARCHAR PRIMARY KEY",
    "name": "VARCHAR",
    "path": "VARCHAR",
    "source": "VARCHAR",
    "machine": "VARCHAR",
    "git_commit": "VARCHAR",
    "git_dirty": "BOOLEAN",
    "started_at": "TIMESTAMP",
    "attnbench_version": "VARCHAR",
    "torch_version": "VARCHAR",
    "suite": "VARCHAR",
    "command": "VARCHAR",
    "n_rows": "BIGINT",
    "stored_at": "TIMESTAMP",
    "meta_json": "VARCHAR",
}


def _add_v2_run_columns(con: duckdb.DuckDBPyConnection) -> None:
    present = _columns(con, "runs")
    for name, sql_type in RUNS_COLUMNS.items():
        if name not in present:
            con.execute(f'ALTER TABLE runs ADD COLUMN "{name}" {sql_type}')


# schema version N -> the step that makes it N + 1
MIGRATIONS: dict[int, Callable[[duckdb.DuckDBPyConnection], None]] = {1: _add_v2_run_columns}


@dataclass(frozen=True)
class Stored:
    """What storing one run did: ``added``, ``unchanged`` or ``replaced`` (it had grown)."""

    run_id: str
    name: str
    action: str
    n_rows: int


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return {name: sql_type for name, sql_type in rows}


def _schema_version(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    tables = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if not tables:
        return 0
    if not {"meta", "runs", "rows"} <= tables:
        raise UsageError(f"{path}: a DuckDB file but not an attnbench store (tables: {', '.join(sorted(tables))})")
    found = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = int(found[0]) if found and str(found[0]).isdigit() else 0
    if not 1 <= version <= SCHEMA_VERSION:
        raise UsageError(
            f"{path}: store schema version {found and found[0]}; this attnbench reads 1 to {SCHEMA_VERSION}"
        )
    return version


def _create(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    columns = ", ".join(f'"{name}" {sql_type}' for name, sql_type in RUNS_COLUMNS.items())
    con.execute(f"CREATE TABLE runs ({columns})")
    con.execute("CREATE TABLE rows (run_id VARCHAR NOT NULL)")
    con.execute(
        "INSERT INTO meta VALUES ('schema_version', ?), ('created_by', ?)",
        [str(SCHEMA_VERSION), f"attnbench {attnbench.__version__}"],
    )


def _migrate(con: duckdb.DuckDBPyConnection, version: int) -> None:
    while version < SCHEMA_VERSION:
        MIGRATIONS[version](con)
        version += 1
    con.execute("DELETE FROM meta WHERE key = 'schema_version'")
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])


DUCKDB_MAGIC = b"DUCK"  # a DuckDB file's header holds these four bytes at offset 8


def _head(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(12)


def _connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    if path.is_file() and path.stat().st_size >= 12 and _head(path)[8:12] != DUCKDB_MAGIC:
        raise UsageError(
            f"--db {path}: not a DuckDB store (a results file? `attnbench store RUN… --db FILE` makes a store from "
            "run folders)"
        )
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        reason = str(exc).splitlines()[0]
        raise UsageError(f"--db {path}: cannot open it as a DuckDB database ({reason})") from None


def _damaged(path: Path, exc: duckdb.Error, write: bool = False) -> UsageError:
    """A store that opened but cannot be read (cut short by a copy or a full disk, or its blocks damaged), or, opened
    to be written, cannot be written either."""
    reason = str(exc).splitlines()[0]
    if write:
        return UsageError(
            f"--db {path}: cannot read or write it (a full disk, or a file damaged or cut short: {reason})"
        )
    return UsageError(f"--db {path}: cannot read it, the file is damaged or cut short ({reason})")


def check_store(path: Path) -> None:
    """Raise a UsageError unless ``path`` is absent (a new store) or a store this attnbench can read."""
    if path.is_dir():
        raise UsageError(f"--db {path}: is a folder; give a database file, e.g. {DEFAULT_DB}")
    if path.exists():
        con = _connect(path, read_only=True)
        try:
            _schema_version(con, path)  # raises for another program's database or a newer schema
        except duckdb.OperationalError as exc:
            raise _damaged(path, exc) from None
        finally:
            con.close()
    else:
        check_can_make(path, "--db")


@contextmanager
def open_store(path: Path, write: bool) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the store at ``path`` in the current schema.

    ``write``: create the file if missing and migrate it in place. Otherwise the file must exist; it is
    opened read-only and, when its schema is older, copied into memory and migrated there.
    """
    if path.is_dir():
        raise UsageError(f"--db {path}: is a folder; give a database file, e.g. {DEFAULT_DB}")
    if not write and not path.is_file():
        raise UsageError(f"--db {path}: no such database; store runs first with `attnbench store RUN… --db {path}`")
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
    con = _connect(path, read_only=not write)
    try:
        version = _schema_version(con, path)
        if write and version == 0:
            _create(con)
        elif version == 0:
            raise UsageError(f"--db {path}: an empty DuckDB file, not an attnbench store")
        elif version < SCHEMA_VERSION and write:
            _migrate(con, version)
        elif version < SCHEMA_VERSION:
            con = _in_memory_copy(con, path, version)
        yield con
    except duckdb.OperationalError as exc:  # an I/O error: a traceback before
        raise _damaged(path, exc, write) from None
    finally:
        con.close()


def _in_memory_copy(con: duckdb.DuckDBPyConnection, path: Path, version: int) -> duckdb.DuckDBPyConnection:
    con.close()
    memory = duckdb.connect(":memory:")
    quoted = str(path).replace("'", "''")
    memory.execute(f"ATTACH '{quoted}' AS old (READ_ONLY)")
    for table in ("meta", "runs", "rows"):
        memory.execute(f"CREATE TABLE {table} AS SELECT * FROM old.{table}")
    memory.execute("DETACH old")
    _migrate(memory, version)
    return memory


def _started_at(meta: dict[str, Any], run: Run) -> dt.datetime:
    for key in ("start_time", "end_time"):
        text = meta.get(key)
        if isinstance(text, str):
            try:
                stamp = dt.datetime.fromisoformat(text)
            except ValueError:
                continue
            if stamp.tzinfo is not None:
                stamp = stamp.astimezone(dt.timezone.utc).replace(tzinfo=None)
            return stamp
    if not run.path.exists():  # a merged folder's run that has moved, and no time in its meta
        return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    mtime = run.path.stat().st_mtime
    return dt.datetime.fromtimestamp(mtime, dt.timezone.utc).replace(tzinfo=None)


def run_id(run: Run) -> str:
    """The stable id of a run (see the module docstring)."""
    meta = run.meta
    machine = machine_label(meta.get("environment") or {})
    if meta.get("start_time"):
        basis = f"{meta['start_time']}|{meta.get('command', '')}|{machine}".encode()
    else:
        basis = run.path.read_bytes() if run.path.is_file() else str(run.path.resolve()).encode()
    return hashlib.sha256(basis).hexdigest()[:16]


def run_record(run: Run, n_rows: int) -> dict[str, Any]:
    """The ``runs`` row of a loaded run; the commit is the working directory's when recorded."""
    meta = run.meta
    env = meta.get("environment") or {}
    commit = env.get("workdir_commit") or env.get("git_commit")
    dirty = env.get("workdir_dirty") if env.get("workdir_commit") else env.get("git_dirty")
    return {
        "run_id": run_id(run),
        "name": run.path.name,
        "path": str(run.path.resolve()),
        "source": "pytest-benchmark" if run.path.is_file() else "attnbench",
        "machine": machine_label(env),
        "git_commit": commit,
        "git_dirty": dirty,
        "started_at": _started_at(meta, run),
        "attnbench_version": env.get("attnbench_version"),
        "torch_version": env.get("torch_version"),
        "suite": meta.get("suite"),
        "command": meta.get("command"),
        "n_rows": n_rows,
        "stored_at": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
        "meta_json": json.dumps(meta, default=str),
    }


def _widened(old: str, new: str) -> str:
    """The type a column takes when a run brings a value of type ``new`` into a column of type ``old``."""
    numeric = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "FLOAT", "DOUBLE", "DECIMAL")
    if old == new or new == "NULL":
        return old
    if old.startswith(numeric) and new.startswith(numeric):
        return "BIGINT" if "INT" in old and "INT" in new else "DOUBLE"
    if old.endswith("[]") and new.endswith("[]"):
        return "DOUBLE[]"
    return "VARCHAR"


def _evolve_rows(con: duckdb.DuckDBPyConnection, frame_types: dict[str, str]) -> None:
    """Add the frame's new columns to ``rows``, widen a column whose type no longer fits."""
    present = _columns(con, "rows")
    for name, sql_type in frame_types.items():
        if name not in present:
            con.execute(f'ALTER TABLE rows ADD COLUMN "{name}" {sql_type}')
            continue
        wider = _widened(present[name], sql_type)
        if wider != present[name]:
            con.execute(f'ALTER TABLE rows ALTER COLUMN "{name}" TYPE {wider}')


def _insert_rows(con: duckdb.DuckDBPyConnection, rid: str, frame: pd.DataFrame) -> None:
    frame = frame.assign(run_id=rid)
    con.register("incoming", frame)
    try:
        described = con.execute("DESCRIBE SELECT * FROM incoming").fetchall()
        types = {row[0]: row[1] for row in described if row[1] != '"NULL"' and row[1] != "NULL"}
        _evolve_rows(con, types)
        names = ", ".join(f'"{name}"' for name in types)
        con.execute(f"INSERT INTO rows ({names}) SELECT {names} FROM incoming")
    finally:
        con.unregister("incoming")


def _with_run_columns(frame: pd.DataFrame, name: str, record: dict[str, Any]) -> pd.DataFrame:
    """``run``, ``machine`` and ``source`` on every row; a merged folder's own per-row values are kept."""
    own = {"run": name, "machine": record["machine"], "source": record["source"]}
    columns = {}
    for column, value in own.items():
        kept = frame[column] if column in frame else pd.Series(None, index=frame.index, dtype=object)
        columns[column] = kept.astype(object).where(kept.notna(), value)
    return frame.assign(**columns)


def load_for_store(paths: list[Path]) -> list[tuple[str, Run]]:
    """Every path loaded and checked (a UsageError names the first bad one) before the store is touched: the
    runs to store and the name each is said by (a merged folder's runs as ``SHARD (from MERGED)``)."""
    runs = []
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such run folder or file")
        run = load_run(path)
        if run.path.is_dir() and not (run.path / "meta.json").is_file():
            raise UsageError(f"{path}: no meta.json; is this an attnbench run folder?")
        found = parts(run)
        for part in found:
            if part is not run and not part.meta.get("environment"):
                raise UsageError(
                    f"{path}: its run {part.name} has no environment in meta.json's merged_from (merged by an "
                    f"attnbench that kept none): store the run folders it was merged from ({part.path}) instead"
                )
        runs += [(run.path.name if part is run else f"{part.path.name} (from {run.path.name})", part) for part in found]
    return runs


def store_runs(paths: list[Path], db: Path) -> list[Stored]:
    """Add run folders (or pytest-benchmark files) to the store at ``db``, creating it when missing; a merged
    folder adds the runs it was made of (module docstring)."""
    runs = load_for_store(paths)
    check_store(db)
    new = not db.exists()
    try:
        return _store(runs, db)
    except BaseException:  # a store this command began and could not finish (the disk full, Ctrl-C) is not left
        if new:  # half-made: its tables without the columns that every reader asks for
            for made in (db, db.with_name(f"{db.name}.wal")):
                made.unlink(missing_ok=True)
        raise


def _store(runs: list[tuple[str, Run]], db: Path) -> list[Stored]:
    done = []
    with open_store(db, write=True) as con:
        for said, run in runs:
            record = run_record(run, len(run.frame))
            rid = record["run_id"]
            found = con.execute("SELECT n_rows FROM runs WHERE run_id = ?", [rid]).fetchone()
            if found is not None and found[0] == record["n_rows"]:
                done.append(Stored(rid, said, "unchanged", record["n_rows"]))
                continue
            frame = _with_run_columns(run.frame, run.path.name, record)
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("DELETE FROM rows WHERE run_id = ?", [rid])
                con.execute("DELETE FROM runs WHERE run_id = ?", [rid])
                columns = ", ".join(f'"{name}"' for name in record)
                marks = ", ".join("?" for _ in record)
                con.execute(f"INSERT INTO runs ({columns}) VALUES ({marks})", list(record.values()))
                _insert_rows(con, rid, frame)
                con.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(duckdb.Error):  # a COMMIT that failed has ended the transaction already
                    con.execute("ROLLBACK")
                if isinstance(exc, duckdb.OperationalError):  # the disk full: what failed, not the rollback
                    reason = str(exc).splitlines()[0]
                    raise UsageError(
                        f"--db {db}: cannot store {said} ({reason}); the store keeps what it held before"
                    ) from None
                raise
            done.append(Stored(rid, said, "added" if found is None else "replaced", record["n_rows"]))
    return done


def table_columns(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """The columns of ``rows`` and ``runs``, for validating ``--where``."""
    return {"rows": list(_columns(con, "rows")), "runs": list(_columns(con, "runs"))}
