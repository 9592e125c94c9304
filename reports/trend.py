"""Geometry of one trend panel: a case's median over runs, its noise band and its steps, one line per machine.

Numbers only — the template draws them as inline SVG (so every string in it is escaped by Jinja2).
x is either the run's position in time order (``commit``: evenly spaced, labelled by commit) or its
start time (``date``: spaced by time). y is logarithmic, so a step of one ratio looks the same size at
any time scale; the band is median · exp(±√v) with v the run's variance from ``reports.changes``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from attnbench.reports.changes import SeriesChanges

WIDTH, HEIGHT = 620, 230
LEFT, RIGHT, TOP, BOTTOM = 58, 12, 12, 58
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
X_MODES = ("commit", "date")


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

    ticks = [math.exp(low + (high - low) * k / 4) for k in range(5)]
    return y, [{"y": y(t), "label": _fmt_ms(t)} for t in ticks]


def _x_positions(order: list[tuple[Any, str]], mode: str) -> dict[str, float]:
    """x of each run id; ``order`` is (started_at, run_id) of every run in the panel, sorted."""
    span = WIDTH - LEFT - RIGHT
    if len(order) == 1:
        return {order[0][1]: LEFT + span / 2}
    if mode == "date":
        first, last = pd.Timestamp(order[0][0]), pd.Timestamp(order[-1][0])
        total = (last - first).total_seconds() or 1.0
        return {rid: round(LEFT + span * (pd.Timestamp(t) - first).total_seconds() / total, 1) for t, rid in order}
    return {rid: round(LEFT + span * k / (len(order) - 1), 1) for k, (_, rid) in enumerate(order)}


def _x_ticks(order: list[tuple[Any, str]], xs: dict[str, float], labels: dict[str, str]) -> list[dict[str, Any]]:
    every = max(1, math.ceil(len(order) / 24))
    return [{"x": xs[rid], "label": labels[rid]} for k, (_, rid) in enumerate(order) if k % every == 0]


def panel(series: dict[str, SeriesChanges], colours: dict[str, str], mode: str) -> dict[str, Any]:
    """One panel: ``series`` maps machine → its changes; returns what the template's macro draws."""
    runs: dict[str, tuple[Any, str]] = {}
    for changes in series.values():
        for point in changes.points:
            runs[point.run_id] = (point.started_at, point.run_id)
    order = sorted(runs.values(), key=lambda item: (pd.Timestamp(item[0]), item[1]))
    xs = _x_positions(order, mode)
    labels: dict[str, str] = {}
    values: list[float] = []
    for changes in series.values():
        for point, v in zip(changes.points, changes.variances, strict=True):
            stamp = pd.Timestamp(point.started_at)
            labels[point.run_id] = (
                commit_label(point.commit, point.dirty) if mode == "commit" else stamp.strftime("%m-%d %H:%M")
            )
            values += [point.median_ms * math.exp(-math.sqrt(v)), point.median_ms * math.exp(math.sqrt(v))]
    y, y_ticks = _y_scale(values)
    lines = []
    for machine, changes in series.items():
        pts = []
        for k, (point, v) in enumerate(zip(changes.points, changes.variances, strict=True)):
            noise = math.sqrt(v)
            pts.append({
                "x": xs[point.run_id], "y": y(point.median_ms), "outlier": k in changes.outliers,
                "title": f"{commit_label(point.commit, point.dirty)} · {pd.Timestamp(point.started_at):%Y-%m-%d %H:%M}"
                         f" · {_fmt_ms(point.median_ms)} ms ± {noise:.1%} ({point.noise_source}) · run {point.run_id}",
            })  # fmt: skip
        upper = [(xs[p.run_id], y(p.median_ms * math.exp(math.sqrt(v)))) for p, v in zip(changes.points,
                 changes.variances, strict=True)]  # fmt: skip
        lower = [(xs[p.run_id], y(p.median_ms * math.exp(-math.sqrt(v)))) for p, v in zip(changes.points,
                 changes.variances, strict=True)]  # fmt: skip
        band = " ".join(f"{x},{yy}" for x, yy in [*upper, *reversed(lower)])
        steps = [{
            "x": round((xs[s.before.run_id] + xs[s.after.run_id]) / 2, 1),
            "label": f"{s.change_pct:+.1f}%", "direction": s.direction,
        } for s in changes.steps]  # fmt: skip
        kept = [p for k, p in enumerate(pts) if not p["outlier"]]
        lines.append({
            "machine": machine, "colour": colours[machine], "band": band, "points": pts, "steps": steps,
            "path": " ".join(f"{p['x']},{p['y']}" for p in kept),
        })  # fmt: skip
    return {
        "width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
        "bottom": HEIGHT - BOTTOM, "y_ticks": y_ticks, "x_ticks": _x_ticks(order, xs, labels), "lines": lines,
    }  # fmt: skip
