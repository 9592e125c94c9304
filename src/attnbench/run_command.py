"""`attnbench run`: plan a sweep (or reopen one with --resume), run it, save it, summarise it.

Every finished row is on disk at once (rows.jsonl); Ctrl-C or SIGTERM stops after the case in hand and
still writes a valid results file; ``--resume RUN_DIR`` runs only the planned cases with no row yet.
Cases run in a worker process by default, so a hung kernel costs its ``--timeout-s`` and a crash costs
one row, never the sweep. The contenders of one workload run together, timed in interleaved rounds;
``--repeat N`` runs the whole sweep N times, each pass in a fresh worker process (see repeats.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import torch

from attnbench import registry
from attnbench.allocator import configure_cpu_allocator
from attnbench.bandwidth_watch import BandwidthWatch
from attnbench.ceilings import Ceilings, load_ceilings
from attnbench.errors import UsageError
from attnbench.machine import environment
from attnbench.noise import environment_warnings, result_warnings
from attnbench.repeats import DECIDED_ONCE, merge_repeats
from attnbench.reports.summary import non_ok_reasons, status_counts, summary_table
from attnbench.results import RunWriter, case_key, make_row
from attnbench.runner import RunOptions, not_runnable, run_group
from attnbench.shard import parse_shard, shard_cases
from attnbench.suite import Suite, check_devices, expand, load_suite, model_suite
from attnbench.workload import Workload

SWEEP_FLAGS = ("suite", "impl", "batch", "heads", "kv_heads", "seq", "seq_kv", "head_dim", "dtype", "device",
               "mask", "pass", "shard", "window", "documents", "score_mod", "softcap", "page_size", "model",
               "phase")  # fmt: skip


def now() -> str:
    return dt.datetime.now().astimezone().isoformat()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's cancel, `kill`) stops the sweep the way Ctrl-C does."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure_ceilings(cases: list[tuple[str, Workload]], threads: int, remeasure: bool) -> dict[str, Ceilings]:
    runnable = [w for impl, w in cases if not_runnable(impl, w) is None]
    return {
        device: load_ceilings(device, sorted({w.dtype for w in runnable if w.device == device}), threads, remeasure)
        for device in sorted({w.device for w in runnable})
    }


def parse_repeat(text: str | int | None, isolate: str) -> int:
    """--repeat: a positive number of worker processes each case runs in (default 1)."""
    if text is None:
        return 1
    try:
        repeat = int(text)
    except ValueError:
        repeat = 0
    if repeat < 1 or str(text).strip() != str(repeat):
        raise UsageError(f"--repeat {text}: must be a positive integer (the number of processes each case runs in)")
    if repeat > 1 and isolate != "worker":
        raise UsageError(f"--repeat {repeat} runs each case in separate worker processes; drop --isolate none")
    return repeat


def _validate_numbers(args: argparse.Namespace) -> None:
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads {args.threads}: must be a positive integer")
    args.repeat = parse_repeat(args.repeat, args.isolate) if args.resume is None or args.repeat else None
    for flag, value in (("--budget-s", args.budget_s), ("--case-budget-s", args.case_budget_s),
                        ("--timeout-s", args.timeout_s)):  # fmt: skip
        if value is not None and not value > 0:
            raise UsageError(f"{flag} {value}: must be a positive number of seconds")


def _plan(args: argparse.Namespace, overrides: dict[str, list[Any]], default_out: Path) -> tuple[Any, ...]:
    """A new run: its writer, meta, cases and options. Nothing is written yet."""
    if isinstance(args.suite, Suite):  # attnbench.run() without a suite
        suite = args.suite
    else:
        suite = load_suite(args.suite or "quick") if args.suite or not overrides.get("model") else model_suite()
    cases = expand(suite, overrides, sorted(registry.load()), registry.sweep_names(), registry.available_sweep_names())
    shard = parse_shard(args.shard) if args.shard else None
    if shard:
        cases = shard_cases(cases, *shard)
    check_devices(cases)
    out = Path(args.out) if args.out else default_out
    RunWriter.check_target(out)
    budget_s, case_budget_s = args.budget_s or suite.budget_s, args.case_budget_s or suite.case_budget_s
    settings = {
        "budget_s": budget_s, "case_budget_s": case_budget_s, "threads": args.threads or torch.get_num_threads(),
        "seed": args.seed, "measure_memory": not args.no_memory, "cpu_allocator": args.cpu_allocator,
        "timeout_s": args.timeout_s or max(120.0, 2 * case_budget_s), "isolate": args.isolate,
        "remeasure_ceilings": args.remeasure_ceilings, "repeat": args.repeat,
    }  # fmt: skip
    meta = {"command": args.command_line, "suite": suite.name, "overrides": overrides,
            "shard": args.shard, "n_cases": len(cases), "settings": settings}  # fmt: skip
    return RunWriter(out), meta, cases


def _reopen(args: argparse.Namespace) -> tuple[Any, ...]:
    given = [f"--{flag.replace('_', '-')}" for flag in SWEEP_FLAGS if getattr(args, flag, None) not in (None, [])]
    given = [flag for flag in given if not (flag == "--suite" and args.suite == "quick")]  # quick: the default
    given += ["--out"] if args.out else []
    given += ["--repeat"] if args.repeat else []
    if given:
        raise UsageError(f"--resume takes the sweep from the run folder; drop {', '.join(given)}")
    writer, meta, cases = RunWriter.reopen(Path(args.resume))
    meta.setdefault("resumed", []).append({"command": args.command_line, "time": now()})
    return writer, meta, cases


def _store_target(args: argparse.Namespace) -> Path | None:
    """--store's database, checked before anything runs (a corrupt one is a usage error, nothing written)."""
    if not getattr(args, "store", False):
        if getattr(args, "db", None):
            raise UsageError("--db is for --store: add --store to keep the run in the results store")
        return None
    from attnbench.reports.store import DEFAULT_DB, check_store

    db = Path(args.db) if args.db else DEFAULT_DB
    check_store(db)
    return db


class Finished(NamedTuple):
    """What :func:`run_sweep` leaves: the results frame and what the summary needs."""

    frame: pd.DataFrame
    writer: RunWriter
    meta: dict[str, Any]
    warnings: list[str]
    interrupted: bool
    store_db: Path | None = None  # --store: the results database to add the run to


def _check_worker_can_load(cases: list[tuple[str, Workload]], isolate: str) -> None:
    """A contender registered in this process runs in the worker only if the worker can import its class."""
    if isolate != "worker":
        return
    _, problems = registry.in_process_references()
    for impl in dict.fromkeys(impl for impl, _ in cases):
        if impl in problems:
            raise UsageError(
                f"contender {impl!r} was registered in this process and {problems[impl]}, so the worker process "
                'cannot load it: define it in an importable module, or run in this process with isolate="none" '
                "(--isolate none)"
            )


def run_sweep(args: argparse.Namespace, overrides: dict[str, list[Any]], default_out: Path) -> Finished:
    """Plan the sweep (or reopen it with --resume), run it, save the run folder; print only warnings.

    Shared by ``attnbench run`` (:func:`cmd_run`) and the Python API (:func:`attnbench.run`)."""
    _validate_numbers(args)
    store_db = _store_target(args)
    resuming = args.resume is not None
    writer, meta, cases = _reopen(args) if resuming else _plan(args, overrides, default_out)
    settings = meta["settings"]
    _check_worker_can_load(cases, settings["isolate"])
    done = {case_key(row["impl"], row) for row in writer.rows}
    todo = [(impl, w) for impl, w in cases if case_key(impl, {**w.as_row()}) not in done]
    allocator = configure_cpu_allocator(settings["cpu_allocator"])
    warnings = environment_warnings()
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    ceilings = _measure_ceilings(todo, settings["threads"], settings["remeasure_ceilings"] and not resuming)
    options = RunOptions(
        budget_s=settings["budget_s"], case_budget_s=settings["case_budget_s"], threads=settings["threads"],
        seed=settings["seed"], measure_memory=settings["measure_memory"], ceilings=ceilings,
    )  # fmt: skip
    meta.update(cpu_allocator=allocator, warnings=warnings, environment=environment(options.threads),
                ceilings={**meta.get("ceilings", {}), **{d: asdict(c) for d, c in ceilings.items()}},
                end_time=None, finished=False)  # fmt: skip
    meta.setdefault("start_time", now())
    bandwidth = BandwidthWatch(meta, ceilings, options.threads)  # measured now and after the sweep
    if resuming:
        writer.write_meta(meta)
        print(f"resuming {writer.out_dir}: {len(done)} of {len(cases)} cases done, {len(todo)} to run",
              file=sys.stderr)  # fmt: skip
    else:
        writer.start(meta, cases)
    interrupted = sweep(todo, options, writer, settings, args.progress)
    for warning in bandwidth.after(interrupted):
        print(f"warning: {warning}", file=sys.stderr)
        warnings.append(warning)
    meta.update(end_time=now(), finished=not interrupted)
    return Finished(writer.finish(meta), writer, meta, warnings, interrupted, store_db)


def cmd_run(args: argparse.Namespace, overrides: dict[str, list[Any]], default_out: Path) -> int:
    frame, writer, meta, warnings, interrupted, store_db = run_sweep(args, overrides, default_out)
    _summarise(frame, writer, meta, warnings)
    if store_db is not None:
        from attnbench.reports.store import store_runs

        (stored,) = store_runs([writer.out_dir], store_db)
        print(f"stored: {stored.action} in {store_db} (run_id {stored.run_id})")
    if interrupted:
        print(f"interrupted: finished rows are saved; continue with: attnbench run --resume {writer.out_dir}",
              file=sys.stderr)  # fmt: skip
        return 130
    return 0


def group_by_workload(cases: list[tuple[str, Workload]]) -> list[tuple[Workload, list[str]]]:
    """The cases as (workload, contenders) groups, in the order workloads first appear."""
    groups: dict[Workload, list[str]] = {}
    for impl, workload in cases:
        groups.setdefault(workload, []).append(impl)
    return list(groups.items())


def sweep(cases: list[tuple[str, Workload]], options: RunOptions, writer: RunWriter, settings: dict[str, Any],
          progress_mode: str) -> bool:  # fmt: skip
    """Run the cases, appending each row as it finishes; True if interrupted.

    The contenders of a workload run as one group (timed in interleaved rounds). With ``repeat`` N > 1 the
    sweep is run N times, each pass in a fresh worker process; a case's row is written when its last
    repeat is in (or at once when a repeat is not ok)."""
    from attnbench.worker import CaseWorker

    repeat = int(settings.get("repeat") or 1)
    torch.set_num_threads(options.threads)
    progress = _progress(len(cases) * repeat - sum(map(len, writer.partial.values())), progress_mode)
    worker: CaseWorker | None = None
    finished: set[tuple[Any, ...]] = set()

    def keep(row: dict[str, Any]) -> None:
        key = case_key(row["impl"], row)
        if repeat == 1 or (row["status"] in DECIDED_ONCE and key not in writer.partial):
            writer.append(merge_repeats([row]))
            finished.add(key)
            progress.update(repeat)
            return
        rows = writer.append_repeat(row)
        progress.update(1)
        if len(rows) == repeat or row["status"] != "ok":
            writer.append(merge_repeats(rows))
            finished.add(key)
            progress.update(repeat - len(rows))
            del writer.partial[key]

    references = tuple(registry.in_process_references()[0].values())  # contenders register()ed here
    try:
        with sigterm_as_interrupt():
            for pass_number in range(repeat):
                if worker is not None:  # every pass in a fresh process
                    worker.close()
                worker = (
                    CaseWorker(options, settings["cpu_allocator"], settings["timeout_s"], references)
                    if settings["isolate"] == "worker"
                    else None
                )
                for workload, impls in group_by_workload(cases):
                    todo = []
                    for impl in impls:
                        key = case_key(impl, workload.as_row())
                        if key in finished or len(writer.partial.get(key, [])) > pass_number:
                            continue
                        verdict = not_runnable(impl, workload)
                        if verdict is not None:
                            keep(make_row(impl, workload, *verdict))
                        else:
                            todo.append(impl)
                    if not todo:
                        continue
                    progress.set_description_str(f"{','.join(todo)} {workload.label()}")
                    rows = worker.run_group(todo, workload) if worker else run_group(todo, workload, options)
                    for row in rows:
                        keep(row)
    except KeyboardInterrupt:
        return True
    finally:
        progress.close()
        if worker is not None:
            worker.close()
    return False


def _summarise(frame: pd.DataFrame, writer: RunWriter, meta: dict[str, Any], warnings: list[str]) -> None:
    print(summary_table(frame))
    print(f"\n{len(frame)} cases: {status_counts(frame)}")
    reasons = non_ok_reasons(frame)
    if reasons:
        print(reasons)
    late = result_warnings(frame)
    if late:
        meta["warnings"] = warnings + late
        writer.write_meta(meta)
    for warning in warnings + late:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"results: {writer.out_dir / 'results.parquet'} (also results.csv, meta.json)")


def _progress(total: int, mode: str) -> Any:
    from tqdm import tqdm

    disable = mode == "off" or (mode == "auto" and not sys.stderr.isatty())
    return tqdm(total=total, unit="case", disable=disable, file=sys.stderr, dynamic_ncols=True)
