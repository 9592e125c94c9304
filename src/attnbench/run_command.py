"""`attnbench run`: plan a sweep (or reopen one with --resume), run it, save it, summarise it.

Every finished row is on disk at once (rows.jsonl); Ctrl-C or SIGTERM stops after the case in hand and
still writes a valid results file; ``--resume RUN_DIR`` runs only the planned cases with no row yet.
Cases run in a worker process by default, so a hung kernel costs its ``--timeout-s`` and a crash costs
one row, never the sweep.
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
from typing import Any

import pandas as pd
import torch

from attnbench import registry
from attnbench.allocator import configure_cpu_allocator
from attnbench.ceilings import Ceilings, load_ceilings
from attnbench.errors import UsageError
from attnbench.machine import environment
from attnbench.noise import environment_warnings, result_warnings
from attnbench.reports.summary import non_ok_reasons, status_counts, summary_table
from attnbench.results import RunWriter, case_key
from attnbench.runner import RunOptions, not_runnable, run_case
from attnbench.shard import parse_shard, shard_cases
from attnbench.suite import check_devices, expand, load_suite, model_suite
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


def _validate_numbers(args: argparse.Namespace) -> None:
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads {args.threads}: must be a positive integer")
    for flag, value in (("--budget-s", args.budget_s), ("--case-budget-s", args.case_budget_s),
                        ("--timeout-s", args.timeout_s)):  # fmt: skip
        if value is not None and not value > 0:
            raise UsageError(f"{flag} {value}: must be a positive number of seconds")


def _plan(args: argparse.Namespace, overrides: dict[str, list[Any]], default_out: Path) -> tuple[Any, ...]:
    """A new run: its writer, meta, cases and options. Nothing is written yet."""
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
        "remeasure_ceilings": args.remeasure_ceilings,
    }  # fmt: skip
    meta = {"command": args.command_line, "suite": suite.name, "overrides": overrides,
            "shard": args.shard, "n_cases": len(cases), "settings": settings}  # fmt: skip
    return RunWriter(out), meta, cases


def _reopen(args: argparse.Namespace) -> tuple[Any, ...]:
    given = [f"--{flag.replace('_', '-')}" for flag in SWEEP_FLAGS if getattr(args, flag, None) not in (None, [])]
    given = [flag for flag in given if not (flag == "--suite" and args.suite == "quick")]  # quick: the default
    given += ["--out"] if args.out else []
    if given:
        raise UsageError(f"--resume takes the sweep from the run folder; drop {', '.join(given)}")
    writer, meta, cases = RunWriter.reopen(Path(args.resume))
    meta.setdefault("resumed", []).append({"command": args.command_line, "time": now()})
    return writer, meta, cases


def cmd_run(args: argparse.Namespace, overrides: dict[str, list[Any]], default_out: Path) -> int:
    _validate_numbers(args)
    resuming = args.resume is not None
    writer, meta, cases = _reopen(args) if resuming else _plan(args, overrides, default_out)
    settings = meta["settings"]
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
    if resuming:
        writer.write_meta(meta)
        print(f"resuming {writer.out_dir}: {len(done)} of {len(cases)} cases done, {len(todo)} to run",
              file=sys.stderr)  # fmt: skip
    else:
        writer.start(meta, cases)
    interrupted = sweep(todo, options, writer, settings, args.progress)
    meta.update(end_time=now(), finished=not interrupted)
    frame = writer.finish(meta)
    _summarise(frame, writer, meta, warnings)
    if interrupted:
        print(f"interrupted: finished rows are saved; continue with: attnbench run --resume {writer.out_dir}",
              file=sys.stderr)  # fmt: skip
        return 130
    return 0


def sweep(cases: list[tuple[str, Workload]], options: RunOptions, writer: RunWriter, settings: dict[str, Any],
          progress_mode: str) -> bool:  # fmt: skip
    """Run the cases, appending each row as it finishes; True if interrupted."""
    from attnbench.worker import CaseWorker

    torch.set_num_threads(options.threads)
    progress = _progress(len(cases), progress_mode)
    worker = (
        CaseWorker(options, settings["cpu_allocator"], settings["timeout_s"])
        if settings["isolate"] == "worker"
        else None
    )
    try:
        with sigterm_as_interrupt():
            for impl, workload in cases:
                progress.set_description_str(f"{impl} {workload.label()}")
                verdict = not_runnable(impl, workload)
                if worker is None or verdict is not None:
                    row = run_case(impl, workload, options)
                else:
                    row = worker.run(impl, workload)
                writer.append(row)
                progress.update(1)
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
