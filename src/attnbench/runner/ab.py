"""A/B in one process: two versions of a contender timed side by side, a verdict per case.

Why in one process: on a shared machine the speed wanders by several per cent over minutes and does not
hit every contender alike, so two separate runs disagree by more than most kernel changes gain (a GPU's
clock moves with its temperature and power draw). Timed in the same interleaved rounds with ``paired=True``
(measure.time_cpu_rounds on CPU, measure_cuda.time_cuda_rounds on CUDA: CUDA events, warm samples only),
each round takes one sample of A and one of B, in a shuffled order, the machine's state of the moment lands
on both, and the ratio of round i's two samples, B_i / A_i, carries the change and little of the drift.

The statistic: the ratio is the median of the per-round ratios (taken on logs, so ×1.05 and ÷1.05 weigh
alike), with a 95 % interval of that median. Why the median rather than a paired t on the mean log ratio:
on a shared machine a round now and then catches a preemption on one side only (ratios of 0.3 or 4),
the mean is pulled and the t interval widened by these, the median is not. The interval is the wider
(the union) of two that assume no distribution:

* a seeded circular *block* bootstrap of the median (blocks of about n^⅓ consecutive rounds):
  neighbouring rounds share the machine's state, and resampling single rounds would make the interval
  narrower than the data support;
* the order-statistic interval of the median (the sign test's: exact for independent rounds at any n),
  because a percentile bootstrap of a median covers too little with few rounds — a case that got ten
  rounds on a busy machine must come out ``unclear``, not be decided on a lucky resample.

Seeded (by ``--seed``), so the same samples always give the same verdict.

The verdict, with ``threshold`` t (default 2 %):

* ``same`` — the whole interval lies inside [1 − t, 1 + t];
* ``slower`` / ``faster`` — the interval excludes 1 and the ratio is beyond 1 ± t. Since the interval
  must exclude 1, the smallest change called is also at least the interval's own half-width: the
  threshold is never below what the interval resolves (``resolution`` in the output);
* ``unclear`` — anything else (a wide interval, or a change inside the threshold not pinned down), and
  always with fewer than ``MIN_PAIRS`` rounds.

A case that cannot be timed gets its status instead of a verdict: ``unsupported`` (a version does not
run this workload), ``incorrect`` (a version's output fails the float64 check, never timed), ``error``.
An ``unclear`` case says why in its reason (too few rounds, or an interval too wide for the threshold, and on
CPU how long the threads waited for a core).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnbench import errors
from attnbench.contenders import _revision as revision
from attnbench.contenders import registry
from attnbench.contenders.contract import Contender, Unsupported
from attnbench.errors import REASON_CHARS, UsageError, one_line
from attnbench.measure._hardware import last_level_cache_bytes
from attnbench.measure.native_build import fresh_tuning_dir
from attnbench.measure.stopwatch import SampleError, Timing, cache_flusher, synchronize, time_cpu_rounds, warm_up
from attnbench.measure.stopwatch_cuda import time_cuda_rounds
from attnbench.runner.cases import WAITED_STALL, prepare_checked
from attnbench.workload import Workload
from attnbench.workload.inputs import make_inputs
from attnbench.workload.suite import check_devices, expand, load_suite, profile_suite

DEFAULT_THRESHOLD = 0.02
DEFAULT_BUDGET_S = 3.0  # timing seconds per case, shared by A and B (preparing and checking come on top)
CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_PAIRS = 5  # fewer rounds than this can't give an interval worth a verdict
VERDICTS = ("faster", "slower", "same", "unclear")


@dataclass(frozen=True)
class Version:
    """One side of the comparison: the row name, the contender object, and where it came from."""

    name: str
    contender: Contender
    source: str  # "registered", or "git COMMIT (REV)"
    notes: tuple[str, ...] = ()  # what of it is not what ``source`` says, one line each, said before timing


@dataclass(frozen=True)
class AbOptions:
    threshold: float = DEFAULT_THRESHOLD
    budget_s: float = DEFAULT_BUDGET_S
    threads: int = 1
    seed: int = 0
    cold: bool = False  # judge the cache-flushed samples (each call after a flush), not the warm ones
    keep_tuning: bool = False  # reuse choices tuned by earlier processes (tuning_dir) instead of tuning both afresh


def _available(name: str, flag: str) -> Contender:
    entry = registry.get(name)  # UsageError for an unknown name
    if not entry.available or entry.contender is None:
        raise UsageError(f"{flag} {name}: not available here — {entry.unavailable_reason}")
    return entry.contender


def registered_versions(a: str, b: str) -> tuple[Version, Version]:
    """``--a A --b B``; ``--a X --b X`` is an A/A run, B's row named ``X (b)`` and prepared on its own."""
    version_a = Version(a, _available(a, "--a"), "registered")
    version_b = Version(b if b != a else f"{b} (b)", _available(b, "--b"), "registered")
    return version_a, version_b


def revision_versions(name: str, rev: str, workdir: Path) -> tuple[Version, Version]:
    """``--impl NAME --base REV``: A is NAME as committed at REV (extracted under ``workdir``, which must
    outlive the run), B the working tree's NAME (see attnbench.contenders._revision). A's ``notes`` say which
    repository and commit REV resolved to, that the run is an A/A when the package's files did not change since,
    and what of it still comes from the working tree."""
    current = _available(name, "--impl")
    located = revision.locate(name, current)
    commit = revision.resolve(located.repo, rev)
    base_root = revision.extract(located, commit, workdir)
    copied = revision.copy_built_extensions(located, base_root)
    base = revision.import_base(name, located, base_root)
    notes = (*revision.orientation(name, located, commit, rev), *revision.notes(located, commit, rev, copied))
    label = f"{name}@{rev}"
    return Version(label, base, f"git {commit} ({rev})", notes), Version(name, current, "working tree")


def sweep_workloads(suite: str | None, overrides: dict[str, list[Any]]) -> list[Workload]:
    """The workloads a suite (or the default one-workload sweep) and axis overrides expand into; the
    suite's contenders are left out, A and B take their place."""
    chosen = load_suite(suite) if suite else profile_suite("ab")
    cases = expand(chosen, {**overrides, "impl": ["ab"]}, ["ab"])
    workloads = list(dict.fromkeys(workload for _, workload in cases))
    check_devices(cases)
    return workloads


# --- the statistic ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedRatio:
    ratio: float  # median of B_i / A_i
    ci_low: float
    ci_high: float
    n_pairs: int

    @property
    def resolution(self) -> float:
        """Half-width of the interval, as a fraction: the smallest change it can tell from none."""
        return math.sqrt(self.ci_high / self.ci_low) - 1


def paired_ratio(a_ms: list[float], b_ms: list[float], seed: int = 0) -> PairedRatio:
    """The median per-round ratio B/A and its circular-block-bootstrap interval (module docstring)."""
    n = min(len(a_ms), len(b_ms))
    if n == 0:
        raise ValueError("no paired rounds")
    logs = np.log(np.asarray(b_ms[:n], dtype=float) / np.asarray(a_ms[:n], dtype=float))
    block = max(1, round(n ** (1 / 3)))
    generator = np.random.default_rng(seed)
    starts = generator.integers(0, n, size=(RESAMPLES, -(-n // block)))
    index = ((starts[:, :, None] + np.arange(block)) % n).reshape(RESAMPLES, -1)[:, :n]
    medians = np.median(logs[index], axis=1)
    low, high = np.quantile(medians, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    rank_low, rank_high = _order_statistic_ranks(n)
    ordered = np.sort(logs)
    low, high = min(low, ordered[rank_low]), max(high, ordered[rank_high])
    return PairedRatio(math.exp(float(np.median(logs))), math.exp(float(low)), math.exp(float(high)), n)


def _order_statistic_ranks(n: int) -> tuple[int, int]:
    """0-based ranks (j, n−1−j) of the sorted sample bounding the median with ≥ CONFIDENCE: the largest j
    with P(Binomial(n, ½) ≤ j) ≤ (1 − CONFIDENCE)/2 (exact, in integers); the whole range when n is too
    small for that."""
    tail, total = (1 - CONFIDENCE) / 2, 2**n
    j, term, cumulative = -1, 1, 1  # term = C(n, j + 1), cumulative = Σ C(n, i) for i ≤ j + 1
    while cumulative / total <= tail:
        j += 1
        term = term * (n - j) // (j + 1)
        cumulative += term
    j = max(j, 0)
    return j, n - 1 - j


def verdict(paired: PairedRatio, threshold: float) -> str:
    """faster / slower / same / unclear for one case (the rules are in the module docstring)."""
    if paired.n_pairs < MIN_PAIRS:
        return "unclear"
    if 1 - threshold <= paired.ci_low and paired.ci_high <= 1 + threshold:
        return "same"
    if paired.ci_low > 1 and paired.ratio > 1 + threshold:
        return "slower"
    if paired.ci_high < 1 and paired.ratio < 1 - threshold:
        return "faster"
    return "unclear"


# --- one case, a sweep ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AbCase:
    """One workload's outcome: a verdict with its ratio, or the status that kept it from being timed."""

    workload: Workload
    verdict: str  # one of VERDICTS, or unsupported / incorrect / error
    reason: str = ""
    paired: PairedRatio | None = None
    samples_a_ms: list[float] = field(default_factory=list)
    samples_b_ms: list[float] = field(default_factory=list)
    choice_a: str = ""  # what each side chose (contract.choice_of: a tuned tile, a backend), '' if it says nothing
    choice_b: str = ""

    def record(self, a: Version, b: Version, threshold: float) -> dict[str, Any]:
        """The case as the JSON line, the CSV row and the figure read it."""
        p = self.paired
        n = p.n_pairs if p else 0
        median_a = float(np.median(self.samples_a_ms[:n])) if n else None
        median_b = float(np.median(self.samples_b_ms[:n])) if n else None
        quotient = median_b / median_a if median_a and median_b is not None else None
        return {
            "impl_a": a.name,
            "impl_b": b.name,
            "workload": self.workload.label(),
            "verdict": self.verdict,
            "ratio": p.ratio if p else None,
            "ci_low": p.ci_low if p else None,
            "ci_high": p.ci_high if p else None,
            "resolution": p.resolution if p else None,
            "threshold": threshold,
            "n_pairs": n,
            "median_a_ms": median_a,
            "median_b_ms": median_b,
            "median_quotient": quotient,
            "medians_disagree": medians_disagree(quotient, p, threshold),
            "reason": self.reason,
            "choice_a": self.choice_a,
            "choice_b": self.choice_b,
            **self.workload.as_row(),
        }


def medians_disagree(quotient: float | None, paired: PairedRatio | None, threshold: float) -> bool | None:
    """Whether B's median over A's lies outside the paired ratio's 95 % interval widened by ``threshold`` on each
    side (None when not timed): inside that, the two tell the same verdict, and a tight interval on a quiet GPU
    does not flag a quotient a few tenths of a per cent off it. On a busy machine a version's samples are bimodal
    (calls preempted or not) and one side's median can land in the fast mode while the other's lands in the slow
    one: 2.189 and 8.252 ms beside a paired ratio of 1.997 [1.978, 2.040]. The paired rounds hold the change;
    medians that contradict them are the machine's."""
    if quotient is None or paired is None:
        return None
    return not paired.ci_low * (1 - threshold) <= quotient <= paired.ci_high * (1 + threshold)


def _reason(exc: BaseException, contender: Contender | None = None) -> str:
    """The exception as a one-line reason (errors.one_line), with base modules under their package's names, and
    where in ``contender``'s own code it was raised (errors.raised_in)."""
    where = errors.raised_in(exc, type(contender).__module__) if contender is not None else ""
    suffix = f" (raised in {where})" if where else ""
    return one_line(f"{type(exc).__name__}: {revision.readable(str(exc))}", REASON_CHARS - len(suffix)) + suffix


def _per_call_s(fn: Callable[[], object], device: str, least_s: float = 0.01) -> float:
    """Seconds per call over ``least_s`` of back-to-back calls: the block size's estimate (one call after
    the warm-up can be several times off on a busy machine)."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        synchronize(device)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= least_s:
            return elapsed / calls


def run_case(a: Version, b: Version, workload: Workload, options: AbOptions) -> AbCase:
    """Prepare and check both versions on one set of inputs, warm them up, time them in paired rounds for
    ``options.budget_s`` seconds in all, and judge the ratio.

    One set, not one each: a memory-bound kernel's speed depends on where its operands lie (huge pages or
    not, which pages collide in the cache), and two copies allocated one after the other don't lie alike.
    With a copy each, A/A runs on a 256 MiB decode cache read B/A 0.92–0.97 (B favoured); reading the same
    tensors, that difference is not there to be measured as a change."""
    for version in (a, b):
        reason = version.contender.unsupported_reason(workload)
        if reason is not None:
            return AbCase(workload, "unsupported", f"{version.name}: {reason}")
    try:
        inputs = make_inputs(workload, seed=options.seed, requires_grad=workload.pass_ != "fwd")
    except Exception as exc:
        return AbCase(workload, "error", f"inputs: {_reason(exc)}")
    fns: dict[str, Callable[[], object]] = {}
    estimates: dict[str, float] = {}
    choices: dict[str, str] = {}
    checks: list[str] = []  # each version's check, said when one fails: "A: max_abs_err …; B: correct"
    failed = False
    for key, version in (("a", a), ("b", b)):
        try:
            prepared = prepare_checked(version.name, workload, options.seed, inputs, version.contender)
            checks.append(f"{version.name}: {prepared.reason if not prepared.ok else 'correct'}")
            failed = failed or not prepared.ok
            if failed:  # nothing is timed; after A failed, B is still checked, to say whether it passes
                continue
            warm_up(prepared.fn, workload.device, prepared.first_call_ms, options.budget_s / 2)
            estimates[key] = _per_call_s(prepared.fn, workload.device)
        except Unsupported as exc:
            return AbCase(workload, "unsupported", f"{version.name}: {one_line(str(exc))}")
        except Exception as exc:  # a contender may fail in any way; the sweep goes on
            return AbCase(workload, "error", f"{version.name}: {_reason(exc, version.contender)}")
        fns[key] = prepared.fn
        choices[key] = prepared.choice
    if failed:  # a version's output failed the check: whether the other's passed is said too
        return AbCase(workload, "incorrect", "; ".join(checks))
    if workload.device == "cuda":
        graphs = workload.pass_ == "fwd"  # autograd's streams don't capture
        timings = time_cuda_rounds(
            fns, options.budget_s / 2, options.seed, paired=True, cold=options.cold, graphs=graphs
        )
    else:
        flush = cache_flusher(last_level_cache_bytes(), options.threads) if options.cold else None
        timings = time_cpu_rounds(
            fns,
            options.threads,
            options.budget_s / 2,
            estimates,
            options.seed,
            paired=True,
            cold=list(fns),
            flush=flush,
        )
    for key, version in (("a", a), ("b", b)):
        timing = timings[key]
        if isinstance(timing, SampleError):
            return AbCase(workload, "error", f"{version.name}: {_reason(timing.cause, version.contender)}")
    samples_a, samples_b = (judged_samples(timings[key], options.cold) for key in ("a", "b"))  # type: ignore[arg-type]
    paired = paired_ratio(samples_a, samples_b, options.seed)
    judged = verdict(paired, options.threshold)
    waited = [t.waited for t in timings.values() if isinstance(t, Timing) and t.waited is not None]
    why = unclear_reason(paired, options.threshold, max(waited, default=None)) if judged == "unclear" else ""
    return AbCase(workload, judged, why, paired, samples_a, samples_b, choices["a"], choices["b"])


def unclear_reason(paired: PairedRatio, threshold: float, waited: float | None = None) -> str:
    """Why a case is ``unclear``, in one line: too few rounds, or an interval too wide for the threshold (and,
    on CPU, how long the threads waited for a core: a busy machine widens it)."""
    if paired.n_pairs < MIN_PAIRS:
        return f"only {paired.n_pairs} paired rounds, fewer than the {MIN_PAIRS} a verdict needs: raise --budget-s"
    busy = (
        f"; its threads waited for a core {waited:.0%} of their time (another process on its cores)"
        if waited is not None and waited >= WAITED_STALL
        else ""
    )
    return (
        f"the 95 % interval [{paired.ci_low:.3f}, {paired.ci_high:.3f}] is not inside 1 ± {threshold:.1%} and does "
        f"not exclude 1 beyond it: more rounds (--budget-s) or a quieter machine narrow it{busy}"
    )


def judged_samples(timing: Timing, cold: bool) -> list[float]:
    """The samples a verdict reads: the warm ones (back-to-back calls, the caches holding what the last call
    left), or with ``cold`` the cache-flushed ones — in paired rounds one of each a round, so A's i-th and B's
    i-th come from the same round either way."""
    if not cold:
        return timing.samples_ms
    if not timing.cold_samples_ms:
        raise ValueError("cold samples asked for, none taken (timed with cold=False, or without a flush)")
    return timing.cold_samples_ms


def run_ab(
    a: Version,
    b: Version,
    workloads: list[Workload],
    options: AbOptions,
    on_case: Callable[[int, AbCase], None] | None = None,
) -> list[AbCase]:
    """Every workload to one :class:`AbCase`, in order; ``on_case(index, case)`` as each one finishes.
    torch runs on ``options.threads`` threads meanwhile (prepare, checks, warm-up and timing alike). Fresh
    tuning is fresh on disk: a contender's in-memory choices from an earlier ``run_ab`` in this process stay
    (the CLI runs one ``ab`` a process)."""
    cases = []
    previous = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    # Both sides tune here, in one folder of their own: a choice kept from an earlier process (one side's, tuned
    # under other conditions) beside one tuned now would put the tuning's luck in the ratio. Where the two ask
    # the same key (an A/A, or a change the key does not see), the second reads the first's choice.
    tuning = contextlib.nullcontext() if options.keep_tuning else fresh_tuning_dir()
    try:
        with tuning:
            for index, workload in enumerate(workloads):
                case = run_case(a, b, workload, options)
                if on_case is not None:
                    on_case(index, case)
                cases.append(case)
    finally:
        torch.set_num_threads(previous)
    return cases


def failed(cases: list[AbCase]) -> list[AbCase]:
    """The cases that make the command exit 1: ``slower``, a version's output ``incorrect``, or a version that
    raised (``error``): a gate must not pass a kernel that fails on every case."""
    return [case for case in cases if case.verdict in ("slower", "incorrect", "error")]


def describe(version: Version) -> dict[str, Any]:
    """A version as meta.json records it."""
    contender = version.contender
    module = revision.real_module_name(type(contender).__module__)
    return {
        "name": version.name,
        "source": version.source,
        "class": f"{module}.{type(contender).__qualname__}",
        "notes": list(version.notes),
    }
