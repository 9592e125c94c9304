"""The report's figures, drawn with seaborn: one colour per contender across every figure, log axes
where sizes double, a panel per workload group and machine (``facets.py``: what varies in a group goes on
x — sequence length, key length, heads, head_dim or batch — and a group run at one size is drawn as
points by contender). Layout — panels, legends outside, value axes, tick labels — follows
``figure_layout.py``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from attnbench.contenders.registry import declared_names
from attnbench.reports.facets import AXIS_LABELS, Facet, facets
from attnbench.reports.figure_layout import DPI, TITLE_SIZE, finish, legend_right, panel_grid, plain, value_axis
from attnbench.reports.frames import CASE_KEY, group_label, labels, phase_of
from attnbench.reports.pooled import pool_runs
from attnbench.runner._noise import read_from_cache

TORCH_CONTENDERS = {
    "naive",
    "bmm",
    "einsum",
    "sdpa_math",
    "sdpa_flash",
    "sdpa_efficient",
    "sdpa_cudnn",
    "flex",
}


def _fixed_order(impls: list[str]) -> list[str]:
    """Every contender declared on this machine (built-ins and installed plugins, in the registry's order), then
    the others in name order: what decides a contender's colour and marker, the same in every figure."""
    declared = declared_names()
    return declared + sorted(set(impls) - set(declared))


# After tab10's ten, ten more: each in turn the colour (of a 16-step RGB grid, CIELAB lightness 25–72, none of the
# blue family bmm's and score_dot's hues hold: HSV hue 185–255) farthest by CIEDE2000, lightness counted half (thin
# lines and small markers show hue more than lightness), from every colour before it; each is as far from every
# other as tab10's own closest pair (red and brown). The earlier hand-picked ten put sdpa_cudnn's navy beside
# torch_mha's indigo (CIEDE2000 7.9) and a darker twin of bmm's blue, both GPU peers in one figure.
SECOND_TEN = (
    "#444400",  # dark olive
    "#005544",  # dark teal
    "#771144",  # wine
    "#bb9966",  # tan
    "#4400ff",  # ultramarine violet
    "#00bb99",  # turquoise
    "#99aa88",  # sage
    "#774400",  # umber
    "#554455",  # aubergine grey
    "#ff3377",  # rose
)


def colour_cycle() -> list[tuple[float, float, float]]:
    """The twenty contender colours in the order they are given: tab10's, then ``SECOND_TEN``."""
    return [*sns.color_palette("tab10", 10), *(matplotlib.colors.to_rgb(c) for c in SECOND_TEN)]


def palette(impls: list[str]) -> dict[str, Any]:
    """A fixed colour per contender (:func:`_fixed_order`): :func:`colour_cycle`'s, in turn."""
    colours = colour_cycle()
    return {name: colours[i % len(colours)] for i, name in enumerate(_fixed_order(impls)) if name in impls}


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*", "d")
MAX_NESTING = 3  # equal lines nest at most this deep (a fourth and later keep the widest width)


def markers(impls: list[str]) -> dict[str, str]:
    """A fixed marker shape per contender (:func:`_fixed_order`), beside its colour: lines of equal values
    still show each contender's shape."""
    return {name: MARKERS[i % len(MARKERS)] for i, name in enumerate(_fixed_order(impls)) if name in impls}


def _nesting(rows: pd.DataFrame, x: str, y: str, order: list[str]) -> dict[str, int]:
    """How many later-drawn contenders each one's line coincides with (the same value, to three significant
    digits, at every x): where several contenders measure alike (the peak memory of bmm, einsum and naive),
    the first is drawn widest and the last narrowest, so every one shows around the others instead of the
    last hiding them."""
    drawn = {
        impl: tuple(f"{v:.3g}" for v in rows[rows["impl"] == impl].groupby(x)[y].median().sort_index())
        for impl in order
    }
    return {impl: sum(drawn[later] == drawn[impl] for later in order[order.index(impl) + 1 :]) for impl in order}


def _hosts_joined(ok: pd.DataFrame) -> pd.Series:
    """Each row's machine as its panels name it: the hosts of one kind of hardware as one machine ("AMD EPYC ×2
    threads @ 2 hosts") where they hold disjoint cases — the shards of a sweep spread over a cluster's nodes, whose
    host names differ while nothing else does, were drawn as a machine each, every workload group cut into one
    panel per node. Hosts that hold a case in common (one sweep run on each, to compare them) stay apart."""
    hardware = ok["machine"].str.replace(r" @ .*$", "", regex=True).to_numpy()
    joined = ok["machine"].to_numpy(dtype=object, copy=True)
    for kind in dict.fromkeys(hardware):
        rows = ok[hardware == kind]
        hosts = rows["machine"].unique()
        if len(hosts) > 1 and not rows.duplicated(subset=[c for c in CASE_KEY if c != "machine"]).any():
            joined[hardware == kind] = f"{kind} @ {len(hosts)} hosts"
    return pd.Series(joined, index=ok.index, dtype=object)


def plottable(frame: pd.DataFrame) -> pd.DataFrame:
    """ok rows (incorrect ones never rank or plot), a case in several runs of one machine pooled (``pooled.py``: the
    headline's figure), with a facet label per workload group and machine (:func:`_hosts_joined`; ``roof_machine``
    keeps each row's own, whose ceilings it is measured against)."""
    ok = pool_runs(frame[frame["status"] == "ok"])
    if ok.empty:
        return ok
    ok["roof_machine"] = ok["machine"]
    ok["machine"] = _hosts_joined(ok)
    ok["group"] = [group_label(r) for r in ok.to_dict("records")]
    if ok["machine"].nunique() > 1:
        ok["group"] = ok["machine"] + "\n" + ok["group"]
    return ok


def _log2_x(axis: Any) -> None:
    axis.set_xscale("log", base=2)
    axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(plain))
    axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


class Roofs(NamedTuple):
    """One (machine, device, dtype)'s ceilings from meta.json: TFLOP/s and GB/s."""

    roof_tflops: float  # the hardware's compute roof (FMA kernel or datasheet)
    roof_gbps: float  # the hardware's bandwidth roof (the higher of read stream and triad, or datasheet)
    matmul_tflops: float  # torch's matmul rate
    copy_gbps: float  # torch's copy rate


class Reference(NamedTuple):
    """A horizontal line across a panel: its value, its label, dashed or solid, the label at the panel's left or
    right (two lines close together keep their labels apart)."""

    value: float
    text: str
    dashed: bool = True
    left: bool = True


Decorate = Callable[[Facet, Any], list[Reference]]  # draws on a panel; returns its reference lines


def _facet_figure(
    panels: list[Facet],
    y: str,
    ylabel: str,
    colours: dict[str, Any],
    decorate: Decorate | None = None,
    xlabel: str | None = None,
    hollow: str | None = None,
    missing: dict[str, str] | None = None,
) -> Any:
    """A panel per facet — lines against its x axis, or points by contender where it has one size — each
    with its own value axis, and one legend of contenders to the right. ``hollow``: a column drawn as hollow
    markers where it has a value (the rows' cold figures), beside the filled ones, said in the legend. ``missing``:
    contenders some of whose cases have no ok row (:func:`not_drawn`), listed under the legend with why."""
    figure, axes = panel_grid(len(panels))
    drew_hollow = False
    for axis, panel in zip(axes, panels, strict=True):
        _draw_panel(axis, panel, y, colours, xlabel)
        extra = _draw_hollow(axis, panel, hollow, colours) if hollow else []
        drew_hollow = drew_hollow or bool(extra)
        lines = decorate(panel, axis) if decorate else []
        value_axis(axis, panel.rows[y], extra=[*extra, *(line.value for line in lines)])
        points = _drawn_points(axis)
        taken: list[tuple[float, ...]] = []
        for line in lines:
            taken.append(_reference_line(axis, line, points, taken))
        axis.set_ylabel(ylabel)
        axis.set_title(panel.title, size=TITLE_SIZE)
        axis.grid(True, which="major", alpha=0.3)
    shown = [impl for impl in colours if any(impl in set(p.rows["impl"]) for p in panels)]
    shapes = markers(list(colours))
    handles = [matplotlib.lines.Line2D([], [], color=colours[i], marker=shapes[i], label=i) for i in shown]
    if missing:  # a PNG sent alone says whose points are absent, and why
        said = ["\nnot drawn (cases with no ok row):", *(f"{impl}: {why}" for impl, why in missing.items())]
        handles += [matplotlib.lines.Line2D([], [], linestyle="", marker="", label=text) for text in said]
    if drew_hollow:
        handles.append(
            matplotlib.lines.Line2D(
                [], [], color="grey", marker="o", markerfacecolor="none", linestyle="", label="hollow: caches flushed"
            )
        )
    legend_right(figure, handles, "impl")
    return finish(figure)


def _draw_hollow(axis: Any, panel: Facet, column: str, colours: dict[str, Any]) -> list[float]:
    """The panel's rows' ``column`` as hollow markers in each contender's colour and shape, where x is its own or
    the contender's place (a one-size panel); returns the values drawn."""
    if column not in panel.rows:
        return []
    order = [impl for impl in colours if impl in set(panel.rows["impl"])]
    shapes = markers(list(colours))
    drawn: list[float] = []
    for row in panel.rows.to_dict("records"):
        value = row.get(column)
        if value is None or not np.isfinite(value) or value <= 0:
            continue
        x = row[panel.x] if panel.x is not None else order.index(row["impl"])
        colour, shape = colours[row["impl"]], shapes[row["impl"]]
        axis.scatter([x], [value], facecolors="none", edgecolors=[colour], marker=shape, s=48, zorder=3)
        drawn.append(float(value))
    return drawn


def _draw_panel(axis: Any, panel: Facet, y: str, colours: dict[str, Any], xlabel: str | None = None) -> None:
    order = [impl for impl in colours if impl in set(panel.rows["impl"])]
    shapes = markers(list(colours))
    if panel.x is None:
        # a point per contender on the panel's y axis (a bar from an arbitrary log floor would mislead), in its
        # colour and marker, as the legend shows it
        for position, impl in enumerate(order):
            values = panel.rows.loc[panel.rows["impl"] == impl, y].to_numpy(dtype=float)
            axis.scatter([position] * len(values), values, color=colours[impl], marker=shapes[impl], s=64, zorder=3)
        axis.set_xticks(range(len(order)), order)
        axis.set_xlim(-0.5, len(order) - 0.5)
        axis.set_xlabel("")
        axis.tick_params(axis="x", labelsize=7)
        return
    nesting = _nesting(panel.rows, panel.x, y, order)
    for impl in order:
        depth = min(nesting[impl], MAX_NESTING)
        sns.lineplot(
            data=panel.rows[panel.rows["impl"] == impl],
            x=panel.x,
            y=y,
            color=colours[impl],
            marker=shapes[impl],
            markersize=6 + 4 * depth,
            linewidth=1.5 + 2.5 * depth,
            errorbar=None,  # one row per contender and size (pooled): no band of seaborn's that no caption explains
            ax=axis,
            legend=False,
        )
    _log2_x(axis)
    axis.set_xlabel(xlabel or AXIS_LABELS[panel.x])


STEPS_PER_SEGMENT = 24  # points sampled along each segment of a drawn line: a label must not hide a line either


def _drawn_points(axis: Any) -> np.ndarray:
    """Every marker drawn on the panel so far (lines' points, strip plots' dots) and points along each line's
    segments, in axes fractions (0–1): a label over a line between two markers hides it as surely as one over a
    marker."""

    def to_axes(data: np.ndarray) -> np.ndarray:
        data = data[np.isfinite(data).all(axis=1)]
        return axis.transAxes.inverted().transform(axis.transData.transform(data)) if len(data) else data

    found = [np.empty((0, 2))]
    for line in axis.lines:
        points = to_axes(np.asarray(line.get_xydata(), float))
        found.append(points)
        if line.get_linestyle() not in ("None", "", " ") and len(points) > 1:  # straight on screen, log axes too
            steps = np.linspace(0, 1, STEPS_PER_SEGMENT)[:, None, None]
            found.append((points[:-1] + steps * (points[1:] - points[:-1])).reshape(-1, 2))
    found += [to_axes(np.asarray(each.get_offsets(), float)) for each in axis.collections if len(each.get_offsets())]
    return np.concatenate(found)


LABEL_SIZE = 7  # points: a reference line's label


def _reference_line(axis: Any, line: Reference, points: np.ndarray, taken: list[tuple[float, ...]]) -> tuple:
    """A horizontal line labelled at the panel's left or right: below it in the panel's upper half, above it in
    the lower half, so the label stays inside the panel (clear of the title and the tick labels). Of the two ends,
    the one whose label box covers fewer of the panel's points and no other label's box (``line.left`` where both
    are clear): a roof's label once hid the fastest point under it. Returns the box taken (axes fractions)."""
    axis.axhline(line.value, color="black", linestyle="--" if line.dashed else "-", linewidth=1)
    height = axis.transLimits.transform((0, line.value))[1]  # 0 at the bottom of the panel, 1 at the top
    upper = height > 0.5
    size = axis.get_window_extent()
    width_pt, height_pt = size.width * 72 / axis.figure.dpi, size.height * 72 / axis.figure.dpi
    box_w, box_h = (len(line.text) * 0.58 * LABEL_SIZE + 4) / width_pt, (LABEL_SIZE + 6) / height_pt
    low, high = (height - box_h, height) if upper else (height, height + box_h)

    def box(left: bool) -> tuple[float, float, float, float]:
        return (0.02, 0.02 + box_w, low, high) if left else (0.98 - box_w, 0.98, low, high)

    def cost(left: bool) -> tuple[int, int, bool]:
        x0, x1, y0, y1 = box(left)
        covered = int(((points[:, 0] >= x0) & (points[:, 0] <= x1) & (points[:, 1] >= y0) & (points[:, 1] <= y1)).sum())
        clash = sum(x0 < b[1] and b[0] < x1 and y0 < b[3] and b[2] < y1 for b in taken)
        return clash, covered, left != line.left

    left = min((line.left, not line.left), key=cost)
    axis.annotate(
        line.text,
        (0.02 if left else 0.98, line.value),
        xycoords=("axes fraction", "data"),
        xytext=(0, -2 if upper else 2),
        textcoords="offset points",
        va="top" if upper else "bottom",
        ha="left" if left else "right",
        fontsize=LABEL_SIZE,
        bbox={"facecolor": "white", "alpha": 0.75, "edgecolor": "none", "pad": 1},
    )
    return box(left)


def latency(ok: pd.DataFrame, colours: dict[str, Any], missing: dict[str, str] | None = None) -> Any:
    if ok.empty:  # only decode rows: they have their own figure
        return None
    return _facet_figure(facets(ok), "median_ms", "median time per call (ms)", colours, missing=missing)


def throughput(
    ok: pd.DataFrame,
    colours: dict[str, Any],
    ceilings: dict[tuple[str, str, str], Roofs],
    missing: dict[str, str] | None = None,
) -> Any:
    """TFLOP/s per panel, under the hardware roof (solid) and torch's measured matmul (dashed): a kernel can
    pass torch's matmul — a CPU's FMA roof is often 2× it — but not the roof."""
    if ok.empty:
        return None

    def peak_lines(panel: Facet, axis: Any) -> list[Reference]:
        roofs = ceilings.get(roof_key(panel.rows.iloc[0]))
        if roofs is None:
            return []
        roof, matmul = roofs.roof_tflops, roofs.matmul_tflops
        if roof <= 0:
            return []
        if 0 < matmul < roof:
            return [
                Reference(roof, f"hardware roof {roof:.3g} TFLOP/s", dashed=False),
                Reference(matmul, f"torch matmul {matmul:.3g} TFLOP/s", left=False),
            ]
        named = "roof: torch matmul" if matmul > 0 else "hardware roof"  # torch's matmul is the roof, or has no rate
        return [Reference(roof, f"{named} {roof:.3g} TFLOP/s", dashed=False)]

    return _facet_figure(facets(ok), "tflops", "TFLOP/s", colours, peak_lines, missing=missing)


def memory(ok: pd.DataFrame, colours: dict[str, Any], missing: dict[str, str] | None = None) -> Any:
    """Peak working memory per panel; ``missing`` as the latency figure's: a panel where only fused_cpu reached
    S512 read as if the others needed no memory there, when they had stalled."""
    with_memory = ok[ok["peak_mem_mb"].notna() & (ok["peak_mem_mb"] > 0)] if not ok.empty else ok
    if with_memory.empty:
        return None
    return _facet_figure(facets(with_memory), "peak_mem_mb", "peak working memory (MiB)", colours, missing=missing)


def speedup_table(ok: pd.DataFrame, baseline: str | None) -> tuple[pd.DataFrame, pd.Series]:
    """Speedup of each contender over the baseline per workload (baseline median / contender median).

    The baseline is ``baseline`` where it ran, else the fastest correct torch contender of the workload. ``ok`` has
    each contender once per case (``plottable``, ``pooled.py``: several runs of one machine pooled, as the headline
    ranks them), so the baseline's own cell is 1× and a speedup matches its margin."""
    ok = ok.assign(workload=labels(ok))
    if ok["machine"].nunique() > 1:
        ok["workload"] = ok["machine"] + " · " + ok["workload"]
    base = {}
    for workload, rows in ok.groupby("workload", sort=False):
        chosen = rows[rows["impl"] == baseline] if baseline else rows.iloc[0:0]
        if chosen.empty:
            chosen = rows[rows["impl"].isin(TORCH_CONTENDERS)]
        if not chosen.empty:
            best = chosen.sort_values("median_ms").iloc[0]
            base[workload] = (best["impl"], best["median_ms"])
    ok = ok[ok["workload"].isin(base)]
    ok = ok.assign(speedup=[base[w][1] / m for w, m in zip(ok["workload"], ok["median_ms"], strict=True)])
    table = ok.pivot_table(index="impl", columns="workload", values="speedup", aggfunc="max", sort=False)
    return table, pd.Series({w: b[0] for w, b in base.items()}, name="baseline")


SPEEDUP_SATURATES = 2  # log2: the speedup map's colours run from 1/4× to 4×


def speedup(ok: pd.DataFrame, colours: dict[str, Any], baseline: str | None) -> Any:
    table, base = speedup_table(ok, baseline)
    if table.empty:
        return None
    table = table.reindex([i for i in colours if i in table.index]).T  # rows: workloads, columns: contenders
    rows = [f"{w}  (baseline {base[w]})" for w in table.index]
    size = (0.9 * len(table.columns) + 6.5, 0.38 * len(rows) + 1.8)
    figure, axis = plt.subplots(figsize=size, layout="constrained", dpi=DPI)
    values = np.log2(table.to_numpy(dtype=float))
    # colour from 1/4× to 4× (beyond, it saturates: naive's 0.02× would wash real 2× gains out to pale)
    limit = min(SPEEDUP_SATURATES, max(1.0, float(np.nanmax(np.abs(values))))) if np.isfinite(values).any() else 1.0
    with warnings.catch_warnings():
        # seaborn draws the figure inside heatmap() to see whether tick labels overlap, before the colour bar's
        # room is settled: the constrained layout collapses on that one draw and warns; the figure as saved
        # is laid out (figure_layout's overlap check passes on it)
        warnings.filterwarnings("ignore", "constrained_layout not applied", UserWarning)
        sns.heatmap(
            values,
            ax=axis,
            cmap="RdYlGn",
            center=0,
            vmin=-limit,
            vmax=limit,
            annot=table.map(lambda v: "" if pd.isna(v) else f"{v:.3g}×").to_numpy(),
            fmt="",
            annot_kws={"size": 7},
            cbar_kws={"label": "speedup over baseline", "extend": "both" if limit == SPEEDUP_SATURATES else "neither"},
            xticklabels=list(table.columns),
            yticklabels=rows,
        )
    colour_bar = axis.collections[0].colorbar
    if colour_bar is not None:
        steps = [k for k in range(-SPEEDUP_SATURATES, SPEEDUP_SATURATES + 1) if abs(k) <= limit]
        colour_bar.set_ticks(steps, labels=[f"{2.0**k:g}×" for k in steps])
    axis.set_xticklabels(axis.get_xticklabels(), rotation=0, fontsize=8)
    axis.set_yticklabels(axis.get_yticklabels(), rotation=0, fontsize=7)
    axis.set_title("speedup over the baseline (> 1× is faster; the baseline is 1×)", size=10)
    axis.set_xlabel("")
    axis.set_ylabel("")
    return finish(figure)


def roof_key(row: Any) -> tuple[str, str, str]:
    """The (machine, device, dtype) whose ceilings a row is measured against: the type its dots run in, i.e. an
    fp8 forward's q_dtype (its rows have the model's dtype, their roofs are fp8's), else the row's dtype."""
    dots = row.get("q_dtype")
    machine = row.get("roof_machine") or row["machine"]  # plottable's rows: their own machine, not their panel's
    return machine, row["device"], dots if isinstance(dots, str) and dots else row["dtype"]


def roofline(ok: pd.DataFrame, colours: dict[str, Any], ceilings: dict[tuple[str, str, str], Roofs]) -> Any:
    """Achieved TFLOP/s against arithmetic intensity, under the hardware roofline (solid) and the library's
    (dashed: torch's matmul and copy rates); their figures in each panel's title, one legend to the right."""
    points = ok[ok["intensity"].notna() & ok["tflops"].notna()]
    point_keys = [roof_key(row) for row in points.to_dict("records")]
    keys = sorted(key for key in set(point_keys) & set(ceilings) if ceilings[key].roof_tflops > 0)  # a roof to draw
    if not keys:
        return None
    figure, axes = panel_grid(len(keys), size=(5.2, 4.2))
    shapes = markers(list(colours))
    for axis, key in zip(axes, keys, strict=True):
        roofs = ceilings[key]
        peak, bandwidth_gbps = roofs.roof_tflops, roofs.roof_gbps
        rows = points[[k == key for k in point_keys]]
        # the points and each roof's ridge (where it bends), so a decode-only or prefill-only panel shows both slopes
        ridges = [peak * 1e3 / bandwidth_gbps] if bandwidth_gbps > 0 else []
        if roofs.matmul_tflops > 0 and roofs.copy_gbps > 0:
            ridges.append(roofs.matmul_tflops * 1e3 / roofs.copy_gbps)
        low = min([rows["intensity"].min() / 4, *(r / 2 for r in ridges)])
        high = max([rows["intensity"].max() * 4, *(r * 2 for r in ridges)])
        value_axis(axis, [low, high], which="x")
        left, right = axis.get_xlim()
        x = np.geomspace(left, right, 200)  # the roofs across the whole axis, from its left edge
        axis.plot(
            x,
            np.minimum(peak, x * bandwidth_gbps / 1e3),
            color="black",
            linewidth=1.2,
            label=f"hardware roof ({peak:.3g} TFLOP/s, {bandwidth_gbps:.3g} GB/s)",
        )
        if roofs.matmul_tflops > 0:
            axis.plot(
                x,
                np.minimum(roofs.matmul_tflops, x * roofs.copy_gbps / 1e3),
                color="black",
                linewidth=1,
                linestyle="--",
                label=f"torch matmul ({roofs.matmul_tflops:.3g} TFLOP/s) and copy",
            )
            library = f"torch matmul {roofs.matmul_tflops:.3g} TFLOP/s, copy {roofs.copy_gbps:.3g} GB/s"
        else:  # e.g. fp8 where torch has no fp8 matmul on this GPU (measure_matmul_tflops gives 0)
            library = f"no torch matmul rate in {key[2]}"
        here = [i for i in colours if i in set(rows["impl"])]
        sns.scatterplot(
            data=rows,
            x="intensity",
            y="tflops",
            hue="impl",
            hue_order=here,
            palette=colours,
            style="impl",
            style_order=here,
            markers={i: shapes[i] for i in here},
            ax=axis,
            s=40,
            legend=False,
        )
        value_axis(axis, rows["tflops"], extra=[peak, x[0] * bandwidth_gbps / 1e3])
        axis.set_xlabel("arithmetic intensity (FLOP/byte)")
        axis.set_ylabel("achieved TFLOP/s")
        axis.set_title(
            f"{key[0]}, {key[1]} {key[2]}: hardware roof {peak:.3g} TFLOP/s, {bandwidth_gbps:.3g} GB/s; {library}",
            size=TITLE_SIZE,
        )
        axis.grid(True, which="both", alpha=0.25)
    shown = [i for i in colours if i in set(points["impl"])]
    line = matplotlib.lines.Line2D
    handles = [
        line([], [], color="black", linewidth=1.2, label="hardware roof"),
        line([], [], color="black", linewidth=1, linestyle="--", label="torch matmul and copy"),
        *[line([], [], color=colours[i], marker=shapes[i], linestyle="", label=i) for i in shown],
    ]
    legend_right(figure, handles, "roofs and impl")
    return finish(figure)


def decode_bandwidth(
    ok: pd.DataFrame,
    colours: dict[str, Any],
    ceilings: dict[tuple[str, str, str], Roofs],
    missing: dict[str, str] | None = None,
) -> Any:
    """Decode steps (Sq ≤ 16 against a longer KV cache) are bandwidth-bound: GB/s against the KV length,
    per model and workload group, with the hardware's bandwidth roof (read stream or triad, or the GPU's datasheet)
    dashed and a right axis in % of it."""
    decode = _decode_rows(ok)
    if decode.empty:
        return None

    def bandwidth_line(panel: Facet, axis: Any) -> list[Reference]:
        row = panel.rows.iloc[0]
        roofs = ceilings.get(roof_key(row))
        bandwidth = roofs.roof_gbps if roofs is not None else 0.0
        if not bandwidth:
            return []
        percent = axis.secondary_yaxis(
            "right", functions=(lambda v: 100 * v / bandwidth, lambda p: p * bandwidth / 100)
        )
        percent.set_ylabel("% of bandwidth", fontsize=8)
        percent.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(plain))
        percent.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        return [Reference(bandwidth, f"bandwidth roof {bandwidth:.3g} GB/s")]

    decode = decode.assign(cold_gbps=decode["gbps"] * decode["median_ms"] / _cold_ms(decode))
    return _facet_figure(
        _decode_panels(decode),
        "gbps",
        "GB/s (q, the KV read, o)",  # the row's gbps: all its minimum bytes, not the cache's alone
        colours,
        bandwidth_line,
        xlabel=_kv_label(decode),
        hollow="cold_gbps",
        missing=missing,
    )


def decode_latency(ok: pd.DataFrame, colours: dict[str, Any], missing: dict[str, str] | None = None) -> Any:
    """Decode steps' time per step against the KV length, in the panels of :func:`decode_bandwidth`: what a
    server waits per generated token in this layer (the bandwidth figure says how near the roof it is)."""
    decode = _decode_rows(ok)
    if decode.empty:
        return None
    decode = decode.assign(cold_ms=_cold_ms(decode))
    return _facet_figure(
        _decode_panels(decode),
        "median_ms",
        "median time per step (ms)",
        colours,
        xlabel=_kv_label(decode),
        hollow="cold_ms",
        missing=missing,
    )


def _cold_ms(decode: pd.DataFrame) -> pd.Series:
    """Each row's cold median where it read its bytes from the cache warm (``cache_resident``), else NaN: there
    warm and cold differ by what the cache held (a row reading memory either way is not drawn twice)."""
    if "cold_median_ms" not in decode:
        return pd.Series(np.nan, index=decode.index)
    return decode["cold_median_ms"].astype("float64").where(read_from_cache(decode))


def _decode_rows(ok: pd.DataFrame) -> pd.DataFrame:
    """The decode steps (Sq ≤ 16 against a longer cache) with a bandwidth: what the decode figures draw."""
    if "gbps" not in ok:
        return ok.iloc[0:0]
    decode = ok[ok["gbps"].notna() & (ok["gbps"] > 0)]
    return decode[[phase_of(r) == "decode" for r in decode.to_dict("records")]]


def _decode_panels(decode: pd.DataFrame) -> list[Facet]:
    """A panel per workload group: x the KV length where it varies; else the one it ran at is in its title."""
    return [
        Facet(str(group), "seq_k", rows)
        if rows["seq_k"].nunique() > 1
        else Facet(f"{group} Sk{rows['seq_k'].iloc[0]}", None, rows)
        for group, rows in decode.groupby("group", sort=False)
    ]


def _kv_label(decode: pd.DataFrame) -> str:
    ragged = "lengths" in decode and (decode["lengths"].fillna("equal") != "equal").any()
    return "KV cache length (keys; the longest where the batch's lengths vary)" if ragged else "KV cache length (keys)"


NOT_DRAWN = ("unavailable",)  # never ran on this machine: the page's table of missing points says so, not each figure


def not_drawn(frame: pd.DataFrame) -> dict[str, str]:
    """Each contender some of whose cases (per machine) have no ok row in ``frame``, and how those ended — "2
    stalled, 1 unsupported" — leaving out a contender this machine does not have (:data:`NOT_DRAWN`): a figure's
    panels show ok rows alone, so a one-size panel with one contender in it looked like a race of one."""
    if frame.empty:
        return {}
    key = [c for c in CASE_KEY if c in frame.columns]
    cases = frame.drop_duplicates([*key, "status"]).copy()
    with_ok = set(cases.loc[cases["status"] == "ok", key].itertuples(index=False, name=None))
    lacking = cases[[tuple(row) not in with_ok for row in cases[key].itertuples(index=False, name=None)]]
    lacking = lacking[~lacking["status"].isin([*NOT_DRAWN, "ok"])].drop_duplicates(key)
    found = {}
    for impl, rows in lacking.groupby("impl", sort=True):
        counts = sorted(rows["status"].value_counts().items(), key=lambda item: (-item[1], item[0]))
        found[str(impl)] = ", ".join(f"{count} {status}" for status, count in counts)
    return found


def save(figure: Any, path: Path) -> Path:
    target = figure.figure if hasattr(figure, "figure") and not isinstance(figure, plt.Figure) else figure
    target.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(target)
    return path


def draw_all(
    frame: pd.DataFrame,
    out_dir: Path,
    baseline: str | None,
    ceilings: dict[tuple[str, str, str], Roofs],
) -> list[tuple[str, Path]]:
    """Every figure the data allows, as (title, PNG path)."""
    ok = plottable(frame)
    if ok.empty:
        return []
    colours = palette(sorted(set(ok["impl"])))
    everything, ok = ok, ok[[phase_of(r) != "decode" for r in ok.to_dict("records")]]  # decode: its own figure
    decode = pd.Series([phase_of(r) == "decode" for r in frame.to_dict("records")], index=frame.index, dtype=bool)
    missing, missing_decode = not_drawn(frame[~decode]), not_drawn(frame[decode])
    makers: list[tuple[str, str, Callable[[], Any]]] = [
        ("Latency", "latency.png", lambda: latency(ok, colours, missing)),
        ("Throughput", "tflops.png", lambda: throughput(ok, colours, ceilings, missing)),
        ("Peak working memory", "memory.png", lambda: memory(ok, colours, missing)),
        ("Speedup over the baseline", "speedup.png", lambda: speedup(everything, colours, baseline)),
        ("Roofline", "roofline.png", lambda: roofline(everything, colours, ceilings)),
        (
            "Decode bandwidth vs KV length",
            "decode.png",
            lambda: decode_bandwidth(everything, colours, ceilings, missing_decode),
        ),
        (
            "Decode time per step vs KV length",
            "decode_ms.png",
            lambda: decode_latency(everything, colours, missing_decode),
        ),
    ]
    drawn = []
    for title, name, make in makers:
        figure = make()
        if figure is not None:
            drawn.append((title, save(figure, out_dir / name)))
    return drawn
