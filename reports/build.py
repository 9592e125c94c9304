"""`attnbench report`: load runs, draw the figures, write the HTML page."""

from __future__ import annotations

from pathlib import Path

from attnbench.errors import UsageError
from attnbench.reports.frames import all_parts, load_runs, machine_label
from attnbench.reports.html import write_report
from attnbench.reports.masks import report_masks
from attnbench.reports.merge import set_warnings
from attnbench.reports.out_folder import claim_report_folder
from attnbench.reports.plots import Roofs, draw_all
from attnbench.reports.summary import status_counts

REPORT_FILES = ("report.html", "*.png", "masks.csv")  # what build_report writes: an earlier report's are cleared


def ceilings_by_key(runs: list) -> dict[tuple[str, str, str], Roofs]:
    """(machine, device, dtype) -> the hardware roofs and the library's rates from each run's meta.json
    (a run made before hardware roofs were measured gets its matmul and copy rates for both)."""
    found: dict[tuple[str, str, str], Roofs] = {}
    for run in runs:
        machine = machine_label(run.meta.get("environment") or {})
        for device, ceiling in (run.meta.get("ceilings") or {}).items():
            copy = float(ceiling.get("copy_gbps") or 0)
            roof_gbps = float(ceiling.get("roof_gbps") or copy)
            roofs = ceiling.get("roof_tflops") or {}
            for dtype, tflops in (ceiling.get("matmul_tflops") or {}).items():
                roof = float(roofs.get(dtype) or tflops)
                found[(machine, device, dtype)] = Roofs(roof, roof_gbps, float(tflops), copy)
    return found


def build_report(
    paths: list[Path], out_dir: Path, baseline: str | None, command: str
) -> tuple[Path, list[Path], str | None, list[str]]:
    """Write report.html and its PNGs (and masks.csv where the run has masks) into ``out_dir``; returns the
    page's path, the PNGs', where no row ran ok (so no time is drawn) a line saying so, and what the runs lack or
    hold twice as shards of one sweep (merge's warnings: the page says them too)."""
    frame, runs = load_runs(paths)
    cases = [index for run in runs for index in range(len(run.frame))]  # in each folder's file, merged ones too
    runs = all_parts(runs)  # a merged folder's runs, each with its environment, ceilings and warnings
    if baseline and not (frame["impl"] == baseline).any():  # a misspelt name would fall back without a word
        known = ", ".join(sorted(set(frame["impl"]))) or "none"
        raise UsageError(f"--baseline {baseline!r}: no row of it in the runs; allowed: a contender they hold ({known})")
    claim_report_folder(out_dir, "report.html", REPORT_FILES)  # after every check: bad input leaves a report as it was
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = draw_all(frame, out_dir, baseline, ceilings_by_key(runs)) + report_masks(frame, out_dir)
    gaps = set_warnings(runs)
    html = write_report(frame, runs, figures, out_dir, baseline, command, cases, gaps)
    empty = None
    if not (frame["status"] == "ok").any():
        why = f"({status_counts(frame)}), so the page draws no time; its tables say why"
        empty = "no row ran ok " + (why if len(frame) else "(the runs hold no row: they stopped before their first)")
    return html, [path for _, path in figures], empty, gaps
