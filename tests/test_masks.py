"""`attnbench masks` and workload/tiles.py: each mask's tiles empty, partial or full, checked tile by tile against
the dense mask, and the command's table, CSV and picture."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from attnbench.workload import Workload
from attnbench.workload.masks import dense_mask_of, workload_pairs
from attnbench.workload.sequences import sequence_lengths
from attnbench.workload.tiles import count_tiles

MASKS = [
    ("none", {}),
    ("causal", {}),
    ("causal_bottom_right", {}),
    ("padding", {}),
    ("sliding_window", {"window": 7}),
    ("sliding_window", {"window": 40}),
    ("document", {"documents": 3}),
    ("chunked", {"chunk": 24}),
    ("causal", {"lengths": "bimodal"}),
    ("mixed", {"decode_share": 0.4, "lengths": "uniform"}),
]
SHAPES = [(50, 50), (37, 90), (90, 37), (1, 77)]
TILES = [(16, 16), (8, 32), (64, 64), (1, 5)]


def _by_hand(w: Workload, block_m: int, block_n: int) -> tuple[int, ...]:
    """(full, partial, empty, visible, computed) by looking at every tile of the dense mask; a ragged batch's
    sequence tiled as its own matrix, as varlen kernels tile it: its rows up to the last that sees a key, its keys
    up to the last some row sees (each sequence's last row sees its last key, or the window up to it)."""
    dense = dense_mask_of(w, "cpu")
    visible = torch.ones(1, w.seq_q, w.seq_k, dtype=torch.bool) if dense is None else dense[:, 0]
    visible = visible.expand(w.batch, -1, -1)
    full = partial = empty = computed = 0
    for b in range(w.batch):
        rows, keys = w.seq_q, w.seq_k
        if sequence_lengths(w) is not None:
            rows = int(visible[b].any(1).nonzero().max()) + 1
            keys = int(visible[b].any(0).nonzero().max()) + 1
        for row in range(0, rows, block_m):
            for key in range(0, keys, block_n):
                tile = visible[b, row : min(row + block_m, rows), key : min(key + block_n, keys)]
                if tile.all():
                    full += 1
                elif tile.any():
                    partial += 1
                else:
                    empty += 1
                computed += tile.numel() if tile.any() else 0
    return full, partial, empty, int(visible.sum()), computed


@pytest.mark.parametrize(("mask", "extra"), MASKS, ids=[f"{m}-{'-'.join(map(str, e.values()))}" for m, e in MASKS])
def test_tile_counts_match_the_dense_mask_tile_by_tile(mask, extra):
    """Every mask, square and not (Sq > Sk too, and a decode row), ragged and mixed batches, at tiles that divide
    the matrix and that do not: the counts are the dense mask's, and the visible pairs the closed form's."""
    for seq_q, seq_k in SHAPES:
        if mask == "document" and seq_q != seq_k:
            continue
        w = Workload(batch=3, heads=2, kv_heads=2, seq_q=seq_q, seq_k=seq_k, head_dim=8, mask=mask, **extra)
        for block_m, block_n in TILES:
            counts = count_tiles(w, block_m, block_n)
            found = (counts.full, counts.partial, counts.empty, counts.visible_pairs, counts.computed_pairs)
            assert found == _by_hand(w, block_m, block_n), (seq_q, seq_k, block_m, block_n)
            assert counts.visible_pairs == workload_pairs(w)


def test_a_mixed_batch_decode_step_is_one_row_of_tiles_one_row_high():
    """B2 mixed, S40 × 40 at 16 × 16: the decode step's one row sees all 40 keys, three full tiles of 16 + 16 + 8
    pairs (not three 16-row tiles, 15 rows of them padding); the prefill is causal S40: 3 full, 3 partial (the
    diagonal), 3 empty, computing 16·16·2 + 16·8 + 16·16·2 + 8·8 = 1088 of its 40·41/2 = 820 pairs."""
    w = Workload(batch=2, heads=1, kv_heads=1, seq_q=40, seq_k=40, head_dim=8, mask="mixed", decode_share=0.5)
    counts = count_tiles(w, 16, 16)
    found = (counts.full, counts.partial, counts.empty, counts.visible_pairs, counts.computed_pairs)
    assert found == (3 + 3, 3, 3, 40 + 820, 40 + 1088)


def test_work_factor_of_known_shapes():
    """Causal S4096 at 128 × 128: 32·33/2 tiles of 128² over 4096·4097/2 pairs; a 256-key window: 1.5×."""
    causal = Workload(batch=1, heads=1, kv_heads=1, seq_q=4096, seq_k=4096, head_dim=64, mask="causal")
    assert count_tiles(causal, 128, 128).work_factor == pytest.approx(528 * 128 * 128 / (4096 * 4097 / 2))
    window = Workload(
        batch=1, heads=1, kv_heads=1, seq_q=4096, seq_k=4096, head_dim=64, mask="sliding_window", window=256
    )
    counts = count_tiles(window, 128, 128)
    assert (counts.full, counts.partial) == (31, 62)
    assert counts.work_factor == pytest.approx(1.5, abs=0.01)


def test_masks_command_draws_every_mask_and_writes_its_table(cli, tmp_path):
    code, out, err = cli(
        "masks", "--seq", "512", "--seq-kv", "1024", "--tile", "64x64,128x32", "--out", str(tmp_path / "m")
    )
    assert code == 0, err
    assert "masks: document left out: mask document packs documents into one sequence" in err  # Sq ≠ Sk
    table = pd.read_csv(tmp_path / "m" / "masks.csv")
    shown = {"none", "causal", "causal_bottom_right", "padding", "sliding_window", "chunked", "mixed"}
    assert {label.split()[2] for label in table["mask"]} == shown
    assert len(table) == 2 * len(shown) and set(table["tile"]) == {"64x64", "128x32"}
    assert (table["full"] + table["partial"] + table["empty"] > 0).all() and (table["work"] >= 1).all()
    none = table[table["mask"] == "B1 S512x1024 none"].iloc[0]
    assert (none["full"], none["partial"], none["empty"], none["work"]) == (8 * 16, 0, 0, 1.0)
    assert "B1 S512x1024 causal_bottom_right" in out and "work" in out.splitlines()[0]
    assert (tmp_path / "m" / "masks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_masks_command_takes_the_masks_named(cli, tmp_path):
    code, out, err = cli(
        "masks",
        "--mask",
        "sliding_window",
        "--window",
        "100",
        "--seq",
        "300",
        "--tile",
        "64x32",
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split()[:4] == ["B1", "S300", "sliding_window", "w100"] and len(lines) == 2 + 3
    assert lines[1].split()[-1] == f"{count_tiles(_window_case(), 64, 32).work_factor:.2f}x"


def _window_case() -> Workload:
    return Workload(batch=1, heads=8, kv_heads=8, seq_q=300, seq_k=300, head_dim=64, mask="sliding_window", window=100)


def _rows(*workloads: Workload, impls=("bmm", "naive")) -> pd.DataFrame:
    from attnbench.runner.results import make_row

    return pd.DataFrame([make_row(impl, w, "ok") for w in workloads for impl in impls])


def test_a_report_draws_the_runs_masks_that_leave_tiles_other_than_full(tmp_path):
    """Each shape once (every contender's row, every batch of one mask), a batch of equal sequences as one, a
    ragged batch as itself; a plain square (all tiles full) and decode rows (a windowed one too) not at all."""
    from attnbench.reports.masks import REPORT_TILES, report_masks, run_masks

    def case(**fields):
        return Workload(**{"batch": 2, "heads": 8, "kv_heads": 8, "seq_q": 300, "seq_k": 300, "head_dim": 64, **fields})

    frame = _rows(
        case(),
        case(mask="causal"),
        case(mask="causal", batch=4, head_dim=128),
        case(mask="causal_bottom_right", seq_q=1, seq_k=1000),
        case(mask="sliding_window", window=64, seq_q=1, seq_k=1000),
        case(mask="causal", lengths="uniform"),
        _window_case(),
    )
    labels = [f"{w.batch} {w.mask} {w.lengths}" for w in run_masks(frame, REPORT_TILES[0])]
    assert labels == ["1 causal equal", "2 causal uniform", "1 sliding_window equal"]
    assert report_masks(frame, tmp_path) == [("Masks on the kernels' tiles", tmp_path / "masks.png")]
    table = pd.read_csv(tmp_path / "masks.csv")
    assert list(table["tile"]) == ["128x128", "128x64"] * 3
    assert "S300 causal" in set(table["mask"])  # the B2 and B4 rows, counted per sequence: no batch in the label
    window = table[table["mask"] == "S300 sliding_window w100"].set_index("tile")
    assert window.loc["128x64", "work"] == pytest.approx(count_tiles(_window_case(), 128, 64).work_factor)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert report_masks(_rows(case(), case(mask="causal_bottom_right", seq_q=1, seq_k=1000)), plain) == []
    assert list(plain.iterdir()) == []


def test_a_row_of_an_older_run_or_a_foreign_one_reads_as_it_can():
    """A row without the feature columns is read at their neutral values; one without its sizes is passed by."""
    from attnbench.reports.masks import REPORT_TILES, run_masks

    old = _rows(_window_case()).drop(columns=["chunk", "decode_share", "lengths", "layer"])
    assert [w.window for w in run_masks(old, REPORT_TILES[0])] == [100]
    foreign = pd.concat([old, pd.DataFrame([{"impl": "x", "mask": "causal", "seq_q": 256}])], ignore_index=True)
    assert len(run_masks(foreign, REPORT_TILES[0])) == 1


def test_the_reports_table_adds_the_tiles_the_runs_contenders_chose(tmp_path):
    """masks.csv: every mask at 128x128, 128x64 and each prefill tile a row's `choice` names (fused_triton's
    spelling, BLOCK_M,BLOCK_N first, every kernel), once; a decode row's choice is not a mask's tile."""
    from attnbench.reports.masks import chosen_tiles, report_masks

    frame = _rows(_window_case())
    frame["choice"] = ["fwd 64,32,4,2; dkdv 32,64,4,2", None]
    decode = _rows(
        Workload(batch=1, heads=8, kv_heads=8, seq_q=1, seq_k=999, head_dim=64, mask="sliding_window", window=100),
        impls=("fused_triton",),
    ).assign(choice="fwd 16,16,1,1")
    frame = pd.concat([frame, decode, frame.assign(impl="again")], ignore_index=True)
    assert chosen_tiles(frame) == [(64, 32), (32, 64)]
    report_masks(frame, tmp_path)
    table = pd.read_csv(tmp_path / "masks.csv")
    assert list(table["tile"]) == ["128x128", "128x64", "64x32", "32x64"]
    assert table.set_index("tile").loc["64x32", "work"] == pytest.approx(
        count_tiles(_window_case(), 64, 32).work_factor
    )


def test_a_picture_of_more_masks_than_panels_says_how_many_it_left_out():
    import matplotlib.pyplot as plt

    from attnbench.reports.masks import MAX_PANELS, draw_masks

    many = [
        Workload(batch=1, heads=1, kv_heads=1, seq_q=256, seq_k=256, head_dim=64, mask="sliding_window", window=w)
        for w in range(8, 8 * (MAX_PANELS + 4), 8)
    ]
    for workloads, said in ((many, f"the first {MAX_PANELS} of {MAX_PANELS + 3} masks"), (many[:3], None)):
        figure = draw_masks(workloads, (64, 64))
        title = figure.legends[0].get_title().get_text()
        assert len(figure.axes) == min(len(workloads), MAX_PANELS) and (said in title if said else "\n" not in title)
        plt.close(figure)


def test_block_ticks_are_whole_numbers_even_for_one_block():
    """A 128-query case at 128-row tiles is one block row: its axis says 0, not -0.5 … 0.5; two blocks say 0, 1."""
    import matplotlib.pyplot as plt

    from attnbench.reports.masks import draw_masks

    shapes = [(128, 256, "causal_bottom_right"), (256, 256, "causal"), (4096, 4096, "causal")]
    cases = [Workload(batch=1, heads=1, kv_heads=1, seq_q=q, seq_k=k, head_dim=64, mask=m) for q, k, m in shapes]
    figure = draw_masks(cases, (128, 128))
    figure.canvas.draw()

    def shown(ticks, limits):  # the ticks matplotlib draws: those inside the view
        low, high = sorted(limits)
        return [float(t) for t in ticks if low <= t <= high]

    for axis in figure.axes:
        for ticks in (shown(axis.get_xticks(), axis.get_xlim()), shown(axis.get_yticks(), axis.get_ylim())):
            assert ticks and all(t.is_integer() for t in ticks), ticks
    assert shown(figure.axes[0].get_yticks(), figure.axes[0].get_ylim()) == [0.0]
    assert shown(figure.axes[1].get_yticks(), figure.axes[1].get_ylim()) == [0.0, 1.0]
    plt.close(figure)


def test_tiles_are_drawn_in_proportion_and_a_report_label_of_one_sequence_has_no_batch():
    """A 128 × 64 tile is twice as tall as wide on the picture (a causal diagonal at 45°), a strip of S512
    against 8192 keys is stretched to its panel; the report counts a B4 causal batch as one sequence, so its
    label has no batch (it said B1 for a B4 run), while `attnbench masks` keeps the batch it counted."""
    import matplotlib.pyplot as plt

    from attnbench.reports.masks import draw_masks, mask_label, mask_table

    def case(q, k, mask, batch=1):
        return Workload(batch=batch, heads=1, kv_heads=1, seq_q=q, seq_k=k, head_dim=64, mask=mask)

    figure = draw_masks([case(1024, 1024, "causal"), case(512, 8192, "causal_bottom_right")], (128, 64))
    assert figure.axes[0].get_aspect() == 2.0 and figure.axes[1].get_aspect() == "auto"
    assert figure.axes[0].get_images()[0].get_array().shape == (8, 16)  # 8 query blocks down, 16 key blocks across
    plt.close(figure)
    assert mask_label(case(1024, 1024, "causal", batch=4)) == "B4 S1024 causal"
    assert mask_label(case(1024, 1024, "causal"), per_sequence=True) == "S1024 causal"
    assert mask_table([case(256, 256, "causal", batch=4)], [(128, 128)])["mask"].tolist() == ["B4 S256 causal"]


def test_a_feature_flag_of_one_mask_keeps_the_gallery_and_one_of_none_is_refused(cli, tmp_path):
    """`masks --window 128` draws the gallery's every mask, the window on its sliding one (a check made per sweep
    refused the seven others); a flag that applies to no mask drawn is refused in one line."""
    code, _, err = cli("masks", "--window", "128", "--seq", "256", "--out", str(tmp_path / "w"))
    assert code == 0 and "left out" not in err, err
    table = pd.read_csv(tmp_path / "w" / "masks.csv")
    assert len({label.split()[2] for label in table["mask"]}) == 8 and any("w128" in m for m in table["mask"])
    code, _, err = cli("masks", "--softcap", "30", "--out", str(tmp_path / "s"))
    assert code == 2 and "--softcap 30 applies to score_mod softcap" in err and not (tmp_path / "s").exists()
