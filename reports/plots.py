"""The report's figures, drawn with seaborn: one colour per contender across every figure, log axes
where sizes double, a panel per workload group and machine (``facets.py``: what varies in a group goes on
x — sequence length, key length, heads, head_dim or batch — and a group run at one size is drawn as
points by contender)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from attnbench.reports.facets import AXIS_LABELS, Facet, facets
from attnbench.reports.frames import group_label, labels, phase_of

KNOWN_ORDER = ["naive", "bmm", "einsum", "sdpa_math", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn",
               "xformers", "flex", "fused_cpu", "fused_triton"]  # fmt: skip
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
DPI = 110


def palette(impls: list[str]) -> dict[str, Any]:
    """A fixed colour per contender: built-ins always get the same one, others follow in name order."""
    tab20 = sns.color_palette("tab20", 20)
    colours = [tab20[i] for i in range(0, 20, 2)] + [tab20[i] for i in range(1, 20, 2)]
    names = KNOWN_ORDER + sorted(set(impls) - set(KNOWN_ORDER))
    return {name: colours[i % len(colours)] for i, name in enumerate(names) if name in impls}


def plottable(frame: pd.DataFrame) -> pd.DataFrame:
    """ok rows (incorrect ones never rank or plot) with a facet label per workload group and machine."""
    ok = frame[frame["status"] == "ok"].copy()
    if ok.empty:
        return ok
    ok["group"] = [group_label(r) for r in ok.to_dict("records")]
    if ok["machine"].nunique() > 1:
        ok["group"] = ok["machine"] + "\n" + ok["group"]
    return ok


def _log2_x(axis: Any) -> None:
    axis.set_xscale("log", base=2)
    axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))


def _facet_figure(
    ok: pd.DataFrame, y: str, ylabel: str, colours: dict[str, Any], logy: bool = True
) -> tuple[Any, list[tuple[Facet, Any]]]:
    """A panel per facet: lines against its x axis, or points by contender where it has one size; returns the
    figure and each facet with its axes."""
    panels = facets(ok)
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.4 * columns, 3.4 * rows), squeeze=False)
    for axis, panel in zip(axes.flat, panels, strict=False):
        _draw_panel(axis, panel, y, colours)
        if logy:
            axis.set_yscale("log")
        axis.set_ylabel(ylabel)
        axis.set_title(panel.title, size=8)
        axis.grid(True, which="major", alpha=0.3)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    shown = [impl for impl in colours if impl in set(ok["impl"])]
    handles = [matplotlib.lines.Line2D([], [], color=colours[i], marker="o", label=i) for i in shown]
    figure.legend(handles=handles, title="impl", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    figure.tight_layout()
    return figure, [(panel, axis) for axis, panel in zip(axes.flat, panels, strict=False)]


def _draw_panel(axis: Any, panel: Facet, y: str, colours: dict[str, Any]) -> None:
    order = [impl for impl in colours if impl in set(panel.rows["impl"])]
    if panel.x is None:
        # a point per contender on the panel's (log) y axis: a bar from an arbitrary log floor would mislead
        sns.stripplot(data=panel.rows, x="impl", y=y, hue="impl", order=order, hue_order=order, palette=colours,
                      jitter=False, size=8, ax=axis, legend=False)  # fmt: skip
        axis.set_xlabel("")
        axis.tick_params(axis="x", labelrotation=30, labelsize=7)
        return
    sns.lineplot(data=panel.rows, x=panel.x, y=y, hue="impl", hue_order=order, palette=colours, marker="o", ax=axis,
                 legend=False)  # fmt: skip
    _log2_x(axis)
    axis.set_xlabel(AXIS_LABELS[panel.x])


def latency(ok: pd.DataFrame, colours: dict[str, Any]) -> Any:
    if ok.empty:  # only decode rows: they have their own figure
        return None
    return _facet_figure(ok, "median_ms", "median time per call (ms)", colours)[0]


def throughput(ok: pd.DataFrame, colours: dict[str, Any], peaks: dict[tuple[str, str, str], float]) -> Any:
    if ok.empty:
        return None
    figure, panels = _facet_figure(ok, "tflops", "TFLOP/s", colours)
    for panel, axis in panels:
        rows = panel.rows.iloc[0]
        peak = peaks.get((rows["machine"], rows["device"], rows["dtype"]))
        if peak:
            axis.axhline(peak, color="black", linestyle="--", linewidth=1)
            axis.annotate(f"measured matmul peak {peak:.3g}", (0.02, peak), xycoords=("axes fraction", "data"),
                          va="bottom", fontsize=7)  # fmt: skip
    return figure


def memory(ok: pd.DataFrame, colours: dict[str, Any]) -> Any:
    with_memory = ok[ok["peak_mem_mb"].notna() & (ok["peak_mem_mb"] > 0)] if not ok.empty else ok
    if with_memory.empty:
        return None
    return _facet_figure(with_memory, "peak_mem_mb", "peak working memory (MiB)", colours)[0]


def speedup_table(ok: pd.DataFrame, baseline: str | None) -> tuple[pd.DataFrame, pd.Series]:
    """Speedup of each contender over the baseline per workload (baseline median / contender median).

    The baseline is ``baseline`` where it ran, else the fastest correct torch contender of the workload."""
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
    table = ok.pivot_table(index="impl", columns="workload", values="speedup", aggfunc="first", sort=False)
    return table, pd.Series({w: b[0] for w, b in base.items()}, name="baseline")


def speedup(ok: pd.DataFrame, colours: dict[str, Any], baseline: str | None) -> Any:
    table, base = speedup_table(ok, baseline)
    if table.empty:
        return None
    table = table.reindex([i for i in colours if i in table.index]).T  # rows: workloads, columns: contenders
    rows = [f"{w}  (baseline {base[w]})" for w in table.index]
    figure, axis = plt.subplots(figsize=(0.9 * len(table.columns) + 6.5, 0.38 * len(rows) + 1.8))
    values = np.log2(table.to_numpy(dtype=float))
    limit = max(1.0, float(np.nanmax(np.abs(values)))) if np.isfinite(values).any() else 1.0
    sns.heatmap(values, ax=axis, cmap="RdYlGn", center=0, vmin=-limit, vmax=limit,
                annot=table.map(lambda v: "" if pd.isna(v) else f"{v:.2g}×").to_numpy(), fmt="",
                annot_kws={"size": 7}, cbar_kws={"label": "log2 speedup over baseline"},
                xticklabels=list(table.columns), yticklabels=rows)  # fmt: skip
    axis.set_xticklabels(axis.get_xticklabels(), rotation=30, ha="right", fontsize=8)
    axis.set_yticklabels(axis.get_yticklabels(), rotation=0, fontsize=7)
    axis.set_title("speedup over the baseline (> 1× is faster; the baseline is 1×)")
    axis.set_xlabel("")
    axis.set_ylabel("")
    figure.tight_layout()
    return figure


class Roofs(NamedTuple):
    """One (machine, device, dtype)'s ceilings from meta.json: TFLOP/s and GB/s."""

    roof_tflops: float  # the hardware's compute roof (FMA kernel or datasheet)
    roof_gbps: float  # the hardware's bandwidth roof (triad or datasheet)
    matmul_tflops: float  # torch's matmul rate
    copy_gbps: float  # torch's copy rate


def roofline(ok: pd.DataFrame, colours: dict[str, Any], ceilings: dict[tuple[str, str, str], Roofs]) -> Any:
    """Achieved TFLOP/s against arithmetic intensity, under the hardware roofline (solid) and the library's
    (dashed: torch's matmul and copy rates)."""
    points = ok[ok["intensity"].notna() & ok["tflops"].notna()]
    keys = sorted(set(zip(points["machine"], points["device"], points["dtype"], strict=True)) & set(ceilings))
    if not keys:
        return None
    figure, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4.2), squeeze=False)
    for axis, key in zip(axes[0], keys, strict=True):
        roofs = ceilings[key]
        peak, bandwidth_gbps = roofs.roof_tflops, roofs.roof_gbps
        rows = points[(points["machine"] == key[0]) & (points["device"] == key[1]) & (points["dtype"] == key[2])]
        low, high = rows["intensity"].min() / 4, rows["intensity"].max() * 4
        x = np.geomspace(low, high, 200)
        axis.plot(x, np.minimum(peak, x * bandwidth_gbps / 1e3), color="black", linewidth=1.2,
                  label=f"hardware roof ({peak:.3g} TFLOP/s, {bandwidth_gbps:.3g} GB/s)")  # fmt: skip
        axis.plot(x, np.minimum(roofs.matmul_tflops, x * roofs.copy_gbps / 1e3), color="black", linewidth=1,
                  linestyle="--", label=f"torch matmul ({roofs.matmul_tflops:.3g} TFLOP/s) and copy")  # fmt: skip
        sns.scatterplot(data=rows, x="intensity", y="tflops", hue="impl", hue_order=[i for i in colours
                        if i in set(rows["impl"])], palette=colours, ax=axis, s=40)  # fmt: skip
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("arithmetic intensity (FLOP/byte)")
        axis.set_ylabel("achieved TFLOP/s")
        axis.set_title(f"{key[0]}\n{key[1]} {key[2]}: hardware roof {peak:.3g} TFLOP/s, {bandwidth_gbps:.3g} GB/s",
                       size=8)  # fmt: skip
        axis.grid(True, which="both", alpha=0.25)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def decode_bandwidth(ok: pd.DataFrame, colours: dict[str, Any], ceilings: dict[tuple[str, str, str], Roofs]) -> Any:
    """Decode steps (Sq ≤ 16 against a longer KV cache) are bandwidth-bound: GB/s against the KV length,
    per model and workload group, with the hardware's measured bandwidth (triad, or the GPU's datasheet)
    dashed and a right axis in % of it."""
    if "gbps" not in ok:
        return None
    decode = ok[ok["gbps"].notna() & (ok["gbps"] > 0)]
    decode = decode[[phase_of(r) == "decode" for r in decode.to_dict("records")]]
    if decode.empty:
        return None
    groups = list(dict.fromkeys(decode["group"]))
    grid = sns.relplot(
        data=decode, x="seq_k", y="gbps", hue="impl", hue_order=[i for i in colours if i in set(decode["impl"])],
        palette=colours, col="group", col_order=groups, col_wrap=min(3, len(groups)), kind="line", marker="o",
        height=3.2, aspect=1.35, facet_kws={"sharey": False, "sharex": False},
    )  # fmt: skip
    for group, axis in grid.axes_dict.items():
        _log2_x(axis)
        axis.grid(True, which="major", alpha=0.3)
        row = decode[decode["group"] == group].iloc[0]
        roofs = ceilings.get((row["machine"], row["device"], row["dtype"]))
        bandwidth = roofs.roof_gbps if roofs is not None else 0.0
        if bandwidth:
            axis.axhline(bandwidth, color="black", linestyle="--", linewidth=1)
            axis.annotate(f"measured bandwidth {bandwidth:.3g} GB/s", (0.02, bandwidth),
                          xycoords=("axes fraction", "data"), va="bottom", fontsize=7)  # fmt: skip
            axis.set_ylim(0, max(bandwidth, float(decode[decode["group"] == group]["gbps"].max())) * 1.15)
            percent = axis.secondary_yaxis(
                "right", functions=(lambda v, b=bandwidth: 100 * v / b, lambda p, b=bandwidth: p * b / 100)
            )
            percent.set_ylabel("% of bandwidth", fontsize=8)
    grid.set_titles("{col_name}", size=8)
    grid.set_axis_labels("KV cache length (keys)", "GB/s (bytes of the KV read)")
    return grid


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
    peaks = {key: value.matmul_tflops for key, value in ceilings.items()}
    everything, ok = ok, ok[[phase_of(r) != "decode" for r in ok.to_dict("records")]]  # decode: its own figure
    makers: list[tuple[str, str, Callable[[], Any]]] = [
        ("Latency", "latency.png", lambda: latency(ok, colours)),
        ("Throughput", "tflops.png", lambda: throughput(ok, colours, peaks)),
        ("Peak working memory", "memory.png", lambda: memory(ok, colours)),
        ("Speedup over the baseline", "speedup.png", lambda: speedup(everything, colours, baseline)),
        ("Roofline", "roofline.png", lambda: roofline(everything, colours, ceilings)),
        ("Decode bandwidth vs KV length", "decode.png", lambda: decode_bandwidth(everything, colours, ceilings)),
    ]
    drawn = []
    for title, name, make in makers:
        figure = make()
        if figure is not None:
            drawn.append((title, save(figure, out_dir / name)))
    return drawn
