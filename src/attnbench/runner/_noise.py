"""Environment warnings, pyperf-style: say when the machine is noisy or a result too thin to trust."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from attnbench.measure import _gpu_state as gpu_state
from attnbench.measure import _other_work as other_work
from attnbench.measure.stopwatch import MIN_TRUSTED, UNSTABLE_REL_IQR
from attnbench.workload import axes

MIN_TRUSTED_SAMPLES = MIN_TRUSTED


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _governor_warnings() -> list[str]:
    paths = Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")
    governors = sorted({g for g in map(_read, paths) if g and g != "performance"})
    warnings = [f"CPU frequency governor is {g!r}, not 'performance': timings drift" for g in governors]
    if _read(Path("/sys/devices/system/cpu/intel_pstate/no_turbo")) == "0":
        warnings.append("Turbo Boost is on: the clock, and so timings, depend on temperature and load")
    return warnings


def _other_work_warnings() -> list[str]:
    """Other work competing for the CPU, named with what it used; only work outside attnbench's own tree (this
    process's: see _other_work.py) counts."""
    seen = other_work.measure()
    warning = seen.warning() if seen is not None else None
    return [warning] if warning else []


def _interpreter_warnings() -> list[str]:
    """Under ``TRITON_INTERPRET=1`` every Triton kernel (fused_triton's, a plugin's) runs in Triton's Python
    interpreter: its output is checked as any contender's, but its time is the interpreter's, hundreds of times a
    compiled kernel's, and it would rank beside compiled contenders with nothing in the row to tell."""
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in {"1", "true", "on", "yes"}:
        return []
    return [
        "TRITON_INTERPRET is set: Triton kernels run in Triton's Python interpreter, so their rows check correctness "
        "but their times are the interpreter's, not a kernel's — time them on a GPU without it"
    ]


def environment_warnings() -> list[str]:
    """Warnings about the machine, taken just before a run starts."""
    return [*_governor_warnings(), *_interpreter_warnings(), *_other_work_warnings()]


def result_warnings(frame: pd.DataFrame) -> list[str]:
    """Warnings about the measurements themselves."""
    ok = frame[frame["status"] == "ok"]
    warnings = []
    stalled = frame[frame["status"] == "stalled"]
    if len(stalled):
        warnings.append(
            f"{len(stalled)} case(s) stalled (the machine stalled while they were timed, twice; their times are "
            "kept and not ranked: run them again on a quieter machine, or with --threads below the cores other work "
            "leaves free): " + ", ".join(sorted(set(stalled["impl"])))
        )
    unstable = ok[ok["unstable"].fillna(False).astype(bool)]
    if len(unstable):
        warnings.append(
            f"{len(unstable)} case(s) unstable (IQR ≥ {UNSTABLE_REL_IQR:.0%} of the median): "
            + ", ".join(sorted(set(unstable["impl"])))
        )
    over = _over_roof_warning(ok)
    if over:
        warnings.append(over)
    cached = above_memory_from_cache(ok)
    if len(cached):
        warnings.append(
            f"{len(cached)} memory-bound row(s) above 100 % of the bandwidth roof read bytes that fit in the cache in "
            "front of memory (cache_resident: a CPU's last level, a GPU's L2), so their GB/s and pct_of_peak are the "
            f"cache's, not memory's{_cold_range(cached)}; a larger batch or KV length measures memory: "
            + ", ".join(sorted(set(cached["impl"])))
        )
    cold = ok["cold_median_ms"].astype("float64") if "cold_median_ms" in ok else None
    colder = ok[cold < ok["median_ms"] - ok["iqr_ms"]] if cold is not None else ok[:0]
    if len(colder):
        warnings.append(
            f"{len(colder)} case(s) faster with the caches flushed than warm by more than the IQR (cold_median_ms), a "
            "timing defect or a clock that moved: " + ", ".join(sorted(set(colder["impl"])))
        )
    slowed = _slowed_gpu_warning(ok)
    if slowed:
        warnings.append(slowed)
    thin = ok[ok["n_samples"] < MIN_TRUSTED_SAMPLES]
    if len(thin):
        warnings.append(
            f"{len(thin)} case(s) with fewer than {MIN_TRUSTED_SAMPLES} samples, too short to trust "
            "(raise --budget-s): " + ", ".join(sorted(set(thin["impl"])))
        )
    return warnings


def _slowed_gpu_warning(ok: pd.DataFrame, named: int = 3) -> str | None:
    """GPU rows that ran throttled or under their maximum SM clock (attnbench.measure._gpu_state.slowed), counted, the
    first few named: their times hold for that clock, not the GPU's best."""
    if "throttle" not in ok:
        return None
    slowed = [(r, why) for r in ok.to_dict("records") if (why := gpu_state.slowed(r))]
    if not slowed:
        return None
    shown = "; ".join(f"{r['impl']} at {axes.case_label(r, device_first=True)}: {why}" for r, why in slowed[:named])
    more = f" (and {len(slowed) - named} more)" if len(slowed) > named else ""
    return (
        f"{len(slowed)} GPU case(s) ran throttled or below the maximum SM clock (columns sm_clock_mhz, throttle): "
        f"{shown}{more}"
    )


ROOF_PCT = 100.0  # no kernel runs faster than the hardware: a row above this % of the roof is a measurement defect


def _over(ok: pd.DataFrame) -> pd.Series:
    """Whether each row is above ``ROOF_PCT`` of the hardware roof (no where the column is missing)."""
    if "pct_of_peak" not in ok:
        return pd.Series(False, index=ok.index)
    return ok["pct_of_peak"].astype("float64") > ROOF_PCT


def read_from_cache(ok: pd.DataFrame) -> pd.Series:
    """Whether each row read its bytes from the cache in front of memory (a run written before ``cache_resident``
    existed: no)."""
    if "cache_resident" not in ok:
        return pd.Series(False, index=ok.index)
    return ok["cache_resident"].astype("boolean").fillna(False).astype(bool)


def cold_pct_of_peak(ok: pd.DataFrame) -> pd.Series:
    """Each row's ``pct_of_peak`` at its cold median (the caches flushed before each call), NaN where it has none."""
    if "cold_median_ms" not in ok or "pct_of_peak" not in ok:
        return pd.Series(float("nan"), index=ok.index)
    return ok["pct_of_peak"].astype("float64") * ok["median_ms"] / ok["cold_median_ms"].astype("float64")


def _cold_over(ok: pd.DataFrame) -> pd.Series:
    """Whether each row is above ``ROOF_PCT`` of the roof even at its cold median (no where it has none)."""
    return cold_pct_of_peak(ok).fillna(0.0) > ROOF_PCT


def above_roof(ok: pd.DataFrame) -> pd.DataFrame:
    """The rows above ``ROOF_PCT`` of the hardware roof that no cache explains (none where the column is
    missing): a bandwidth-bound row whose bytes fit in the cache in front of memory (``cache_resident``) may read
    them from there, above the memory roof, without a defect (:func:`above_memory_from_cache`) — unless its cold
    median, the caches flushed before each call, is above the roof too."""
    return ok[_over(ok) & (~read_from_cache(ok) | _cold_over(ok))]


def above_memory_from_cache(ok: pd.DataFrame) -> pd.DataFrame:
    """The bandwidth-bound rows above the memory roof whose bytes fit in the cache in front of it (and whose
    cold median, where they have one, is under the roof)."""
    return ok[_over(ok) & read_from_cache(ok) & ~_cold_over(ok)]


def _cold_range(rows: pd.DataFrame) -> str:
    """ ", at A–B % of the roof with the caches flushed (cold_median_ms)" over the rows that have a cold median."""
    cold = cold_pct_of_peak(rows).dropna()
    if cold.empty:
        return ""
    low, high = cold.min(), cold.max()
    span = f"{low:.0f} %" if round(low) == round(high) else f"{low:.0f}–{high:.0f} %"
    return f" (with the caches flushed before each call, cold_median_ms: {span} of the roof)"


def _over_roof_warning(ok: pd.DataFrame) -> str | None:
    """Rows above 100 % of the hardware roof: no kernel runs faster than the hardware, so the timing or the
    FLOP count of such a row is wrong. Each is named: contender, case, percentage."""
    over = above_roof(ok)
    if over.empty:
        return None
    rows = over.to_dict("records")
    named = [f"{r['impl']} at {axes.case_label(r, device_first=True)} ({r['pct_of_peak']:.0f} %)" for r in rows]
    return f"{len(over)} row(s) above 100 % of the hardware roof (pct_of_peak), a measurement defect: " + "; ".join(
        named
    )
