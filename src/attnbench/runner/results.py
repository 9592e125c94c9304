"""Results rows and the run folder.

Every planned case ends as exactly one row. Rows are appended to ``rows.jsonl`` as each case finishes
(so a crash or Ctrl-C loses nothing finished); :meth:`RunWriter.finish` writes ``results.parquet``,
``results.csv`` and ``meta.json``. Raw timing samples are kept: a list column in Parquet, a JSON string
in CSV. Every file written whole (the results, ``meta.json``, ``plan.json``) is written to a temporary file
beside it and renamed over it (:func:`replacing`), so a reader — or a run killed mid-write — never sees
half a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import UsageError, check_can_make
from attnbench.measure import _gpu_state as gpu_state
from attnbench.runner._folder_lock import LOCK_NAME, hold, writer_pid
from attnbench.workload import Workload, axes

STATUSES = ("ok", "unavailable", "unsupported", "skipped", "oom", "timeout", "error", "incorrect", "stalled")

WORKLOAD_COLUMNS = axes.WORKLOAD_COLUMNS
# The workload features' neutral values: what a run folder written before these columns existed means.
FEATURE_DEFAULTS: dict[str, Any] = {axis.column: axis.neutral for axis in axes.FEATURES}
# What identifies a case within one run (the scale follows from head_dim unless set).
CASE_COLUMNS = ["impl", *(c for c in WORKLOAD_COLUMNS if axes.BY_COLUMN[c].sweep)]
COLUMNS = [
    "impl",
    *WORKLOAD_COLUMNS,
    "status",
    "reason",
    "median_ms",
    "iqr_ms",
    "n_samples",
    "calls_per_sample",
    "unstable",
    "timing_method",
    "cold_median_ms",
    "rounds",
    "repeat_medians_ms",
    "host_overhead_us",
    "waited_pct",
    "tflops",
    "gbps",
    "flops",
    "bytes",
    "intensity",
    "pct_of_peak",
    "pct_of_matmul",
    "cache_resident",
    "peak_mem_mb",
    "predicted_ms",
    "predicted_mem_mb",
    "max_abs_err",
    "rms_err",
    "atol",
    "rtol",
    "checked_rows",
    "grad_err",
    "grad_tol",
    "setup_ms",
    "first_call_ms",
    "choice",
    "threads",
    "reproduce",
    "samples_ms",
    "yardstick_fma_gflops",
    "yardstick_stream_gbps",
    "repeat_fma_gflops",
    "repeat_stream_gbps",
    *gpu_state.COLUMNS,
]
# The yardsticks (attnbench.measure._yardsticks): their rates in the rounds that timed the case, medians (per repeat
# in the repeat_ lists, beside repeat_medians_ms).
YARDSTICK_COLUMNS = {"fma_gflops": "yardstick_fma_gflops", "stream_gbps": "yardstick_stream_gbps"}
REPEAT_YARDSTICK_COLUMNS = {"fma_gflops": "repeat_fma_gflops", "stream_gbps": "repeat_stream_gbps"}
LIST_COLUMNS = ["samples_ms", "repeat_medians_ms", *REPEAT_YARDSTICK_COLUMNS.values()]  # lists in Parquet, JSON in CSV

FLOAT_COLUMNS = [
    "scale",
    "median_ms",
    "iqr_ms",
    "cold_median_ms",
    "tflops",
    "gbps",
    "flops",
    "bytes",
    "intensity",
    "pct_of_peak",
    "pct_of_matmul",
    "peak_mem_mb",
    "predicted_ms",
    "predicted_mem_mb",
    "max_abs_err",
    "rms_err",
    "atol",
    "rtol",
    "grad_err",
    "grad_tol",
    "setup_ms",
    "first_call_ms",
    "host_overhead_us",
    "waited_pct",
    "yardstick_fma_gflops",
    "yardstick_stream_gbps",
    *(column for column in gpu_state.COLUMNS if column != "throttle"),
]


def make_row(impl: str, workload: Workload, status: str, reason: str = "", **metrics: Any) -> dict[str, Any]:
    """A full row: every column present (missing metrics are None), status validated."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    if status != "ok" and not reason:
        raise ValueError(f"status {status} needs a reason")
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(workload.as_row())
    row.update(impl=impl, status=status, reason=reason)
    unknown = set(metrics) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown result columns {sorted(unknown)}")
    row.update(metrics)
    return row


_unfinished: set[Path] = set()  # temporary files being written now (removed by an exit at once)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; it replaces ``path`` in one rename when the block ends
    (and is removed if the block raises), so no reader ever sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _unfinished.add(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:  # the disk full: name the file being written, not its temporary name or none
        if exc.filename not in (None, str(tmp)):
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
    finally:
        _unfinished.discard(tmp)
        tmp.unlink(missing_ok=True)


def remove_unfinished() -> None:
    """Remove the temporary files of writes in progress (before exiting at once; safe in a signal handler)."""
    for tmp in list(_unfinished):
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, all or nothing."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _held_run(out_dir: Path) -> str:
    """What to do with a folder that is taken: a run that stopped before its end (a job killed, then started again
    with the same --out, as a batch script's requeued task is) is continued with --resume, not begun again."""
    pid = writer_pid(out_dir)
    if pid is not None:
        return f"another attnbench process{f' (pid {pid})' if pid else ''} is writing a run there now; choose a new one"
    try:
        meta = json.loads((out_dir / "meta.json").read_text())
        planned = len(json.loads((out_dir / "plan.json").read_text()))
    except (OSError, ValueError, TypeError):
        return "choose a new one"
    if not isinstance(meta, dict) or meta.get("finished", True):
        return "it holds a finished run; choose a new one"
    done = len(_read_jsonl(out_dir / "rows.jsonl"))
    return (
        f"it holds a run that stopped after {done} of its {planned} cases; continue it with: attnbench run --resume "
        f"{shlex.quote(str(out_dir))} (or choose a new folder)"
    )


class RunWriter:
    """Owns one run folder: refuses a non-empty one, appends rows, writes the final files.

    ``plan.json`` lists every planned case, so ``attnbench run --resume`` can run what is missing.
    """

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.rows_path = out_dir / "rows.jsonl"
        self.plan_path = out_dir / "plan.json"
        self.repeats_path = out_dir / "repeats.jsonl"  # one row per finished repeat, with --repeat N > 1
        self.rows: list[dict[str, Any]] = []
        self.partial: dict[tuple[Any, ...], list[dict[str, Any]]] = {}  # repeats of cases not yet complete
        self.lock: int | None = None  # the folder's lock, held while this process lives (runner._folder_lock)

    @staticmethod
    def check_target(out_dir: Path, run: bool = False) -> None:
        """Raise a UsageError if ``out_dir`` can't be used (call before any work is done); ``run``: for `attnbench
        run`, whose refusal of a run that stopped says how to continue it."""
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            then = _held_run(out_dir) if run else "choose a new one"
            raise UsageError(f"--out {out_dir}: already exists and is not an empty folder; {then}")
        check_can_make(out_dir, "--out")

    def start(self, meta: dict[str, Any], plan: list[tuple[str, Workload]]) -> None:
        self.check_target(self.out_dir, run=True)
        made = not self.out_dir.exists()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.lock = hold(self.out_dir, "--out")
        try:
            self.rows_path.touch()
            entries = [{"impl": impl, "workload": dataclasses.asdict(w)} for impl, w in plan]
            write_text(self.plan_path, json.dumps(entries) + "\n")
            self.write_meta(meta)
        except BaseException:  # the disk full, Ctrl-C: no half-made folder is left to refuse the same --out again
            self.release()
            for name in ("meta.json", self.plan_path.name, self.rows_path.name, LOCK_NAME):
                (self.out_dir / name).unlink(missing_ok=True)
            if made:
                with contextlib.suppress(OSError):
                    self.out_dir.rmdir()
            raise

    @classmethod
    def reopen(cls, out_dir: Path) -> tuple[RunWriter, dict[str, Any], list[tuple[str, Workload]]]:
        """An existing run folder for --resume: its writer (holding the finished rows), meta and plan."""
        writer = cls(out_dir)
        if not out_dir.is_dir():
            raise UsageError(f"--resume {out_dir}: no such folder (give the folder of the run to continue)")
        if not writer.plan_path.is_file() or not (out_dir / "meta.json").is_file():
            raise UsageError(f"--resume {out_dir}: not an attnbench run folder (no plan.json and meta.json)")
        writer.lock = hold(out_dir, "--resume")  # before its rows are read: another writer may append to them
        try:
            meta, plan = writer._read_back()
        except BaseException:  # a folder found damaged is let go again
            writer.release()
            raise
        return writer, meta, plan

    def _read_back(self) -> tuple[dict[str, Any], list[tuple[str, Workload]]]:
        """A reopened folder's meta and plan, its finished rows and its unfinished cases' repeats (each file
        rewritten up to a line a kill cut short)."""
        try:
            meta = json.loads((self.out_dir / "meta.json").read_text())
            plan = [(e["impl"], Workload(**e["workload"])) for e in json.loads(self.plan_path.read_text())]
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--resume {self.out_dir}: plan.json or meta.json is damaged ({exc})") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("settings"), dict):  # the sweep reads them
            raise UsageError(
                f"--resume {self.out_dir}: meta.json is damaged (no run settings: an object with 'settings')"
            )
        self.rows.extend(_read_jsonl(self.rows_path))
        write_text(self.rows_path, "".join(json.dumps(row) + "\n" for row in self.rows))
        finished = {case_key(row["impl"], row) for row in self.rows}
        repeats = _read_jsonl(self.repeats_path)
        for row in repeats:
            key = case_key(row["impl"], row)
            if key not in finished:
                self.partial.setdefault(key, []).append(row)
        if self.repeats_path.exists():
            write_text(self.repeats_path, "".join(json.dumps(row) + "\n" for row in repeats))
        return meta, plan

    def append(self, row: dict[str, Any]) -> None:
        row = {key: _clean(value) for key, value in row.items()}
        _append_line(self.rows_path, json.dumps(row) + "\n")
        self.rows.append(row)

    def repeats_done(self, key: tuple[Any, ...] | None = None) -> int:
        """Repeats kept of one unfinished case (by :func:`case_key`), or of every unfinished case."""
        if key is None:
            return sum(map(len, self.partial.values()))
        return len(self.partial.get(key, []))

    def finish_case(self, row: dict[str, Any]) -> None:
        """A case's final row (its repeats merged): appended, its kept repeats dropped."""
        self.append(row)
        self.partial.pop(case_key(row["impl"], row), None)

    def append_repeat(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Keep one repeat of a case (in repeats.jsonl too); returns every repeat of that case so far."""
        row = {key: _clean(value) for key, value in row.items()}
        _append_line(self.repeats_path, json.dumps(row) + "\n")
        rows = self.partial.setdefault(case_key(row["impl"], row), [])
        rows.append(row)
        return rows

    def finish(self, meta: dict[str, Any]) -> pd.DataFrame:
        frame = rows_to_frame(self.rows)
        write_frame(frame, self.out_dir)
        self.write_meta(meta)
        return frame

    def release(self) -> None:
        """Let the folder go (its lock): the run has written its files, or stopped before."""
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_text(self.out_dir / "meta.json", json.dumps(meta, indent=2, default=str) + "\n")


def _append_line(path: Path, line: str) -> None:
    """Append one whole line to ``path``, or nothing: a write that fails part-way (the disk filled) is cut back to
    where the file ended, so the file never holds half a row (which made ``report`` refuse the run), and the
    OSError names the file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.fstat(fd).st_size
        try:
            data = memoryview(line.encode())
            while data:
                data = data[os.write(fd, data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):  # truncating frees space: it needs none
                os.ftruncate(fd, end)
            raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        os.close(fd)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, up to a line cut short by a kill (that case runs again)."""
    rows: list[dict[str, Any]] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def write_frame(frame: pd.DataFrame, out_dir: Path) -> None:
    """results.parquet and results.csv (raw samples as a JSON list in the CSV), each written whole."""
    with replacing(out_dir / "results.parquet") as tmp:
        frame.to_parquet(tmp, index=False)
    csv = frame.copy()
    for column in LIST_COLUMNS:
        csv[column] = csv[column].map(lambda s: json.dumps(list(s)) if s is not None else "")
    with replacing(out_dir / "results.csv") as tmp:
        csv.to_csv(tmp, index=False)


def case_key(impl: str, workload_row: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a case within a run: the contender and the workload columns."""
    return (impl, *(workload_row.get(c, FEATURE_DEFAULTS.get(c)) for c in CASE_COLUMNS[1:]))


def fill_feature_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    """Missing or empty feature columns (older runs) read as their neutral values, in their dtypes; a missing
    column of an axis that follows another (head_dim_v, kv_dtype) as the other's values."""
    for axis in axes.DECLARED:
        followed = axes.BY_NAME[axis.follows].column if axis.follows else ""
        if followed in frame and axis.column not in frame:  # (not a results file at all: the caller says so)
            frame[axis.column] = frame[followed]
    for column, default in FEATURE_DEFAULTS.items():
        values = frame[column] if column in frame else pd.Series(default, index=frame.index)
        values = values.where(values.notna(), default) if len(frame) else values
        frame[column] = values.astype(type(default) if not isinstance(default, str) else object)
    return frame


def rows_to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows in the documented column order and dtypes."""
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for column in FLOAT_COLUMNS:
        frame[column] = frame[column].astype("float64")
    frame["unstable"] = frame["unstable"].astype("boolean")
    frame["cache_resident"] = frame["cache_resident"].astype("boolean")
    optional_sizes = [axis.column for axis in axes.WORKLOAD_AXES if axis.optional and axis.kind is int]
    for column in ("n_samples", "calls_per_sample", "checked_rows", "threads", *optional_sizes, "rounds"):
        frame[column] = frame[column].astype("Int64")
    return fill_feature_defaults(frame)


def load_results(run_dir: Path) -> pd.DataFrame:
    """A run folder's results as a DataFrame (Parquet, else the rows written so far); a file that cannot be read
    (truncated, corrupt) is a UsageError naming it."""
    parquet, rows_path = run_dir / "results.parquet", run_dir / "rows.jsonl"
    path = parquet if parquet.exists() else rows_path if rows_path.exists() else None
    if path is None:
        raise UsageError(f"{run_dir}: no results.parquet or rows.jsonl; is this an attnbench run folder?")
    try:
        if path == parquet:
            return fill_feature_defaults(pd.read_parquet(parquet))
        return rows_to_frame([json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()])
    except Exception as exc:  # pyarrow, pandas and json raise many types for a corrupt file: say which file
        raise UsageError(f"{path}: results file is unreadable ({type(exc).__name__}: {exc})") from None
