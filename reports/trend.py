"""Geometry of one trend panel: a case's median over runs, its noise band and its steps, one line per machine.

Numbers only — the template draws them as inline SVG (so every string in it is escaped by Jinja2).
x is either the commit (``commit``: commits evenly spaced in the order of their first run, every
machine's run of one commit at one x) or the run's start time (``date``: spaced by time). y is
logarithmic, so a step of one ratio looks the same size at any level; the band is median · exp(±√v)
with v the run's variance from ``reports.changes``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from attnbench.reports.changes import Point, SeriesChanges

WIDTH, HEIGHT = 620, 230
LEFT, RIGHT, TOP, BOTTOM = 58, 36, 14, 58
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


def commit_label(commit: Any, dirty: Any) -> str:
    text = str(commit)[:7] if isinstance(commit, str) and commit else "?"
    return text + ("*" if dirty is True else "")


def _fmt_ms(value: float) -> str:
    return f"{value:.3g}"


def _y_scale(values: list[float]) -> tuple[Any, list[dict[str, Any]]]:
    low, high = math.log(min(values)), math.log(max(values))
    if high - low < 0.1:  # a flat series still gets a readable axis (±5 %)
        middle = (low + high) / 2
        low, high = middle - 0.05, middle + 0.05
    pad = (high - low) * 0.08
    low, high = low - pad, high + pad
    span = HEIGHT - TOP - BOTTOM

    def y(value: float) -> float:
        return round(TOP + span * (high - math.log(value)) / (high - low), 1)

    return y, [{"y": y(t), "label": label} for t, label in nice_ticks(math.exp(low), math.exp(high))]


def nice_ticks(low: float, high: float) -> list[tuple[float, str]]:
    """Round values between ``low`` and ``high`` (> 0) and their labels, for a log axis: the powers of ten, or 1,
    2 and 5 of each decade, where three or more fall in the range; else 2–6 even steps of 1, 2, 2.5 or 5 times a
    power of ten (a narrow range on a log axis is near linear; the labels stay round, not 1.37)."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for mantissas in ((1,), (1, 2, 5)):
        ticks = [m * 10.0**k for k in decades for m in mantissas if low <= m * 10.0**k <= high]
        if len(ticks) >= 3:
            return [(t, f"{t:g}") for t in ticks]
    step = nice_step(high - low)
    first = math.ceil(low / step - 1e-9)
    ticks = [k * step for k in range(first, math.floor(high / step + 1e-9) + 1)]
    power = 10.0 ** math.floor(math.log10(step) + 1e-9)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if round(step / power, 6) == 2.5 else 0))
    return [(t, f"{t:.{decimals}f}") for t in ticks]


def nice_step(span: float, count: int = 5) -> float:
    """A round step — 1, 2, 2.5, 5 or 10 times a power of ten — for about ``count`` intervals across ``span``."""
    raw = span / count
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


SPREAD_SHARE = 0.6  # the runs of one commit take at most this share of its slot …
SPREAD_STEP_PX = 14.0  # … and at most this much apart


def _x_key(point: Point, mode: str) -> str:
    """What shares one x: in ``commit`` mode the commit (a dirty tree apart from the clean one); a run
    without a recorded commit, and every run in ``date`` mode, stands alone."""
    if mode == "commit" and point.commit:
        return commit_label(point.commit, point.dirty) + point.commit
    return point.run_id


def _x_positions(points: list[Point], mode: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """x of each run id and the axis ticks (at most 24 labels)."""
    span = WIDTH - LEFT - RIGHT
    first_seen: dict[str, tuple[pd.Timestamp, Point]] = {}
    for point in sorted(points, key=lambda p: (pd.Timestamp(p.started_at), p.run_id)):
        first_seen.setdefault(_x_key(point, mode), (pd.Timestamp(point.started_at), point))
    keys = list(first_seen)
    # each x key at the middle of a slot of its own (commit), or by time within the panel less half a slot each
    # side (date): the runs of the first and last commits spread both ways, not squashed against the edge
    slot = span / len(keys)
    if mode == "date" and len(keys) > 1:
        start, stop = first_seen[keys[0]][0], first_seen[keys[-1]][0]
        total = (stop - start).total_seconds() or 1.0
        inner = span - slot
        at = {
            key: LEFT + slot / 2 + inner * (stamp - start).total_seconds() / total
            for key, (stamp, _) in first_seen.items()
        }
    else:
        at = {key: LEFT + slot * (k + 0.5) for k, key in enumerate(keys)}
    xs = {p.run_id: round(at[_x_key(p, mode)], 1) for p in points}
    # Several runs of one commit: spread across part of its slot in time order, so they read as runs, not as one
    # x with a vertical line through it (and their noise band has a width).
    runs_of: dict[str, list[str]] = {}
    for point in sorted(points, key=lambda p: (pd.Timestamp(p.started_at), p.run_id)):
        ids = runs_of.setdefault(_x_key(point, mode), [])
        if point.run_id not in ids:
            ids.append(point.run_id)
    for key, ids in runs_of.items():
        if len(ids) > 1:
            width = min(slot * SPREAD_SHARE, SPREAD_STEP_PX * (len(ids) - 1))
            for k, run_id in enumerate(ids):
                x = at[key] - width / 2 + width * k / (len(ids) - 1)
                xs[run_id] = round(min(max(x, LEFT), LEFT + span), 1)
    every = max(1, math.ceil(len(keys) / 24))
    ticks = []
    for k, key in enumerate(keys):
        stamp, point = first_seen[key]
        label = commit_label(point.commit, point.dirty) if mode == "commit" else f"{stamp:%m-%d %H:%M}"
        if k % every == 0:
            ticks.append({"x": round(at[key], 1), "label": label})
    return xs, ticks


def panel(series: dict[str, SeriesChanges], colours: dict[str, str], mode: str) -> dict[str, Any]:
    """One panel: ``series`` maps machine → its changes; returns what the template's macro draws."""
    xs, x_ticks = _x_positions([p for changes in series.values() for p in changes.points], mode)
    values: list[float] = []
    for changes in series.values():
        for point, v in zip(changes.points, changes.variances, strict=True):
            values += [point.median_ms * math.exp(-math.sqrt(v)), point.median_ms * math.exp(math.sqrt(v))]
    y, y_ticks = _y_scale(values)
    lines = []
    for machine, changes in series.items():
        pts = []
        for k, (point, v) in enumerate(zip(changes.points, changes.variances, strict=True)):
            noise = math.sqrt(v)
            pts.append(
                {
                    "x": xs[point.run_id],
                    "y": y(point.median_ms),
                    "outlier": k in changes.outliers,
                    "title": f"{commit_label(point.commit, point.dirty)} · "
                    f"{pd.Timestamp(point.started_at):%Y-%m-%d %H:%M}"
                    f" · {_fmt_ms(point.median_ms)} ms ± {noise:.1%} ({point.noise_source}) · run {point.run_id}",
                }
            )
        upper = [
            (xs[p.run_id], y(p.median_ms * math.exp(math.sqrt(v))))
            for p, v in zip(changes.points, changes.variances, strict=True)
        ]
        lower = [
            (xs[p.run_id], y(p.median_ms * math.exp(-math.sqrt(v))))
            for p, v in zip(changes.points, changes.variances, strict=True)
        ]
        band = " ".join(f"{x},{yy}" for x, yy in [*upper, *reversed(lower)])
        steps = [
            {
                "x": round((xs[s.before.run_id] + xs[s.after.run_id]) / 2, 1),
                "label": f"{s.change_pct:+.1f}%",
                "direction": s.direction,
            }
            for s in changes.steps
        ]
        kept = [p for k, p in enumerate(pts) if not p["outlier"]]
        lines.append(
            {
                "machine": machine,
                "colour": colours[machine],
                "band": band,
                "points": pts,
                "steps": steps,
                "path": " ".join(f"{p['x']},{p['y']}" for p in kept),
            }
        )
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "top": TOP,
        "bottom": HEIGHT - BOTTOM,
        "y_ticks": y_ticks,
        "x_ticks": x_ticks,
        "lines": lines,
    }
