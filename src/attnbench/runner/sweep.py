"""Run a :class:`RunRequest`: plan the sweep (or reopen one with --resume), run it, save the run folder.

Every finished row is on disk at once (rows.jsonl); Ctrl-C, SIGTERM or SIGHUP stops after the case in hand
and still writes a valid results file — a second signal cuts the case in hand short, a third exits at once
(see _interrupts.py); ``--resume RUN_DIR`` runs only the planned cases with no row yet.
Cases run in a worker process by default, so a hung kernel costs its ``--timeout-s`` and a crash costs
one row, never the sweep. The contenders of one workload run together, timed in interleaved rounds;
``--repeat N`` runs the whole sweep N times, each pass in a fresh worker process (see _repeats.py).
``attnbench run`` (cli.py) and :func:`attnbench.run` both build a request and call :func:`run_sweep`; the
command then prints the summary and stores the run (reports are the command's, not the core's).
"""

from __future__ import annotations

import datetime as dt
import math
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import torch

from attnbench.contenders import registry
from attnbench.errors import UsageError
from attnbench.measure._bandwidth_watch import BandwidthWatch
from attnbench.measure._ceilings import Ceilings, load_ceilings
from attnbench.measure.allocator import configure_cpu_allocator
from attnbench.measure.environment import environment
from attnbench.runner._interrupts import StopSignals
from attnbench.runner._noise import environment_warnings, result_warnings
from attnbench.runner._repeats import DECIDED_ONCE, merge_repeats
from attnbench.runner._shard import shard_cases, shard_plan
from attnbench.runner.cases import RunOptions, not_runnable, run_group
from attnbench.runner.reproduce import Reproducer
from attnbench.runner.request import DEFAULT_SUITE, RunRequest, RunSettings
from attnbench.runner.results import RunWriter, case_key, make_row
from attnbench.workload import Workload
from attnbench.workload.axes import IMPL, MODEL
from attnbench.workload.masks import unseeing_share
from attnbench.workload.suite import Suite, check_devices, expand, load_suite, model_suite

# What a fresh process's torch takes without --threads (a sweep sets torch's threads, so read it at import):
# a row's reproduce command gives --threads when the run's differ.
DEFAULT_THREADS = torch.get_num_threads()


def now() -> str:
    return dt.datetime.now().astimezone().isoformat()


def _measure_ceilings(cases: list[tuple[str, Workload]], threads: int, remeasure: bool) -> dict[str, Ceilings]:
    runnable = [w for impl, w in cases if not_runnable(impl, w) is None]
    return {
        device: load_ceilings(
            device, sorted({d for w in runnable if w.device == device for d in _dots(w)}), threads, remeasure
        )
        for device in sorted({w.device for w in runnable})
    }


def _dots(w: Workload) -> set[str]:
    """The types whose rates a case's row reads: its dtype, and on a GPU an fp8 forward's (its dots' type)."""
    return {w.dtype, w.compute_dtype} if w.device == "cuda" else {w.dtype}


LEFT_OUT_REASONS = 3  # the distinct reasons a left-out contender's line names, at most


def plan_cases(
    request: RunRequest,
    left_out: dict[str, str] | None = None,
    partly: list[str] | None = None,
    plan: dict[str, Any] | None = None,
) -> tuple[Suite, list[tuple[str, Workload]]]:
    """The suite a new run's request names and its (contender, workload) cases, this shard's only. A contender
    that ``all`` brought in and that suits none of a sweep's workloads is left out of it; ``left_out`` receives
    its name and its workloads' distinct reasons, ``partly`` the names of those that still run in another sweep,
    ``plan`` (with --shard) what the partition was computed from (_shard.shard_plan: the whole sweep's workloads)."""
    if isinstance(request.suite, Suite):
        suite = request.suite
    elif request.suite or not request.axes.get(MODEL.name):
        suite = load_suite(request.suite or DEFAULT_SUITE)
    else:
        suite = model_suite()
    overrides = dict(request.axes)
    said = {} if left_out is None else left_out
    reasons_of: dict[str, list[str]] = {}

    def never_applies(impl: str, workloads: list[Workload]) -> bool:
        entry = registry.get(impl)
        if not entry.available or entry.contender is None or not workloads:
            return False  # unavailable: its one reason is listed anyway
        try:
            reasons = [entry.contender.unsupported_reason(w) for w in workloads]
        except Exception:  # a contender that cannot say: plan it, its rows will
            return False
        if not all(reasons):
            return False
        known = reasons_of.setdefault(impl, [])
        known += [str(r) for r in dict.fromkeys(reasons) if str(r) not in known]
        shown = "; ".join(known[:LEFT_OUT_REASONS]) + ("; …" if len(known) > LEFT_OUT_REASONS else "")
        said[impl] = shown
        return True

    cases = expand(
        suite,
        overrides,
        sorted(registry.load()),
        registry.sweep_names(),
        registry.available_sweep_names,
        never_applies,
    )
    if partly is not None:  # left out of some sweeps, planned in another
        planned = {impl for impl, _ in cases}
        partly += [impl for impl in said if impl in planned]
    shard = request.shard_slice
    if shard:  # partitioned by the sweep's workloads, whichever contenders this machine has or leaves out
        workloads = [w for _, w in expand(suite, {**overrides, IMPL.name: ["-"]}, ["-"], check_flags=False)]
        if plan is not None:
            plan.update(shard_plan(workloads))
        cases = shard_cases(cases, *shard, workloads=workloads)
    return suite, cases


def _plan(request: RunRequest, default_out: Path) -> tuple[RunWriter, dict[str, Any], list[tuple[str, Workload]]]:
    """A new run: its writer, meta and cases. Nothing is written yet."""
    left_out: dict[str, str] = {}
    partly: list[str] = []
    plan: dict[str, Any] = {}
    suite, cases = plan_cases(request, left_out, partly, plan)
    check_devices(cases)
    out = request.out or default_out
    RunWriter.check_target(out, run=True)
    settings = RunSettings.resolve(request, suite, torch.get_num_threads())
    meta = {
        "command": request.command,
        "suite": suite.name,
        "overrides": dict(request.axes),
        "shard": "/".join(map(str, shard)) if (shard := request.shard_slice) else None,  # ' 2/3' as '2/3'
        **({"shard_plan": plan} if plan else {}),
        "n_cases": len(cases),
        "settings": settings.as_meta(),
        "default_threads": DEFAULT_THREADS,
        "left_out": left_out,
        "left_out_partly": partly,
    }
    return RunWriter(out), meta, cases


def _reopen(request: RunRequest) -> tuple[RunWriter, dict[str, Any], list[tuple[str, Workload]]]:
    assert request.resume is not None
    writer, meta, cases = RunWriter.reopen(request.resume)
    meta.setdefault("resumed", []).append({"command": request.command, "time": now()})
    return writer, meta, cases


class Finished(NamedTuple):
    """What :func:`run_sweep` leaves: the results frame and what the summary needs."""

    frame: pd.DataFrame
    writer: RunWriter
    meta: dict[str, Any]
    warnings: list[str]
    interrupted: bool
    stop: StopSignals | None = None  # the run's signal counter: the CLI keeps it installed while it summarises


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


def run_sweep(request: RunRequest, default_out: Path, say_late: bool = True) -> Finished:
    """Plan the sweep (or reopen it with --resume), run it, save the run folder; print only warnings: those
    known before the sweep at once, and with ``say_late`` those its end raises (``attnbench run`` says every
    warning again under its table, so it passes False rather than say one twice within a few lines).

    Shared by ``attnbench run`` and the Python API (:func:`attnbench.run`)."""
    resuming = request.resume is not None
    writer, meta, cases = _reopen(request) if resuming else _plan(request, default_out)
    try:  # the folder is this process's until its files are written (or it stops): then let go of it
        return _sweep(request, writer, meta, cases, say_late)
    finally:
        writer.release()


def _sweep(
    request: RunRequest, writer: RunWriter, meta: dict[str, Any], cases: list[tuple[str, Workload]], say_late: bool
) -> Finished:
    """:func:`run_sweep` once its folder is planned or reopened (and held)."""
    resuming = request.resume is not None
    settings = RunSettings.from_meta(meta["settings"])
    _check_worker_can_load(cases, settings.isolate)
    done = {case_key(row["impl"], row) for row in writer.rows}
    todo = [(impl, w) for impl, w in cases if case_key(impl, {**w.as_row()}) not in done]
    allocator = configure_cpu_allocator(settings.cpu_allocator)
    warnings = environment_warnings() + plan_warnings([w for _, w in todo]) + _empty_shard(meta, cases)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    ceilings = _measure_ceilings(todo, settings.threads, settings.remeasure_ceilings and not resuming)
    options = RunOptions(
        budget_s=settings.budget_s,
        case_budget_s=settings.case_budget_s,
        threads=settings.threads,
        seed=settings.seed,
        measure_memory=settings.measure_memory,
        ceilings=ceilings,
    )
    meta.update(
        cpu_allocator=allocator,
        warnings=warnings,
        environment=environment(options.threads),
        ceilings={**meta.get("ceilings", {}), **{d: asdict(c) for d, c in ceilings.items()}},
        end_time=None,
        finished=False,
    )
    meta.setdefault("start_time", now())
    bandwidth = BandwidthWatch(meta, ceilings, options.threads)  # measured now and after the sweep
    if resuming:
        writer.write_meta(meta)
        print(
            f"resuming {writer.out_dir}: {len(done)} of {len(cases)} cases done, {len(todo)} to run",
            file=sys.stderr,
        )
    else:
        writer.start(meta, cases)
    with StopSignals(writer.out_dir, _exit_at_once) as stop:  # until the results are written
        interrupted = run_cases(todo, options, writer, settings, request.progress, stop, Reproducer.of_meta(meta))
        for warning in bandwidth.after(interrupted):
            if say_late:
                print(f"warning: {warning}", file=sys.stderr)
            warnings.append(warning)
        meta.update(end_time=now(), finished=not interrupted)
        frame = writer.finish(meta)
    return Finished(frame, writer, meta, warnings, interrupted, stop)


def _exit_at_once() -> None:
    """Before the third signal's exit: no worker left behind, no half-written temporary file."""
    from attnbench.runner._worker import kill_workers
    from attnbench.runner.results import remove_unfinished

    kill_workers()
    remove_unfinished()


BLIND_SHARE = 0.5  # a workload where more query rows than this see no key is said before the run


def plan_warnings(workloads: list[Workload]) -> list[str]:
    """What the plan itself gets wrong: workloads where most query rows see no key (masks.unseeing_share)."""
    blind = {w.label(): share for w in dict.fromkeys(workloads) if (share := unseeing_share(w)) > BLIND_SHARE}
    if not blind:
        return []
    label, share = max(blind.items(), key=lambda item: item[1])
    return [
        f"{len(blind)} workload(s) where most query rows see no key (e.g. {label}: {share:.0%} of its rows), "
        "which output zeros and do no work: give the keys at least the queries' length (--seq-kv ≥ --seq)"
    ]


def _empty_shard(meta: dict[str, Any], cases: list[tuple[str, Workload]]) -> list[str]:
    """A shard that owns no workload (more shards than the sweep has workloads) says so: it runs nothing."""
    if not meta.get("shard") or cases:
        return []
    workloads = (meta.get("shard_plan") or {}).get("workloads", 0)
    return [
        f"shard {meta['shard']} holds none of this sweep's {workloads} workload(s) (a shard takes whole workloads, "
        "and there are more shards than workloads): it runs nothing"
    ]


def late_warnings(finished: Finished) -> list[str]:
    """Warnings the results themselves raise (unstable timings…), added to meta.json; every warning back."""
    late = result_warnings(finished.frame)
    if late:
        finished.meta["warnings"] = finished.warnings + late
        finished.writer.write_meta(finished.meta)
    return finished.warnings + late


def group_by_workload(cases: list[tuple[str, Workload]]) -> list[tuple[Workload, list[str]]]:
    """The cases as (workload, contenders) groups, in the order workloads first appear."""
    groups: dict[Workload, list[str]] = {}
    for impl, workload in cases:
        groups.setdefault(workload, []).append(impl)
    return list(groups.items())


def run_cases(
    cases: list[tuple[str, Workload]],
    options: RunOptions,
    writer: RunWriter,
    settings: RunSettings,
    progress_mode: str,
    stop: StopSignals | None = None,
    reproduce: Callable[[dict[str, Any]], str] | None = None,
) -> bool:
    """Run the cases, appending each row as it finishes; True if interrupted.

    The contenders of a workload run as one group (timed in interleaved rounds). With ``repeat`` N > 1 the
    sweep is run N times, each pass in a fresh worker process; a case's row is written when its last
    repeat is in (or at once when a repeat is not ok). ``stop`` (signals, see _interrupts.py) ends the sweep
    after the group in hand, or cuts that group short (no rows from it). ``reproduce`` gives each row's
    ``reproduce`` command (see reproduce.py)."""
    from attnbench.runner._worker import CaseWorker

    repeat = settings.repeats
    torch.set_num_threads(options.threads)
    progress_mode = shown_progress(progress_mode)
    progress = _progress(len(cases) * repeat - writer.repeats_done(), progress_mode)
    lines = CaseLines(cases) if progress_mode == "lines" else None
    worker: CaseWorker | None = None
    finished: set[tuple[Any, ...]] = set()
    stop = stop or StopSignals(writer.out_dir, lambda: None)  # not installed: never requested

    def finish(key: tuple[Any, ...], merged: dict[str, Any]) -> None:
        writer.finish_case(merged)
        finished.add(key)
        if lines is not None:
            lines.say(key, merged)

    def keep(row: dict[str, Any]) -> None:
        if reproduce is not None:
            row = {**row, "reproduce": reproduce(row)}
        key = case_key(row["impl"], row)
        if repeat == 1 or (row["status"] in DECIDED_ONCE and not writer.repeats_done(key)):
            progress.update(repeat)
            finish(key, merge_repeats([row]))
            return
        rows = writer.append_repeat(row)
        progress.update(1)
        if len(rows) == repeat or row["status"] != "ok":
            progress.update(repeat - len(rows))
            finish(key, merge_repeats(rows, repeat))

    references = tuple(registry.in_process_references()[0].values())  # contenders register()ed here
    try:
        for pass_number in range(repeat):
            if stop.requested:
                return True
            if worker is not None:  # every pass in a fresh process
                worker.close()
            worker = (
                CaseWorker(options, settings.cpu_allocator, settings.timeout_s, references)
                if settings.isolate == "worker"
                else None
            )
            for workload, impls in group_by_workload(cases):
                if stop.requested:
                    return True
                todo = []
                for impl in impls:
                    key = case_key(impl, workload.as_row())
                    if key in finished or writer.repeats_done(key) > pass_number:
                        continue
                    verdict = not_runnable(impl, workload)
                    if verdict is not None:
                        keep(make_row(impl, workload, *verdict))
                    else:
                        todo.append(impl)
                if not todo:
                    continue
                progress.set_description_str(f"{','.join(todo)} {workload.label()}")
                with stop.case():
                    rows = worker.run_group(todo, workload) if worker else run_group(todo, workload, options)
                for row in rows:
                    keep(row)
    except KeyboardInterrupt:  # the case in hand cut short (a second signal), or Ctrl-C without StopSignals
        if worker is not None:
            worker.kill()
        return True
    finally:
        progress.close()
        if worker is not None:
            worker.close()
    return False  # every case has its row, even if a signal came during the last one


REASON_CHARS = 200  # a progress line's reason, at most (a stalled row's, either kind, is about 165 characters: whole)


class CaseLines:
    """``--progress lines`` (and ``auto`` where stderr is not a terminal): one stderr line as each case's row is
    written, for a log (a batch job's, CI's) where a bar's carriage returns pile up on one line:
    ``[3/40 0:01:05] bmm B1 H8 S256 D64 float32 cpu none fwd: ok 1.02 ms`` (cases done of this run's, the time since
    it started; a row that is not ok adds its reason's first line). A contender that cannot run here is said once,
    at its first row: its other rows would repeat its reason word for word (24 of the quick suite's 66 lines on a
    CPU)."""

    def __init__(self, cases: list[tuple[str, Workload]]) -> None:
        self.total, self.done, self.start = len(cases), 0, time.monotonic()
        self.labels = {case_key(impl, w.as_row()): w.label() for impl, w in cases}
        self.unavailable: set[tuple[str, str]] = set()  # (contender, reason) said

    def say(self, key: tuple[Any, ...], row: dict[str, Any]) -> None:
        self.done += 1
        if row["status"] == "unavailable":
            said = (row["impl"], str(row.get("reason")))
            if said in self.unavailable:
                return
            self.unavailable.add(said)
            row = {**row, "status": "unavailable (all its cases)"}
        elapsed = dt.timedelta(seconds=int(time.monotonic() - self.start))
        median, reason = row.get("median_ms"), str(row.get("reason") or "").splitlines()
        what = row["status"]
        if isinstance(median, float) and math.isfinite(median):  # a stalled or incorrect row keeps its time too
            what += f" {median:.4g} ms"
        if row["status"] != "ok" and reason:
            what += f" — {textwrap.shorten(reason[0], REASON_CHARS, placeholder=' …')}"  # whole words
        label = self.labels.get(key, "")
        print(f"[{self.done}/{self.total} {elapsed}] {row['impl']} {label}: {what}", file=sys.stderr, flush=True)


def shown_progress(mode: str) -> str:
    """What ``--progress`` shows: ``auto`` is a bar where stderr is a terminal and a line per case anywhere
    else (a log, a pipe, a notebook), where a bar's carriage returns would pile up and silence would leave a
    long run looking hung."""
    if mode != "auto":
        return mode
    return "on" if sys.stderr.isatty() else "lines"


def _progress(total: int, mode: str) -> Any:
    from tqdm import tqdm

    if not hasattr(tqdm, "_lock"):  # a thread lock: tqdm's default adds a multiprocessing semaphore, which
        tqdm.set_lock(threading.RLock())  # leaks (resource_tracker warns) when a run exits at once
    disable = mode in ("off", "lines")
    return tqdm(total=total, unit="case", disable=disable, file=sys.stderr, dynamic_ncols=True)
