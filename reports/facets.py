"""How the report's per-workload figures are laid out: which rows share a panel and what goes on x.

Definitions:

* a *family* is the rows that agree on everything but the workload's sizes (``FAMILY``: machine, device,
  dtype, mask, pass, hidden, module, and the feature tags of ``attnbench.workload.axes.tags``: window, sinks, KV type,
  the model preset and its kind of layer …, which also end the panel's title);
* its x axis is the first of ``X_AXES`` whose values vary within it (:func:`x_axis`): sequence length
  first, then key length alone, heads, head_dim, batch; ``None`` when nothing varies (every contender has
  one point, drawn as a point per contender on a categorical x);
* a *facet* (one panel) is the rows of a family that agree on every size but the x axis. When x is the
  query length, a key length equal to it moves with it (square attention); when x is heads, the kv heads
  move with them at a fixed group size. A square case alone at its size (Sq = Sk = 1024) beside a panel of
  the same family at that key length (Sk 1024) is that panel's point at Sq 1024, not a panel of its own.

To add an axis (decode's KV length, a model preset's name), put its column into ``X_AXES`` at its rank and,
if it is not a workload size, into ``FAMILY``'s complement via ``SIZES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from attnbench.workload.axes import tags

X_AXES = ["seq_q", "seq_k", "heads", "head_dim", "batch"]  # the first that varies goes on x
SIZES = ["batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim"]
FAMILY = ["machine", "device", "dtype", "mask", "pass", "hidden", "module"]
AXIS_LABELS = {
    "seq_q": "sequence length (queries)",
    "seq_k": "key length",
    "heads": "query heads",
    "head_dim": "head dim",
    "batch": "batch",
}


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
    return " ".join(str(p) for p in parts if p) + tags(row)


def facets(ok: pd.DataFrame) -> list[Facet]:
    """Panels for the ok rows, in the order their workloads first appear."""
    found: list[Facet] = []
    ok = ok.assign(_features=[tags(r) for r in ok.to_dict("records")])
    family_columns = [c for c in [*FAMILY, "_features"] if c in ok.columns]
    several_machines = "machine" in ok.columns and ok["machine"].nunique() > 1
    for _, family in ok.groupby(family_columns, sort=False, dropna=False):
        family = family.drop(columns="_features")
        x = x_axis(family)
        records = family.to_dict("records")
        own = [_size_key(r, x) for r in records]
        keys = _square_points_join(own, records) if x == "seq_q" else own
        for key in dict.fromkeys(keys):
            rows = family[[k == key for k in keys]]
            facet_x = x if x is not None and rows[x].nunique() > 1 else None  # one size: by contender, not a lone dot
            # the title from a row of the panel's own sizes (not a square point that joined it)
            first = next(r for r, mine, k in zip(records, own, keys, strict=True) if k == key and mine == key)
            title = _title(first, facet_x)
            found.append(Facet(f"{first['machine']}\n{title}" if several_machines else title, facet_x, rows))
    return found


def _square_points_join(keys: list[tuple[Any, ...]], records: list[dict[Any, Any]]) -> list[tuple[Any, ...]]:
    """With x the query length: a square facet of one size S (Sq = Sk = S) whose family also has a facet at key
    length S takes that facet's key, so the point is drawn where its panel has the tick for it."""
    square = [i for i, key in enumerate(keys) if dict(key).get("seq_k") == "= seq_q"]
    sizes = {keys[i]: {records[j]["seq_q"] for j in square if keys[j] == keys[i]} for i in square}
    joined = list(keys)
    for i in square:
        (size, *more) = sizes[keys[i]]
        target = tuple((name, size if name == "seq_k" else value) for name, value in keys[i])
        if not more and target in keys:
            joined[i] = target
    return joined
