"""Load runs into one documented pandas schema.

A run is either an attnbench run folder (``results.parquet`` or, for an interrupted run, ``rows.jsonl``,
plus ``meta.json``) or a pytest-benchmark JSON file written by our pytest front end
(``pytest suites/ --benchmark-json=FILE``). Every row gets the results columns (see
``attnbench.runner.results.COLUMNS``) plus:

* ``run`` — which run it came from (the folder or file name, made unique);
* ``machine`` — the machine it ran on (CPU or GPU name and host), so identical cases from different
  machines never collide;
* ``source`` — ``attnbench`` or ``pytest-benchmark``.

A merged folder (``attnbench merge``) is one run to whoever reads its rows, and the runs it was made of to
whoever reads a run's meta.json: :func:`parts` gives those, each with its own rows and meta (environment,
ceilings, warnings, start time), so that `report`, `compare` and `store` read a merged folder as they read
its shards.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.errors import UsageError
from attnbench.runner.reproduce import Reproducer
from attnbench.runner.results import CASE_COLUMNS, COLUMNS, fill_feature_defaults, load_results, rows_to_frame
from attnbench.workload.axes import MODEL, case_label, is_decode

EXTRA_COLUMNS = ["run", "machine", "source"]
ESSENTIAL = [
    "impl",
    "device",
    "dtype",
    "batch",
    "heads",
    "kv_heads",
    "seq_q",
    "seq_k",
    "head_dim",
    "mask",
    "pass",
    "status",
    "reason",
    "median_ms",
]
CASE_KEY = ["machine", *CASE_COLUMNS]  # identical cases from different machines never collide


@dataclass
class Run:
    name: str
    path: Path
    frame: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)


def machine_label(environment: dict[str, Any]) -> str:
    gpus = environment.get("gpu_names") or []
    device = gpus[0] if gpus else environment.get("cpu_name") or "unknown machine"
    host = environment.get("hostname")
    threads = environment.get("threads")
    label = f"{device} ×{threads} threads" if threads and not gpus else device
    return f"{label} @ {host}" if host else label


def environment_line(meta: dict[str, Any]) -> str:
    """What a run ran on and with, in one line for a reader: the machine (its threads of how many cores, the GPU's
    driver), attnbench's version and commit (``+edits`` where its tracked files had changed), the checkout it ran
    in where that differs, torch, Python, the plugins and when it started — what a colleague asks first, which the
    pages held only in a JSON dump at their end (the compare page nowhere)."""
    env = meta.get("environment") or {}
    if not env:
        return "no environment recorded (no meta.json)"
    machine = machine_label(env)
    if env.get("cpu_count") and not env.get("gpu_names"):
        machine += f" ({env['cpu_count']} CPU cores)"
    if env.get("nvidia_driver"):
        machine += f", NVIDIA driver {env['nvidia_driver']}"
    commit, dirty = env.get("git_commit"), env.get("git_dirty")
    code = f"attnbench {env.get('attnbench_version', '?')}"
    code += f" at {str(commit)[:12]}{'+edits' if dirty else ''}" if commit else " (not from a git checkout)"
    workdir = env.get("workdir_commit")
    if workdir and workdir != commit:
        code += f", run in a checkout at {str(workdir)[:12]}{'+edits' if env.get('workdir_dirty') else ''}"
    torch = f"torch {env.get('torch_version', '?')}" + (f" (CUDA {env['torch_cuda']})" if env.get("torch_cuda") else "")
    parts = [machine, code, torch, f"Python {env.get('python', '?')}"]
    parts += [f"{name} {version}" for name, version in (env.get("plugins") or {}).items()]
    if meta.get("start_time"):
        try:
            stamp = pd.Timestamp(meta["start_time"])
            parts.append(f"started {stamp:%Y-%m-%d %H:%M} {stamp.tzname() or ''}".rstrip())
        except ValueError:
            parts.append(f"started {meta['start_time']}")
    return "; ".join(parts)


def without_threads(label: str) -> str:
    """A :func:`machine_label` less its CPU thread count: the hardware and host, not a setting of the run."""
    return re.sub(r" ×\d+ threads", "", label)


def _load_meta(folder: Path) -> dict[str, Any]:
    path = folder / "meta.json"
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: expected a JSON object")
    return meta


def _load_folder(path: Path) -> Run:
    frame = load_results(path)  # a file it cannot read is a UsageError naming it
    missing = [c for c in ESSENTIAL if c not in frame.columns]
    if missing:
        raise UsageError(f"{path}: not an attnbench results file (missing columns: {', '.join(missing[:5])})")
    frame = frame.reindex(columns=list(dict.fromkeys([*COLUMNS, *frame.columns])))  # older runs lack newer columns
    frame = fill_feature_defaults(frame)
    meta = _load_meta(path)
    if not meta:  # results.csv copied without its meta.json: the rows are whole, what they ran on is not
        note = (
            "no meta.json beside its results: its machine, versions and ceilings are unknown (its rows read "
            "'unknown machine', apart from every other run's), and its reproduce commands lack the run's settings"
        )
        print(f"note: {path}: {note}", file=sys.stderr)
        meta = {"warnings": [note]}
    return Run(path.name, path, _fill_reproduce(frame, meta), meta)


def _fill_reproduce(frame: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """A run written before the ``reproduce`` column gets its commands from its rows and meta.json."""
    missing = frame["reproduce"].isna()
    if missing.any():
        reproduce = Reproducer.of_meta(meta)
        frame["reproduce"] = frame["reproduce"].astype(object)
        frame.loc[missing, "reproduce"] = [reproduce(row) for row in frame[missing].to_dict("records")]
    return frame


def _pytest_benchmark_row(bench: dict[str, Any]) -> dict[str, Any]:
    info = bench.get("extra_info") or {}
    if "impl" not in info:
        raise KeyError("extra_info has no attnbench workload (was it written by `pytest suites/`?)")
    stats = bench["stats"]
    median_ms = stats["median"] * 1e3
    flops, traffic = info.get("flops"), info.get("bytes")  # bytes: written since session 42's front end
    tflops = flops / (median_ms * 1e-3) / 1e12 if flops else None
    roof, matmul = info.get("roof_tflops"), info.get("matmul_roof_tflops")  # since session 43's front end
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update({key: info.get(key) for key in COLUMNS if key in info})
    row.update(
        status="ok" if info.get("correct") else "incorrect",
        reason="" if info.get("correct") else "over tolerance (pytest-benchmark run)",
        median_ms=median_ms,
        iqr_ms=stats["iqr"] * 1e3,
        n_samples=stats["rounds"],
        calls_per_sample=stats.get("iterations", 1),
        timing_method="pytest-benchmark",
        tflops=tflops,
        pct_of_peak=100 * tflops / roof if tflops and roof else None,
        pct_of_matmul=100 * tflops / matmul if tflops and matmul else None,
        gbps=traffic / (median_ms * 1e-3) / 1e9 if traffic else None,
        intensity=flops / traffic if flops and traffic else None,
        samples_ms=[t * 1e3 for t in stats["data"]] if stats.get("data") else None,
    )
    return row


def _load_pytest_benchmark(path: Path) -> Run:
    """A pytest-benchmark JSON file's attnbench cases. A suite that runs attnbench's cases beside its own
    benchmarks writes them into one file: the others are left out, with a note naming them (stderr and the
    run's ``warnings``); a file with no attnbench case is refused."""
    try:
        data = json.loads(path.read_text())
        ours, others = [], []
        for bench in data["benchmarks"]:
            if "impl" in (bench.get("extra_info") or {}):
                ours.append(bench)
            else:
                others.append(str(bench.get("name", "?")))
        rows = [_pytest_benchmark_row(bench) for bench in ours]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a pytest-benchmark JSON file from attnbench's suites ({exc})") from None
    if not rows:
        raise UsageError(
            f"{path}: none of its {len(others)} benchmark(s) has an attnbench workload in extra_info "
            "(attnbench's cases are suites/test_benchmarks.py's test_attention)"
        )
    machine = data.get("machine_info", {})
    environment = {"cpu_name": (machine.get("cpu") or {}).get("brand_raw"), "hostname": machine.get("node")}
    meta: dict[str, Any] = {"environment": environment, "command": "pytest suites/ --benchmark-json (pytest-benchmark)"}
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        note = f"{len(others)} benchmark(s) without an attnbench workload left out: {shown}"
        print(f"note: {path}: {note}", file=sys.stderr)
        meta["warnings"] = [note]
    return Run(path.stem, path, rows_to_frame(rows), meta)


def load_run(path: Path) -> Run:
    if path.is_dir():
        return _load_folder(path)
    if path.is_file() and path.suffix == ".json":
        return _load_pytest_benchmark(path)
    raise UsageError(f"{path}: not a run folder or a pytest-benchmark .json file")


def merged_from(meta: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The runs a merged folder's meta.json says it was made of (``merged_from``: each one's ``run`` name, ``path``
    and ``meta``), a merged folder merged again replaced by its own; None for a run that is not merged."""
    entries = meta.get("merged_from")
    if not isinstance(entries, list):
        return None
    flat: list[dict[str, Any]] = []
    for entry in entries:
        inner = merged_from(entry.get("meta") or {}) if isinstance(entry, dict) else None
        flat += inner if inner is not None else [entry if isinstance(entry, dict) else {}]
    return flat


def parts(run: Run) -> list[Run]:
    """The runs a merged folder was made of, each with its rows (by the ``run`` column) and its own meta.json; a
    run that is not merged is its own one part. A merged folder whose rows name a run its meta.json does not is
    bad input (a UsageError): its rows would lose their environment."""
    entries = merged_from(run.meta)
    if entries is None:
        return [run]
    names = [str(entry.get("run")) for entry in entries]
    rows = run.frame["run"].astype(object) if "run" in run.frame else pd.Series(None, index=run.frame.index)
    stray = sorted({str(name) for name in rows.where(rows.notna(), "(none)")} - set(names))
    if stray:
        raise UsageError(
            f"{run.path / 'meta.json'}: its rows come from run(s) {', '.join(stray)}, which its merged_from does not "
            f"name (it names {', '.join(names) or 'none'}): merge the runs again"
        )
    found = []
    for name, entry in zip(names, entries, strict=True):
        given = entry.get("meta")
        meta: dict[str, Any] = given if isinstance(given, dict) else {}
        found.append(
            Run(name, Path(str(entry.get("path") or name)), run.frame[rows == name].reset_index(drop=True), meta)
        )
    return found


def all_parts(runs: list[Run]) -> list[Run]:
    """Every run's :func:`parts`, in order."""
    return [part for run in runs for part in parts(run)]


def _unique(name: str, seen: dict[str, int]) -> str:
    count = seen.get(name, 0)
    seen[name] = count + 1
    return f"{name}#{count + 1}" if count else name


def load_runs(paths: list[Path]) -> tuple[pd.DataFrame, list[Run]]:
    """All runs in one frame with ``run``, ``machine`` and ``source`` columns. Run names are made unique, those of
    a merged folder's parts too (its rows' ``run`` and its merged_from renamed alike, so :func:`parts` holds)."""
    runs = [load_run(p) for p in paths]
    seen: dict[str, int] = {}
    frames = []
    for run in runs:
        run.name = _unique(run.name, seen)
        own = {
            "run": run.name,
            "machine": machine_label(run.meta.get("environment") or {}),
            "source": "pytest-benchmark" if run.path.is_file() else "attnbench",
        }
        # A merged folder already says, per row, which run and machine each row came from: keep that.
        kept = {c: v for c, v in own.items() if c not in run.frame or run.frame[c].isna().all()}
        run.frame = run.frame.assign(**kept)
        entries = merged_from(run.meta)
        if entries:
            renamed = {}
            for entry in entries:
                old = str(entry.get("run"))
                entry["run"] = renamed[old] = _unique(old, seen)
            run.frame["run"] = [renamed.get(str(name), name) for name in run.frame["run"]]
        frames.append(run.frame)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS + EXTRA_COLUMNS)
    return frame, runs


def workload_label(row: Any, with_seq: bool = True) -> str:
    """'cpu float32 B1 H8/2 S128x256 D64 causal fwd' from a results row (a dict or Series): the core's case
    label (``attnbench.workload.axes.case_label``) with the machine's side first."""
    return case_label(row, with_seq=with_seq, device_first=True)


def phase_of(row: Any) -> str:
    """'decode' for a short query against a longer KV cache (Sq ≤ 16 < Sk), else 'prefill'."""
    return "decode" if is_decode(row) else "prefill"


def group_label(row: Any) -> str:
    """A figure facet: the workload without the query length (the x axis); Sk kept when it differs. A
    model's rows are grouped by model and phase, and decode groups leave out the KV length (their x axis)."""
    label = workload_label(row, with_seq=False)
    if phase_of(row) == "decode":
        return f"{label} decode Sq{row['seq_q']}"
    if MODEL.read(row):
        label += " prefill"
    return f"{label} Sk{row['seq_k']}" if row["seq_k"] != row["seq_q"] else label


def labels(frame: pd.DataFrame) -> list[str]:
    return [workload_label(r) for r in frame.to_dict("records")]
