"""nox sessions for attnbench: `nox -l` lists them, `nox -s NAME -- ARGS` passes ARGS through.

PyTorch is installed first, as an exact build, so that pip never resolves it itself: the default
`torch==2.13.0` is the CPU build on machines that carry it locally and the CUDA build from the package
index elsewhere on Linux. Set ATTNBENCH_TORCH to install another (e.g. "torch==2.13.0+cu128" with your
own index settings).

`nox -s bench_gpu` installs torch and xformers as a pair instead (ATTNBENCH_TORCH does not apply to it):
xformers' CUDA kernels are a C++ extension built against one exact torch, and under any other torch every
xformers row would be unavailable. By default `torch==2.10.0` from PyTorch's cu128 index
(https://download.pytorch.org/whl/cu128) and `xformers==0.0.35`, the wheel built for torch 2.10.0+cu128. Name
another pair with ATTNBENCH_GPU_TORCH (the torch requirement), ATTNBENCH_GPU_TORCH_INDEX (the index torch comes
from; empty: pip's own settings) and ATTNBENCH_XFORMERS (the xformers requirement, resolved with pip's own
settings; empty: not pinned).

Your plugins (packages with contenders) go into every session that runs attnbench: name them in
ATTNBENCH_PLUGINS (space-separated pip requirements or paths) and/or in plugins.txt beside this file (one
per line), so a rebuilt session venv still has them. `nox -s dev` makes .venv/ here, your own environment.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"

TORCH = os.environ.get("ATTNBENCH_TORCH", "torch==2.13.0")
ROOT = Path(__file__).parent
PACKAGES = ["src", "impls", "suites", "reports"]


def plugin_requirements(environ: Mapping[str, str] = os.environ, file: Path | None = None) -> list[str]:
    """The user's plugins as pip arguments: ATTNBENCH_PLUGINS split as a shell splits a line, then each line of
    `file` (default plugins.txt here, git-ignored; blank lines and `#` comments skipped; a line that starts
    with `-`, e.g. `-e ../mypkg`, is an option and its value). Paths are relative to this folder, where nox
    runs."""
    requirements = shlex.split(environ.get("ATTNBENCH_PLUGINS", ""))
    file = ROOT / "plugins.txt" if file is None else file
    if file.exists():
        for line in file.read_text().splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                requirements += shlex.split(line) if line.startswith("-") else [line]
    return requirements


class Torch(NamedTuple):
    """The torch a session installs first: its requirement, the index it comes from ("": pip's own settings),
    and what must come with it, pinned for every later step (xformers, whose extension loads under one torch)."""

    requirement: str
    index: str = ""
    pinned: tuple[str, ...] = ()


def gpu_pair(environ: Mapping[str, str] = os.environ) -> Torch:
    """bench_gpu's torch and xformers, a pair whose C++/CUDA extension loads (see the module docstring)."""
    xformers = environ.get("ATTNBENCH_XFORMERS", "xformers==0.0.35").strip()
    return Torch(
        environ.get("ATTNBENCH_GPU_TORCH", "torch==2.10.0"),
        environ.get("ATTNBENCH_GPU_TORCH_INDEX", "https://download.pytorch.org/whl/cu128").strip(),
        (xformers,) if xformers else (),
    )


def install_steps(
    tmp: Path, extras: tuple[str, ...], editable: bool = False, plugins: bool = True, torch: Torch | None = None
) -> list[list[str]]:
    """The `pip install` argument lists, in order: torch (the exact build, from its index if it names one),
    attnbench with `extras` under a constraint that pins that torch (and what `torch` pins with it), then the
    user's plugins under the same constraint. `torch` defaults to ATTNBENCH_TORCH from pip's own index."""
    torch = Torch(TORCH) if torch is None else torch
    constraint = tmp / "torch-constraint.txt"
    constraint.write_text("".join(f"{line}\n" for line in (torch.requirement, *torch.pinned)))
    target = f".[{','.join(extras)}]" if extras else "."
    index = ["--index-url", torch.index] if torch.index else []
    steps = [[torch.requirement, *index], ["--constraint", str(constraint), *(["-e"] if editable else []), target]]
    requirements = plugin_requirements() if plugins else []
    if requirements:
        steps.append(["--constraint", str(constraint), *requirements])
    return steps


def install(session: nox.Session, *extras: str, plugins: bool = True, torch: Torch | None = None) -> None:
    """torch first (exact build), then attnbench with the given extras and the user's plugins (see
    plugin_requirements), never letting pip swap torch. The test and lint sessions leave plugins out: they
    check attnbench itself. setuptools' build/ folder goes first: it keeps modules since deleted from the source
    and would put them in the wheel (a test of a removed module then finds it installed)."""
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    for args in install_steps(Path(session.create_tmp()), extras, plugins=plugins, torch=torch):
        session.install(*args)


@nox.session(python=False, default=False)
def dev(session: nox.Session) -> None:
    """Make or update .venv/ here, your own environment: attnbench editable, torch pinned, pytest, your plugins."""
    venv = ROOT / ".venv"
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        session.run(sys.executable, "-m", "venv", str(venv), external=True)
    for args in install_steps(Path(session.create_tmp()), ("test",), editable=True):
        session.run(str(python), "-m", "pip", "install", *args, external=True)
    bin_dir = python.parent.relative_to(ROOT)
    session.log(
        f"ready: `source {bin_dir}/activate` puts attnbench on PATH (or call {bin_dir}/attnbench); "
        "edits to this folder take effect without reinstalling"
    )


# Run before the whole suite (no test selection): they build the C++ kernels and measure this machine's ceilings into
# the suite's cache once, on a quiet machine, and say in the log what the machine is and which contenders run here.
WARM_UP = (("attnbench", "env"), ("attnbench", "list"))


@nox.session
def tests(session: nox.Session) -> None:
    """Run the tests against a plain, non-editable install of attnbench, in two phases (see test_phases) that share
    one cache of built kernels and measured ceilings (see test_cache)."""
    install(session, "test", "xformers", "triton", plugins=False)
    env = test_cache(Path(session.create_tmp()))
    for command in () if session.posargs else WARM_UP:
        session.run(*command, env=env)
    for args in test_phases(session.posargs):
        # with the user's own selection (`-- -k name`) one phase may find nothing to run: pytest's exit code 5
        session.run("pytest", *args, env=env, success_codes=[0, 5] if session.posargs else [0])


def test_cache(tmp: Path, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment that gives the test run one attnbench cache (ATTNBENCH_CACHE_DIR): a fresh folder under the
    session's tmp/, emptied first, so that each `nox -s tests` measures this machine anew and builds from the
    current sources; nothing where the user names their own cache. Without it each pytest process made its own, and
    built the C++ kernels and measured the ceilings again."""
    if environ.get("ATTNBENCH_CACHE_DIR", "").strip():
        return {}
    cache = tmp.resolve() / "attnbench-cache"  # absolute: tests run attnbench in folders of their own
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    return {"ATTNBENCH_CACHE_DIR": str(cache)}


def default_workers(cores: int | None = None) -> int:
    """The first phase's pytest-xdist workers where ATTNBENCH_TEST_WORKERS is not set: 2 where there are 2 cores or
    more, else none (pytest's own process). More workers than 2 are not the default: the suite is checked on 2."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 2 if cores >= 2 else 0


def test_phases(posargs: list[str], environ: Mapping[str, str] = os.environ) -> list[list[str]]:
    """pytest's arguments for each phase of `nox -s tests`: first every test but the `serial` ones, then the
    `serial` ones on their own: they keep both cores busy themselves (Triton's interpreter split over a process per
    core) or need the machine to themselves (the README's commands, whose rows must time `ok`). The first phase runs
    on ATTNBENCH_TEST_WORKERS pytest-xdist workers (default: default_workers; 0: in pytest's own process), a test
    file at a time on one worker, so a file's shared fixtures are made once. Most tests use one core, so two workers
    keep both cores busy (docs/testing.md: the times); a real sweep then times more rows `stalled`, which every test
    of a real sweep accepts as checked."""
    workers = environ.get("ATTNBENCH_TEST_WORKERS", "").strip() or str(default_workers())
    return [
        ["tests", "-n", workers, "--dist", "loadfile", "-m", "not timing and not serial", *posargs],
        ["tests", "-m", "serial and not timing", *posargs],
    ]


@nox.session(default=False)
def timing_checks(session: nox.Session) -> None:
    """Check the timing claims (agreement with blocked_autorange, repeatability) on a quiet machine."""
    install(session, "test", plugins=False)
    session.run("pytest", "tests", "-m", "timing", "-v", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """Check style with ruff, types with mypy and the core's import order (its rooms) with import-linter."""
    install(session, "lint", plugins=False)
    session.run("ruff", "check", *PACKAGES, "tests", "noxfile.py", "examples", "trials")
    session.run("ruff", "format", "--check", *PACKAGES, "tests", "noxfile.py", "examples", "trials")
    # mypy cannot follow setuptools' package-dir mapping, so check a symlinked view of the import layout.
    view = Path(session.create_tmp()) / "typecheck"
    _import_layout(view)
    session.run("mypy", str(view / "attnbench"))
    # the rooms' import order (pyproject.toml's [tool.importlinter]), read from the same view
    session.run("lint-imports", str(ROOT / "pyproject.toml"), env={"PYTHONPATH": str(view)})


def _import_layout(view: Path) -> None:
    """view/attnbench/ mirrors the installed package: src/attnbench modules and rooms plus impls/, suites/, reports/."""
    package = view / "attnbench"
    if package.exists():
        for link in package.iterdir():
            link.unlink()
    package.mkdir(parents=True, exist_ok=True)
    for item in (ROOT / "src" / "attnbench").iterdir():
        if item.suffix == ".py" or (item / "__init__.py").is_file():  # the core's modules and its rooms
            (package / item.name).symlink_to(item, target_is_directory=item.is_dir())
    for sub in ("impls", "suites", "reports"):
        (package / sub).symlink_to(ROOT / sub, target_is_directory=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Run the quick CPU benchmark into runs/ (arguments go to `attnbench run`)."""
    install(session, "xformers")
    session.run("attnbench", "run", "--suite", "quick", *session.posargs)


@nox.session(default=False)
def report(session: nox.Session) -> None:
    """Write report.html and figures for run folders (default: the newest run under runs/)."""
    install(session)
    runs = session.posargs or [str(_newest_run())]
    session.run("attnbench", "report", *runs)


def _newest_run() -> Path:
    runs = [p for p in (ROOT / "runs").glob("*") if (p / "results.parquet").exists()]
    if not runs:
        raise SystemExit("no run under runs/: run `nox -s bench` first, or pass run folders after --")
    return max(runs, key=lambda p: p.stat().st_mtime)


@nox.session(default=False)
def profile(session: nox.Session) -> None:
    """Profile contenders with torch.profiler (arguments go to `attnbench profile`, e.g. --impl bmm --seq 1024)."""
    install(session)
    session.run("attnbench", "profile", *session.posargs)


@nox.session(default=False)
def history(session: nox.Session) -> None:
    """Store the newest runs under runs/ in runs/attnbench.duckdb and draw runs/history/history.html.

    Arguments go to `attnbench history` (e.g. --impl fused_cpu --fail-on-regression 10)."""
    install(session)
    runs = _newest_runs(HISTORY_RUNS)
    if not runs:
        raise SystemExit("no run under runs/: run `nox -s bench` first")
    db = str(ROOT / "runs" / "attnbench.duckdb")
    session.run("attnbench", "store", *map(str, runs), "--db", db)
    session.run("attnbench", "history", "--db", db, "--out", str(ROOT / "runs" / "history"), *session.posargs)


HISTORY_RUNS = 50  # the newest run folders `nox -s history` stores (storing one twice adds nothing)


def _newest_runs(count: int) -> list[Path]:
    runs = [p for p in (ROOT / "runs").glob("*") if (p / "results.parquet").exists()]
    return sorted(runs, key=lambda p: p.stat().st_mtime)[-count:]


@nox.session(default=False)
def report_check(session: nox.Session) -> None:
    """Test the reports, in headless Chromium too (installed from Debian's packages when missing)."""
    session.run("bash", ".ci/install-chromium", external=True)
    install(session, "test", plugins=False)
    session.run("pytest", "tests/test_reports.py", "tests/test_report_browser.py", "-rs", *session.posargs)


@nox.session(default=False)
def bench_gpu(session: nox.Session) -> None:
    """Run the gpu suite on CUDA into runs/ (arguments go to `attnbench run`), with torch and xformers installed as
    a pair whose extension loads (gpu_pair: ATTNBENCH_GPU_TORCH, ATTNBENCH_GPU_TORCH_INDEX, ATTNBENCH_XFORMERS)."""
    install(session, "xformers", "gpu", torch=gpu_pair())
    session.run("attnbench", "run", "--suite", "gpu", *session.posargs)


@nox.session(default=False)
def bench_fused(session: nox.Session) -> None:
    """Our fused kernels against their peers, each claim measured within one run (exit 1 if one is missed).

    CPU, eight runs: fp32 forward (S 2048/4096) and fwd_bwd (S 2048), none and causal, ≤ 1.0× sdpa_flash's
    median, and fp32 S4096 none ≥ 85 % of the hardware roof (`pct_of_peak`: the measured FMA throughput);
    bf16 ≤ 1.0× sdpa_flash in bf16 and ≥ 1.6× fused_cpu's own fp32 rate (S 4096); decode (Sq 1, KV 32768,
    H32/8, D128) ≤ 1.0× sdpa_flash and ≥ 70 % of the memory roof (`pct_of_peak`: gbps over the measured
    triad bandwidth); bf16 S4096 ≥ 88 % of the bf16 dot-product roof. Issue 23's workloads: MLA decode (latent
    576/512, H128, B4, cache 8192, fp32 and bf16) ≥ 70 % of its dtype's roof and ≤ 0.5× the best of bmm, einsum
    and sdpa_flash; decode over a shared prefix (B32, prefix 16384 + suffix 256, H32/8 D128) ≥ 70 % of the roof
    at its intensity, ≤ 0.2× sdpa_flash and ≤ 0.25× fused_cpu reading the prefix per sequence; learned sinks
    ≤ 1.05× the same case without (fwd and fwd_bwd, S2048, the median of 3 repeats); decode over an fp8 cache
    ≤ 0.35× (a float32 q, and a bfloat16 model's q) and a bf16 cache ≤ 0.6× fused_cpu's own fp32-cache decode
    (H32/8 D128, KV 32768).
    On a CUDA machine also fused_triton (issue 32, suites fused_gpu and fused_gpu_short, bf16): the D128 forward (S
    4k–16k) ≥ 1.0× the best SDPA backend and ≥ 70 % of the measured bf16 matmul rate, at S16384 none ≥ 62 % of the
    datasheet roof (`pct_of_peak`); D64 S8192 ≤ 1.0× sdpa_cudnn; fwd_bwd S8192 ≤ 1.15× sdpa_cudnn; the gpu suite's
    short rows (S 512–2048, D64 and D128) ≤ 1.1× the fastest contender; the fp8 forward (suite fused_gpu_fp8: q, k,
    v in e4m3, D128 S16384) ≥ 1.4× its own bf16 rate; and its serving kernels (suite fused_gpu_serving, issue 33):
    decode (B8 H32/8 D128 bf16, 8192 and 32768 keys) ≤ 1.0× sdpa_cudnn and ≥ 85 % of the copy bandwidth measured in
    the run (`pct_of_matmul`); pages of 16 ≤ 1.1× its contiguous time; an fp8 e4m3 cache ≤ 0.6× its bf16-cache time;
    MLA decode (B8 and B64) ≤ 0.5× bmm and ≥ 50 % of the roof at its intensity; decode over a shared prefix (B32,
    16384 + 256) ≤ 0.2× itself reading the prefix per sequence and ≤ 0.2× the best of sdpa_cudnn and the torch
    cascade.
    Arguments go to `attnbench run` (e.g. --threads 2)."""
    install(session, "triton", "gpu")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cpu, gpu, serving = f"runs/fused-cpu-{stamp}", f"runs/fused-gpu-{stamp}", f"runs/fused-gpu-serving-{stamp}"
    short, fp8 = f"runs/fused-gpu-short-{stamp}", f"runs/fused-gpu-fp8-{stamp}"
    suites = (
        "fused_cpu",
        "fused_cpu_train",
        "fused_cpu_bf16",
        "fused_cpu_decode",
        "fused_cpu_mla",
        "fused_cpu_prefix",
        "fused_cpu_sinks",
        "fused_cpu_kv",
    )
    runs = {suite: f"{cpu}/{suite}" for suite in suites}
    # the sinks gate compares two workloads timed apart, not in the same rounds: the median of 3 repeats, so one
    # disturbed sample (a fwd_bwd row read 1.08x with an IQR of 7.7 ms, 1.017x on the re-run) doesn't decide it
    repeats = {"fused_cpu_sinks": ["--repeat", "3"]}
    for suite, out in runs.items():
        session.run("attnbench", "run", "--suite", suite, "--out", out, *repeats.get(suite, []), *session.posargs)
    session.run("attnbench", "report", *runs.values(), "--out", f"{cpu}/report")
    check = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
    has_cuda = str(session.run("python", "-c", check, silent=True)).strip().splitlines()[-1] == "cuda"
    if has_cuda:  # both runs first, then the gates: a missed CPU claim must not cost the GPU run
        session.run("attnbench", "run", "--suite", "fused_gpu", "--out", gpu, *session.posargs)
        session.run("attnbench", "run", "--suite", "fused_gpu_short", "--out", short, *session.posargs)
        session.run("attnbench", "run", "--suite", "fused_gpu_fp8", "--out", fp8, *session.posargs)
        session.run("attnbench", "run", "--suite", "fused_gpu_serving", "--out", serving, *session.posargs)
        session.run("attnbench", "report", gpu, short, fp8, serving, "--out", f"{gpu}/report")
    gates = [
        (runs["fused_cpu"], "--vs", "sdpa_flash", "--max-time-ratio", "1.0"),
        (
            runs["fused_cpu"],
            "--vs",
            "sdpa_flash",
            "--where",
            "seq_q=4096",
            "--where",
            "mask=none",
            "--min-pct-of-peak",
            "85",
        ),
        (runs["fused_cpu_train"], "--vs", "sdpa_flash", "--max-time-ratio", "1.0"),
        (runs["fused_cpu_bf16"], "--vs", "sdpa_flash", "--where", "dtype=bfloat16", "--max-time-ratio", "1.0"),
        (
            runs["fused_cpu_bf16"],
            "--vs",
            "fused_cpu",
            "--where",
            "dtype=bfloat16",
            "--peer-where",
            "dtype=float32",
            "--min-speedup",
            "1.6",
        ),
        (runs["fused_cpu_decode"], "--vs", "sdpa_flash", "--max-time-ratio", "1.0", "--min-pct-of-peak", "70"),
        # issue 23: bf16 prefill near its dot-product roof; MLA decode compute-bound; a shared prefix read once;
        # sinks at the price of the case without them
        (runs["fused_cpu_bf16"], "--vs", "sdpa_flash", "--where", "dtype=bfloat16", "--min-pct-of-peak", "88"),
        (
            runs["fused_cpu_mla"],
            "--vs",
            "bmm,einsum,sdpa_flash",
            "--best",
            "--max-time-ratio",
            "0.5",
            "--min-pct-of-peak",
            "70",
        ),
        (
            runs["fused_cpu_prefix"],
            "--vs",
            "sdpa_flash",
            "--where",
            "shared_prefix=16384",
            "--max-time-ratio",
            "0.2",
            "--min-pct-of-peak",
            "70",
        ),
        (
            runs["fused_cpu_prefix"],
            "--vs",
            "fused_cpu",
            "--where",
            "shared_prefix=16384",
            "--peer-where",
            "shared_prefix=0",
            "--max-time-ratio",
            "0.25",
        ),
        (
            runs["fused_cpu_sinks"],
            "--vs",
            "fused_cpu",
            "--where",
            "sinks=learned",
            "--peer-where",
            "sinks=none",
            "--max-time-ratio",
            "1.05",
        ),
        # narrow caches against the float32 cache: a float32 q, and (fp8) a bfloat16 model's q
        (
            runs["fused_cpu_kv"],
            "--vs",
            "fused_cpu",
            "--where",
            "dtype=float32",
            "--where",
            "kv_dtype=float8_e4m3fn",
            "--peer-where",
            "kv_dtype=float32",
            "--max-time-ratio",
            "0.35",
        ),
        (
            runs["fused_cpu_kv"],
            "--vs",
            "fused_cpu",
            "--where",
            "dtype=bfloat16",
            "--where",
            "kv_dtype=float8_e4m3fn",
            "--peer-where",
            "dtype=float32",
            "--peer-where",
            "kv_dtype=float32",
            "--max-time-ratio",
            "0.35",
        ),
        (
            runs["fused_cpu_kv"],
            "--vs",
            "fused_cpu",
            "--where",
            "dtype=float32",
            "--where",
            "kv_dtype=bfloat16",
            "--peer-where",
            "kv_dtype=float32",
            "--max-time-ratio",
            "0.6",
        ),
    ]
    _gates(session, "fused_cpu", gates)
    if not has_cuda:
        session.log("no CUDA device: fused_triton's GPU comparison skipped")
        return
    contiguous = ("--where", "page_size=0", "--where", "kv_dtype=bfloat16", "--where", "kv_layout=separate")
    prefill = ("--where", "pass=fwd", "--where", "head_dim=128")
    peers = "bmm,sdpa_math,sdpa_flash,sdpa_efficient,sdpa_cudnn,xformers,flex"
    gpu_gates = [
        (
            gpu,
            "--vs",
            "sdpa_flash,sdpa_efficient,sdpa_cudnn",
            "--best",
            *prefill,
            "--min-speedup",
            "1.0",
            "--min-pct-of-matmul",
            "70",
        ),
        (
            gpu,
            "--vs",
            "sdpa_cudnn",
            *prefill,
            "--where",
            "seq_q=16384",
            "--where",
            "mask=none",
            "--min-pct-of-peak",
            "62",
        ),
        (gpu, "--vs", "sdpa_cudnn", "--where", "head_dim=64", "--max-time-ratio", "1.0"),
        (gpu, "--vs", "sdpa_cudnn", "--where", "pass=fwd_bwd", "--where", "seq_q=8192", "--max-time-ratio", "1.15"),
        (short, "--vs", peers, "--best", "--max-time-ratio", "1.1"),
        (
            fp8,
            "--vs",
            "fused_triton",
            "--where",
            "q_dtype=float8_e4m3fn",
            "--peer-where",
            "q_dtype=bfloat16",
            "--peer-where",
            "kv_dtype=bfloat16",
            "--min-speedup",
            "1.4",
        ),
        (
            serving,
            "--vs",
            "sdpa_cudnn",
            "--where",
            "batch=8",
            *contiguous,
            "--max-time-ratio",
            "1.0",
            "--min-pct-of-matmul",
            "85",
        ),
        (
            serving,
            "--vs",
            "fused_triton",
            "--where",
            "page_size=16",
            "--peer-where",
            "page_size=0",
            "--max-time-ratio",
            "1.1",
        ),
        (
            serving,
            "--vs",
            "fused_triton",
            "--where",
            "kv_dtype=float8_e4m3fn",
            "--peer-where",
            "kv_dtype=bfloat16",
            "--max-time-ratio",
            "0.6",
        ),
        (serving, "--vs", "bmm", "--where", "kv_layout=latent", "--max-time-ratio", "0.5", "--min-pct-of-peak", "50"),
        (
            serving,
            "--vs",
            "fused_triton",
            "--where",
            "shared_prefix=16384",
            "--peer-where",
            "shared_prefix=0",
            "--max-time-ratio",
            "0.2",
        ),
        (serving, "--vs", "sdpa_cudnn,cascade", "--best", "--where", "shared_prefix=16384", "--max-time-ratio", "0.2"),
    ]
    _gates(session, "fused_triton", gpu_gates)


def _gates(session: nox.Session, impl: str, gates: list[tuple[str, ...]]) -> None:
    """``attnbench ratios RUN --impl IMPL ARGS…`` for each (RUN, ARGS…): every gate reports, then the session
    fails if any missed."""
    missed = 0
    for run, *args in gates:
        try:
            session.run("attnbench", "ratios", run, "--impl", impl, *args)
        except nox.command.CommandFailed:
            missed += 1
    if missed:
        session.error(f"{missed} of {len(gates)} {impl} gate(s) missed")


@nox.session(default=False)
def calibrate(session: nox.Session) -> None:
    """A/A false alarms and detection of ×1.05/×1.10/×1.25 slowdowns on this machine, one table: ab (one process),
    compare run vs run (raw, yardstick-normalised, history floors) and history's change detection (a real +10 %
    step). Arguments go to `python -m attnbench.reports.calibrate` (e.g. --quick, --runs 10)."""
    install(session)
    session.run("python", "-m", "attnbench.reports.calibrate", "--ab", *session.posargs)


@nox.session(default=False)
def calibrate_ab(session: nox.Session) -> None:
    """Measure `attnbench ab`'s false alarms (A/A) and detection of ×1.05/×1.10/×1.25 slowdowns by real work."""
    install(session)
    session.run("python", "-m", "attnbench.reports.calibrate_ab", *session.posargs)


@nox.session(default=False)
def gpu_smoke(session: nox.Session) -> None:
    """Force every fused_triton tile once, forward and backward, against float64 on a CUDA GPU (exit 0 without one):
    the basic cases and the newest workloads' (Dv ≠ D, sinks, ragged/mixed/chunked, fp8 caches, MLA, shared prefix)."""
    install(session, "triton")
    session.run("python", "-m", "attnbench.impls.fused_triton.smoke", *(session.posargs or ["--jobs", "8"]))


@nox.session(default=False)
def pytest_bench(session: nox.Session) -> None:
    """Run a suite through pytest-benchmark (arguments go to pytest, e.g. --attnbench-suite standard)."""
    install(session, "test")
    session.run("pytest", "suites", "--benchmark-only", "-p", "no:cacheprovider", *session.posargs)
