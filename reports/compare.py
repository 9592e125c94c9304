"""`attnbench compare BASE NEW`: a verdict per case from the raw samples, not a bare threshold.

For each case both runs measured correctly, the ratio of medians (new / base) and a two-sided
Mann-Whitney U test on the raw samples decide:

* ``faster`` / ``slower`` — the difference is beyond the practical floor *and* either significant
  (p < alpha) or clear-cut: every new sample on the same side of every base sample (with three samples
  a side, the smallest p-value the test can give is 0.1, so a slow case measured a few times would
  otherwise never be called);
* ``same`` — within the floor;
* ``unclear`` — beyond the floor but not significant (too few or too noisy samples).

The floor defaults to 5 %: on a shared two-core VM, medians of the same case drift by up to that much
between runs minutes apart, and a gate must not fail on that. The geometric mean of the ratios summarises
the comparison; the exit code is 1 when any case is slower (for CI gating).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import mannwhitneyu

from attnbench.reports.frames import load_runs, workload_label
from attnbench.results import CASE_COLUMNS

MATCH_ON = CASE_COLUMNS
VERDICTS = ("faster", "slower", "same", "unclear")


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.05
    alpha: float = 0.01


def _samples(row: pd.Series) -> np.ndarray:
    samples = row.get("samples_ms")
    if samples is None or (isinstance(samples, float) and math.isnan(samples)) or len(samples) == 0:
        return np.array([row["median_ms"]])
    return np.asarray(samples, dtype=float)


def verdict(base_samples: Any, new_samples: Any, settings: Settings) -> tuple[str, float, float]:
    """(verdict, new/base median ratio, p-value) for two sets of per-call samples."""
    base, new = np.asarray(base_samples, dtype=float), np.asarray(new_samples, dtype=float)
    ratio = float(np.median(new) / np.median(base))
    if len(base) >= 2 and len(new) >= 2 and not (np.ptp(base) == 0 and np.ptp(new) == 0):
        p_value = float(mannwhitneyu(base, new, alternative="two-sided").pvalue)
    else:
        p_value = 0.0 if ratio != 1.0 else 1.0
    if abs(ratio - 1) <= settings.threshold:
        return "same", ratio, p_value
    separated = new.min() > base.max() if ratio > 1 else new.max() < base.min()
    if p_value >= settings.alpha and not separated:
        return "unclear", ratio, p_value
    return ("slower" if ratio > 1 else "faster"), ratio, p_value


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, settings: Settings) -> pd.DataFrame:
    """One row per case present in either run: verdict, ratio, p-value, or why it can't be compared."""
    merged = base.merge(new, on=MATCH_ON, how="outer", suffixes=("_base", "_new"), indicator=True)
    records: list[dict[str, Any]] = []
    for row in merged.to_dict("records"):
        record = {key: row[key] for key in MATCH_ON}
        record["workload"] = workload_label(pd.Series(record))
        if row["_merge"] != "both":
            record.update(verdict="missing", note=f"only in {'base' if row['_merge'] == 'left_only' else 'new'}")
        elif row["status_base"] != "ok" or row["status_new"] != "ok":
            record.update(verdict="not comparable", note=f"base {row['status_base']}, new {row['status_new']}")
        else:
            base_row = pd.Series({"samples_ms": row["samples_ms_base"], "median_ms": row["median_ms_base"]})
            new_row = pd.Series({"samples_ms": row["samples_ms_new"], "median_ms": row["median_ms_new"]})
            outcome, ratio, p_value = verdict(_samples(base_row), _samples(new_row), settings)
            record.update(verdict=outcome, ratio=ratio, p_value=p_value, note="",
                          base_ms=row["median_ms_base"], new_ms=row["median_ms_new"])  # fmt: skip
        records.append(record)
    columns = ["impl", "workload", "verdict", "ratio", "p_value", "base_ms", "new_ms", "note", *MATCH_ON[1:]]
    return pd.DataFrame.from_records(records).reindex(columns=columns)


def geometric_mean(ratios: pd.Series) -> float | None:
    values = ratios.dropna()
    return float(np.exp(np.log(values).mean())) if len(values) else None


def load_pair(base: Path, new: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    frame, _ = load_runs([base, new])
    names = list(dict.fromkeys(frame["run"]))
    return frame[frame["run"] == names[0]], frame[frame["run"] == names[1]]


def ratio_figure(table: pd.DataFrame, path: Path, settings: Settings) -> Path | None:
    """Dot plot of new/base ratios per case, coloured by verdict, with the floor shaded."""
    from attnbench.reports.plots import DPI, plt, sns

    compared = table[table["ratio"].notna()]
    if compared.empty:
        return None
    labels = compared["impl"] + " · " + compared["workload"]
    figure, axis = plt.subplots(figsize=(8, 0.28 * len(compared) + 1.6))
    colours = {"faster": "#137333", "slower": "#b3261e", "same": "#777777", "unclear": "#e8a317"}
    sns.scatterplot(x=compared["ratio"].to_numpy(), y=labels.to_numpy(), hue=compared["verdict"].to_numpy(),
                    palette=colours, ax=axis, s=30)  # fmt: skip
    axis.axvspan(1 - settings.threshold, 1 + settings.threshold, color="#dddddd", alpha=0.6, zorder=0)
    axis.axvline(1, color="black", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xlabel("new / base median (< 1 is faster)")
    axis.tick_params(axis="y", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return path


COMPARE_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>attnbench compare</title>
<style>body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1200px;padding:0 1rem}
table{border-collapse:collapse;font-size:.82rem}th,td{border:1px solid #ddd;padding:.25rem .45rem}
th{background:#f4f4f6}.slower{color:#b3261e;font-weight:600}.faster{color:#137333;font-weight:600}
img{max-width:100%}</style></head><body>
<h1>attnbench compare</h1>
<p>base: <code>{{ base }}</code><br>new: <code>{{ new }}</code></p>
<p>{{ summary }}</p>
{% if image %}<img src="data:image/png;base64,{{ image }}" alt="new/base ratio per case">{% endif %}
<table><thead><tr><th>impl</th><th>workload</th><th>verdict</th><th>new/base</th><th>p-value</th>
<th>base ms</th><th>new ms</th><th>note</th></tr></thead><tbody>
{% for r in rows %}<tr><td>{{ r.impl }}</td><td>{{ r.workload }}</td><td class="{{ r.verdict }}">{{ r.verdict }}</td>
<td>{{ r.ratio }}</td><td>{{ r.p_value }}</td><td>{{ r.base_ms }}</td><td>{{ r.new_ms }}</td><td>{{ r.note }}</td></tr>
{% endfor %}</tbody></table>
<p>Made with: <code>{{ command }}</code></p></body></html>
"""


def summary_line(table: pd.DataFrame, settings: Settings) -> str:
    counts = table["verdict"].value_counts()
    parts = [f"{counts.get(v, 0)} {v}" for v in (*VERDICTS, "missing", "not comparable") if counts.get(v, 0)]
    mean = geometric_mean(table["ratio"])
    gm = f"; geometric-mean new/base {mean:.3f}" if mean is not None else ""
    floor = f" (floor {settings.threshold:.0%}, alpha {settings.alpha:g})"
    return ", ".join(parts) + gm + floor


def write_compare(table: pd.DataFrame, out_dir: Path, base: Path, new: Path, settings: Settings,
                  command: str) -> tuple[Path, Path | None]:  # fmt: skip
    import base64

    import jinja2

    out_dir.mkdir(parents=True, exist_ok=True)
    png = ratio_figure(table, out_dir / "compare.png", settings)
    image = base64.b64encode(png.read_bytes()).decode() if png else None

    def fmt(value: Any, spec: str) -> str:
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)

    rows = [{"impl": r["impl"], "workload": r["workload"], "verdict": r["verdict"], "ratio": fmt(r["ratio"], ".3f"),
             "p_value": fmt(r["p_value"], ".2g"), "base_ms": fmt(r["base_ms"], ".4g"),
             "new_ms": fmt(r["new_ms"], ".4g"), "note": r["note"]} for r in table.to_dict("records")]  # fmt: skip
    html = (
        jinja2.Environment(autoescape=True)
        .from_string(COMPARE_TEMPLATE)
        .render(
            base=str(base),
            new=str(new),
            summary=summary_line(table, settings),
            image=image,
            rows=rows,
            command=command,
        )
    )
    path = out_dir / "compare.html"
    path.write_text(html)
    return path, png
