"""The self-contained HTML report: Jinja2 with autoescaping (every string from a contender, a plugin or
an error message is shown as text), figures embedded as base64 PNGs, the table of every row made by itables
(DataTables, embedded; see ``table.py``), a little inline JavaScript to sort the small tables, nothing
fetched from the network."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import pandas as pd

import attnbench
from attnbench.reports.frames import Run, environment_line, labels, machine_label, workload_label
from attnbench.reports.out_folder import write_page
from attnbench.reports.plots import speedup_table
from attnbench.reports.pooled import RUNS, code_differences, pool_runs
from attnbench.reports.ranking import LEGEND, TIE, Ranking, fastest_rows, rank
from attnbench.reports.summary import merged_reasons
from attnbench.reports.table import results_table_html
from attnbench.runner._noise import above_roof
from attnbench.workload.axes import features_asked

CAPTIONS = {
    "latency.png": "median time per call (log axis where times span 3× or more; with several runs of one machine, the "
    "median of a contender's processes in all of them, as in the headline); one colour and marker per contender "
    "throughout; contenders whose lines coincide are drawn nested, the first widest.",
    "tflops.png": "achieved TFLOP/s from the shared FLOP count; the solid line is the hardware roof (a CPU's FMA "
    "kernel, a GPU's datasheet), the dashed one torch's measured matmul, which a kernel may pass.",
    "memory.png": "working memory one call needs beyond inputs and output, measured in a separate pass; contenders "
    "that need the same are drawn nested, the first widest.",
    "speedup.png": "baseline median / contender median per workload; green is faster than the baseline. The baseline "
    "is --baseline where it ran, else each row's fastest torch contender (named in the row); with several runs of "
    "one machine each contender counts the median of its processes in all of them, as the headline ranks them. A "
    "blank cell: that contender has no ok row there (the status table says why); a workload with no ok baseline "
    "(no torch contender ran ok, nor --baseline) has no row.",
    "roofline.png": "achieved TFLOP/s against arithmetic intensity: the solid line is the hardware roof (own FMA "
    "and bandwidth kernels — the higher of a read stream and STREAM's triad, as the ceilings table below says — or the "
    "GPU's datasheet), the dashed one torch's matmul and copy rates.",
    "decode.png": "decode steps: minimum bytes per second (gbps: q, the KV cache read, o) against the cache's length; "
    "dashed: the bandwidth roof "
    "(as the roofline's: measured on a CPU, the datasheet's on a GPU), the right axis in % of it; hollow markers: a "
    "row whose cache fits in the cache in front of memory (cache_resident) with the caches flushed before each call "
    "(cold_median_ms), as a model's layer finds it, beside its warm figure.",
    "decode_ms.png": "decode steps: the median time per step against the KV cache's length, in the panels of the "
    "bandwidth figure above (log axis where times span 3× or more); hollow markers as there: cold.",
    "masks.png": "each mask of the run on 128 × 128 tiles, as a kernel that skips blocks meets it (one sequence where "
    "the batch's sequences share the mask, so its label has no batch): empty tiles "
    "skipped, partial ones computed whole and masked, full ones computed plainly; work = pairs computed over visible. "
    "TFLOP/s count the visible pairs only, so a kernel at work 1.5× does 1.5× the credited work (masks.csv: "
    "every mask at 128 × 128, 128 × 64 and each tile a contender's choice column names; attnbench masks --tile for "
    "others).",
}


def _features(rows: pd.DataFrame) -> str:
    """The workload features a group of rows asks for (new masks, score modifiers, paged KV), e.g.
    'mask sliding_window, score_mod alibi'; '' when none — so the table shows who lacks which feature."""
    found = dict.fromkeys(feature for row in rows.to_dict("records") for feature in features_asked(row))
    return ", ".join(found)


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


NOT_RANKED = ("stalled", "incorrect")  # timed, never ranked: the headline says how many contenders of a row were


def _headline(frame: pd.DataFrame, baseline: str | None) -> list[dict[str, Any]]:
    """A row per (machine, workload) with an ok, stalled or incorrect row: the fastest of its ok rows, as the run's
    summary ranks them — a case in several runs of one machine pooled per contender (``pooled.py``), as the figures draw
    it. A stalled or incorrect row is not ranked, so where a contender only stalled or was incorrect the row says how
    many (after a stall the fastest is only the fastest of those that ran clean; an incorrect one may have been
    faster, wrongly) and a workload with no ok row has no fastest."""
    ranked = frame[frame["status"].isin(["ok", *NOT_RANKED])]
    if ranked.empty:
        return []
    ranked = ranked.assign(workload=labels(ranked))
    ok = pool_runs(ranked[ranked["status"] == "ok"])
    speedups, bases = speedup_table(ok, baseline) if not ok.empty else (pd.DataFrame(), pd.Series(dtype=str))
    rows: list[dict[str, Any]] = []
    for (machine, workload), both in ranked.groupby(["machine", "workload"], sort=False):
        group = ok[(ok["machine"] == machine) & (ok["workload"] == workload)]
        left_out = {
            status: len(set(both.loc[both["status"] == status, "impl"]) - set(group["impl"])) for status in NOT_RANKED
        }
        stalled, not_ranked = left_out["stalled"], ", ".join(f"{n} {status}" for status, n in left_out.items() if n)
        if group.empty:
            blank = dict.fromkeys(
                ("fastest", "median", "tflops", "gbps", "runner_up", "margin", "baseline", "speedup"), ""
            )
            everyone = f"all {stalled} stalled" if not left_out["incorrect"] else not_ranked
            rows.append(
                {"machine": machine, "workload": workload, **blank, "within_noise": False, "over_roof": False}
                | {"stalled": stalled, "not_ranked": f"no ranked contender: {everyone}", "runs": 0}
            )
            continue
        ranking = rank(group)
        best = fastest_rows(group).iloc[0]
        key = f"{machine} · {workload}" if ok["machine"].nunique() > 1 else workload
        speed = speedups.get(key, {}).get(best["impl"]) if key in speedups else None
        rows.append(
            {
                "machine": machine,
                "workload": workload,
                "fastest": ranking.label(),
                "median": _fmt(best["median_ms"]),
                "tflops": _fmt(best["tflops"]),
                "gbps": _fmt(best.get("gbps")),  # a decode step's figure: it is bound by the bytes it reads
                "runner_up": ranking.runner_up or "",
                "margin": _margin(ranking),
                "within_noise": not ranking.clear,
                "over_roof": best.name in above_roof(group).index,  # no kernel outruns the hardware
                "baseline": bases.get(key, ""),
                "speedup": "" if speed is None else f"{speed:.2f}×",
                "stalled": stalled,
                "not_ranked": f"({not_ranked}, not ranked)" if not_ranked else "",
                "runs": int(best[RUNS]),  # the runs the fastest's median pools (pooled.py)
            }
        )
    return rows


def _undrawn_machines(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Where the report holds several machines but only some have an ok row: those drawn and those not. The
    figures name a panel's machine only where they draw more than one, so a report of a ×2-thread run that all
    stalled beside a ×1-thread one drew the ×1 run's panels without saying whose they were."""
    machines = list(dict.fromkeys(frame["machine"]))
    drawn = list(dict.fromkeys(frame.loc[frame["status"] == "ok", "machine"]))
    if len(machines) < 2 or not drawn or len(drawn) == len(machines):
        return {}
    return {"drawn": drawn, "not_drawn": [m for m in machines if m not in drawn]}


def _margin(ranking: Ranking) -> str:
    """The runner-up's time over the fastest's, and whether the runner-up is within its noise (ranking.py)."""
    if ranking.margin is None:
        return ""
    return f"{ranking.margin:.2f}×" + (f", {TIE} within noise" if ranking.runner_up in ranking.within else "")


def _missing(frame: pd.DataFrame) -> list[dict[str, Any]]:
    bad = frame[frame["status"] != "ok"]
    bad = bad.assign(reason=merged_reasons(bad))  # a contender's stalled rows once, their percentages a range
    rows = []
    for (status, impl, reason), group in bad.groupby(["status", "impl", "reason"], sort=False, dropna=False):
        rows.append(
            {
                "status": status,
                "impl": impl,
                "reason": reason,
                "count": len(group),
                "example": workload_label(group.iloc[0]),
                "feature": _features(group),
            }
        )
    return rows


CHECKED = ("ok", "incorrect", "stalled")  # each checked against float64 before it was timed


def _accuracy(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per contender and dtype, the cases checked against the float64 reference: every row that carries a check
    (ok, incorrect, and stalled — a stalled row's time is not ranked, but its output was checked), the incorrect
    ones among them, the worst error and the tolerance."""
    checked = frame[frame["status"].isin(CHECKED) | frame["atol"].notna()]
    rows = []
    for (impl, dtype), group in checked.groupby(["impl", "dtype"], sort=True):
        rows.append(
            {
                "impl": impl,
                "dtype": dtype,
                "checked": len(group),
                "incorrect": int((group["status"] == "incorrect").sum()),
                "worst": _fmt(group["max_abs_err"].max()),
                "tolerance": _fmt(group["atol"].max()),
            }
        )
    return rows


def bandwidth_during_run(meta: dict[str, Any], device: str) -> str:
    """The bandwidth measured before and after the sweep (bandwidth_watch.py), as one cell: each stream's
    range and spread, the floor it is held to, and when it was measured; or why it was not."""
    entries = [e for e in meta.get("bandwidth_during_run") or [] if e.get("device", "cpu") == device]
    found = meta.get("bandwidth_spread") or {}
    if not entries:
        return str(found.get("note", "")) if device == "cpu" else ""
    parts = []
    for stream, label in (("read_gbps", "read"), ("triad_gbps", "triad")):
        values = [e[stream] for e in entries if e.get(stream)]
        if values:
            parts.append(f"{label} {min(values):.3g}–{max(values):.3g} (spread {found.get(stream, 0):.0%})")
    floor = found.get("floor")
    verdict = (
        (f"; moved more than the {floor:.0%} floor" if found.get("moved") else f"; within the {floor:.0%} floor")
        if floor is not None
        else ""
    )
    times = ", ".join(f"{e.get('when')} {str(e.get('time', ''))[11:19]}" for e in entries)
    return f"{', '.join(parts)}{verdict} ({times})"


def _ceilings(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per device and dtype: the hardware roofs with their sources, the library's rates, and the
    bandwidth measured during the run beside the cached roof."""
    rows = []
    for device, c in (meta.get("ceilings") or {}).items():
        during = bandwidth_during_run(meta, device)
        for dtype, matmul in (c.get("matmul_tflops") or {}).items():
            rows.append(
                {
                    "device": device,
                    "dtype": dtype,
                    "roof": _fmt((c.get("roof_tflops") or {}).get(dtype)),
                    "roof_source": (c.get("roof_source") or {}).get(dtype, ""),
                    "matmul": _fmt(matmul),
                    "roof_gbps": _fmt(c.get("roof_gbps")),
                    "bandwidth_source": c.get("bandwidth_source", ""),
                    "copy_gbps": _fmt(c.get("copy_gbps")),
                    "during_run": during,
                }
            )
    return rows


def _run_block(run: Run) -> dict[str, Any]:
    meta = run.meta
    environment = dict(meta.get("environment") or {})
    keys = ("ceilings", "cpu_allocator", "suite", "start_time", "end_time")
    details = {"environment": environment, **{key: meta.get(key) for key in keys}}
    return {
        "name": run.name,
        "machine": machine_label(environment),
        "summary": environment_line(meta),
        "command": meta.get("command", "(unknown)"),
        "warnings": meta.get("warnings") or [],
        "ceilings": _ceilings(meta),
        "environment": json.dumps(
            {k: v for k, v in details.items() if v is not None}, indent=2, default=str, ensure_ascii=False
        ),
    }


LEGIBLE = 0.75  # a figure is never drawn below this share of its pixel size: its 7-point labels stay readable


def _legible_width(png: Path) -> int:
    """The narrowest a figure is drawn on the page, in CSS pixels: ``LEGIBLE`` × its width (a PNG's header holds it at
    bytes 16–20). In an 800-pixel window the figures shrank to 43 % of their size and their labels to 4 pixels: below
    this width a figure scrolls sideways in its box instead (the page's CSS)."""
    return round(LEGIBLE * int.from_bytes(png.read_bytes()[16:20], "big"))


def write_report(
    frame: pd.DataFrame,
    runs: list[Run],
    figures: list[tuple[str, Path]],
    out_dir: Path,
    baseline: str | None,
    report_command: str,
    cases: list[int] | None = None,
    gaps: list[str] | None = None,
) -> Path:
    template_text = resources.files("attnbench.reports").joinpath("templates/report.html.j2").read_text()
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = environment.from_string(template_text)
    table_bundle, results_table = results_table_html(frame, cases)
    html = template.render(
        runs=[_run_block(run) for run in runs],
        n_rows=len(frame),
        gaps=gaps or [],
        version=attnbench.__version__,
        generated=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        headline=_headline(frame, baseline),
        pooled_code=code_differences(runs),
        undrawn=int((frame["status"] == "stalled").sum()),
        undrawn_machines=_undrawn_machines(frame),
        tie_legend=LEGEND,
        figures=[
            {
                "title": title,
                "caption": CAPTIONS.get(path.name, ""),
                "data": base64.b64encode(path.read_bytes()).decode(),
                "min_width": _legible_width(path),
            }
            for title, path in figures
        ],
        table_bundle=markupsafe.Markup(table_bundle),
        results_table=markupsafe.Markup(results_table),
        missing=_missing(frame),
        accuracy=_accuracy(frame),
        report_command=report_command,
    )
    path = out_dir / "report.html"
    write_page(path, html)
    return path
