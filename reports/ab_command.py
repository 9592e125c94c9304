"""`attnbench ab`: check the flags, build the two versions, run the sweep, print and write the verdicts.

Everything that can be bad input (the flags, the output folder, the contenders, the git revision, the
sweep) is checked before anything is timed or written. The versions come from ``attnbench.runner.ab``; the
table, CSV and figure from ``attnbench.reports.ab_report``. Exit 1 when a case is ``slower`` (or a
version's output ``incorrect``), else 0. Ctrl-C keeps the verdicts of the cases judged before it (written,
printed, exit 130); the case in hand leaves nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from attnbench.errors import UsageError
from attnbench.measure.allocator import configure_cpu_allocator
from attnbench.measure.environment import environment
from attnbench.reports.ab_report import format_table, summary_line, write_ab
from attnbench.runner import ab
from attnbench.runner._noise import environment_warnings
from attnbench.runner.request import check_threads
from attnbench.runner.results import RunWriter


def check_flags(args: argparse.Namespace) -> None:
    """One line per mistake: which versions to compare, the threshold, the budget, the threads."""
    if (args.a is None) != (args.b is None):
        raise UsageError("--a and --b go together: --a A --b B times B against A (--a X --b X: an A/A run)")
    if args.a is not None and (args.impl or args.base):
        raise UsageError("give either --a A --b B, or --impl NAME [--base REV]; not both")
    if args.a is None and args.impl is None:
        raise UsageError("--base needs --impl NAME" if args.base else "give --a A --b B, or --impl NAME [--base REV]")
    if args.base is not None and not args.base.strip():
        raise UsageError(
            "--base '': names no revision; give a commit, branch or tag (e.g. --base HEAD~1), or leave it out"
        )
    if not 0 < args.threshold < 1:
        raise UsageError(f"--threshold {args.threshold}: must be a fraction between 0 and 1, e.g. 0.02")
    if not 0 < args.budget_s < math.inf:
        raise UsageError(f"--budget-s {args.budget_s:g}: must be a positive number of seconds")
    check_threads(args.threads)


def progress_line(index: int, total: int, case: ab.AbCase, label: str) -> str:
    """A case's line as it is judged: its verdict and ratio (or why it has none), and where the two sides chose
    differently (a tuned contender's tiles), what each chose."""
    shown = f"{case.paired.ratio:.3f}" if case.paired else case.reason
    if case.choice_a != case.choice_b:
        shown += f" (A chose {case.choice_a or '-'}; B chose {case.choice_b or '-'})"
    return f"[{index + 1}/{total}] {label}: {case.verdict} {shown}"


def cmd_ab(args: argparse.Namespace, overrides: dict[str, list[Any]], out: Path) -> int:
    check_flags(args)
    RunWriter.check_target(out)
    workloads = ab.sweep_workloads(args.suite, overrides)
    threads = args.threads or torch.get_num_threads()
    options = ab.AbOptions(args.threshold, args.budget_s, threads, args.seed, args.cold, args.keep_tuning)
    with tempfile.TemporaryDirectory(prefix="attnbench-ab-") as workdir:  # the base revision's files
        if args.a is not None:
            a, b = ab.registered_versions(args.a, args.b)
        else:
            a, b = ab.revision_versions(args.impl, args.base or "HEAD", Path(workdir))
            for note in a.notes:  # before anything is timed: what of the base is not the base revision's
                print(f"ab: note: {note}", file=sys.stderr)
        configure_cpu_allocator("cached")  # as `run` does by default
        for warning in environment_warnings():  # as a run says them: other work on the cores, the governor
            print(f"warning: {warning}", file=sys.stderr)

        cases: list[ab.AbCase] = []  # as each is judged: what an interrupt keeps

        def report(index: int, case: ab.AbCase) -> None:
            record = case.record(a, b, args.threshold)
            if args.json:
                print(json.dumps(record), flush=True)
            else:
                print(progress_line(index, len(workloads), case, record["workload"]), file=sys.stderr)
            cases.append(case)

        try:
            ab.run_ab(a, b, workloads, options, report)
        except KeyboardInterrupt:
            if not cases:
                raise  # nothing judged: nothing is written, as main says
            interrupted = True
        else:
            interrupted = False
    records = [case.record(a, b, args.threshold) for case in cases]
    settings = {
        "threshold": args.threshold,
        "budget_s": args.budget_s,
        "seed": args.seed,
        "samples": "cold (caches flushed before each call)" if args.cold else "warm (back-to-back calls)",
        "tuning": "kept (choices tuned by earlier processes reused)" if args.keep_tuning else "fresh (both tuned here)",
    }
    meta = {
        "command_line": args.command_line,
        "versions": [ab.describe(a), ab.describe(b)],
        **settings,
        **({"interrupted": f"{len(cases)} of {len(workloads)} case(s) judged"} if interrupted else {}),
        **environment(threads),
    }
    paths = write_ab(records, [(c.samples_a_ms, c.samples_b_ms) for c in cases], out, meta)
    if not args.json:
        print(format_table(records))
        print(summary_line(records))
    print(f"ab: {', '.join(map(str, paths))}", file=sys.stderr if args.json else sys.stdout)
    bad = ab.failed(cases)
    if bad:
        print(f"{len(bad)} case(s) slower beyond {args.threshold:.1%}, incorrect or in error", file=sys.stderr)
    if interrupted:
        print(
            f"ab: interrupted: the files hold the {len(cases)} case(s) judged before it, of {len(workloads)}",
            file=sys.stderr,
        )
        return 130
    return 1 if bad else 0
