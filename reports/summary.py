"""The short table printed at the end of a run: median ms per workload × contender, or why not."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from attnbench.reports.frames import workload_label
from attnbench.reports.ranking import LEGEND, rank
from attnbench.runner._noise import above_roof
from attnbench.runner.results import CASE_COLUMNS

GROUP = CASE_COLUMNS[1:]  # the workload columns that identify a case


def _cell(row: pd.Series) -> str:
    if row["status"] == "ok":
        return f"{row['median_ms']:.3g}"
    if row["status"] == "incorrect":
        return f"{row['median_ms']:.3g}!"
    if row["status"] == "stalled":
        return f"{row['median_ms']:.3g}~"
    return row["status"]


def summary_table(frame: pd.DataFrame) -> str:
    """Median ms per workload (rows) and contender (columns); '!' marks an incorrect result's time, '~' a time
    taken while the machine stalled (status ``stalled``): both shown, neither ranked in ``fastest``. Where others
    are within the noise of the fastest (``ranking.py``), ``fastest`` names them after it, ``A ≈ B``, and a
    line under the table says what ``≈`` means.

    Cells that are not times name the status; contenders unavailable on every row are left out."""
    if frame.empty:
        return "(no cases)"
    cells = frame.assign(cell=frame.apply(_cell, axis=1))
    cells = cells.assign(hidden=cells["hidden"].fillna(0), module=cells["module"].fillna("core"))
    table = cells.pivot_table(index=GROUP, columns="impl", values="cell", aggfunc="first", sort=False)
    # Contenders unavailable everywhere only add columns of "unavailable"; their reason is listed below.
    shown = [impl for impl in dict.fromkeys(frame["impl"]) if (frame[frame.impl == impl].status != "unavailable").any()]
    if not shown:  # nothing ran: the lines under the table say why
        return f"(no contender ran on any of the {len(table)} workloads)"
    table = table.reindex(columns=shown)
    ok = cells[cells["status"] == "ok"]
    stalled = cells[cells["status"] == "stalled"].groupby(GROUP, sort=False).size().to_dict()
    tied = False
    if not ok.empty or stalled:
        rankings = {key: rank(rows) for key, rows in ok.groupby(GROUP, sort=False)}
        tied = any(not r.clear for r in rankings.values())
        over = _over_roof(ok)
        labels = {
            key: r.label()
            + (" (above the hardware roof: a measurement defect, see the warning)" if (key, r.fastest) in over else "")
            + (f" ({stalled[key]} stalled, not ranked)" if key in stalled else "")
            for key, r in rankings.items()
        }  # the fastest of the clean rows only: where others stalled, the label says it did not beat them
        for key, count in stalled.items():  # a workload whose every timed row stalled: no fastest, and why
            labels.setdefault(key, f"no ranked contender: all {count} stalled")  # type: ignore[arg-type]
        table["fastest"] = pd.Series(labels).reindex(table.index)
    table = table.fillna("")
    table.index = [_label(key) for key in table.index]
    table.columns.name = None
    return table.to_string() + (f"\n{LEGEND}" if tied else "")


def _over_roof(ok: pd.DataFrame) -> set[tuple[Any, str]]:
    """(workload key, contender) of the rows above 100 % of the hardware roof: no kernel outruns the hardware, so
    such a row's time or FLOP count is wrong, and a `fastest` it wins says so."""
    return {(tuple(row[GROUP]), row["impl"]) for _, row in above_roof(ok).iterrows()}


def _label(key: tuple) -> str:
    return workload_label(dict(zip(GROUP, key, strict=True)))


def status_counts(frame: pd.DataFrame) -> str:
    counts = frame["status"].value_counts()
    return ", ".join(f"{count} {status}" for status, count in counts.items())


_PERCENT = re.compile(r"\d+(?:\.\d+)?%")
# Any number standing alone ("in 11 of 35 rounds (median 515)", "48%"), not one inside a word (D64, fp8, sm_90).
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%?(?![\w])")
_REPEAT = re.compile(r"^repeat (\d+) of (\d+): ")  # a --repeat run's row: which repeat stalled or failed


def _numbers_of(status: str) -> re.Pattern[str]:
    """The numbers a status' reasons are merged over: a stall's — its rounds, medians and shares, the machine's
    figures, not the case's — every number; any other status only its percentages (a skipped case's predicted
    0.5 s and 8.1 s are two reasons, each with its own example)."""
    return _NUMBER if status == "stalled" else _PERCENT


def _range(values: list[str]) -> str:
    suffix = "%" if values[0].endswith("%") else ""
    numbers = [float(value.rstrip("%")) for value in values]
    low, high = min(numbers), max(numbers)
    return f"{low:g}{suffix}" if low == high else f"{low:g}–{high:g}{suffix}"


def merged_reasons(rows: pd.DataFrame) -> pd.Series:
    """Each row's reason on one line (a run before reasons were made one line kept its line breaks), with its
    numbers replaced by their range (:func:`_numbers_of`: a stall's every number, another status' percentages),
    and a ``--repeat`` run's "repeat N of M" by the repeats, over the same contender's and status' reasons that
    differ only there: a contender's stalled rows read "waited for a core 48–50% of their time" once, "in 11–26 of
    35–73 rounds" once, "repeats 1, 2 of 3: …" once, not a line per figure or repeat."""
    flat = rows["reason"].fillna("").astype(str).map(lambda text: " ".join(text.split()))
    numbers = rows["status"].astype(str).map(_numbers_of)
    shapes = pd.Series(
        [
            pattern.sub(lambda m: "#%" if m.group().endswith("%") else "#", _REPEAT.sub(r"repeat # of \2: ", text))
            for text, pattern in zip(flat, numbers, strict=True)
        ],
        index=flat.index,
    )
    merged = flat.copy()
    for (_, status, _), same in flat.groupby([rows["impl"], rows["status"], shapes], sort=False):
        if len(set(same)) == 1:
            continue
        pattern = _numbers_of(str(status))
        repeats = sorted({int(match.group(1)) for text in same if (match := _REPEAT.match(text))})
        bodies = [_REPEAT.sub("", text) for text in same]
        found = [pattern.findall(text) for text in bodies]
        if len({len(f) for f in found}) != 1:
            continue
        ranges = [_range(list(slot)) for slot in zip(*found, strict=True)]
        parts = pattern.split(bodies[0])  # the text around the numbers, one more part than them
        body = "".join(part + value for part, value in zip(parts, [*ranges, ""], strict=True))
        first = _REPEAT.match(same.iloc[0])
        if first is not None:
            numbers_said = ", ".join(map(str, repeats))
            body = f"repeat{'s' if len(repeats) > 1 else ''} {numbers_said} of {first.group(2)}: {body}"
        merged[same.index] = body
    return merged


CASE_FAILURES = ("incorrect", "error", "timeout", "oom")  # what went wrong in a case: its lines name the case
SHOWN_CASES = 3  # a failure shared by more cases names this many, then counts the rest


def non_ok_reasons(frame: pd.DataFrame) -> str:
    """One line per distinct (contender, status, reason) that is not ok (see :func:`merged_reasons`), a
    contender's lines together. A case's
    failure (:data:`CASE_FAILURES`) names its case as the table above labels it (``bmm cpu float32 B2 H8/2 S128
    D64 padding fwd: incorrect — …``), or the cases that share it (``bmm (2 cases: …; …): error — …``): a
    contender that fails only its GQA or padded workloads says which."""
    bad = frame[frame["status"] != "ok"]
    bad = bad.assign(reason=merged_reasons(bad))
    # a contender's lines together, in the order its first row came (a sweep's stalls of one contender, several
    # reasons, were spread through the list between other contenders')
    order = {impl: k for k, impl in enumerate(dict.fromkeys(bad["impl"]))}
    bad = bad.sort_values("impl", key=lambda impls: impls.map(order), kind="stable")
    lines = []
    for (impl, status, reason), rows in bad.groupby(["impl", "status", "reason"], sort=False):
        if status not in CASE_FAILURES:
            lines.append(f"  {impl}: {status} — {reason}")
            continue
        labels = list(dict.fromkeys(workload_label(row) for _, row in rows.iterrows()))
        if len(labels) == 1:
            lines.append(f"  {impl} {labels[0]}: {status} — {reason}")
            continue
        shown = "; ".join(labels[:SHOWN_CASES])
        more = f" and {len(labels) - SHOWN_CASES} more" if len(labels) > SHOWN_CASES else ""
        lines.append(f"  {impl} ({len(labels)} cases: {shown}{more}): {status} — {reason}")
    return "\n".join(lines)
