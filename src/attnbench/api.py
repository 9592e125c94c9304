"""``attnbench.run()``: a sweep from Python (a notebook, a script), returning the results frame.

It is ``attnbench run`` without the shell: every argument becomes the CLI flag of the same name and goes
through the CLI's own parser and validation, so a bad value raises :class:`attnbench.UsageError` with the
message the command prints. Axes take one value or a list (``seq=[256, 512]``); ``pass_`` is the ``pass``
axis (``pass`` is a Python keyword), as in :class:`attnbench.Workload`.

``suite=None`` runs one sweep of the axes given, the rest defaulting as ``attnbench profile`` does
(B=1, H=8, S=1024, D=64, float32, cpu, no mask, forward; every contender), with a 1 s timing budget per
case; ``suite="quick"`` (or a .toml path) runs that suite with the axes given replacing its own.

A run folder is written only when ``out`` is given; otherwise the sweep runs in a temporary folder that is
removed before the call returns. Contenders added with :func:`attnbench.register` run in the worker
process too when their class can be imported as ``module:qualname``; otherwise the call raises a
UsageError saying why, and ``isolate="none"`` runs them in this process.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

Axis = Any  # one value or a list of them; validated by the CLI's parser

AXIS_ARGUMENTS = ("impl", "batch", "heads", "kv_heads", "seq", "seq_kv", "head_dim", "dtype", "device", "mask",
                  "pass_", "hidden", "module", "window", "documents", "score_mod", "softcap", "page_size", "model",
                  "phase")  # fmt: skip


def _text(value: Axis) -> str:
    """A value or list as the CLI's comma-separated text."""
    values = value if isinstance(value, list | tuple) else [value]
    return ",".join(str(v) for v in values)


def _argv(suite: str | None, axes: dict[str, Axis], options: dict[str, Any]) -> list[str]:
    argv = ["run"] + ([f"--suite={suite}"] if suite is not None else [])
    for name, value in axes.items():
        if value is not None:
            argv.append(f"--{name.rstrip('_').replace('_', '-')}={_text(value)}")
    for flag, value in options.items():
        if value is not None:
            argv.append(f"--{flag.replace('_', '-')}={value}")
    return argv


def run(
    suite: str | None = None,
    *,
    impl: Axis = None,
    batch: Axis = None,
    heads: Axis = None,
    kv_heads: Axis = None,
    seq: Axis = None,
    seq_kv: Axis = None,
    head_dim: Axis = None,
    dtype: Axis = None,
    device: Axis = None,
    mask: Axis = None,
    pass_: Axis = None,
    hidden: Axis = None,
    module: Axis = None,
    window: Axis = None,
    documents: Axis = None,
    score_mod: Axis = None,
    softcap: Axis = None,
    page_size: Axis = None,
    model: Axis = None,
    phase: Axis = None,
    threads: int | None = None,
    budget_s: float | None = None,
    case_budget_s: float | None = None,
    timeout_s: float | None = None,
    repeat: int = 1,
    seed: int = 0,
    memory: bool = True,
    cpu_allocator: str = "cached",
    out: str | Path | None = None,
    isolate: str = "worker",
    progress: str = "auto",
) -> pd.DataFrame:
    """Run a sweep and return its results: the run's columns (``attnbench.results.COLUMNS``), one row per case.

    Arguments are those of ``attnbench run`` (``memory=False`` is ``--no-memory``); see the module docstring.
    Raises :class:`attnbench.UsageError` on bad input, before anything runs or is written, and
    KeyboardInterrupt after saving the finished rows when the sweep is interrupted.
    """
    from attnbench import run_command
    from attnbench.cli import PROFILE_WORKLOAD, _overrides, build_parser
    from attnbench.suite import DEFAULTS, Suite

    given = dict(zip(AXIS_ARGUMENTS, (impl, batch, heads, kv_heads, seq, seq_kv, head_dim, dtype, device, mask,
                                      pass_, hidden, module, window, documents, score_mod, softcap, page_size,
                                      model, phase), strict=True))  # fmt: skip
    options = {"threads": threads, "budget_s": budget_s, "case_budget_s": case_budget_s, "timeout_s": timeout_s,
               "repeat": repeat, "seed": seed, "cpu_allocator": cpu_allocator, "isolate": isolate,
               "progress": progress}  # fmt: skip
    argv = _argv(suite, given, options) + ([] if memory else ["--no-memory"])
    with tempfile.TemporaryDirectory(prefix="attnbench-run-") as scratch:
        target = Path(out) if out is not None else Path(scratch) / "run"
        args = build_parser().parse_args([*argv, f"--out={target}"])
        named = {"suite": suite, **given, **options, "memory": memory, "out": out}
        args.command_line = f"attnbench.run({', '.join(f'{k}={v!r}' for k, v in named.items() if v is not None)})"
        overrides = _overrides(args)
        if suite is None and model is None:
            args.suite = Suite("notebook", "attnbench.run() without a suite", 1.0, 60.0,
                               ({**DEFAULTS, **PROFILE_WORKLOAD},))  # fmt: skip
        finished = run_command.run_sweep(args, overrides, target)
    if finished.interrupted:
        saved = f"; finished rows are saved in {target}" if out is not None else ""
        raise KeyboardInterrupt(f"attnbench.run was interrupted{saved}")
    return finished.frame
