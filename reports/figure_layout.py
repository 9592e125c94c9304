"""Layout rules every report figure follows, and the check that they hold.

* **Panels** (:func:`panel_grid`): at most three per row, in a constrained layout, so titles, tick labels,
  axis labels, a right-hand second axis and colour bars get their room instead of running into the next
  panel; panel titles are wrapped to the panel's width (:func:`wrap_titles`).
* **Legends outside** (:func:`legend_right`): one legend for the figure, to the right of every panel; never
  over the data or an axis label.
* **Value axes** (:func:`value_axis`): times, rates and sizes are drawn on a log axis only when they span a
  factor of ``LOG_SPAN`` or more; otherwise on a linear axis from zero, so a 5 % spread is 5 % of the panel,
  not all of it. Every tick label is a plain decimal (``0.805``, ``2``, ``1024``), never ``8.05×10⁻¹``.
* **Tick labels that fit** (:func:`fit_ticks`, after drawing): x labels that touch are turned upright, then
  thinned; y labels that touch are thinned.

:func:`text_overlaps` measures every text's box on the drawn figure (titles, tick labels, axis labels, legend
entries, annotations) and lists the pairs that overlap, and any legend over an axes or a label: the report's
tests run it over every figure kind.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

LOG_SPAN = 3.0  # values spanning less than this factor are drawn on a linear axis from zero
STEPS_UP_TO = 2.5  # decades: a log axis up to this long is labelled at 1, 2 and 5 of each; a longer one at 1
TITLE_SIZE = 8
PANEL_SIZE = (4.4, 3.4)  # inches per panel
COLUMNS = 3
DPI = 110  # figures are laid out, checked and saved at this resolution
# one colour per verdict in every figure that shows them (compare.png, ab.png), as the report's status colours
VERDICT_COLOURS = {"faster": "#137333", "slower": "#b3261e", "same": "#777777", "unclear": "#e8a317"}
TICK_GAP_PX = 4.0  # tick labels closer than this are treated as touching


def plain(value: float, _position: Any = None) -> str:
    """A tick label as a plain decimal with three significant digits: 0.000805, 0.5, 2, 1024."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else ""
    if abs(value) >= 100:
        return f"{value:.0f}"
    return np.format_float_positional(value, precision=3, unique=True, fractional=False, trim="-")


def log_axis(axis: Any, which: str = "y") -> None:
    """A log axis labelled in plain decimals: 1-2-5 steps over at most ``STEPS_UP_TO`` decades, decades beyond."""
    (axis.set_yscale if which == "y" else axis.set_xscale)("log")
    _plain_log_ticks(axis.yaxis if which == "y" else axis.xaxis)


def _plain_log_ticks(ticks: Any) -> None:
    low, high = sorted(ticks.get_view_interval())
    decades = math.log10(high / low) if low > 0 else 9.0
    ticks.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= STEPS_UP_TO else (1.0,)))
    ticks.set_major_formatter(FuncFormatter(plain))
    ticks.set_minor_formatter(NullFormatter())


def plain_ticks(axis: Any) -> None:
    """Plain decimal labels on every numeric axis of ``axis`` and its second axes (``secondary_yaxis``),
    whatever scale they got; categorical labels are left alone."""
    for each in [axis, *getattr(axis, "child_axes", [])]:
        for ticks in (each.xaxis, each.yaxis):
            if each is not axis and ticks.get_scale() in ("log", "functionlog"):
                # a second axis (decode's % of bandwidth) took its parent's log scale with powers of ten alone: over
                # 12–200 % only "100" was labelled; it gets the 1-2-5 steps its parent's values have
                _plain_log_ticks(ticks)
                continue
            if isinstance(ticks.get_minor_formatter(), matplotlib.ticker.LogFormatter):
                # a log axis' minor labels (2×10¹ beside a plain 100); a second axis gets them back when its
                # parent turns log after it was made, so they are cleared here, once the panel is drawn
                ticks.set_minor_formatter(NullFormatter())
            formatter = ticks.get_major_formatter()
            if not isinstance(
                formatter, (matplotlib.ticker.ScalarFormatter, matplotlib.ticker.LogFormatter, FuncFormatter)
            ):
                continue
            if ticks.get_scale() == "log" and not isinstance(formatter, FuncFormatter):
                _plain_log_ticks(ticks)
            elif not isinstance(formatter, FuncFormatter):
                ticks.set_major_formatter(FuncFormatter(plain))


def _step_below(value: float) -> float:
    """The largest 1, 2 or 5 times a power of ten at or below ``value``: a log axis starting there has a labelled
    tick under its lowest point (the fastest contender sat below the lowest label) where it is labelled at 1, 2
    and 5 (:data:`STEPS_UP_TO`)."""
    power = 10.0 ** math.floor(math.log10(value))
    return max(m * power for m in (1, 2, 5) if m * power <= value * (1 + 1e-9))


def value_axis(
    axis: Any, values: Iterable[float], which: str = "y", extra: Iterable[float] = (), zero: bool = True
) -> None:
    """Log (plain labels) when ``values`` and ``extra`` (lines drawn, such as a roof) span ``LOG_SPAN`` or
    more, else linear — from zero (``zero``: times, rates, sizes) or padded by a tenth of the span each side
    (ratios) — so noise is drawn at its true size. Room is left above the largest for a line's label."""
    seen = np.asarray([v for v in [*values, *extra] if v is not None and np.isfinite(v) and v > 0], float)
    if seen.size == 0:
        return
    low, high = float(seen.min()), float(seen.max())
    limits = axis.set_ylim if which == "y" else axis.set_xlim
    if high / low >= LOG_SPAN:
        bottom, top = _step_below(low / 1.05), high * (2.0 if which == "y" else 1.3)
        if math.log10(top / bottom) > STEPS_UP_TO:  # labelled at powers of ten only: start at the one below
            bottom = 10.0 ** math.floor(math.log10(low / 1.05))
        limits(bottom, top)
        log_axis(axis, which)
        return
    pad = 0.1 * (high - low) or 0.05 * high
    limits((0.0, high * 1.2) if zero else (low - pad, high + pad))
    ticks = axis.yaxis if which == "y" else axis.xaxis
    ticks.set_major_locator(MaxNLocator(nbins=5))
    ticks.set_major_formatter(FuncFormatter(plain))


def panel_grid(count: int, size: tuple[float, float] = PANEL_SIZE) -> tuple[Any, list[Any]]:
    """A figure with ``count`` panels, up to ``COLUMNS`` a row, in a constrained layout; spare cells removed."""
    columns = max(1, min(COLUMNS, count))
    rows = -(-count // columns)
    figure, grid = plt.subplots(
        rows, columns, figsize=(size[0] * columns, size[1] * rows), squeeze=False, layout="constrained", dpi=DPI
    )
    axes = list(grid.flat)
    for spare in axes[count:]:
        spare.remove()
    return figure, axes[:count]


def legend_right(figure: Any, handles: list[Any], title: str) -> Any:
    """One legend for the figure, outside every panel on the right: the figure is widened by the legend's
    width, so the panels keep theirs (the constrained layout places it)."""
    legend = figure.legend(handles=handles, title=title, loc="outside right upper", frameon=False)
    width = legend.get_window_extent(figure.canvas.get_renderer()).width / figure.dpi  # its own size: no layout
    figure.set_size_inches(figure.get_figwidth() + width + 0.2, figure.get_figheight())
    return legend


def wrap_titles(figure: Any) -> None:
    """Wrap each panel title at spaces until it is no wider than its panel (the figure is drawn to measure)."""
    renderer = _renderer(figure)
    for axis in figure.axes:
        title = axis.title
        text = title.get_text().replace("\n", " ")
        if not text:
            continue
        width = axis.get_window_extent(renderer).width
        chars = len(text)
        while chars > 12:
            title.set_text("\n".join(textwrap.wrap(text, chars)))
            if title.get_window_extent(renderer).width <= width:
                break
            chars = int(chars * 0.85)


def fit_ticks(figure: Any) -> None:
    """After layout: x tick labels that touch are turned upright, then thinned; y labels that touch thinned
    (a few passes, one drawing each: a change moves the layout)."""
    for _ in range(4):
        renderer = _renderer(figure)
        sides = [(axis, which, _tick_labels(axis, which, renderer)) for axis in figure.axes for which in ("x", "y")]
        crowded = [side for side in sides if _any_overlap([box for _, box in side[2]], -TICK_GAP_PX)]
        if not crowded:
            return
        upright = [
            box.width
            for _, which, labels in crowded
            if which == "x" and labels[0][0].get_rotation() != 90
            for _, box in labels
        ]
        if upright:  # upright labels take their width in height: the figure grows by it, the panels keep theirs
            figure.set_size_inches(figure.get_figwidth(), figure.get_figheight() + max(upright) / figure.dpi)
        for axis, which, labels in crowded:
            ticks = axis.xaxis if which == "x" else axis.yaxis
            if which == "x" and labels[0][0].get_rotation() != 90:
                axis.tick_params(axis="x", labelrotation=90)
                for label in ticks.get_ticklabels():
                    label.set_horizontalalignment("center")
            elif isinstance(ticks.get_major_locator(), matplotlib.ticker.FixedLocator):
                _thin_fixed(ticks)
            else:
                ticks.set_major_locator(MaxNLocator(nbins=max(2, len(labels) // 2)))


def _thin_fixed(ticks: Any) -> None:
    """Keep every other label of a categorical axis (its ticks stay)."""
    labels = ticks.get_ticklabels()
    for index, label in enumerate(labels):
        if index % 2:
            label.set_visible(False)


def finish(figure: Any) -> Any:
    """Apply the text rules to a drawn figure: plain tick labels, titles wrapped, tick labels fitted."""
    if any(getattr(axis, "child_axes", []) for axis in figure.axes):
        figure.draw_without_rendering()  # a second axis takes its parent's scale (and resets its labels) when drawn
    for axis in figure.axes:
        plain_ticks(axis)
    wrap_titles(figure)
    fit_ticks(figure)
    return figure


# --- the check -------------------------------------------------------------------------------------------


def _renderer(figure: Any) -> Any:
    """Lay the figure out (constrained layout, ticks) without rasterising it; the renderer measures text."""
    figure.draw_without_rendering()
    return figure.canvas.get_renderer()


def _tick_labels(axis: Any, which: str, renderer: Any) -> list[tuple[Any, Any]]:
    """The tick labels drawn on one side of an axes (inside its view), with their boxes."""
    ticks = axis.xaxis if which == "x" else axis.yaxis
    low, high = sorted(ticks.get_view_interval())
    span = high - low
    found = []
    for tick in [*ticks.get_major_ticks(), *ticks.get_minor_ticks()]:
        location = tick.get_loc()
        if location is None or not low - 1e-9 * span <= location <= high + 1e-9 * span:
            continue
        for label in (tick.label1, tick.label2):
            if label.get_visible() and label.get_text().strip() and tick.get_visible():
                found.append((label, label.get_window_extent(renderer)))
    return found


def _overlap(a: Any, b: Any, slack: float = 0.5) -> bool:
    """Boxes share more than ``slack`` pixels each way (a negative slack: they come closer than that)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > slack and min(a.y1, b.y1) - max(a.y0, b.y0) > slack


def _any_overlap(boxes: list[Any], slack: float = 0.5) -> bool:
    return any(_overlap(a, b, slack) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def _all_axes(figure: Any) -> list[Any]:
    axes = []
    for axis in figure.axes:
        axes += [axis, *getattr(axis, "child_axes", [])]
    return [a for a in axes if a.get_visible()]


def text_boxes(figure: Any) -> list[tuple[str, Any]]:
    """(description, window box) of every visible, non-empty text in the figure: the suptitle and figure
    texts, each axes' titles, axis labels, tick labels and annotations, and each legend's entries."""
    renderer = _renderer(figure)
    texts: list[tuple[str, Any]] = [(f"figure text {t.get_text()!r}", t) for t in figure.texts]
    if figure._suptitle is not None:
        texts.append((f"suptitle {figure._suptitle.get_text()!r}", figure._suptitle))
    legends = list(figure.legends)
    for number, axis in enumerate(_all_axes(figure)):
        name = f"axes {number}"
        for title in (axis.title, axis._left_title, axis._right_title):
            texts.append((f"{name} title {title.get_text()!r}", title))
        texts.append((f"{name} x label {axis.xaxis.label.get_text()!r}", axis.xaxis.label))
        texts.append((f"{name} y label {axis.yaxis.label.get_text()!r}", axis.yaxis.label))
        texts += [(f"{name} annotation {t.get_text()!r}", t) for t in axis.texts]
        for which in ("x", "y"):
            boxes = _tick_labels(axis, which, renderer)
            texts += [(f"{name} {which} tick {label.get_text()!r}", label) for label, _ in boxes]
        if axis.get_legend() is not None:
            legends.append(axis.get_legend())
    for number, legend in enumerate(legends):
        entries = [legend.get_title(), *legend.get_texts()]
        texts += [(f"legend {number} entry {t.get_text()!r}", t) for t in entries]
    shown = [(name, text) for name, text in texts if text.get_visible() and text.get_text().strip()]
    return [(name, text.get_window_extent(renderer)) for name, text in shown]


def text_overlaps(figure: Any) -> list[str]:
    """Every pair of overlapping text boxes, and every legend over an axes or over text outside it; empty
    when the figure follows the rules."""
    boxes = text_boxes(figure)
    problems = [
        f"{a} overlaps {b}"
        for i, (a, box_a) in enumerate(boxes)
        for b, box_b in boxes[i + 1 :]
        if _overlap(box_a, box_b)
    ]
    renderer = figure.canvas.get_renderer()
    legends = list(figure.legends) + [a.get_legend() for a in _all_axes(figure) if a.get_legend() is not None]
    for number, legend in enumerate(legends):
        frame = legend.get_window_extent(renderer)
        for index, axis in enumerate(_all_axes(figure)):
            if _overlap(frame, axis.get_window_extent(renderer)):
                problems.append(f"legend {number} lies over axes {index}")
        problems += [
            f"legend {number} covers {name}"
            for name, box in boxes
            if not name.startswith(f"legend {number} ") and _overlap(frame, box)
        ]
    return problems
