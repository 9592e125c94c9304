"""attnbench: list, run, suites, models, env, profile, masks, report, compare, ratios, ab, merge, store, history.

One ``cmd_*`` per command, parsing its flags. A command's body lives in the lowest room that can hold it: run's
and profile's in the runner room (``runner.sweep``, ``runner._profiling``: they time cases and print tables);
the bodies that read finished runs or draw figures in ``attnbench.reports``, imported when the command runs —
report, compare, ratios, merge, store, history, masks (``reports.masks``: its picture), and ab's
(``reports.ab_command``: it times in the runner's ``ab`` and then draws ``ab.png``, which the runner room may not
import).

Bad input raises UsageError anywhere below; ``main`` prints it as one line and exits with code 2, before
anything is written. A file that cannot be written or read (the disk full, a read-only folder, a name too long) is
one line and exit 2 as well, naming the file and saying what the command kept (a run: its finished rows and the
``--resume`` command).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from attnbench.contenders import registry
from attnbench.errors import UsageError, refuse_empty
from attnbench.measure._ceilings import load_ceilings
from attnbench.measure._source_trees import check_one_tree
from attnbench.measure.allocator import POLICIES, configure_cpu_allocator
from attnbench.measure.environment import attnbench_version, command_line, environment
from attnbench.runner._interrupts import termination_as_interrupt
from attnbench.runner.cases import WAITED_STALL, not_runnable, waited_text
from attnbench.runner.fail_on import failure_line, parse_fail_on
from attnbench.runner.request import ISOLATION, PROGRESS_BAR_MODES, RunRequest, build_request, check_threads
from attnbench.runner.results import RunWriter
from attnbench.workload.axes import DTYPE, IMPL, PASS, SWEEP_AXES, parse_overrides, parse_text
from attnbench.workload.suite import (
    check_devices,
    check_flags_apply,
    expand,
    load_suite,
    mask_suite,
    model_suite,
    profile_suite,
    suite_names,
)

if TYPE_CHECKING:
    from attnbench.runner._ncu_profile import NcuProfile
    from attnbench.runner._profiling import CaseProfile
    from attnbench.runner.sweep import Finished

parse_axis_overrides = parse_overrides  # {axis: 'a,b'} -> checked lists; the pytest front end's name for it


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise UsageError(message)


def _given_axes(args: argparse.Namespace) -> dict[str, str]:
    """The axis flags given on the command line, as {axis: text}."""
    return {axis.name: getattr(args, axis.name) for axis in SWEEP_AXES if getattr(args, axis.name, None) is not None}


_CLAIMED: list[Path] = []  # the default folders this command made; main() removes those it left empty


def _out(args: argparse.Namespace, name: str) -> Path:
    """The command's ``--out``, or a new ``runs/NAME-STAMP`` folder without one; ``--out ''`` is refused (it was
    quietly the default)."""
    refuse_empty("--out", args.out, f"runs/{name}-mine")
    return Path(args.out) if args.out else _default_out(name)


def _default_out(suite: str) -> Path:
    """A new folder ``runs/SUITE-STAMP[-N]``, made here: a mkdir either makes the folder or fails, so two
    commands started in the same second take different ones (a look first and a mkdir later would let both
    write into one). :func:`main` removes it again if the command ends without writing anything into it."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if not Path("runs").is_dir():
        _CLAIMED.append(Path("runs"))  # removed after the folder inside it, if that is all it holds
    n = 1
    while True:
        out = Path("runs") / (f"{suite}-{stamp}" if n == 1 else f"{suite}-{stamp}-{n}")
        try:
            out.mkdir(parents=True)
        except FileExistsError:
            n += 1
            continue
        except OSError as exc:  # `runs` is a file, the folder is read-only…
            why = "runs is a file, not a folder" if Path("runs").is_file() else exc.strerror
            raise UsageError(
                f"cannot make the default folder {out} ({why}); give a folder to write with --out DIR"
            ) from None
        _CLAIMED.append(out)
        return out


def _drop_empty_claims() -> None:
    while _CLAIMED:
        out = _CLAIMED.pop()
        with contextlib.suppress(OSError):  # rmdir removes only an empty folder
            out.rmdir()


def request_from_args(args: argparse.Namespace) -> RunRequest:
    """``attnbench run``'s flags as a checked request."""
    if args.from_run is not None or args.case is not None:
        return _from_run_request(args)
    return build_request(
        args.suite,
        _given_axes(args),
        repeat=args.repeat,
        budget_s=args.budget_s,
        case_budget_s=args.case_budget_s,
        timeout_s=args.timeout_s,
        threads=args.threads,
        seed=args.seed,
        memory=not args.no_memory,
        cpu_allocator=args.cpu_allocator,
        isolate=args.isolate,
        remeasure_ceilings=args.remeasure_ceilings,
        progress=args.progress,
        out=args.out,
        resume=args.resume,
        shard=args.shard,
        store=args.store,
        db=args.db,
        command=args.command_line,
    )


def _from_run_request(args: argparse.Namespace) -> RunRequest:
    """--from RUN_DIR --case N: one case of a run, with that run's sweep settings (see reproduce.py)."""
    from attnbench.runner.reproduce import from_run_request

    if args.from_run is None or args.case is None:
        raise UsageError("--from RUN_DIR and --case N go together: give both (N: the row's index in results.csv)")
    settings = (
        ("--suite", args.suite),
        ("--resume", args.resume),
        ("--shard", args.shard),
        ("--repeat", args.repeat),
        ("--threads", args.threads),
        ("--budget-s", args.budget_s),
        ("--case-budget-s", args.case_budget_s),
        ("--timeout-s", args.timeout_s),
    )
    given = [flag for flag, value in settings if value is not None]
    given += [axis.flag for axis in SWEEP_AXES if getattr(args, axis.name, None) is not None]
    written = {token.split("=", 1)[0] for token in getattr(args, "argv", [])}  # `--seed 0` too, the default
    given += [  # the run's settings too: a value given here was dropped, while meta.json's command kept it
        flag
        for flag, was_given in (
            ("--seed", args.seed != 0),
            ("--no-memory", args.no_memory),
            ("--cpu-allocator", args.cpu_allocator != "cached"),
            ("--isolate", args.isolate != "worker"),
            ("--remeasure-ceilings", args.remeasure_ceilings),
        )
        if was_given or flag in written
    ]
    if given:
        raise UsageError(f"--from reruns one case of RUN_DIR with its settings; drop {', '.join(given)}")
    return from_run_request(
        args.from_run,
        args.case,
        out=args.out,
        progress=args.progress,
        store=args.store,
        db=args.db,
        command=args.command_line,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from attnbench.runner import sweep

    fail_on = parse_fail_on(args.fail_on)
    request = request_from_args(args)
    store_db = _store_target(request)
    default = request.out or request.resume or _default_out(request.suite_name)  # made only where it is used
    finished = sweep.run_sweep(request, default, say_late=False)  # _summarise says them under the table
    with finished.stop or contextlib.nullcontext():  # signals still counted: a burst never cuts the summary
        return _summarise(finished, store_db, fail_on)


def left_out_lines(meta: dict[str, Any]) -> list[str]:
    """A line per contender that ``all`` brought in and a sweep left out (it suits none of its workloads):
    of every sweep, or of some while its other cases ran."""
    partly = set(meta.get("left_out_partly", []))
    lines = []
    for impl, reason in meta.get("left_out", {}).items():
        if impl in partly:
            lines.append(f"  {impl}: left out of the sweeps where it suits no workload ({reason}); its other cases ran")
        else:
            lines.append(f"  {impl}: left out — unsupported on every workload of its sweeps ({reason})")
    return lines


def _summarise(finished: Finished, store_db: Path | None, fail_on: tuple[str, ...] = ()) -> int:
    """The end of `attnbench run`: the summary table, counts, reasons, warnings, the store, the exit code (1 where
    a row has a status ``--fail-on`` names)."""
    from attnbench.reports.summary import non_ok_reasons, status_counts, summary_table
    from attnbench.runner import sweep

    frame, writer = finished.frame, finished.writer
    if frame.empty:  # interrupted before its first case finished
        print(f"no case finished (0 of {finished.meta.get('n_cases', 0)})")
    else:
        print(summary_table(frame))
        planned = finished.meta.get("n_cases", 0)  # a run interrupted: how many of its cases these are
        print(f"\n{len(frame)}{f' of {planned}' if len(frame) < planned else ''} cases: {status_counts(frame)}")
    reasons = non_ok_reasons(frame)
    if reasons:
        print(reasons)
    for line in left_out_lines(finished.meta):
        print(line)
    for warning in sweep.late_warnings(finished):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"results: {writer.out_dir / 'results.parquet'} (also results.csv, meta.json)")
    if store_db is not None:
        from attnbench.reports.store import store_runs

        (stored,) = store_runs([writer.out_dir], store_db)
        print(f"stored: {stored.action} in {store_db} (run_id {stored.run_id})")
    if finished.interrupted:
        print(
            f"interrupted: finished rows are saved; continue with: attnbench run --resume {writer.out_dir}",
            file=sys.stderr,
        )
        return 130
    failure = failure_line(frame, fail_on)
    if failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


def _store_target(request: RunRequest) -> Path | None:
    """--store's database, checked before anything runs (a corrupt one is a usage error, nothing written)."""
    if not request.store:
        return None
    from attnbench.reports.store import DEFAULT_DB, check_store

    db = request.db or DEFAULT_DB
    check_store(db)
    return db


def cmd_merge(args: argparse.Namespace) -> int:
    from attnbench.reports.merge import merge_runs

    if not args.out.strip():  # Path('') is the current folder
        raise UsageError("--out '': no value; give a new folder for the merged results, e.g. --out runs/merged")
    out = Path(args.out)
    RunWriter.check_target(out)
    frame, warnings = merge_runs(_run_paths(args.runs), out, args.command_line)
    runs = frame["run"].nunique() if "run" in frame else len(args.runs)  # a merged folder given: its runs
    print(f"merged {runs} run(s), {len(frame)} rows, {frame['machine'].nunique()} machine(s): {out}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _profiled_calls(profile: CaseProfile) -> str:
    """Which calls the profile's tables are per: all recorded, or those nearest the median (CPU); and why fewer
    than --calls asked for, where a slow call capped them."""
    from attnbench.runner._profiling import PROFILE_SECONDS

    capped = (
        f"; --calls {profile.asked} capped at about {PROFILE_SECONDS:g} s of calls"
        if profile.asked > profile.calls
        else ""
    )
    if profile.recorded > profile.calls:
        return (
            f"profiled {profile.profiled_ms:.4g} ms per call (the {profile.calls} of {profile.recorded} "
            f"recorded calls nearest the median{capped})"
        )
    return f"profiled {profile.profiled_ms:.4g} ms per call ({profile.calls} calls recorded{capped})"


PROFILED_FAR = 1.5  # profiled calls this many times the median or more: the tables disagree with the median


def profiled_far_warning(profile: CaseProfile) -> str | None:
    """A warning where the profiled calls took ``PROFILED_FAR`` times the case's median or more (a machine that got
    busy while the profiler recorded, or the profiler's own cost on many small ops): the top-ops table is per
    profiled call, the breakdown scaled to the median, so the two no longer read alike."""
    if profile.workload.device != "cpu":  # CUDA tables are the kernels' device times, not the host's wall
        return None
    if profile.median_ms <= 0 or profile.profiled_ms < PROFILED_FAR * profile.median_ms:
        return None
    return (
        f"{profile.impl} {profile.workload.label()}: the profiled calls took {profile.profiled_ms:.4g} ms each, "
        f"{profile.profiled_ms / profile.median_ms:.1f}× the median {profile.median_ms:.4g} ms (a machine busy while "
        "the profiler recorded, or its own cost on many small ops): the top ops are per profiled call, the "
        "breakdown scaled to the median — profile it again on a quieter machine"
    )


def cmd_profile(args: argparse.Namespace) -> int:
    from attnbench.runner._noise import environment_warnings
    from attnbench.runner._profiling import CaseFailed, profile_case, side_by_side, write_tables

    if args.calls < 1:
        raise UsageError(f"--calls {args.calls}: must be a positive integer")
    if args.profile_pass not in (None, "fwd"):
        shown = args.profile_pass or "''"
        raise UsageError(f"--pass {shown}: profile records the forward call only; allowed: fwd")
    if not 0 < args.budget_s < math.inf:
        raise UsageError(f"--budget-s {args.budget_s:g}: must be a positive number of seconds")
    check_threads(args.threads)
    ncu = _ncu_gate() if args.ncu else None
    given = _given_axes(args)
    if ncu is not None:
        given.setdefault("device", "cuda")  # ncu measures CUDA kernels: --ncu alone means the GPU
    overrides = parse_overrides(given)
    known, sweep_names = sorted(registry.load()), registry.sweep_names()
    cases = expand(profile_suite(), overrides, known, sweep_names, registry.available_sweep_names)
    check_devices(cases)
    if ncu is not None and any(w.device != "cuda" for _, w in cases):
        raise UsageError(
            "profile: --ncu measures CUDA kernels and a cpu case has none; allowed with --ncu: --device cuda"
        )
    out = _out(args, "profile")
    RunWriter.check_target(out)
    runnable = []
    for impl, workload in cases:
        verdict = not_runnable(impl, workload)
        if verdict is None:
            runnable.append((impl, workload))
        else:
            print(f"{impl} {workload.label()}: {verdict[0]} — {verdict[1]}", file=sys.stderr)
    if not runnable:
        raise UsageError("nothing to profile: every case is unavailable or unsupported (see above)")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    for warning in environment_warnings():  # as a run says them: other work on the cores, the governor
        print(f"warning: {warning}", file=sys.stderr)
    configure_cpu_allocator("cached")  # as `run` does by default, so the median is the run's
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    profiles, ncu_results, failed = [], [], 0
    metrics = _ncu_metrics(ncu) if ncu is not None else ()
    interrupted = False
    try:  # Ctrl-C: the cases profiled so far keep their tables; the one in hand leaves nothing
        for impl, workload in runnable:
            try:
                profile = profile_case(impl, workload, out, calls=args.calls, seed=args.seed, budget_s=args.budget_s)
            except CaseFailed as failure:  # as a run's row would say it; the other cases go on
                print(f"{impl} {workload.label()}: {failure.status} — {failure.reason}; not profiled", file=sys.stderr)
                failed += 1
                continue
            profile, result = _show_profile(profile, ncu, metrics, args.seed)
            ncu_results += [result] if result is not None else []
            profiles.append(profile)
    except KeyboardInterrupt:
        interrupted = True
    kept = {profile.trace_path for profile in profiles}
    for trace in out.glob("*.trace.json"):  # a trace whose case was cut short has no table rows
        if trace not in kept:
            trace.unlink()
    if not profiles:
        if made and not any(out.iterdir()):
            out.rmdir()  # nothing was written: no empty folder left behind
        if interrupted:
            print("attnbench: interrupted; nothing was written", file=sys.stderr)
            return 130
        print(f"profile: nothing profiled: all {failed} case(s) failed (reasons above)", file=sys.stderr)
        return 1
    top_path, breakdown_path = write_tables(profiles, out)
    across = side_by_side(profiles)
    if across:
        print(f"\nside by side\n{across}")
    print(f"\ntables: {top_path}, {breakdown_path}")
    if failed:
        print(f"profile: {failed} case(s) not profiled (reasons above); the tables hold the others", file=sys.stderr)
    code = _ncu_summary(ncu_results, len(profiles) - len(ncu_results), out) if ncu is not None else 0
    if interrupted:
        print(
            f"profile: interrupted: the tables and traces hold the {len(profiles)} case(s) profiled before it, of "
            f"{len(runnable)}",
            file=sys.stderr,
        )
        return 130
    return max(code, 1 if failed else 0)


def _show_profile(
    profile: CaseProfile, ncu: str | None, metrics: tuple[str, ...], seed: int
) -> tuple[CaseProfile, NcuProfile | None]:
    """Print one profiled case's tables and warnings; with ``ncu``, profile it under ncu too (its columns added)."""
    from attnbench.runner._ncu_csv import short_name
    from attnbench.runner._ncu_profile import annotate_breakdown, annotate_top_ops, format_table

    impl, workload = profile.impl, profile.workload
    shown = profile.top_ops[["op", "self_ms_per_call", "pct", "category"]].copy()
    kernels = set(profile.kernels["kernel"])  # CUDA kernels print shortened; the CSV keeps their names
    shown["op"] = [short_name(op) if op in kernels else op for op in shown["op"]]
    print(f"\n{impl}  {workload.label()}  median {profile.median_ms:.4g} ms per call, {_profiled_calls(profile)}")
    print(shown.to_string(index=False, formatters={"self_ms_per_call": "{:.4g}".format, "pct": "{:.1f}".format}))
    split = ", ".join(f"{r.category} {r.ms_per_call:.3g} ms ({r.pct:.0f}%)" for r in profile.breakdown.itertuples())
    print(f"breakdown: {split}\ntrace: {profile.trace_path}", flush=True)
    far = profiled_far_warning(profile)
    if far is not None:
        print(f"warning: {far}", file=sys.stderr)
    if profile.waited is not None and profile.waited >= WAITED_STALL:  # a run would time this row `stalled`
        print(
            f"warning: {impl} {workload.label()}: the machine stalled while it was timed: "
            f"{waited_text(profile.waited)}; its times are a busy machine's — profile it again on a quieter one",
            file=sys.stderr,
        )
    result = _ncu_case(ncu, metrics, profile, seed) if ncu is not None else None
    if result is not None:
        profile = dataclasses.replace(
            profile,
            top_ops=annotate_top_ops(profile.top_ops, result.kernels),
            breakdown=annotate_breakdown(profile.breakdown, result.kernels),
        )
        print(format_table(result))
    return profile, result


# --- profile --ncu: Nsight Compute per kernel (attnbench.runner._ncu_profile) ----------------------------------


def _ncu_gate() -> str:
    """ncu's path, or a usage error when --ncu cannot be done here (checked before anything runs)."""
    from attnbench.runner._ncu_profile import find_ncu, unavailable_reason

    ncu = find_ncu()
    reason = unavailable_reason(ncu, torch.cuda.is_available())
    if reason is not None or ncu is None:
        raise UsageError(f"profile: {reason}")
    return ncu


def _ncu_metrics(ncu: str) -> tuple[str, ...]:
    from attnbench.runner._ncu_csv import METRICS
    from attnbench.runner._ncu_profile import metrics_here

    metrics = metrics_here(ncu)
    missing = [m for m in METRICS if m not in metrics]
    print(f"ncu: {ncu}" + (f"; not on this GPU: {', '.join(missing)}" if missing else ""))
    return metrics


def _ncu_case(ncu: str, metrics: tuple[str, ...], profile: CaseProfile, seed: int) -> NcuProfile | None:
    """One case under ncu, or None (its one-line reason on stderr) when ncu could not profile it."""
    from attnbench.measure._memory import release_cached_memory
    from attnbench.runner._ncu_profile import NcuError, profile_case

    release_cached_memory(profile.workload.device)  # the child under ncu needs the GPU memory this case held
    stem = profile.trace_path.name.removesuffix(".trace.json")
    print(f"ncu: profiling {profile.impl} {profile.workload.label()} ({profile.calls} calls) …", file=sys.stderr)
    try:
        return profile_case(
            ncu,
            metrics,
            profile.impl,
            profile.workload,
            profile.trace_path.parent,
            stem,
            profile.calls,
            seed,
            profile.kernels,
        )
    except NcuError as exc:
        print(f"ncu: {profile.impl} {profile.workload.label()}: {exc}", file=sys.stderr)
        return None


def _ncu_summary(results: list[NcuProfile], failed: int, out: Path) -> int:
    """ncu_kernels.csv, and exit 1 when ncu could not profile every case (the reasons are above)."""
    from attnbench.runner._ncu_profile import write_kernels

    if results:
        print(f"ncu: {write_kernels(results, out)} (reports: *.ncu-rep, raw pages: *.ncu.csv)")
    if failed:
        print(
            f"ncu: {failed} case(s) not profiled by ncu (reasons above); their torch.profiler tables are written",
            file=sys.stderr,
        )
        return 1
    return 0


def _run_paths(texts: list[str]) -> list[Path]:
    paths = [Path(t) for t in texts]
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such run folder or file")
    return paths


def cmd_report(args: argparse.Namespace) -> int:
    from attnbench.reports.build import build_report

    out = _out(args, "report")  # its flags before its runs
    paths = _run_paths(args.runs)
    given = [path.resolve() for path in paths]
    twice = next((path for index, path in enumerate(paths) if given[index] in given[:index]), None)
    if twice is not None:
        raise UsageError(f"{twice}: given twice; a report draws each run once (compare runs with `attnbench compare`)")
    html, pngs, empty, gaps = build_report(paths, out, args.baseline, args.command_line)  # it claims the folder
    print(f"report: {html}")
    for png in pngs:
        print(f"figure: {png}")
    for line in [*([empty] if empty else []), *gaps]:
        print(f"warning: {line}", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from attnbench.reports.compare import (
        Settings,
        broken,
        compare_frames,
        load_for_compare,
        summary_line,
        terminal_table,
        write_compare,
    )
    from attnbench.reports.out_folder import claim_report_folder

    if not 0 < args.threshold < 1:
        raise UsageError(f"--threshold {args.threshold}: must be a fraction between 0 and 1, e.g. 0.05")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha {args.alpha}: must be between 0 and 1, e.g. 0.01")
    base, new = _run_paths([args.base, args.new])
    settings = Settings(threshold=args.threshold, alpha=args.alpha)
    refuse_empty("--db", args.db, "runs/attnbench.duckdb")
    db = Path(args.db) if args.db else None
    if db is not None and not db.is_file():
        raise UsageError(f"--db {db}: no such store; store runs first with `attnbench store RUN… --db {db}`")
    base_rows, new_rows, history = load_for_compare(base, new, args.normalise, db)
    comparison = compare_frames(base_rows, new_rows, settings, history)
    out = _out(args, "compare")
    claim_report_folder(out, "compare.html", ("compare.*",))
    table = comparison.table
    html, png = write_compare(comparison, out, base, new, settings, args.command_line)  # before a reader can leave
    slower, broke = table[table["verdict"] == "slower"], broken(table)
    shown, footnotes = terminal_table(table)
    try:
        print(shown)
        for footnote in footnotes:
            print(footnote)
        print(summary_line(comparison, settings))
        for note in comparison.notes:
            print(f"note: {note}")
        print(f"comparison: {html}" + (f", {png}" if png else "") + f" (verdicts also in {out / 'compare.csv'})")
    except BrokenPipeError:  # `compare … | head`: the gate's answer is the exit code, not what was read
        sys.stderr.close()
        return 1 if len(slower) or len(broke) else 0
    if len(slower):
        print(f"{len(slower)} case(s) slower beyond their floor (≥ {settings.threshold:.0%})", file=sys.stderr)
    for row in broke.to_dict("records"):
        print(f"broken: {row['impl']} {row['workload']}: ok in BASE, {row['new_status']} in NEW", file=sys.stderr)
    return 1 if len(slower) or len(broke) else 0


def cmd_ratios(args: argparse.Namespace) -> int:
    from attnbench.reports.frames import load_runs
    from attnbench.reports.ratios import Bounds, failures, format_table, ratio_table, require, select

    for flag, bound, example in (
        ("--max-time-ratio", args.max_time_ratio, "1.1"),
        ("--min-speedup", args.min_speedup, "1.2"),
        ("--max-mem-ratio", args.max_mem_ratio, "1.5"),
        ("--min-pct-of-peak", args.min_pct_of_peak, "50"),
        ("--min-pct-of-matmul", args.min_pct_of_matmul, "80"),
    ):
        if bound is not None and not 0 < bound < math.inf:  # nan would pass every case, a negative none
            raise UsageError(f"{flag} {bound:g}: must be a positive number, e.g. {flag} {example}")
    peers = [p for p in args.vs.split(",") if p]
    if not peers:
        raise UsageError("--vs: name at least one contender to compare with, e.g. --vs sdpa_flash,bmm")
    if args.impl in peers and not args.peer_where:  # its rows against themselves: every ratio 1, every gate met
        raise UsageError(
            f"--vs {args.vs}: names {args.impl}, the contender judged; name its peers, or give --peer-where to "
            f"compare {args.impl} with its own rows elsewhere (e.g. --where dtype=bfloat16 --peer-where dtype=float32)"
        )
    frame, _ = load_runs(_run_paths([args.run]))
    require(frame, [args.impl, *peers])
    peer_frame = select(frame, args.peer_where) if args.peer_where else None
    frame = select(frame, args.where)
    if not (frame["impl"] == args.impl).any():
        raise UsageError(f"no {args.impl} row matches --where {' '.join(args.where)}")
    unpaired = tuple(condition.partition("=")[0] for condition in args.peer_where)
    table = ratio_table(frame, args.impl, peers, best=args.best, peer_frame=peer_frame, unpaired=unpaired)
    print(format_table(table))
    bounds = Bounds(
        args.max_time_ratio, args.min_speedup, args.max_mem_ratio, args.min_pct_of_peak, args.min_pct_of_matmul
    )
    missed = failures(table, bounds)
    for _, line in missed:
        print(f"missed: {line}", file=sys.stderr)
    if bounds.any():
        print(f"{len(table) - len({index for index, _ in missed})}/{len(table)} case(s) meet the bounds")
    return 1 if missed else 0


# --- history: the results store and trends across runs -------------------------------------------------


def cmd_store(args: argparse.Namespace) -> int:
    from attnbench.reports.store import DEFAULT_DB, store_runs

    refuse_empty("--db", args.db, str(DEFAULT_DB))
    db = Path(args.db) if args.db else DEFAULT_DB
    for stored in store_runs([Path(r) for r in args.runs], db):
        print(f"{stored.action:<9} {stored.name} (run_id {stored.run_id}, {stored.n_rows} rows)")
    print(f"store: {db}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from attnbench.reports import history
    from attnbench.reports.out_folder import claim_report_folder
    from attnbench.reports.store import DEFAULT_DB, open_store

    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha {args.alpha}: must be between 0 and 1, e.g. 0.001")
    if not 0 <= args.min_change < math.inf:
        raise UsageError(f"--min-change {args.min_change}: must be a fraction ≥ 0, e.g. 0.05")
    if args.fail_on_regression is not None and not 0 <= args.fail_on_regression < math.inf:
        raise UsageError(f"--fail-on-regression {args.fail_on_regression}: must be a percentage ≥ 0, e.g. 10")
    if args.fail_on_regression is not None and 0 < args.fail_on_regression < 1:  # a fraction given as a percentage?
        print(
            f"warning: --fail-on-regression {args.fail_on_regression:g} is {args.fail_on_regression:g} % (per cent, "
            "not a fraction: 10 is 10 %)",
            file=sys.stderr,
        )
    if args.min_change >= 1:  # a percentage given as a fraction?
        print(
            f"warning: --min-change {args.min_change:g} is {args.min_change:.0%} (a fraction: 0.05 is 5 %)",
            file=sys.stderr,
        )
    since = _since(args.since, args.fail_on_regression)
    impls = [name for name in (args.impl or "").split(",") if name]
    out = _out(args, "history")
    refuse_empty("--db", args.db, str(DEFAULT_DB))
    db = Path(args.db) if args.db else DEFAULT_DB
    with open_store(db, write=False) as con:
        runs = history.runs_table(con)
        if runs.empty:
            raise UsageError(f"--db {db}: holds no run yet; store runs first with `attnbench store RUN… --db {db}`")
        frame = history.load_history(con, impls, args.where)
    if frame.empty:
        raise UsageError(f"--db {db}: no ok row to draw (with the --impl and --where given)")
    claim_report_folder(out, "history.html", ("history.html", "changes.csv"))  # after every check: nothing cleared
    if args.normalise == "yardstick":
        frame, left_raw = history.normalise_history(frame, runs)
        print(f"normalised by the yardsticks; {left_raw} series left raw (a run without yardstick rates)")
    cases = history.case_histories(frame, args.alpha, args.min_change)
    changes = history.change_records(cases)
    n_machines = frame["machine"].nunique()
    drawn = frame["run_id"].nunique()
    print(f"{drawn} runs, {len(cases)} cases on {n_machines} machine(s): {len(changes)} step(s)")
    if len(runs) > drawn:  # e.g. a run whose every row stalled
        print(f"  ({len(runs) - drawn} of the {len(runs)} stored runs left out: no ok row with the --impl and --where)")
    for row in changes.to_dict("records"):
        where = f"  [{row['machine']}]" if n_machines > 1 else ""
        commits = f"{str(row['commit_before'])[:7]} → {str(row['commit_after'])[:7]}"
        size = f"{row['change_pct']:+.1f}% {row['direction']}"
        outliers = row["outliers_before"] + row["outliers_after"]
        aside = f", {outliers} outlier run(s) set aside" if outliers else ""
        print(
            f"{row['impl']}  {row['workload']}{where}  {commits}  {size}  confidence {row['confidence']:.4f}"
            f"  (runs {row['runs_before']}/{row['runs_after']}{aside}, noise: {row['noise']})"
        )
    settings = {
        "alpha": args.alpha,
        "floor": f"max({args.min_change:.0%}, the series' typical noise)",
        "noise": "per-repeat medians where the run has them, else the run's own IQR",
        "times": "normalised by the yardsticks" if args.normalise == "yardstick" else "raw",
    }
    html = history.write_history(cases, changes, runs, out, args.x, args.command_line, settings)
    print(f"history: {html} (steps also in {out / 'changes.csv'})")
    if args.fail_on_regression is not None:
        every = history.regressions(changes, args.fail_on_regression)
        bad = every if since is None else history.first_seen_since(every, since)
        known = len(every) - len(bad)
        if known:
            print(
                f"{known} slowdown(s) beyond {args.fail_on_regression:g}% first seen before --since {args.since}: "
                "shown, not failed"
            )
        for row in bad.to_dict("records"):
            print(
                f"regression: {row['impl']} {row['workload']} on {row['machine']}: {row['change_pct']:+.1f}% "
                f"from {str(row['commit_before'])[:7]} to {str(row['commit_after'])[:7]} "
                f"(beyond {args.fail_on_regression:g}%)",
                file=sys.stderr,
            )
        if len(bad):
            return 1
    return 0


def _since(text: str | None, fail_on_regression: float | None) -> Any:
    """--since: a date or time (UTC unless it names its zone), for --fail-on-regression only."""
    if text is None:
        return None
    if fail_on_regression is None:
        raise UsageError("--since is for --fail-on-regression: add it, e.g. --fail-on-regression 10 --since 2026-11-20")
    import pandas as pd

    try:
        when: Any = pd.Timestamp(text)
    except ValueError:
        when = pd.NaT
    if pd.isna(when):
        raise UsageError(
            f"--since {text!r}: not a date or time; e.g. 2026-11-20 or 2026-11-20T06:00 (UTC unless given)"
        )
    return when.tz_localize("UTC") if when.tzinfo is None else when.tz_convert("UTC")


def _add_history_commands(commands: Any) -> None:
    p_store = commands.add_parser("store", help="add run folders to the DuckDB results store (SQL over every run)")
    p_store.add_argument("runs", nargs="+", metavar="RUN", help="run folders or pytest-benchmark .json files")
    p_store.add_argument("--db", help="the store (default runs/attnbench.duckdb; created if missing)")
    p_store.set_defaults(func=cmd_store)

    p_history = commands.add_parser("history", help="trend per case across stored runs, steps found; history.html")
    p_history.add_argument("--db", help="the store (default runs/attnbench.duckdb)")
    p_history.add_argument("--impl", help="contenders to keep, comma-separated (default: all)")
    p_history.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        help="keep rows whose column (of rows or runs) equals VALUE; repeatable",
    )
    p_history.add_argument("--out", help="folder for history.html and changes.csv (default: runs/history-…)")
    p_history.add_argument("--x", choices=["commit", "date"], default="commit", help="x axis (default commit)")
    p_history.add_argument("--alpha", type=float, default=0.001, help="significance of a step (default 0.001)")
    p_history.add_argument(
        "--min-change",
        type=float,
        default=0.05,
        help="smallest step reported, a fraction (default 0.05; never below the noise)",
    )
    p_history.add_argument(
        "--normalise",
        choices=["raw", "yardstick"],
        default="raw",
        help="yardstick: divide each run's time by the yardstick matching the case's place on "
        "the roofline, timed in the same rounds (default raw)",
    )
    p_history.add_argument(
        "--fail-on-regression",
        type=float,
        metavar="PCT",
        help="exit 1 when a series' newest step is a slowdown beyond PCT per cent",
    )
    p_history.add_argument(
        "--since",
        metavar="WHEN",
        help="with --fail-on-regression: only a step first seen in a run started at WHEN or later fails (a date or "
        "time, UTC unless it says; a slowdown known before is shown, not failed)",
    )
    p_history.set_defaults(func=cmd_history)


def ab_overrides(args: argparse.Namespace) -> dict[str, list[Any]]:
    """The sweep axes `ab`'s flags set (--impl names ab's contender there, not the sweep's impl axis)."""
    texts = {
        axis.name: getattr(args, axis.name)
        for axis in SWEEP_AXES
        if axis is not IMPL and getattr(args, axis.name, None) is not None
    }
    return parse_overrides(texts)


def cmd_ab(args: argparse.Namespace) -> int:
    from attnbench.reports import ab_command

    return ab_command.cmd_ab(args, ab_overrides(args), _out(args, "ab"))


def _add_ab_command(commands: Any) -> None:
    p_ab = commands.add_parser("ab", help="A/B: two versions of a contender timed in one process; exit 1 if slower")
    p_ab.add_argument("--a", metavar="IMPL", help="version A, a registered contender (with --b)")
    p_ab.add_argument("--b", metavar="IMPL", help="version B, judged against A (--a X --b X: an A/A run)")
    p_ab.add_argument("--impl", metavar="NAME", help="one contender at two git revisions: the working tree is B")
    p_ab.add_argument("--base", metavar="REV", help="with --impl: the revision that is A (default HEAD)")
    p_ab.add_argument("--suite", help="a suite's workloads (name or .toml; default: B1 H8 S1024 D64)")
    for axis in SWEEP_AXES:
        if axis is not IMPL:
            p_ab.add_argument(axis.flag, dest=axis.name, metavar="LIST", help=f"override {axis.name} (comma-separated)")
    p_ab.add_argument(
        "--threshold", type=float, default=0.02, help="smallest change called faster or slower (default 0.02 = 2%%)"
    )
    p_ab.add_argument(
        "--budget-s", type=float, default=3.0, help="timing seconds per case, shared by A and B (default 3)"
    )
    p_ab.add_argument(
        "--cold",
        action="store_true",
        help="judge the samples taken with the caches flushed before each call (GPU: L2; CPU: 4× the last level read "
        "and written), as a layer's step finds them in a model, not back-to-back calls",
    )
    p_ab.add_argument(
        "--keep-tuning",
        action="store_true",
        help="reuse the choices tuned contenders kept on disk (fused_triton's tiles) instead of tuning both sides "
        "afresh in this run",
    )
    p_ab.add_argument("--threads", type=int, help="CPU threads (default: torch's default)")
    p_ab.add_argument("--seed", type=int, default=0, help="input and bootstrap seed (default 0)")
    p_ab.add_argument("--json", action="store_true", help="one JSON object per case per line")
    p_ab.add_argument("--out", help="folder for ab.csv, ab_samples.csv, ab.png (default: runs/ab-TIMESTAMP)")
    p_ab.set_defaults(func=cmd_ab)


def cmd_masks(args: argparse.Namespace) -> int:
    """How each workload's mask falls on a kernel's tiles: masks.csv, masks.png and the table."""
    from attnbench.reports.masks import format_table, parse_tiles, write_masks

    tiles = parse_tiles(args.tile)
    given = _given_axes(args)
    gallery = not args.suite and not {"mask", "model"} & set(given)  # every mask, unless the command names some
    if args.suite:
        suite = load_suite(args.suite)
    elif "model" in given:  # the presets' own sizes and layers, as `run --model` plans them
        suite = model_suite()
    else:
        suite = mask_suite() if gallery else profile_suite()
    known, overrides = sorted(registry.load()), parse_overrides(given)
    cases = []
    for sweep in suite.sweeps:  # contenders do not change a mask: none is asked whether it runs here
        try:
            one = dataclasses.replace(suite, sweeps=(sweep,))
            cases += expand(one, overrides, known, None, known, check_flags=False)  # checked below, over them all
        except UsageError as error:
            if not gallery:
                raise
            print(f"masks: {sweep['mask'][0]} left out: {error}", file=sys.stderr)  # one these sizes exclude
    if not cases:
        raise UsageError("masks: no mask can be drawn at these sizes (see above)")
    check_flags_apply(overrides, [workload for _, workload in cases])
    out = _out(args, "masks")
    RunWriter.check_target(out)
    table = write_masks([workload for _, workload in cases], tiles, out)
    print(format_table(table))
    print(
        f"\nwork: the pairs of every tile that is not empty over the visible pairs\nwrote {out / 'masks.csv'}, "
        f"{out / 'masks.png'} (tile {tiles[0][0]}x{tiles[0][1]})"
    )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    entries = registry.load()
    records: list[dict[str, Any]] = []
    for name, entry in sorted(entries.items()):
        caps = entry.contender.capabilities if entry.contender is not None else None
        records.append(
            {
                "name": name,
                "available": entry.available,
                "reason": entry.unavailable_reason or "",
                "description": entry.contender.description if entry.contender is not None else "",
                "devices": sorted(caps.devices) if caps else [],
                "dtypes": sorted(caps.dtypes) if caps else [],
                "masks": sorted(caps.masks) if caps else [],
                "score_mods": sorted(caps.score_mods) if caps else [],
                "paged": caps.paged if caps else "",
                "gqa": caps.gqa if caps else None,
                "backward": caps.backward if caps else None,
                "source": entry.source,
            }
        )
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    width = max(len(r["name"]) for r in records)
    for r in records:
        state = "available" if r["available"] else "unavailable"
        detail = r["description"] if r["available"] else r["reason"]
        print(f"{r['name']:<{width}}  {state:<11}  {','.join(r['devices']):<8}  {detail}")
    return 0


def cmd_suites(args: argparse.Namespace) -> int:
    names = suite_names()
    width = max(map(len, names), default=0)  # the description column starts after the longest name
    for name in names:
        print(f"{name:<{width}}  {load_suite(name).description}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from attnbench.workload.models import describe

    print(describe())
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """The environment as meta.json records it, and this machine's ceilings per device (cached ones; what
    is missing is measured)."""
    check_threads(args.threads)
    dtypes = parse_text(DTYPE.name, args.dtype)  # a checked, non-empty list: --dtype '' is refused
    threads = args.threads or torch.get_num_threads()
    devices = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    ceilings = {device: asdict(load_ceilings(device, dtypes, threads, args.remeasure)) for device in devices}
    print(json.dumps({**environment(threads), "ceilings": ceilings}, indent=2))
    return 0


def _choices(allowed: tuple[str, ...]) -> str:
    """How argparse shows a choice (checked by build_request, so the command and attnbench.run() agree)."""
    return "{" + ",".join(allowed) + "}"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnbench", description="Benchmark attention implementations.")
    parser.add_argument("--version", action="version", version=f"attnbench {attnbench_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p_list = commands.add_parser("list", help="contenders, their availability and the reason when not")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=cmd_list)

    p_run = commands.add_parser("run", help="run a suite and write a run folder")
    p_run.add_argument(
        "--suite",
        help="suite name (see `attnbench suites`) or a .toml path (default: quick; with --model: the presets)",
    )
    p_run.add_argument("--out", help="run folder to create (default: runs/SUITE-TIMESTAMP)")
    for axis in SWEEP_AXES:
        p_run.add_argument(axis.flag, dest=axis.name, metavar="LIST", help=f"override {axis.name} (comma-separated)")
    p_run.add_argument("--threads", type=int, help="CPU threads (default: torch's default); recorded")
    p_run.add_argument(
        "--budget-s",
        type=float,
        help="timed seconds per contender and case (default: the suite's); the untimed call before each CPU "
        "sample adds up to as much again",
    )
    p_run.add_argument("--case-budget-s", type=float, help="skip a case predicted to cost more (seconds)")
    p_run.add_argument("--remeasure-ceilings", action="store_true", help="measure ceilings again")
    p_run.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p_run.add_argument(
        "--cpu-allocator",
        metavar=_choices(POLICIES),
        default="cached",
        help="cached: malloc keeps freed memory, no page faults in timings (default); system: malloc as is",
    )
    p_run.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p_run.add_argument(
        "--timeout-s",
        type=float,
        help="per-case limit; past it the case is `timeout` (default: the larger of 120 and twice --case-budget-s)",
    )
    p_run.add_argument(
        "--isolate",
        metavar=_choices(ISOLATION),
        default="worker",
        help="worker: run cases in a worker process, so a hung or crashing kernel costs one row (default)",
    )
    p_run.add_argument(
        "--repeat",
        metavar="N",
        help="run every case N times, each pass in a fresh worker process; median_ms is the median of the "
        "per-repeat medians (repeat_medians_ms), which compare uses (default 1)",
    )
    p_run.add_argument("--shard", metavar="I/N", help="run the I-th of N balanced, deterministic slices")
    p_run.add_argument("--resume", metavar="RUN_DIR", help="run only the cases of RUN_DIR that have no row yet")
    p_run.add_argument(
        "--from",
        dest="from_run",
        metavar="RUN_DIR",
        help="rerun one case of RUN_DIR (with --case) with that run's seed, threads and budgets",
    )
    p_run.add_argument(
        "--case",
        metavar="N",
        help="with --from: the row's index in RUN_DIR's results.csv and "
        "results.parquet (0 is the first row; the `case` column of the report's table)",
    )
    p_run.add_argument(
        "--progress",
        metavar=_choices(PROGRESS_BAR_MODES),
        default="auto",
        help="lines: a line per finished case (for logs); on: a bar; off; auto: a bar where stderr is a terminal, "
        "else lines",
    )
    p_run.add_argument(
        "--fail-on",
        metavar="STATUSES",
        help="exit 1 when a row has one of these statuses (comma-separated, e.g. incorrect,error); "
        "without it a run exits 0 whatever its rows say",
    )
    p_run.add_argument("--store", action="store_true", help="add the run to the results store as it finishes")
    p_run.add_argument("--db", help="the store for --store (default runs/attnbench.duckdb)")
    p_run.set_defaults(func=cmd_run)

    p_profile = commands.add_parser("profile", help="torch.profiler traces and top operators per contender")
    p_profile.add_argument("--out", help="folder to create (default: runs/profile-TIMESTAMP)")
    for axis in SWEEP_AXES:
        if axis is not PASS:  # profiling records the forward call
            p_profile.add_argument(axis.flag, dest=axis.name, metavar="LIST", help=f"{axis.name} (comma-separated)")
    p_profile.add_argument("--pass", dest="profile_pass", help=argparse.SUPPRESS)  # refused below, in one line
    p_profile.add_argument(
        "--calls",
        type=int,
        default=5,
        help="calls the tables are per, at most (default 5; fewer past about 0.1 s of calls; on CPU 2N+3 are recorded, "
        "the N nearest the median kept)",
    )
    p_profile.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p_profile.add_argument("--threads", type=int, help="CPU threads (default: torch's default), as run's --threads")
    p_profile.add_argument("--budget-s", type=float, default=1.0, help="timing budget for each case's median (1)")
    p_profile.add_argument(
        "--ncu",
        action="store_true",
        help="also per kernel with Nsight Compute: SM and DRAM throughput, tensor pipe and "
        "occupancy (needs CUDA and ncu on PATH; --device defaults to cuda)",
    )
    p_profile.set_defaults(func=cmd_profile)

    p_report = commands.add_parser("report", help="figures and one self-contained HTML page from runs")
    p_report.add_argument("runs", nargs="+", metavar="RUN", help="run folders or pytest-benchmark .json files")
    p_report.add_argument("--out", help="folder for report.html and PNGs (default: runs/report-TIMESTAMP)")
    p_report.add_argument("--baseline", help="contender to compute speedups against (default: fastest torch one)")
    p_report.set_defaults(func=cmd_report)

    p_merge = commands.add_parser("merge", help="join shards and runs from several machines into one results set")
    p_merge.add_argument("runs", nargs="+", metavar="RUN", help="run folders or pytest-benchmark .json files")
    p_merge.add_argument("--out", required=True, help="folder to create for the merged results")
    p_merge.set_defaults(func=cmd_merge)

    p_compare = commands.add_parser(
        "compare", help="per-case verdicts of two runs; exit 1 if slower (--repeat runs) or broken"
    )
    p_compare.add_argument("base", metavar="BASE", help="run folder or pytest-benchmark .json")
    p_compare.add_argument("new", metavar="NEW", help="run folder or pytest-benchmark .json")
    p_compare.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="smallest practical floor (default 0.05 = 5%%); a case's floor is the larger of this and the "
        "noise the runs measured for it",
    )
    p_compare.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    p_compare.add_argument(
        "--db",
        help="a results store: each case's floor from the spread between the runs "
        "it holds of that case on this machine (default: floors from the two runs only)",
    )
    p_compare.add_argument(
        "--normalise",
        choices=["raw", "yardstick"],
        default="raw",
        help="yardstick: divide each case's times by the rate of the yardstick that matches "
        "its place on the roofline, timed in the same rounds (default raw)",
    )
    p_compare.add_argument(
        "--out", help="folder for compare.html, compare.png and compare.csv (default: runs/compare-…)"
    )
    p_compare.set_defaults(func=cmd_compare)

    p_ratios = commands.add_parser("ratios", help="one contender vs peers in one run; exit 1 if a bound is missed")
    p_ratios.add_argument("run", metavar="RUN", help="run folder or pytest-benchmark .json")
    p_ratios.add_argument("--impl", required=True, help="the contender to judge, e.g. fused_cpu")
    p_ratios.add_argument("--vs", required=True, help="peers, comma-separated, e.g. sdpa_flash,bmm")
    p_ratios.add_argument("--best", action="store_true", help="per case, compare with the fastest ok peer only")
    p_ratios.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE", help="keep matching cases")
    p_ratios.add_argument(
        "--peer-where",
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        help="take the peers' rows where this holds instead, paired on the other columns "
        "(e.g. --where dtype=bfloat16 --peer-where dtype=float32)",
    )
    p_ratios.add_argument("--max-time-ratio", type=float, help="bound on impl median / peer median")
    p_ratios.add_argument("--min-speedup", type=float, help="bound on peer median / impl median")
    p_ratios.add_argument("--max-mem-ratio", type=float, help="bound on impl peak_mem_mb / peer peak_mem_mb")
    p_ratios.add_argument("--min-pct-of-peak", type=float, help="bound on impl pct_of_peak (%% of the hardware roof)")
    p_ratios.add_argument("--min-pct-of-matmul", type=float, help="bound on impl pct_of_matmul (%% of torch's matmul)")
    p_ratios.set_defaults(func=cmd_ratios)

    _add_history_commands(commands)
    _add_ab_command(commands)
    p_masks = commands.add_parser("masks", help="how each mask falls on a kernel's tiles: skipped, masked, full")
    p_masks.add_argument("--suite", help="the suite's workloads (default: every mask at S1024; with --mask: those)")
    p_masks.add_argument("--out", help="folder for masks.csv and masks.png (default: runs/masks-TIMESTAMP)")
    p_masks.add_argument(
        "--tile", default="128x128,128x64", help="query rows x keys per tile, comma-separated (default 128x128,128x64)"
    )
    for axis in SWEEP_AXES:
        if axis is not IMPL:
            p_masks.add_argument(axis.flag, dest=axis.name, metavar="LIST", help=f"{axis.name} (comma-separated)")
    p_masks.set_defaults(func=cmd_masks)
    commands.add_parser("suites", help="the shipped suites").set_defaults(func=cmd_suites)
    commands.add_parser("models", help="the model presets for --model").set_defaults(func=cmd_models)
    p_env = commands.add_parser("env", help="what this machine is and its ceilings, as recorded in meta.json")
    p_env.add_argument("--dtype", default="float32,bfloat16", metavar="LIST", help="ceilings of these dtypes")
    p_env.add_argument("--threads", type=int, help="CPU threads (default: torch's default)")
    p_env.add_argument("--remeasure", action="store_true", help="measure the ceilings again")
    p_env.set_defaults(func=cmd_env)
    return parser


def _interrupted_note(args: argparse.Namespace | None) -> str:
    """What an interrupt before a command's own handling leaves: a run folder that a resume continues (its plan
    was written), or nothing."""
    folders = [getattr(args, name, None) for name in ("resume", "out")] + [str(path) for path in _CLAIMED]
    for folder in filter(None, folders):
        with contextlib.suppress(OSError):  # a folder's name too long to look at
            if (Path(folder) / "plan.json").is_file():
                return f"finished rows are saved; continue with: attnbench run --resume {folder}"
    return "nothing was written"


def _report_folders() -> Any:
    """reports.out_folder where a command has imported it (report, compare, history claim their folders there),
    else None: imported at start-up, it would fail before the one-tree check can say why (a core without its
    mapped packages has no attnbench.reports)."""
    return sys.modules.get("attnbench.reports.out_folder")


def _forget_claims() -> None:
    if (folders := _report_folders()) is not None:
        folders.forget_claims()


def _remove_unfinished_pages() -> list[str]:
    folders = _report_folders()
    return folders.remove_unfinished_pages() if folders is not None else []


class _Terminal:
    """``sys.stdout`` or ``sys.stderr`` while a command runs.

    A reader that leaves early (``attnbench run … | head -1``, ``2>&1 | head``) made the next print raise
    BrokenPipeError wherever it stood: a progress line in the middle of a sweep stopped the run after its first
    case, exit 0 and no results files; a line of the summary skipped ``--store`` and turned ``--fail-on``'s exit 1
    into 0. Here a write to a reader that has gone is dropped — the descriptor is pointed at /dev/null, so the
    interpreter's last flush has nowhere to fail — and the command goes on to its end and its own exit code. A
    character the stream's encoding lacks (``PYTHONIOENCODING=ascii``, a Latin-1 locale: ``—``, ``≈``, ``×``) is
    replaced, where it was a UnicodeEncodeError traceback after the work was done."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.gone = False  # the reader has left: nothing more is written

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                try:
                    self._stream.write(text)
                except UnicodeEncodeError:
                    encoding = getattr(self._stream, "encoding", None) or "ascii"
                    self._stream.write(text.encode(encoding, "replace").decode(encoding))
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a stream with no descriptor: nothing to do
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno, … as the stream's
        return getattr(self._stream, name)


def _os_error(exc: OSError, args: argparse.Namespace | None = None) -> str:
    """An OSError as a line: the file it names, and why; where it names none (a figure or table a library was
    writing), the command's output folder."""
    why = exc.strerror or str(exc)
    if exc.filename:
        return f"{exc.filename}: {why}"
    out = getattr(args, "out", None)
    return f"{why} (writing into {out})" if out else why


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = None
    _forget_claims()  # folders claimed before, outside a command (build_report from Python), are not this one's
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Terminal(sys.stdout), _Terminal(sys.stderr)
    try:
        check_one_tree()  # a core from one checkout with another's contenders and reports measures the wrong code
        args = build_parser().parse_args(argv)
        args.command_line = command_line(argv)
        args.argv = list(argv)  # which flags were written, where a value equal to the default says nothing
        with termination_as_interrupt():  # SIGTERM, SIGHUP: what Ctrl-C keeps is kept
            code = int(args.func(args))
        _forget_claims()  # what it claimed is written: report, compare, history
        return code
    except UsageError as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before a command's own handling starts (a run's: with its first case)
        kept = _remove_unfinished_pages()  # report, compare, history: no figures without their page
        print(f"attnbench: interrupted; {'; '.join([_interrupted_note(args), *kept])}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `attnbench list | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
    except OSError as exc:  # the disk filled, a folder turned read-only or vanished, a name too long: one line
        kept = _remove_unfinished_pages()
        said = _os_error(exc, args)
        print(f"attnbench: error: {said}; {'; '.join([_interrupted_note(args), *kept])}", file=sys.stderr)
        return 2
    finally:
        _remove_unfinished_pages()  # a command that failed (bad input found late, a bug) leaves no half a report
        _drop_empty_claims()
        sys.stdout, sys.stderr = streams
