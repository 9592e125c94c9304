"""``attnbench masks``: how each workload's mask falls on a kernel's tiles, as a table (``masks.csv``) and a
picture (``masks.png``): per mask and tile size, the tiles a block-skipping kernel skips (empty), masks
(partial) and computes plainly (full), and its work over the visible pairs (``attnbench.workload.tiles``).
``attnbench report`` draws the same for a run's masks (:func:`report_masks`, read back from its rows).

A mask's shape decides what a kernel can skip, so this is the first thing to read beside a masked case's
time: a 256-key window at 128 × 128 tiles computes 1.5× its visible pairs, a causal S4096 1.03×."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from attnbench.errors import UsageError
from attnbench.reports.figure_layout import DPI, TITLE_SIZE, finish, legend_right, panel_grid
from attnbench.workload import Workload
from attnbench.workload.axes import BY_NAME, is_decode, tags
from attnbench.workload.tiles import EMPTY, FULL, PARTIAL, count_tiles, sequence_ranges, sequence_states

# The report's tiles (those of `attnbench masks`' default --tile); its figure draws the first, a Hopper kernel's.
REPORT_TILES = [(128, 128), (128, 64)]
MAX_PANELS = 24  # the picture's panels, at most; the table has every mask
STATE_COLOURS = {
    EMPTY: ("#f2f2f2", "empty: skipped"),
    PARTIAL: ("#e8a33d", "partial: masked"),
    FULL: ("#2b5c8a", "full: no mask"),
}
_GEOMETRY = ("batch", "seq", "seq_kv", "mask", "window", "documents", "chunk", "decode_share", "lengths")
_CHOSEN_TILE = re.compile(r"\b(?:fwd|dkdv|dq) (\d+),(\d+)")  # a kernel's tile in a row's `choice`
_SHAPE = (*_GEOMETRY, "model", "layer")  # a row's mask and the preset it came from
_LABELLED = ("window", "documents", "chunk", "decode_share", "lengths", "model", "layer")


def parse_tiles(text: str) -> list[tuple[int, int]]:
    """``"128x128,128x64"`` → [(128, 128), (128, 64)]: query rows × keys per tile."""
    tiles = []
    for part in (p.strip() for p in text.split(",")):
        rows, x, keys = part.lower().partition("x")
        if not (x and rows.isdigit() and keys.isdigit() and int(rows) > 0 and int(keys) > 0):
            raise UsageError(f"--tile {part!r}: expected query rows x keys, positive, e.g. --tile 128x128,128x64")
        tiles.append((int(rows), int(keys)))
    return tiles


def mask_label(w: Workload, per_sequence: bool = False) -> str:
    """'B4 S1024x1536 sliding_window w256': what decides the mask, nothing else. ``per_sequence``: the report's
    label, where a batch whose sequences share one mask is counted as one sequence (:func:`run_masks`) — there
    without the batch ('S1024 causal', not 'B1 …' for a B4 run); a batch of different sequences keeps it."""
    seq = f"S{w.seq_q}" if w.seq_q == w.seq_k else f"S{w.seq_q}x{w.seq_k}"
    batch = "" if per_sequence and w.batch == 1 else f"B{w.batch} "
    return f"{batch}{seq} {w.mask}" + tags(w, [BY_NAME[name] for name in _LABELLED])


def distinct_masks(workloads: list[Workload]) -> list[Workload]:
    """One workload per mask geometry (sizes, dtypes and contenders do not change a mask), in order."""
    seen: dict[tuple[Any, ...], Workload] = {}
    for w in workloads:
        key = tuple(BY_NAME[name].read(w) for name in _SHAPE)
        seen.setdefault(key, w)
    return list(seen.values())


def mask_table(workloads: list[Workload], tiles: list[tuple[int, int]], per_sequence: bool = False) -> pd.DataFrame:
    """A row per mask and tile: tiles full, partial and empty, visible pairs (and their share of the batch's
    Sq × Sk) and ``work``, the pairs a block-skipping kernel computes over the visible ones (``per_sequence``:
    :func:`mask_label`'s)."""
    rows = []
    for w in workloads:
        for block_m, block_n in tiles:
            counts = count_tiles(w, block_m, block_n)
            rows.append(
                {
                    "mask": mask_label(w, per_sequence),
                    "tile": f"{block_m}x{block_n}",
                    "full": counts.full,
                    "partial": counts.partial,
                    "empty": counts.empty,
                    "visible_pairs": counts.visible_pairs,
                    "visible_share": counts.visible_pairs / (w.batch * w.seq_q * w.seq_k),
                    "computed_pairs": counts.computed_pairs,
                    "work": counts.work_factor,
                }
            )
    return pd.DataFrame(rows)


def format_table(table: pd.DataFrame) -> str:
    """The table as the command prints it: the mask left-aligned, the counts right-aligned."""
    numbers = pd.DataFrame(
        {
            "tile": table["tile"],
            "visible": [f"{share:.1%}" for share in table["visible_share"]],
            "full": table["full"],
            "partial": table["partial"],
            "empty": table["empty"],
            "work": [f"{work:.2f}x" for work in table["work"]],
        }
    ).to_string(index=False)
    width = max(len("mask"), *(len(mask) for mask in table["mask"]))
    masks = ["mask", *table["mask"]]
    return "\n".join(f"{mask:<{width}}  {line}" for mask, line in zip(masks, numbers.splitlines(), strict=True))


def _shown_sequence(states: list[torch.Tensor]) -> int | None:
    """The sequence a panel draws: where the batch's sequences differ (padding, ragged, mixed), the one with the
    most partial tiles, then the most empty ones (the first of equals); None where they share one mask."""
    if len(states) == 1:
        return None
    return max(
        range(len(states)), key=lambda b: (int((states[b] == PARTIAL).sum()), int((states[b] == EMPTY).sum()), -b)
    )


MAX_ASPECT = 4.0  # a picture longer than this on one side is stretched to its panel instead of drawn to scale


def _aspect(states: torch.Tensor, tile: tuple[int, int]) -> float | str:
    """Each tile drawn in proportion to its query rows and keys (a 128 × 64 tile twice as tall as wide, so a
    causal diagonal runs at 45°), unless the whole picture would then be a strip (S512 against 8192 keys)."""
    aspect = tile[0] / tile[1]
    rows, columns = states.shape
    return aspect if 1 / MAX_ASPECT <= rows * aspect / columns <= MAX_ASPECT else "auto"


def draw_masks(workloads: list[Workload], tile: tuple[int, int], per_sequence: bool = False) -> Any:
    """A panel per mask (the first MAX_PANELS; the legend says so where there are more): its tiles (one
    sequence's, see _shown_sequence), coloured by state; query blocks down, key blocks across, each tile in
    proportion (:func:`_aspect`). ``per_sequence``: :func:`mask_label`'s."""
    shown = workloads[:MAX_PANELS]
    figure, axes = panel_grid(len(shown), size=(3.2, 3.0))
    colours = ListedColormap([STATE_COLOURS[state][0] for state in (EMPTY, PARTIAL, FULL)])
    for axis, w in zip(axes, shown, strict=True):
        states = sequence_states(w, *tile)
        index = _shown_sequence(states)
        shown_states = states[index or 0]
        axis.imshow(
            shown_states.numpy(),
            cmap=colours,
            vmin=EMPTY,
            vmax=FULL,
            interpolation="nearest",
            aspect=_aspect(shown_states, tile),
        )
        counts = count_tiles(w, *tile, states)
        which = f"sequence {index + 1} of {w.batch} shown; the batch's " if index is not None else ""
        # "; " between the mask and its work: the title is re-wrapped at spaces to fit (a line break would not hold)
        axis.set_title(f"{mask_label(w, per_sequence)}; {which}work {counts.work_factor:.2f}x", fontsize=TITLE_SIZE)
        axis.set_xlabel(f"key block ({tile[1]} keys)", fontsize=TITLE_SIZE)
        axis.set_ylabel(f"query block ({tile[0]} rows)", fontsize=TITLE_SIZE)
        axis.tick_params(labelsize=TITLE_SIZE)
        for ticks in (axis.xaxis, axis.yaxis):  # block numbers: whole ones only, also for a 2 × 2 picture
            ticks.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # one block: tick 0, not ±0.5
    handles = [Patch(color=colour, label=label) for colour, label in STATE_COLOURS.values()]
    left_out = (
        f"\nthe first {MAX_PANELS} of {len(workloads)} masks\n(masks.csv has all)"
        if len(workloads) > len(shown)
        else ""
    )
    legend_right(figure, handles, f"tile {tile[0]}x{tile[1]}{left_out}")
    return finish(figure)


def row_geometry(row: Any) -> Workload:
    """The mask's shape of a results row (a dict or Series) as a Workload of one head of dimension 1: what
    tiles.py counts, nothing else (a row of an older run without a feature column reads its neutral value)."""
    fields = {BY_NAME[name].workload_field: BY_NAME[name].kind(BY_NAME[name].read(row)) for name in _SHAPE}
    return Workload(heads=1, kv_heads=1, head_dim=1, **fields)


def _one_sequence(w: Workload) -> Workload:
    """``w`` with batch 1 where every sequence has the same mask (a B8 causal case is a B1's eight times)."""
    return dataclasses.replace(w, batch=1) if len(sequence_ranges(w)) == 1 else w


def run_masks(frame: pd.DataFrame, tile: tuple[int, int]) -> list[Workload]:
    """The distinct masks of a run's prefill rows that leave a kernel's tiles other than full at ``tile`` (a
    causal prefill, a window, documents, a ragged batch; not a plain square, whose tiles are all full). Decode
    rows are left out: a step's one row of tiles is full or skipped, and their bytes count only what it reads."""
    records = [row for row in frame.to_dict("records") if not is_decode(row)]
    rows = {tuple(BY_NAME[name].read(row) for name in _SHAPE): row for row in records}
    geometries = []
    for row in rows.values():  # one per shape: a sweep repeats each for every contender and dtype
        try:
            geometries.append(_one_sequence(row_geometry(row)))
        except (TypeError, ValueError):  # a row without its sizes (a hand-made or foreign one)
            continue
    masks = distinct_masks(geometries)
    return [w for w in masks if (counts := count_tiles(w, *tile)).partial or counts.empty]


def chosen_tiles(frame: pd.DataFrame) -> list[tuple[int, int]]:
    """The (query rows, keys) tiles the run's contenders say they chose for its prefill rows, in order: the
    ``choice`` column as fused_triton spells it, ``fwd 128,64,8,3; dkdv 64,128,8,2`` (BLOCK_M,BLOCK_N first)."""
    found = [
        (int(rows), int(keys))
        for row in frame.to_dict("records")
        if isinstance(row.get("choice"), str) and not is_decode(row)
        for rows, keys in _CHOSEN_TILE.findall(row["choice"])
    ]
    return list(dict.fromkeys(found))


def report_masks(frame: pd.DataFrame, out_dir: Path) -> list[tuple[str, Path]]:
    """The report's figure of how the run's masks fall on the first of ``REPORT_TILES`` (``masks.png``), with
    each in ``masks.csv`` beside it at every one of them and every tile a contender chose (:func:`chosen_tiles`);
    nothing where no mask leaves a tile other than full."""
    masks = run_masks(frame, REPORT_TILES[0])
    if not masks:
        return []
    tiles = list(dict.fromkeys([*REPORT_TILES, *chosen_tiles(frame)]))
    mask_table(masks, tiles, per_sequence=True).to_csv(out_dir / "masks.csv", index=False)
    figure = draw_masks(masks, REPORT_TILES[0], per_sequence=True)
    figure.savefig(out_dir / "masks.png", dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return [("Masks on the kernels' tiles", out_dir / "masks.png")]


def write_masks(workloads: list[Workload], tiles: list[tuple[int, int]], out: Path) -> pd.DataFrame:
    """``masks.csv`` (every mask and tile) and ``masks.png`` (the first tile) in ``out``; the table."""
    masks = distinct_masks(workloads)
    table = mask_table(masks, tiles)
    figure = draw_masks(masks, tiles[0])
    out.mkdir(parents=True, exist_ok=True)  # after the work: a failure above leaves no folder half-written
    table.to_csv(out / "masks.csv", index=False)
    figure.savefig(out / "masks.png", dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return table
