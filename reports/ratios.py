"""One contender against its peers within one run: time and memory ratios per case, and optional gates.

``attnbench ratios RUN --impl fused_cpu --vs sdpa_flash,bmm`` pairs each ``fused_cpu`` row with the
rows of the same case (every workload column equal, machine included) for each peer. With ``--best``
the peers are one: per case, the fastest of them that ran ``ok``. Ratios are of medians, both
measured in the same run, so machine drift between runs does not enter them.

Gates (``--max-time-ratio``, ``--min-speedup``, ``--max-mem-ratio``, ``--min-pct-of-peak``) turn the
table into a check: a case fails when a bound is missed, or when a row the bound reads is not ``ok`` (an
incorrect or missing row cannot pass a performance claim): both rows for a bound on the pair, the contender's
alone for one on the contender (``--min-pct-of-peak``, ``--min-pct-of-matmul``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from attnbench.errors import UsageError
from attnbench.reports.frames import CASE_KEY, workload_label
from attnbench.workload.axes import BY_NAME, WORKLOAD_AXES

WORKLOAD_KEY = [c for c in CASE_KEY if c != "impl"]
PAIR_KEY = [*WORKLOAD_KEY, "run"]  # a merged folder may hold one case from several runs: pair within a run


@dataclass(frozen=True)
class Bounds:
    max_time_ratio: float | None = None  # impl median / peer median
    min_speedup: float | None = None  # peer median / impl median
    max_mem_ratio: float | None = None  # impl peak_mem_mb / peer peak_mem_mb
    min_pct_of_peak: float | None = None  # impl's pct_of_peak (% of the hardware roof)
    min_pct_of_matmul: float | None = None  # impl's pct_of_matmul (% of torch's matmul rate)

    def any(self) -> bool:
        return any(
            v is not None
            for v in (
                self.max_time_ratio,
                self.min_speedup,
                self.max_mem_ratio,
                self.min_pct_of_peak,
                self.min_pct_of_matmul,
            )
        )


def select(frame: pd.DataFrame, where: list[str]) -> pd.DataFrame:
    """Rows matching every ``column=value`` (values compared as text, so seq_q=4096 works)."""
    for condition in where:
        column, sep, value = condition.partition("=")
        if not sep or column not in WORKLOAD_KEY:
            allowed = ", ".join(c for c in WORKLOAD_KEY if c != "machine")
            raise UsageError(f"--where {condition!r}: expected COLUMN=VALUE with COLUMN one of {allowed}")
        frame = frame[frame[column].astype(str) == value]
    return frame


def require(frame: pd.DataFrame, names: list[str]) -> None:
    """Every named contender has rows in the run, or a one-line usage error naming those it has."""
    present = set(frame["impl"])
    for name in names:
        if name not in present:
            raise UsageError(f"contender {name!r} has no row in this run (it has: {', '.join(sorted(present))})")


def ratio_table(
    frame: pd.DataFrame,
    impl: str,
    peers: list[str],
    best: bool = False,
    peer_frame: pd.DataFrame | None = None,
    unpaired: tuple[str, ...] = (),
) -> pd.DataFrame:
    """One row per (case of ``impl``, peer): medians, ratios, peak memory and both statuses. The peers' rows
    come from ``peer_frame`` (default: ``frame``) and are paired on every workload column but ``unpaired``
    (``--peer-where``: e.g. fused_cpu in bfloat16 against fused_cpu in float32, the same shape)."""
    # an axis that follows an unpaired one (kv_dtype follows dtype) pairs on whether it still follows it
    following = {
        a.column: BY_NAME[a.follows].column
        for a in WORKLOAD_AXES
        if a.follows and BY_NAME[a.follows].column in unpaired and a.column not in unpaired
    }

    def followed(rows: pd.DataFrame) -> pd.DataFrame:
        return rows.assign(**{f"{column} follows": rows[column] == rows[other] for column, other in following.items()})

    ours = followed(frame[frame["impl"] == impl])
    key = [f"{c} follows" if c in following else c for c in PAIR_KEY if c not in unpaired]
    columns = [*key, "impl", "status", "median_ms", "peak_mem_mb"]
    peer_rows = followed(frame if peer_frame is None else peer_frame)
    theirs = peer_rows.loc[peer_rows["impl"].isin(peers), columns]
    if best:  # one peer per case: the fastest that ran ok, else any (its status then says why not)
        ranked = theirs.assign(ok=theirs["status"] != "ok").sort_values(["ok", "median_ms"])
        groups = [ranked.drop_duplicates(key).drop(columns="ok")]
    else:  # every peer for every case, even one the peer has no row for (status "missing")
        groups = [theirs[theirs["impl"] == peer] for peer in peers]
    merged = []
    for peer, group in zip(["(best)"] if best else peers, groups, strict=True):
        pairs = ours.merge(group, on=key, how="left", suffixes=("", "_peer"))
        merged.append(pairs.assign(impl_peer=pairs["impl_peer"].fillna("(none)" if best else peer)))
    pairs = pd.concat(merged, ignore_index=True)
    table = pd.DataFrame(
        {
            "workload": [workload_label(r) for r in pairs.to_dict("records")],
            "peer": pairs["impl_peer"],
            "impl_ms": pairs["median_ms"],
            "peer_ms": pairs["median_ms_peer"],
            "time_ratio": pairs["median_ms"] / pairs["median_ms_peer"],
            "speedup": pairs["median_ms_peer"] / pairs["median_ms"],
            "impl_mb": pairs["peak_mem_mb"],
            "peer_mb": pairs["peak_mem_mb_peer"],
            "mem_ratio": pairs["peak_mem_mb"] / pairs["peak_mem_mb_peer"],
            "pct_of_peak": pairs["pct_of_peak"],
            "pct_of_matmul": pairs["pct_of_matmul"],
            "status": pairs["status"],
            "peer_status": pairs["status_peer"].fillna("missing"),
        }
    )
    return table.reset_index(drop=True)


def _missed(value: float, bound: float | None, above: bool) -> bool:
    if bound is None:
        return False
    if value is None or not math.isfinite(value):
        return True
    return value < bound if above else value > bound


def failures(table: pd.DataFrame, bounds: Bounds) -> list[tuple[int, str]]:
    """(table row, line) for each missed bound. A bound on the pair (time, speedup, memory) needs both rows ok; a
    bound on the contender alone (% of peak, % of matmul) needs its row ok and is judged once per case, whatever the
    peer's status (a peer that does not run a case once failed a roofline gate it has no part in)."""
    if not bounds.any():
        return []
    on_pair = any(b is not None for b in (bounds.max_time_ratio, bounds.min_speedup, bounds.max_mem_ratio))
    on_own = bounds.min_pct_of_peak is not None or bounds.min_pct_of_matmul is not None
    lines, judged_own = [], set()
    for index, row in enumerate(table.to_dict("records")):
        where = f"{row['workload']} vs {row['peer']}"
        if on_pair and (row["status"] != "ok" or row["peer_status"] != "ok"):
            lines.append((index, f"{where}: status {row['status']} / {row['peer_status']}, both must be ok"))
            continue
        if on_pair:
            for name, value, bound, above in (
                ("time ratio", row["time_ratio"], bounds.max_time_ratio, False),
                ("speedup", row["speedup"], bounds.min_speedup, True),
                ("memory ratio", row["mem_ratio"], bounds.max_mem_ratio, False),
            ):
                if _missed(value, bound, above):
                    lines.append((index, f"{where}: {name} {value:.3g} {'<' if above else '>'} {bound:g}"))
        if not on_own or row["workload"] in judged_own:
            continue
        judged_own.add(row["workload"])
        if row["status"] != "ok":
            lines.append((index, f"{row['workload']}: status {row['status']}, must be ok"))
            continue
        for name, value, bound in (
            ("% of peak", row["pct_of_peak"], bounds.min_pct_of_peak),
            ("% of matmul", row["pct_of_matmul"], bounds.min_pct_of_matmul),
        ):
            if _missed(value, bound, True):
                lines.append((index, f"{row['workload']}: {name} {value:.3g} < {bound:g}"))
    return lines


def format_table(table: pd.DataFrame) -> str:
    shown = table.copy()
    formats = {
        "impl_ms": ".4g",
        "peer_ms": ".4g",
        "time_ratio": ".3f",
        "speedup": ".2f",
        "impl_mb": ".3g",
        "peer_mb": ".3g",
        "mem_ratio": ".3g",
        "pct_of_peak": ".1f",
        "pct_of_matmul": ".1f",
    }
    for column, spec in formats.items():
        shown[column] = shown[column].map(lambda v, s=spec: "" if v is None or pd.isna(v) else format(v, s))
    return shown.to_string(index=False)
