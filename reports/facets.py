"""How the report's per-workload figures are laid out: which rows share a panel and what goes on x.

Definitions:

* a *family* is the rows that agree on everything but the workload's sizes (``FAMILY``: machine, device,
  dtype, mask, pass, hidden, module);
* its x axis is the first of ``X_AXES`` whose values vary within it (:func:`x_axis`): sequence length
  first, then key length alone, heads, head_dim, batch; ``None`` when nothing varies (every contender has
  one point, drawn as a point per contender on a categorical x);
* a *facet* (one panel) is the rows of a family that agree on every size but the x axis. When x is the
  query length, a key length equal to it moves with it (square attention); when x is heads, the kv heads
  move with them at a fixed group size.

To add an axis (decode's KV length, a model preset's name), put its column into ``X_AXES`` at its rank and,
if it is not a workload size, into ``FAMILY``'s complement via ``SIZES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

X_AXES = ["seq_q", "seq_k", "heads", "head_dim", "batch"]  # the first that varies goes on x
SIZES = ["batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"]
FAMILY = ["machine", "device", "dtype", "mask", "pass", "hidden", "module"]
AXIS_LABELS = {"seq_q": "sequence length (queries)", "seq_k": "key length", "heads": "query heads",
               "head_dim": "head dim", "batch": "batch"}  # fmt: skip


@dataclass(frozen=True)
class Facet:
    title: str
    x: str | None  # a column of X_AXES, or None: one point per contender (categorical x)
    rows: pd.DataFrame


def x_axis(group: pd.DataFrame) -> str | None:
    """The column a group of workloads is drawn against: the first of ``X_AXES`` that varies in it."""
    for axis in X_AXES:
        if axis in group and group[axis].nunique(dropna=False) > 1:
            return axis
    return None


def _size_key(row: Any, x: str | None) -> tuple[Any, ...]:
    """The sizes that tell the facets of a family apart: every size but x (and what moves with x)."""
    key = {size: row[size] for size in SIZES if size != x}
    if x == "seq_q":
        key["seq_k"] = "= seq_q" if row["seq_k"] == row["seq_q"] else row["seq_k"]
    if x == "heads":
        key["kv_heads"] = ("group", row["heads"] // max(1, row["kv_heads"]))
    return tuple(key.items())


def _title(row: Any, x: str | None) -> str:
    """'cpu float32 B1 H8 D64 none fwd' with the x axis' own size left out."""
    heads = f"H{row['heads']}" if row["heads"] == row["kv_heads"] else f"H{row['heads']}/{row['kv_heads']}"
    if x == "heads":
        heads = "" if row["heads"] == row["kv_heads"] else f"group {row['heads'] // max(1, row['kv_heads'])}"
    seq = f"S{row['seq_q']}" if row["seq_q"] == row["seq_k"] else f"S{row['seq_q']}x{row['seq_k']}"
    if x == "seq_q":
        seq = "" if row["seq_q"] == row["seq_k"] else f"Sk{row['seq_k']}"
    elif x == "seq_k":
        seq = f"Sq{row['seq_q']}"
    sizes = {"batch": f"B{row['batch']}", "heads": heads, "seq": seq, "head_dim": f"D{row['head_dim']}"}
    if x in ("batch", "head_dim"):
        del sizes[x]
    parts = [row["device"], row["dtype"], *sizes.values(), row["mask"], row["pass"]]
    hidden, module = row.get("hidden"), row.get("module")
    if hidden is not None and not pd.isna(hidden):
        parts.append(f"h{int(hidden)}")
    if module == "mha":
        parts.append("mha")
    return " ".join(str(p) for p in parts if p)


def facets(ok: pd.DataFrame) -> list[Facet]:
    """Panels for the ok rows, in the order their workloads first appear."""
    found: list[Facet] = []
    family_columns = [c for c in FAMILY if c in ok.columns]
    several_machines = "machine" in ok.columns and ok["machine"].nunique() > 1
    for _, family in ok.groupby(family_columns, sort=False, dropna=False):
        x = x_axis(family)
        keys = [_size_key(r, x) for r in family.to_dict("records")]
        for key in dict.fromkeys(keys):
            rows = family[[k == key for k in keys]]
            facet_x = x if x is not None and rows[x].nunique() > 1 else None  # one size: by contender, not a lone dot
            first = rows.iloc[0].to_dict()
            title = _title(first, facet_x)
            found.append(Facet(f"{first['machine']}\n{title}" if several_machines else title, facet_x, rows))
    return found
