"""Who is fastest in a case, and whether the lead is beyond the noise the run measured.

A run's summary and its report name a fastest contender per case. On a noisy machine the two best may be
closer than their own samples can tell apart — on a shared 2-vCPU VM (an Intel Xeon), nothing else running,
one `nox -s bench` gave a median IQR of 21 % of the median over its 42 rows, and fused_cpu led sdpa_flash by 3 %
on one case, a lead that runs minutes later did not repeat (README: the quick run's sample). Naming a
winner there claims more than was measured, so the ranking says when the runner-up is within the noise:

- each row's median has a distribution-free 95 % confidence interval from its raw samples (``samples_ms``,
  order statistics, as the stop rule uses: ``stopwatch.median_ci``); the lead is clear when the fastest's
  interval ends below the runner-up's — two intervals apart, a conservative test. Under six samples there is
  no 95 % interval; the samples' range stands for it (it holds the median with probability 1 − 2^(1 − n):
  94 % at five; a case that slow in a short budget — naive's few calls — is then still ranked by where its
  samples lie, and the run's "too short to trust" warning names it). A row without samples ties with all;
- a row merged from ``--repeat`` processes also has one median per process: then every one of the fastest's
  must be below every one of the runner-up's too, since what changes between processes does not show in
  one process's samples.

Otherwise both are named: ``fused_cpu ≈ sdpa_flash`` — and every other contender within the noise of the
fastest too (a third with wide intervals can be, where the runner-up is not). Neither rule needs the rows'
samples to be paired, so rows of different runs rank the same way; a contender in a case twice (two runs
of one machine) comes pooled into one row (``pooled.py``: its process medians from every run; two contenders
pooled from the same runs are judged run by run, the lead clear where every run says so), and
:func:`fastest_rows` keeps a contender's faster row only where a caller did not pool. Only ``ok`` rows rank
(see ``summary.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from attnbench.measure.stopwatch import median_ci
from attnbench.reports.pooled import PER_RUN
from attnbench.runner._repeats import listed

TIE = "≈"
LEGEND = (
    f"{TIE}: within the noise of the fastest (their medians' 95 % confidence intervals overlap,"
    " or their repeats' medians interleave)"
)


@dataclass(frozen=True)
class Ranking:
    """The fastest row of a case, the runner-up, how much slower it is, and whether the lead is clear."""

    fastest: str
    runner_up: str | None = None
    margin: float | None = None  # runner-up median ÷ fastest median
    within: tuple[str, ...] = ()  # the others within the fastest's noise, fastest first

    @property
    def clear(self) -> bool:
        """Whether the fastest's lead over every other contender is beyond the noise."""
        return not self.within

    def label(self) -> str:
        """``fastest``, or ``fastest ≈ other ≈ …`` naming those within its noise."""
        return f" {TIE} ".join((self.fastest, *self.within))


def _interval(samples: list[float]) -> tuple[float, float]:
    """The 95 % interval of the median, else the samples' range (under six), else everything (none)."""
    if len(samples) >= 6:
        return median_ci(samples)
    return (min(samples), max(samples)) if samples else (-math.inf, math.inf)


def _per_run(row: Mapping[Any, Any]) -> dict[str, Mapping[Any, Any]]:
    """A pooled row's own rows by run (``pooled.PER_RUN``); {} for a row of one run."""
    found = row.get(PER_RUN)
    return {str(each["run"]): each for each in found} if isinstance(found, list) else {}


def beyond_noise(fastest: Mapping[Any, Any], other: Mapping[Any, Any]) -> bool:
    """Whether ``fastest`` (a row) is faster than ``other`` beyond both rows' noise (the module's rules). Two rows
    pooled from the same runs (``pooled.py``) are judged run by run, each run's rows by these rules, and the lead
    is clear only where every run says so: rows of one run were timed in the same interleaved rounds, and a
    machine's drift between runs (10 % moves both) would otherwise turn a lead every run shows into a tie."""
    mine, theirs = _per_run(fastest), _per_run(other)
    if mine and mine.keys() == theirs.keys():
        return all(beyond_noise(mine[run], theirs[run]) for run in mine)
    _, fastest_high = _interval(listed(fastest.get("samples_ms")))
    other_low, _ = _interval(listed(other.get("samples_ms")))
    if not fastest_high < other_low:
        return False
    repeats: Sequence[float] = listed(fastest.get("repeat_medians_ms"))
    others: Sequence[float] = listed(other.get("repeat_medians_ms"))
    if len(repeats) > 1 or len(others) > 1:
        return max(repeats or [fastest["median_ms"]]) < min(others or [other["median_ms"]])
    return True


def fastest_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One case's rows by median time, each contender once (its fastest row)."""
    return rows.sort_values("median_ms", kind="stable").drop_duplicates("impl")


def rank(rows: pd.DataFrame) -> Ranking:
    """The ranking of one case's ``ok`` rows (at least one) by median time."""
    best, *others = fastest_rows(rows).to_dict("records")
    if not others:
        return Ranking(best["impl"])
    margin = float(others[0]["median_ms"]) / float(best["median_ms"])
    within = tuple(row["impl"] for row in others if not beyond_noise(best, row))
    return Ranking(best["impl"], others[0]["impl"], margin, within)
