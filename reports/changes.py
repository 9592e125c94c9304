"""Change detection: steps in one case's times across runs, weighed by each run's measured noise.

Definitions first:

* **series** — one case (``attnbench.runner.results.CASE_COLUMNS``) on one machine: its ``ok`` runs in order of
  start time, y_i = ln(median_ms of run i). Working in logs makes every size relative.
* **run noise** σ_i, on the log scale: with ``repeat_medians_ms`` (k ≥ 2 medians from separate worker
  processes) the standard error of their mean log, sd/√k — source ``repeats``; otherwise the run's own
  spread, IQR / median / 1.349 (``iqr_ms``, else from ``samples_ms``) — source ``samples``. The latter is
  not divided by √n: samples of one process on a shared machine are not independent (load comes in
  spells), and a run that ran under load shows a wide spread, so it weighs little.
* **series noise** τ: the scatter between runs that σ_i does not explain, from successive differences Δ:
  the larger of (1.4826 · median |Δ|)² / 2 and the mean of Δ² without its two largest, / 2 — less the
  median σ_i². A step moves one difference and a lone outlier run two, so neither sees them; a contender
  whose runs land in one of two modes (sdpa_flash on a 2-core VM: 1.85–1.88 or 2.22–2.30 ms, in an A/A
  series alike) moves many, which the median can miss and the mean does not: in 200 simulated 10-run A/A
  series of such modes (1 % within-run spread) the median alone called a step in 77, this in 17; a +25 %
  step among runs 3 % apart is found in 199 of 200 either way (tests/test_new_user_4.py). Run i has
  variance v_i = σ_i² + τ².
* **outlier** — a run, not the newest, that differs significantly and in the same direction from the
  (up to) two runs on each side while those agree with each other; the first run counts when it differs
  from the next two and they agree. Outliers are shown, never used: one run is not a level.
* **candidate steps** — PELT (``ruptures``) on the remaining y with the Gaussian cost
  Σ (y_i − ȳ)² / v_i of each segment (ȳ its weighted mean) and penalty 2 ln n (BIC: a step adds a mean
  and a position).
* **accepted step** — between adjacent segments with weighted means m₁, m₂, each with the variance
  max(1/Σ(1/v_i), observed weighted scatter / n): Welch's t = (m₂ − m₁) / √(var₁ + var₂) with
  Satterthwaite's degrees of freedom, p its two-sided p-value; accepted when p < ``alpha`` and
  |m₂ − m₁| ≥ the practical floor max(ln(1 + ``min_change``), median √v_i) — never smaller than the
  measured noise, and when it does not leave a single run alone between two steps (one run is not a level:
  the weaker of its two steps fails). A failing step is merged away (least significant first) and the rest
  tested again.
* A step's **size** is ratio = exp(m₂ − m₁) (> 1: slower), its **confidence** 1 − p, its **commit range**
  the last run before it and the first after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import ruptures as rpt
from ruptures.base import BaseCost
from scipy.stats import norm
from scipy.stats import t as student_t

ALPHA = 0.001
MIN_CHANGE = 0.05


@dataclass(frozen=True)
class Point:
    """One run of a series."""

    run_id: str
    commit: str | None
    dirty: bool | None
    started_at: Any
    median_ms: float
    sigma: float  # run noise on the log scale; nan when the run recorded none
    noise_source: str  # repeats, samples or none


@dataclass(frozen=True)
class Step:
    """An accepted step: ``index`` is the position (in the series' points) of the first run after it."""

    index: int
    before: Point
    after: Point
    ratio: float
    p_value: float
    n_before: int
    n_after: int
    median_before_ms: float
    median_after_ms: float
    outliers_before: int = 0  # runs of the level before the step set aside as outliers (shown, never used)
    outliers_after: int = 0

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1) * 100

    @property
    def direction(self) -> str:
        return "slower" if self.ratio > 1 else "faster"

    @property
    def confidence(self) -> float:
        return 1 - self.p_value


@dataclass
class SeriesChanges:
    """The verdict on one series: its steps, outliers and the noise it was weighed by."""

    points: list[Point]
    steps: list[Step] = field(default_factory=list)
    outliers: list[int] = field(default_factory=list)
    variances: list[float] = field(default_factory=list)
    tau: float = 0.0
    floor: float = 0.0

    @property
    def noise_source(self) -> str:
        sources = {p.noise_source for p in self.points} - {"none"}
        return sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")

    def newest_step(self) -> Step | None:
        return self.steps[-1] if self.steps else None


def _finite_positive(values: Any) -> list[float]:
    """The finite, positive numbers of a list-like value; [] for a missing value (None, NaN, NA)."""
    if values is None or isinstance(values, str | float | int):
        return []
    try:
        numbers = [float(v) for v in values if v is not None]
    except TypeError:  # pandas NA and other scalars that are not lists
        return []
    return [v for v in numbers if math.isfinite(v) and v > 0]


def run_noise(median_ms: float, iqr_ms: Any, samples_ms: Any, repeat_medians_ms: Any) -> tuple[float, str]:
    """σ on the log scale and where it came from (see the module docstring)."""
    repeats = _finite_positive(repeat_medians_ms)
    if len(repeats) >= 2:
        return float(np.std(np.log(repeats), ddof=1) / math.sqrt(len(repeats))), "repeats"
    if iqr_ms is not None and not pd_isna(iqr_ms) and median_ms > 0:
        return float(iqr_ms) / median_ms / 1.349, "samples"
    samples = _finite_positive(samples_ms)
    if len(samples) >= 2 and median_ms > 0:
        q1, q3 = np.percentile(samples, [25, 75])
        return float(q3 - q1) / median_ms / 1.349, "samples"
    return math.nan, "none"


def pd_isna(value: Any) -> bool:
    try:
        return bool(value != value)  # NaN, pandas NA
    except (TypeError, ValueError):
        return True


class _WeightedNormal(BaseCost):
    """Σ w_i (y_i − ȳ_w)² over a segment, from cumulative sums; signal columns are (y, w)."""

    model = "weighted_normal"
    min_size = 1

    def fit(self, signal: np.ndarray) -> _WeightedNormal:
        self.signal = signal
        y, w = signal[:, 0], signal[:, 1]
        self.w = np.concatenate([[0.0], np.cumsum(w)])
        self.wy = np.concatenate([[0.0], np.cumsum(w * y)])
        self.wyy = np.concatenate([[0.0], np.cumsum(w * y * y)])
        return self

    def error(self, start: int, end: int) -> float:
        sw = self.w[end] - self.w[start]
        swy = self.wy[end] - self.wy[start]
        return float(self.wyy[end] - self.wyy[start] - swy * swy / sw)


def _mean(y: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    """Weighted mean and its variance."""
    w = 1 / v
    return float((w * y).sum() / w.sum()), float(1 / w.sum())


def _z(a: tuple[float, float], b: tuple[float, float]) -> float:
    return (b[0] - a[0]) / math.sqrt(a[1] + b[1])


def _tau(y: np.ndarray, sigma2: np.ndarray, trim: int = 0) -> float:
    """The between-run scatter σ_i does not explain, from the successive differences Δ: the robust estimate
    (1.4826 · median |Δ|)² / 2, or with ``trim`` the larger of it and the mean of Δ² without its ``trim``
    largest, / 2 (see the module docstring)."""
    if len(y) < 3:
        return 0.0
    diffs = np.abs(np.diff(y))
    scatter = (1.4826 * float(np.median(diffs))) ** 2 / 2
    if trim and len(diffs) > trim:
        scatter = max(scatter, float(np.mean(np.sort(diffs)[:-trim] ** 2)) / 2)
    return math.sqrt(max(0.0, scatter - float(np.median(sigma2))))


def _outliers(y: np.ndarray, v: np.ndarray, z_crit: float) -> list[int]:
    found: list[int] = []
    n = len(y)
    for i in range(n - 1):  # never the newest run
        left = [j for j in (i - 2, i - 1) if j >= 0 and j not in found]
        right = [j for j in (i + 1, i + 2) if j < n]
        if not right:
            continue
        here = (float(y[i]), float(v[i]))
        z_right = _z(_mean(y[right], v[right]), here)
        if left:
            z_left = _z(_mean(y[left], v[left]), here)
            sides_agree = abs(_z(_mean(y[left], v[left]), _mean(y[right], v[right]))) < z_crit
            if sides_agree and z_left * z_right > 0 and min(abs(z_left), abs(z_right)) > z_crit:
                found.append(i)
        elif len(right) == 2 and abs(z_right) > z_crit:  # the first run: an outlier when the next two agree
            found += [i] if abs(_z((y[right[0]], v[right[0]]), (y[right[1]], v[right[1]]))) < z_crit else []
    return found


def _segment(y: np.ndarray, v: np.ndarray, model_df: float) -> tuple[float, float, float]:
    """Weighted mean, the variance of that mean and its degrees of freedom: the larger of the modelled
    variance 1/Σw and the observed scatter s²/n (weighted), so a segment whose runs disagree more than
    their noise says is not trusted beyond what they show."""
    mean, model = _mean(y, v)
    if len(y) < 2:
        return mean, model, model_df
    w = 1 / v
    scatter = float((w * (y - mean) ** 2).sum() / w.sum()) / (len(y) - 1)
    return (mean, model, model_df) if model >= scatter else (mean, scatter, len(y) - 1)


def _test(y: np.ndarray, v: np.ndarray, bounds: Sequence[int]) -> list[tuple[float, float, float, float]]:
    """For each inner boundary: (p-value, step on the log scale, mean before, mean after). Welch's t on
    the segments' weighted means, Satterthwaite's degrees of freedom; a modelled variance counts with the
    degrees of freedom of the whole series' noise estimate (n − 1)."""
    edges = [0, *bounds, len(y)]
    segments = [_segment(y[a:b], v[a:b], max(1, len(y) - 1)) for a, b in pairwise(edges)]
    out = []
    for (m1, var1, df1), (m2, var2, df2) in pairwise(segments):
        df = (var1 + var2) ** 2 / (var1**2 / df1 + var2**2 / df2)
        t = (m2 - m1) / math.sqrt(var1 + var2)
        out.append((float(2 * student_t.sf(abs(t), df)), m2 - m1, m1, m2))
    return out


def detect(points: list[Point], alpha: float = ALPHA, min_change: float = MIN_CHANGE) -> SeriesChanges:
    """Steps in one series (points in time order); see the module docstring for every rule."""
    result = SeriesChanges(points=points)
    n = len(points)
    if n == 0:
        return result
    y_all = np.log([p.median_ms for p in points])
    sigma = np.array([p.sigma for p in points], dtype=float)
    known = sigma[np.isfinite(sigma)]
    sigma = np.where(np.isfinite(sigma), sigma, float(np.median(known)) if len(known) else 0.0)
    tau = _tau(y_all, sigma**2, trim=2)  # a step moves one difference, a lone outlier run two
    v_all = np.maximum(sigma**2 + tau**2, 1e-8)  # a run that recorded no spread still has some noise
    result.tau, result.variances = tau, v_all.tolist()
    result.floor = max(math.log1p(min_change), float(np.median(np.sqrt(v_all))))
    z_crit = float(norm.isf(alpha / 2))
    result.outliers = _outliers(y_all, v_all, z_crit)
    kept = [i for i in range(n) if i not in result.outliers]
    y, v = y_all[kept], v_all[kept]
    if len(kept) < 2:
        return result
    algo = rpt.Pelt(custom_cost=_WeightedNormal(), min_size=1, jump=1)
    bounds = algo.fit(np.column_stack([y, 1 / v])).predict(pen=2 * math.log(len(y)))[:-1]
    while bounds:
        tests = _test(y, v, bounds)
        failing = [(p, -abs(d), k) for k, (p, d, _, _) in enumerate(tests) if p >= alpha or abs(d) < result.floor]
        edges = [0, *bounds, len(y)]
        for k in range(1, len(bounds)):  # one run between two steps is not a level: drop the weaker step
            if edges[k + 1] - edges[k] == 1:
                weaker = min((k - 1, k), key=lambda b: (abs(tests[b][1]), -tests[b][0]))
                failing.append((tests[weaker][0], -abs(tests[weaker][1]), weaker))
        if not failing:
            break
        bounds.pop(max(failing)[2])
    edges = [0, *bounds, len(y)]
    for k, (p, _, before, after) in enumerate(_test(y, v, bounds)):
        start, cut, end = edges[k], edges[k + 1], edges[k + 2]
        first = 0 if start == 0 else kept[start]  # a level's span in the whole series, outliers included
        last = n if end == len(kept) else kept[end]
        result.steps.append(
            Step(
                index=kept[cut],
                before=points[kept[cut - 1]],
                after=points[kept[cut]],
                ratio=math.exp(after - before),
                p_value=p,
                n_before=cut - start,
                n_after=end - cut,
                median_before_ms=math.exp(before),
                median_after_ms=math.exp(after),
                outliers_before=sum(first <= i < kept[cut] for i in result.outliers),
                outliers_after=sum(kept[cut] <= i < last for i in result.outliers),
            )
        )
    return result
