"""Memory bandwidth measured during the run, beside the cached roof that ``pct_of_peak`` divides by.

The CPU bandwidth roof (_ceilings.py) is measured once and cached, but a shared machine's bandwidth is not
a constant: on a shared VM the STREAM triad measured 33–83 GB/s within minutes, so a decode row's
``% of bandwidth`` swung between 49 % and over 100 % with no change in the kernel. So every run with CPU
cases measures the bandwidth again, right before the sweep and right after it, with the roof's own kernels
(_hardware.py: the read stream and the triad, the same arrays in one allocation, the best of ``WATCH_PASSES``
passes after a warm-up, on the run's threads and on one: a fraction of the roof's 20 passes), and keeps it in
meta.json:

- ``bandwidth_during_run``: one entry per measurement, ``{device, when, time, read_gbps, triad_gbps,
  passes}`` (``when``: ``before`` / ``after`` the sweep, ``before (resumed)`` for each ``--resume``);
- ``bandwidth_spread``: per stream the relative spread of those measurements (max ÷ min − 1), the floor,
  and ``moved``: whether either spread is above it (or ``note`` saying why nothing was measured).

``pct_of_peak`` keeps dividing by the cached roof: the run's figures stay comparable with other runs, and
the spread says how far to trust them. When the bandwidth moved more than ``MOVED_FLOOR`` during the run a
warning names the streams, their ranges and the roof (stderr and meta.json ``warnings``).

Why a fixed 10 % floor: a roof that moved less changes a memory-bound row's % of bandwidth by less than a
tenth of itself, inside the spread one case shows between runs on a shared machine anyway (3–26 % measured
between runs on the 2-core VM, see DESIGN), so it would not change what a reader concludes. A floor taken
from back-to-back measurements would cost another measurement each run and, on a busy machine, grow with
the very movement it is meant to flag.

GPU runs are not watched (their roof is the datasheet's). ``ATTNBENCH_BANDWIDTH_WATCH=off`` skips the
measurements (the test suite does, for its hundred tiny runs); meta.json then says so.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from typing import Any

from attnbench.measure import _hardware as hardware
from attnbench.measure._ceilings import Ceilings
from attnbench.measure.native_build import BuildError

WATCH_PASSES = 3  # best of 3 passes (after a warm-up): short, and still the roof's method
MOVED_FLOOR = 0.10
SWITCH = "ATTNBENCH_BANDWIDTH_WATCH"
STREAMS = {"read_gbps": "read stream", "triad_gbps": "triad"}

Measure = Callable[[int], dict[str, float]]  # threads -> {"read_gbps": …, "triad_gbps": …}


def measure_streams(threads: int) -> dict[str, float]:
    """The read stream's and the triad's GB/s now, the roof's kernels and arrays, ``WATCH_PASSES`` passes."""
    (triad, _), (read, _) = hardware.streams_gbps(threads, passes=WATCH_PASSES)
    return {"read_gbps": read, "triad_gbps": triad}


def spread(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stream the relative spread (max ÷ min − 1) of the measurements, the floor, and whether it moved."""
    found: dict[str, Any] = {}
    for stream in STREAMS:
        values = [e[stream] for e in entries if (e.get(stream) or 0) > 0]
        if values:
            found[stream] = max(values) / min(values) - 1
    moved = any(found.get(stream, 0) > MOVED_FLOOR for stream in STREAMS)
    return {**found, "floor": MOVED_FLOOR, "measurements": len(entries), "moved": moved}


def moved_warning(entries: list[dict[str, Any]], roof_gbps: float | None) -> str | None:
    """One line when the bandwidth moved more than the floor during the run: each stream's range, the roof."""
    found = spread(entries)
    if not found["moved"]:
        return None
    ranges = []
    for stream, label in STREAMS.items():
        values = [e[stream] for e in entries if (e.get(stream) or 0) > 0]
        if values:
            ranges.append(f"{label} {min(values):.3g}–{max(values):.3g} GB/s ({found[stream]:+.0%})")
    whens = ", ".join(e["when"] for e in entries)
    roof = f"the cached roof pct_of_peak divides by is {roof_gbps:.3g} GB/s, so " if roof_gbps else ""
    return (
        f"memory bandwidth moved during the run: {', '.join(ranges)} over {len(entries)} measurements "
        f"({whens}), more than the {MOVED_FLOOR:.0%} floor; {roof}memory-bound rows' pct_of_peak moved "
        "with the machine, not only the kernel"
    )


def stale_roof_warning(entries: list[dict[str, Any]], roof_gbps: float | None) -> str | None:
    """One line when every measurement of the run lies above the cached roof by more than the floor: the roof
    was measured on a slower moment of a shared machine (it is the best of its passes, so a run should not beat
    it), and memory-bound rows may pass 100 % of it; the flag that measures it again."""
    best = [max(e.get(stream) or 0 for stream in STREAMS) for e in entries]
    if not roof_gbps or not best or min(best) <= roof_gbps * (1 + MOVED_FLOOR):
        return None
    return (
        f"every bandwidth measurement of this run ({min(best):.3g}–{max(best):.3g} GB/s) is above the cached roof "
        f"pct_of_peak divides by ({roof_gbps:.3g} GB/s, measured on a slower moment): memory-bound rows may pass "
        "100 % of it; `attnbench run --remeasure-ceilings` measures the ceilings again"
    )


class BandwidthWatch:
    """Measures before the sweep when made, after it in :meth:`after`; keeps both in ``meta``."""

    def __init__(
        self, meta: dict[str, Any], ceilings: dict[str, Ceilings], threads: int, measure: Measure | None = None
    ) -> None:
        self.meta, self.threads, self.measure = meta, threads, measure or measure_streams
        cpu = ceilings.get("cpu")
        self.roof_gbps = cpu.roof_gbps if cpu is not None else None
        self.entries: list[dict[str, Any]] = meta.setdefault("bandwidth_during_run", [])
        self.skip = self._skip_reason(cpu)
        if self.skip and not self.entries:  # a resumed run keeps what its first session measured
            meta["bandwidth_spread"] = {"note": f"not measured: {self.skip}"}
        elif not self.skip:
            self._take("before (resumed)" if self.entries else "before")

    @staticmethod
    def _skip_reason(cpu: Ceilings | None) -> str | None:
        if os.environ.get(SWITCH, "").strip().lower() in ("off", "0", "no", "false"):
            return f"{SWITCH}={os.environ[SWITCH]}"
        if cpu is None:
            return "no CPU cases (a GPU's roof is its datasheet's)"
        return None

    def _take(self, when: str) -> None:
        try:
            rates = self.measure(self.threads)
        except (BuildError, OSError, RuntimeError) as exc:
            self.skip = f"the stream kernels could not run ({exc})"
            self.meta["bandwidth_spread"] = {"note": f"not measured: {self.skip}"}
            return
        now = dt.datetime.now().astimezone().isoformat(timespec="seconds")
        self.entries.append({"device": "cpu", "when": when, "time": now, **rates, "passes": WATCH_PASSES})
        self.meta["bandwidth_spread"] = spread(self.entries)

    def after(self, interrupted: bool) -> list[str]:
        """Measure after the sweep (not after an interrupt: the user asked to stop); the warning, if it moved."""
        if self.skip:
            return []
        if not interrupted:
            self._take("after")
        warnings = [moved_warning(self.entries, self.roof_gbps), stale_roof_warning(self.entries, self.roof_gbps)]
        return [warning for warning in warnings if warning]
