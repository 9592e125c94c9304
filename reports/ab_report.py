"""The A/B command's outputs: the printed table, ``ab.csv``, the raw paired rounds, and ``ab.png``.

``ab.png`` draws every case's ratio B/A with its 95 % interval on a linear axis with plain decimal ticks,
1 marked, and the threshold band [1 − t, 1 + t] shaded: a case whose interval sits inside the band is
``same``, one wholly to the right of 1 and with its point past the band ``slower``. One row per case, its
workload label on the left; the height grows with the cases so labels never overlap.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from attnbench.reports.figure_layout import VERDICT_COLOURS
from attnbench.reports.trend import nice_ticks

DPI = 110


DISAGREE = "‡"  # marks a case whose medians' quotient lies outside the paired ratio's interval


def format_table(records: list[dict[str, Any]]) -> str:
    """One line per case: A's and B's median per-call times, the median of the per-round ratios B_i / A_i with
    its interval, the verdict (or why none). The headers say which is which: the ratio is not the quotient of
    the two medians beside it (27.99 and 23.91 ms with a ratio of 1.010 is a case whose rounds mostly tied).
    Where that quotient lies outside the ratio's interval widened by the threshold (``medians_disagree``: bimodal
    samples on a busy machine), the verdict is marked ‡ and a line under the table says so: the medians are not
    to be quoted. A case not timed (unsupported, incorrect, error) shows its verdict in the table and its reason in
    a line under it, as a run's summary does: a reason in the column (an incorrect one names rows, heads and the
    worst element) made every row of the table as wide as the longest reason."""
    rows, notes, untimed = [], [], []
    for r in records:
        timed = r["ratio"] is not None
        mark = f" {DISAGREE}" if timed and r.get("medians_disagree") else ""
        if mark:
            notes.append(
                f"{DISAGREE} {r['workload']}: B median / A median = {r['median_quotient']:.3f}, outside the paired "
                f"ratio's 95% interval [{r['ci_low']:.3f}, {r['ci_high']:.3f}]: the medians disagree with the paired "
                "rounds (bimodal samples, a busy machine) — trust the paired ratio, or rerun on a quieter machine"
            )
        rows.append(
            {
                "workload": r["workload"],
                "A median ms": f"{r['median_a_ms']:.4g}" if timed else "",
                "B median ms": f"{r['median_b_ms']:.4g}" if timed else "",
                "median of round B/A": f"{r['ratio']:.3f}" if timed else "",
                "95% CI": f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]" if timed else "",
                "rounds": r["n_pairs"] if timed else "",
                "verdict": r["verdict"] + mark,
            }
        )
        if not timed and r["reason"]:
            untimed.append(f"  {r['workload']}: {r['verdict']} — {r['reason']}")
    return "\n".join([pd.DataFrame(rows).to_string(index=False), *notes, *untimed])


def summary_line(records: list[dict[str, Any]]) -> str:
    """``8 cases: 1 slower, 6 same, 1 unclear (B = x vs A = y, threshold 2%)``."""
    counts = pd.Series([r["verdict"] for r in records]).value_counts()
    first = records[0]
    parts = ", ".join(f"{n} {verdict}" for verdict, n in counts.items())
    return (
        f"{len(records)} case(s): {parts} (B = {first['impl_b']} vs A = {first['impl_a']}, "
        f"threshold {first['threshold']:.1%})"
    )


def samples_frame(records: list[dict[str, Any]], samples: list[tuple[list[float], list[float]]]) -> pd.DataFrame:
    """The raw paired rounds: one row per (case, round) with A's and B's per-call time and their ratio."""
    rows = [
        {"workload": r["workload"], "round": i, "a_ms": a, "b_ms": b, "ratio": b / a}
        for r, (a_ms, b_ms) in zip(records, samples, strict=True)
        for i, (a, b) in enumerate(zip(a_ms, b_ms, strict=False))
    ]
    return pd.DataFrame(rows, columns=["workload", "round", "a_ms", "b_ms", "ratio"])


def draw_ratios(records: list[dict[str, Any]]) -> Figure:
    """The figure of ``ab.png`` (see the module docstring)."""
    threshold = records[0]["threshold"]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.42 * len(records)))
    ax.axvspan(1 - threshold, 1 + threshold, color="#dddddd", zorder=0)
    ax.axvline(1.0, color="#444444", linewidth=1, zorder=1)
    labels, lows, highs = [], [1 - 2 * threshold], [1 + 2 * threshold]
    for y, r in enumerate(records):
        if r["ratio"] is None:
            labels.append(f"{r['workload']} — {r['verdict']}")
            continue
        labels.append(r["workload"])
        colour = VERDICT_COLOURS.get(r["verdict"], "#999999")
        error = [[r["ratio"] - r["ci_low"]], [r["ci_high"] - r["ratio"]]]
        ax.errorbar(r["ratio"], y, xerr=error, fmt="o", color=colour, capsize=4, zorder=2)
        lows.append(r["ci_low"])
        highs.append(r["ci_high"])
    span = max(highs) - min(lows)
    ax.set_xlim(min(lows) - 0.05 * span, max(highs) + 0.05 * span)
    ax.set_yticks(range(len(records)), labels)
    ax.set_ylim(len(records) - 0.5, -0.5)  # first case on top
    # round steps (1, 2, 2.5 or 5 × a power of ten) labelled with the decimals they need: MaxNLocator's 0.015
    # steps printed to two decimals put "1.00" at 1.005, left of the line drawn at 1
    low, high = ax.get_xlim()
    ticks = nice_ticks(max(low, 1e-9), high)
    ax.set_xticks([value for value, _ in ticks], [label for _, label in ticks])
    first = records[0]
    ax.set_xlabel(f"time ratio B/A  (B = {first['impl_b']}, A = {first['impl_a']}; > 1: B slower)")
    ax.set_title("A/B in one process: median per-round ratio, 95% interval", fontsize=10)
    shown = {r["verdict"] for r in records if r["ratio"] is not None}
    handles = [Patch(color=c, label=v) for v, c in VERDICT_COLOURS.items() if v in shown]  # the verdicts drawn only
    handles.append(Patch(color="#dddddd", label=f"±{threshold:.0%} threshold"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.06 if len(records) > 2 else 0.12, 1, 1))
    return fig


def plot_ratios(records: list[dict[str, Any]], path: Path) -> Path:
    """``ab.png``."""
    fig = draw_ratios(records)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def write_ab(
    records: list[dict[str, Any]],
    samples: list[tuple[list[float], list[float]]],
    out: Path,
    meta: dict[str, Any],
) -> list[Path]:
    """``ab.csv``, ``ab_samples.csv``, ``ab.png`` and ``meta.json`` in ``out`` (created); their paths. All or none:
    where one cannot be written (the disk full), those written before it go again, and the folder if made here —
    verdicts without their samples or figure would pass for a whole A/B."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "ab.csv", out / "ab_samples.csv", out / "ab.png", out / "meta.json"]
    writes: list[Callable[[Path], object]] = [
        lambda path: pd.DataFrame(records).to_csv(path, index=False),
        lambda path: samples_frame(records, samples).to_csv(path, index=False),
        lambda path: plot_ratios(records, path),
        lambda path: path.write_text(json.dumps(meta, indent=2, default=str) + "\n"),
    ]
    path = out
    try:
        for path, write in zip(paths, writes, strict=True):
            write(path)
    except BaseException as exc:
        for written in paths:
            written.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()
        if isinstance(exc, OSError) and exc.filename is None:  # say which file could not be written
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise
    return paths
