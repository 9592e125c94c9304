"""Run planned cases: availability → support → prediction → prepare → first call → correctness gate →
timing → memory pass → row.

The contenders of one workload run as a group (:func:`run_group`): each is prepared, checked and warmed
up, then all of them are timed together in interleaved rounds (measure.time_cpu_rounds on CPU,
measure_cuda.time_cuda_rounds on CUDA), so machine drift or a GPU's clock lands on every contender alike;
then each gets its memory pass. Every case ends as exactly one row, whatever happens inside it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench import errors
from attnbench.contenders import registry
from attnbench.contenders.contract import Contender, Unsupported, choice_of
from attnbench.measure import _gpu_state as gpu_state
from attnbench.measure import _yardsticks as yardsticks
from attnbench.measure._ceilings import Ceilings
from attnbench.measure._memory import free_memory_bytes, held_for_reuse_bytes, peak_memory_mb, release_cached_memory
from attnbench.measure.stopwatch import SampleError, Timing, cache_flusher, call_once_ms, time_cpu_rounds, warm_up
from attnbench.measure.stopwatch_cuda import time_cuda_rounds
from attnbench.runner._predict import MEMORY_PASS_COST, input_bytes, predict, skip_reason
from attnbench.runner.results import YARDSTICK_COLUMNS, make_row
from attnbench.workload import Workload
from attnbench.workload.check import CheckResult, GradCheck, check_grads, check_output
from attnbench.workload.flops import attention_bytes
from attnbench.workload.inputs import AttentionInputs, make_inputs
from attnbench.workload.mha import check_module_output, wrap_core
from attnbench.workload.paged import gathered


@dataclass(frozen=True)
class RunOptions:
    budget_s: float = 1.0  # timing budget per case
    case_budget_s: float = 60.0  # predicted cost over which a case is skipped
    threads: int = 1
    seed: int = 0
    measure_memory: bool = True
    ceilings: dict[str, Ceilings] = field(default_factory=dict)  # by device
    yardsticks: bool = True  # CPU: time the yardstick kernels in every round (attnbench.measure._yardsticks)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def not_runnable(impl: str, workload: Workload) -> tuple[str, str] | None:
    """(status, reason) when a case can't run here — unavailable contender or unsupported workload."""
    entry = registry.get(impl)
    if not entry.available or entry.contender is None:
        return "unavailable", entry.unavailable_reason or "not available"
    reason = entry.contender.unsupported_reason(workload)
    return None if reason is None else ("unsupported", reason)


@dataclass(frozen=True)
class Prepared:
    """A case made ready to time: the callable, its correctness verdict and set-up costs."""

    fn: Callable[[], object]  # what is timed: the forward, the backward, or both
    check: CheckResult
    setup_ms: float
    first_call_ms: float
    grad_check: GradCheck | None = None
    choice: str = ""  # what the contender chose for this workload (contract.choice_of), after its first call

    @property
    def ok(self) -> bool:
        return self.check.ok and (self.grad_check is None or self.grad_check.ok)

    @property
    def reason(self) -> str:
        return "; ".join(r for r in (self.check.reason, self.grad_check.reason if self.grad_check else "") if r)


def _passes(inputs: AttentionInputs, forward: Callable[[], torch.Tensor]) -> Callable[[], object]:
    """The callable to time for the workload's pass. Gradients come from torch.autograd.grad, which returns
    them instead of accumulating into .grad, so nothing builds up between samples. Learned sinks are a fourth leaf."""
    leaves: tuple[torch.Tensor, ...] = (inputs.q, inputs.k, inputs.v)
    if inputs.sinks is not None:
        leaves = (*leaves, inputs.sinks)
    upstream = inputs.grad_out
    if inputs.workload.pass_ == "fwd":
        return forward
    if inputs.workload.pass_ == "fwd_bwd":
        return lambda: torch.autograd.grad(forward(), leaves, upstream)
    output = forward()  # bwd: one forward outside the timed region, its graph kept for every sample
    return lambda: torch.autograd.grad(output, leaves, upstream, retain_graph=True)


class InputsModified(Exception):
    """A contender wrote into the inputs it was given (q, k, v, their scales, the page pool): the other contenders
    of the workload, and its own later calls, would read what it wrote."""


def _input_versions(inputs: AttentionInputs, harness_gathers: bool) -> dict[str, tuple[torch.Tensor, int]]:
    """The input tensors a contender must leave as given, with their version counters (torch bumps a tensor's on
    every in-place write through torch: ``q.mul_(scale)``, ``out=q``; free to read). k and v are left out where the
    harness gathers a page pool into them in each call."""
    named = {"q": inputs.q, "q_scale": inputs.q_scale, "k_scale": inputs.k_scale, "v_scale": inputs.v_scale}
    if not harness_gathers:
        named.update(k=inputs.k, v=inputs.v)
    if inputs.paged is not None:
        named.update(k_pages=inputs.paged.k_pages, v_pages=inputs.paged.v_pages)
    versions = {}
    for name, tensor in named.items():
        try:
            versions[name] = (tensor, tensor._version) if tensor is not None else None
        except RuntimeError:  # an inference-mode tensor keeps no version counter
            continue
    return {name: kept for name, kept in versions.items() if kept is not None}


def _check_inputs_kept(impl: str, watched: dict[str, tuple[torch.Tensor, int]]) -> None:
    """InputsModified, naming the tensors, when ``prepare`` or the first call wrote into an input in place."""
    written = [name for name, (tensor, version) in watched.items() if tensor._version != version]
    if written:
        raise InputsModified(
            f"{impl} wrote into its input {', '.join(written)} in place (in prepare or its first call); a contender "
            "must leave its inputs as given — every contender of the workload reads the same tensors, and the "
            "check and the timing of the next call would read what it wrote: write into a copy or a new tensor"
        )


def prepare_checked(
    impl: str,
    workload: Workload,
    seed: int = 0,
    inputs: AttentionInputs | None = None,
    contender: Contender | None = None,
) -> Prepared:
    """Make inputs (unless given: a group shares one set), prepare the contender, make its first call and
    check it against the float64 reference (the output, and for backward passes the gradients of q, k and v).
    For a paged cache the contender does not read itself, the callable gathers the pages into its k and v
    first (``attnbench.workload.paged.gathered``). ``contender`` stands in for the registered one named ``impl`` (the
    A/B command's second copy, or a version from another git revision).

    Raises :class:`Unsupported` or whatever the contender raises.
    """
    contender = contender or registry.get(impl).contender
    assert contender is not None
    if inputs is None:
        inputs = make_inputs(workload, seed=seed, requires_grad=workload.pass_ != "fwd")
    paged = inputs.paged  # the page pool is part of the inputs, built before set-up is timed
    watched = _input_versions(inputs, harness_gathers=paged is not None and not contender.reads_pages(workload))
    start = time.perf_counter()
    forward = own = contender.prepare(inputs, workload)  # own: the contender's callable, which says its choice
    if paged is not None and not contender.reads_pages(workload):  # the harness gathers, in the timed call
        forward = gathered(paged, inputs.k, inputs.v, forward)
    if workload.module == "mha":
        module = forward if contender.kind == "module" else wrap_core(forward, inputs)
        setup_ms = (time.perf_counter() - start) * 1e3
        first_call_ms, result = call_once_ms(module, workload.device)
        check = check_module_output(inputs, result)
        return Prepared(module, check, setup_ms, first_call_ms, choice=choice_of(own))
    fn: Callable[[], object] = _passes(inputs, forward)
    setup_ms = (time.perf_counter() - start) * 1e3
    first_call_ms, result = call_once_ms(fn, workload.device)  # compilation, autotuning, lazy init
    _check_inputs_kept(impl, watched)
    reference = contender.reference_output
    choice = choice_of(own)  # after the first call: a tile may be chosen there
    if workload.pass_ == "fwd":
        return Prepared(fn, check_output(inputs, result, reference), setup_ms, first_call_ms, choice=choice)
    with torch.no_grad():
        output = forward()
    grad_check = check_grads(inputs, result)
    return Prepared(fn, check_output(inputs, output, reference), setup_ms, first_call_ms, grad_check, choice)


def run_case(impl: str, workload: Workload, options: RunOptions) -> dict[str, Any]:
    """One (contender, workload) case to exactly one row, whatever happens inside it."""
    return run_group([impl], workload, options)[0]


ContenderStarts = Callable[[int], None]  # told the index (in the group) of the contender about to run


@dataclass
class _Ready:
    """A contender of the group that passed its checks and is warmed up, waiting to be timed."""

    prepared: Prepared
    predicted: dict[str, float]
    estimate_s: float
    cache_resident: bool = False  # its row's column; on CPU such a row also takes cold samples (caches flushed)


def _failure_row(impl: str, workload: Workload, exc: BaseException, predicted: dict[str, float]) -> dict[str, Any]:
    if isinstance(exc, Unsupported):
        return make_row(impl, workload, "unsupported", errors.one_line(str(exc)), **predicted)
    if workload.device == "cuda":
        torch.cuda.empty_cache()
    code = type(registry.get(impl).contender).__module__  # the reason names the line of its code that failed
    return make_row(impl, workload, "oom" if _is_oom(exc) else "error", errors.reason(exc, code=code), **predicted)


class _GroupMemory:
    """The inputs a group shares, and the free memory a case of the group could have.

    Every contender of a workload reads the same seeded tensors (make_inputs is deterministic), so they are
    made once, on first use, and held once: N contenders don't hold N copies. The group starts with the
    allocator's cache given back (the last workload's tensors), so the free memory it reads is a fresh
    process's; what a case may count as free is that, plus the memory this group freed into the cache since
    (its next allocations reuse it), plus the shared inputs its prediction counts again."""

    def __init__(self, workload: Workload, seed: int) -> None:
        self.workload, self.seed = workload, seed
        self._inputs: AttentionInputs | None = None
        release_cached_memory(workload.device)
        self._held_at_start = held_for_reuse_bytes(workload.device)

    def inputs(self) -> AttentionInputs:
        if self._inputs is None:
            w = self.workload
            self._inputs = make_inputs(w, seed=self.seed, requires_grad=w.pass_ != "fwd")
        return self._inputs

    def discard_inputs(self) -> None:
        """Make the inputs afresh on next use (make_inputs is deterministic): a contender wrote into them."""
        self._inputs = None

    def free_bytes(self) -> int:
        device = self.workload.device
        cached = max(0, held_for_reuse_bytes(device) - self._held_at_start)
        shared = input_bytes(self.workload) if self._inputs is not None else 0
        return free_memory_bytes(device) + cached + shared


def _get_ready(impl: str, workload: Workload, options: RunOptions, group: _GroupMemory) -> _Ready | dict[str, Any]:
    """Checks, prediction, prepare, correctness gate and warm-up; a row when the case ends here."""
    verdict = not_runnable(impl, workload)
    if verdict is not None:
        return make_row(impl, workload, *verdict)
    contender = registry.get(impl).contender
    assert contender is not None
    prediction = predict(contender, workload, options.ceilings.get(workload.device))
    predicted = {"predicted_ms": prediction.ms, "predicted_mem_mb": prediction.mem_mb}
    reason = skip_reason(prediction, options.case_budget_s, group.free_bytes())
    if reason is not None:
        return make_row(impl, workload, "skipped", reason, **predicted)
    try:
        prepared = prepare_checked(impl, workload, options.seed, group.inputs())
        estimate_s = warm_up(prepared.fn, workload.device, prepared.first_call_ms, options.budget_s)
        resident = _reads_from_cache(contender, workload, options)  # a plugin's flops() may raise too
    except Exception as exc:  # a contender may fail in any way; the sweep must go on
        if isinstance(exc, InputsModified):
            group.discard_inputs()  # the next contender gets them as made, not as this one left them
        return _failure_row(impl, workload, exc, predicted)
    return _Ready(prepared, predicted, estimate_s, resident)


def _reads_from_cache(contender: Contender, workload: Workload, options: RunOptions) -> bool:
    """Whether the contender's row will be ``cache_resident`` on this device's ceilings: bandwidth-bound, its
    bytes fitting in the cache in front of memory, so its warm samples read them from that cache."""
    ceilings = options.ceilings.get(workload.device)
    if ceilings is None:
        return False
    traffic = attention_bytes(workload)
    return ceilings.cache_resident(traffic, workload.compute_dtype, contender.flops(workload) / traffic)


def _time_group(
    ready: dict[int, _Ready], workload: Workload, options: RunOptions, progress: ContenderStarts | None
) -> dict[int, Timing | SampleError]:
    """All ready contenders in interleaved rounds: on CPU with the yardsticks and the stall check, and cold samples
    of the contenders whose rows will be cache_resident; on CUDA warm and cold samples alike (measure_cuda)."""
    on_sample = (lambda name: progress(int(name))) if progress is not None else None
    fns = {str(index): one.prepared.fn for index, one in ready.items()}
    if workload.device == "cuda":
        timed = time_cuda_rounds(fns, options.budget_s, options.seed, on_sample, graphs=workload.pass_ == "fwd")
        return {int(name): result for name, result in timed.items()}
    estimates = {str(index): one.estimate_s for index, one in ready.items()}
    sticks = yardsticks.for_threads(options.threads) if options.yardsticks else None
    cold = [str(index) for index, one in ready.items() if one.cache_resident]
    ceilings = options.ceilings.get(workload.device)
    flush = cache_flusher(ceilings.cache_bytes, options.threads) if cold and ceilings is not None else None
    for _attempt in range(2):  # a group timed while the machine stalled is timed once more
        results = time_cpu_rounds(
            fns,
            options.threads,
            options.budget_s,
            estimates,
            options.seed,
            on_sample,
            yardsticks=sticks.callables() if sticks else None,
            cold=cold,
            flush=flush,
        )
        stalled = {name: _stalled(sticks, timing) for name, timing in results.items()}
        if not any(stalled.values()):
            break
    for name, timing in results.items():
        if isinstance(timing, Timing) and stalled[name]:
            results[name] = dataclasses.replace(timing, stalled=stalled[name])
        elif isinstance(timing, Timing) and sticks is not None:
            sticks.saw(timing.yardsticks)
    return {int(name): result for name, result in results.items()}


WAITED_STALL = 0.1  # a case whose threads waited for a core this share of their time (median sample) or more


def waited_text(waited: float) -> str:
    """How long a timing's threads waited for a core, as every stall message says it."""
    return f"its threads waited for a core {waited:.0%} of their time (median sample; another process on its cores)"


def _stalled(sticks: yardsticks.Yardsticks | None, timing: Timing | SampleError) -> str | None:
    """Why ``timing`` was taken on a stalled machine, or None: its threads waited for a core
    (attnbench.measure._cpu_wait) ``WAITED_STALL`` of their time or more in its median sample, or its rounds' FMA
    yardstick collapsed (what the hypervisor takes from the whole VM shows only there)."""
    if isinstance(timing, SampleError):
        return None
    if timing.waited is not None and timing.waited >= WAITED_STALL:
        return f"the machine stalled while it was timed (twice): {waited_text(timing.waited)}; time kept, not ranked"
    return sticks.stalled(timing.yardstick_rounds) if sticks is not None else None


def run_group(
    impls: list[str], workload: Workload, options: RunOptions, progress: ContenderStarts | None = None
) -> list[dict[str, Any]]:
    """The contenders of one workload to one row each (in the order given), timed in interleaved rounds."""
    rows: dict[int, dict[str, Any]] = {}
    ready: dict[int, _Ready] = {}
    group = _GroupMemory(workload, options.seed)
    for index, impl in enumerate(impls):
        if progress is not None:
            progress(index)
        outcome = _get_ready(impl, workload, options, group)
        if isinstance(outcome, _Ready):
            ready[index] = outcome
        else:
            rows[index] = outcome
    timings = _time_group(ready, workload, options, progress) if ready else {}
    for index, one in ready.items():
        if progress is not None:
            progress(index)
        timing = timings[index]
        if isinstance(timing, SampleError):
            rows[index] = _failure_row(impls[index], workload, timing.cause, one.predicted)
            continue
        try:
            rows[index] = _finish_row(impls[index], workload, options, one, timing)
        except Exception as exc:
            rows[index] = _failure_row(impls[index], workload, exc, one.predicted)
    return [rows[index] for index in range(len(impls))]


def _finish_row(impl: str, workload: Workload, options: RunOptions, one: _Ready, timing: Timing) -> dict[str, Any]:
    """The memory pass and the row of a timed case."""
    prepared, predicted = one.prepared, one.predicted
    check, grad_check = prepared.check, prepared.grad_check
    contender = registry.get(impl).contender
    assert contender is not None
    flops, traffic = contender.flops(workload), attention_bytes(workload)
    # The memory pass re-runs the call under the profiler; leave it out where that alone would eat the budget.
    affordable = timing.median_ms * 1e-3 * MEMORY_PASS_COST <= options.case_budget_s / 2
    peak_mb = peak_memory_mb(prepared.fn, workload.device) if options.measure_memory and affordable else None
    metrics: dict[str, Any] = dict(
        median_ms=timing.median_ms,
        iqr_ms=timing.iqr_ms,
        n_samples=timing.n_samples,
        calls_per_sample=timing.calls_per_sample,
        samples_ms=timing.samples_ms,
        unstable=timing.unstable,
        timing_method=timing.method,
        cold_median_ms=timing.cold_median_ms,
        rounds=timing.rounds,
        host_overhead_us=timing.host_overhead_us,
        waited_pct=None if timing.waited is None else 100 * timing.waited,
        flops=flops,
        bytes=traffic,
        intensity=flops / traffic,
        tflops=flops / (timing.median_ms * 1e-3) / 1e12,
        gbps=traffic / (timing.median_ms * 1e-3) / 1e9,
        peak_mem_mb=peak_mb,
        **predicted,
        max_abs_err=check.max_abs_err,
        rms_err=check.rms_err,
        atol=check.atol,
        rtol=check.rtol,
        checked_rows=check.checked_rows,
        grad_err=grad_check.grad_err if grad_check else None,
        grad_tol=grad_check.grad_tol if grad_check else None,
        setup_ms=prepared.setup_ms,
        first_call_ms=prepared.first_call_ms,
        choice=prepared.choice or None,
        threads=options.threads,
        **{column: timing.yardsticks.get(name) for name, column in YARDSTICK_COLUMNS.items()},
        **{column: timing.gpu_state.get(column) for column in gpu_state.COLUMNS},
    )
    ceilings = options.ceilings.get(workload.device)
    dots = workload.compute_dtype  # an fp8 forward: the fp8 roofs (none on a CPU)
    roof = ceilings.roofline_tflops(dots, metrics["intensity"]) if ceilings else None
    metrics["pct_of_peak"] = 100 * metrics["tflops"] / roof if roof else None  # of the hardware roof
    matmul = ceilings.matmul_roofline_tflops(dots, metrics["intensity"]) if ceilings else None
    metrics["pct_of_matmul"] = 100 * metrics["tflops"] / matmul if matmul else None
    metrics["cache_resident"] = one.cache_resident if ceilings else None  # decided before timing (_get_ready)
    if not prepared.ok:
        return make_row(impl, workload, "incorrect", prepared.reason, **metrics)
    if timing.stalled:  # its time kept (the row says what it ran at), never ranked
        return make_row(impl, workload, "stalled", timing.stalled, **metrics)
    return make_row(impl, workload, "ok", prepared.reason, **metrics)
