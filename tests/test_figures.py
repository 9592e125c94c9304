"""The report's figures on fabricated frames: what varies in a workload group goes on x (sequence length,
key length, heads, head_dim, batch), and a group run at one size is a point per contender on a categorical
x axis, not a lone dot on a size axis."""

import itertools

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from attnbench.reports.facets import facets, x_axis
from attnbench.reports.plots import Roofs, draw_all, latency, palette, plottable

BASE = {"machine": "test cpu", "device": "cpu", "dtype": "float32", "mask": "none", "pass": "fwd", "hidden": None,
        "module": "core", "batch": 1, "heads": 8, "kv_heads": 8, "seq_q": 512, "seq_k": 512, "head_dim": 64,
        "status": "ok", "reason": "", "peak_mem_mb": 1.0, "intensity": 10.0}  # fmt: skip


def fabricate(impls=("bmm", "sdpa_flash"), **axes):
    """One ok row per contender and combination of ``axes`` (lists), a made-up time growing with size."""
    names = list(axes)
    rows = []
    for impl, values in itertools.product(impls, itertools.product(*axes.values())):
        row = {**BASE, **dict(zip(names, values, strict=True)), "impl": impl}
        if "seq_q" in names and "seq_k" not in names:
            row["seq_k"] = row["seq_q"]
        if "heads" in names and "kv_heads" not in names:
            row["kv_heads"] = row["heads"]
        size = row["batch"] * row["heads"] * row["seq_q"] * row["seq_k"] * row["head_dim"]
        row["median_ms"] = size / 1e6 * (1 + impls.index(impl))
        row["tflops"] = 1.0 / row["median_ms"]
        rows.append(row)
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("axes", "expected"),
    [
        ({"seq_q": [256, 512, 1024]}, "seq_q"),
        ({"seq_k": [256, 512, 1024]}, "seq_k"),
        ({"heads": [4, 8, 16]}, "heads"),
        ({"head_dim": [32, 64, 128]}, "head_dim"),
        ({"batch": [1, 2, 4]}, "batch"),
        ({"seq_q": [512]}, None),
        ({"heads": [4, 8], "seq_q": [256, 512]}, "seq_q"),  # sequence length ranks first; a panel per heads
    ],
)
def test_the_axis_that_varies_goes_on_x(axes, expected):
    frame = fabricate(**axes)
    assert x_axis(frame) == expected
    panels = facets(frame)
    assert {p.x for p in panels} == {expected}
    panel_count = len(axes.get("heads", [1])) if expected == "seq_q" else 1
    assert len(panels) == panel_count
    assert sum(len(p.rows) for p in panels) == len(frame)


def test_square_and_cross_attention_are_separate_panels_with_their_key_length_in_the_title():
    square = fabricate(seq_q=[256, 512])
    cross = fabricate(seq_q=[128, 256], seq_k=[1024])
    panels = facets(pd.concat([square, cross], ignore_index=True))
    assert [p.title for p in panels] == ["cpu float32 B1 H8 D64 none fwd", "cpu float32 B1 H8 Sk1024 D64 none fwd"]


def test_gqa_heads_sweep_keeps_the_group_size():
    frame = fabricate(heads=[8, 16, 32])
    frame["kv_heads"] = frame["heads"] // 4
    (panel,) = facets(frame)
    assert panel.x == "heads" and "group 4" in panel.title


def test_one_size_group_is_points_by_contender_and_a_sweep_is_lines():
    one = fabricate(impls=("bmm", "sdpa_flash", "naive"), seq_q=[512])
    one["mask"] = "causal"
    swept = fabricate(heads=[4, 8, 16])
    ok = plottable(pd.concat([one, swept], ignore_index=True))
    figure = latency(ok, palette(sorted(set(ok["impl"]))))
    points, lines = [a for a in figure.axes if a.get_visible()]
    assert [t.get_text() for t in points.get_xticklabels()] == ["naive", "bmm", "sdpa_flash"]
    assert sum(len(c.get_offsets()) for c in points.collections) == 3 and len(points.lines) == 0
    assert points.get_xlabel() == "" and points.get_yscale() == "log"
    assert lines.get_xlabel() == "query heads" and len(lines.lines) >= 2 and lines.get_xscale() == "log"
    assert sorted(lines.get_lines()[0].get_xdata()) == [4, 8, 16]
    plt.close(figure)


def test_draw_all_writes_every_figure_for_mixed_groups(tmp_path):
    frame = pd.concat(
        [fabricate(seq_q=[256, 512, 1024]), fabricate(head_dim=[32, 64, 128]).assign(dtype="bfloat16"),
         fabricate(impls=("bmm", "sdpa_flash", "naive"), seq_q=[2048]).assign(mask="causal")],
        ignore_index=True,
    )  # fmt: skip
    drawn = draw_all(frame, tmp_path, None, {("test cpu", "cpu", "float32"): Roofs(1.0, 50.0, 0.5, 40.0)})
    assert {path.name for _, path in drawn} >= {"latency.png", "tflops.png", "memory.png", "speedup.png"}
    assert all(path.stat().st_size > 10_000 for _, path in drawn)
