"""The ``attnbench`` command: list, run, suites, env.

Bad input raises UsageError anywhere below; ``main`` prints it as one line and exits with code 2, before
anything is written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from attnbench import registry
from attnbench.allocator import POLICIES
from attnbench.errors import UsageError
from attnbench.machine import command_line, environment
from attnbench.results import RunWriter
from attnbench.runner import not_runnable
from attnbench.suite import (
    AXES,
    DEFAULTS,
    INT_AXES,
    Suite,
    check_devices,
    coerce_axis,
    expand,
    load_suite,
    suite_names,
)
from attnbench.workload import DEVICES, canonical_dtype

# CLI flag -> suite axis
AXIS_FLAGS = {axis: "--" + axis.replace("_", "-") for axis in AXES}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise UsageError(message)


def _parse_list(axis: str, text: str) -> list[Any]:
    flag = AXIS_FLAGS[axis]
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise UsageError(f"{flag} {text!r}: give a comma-separated list of values, e.g. {flag} a,b")
    if axis in INT_AXES:
        try:
            values: list[Any] = [int(item) for item in items]
        except ValueError:
            raise UsageError(f"{flag} {text!r}: expected positive integers, e.g. {flag} 512,1024") from None
    else:
        values = items
    if axis == "dtype":
        values = [canonical_dtype(v) for v in values]
    return coerce_axis(axis, values, flag)


def parse_axis_overrides(texts: dict[str, str]) -> dict[str, list[Any]]:
    """{axis: 'a,b'} from flags (or pytest options) into validated value lists."""
    overrides = {}
    for axis, text in texts.items():
        if axis not in AXIS_FLAGS:
            raise UsageError(f"axis {axis!r} is not known; allowed: {', '.join(AXES)}")
        overrides[axis] = _parse_list(axis, text)
    for device in overrides.get("device", []):
        if device not in DEVICES:
            raise UsageError(f"--device {device!r} is not known; allowed: {', '.join(DEVICES)}")
    return overrides


def _overrides(args: argparse.Namespace) -> dict[str, list[Any]]:
    return parse_axis_overrides({axis: getattr(args, axis) for axis in AXES if getattr(args, axis) is not None})


def _default_out(suite: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path("runs") / f"{suite}-{stamp}"
    n = 1
    while out.exists():
        n += 1
        out = Path("runs") / f"{suite}-{stamp}-{n}"
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from attnbench import run_command

    return run_command.cmd_run(args, _overrides(args), _default_out(Path(args.suite).stem))


def cmd_merge(args: argparse.Namespace) -> int:
    from attnbench.reports.merge import merge_runs

    out = Path(args.out)
    RunWriter.check_target(out)
    frame = merge_runs(_run_paths(args.runs), out, args.command_line)
    print(f"merged {len(args.runs)} runs, {len(frame)} rows, {frame['machine'].nunique()} machine(s): {out}")
    return 0


PROFILE_WORKLOAD = {"batch": [1], "heads": [8], "seq": [1024], "head_dim": [64]}


def cmd_profile(args: argparse.Namespace) -> int:
    from attnbench.profiling import profile_case, write_tables

    if args.calls < 1:
        raise UsageError(f"--calls {args.calls}: must be a positive integer")
    overrides = _overrides(args)
    suite = Suite("profile", "", 1.0, 60.0, ({**DEFAULTS, **PROFILE_WORKLOAD},))
    cases = expand(suite, overrides, sorted(registry.load()), registry.sweep_names(), registry.available_sweep_names())
    check_devices(cases)
    out = Path(args.out) if args.out else _default_out("profile")
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
    out.mkdir(parents=True, exist_ok=True)
    profiles = []
    for impl, workload in runnable:
        profile = profile_case(impl, workload, out, calls=args.calls, seed=args.seed)
        profiles.append(profile)
        shown = profile.top_ops[["op", "self_ms_per_call", "pct", "category"]].round(4)
        print(f"\n{impl}  {workload.label()}  ({profile.calls} calls recorded)")
        print(shown.to_string(index=False))
        split = ", ".join(f"{r.category} {r.pct:.0f}%" for r in profile.breakdown.itertuples())
        print(f"breakdown: {split}\ntrace: {profile.trace_path}")
    top_path, breakdown_path = write_tables(profiles, out)
    print(f"\ntables: {top_path}, {breakdown_path}")
    return 0


def _run_paths(texts: list[str]) -> list[Path]:
    paths = [Path(t) for t in texts]
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such run folder or file")
    return paths


def cmd_report(args: argparse.Namespace) -> int:
    from attnbench.reports.build import build_report

    paths = _run_paths(args.runs)
    out = Path(args.out) if args.out else _default_out("report")
    html, pngs = build_report(paths, out, args.baseline, args.command_line)
    print(f"report: {html}")
    for png in pngs:
        print(f"figure: {png}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from attnbench.reports.compare import Settings, compare_frames, load_pair, summary_line, write_compare

    if not 0 < args.threshold < 1:
        raise UsageError(f"--threshold {args.threshold}: must be a fraction between 0 and 1, e.g. 0.05")
    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha {args.alpha}: must be between 0 and 1, e.g. 0.01")
    base, new = _run_paths([args.base, args.new])
    settings = Settings(threshold=args.threshold, alpha=args.alpha)
    table = compare_frames(*load_pair(base, new), settings)
    shown = table[["impl", "workload", "verdict", "ratio", "p_value", "note"]].copy()
    shown["ratio"] = shown["ratio"].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    shown["p_value"] = shown["p_value"].map(lambda v: "" if pd.isna(v) else f"{v:.2g}")
    print(shown.to_string(index=False))
    print(summary_line(table, settings))
    out = Path(args.out) if args.out else _default_out("compare")
    html, png = write_compare(table, out, base, new, settings, args.command_line)
    print(f"comparison: {html}" + (f", {png}" if png else ""))
    slower = table[table["verdict"] == "slower"]
    if len(slower):
        print(f"{len(slower)} case(s) slower beyond {settings.threshold:.0%}", file=sys.stderr)
        return 1
    return 0


def cmd_ratios(args: argparse.Namespace) -> int:
    from attnbench.reports.frames import load_runs
    from attnbench.reports.ratios import Bounds, failures, format_table, ratio_table, require, select

    peers = [p for p in args.vs.split(",") if p]
    if not peers:
        raise UsageError("--vs: name at least one contender to compare with, e.g. --vs sdpa_flash,bmm")
    frame, _ = load_runs(_run_paths([args.run]))
    require(frame, [args.impl, *peers])
    peer_frame = select(frame, args.peer_where) if args.peer_where else None
    frame = select(frame, args.where)
    if not (frame["impl"] == args.impl).any():
        raise UsageError(f"no {args.impl} row matches --where {' '.join(args.where)}")
    unpaired = tuple(condition.partition("=")[0] for condition in args.peer_where)
    table = ratio_table(frame, args.impl, peers, best=args.best, peer_frame=peer_frame, unpaired=unpaired)
    print(format_table(table))
    bounds = Bounds(args.max_time_ratio, args.min_speedup, args.max_mem_ratio, args.min_pct_of_peak)
    missed = failures(table, bounds)
    for _, line in missed:
        print(f"missed: {line}", file=sys.stderr)
    if bounds.any():
        print(f"{len(table) - len({index for index, _ in missed})}/{len(table)} case(s) meet the bounds")
    return 1 if missed else 0


def cmd_list(args: argparse.Namespace) -> int:
    entries = registry.load()
    records: list[dict[str, Any]] = []
    for name, entry in sorted(entries.items()):
        caps = entry.contender.capabilities if entry.contender is not None else None
        records.append({
            "name": name,
            "available": entry.available,
            "reason": entry.unavailable_reason or "",
            "description": entry.contender.description if entry.contender is not None else "",
            "devices": sorted(caps.devices) if caps else [],
            "dtypes": sorted(caps.dtypes) if caps else [],
            "masks": sorted(caps.masks) if caps else [],
            "gqa": caps.gqa if caps else None,
            "backward": caps.backward if caps else None,
            "source": entry.source,
        })  # fmt: skip
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
    for name in suite_names():
        suite = load_suite(name)
        print(f"{name:<10} {suite.description}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    print(json.dumps(environment(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnbench", description="Benchmark attention implementations.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p_list = commands.add_parser("list", help="contenders, their availability and the reason when not")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=cmd_list)

    p_run = commands.add_parser("run", help="run a suite and write a run folder")
    p_run.add_argument("--suite", default="quick", help="suite name (see `attnbench suites`) or a .toml path")
    p_run.add_argument("--out", help="run folder to create (default: runs/SUITE-TIMESTAMP)")
    for axis, flag in AXIS_FLAGS.items():
        p_run.add_argument(flag, dest=axis, metavar="LIST", help=f"override {axis} (comma-separated)")
    p_run.add_argument("--threads", type=int, help="CPU threads (default: torch's default); recorded")
    p_run.add_argument("--budget-s", type=float, help="timing budget per case in seconds (default: the suite's)")
    p_run.add_argument("--case-budget-s", type=float, help="skip a case predicted to cost more (seconds)")
    p_run.add_argument("--remeasure-ceilings", action="store_true", help="measure ceilings again")
    p_run.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    p_run.add_argument(
        "--cpu-allocator", choices=POLICIES, default="cached",
        help="cached: malloc keeps freed memory, no page faults in timings (default); system: malloc as is",
    )  # fmt: skip
    p_run.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p_run.add_argument("--timeout-s", type=float, help="per-case limit; past it the case is `timeout` (default 120)")
    p_run.add_argument(
        "--isolate", choices=["worker", "none"], default="worker",
        help="worker: run cases in a worker process, so a hung or crashing kernel costs one row (default)",
    )  # fmt: skip
    p_run.add_argument("--shard", metavar="I/N", help="run the I-th of N balanced, deterministic slices")
    p_run.add_argument("--resume", metavar="RUN_DIR", help="run only the cases of RUN_DIR that have no row yet")
    p_run.add_argument("--progress", choices=["auto", "on", "off"], default="auto", help="progress bar")
    p_run.set_defaults(func=cmd_run)

    p_profile = commands.add_parser("profile", help="torch.profiler traces and top operators per contender")
    p_profile.add_argument("--out", help="folder to create (default: runs/profile-TIMESTAMP)")
    for axis, flag in AXIS_FLAGS.items():
        if axis != "pass":
            p_profile.add_argument(flag, dest=axis, metavar="LIST", help=f"{axis} (comma-separated)")
    p_profile.set_defaults(**{"pass": None})
    p_profile.add_argument("--calls", type=int, default=5, help="most calls recorded per case (default 5)")
    p_profile.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
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

    p_compare = commands.add_parser("compare", help="per-case verdicts between two runs; exit 1 if slower")
    p_compare.add_argument("base", metavar="BASE", help="run folder or pytest-benchmark .json")
    p_compare.add_argument("new", metavar="NEW", help="run folder or pytest-benchmark .json")
    p_compare.add_argument("--threshold", type=float, default=0.05, help="practical floor (default 0.05 = 5%%)")
    p_compare.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    p_compare.add_argument("--out", help="folder for compare.html and compare.png (default: runs/compare-…)")
    p_compare.set_defaults(func=cmd_compare)

    p_ratios = commands.add_parser("ratios", help="one contender vs peers in one run; exit 1 if a bound is missed")
    p_ratios.add_argument("run", metavar="RUN", help="run folder or pytest-benchmark .json")
    p_ratios.add_argument("--impl", required=True, help="the contender to judge, e.g. fused_cpu")
    p_ratios.add_argument("--vs", required=True, help="peers, comma-separated, e.g. sdpa_flash,bmm")
    p_ratios.add_argument("--best", action="store_true", help="per case, compare with the fastest ok peer only")
    p_ratios.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE", help="keep matching cases")
    p_ratios.add_argument("--peer-where", action="append", default=[], metavar="COLUMN=VALUE",
                          help="take the peers' rows where this holds instead, paired on the other columns "
                          "(e.g. --where dtype=bfloat16 --peer-where dtype=float32)")  # fmt: skip
    p_ratios.add_argument("--max-time-ratio", type=float, help="bound on impl median / peer median")
    p_ratios.add_argument("--min-speedup", type=float, help="bound on peer median / impl median")
    p_ratios.add_argument("--max-mem-ratio", type=float, help="bound on impl peak_mem_mb / peer peak_mem_mb")
    p_ratios.add_argument("--min-pct-of-peak", type=float, help="bound on impl pct_of_peak (%% of the matmul rate)")
    p_ratios.set_defaults(func=cmd_ratios)

    commands.add_parser("suites", help="the shipped suites").set_defaults(func=cmd_suites)
    commands.add_parser("env", help="what this machine is, as recorded in meta.json").set_defaults(func=cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        args.command_line = command_line(argv)
        return int(args.func(args))
    except UsageError as exc:
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `attnbench list | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
