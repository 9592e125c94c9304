"""The report's figures on fabricated frames: what varies in a workload group goes on x (sequence length,
key length, heads, head_dim, batch), and a group run at one size is a point per contender on a categorical
x axis, not a lone dot on a size axis."""

import itertools
import math
import re
import warnings

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from attnbench.reports.facets import facets, x_axis
from attnbench.reports.plots import Roofs, colour_cycle, draw_all, latency, palette, plottable
from attnbench.workload import Workload

BASE = {
    "machine": "test cpu",
    "device": "cpu",
    "dtype": "float32",
    "mask": "none",
    "pass": "fwd",
    "hidden": None,
    "module": "core",
    "batch": 1,
    "heads": 8,
    "kv_heads": 8,
    "seq_q": 512,
    "seq_k": 512,
    "head_dim": 64,
    "status": "ok",
    "reason": "",
    "peak_mem_mb": 1.0,
    "intensity": 10.0,
}


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
    assert [t.get_text() for t in points.get_xticklabels()] == ["bmm", "naive", "sdpa_flash"]  # the palette's order
    assert sum(len(c.get_offsets()) for c in points.collections) == 3 and len(points.lines) == 0
    assert points.get_xlabel() == "" and points.get_yscale() == "log"
    assert lines.get_xlabel() == "query heads" and len(lines.lines) >= 2 and lines.get_xscale() == "log"
    assert sorted(lines.get_lines()[0].get_xdata()) == [4, 8, 16]
    plt.close(figure)


def test_draw_all_writes_every_figure_for_mixed_groups(tmp_path):
    frame = pd.concat(
        [
            fabricate(seq_q=[256, 512, 1024]),
            fabricate(head_dim=[32, 64, 128]).assign(dtype="bfloat16"),
            fabricate(impls=("bmm", "sdpa_flash", "naive"), seq_q=[2048]).assign(mask="causal"),
        ],
        ignore_index=True,
    )
    drawn = draw_all(frame, tmp_path, None, {("test cpu", "cpu", "float32"): Roofs(1.0, 50.0, 0.5, 40.0)})
    assert {path.name for _, path in drawn} >= {"latency.png", "tflops.png", "memory.png", "speedup.png"}
    assert all(path.stat().st_size > 10_000 for _, path in drawn)


def test_the_quick_suites_heat_map_warns_nothing():
    """`attnbench report` on a quick run printed matplotlib's "constrained_layout not applied" (seaborn draws the
    heat map once before its colour bar has room): nothing a user can act on, so nothing on stderr."""
    from attnbench.reports.plots import speedup

    quick = ("bmm", "einsum", "flex", "fused_cpu", "naive", "sdpa_flash", "sdpa_math")
    ok = plottable(fabricate(impls=quick, seq_q=[256, 1024]).assign(mask="causal_bottom_right"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        figure = speedup(ok, palette(quick), None)
    assert figure is not None
    plt.close(figure)


# --- text on text (issue 24 item 4): every figure kind, on frames made to crowd it ---------------------------

MANY = (
    "naive",
    "bmm",
    "einsum",
    "sdpa_math",
    "sdpa_flash",
    "flex",
    "fused_cpu",
    "xformers",
    "my_org_flash_attention_v3_experimental",
    "another_plugin_with_a_long_name",
    "tiled_cpu_kernel_v2",
    "z_last_contender",
)
LONG_MODEL = "a-very-long-model-preset-name-for-testing-70b-instruct"
ROOFS = {("test cpu", "cpu", "float32"): Roofs(1.0, 50.0, 0.5, 40.0)}


def crowded():
    """Long workload labels (a long model name, sliding windows), a dozen contenders, eleven x values, a
    one-size group (points by contender), and decode groups over many KV lengths, paged and not."""
    sweep = fabricate(impls=MANY, seq_q=[2**n for n in range(6, 17)]).assign(model=LONG_MODEL, window=4096)
    sweep["mask"] = "sliding_window"
    one = fabricate(impls=MANY, seq_q=[512], seq_k=[8192]).assign(mask="causal_bottom_right", model=LONG_MODEL)
    decode = fabricate(impls=MANY, seq_q=[1], seq_k=[2**n for n in range(10, 18)], page_size=[0, 64])
    decode = decode.assign(model=LONG_MODEL, heads=32, kv_heads=8, head_dim=128)
    frame = pd.concat([sweep, one, decode], ignore_index=True)
    frame["gbps"] = 1e3 / frame["median_ms"] % 60 + 1
    frame["intensity"] = frame["seq_k"] / 8
    return frame


def figures_of_every_kind():
    from attnbench.reports.compare import Settings, ratio_plot
    from attnbench.reports.plots import decode_bandwidth, decode_latency, memory, roofline, speedup, throughput

    ok = plottable(crowded())
    colours = palette(sorted(set(ok["impl"])))
    not_decode = ok[ok["seq_q"] > 1]
    compared = crowded().assign(workload=lambda f: f["mask"] + " " + f["seq_q"].astype(str) + " " + LONG_MODEL)
    compared = compared.assign(
        ratio=[0.7 + 0.05 * (i % 13) for i in range(len(compared))], verdict="unclear", floor=0.05
    )
    return {
        "latency": latency(not_decode, colours),
        "tflops": throughput(not_decode, colours, ROOFS),
        "memory": memory(not_decode, colours),
        "speedup": speedup(ok, colours, None),
        "roofline": roofline(ok, colours, ROOFS),
        "decode": decode_bandwidth(ok, colours, ROOFS),
        "decode_ms": decode_latency(ok, colours),
        "compare": ratio_plot(compared.head(40), Settings()),
        "masks": _masks_figure(),
    }


def _masks_figure():
    from attnbench.reports.masks import distinct_masks, draw_masks
    from attnbench.workload.suite import expand, mask_suite

    workloads = [w for _, w in expand(mask_suite(), {}, ["bmm"], None, ["bmm"])]
    return draw_masks(distinct_masks(workloads), (64, 64))


def _tick_texts(figure):
    return [t.get_text() for a in figure.axes for ax in (a.xaxis, a.yaxis) for t in ax.get_ticklabels()]


def test_no_figure_kind_draws_text_on_text():
    """Titles, tick labels, axis labels, legend entries and annotations never overlap, and legends lie outside
    every axes (figure_layout.text_overlaps measures each text's window extent)."""
    from attnbench.reports.figure_layout import text_overlaps

    drawn = figures_of_every_kind()
    assert all(figure is not None for figure in drawn.values()), [k for k, f in drawn.items() if f is None]
    for kind, figure in drawn.items():
        assert text_overlaps(figure) == [], kind
        assert not [t for t in _tick_texts(figure) if re.search(r"\$|×\s*10|\d[eE][+-]?\d", t)], kind  # plain decimals
        assert len(figure.legends) <= 1 and not [a for a in figure.axes if a.get_legend()], kind
        plt.close(figure)


def test_the_checker_finds_text_on_text():
    """The check itself: two titles run together, a legend over the data."""
    from attnbench.reports.figure_layout import text_overlaps

    figure, (left, right) = plt.subplots(1, 2, figsize=(4, 2))
    left.set_title("a title long enough to run into the next panel's own title")
    right.set_title("the next panel's title")
    left.plot([1, 2], [1, 2], label="a line")
    left.legend(loc="center")
    problems = text_overlaps(figure)
    assert any("title" in p and "overlaps" in p for p in problems)
    assert any(p.startswith("legend 0 lies over axes 0") for p in problems)
    plt.close(figure)


def test_a_five_percent_spread_is_drawn_from_zero_with_plain_labels():
    """pytest-benchmark latencies 0.80–0.84 ms: a linear axis from zero, not a log axis labelled 8.05×10⁻¹."""
    frame = fabricate(impls=("bmm", "sdpa_flash"), seq_q=[256, 512, 1024])
    frame["median_ms"] = [0.80, 0.81, 0.82, 0.84, 0.83, 0.805]
    ok = plottable(frame)
    figure = latency(ok, palette(sorted(set(ok["impl"]))))
    (axis,) = figure.axes
    assert axis.get_yscale() == "linear" and axis.get_ylim()[0] == 0 and axis.get_ylim()[1] < 1.2
    labels = [t.get_text() for t in axis.get_yticklabels() if t.get_text()]
    assert labels and all(text.replace(".", "").isdigit() for text in labels), labels
    plt.close(figure)


def test_a_wide_spread_gets_a_log_axis_with_plain_labels():
    from attnbench.reports.figure_layout import plain

    frame = fabricate(seq_q=[256, 1024, 4096])  # times over 256× apart
    ok = plottable(frame)
    figure = latency(ok, palette(sorted(set(ok["impl"]))))
    (axis,) = figure.axes
    assert axis.get_yscale() == "log"
    assert [plain(v) for v in (0.000805, 0.5, 2.0, 1024.0, 16384.0)] == ["0.000805", "0.5", "2", "1024", "16384"]
    plt.close(figure)


def test_a_lone_square_point_joins_the_panel_at_its_key_length():
    """Sq = Sk = 1024 alone, beside a panel of Sq 256 and 512 against Sk 1024: it is that panel's Sq 1024 point."""
    square = fabricate(seq_q=[1024])
    cross = fabricate(seq_q=[256, 512], seq_k=[1024])
    (panel,) = facets(pd.concat([square, cross], ignore_index=True))
    assert panel.x == "seq_q" and sorted(set(panel.rows["seq_q"])) == [256, 512, 1024]
    assert panel.title == "cpu float32 B1 H8 Sk1024 D64 none fwd"


def test_model_layers_and_features_get_panels_of_their_own_named_in_the_title():
    rows = []
    for layer, mask in (("sliding", "sliding_window"), ("full", "causal")):
        one = fabricate(seq_q=[256, 512])
        one = one.assign(
            model="gpt-oss-20b", layer=layer, sinks="learned", mask=mask, window=128 if layer == "sliding" else 0
        )
        rows.append(one)
    panels = facets(pd.concat(rows, ignore_index=True))
    titles = sorted(p.title for p in panels)
    assert titles == [
        "cpu float32 B1 H8 D64 causal fwd sinks [gpt-oss-20b full]",
        "cpu float32 B1 H8 D64 sliding_window fwd w128 sinks [gpt-oss-20b sliding]",
    ]


def test_an_fp8_forward_is_drawn_under_the_fp8_roofs_not_its_dtype_s():
    """An fp8 forward's rows carry the model's dtype (bf16 out) and q_dtype float8_e4m3fn: its dots run in fp8,
    so the roofline puts it in a panel of its own under the fp8 roof, and the throughput panel's peak is fp8's."""
    from attnbench.reports.plots import roofline, throughput

    bf16 = fabricate(seq_q=[4096, 8192]).assign(dtype="bfloat16", device="cuda", q_dtype="bfloat16")
    fp8 = bf16.assign(q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", tflops=bf16["tflops"] * 1.5)
    ok = plottable(pd.concat([bf16, fp8], ignore_index=True))
    roofs = {
        ("test cpu", "cuda", "bfloat16"): Roofs(989.0, 3350.0, 700.0, 3000.0),
        ("test cpu", "cuda", "float8_e4m3fn"): Roofs(1979.0, 3350.0, 1300.0, 3000.0),
    }
    colours = palette(sorted(set(ok["impl"])))
    figure = roofline(ok, colours, roofs)
    titles = [axis.get_title() for axis in figure.axes if axis.get_title()]
    assert len(titles) == 2, titles
    (fp8_title,) = [t for t in titles if "float8_e4m3fn" in t]
    assert "hardware roof 1.98e+03 TFLOP/s" in fp8_title
    fp8_axis = next(axis for axis in figure.axes if axis.get_title() == fp8_title)
    drawn = sorted(y for c in fp8_axis.collections for _, y in c.get_offsets())
    assert drawn == sorted(fp8["tflops"])  # the fp8 points, none of the bf16 ones
    plt.close(figure)
    figure = throughput(ok, colours, roofs)
    peaks = {text.get_text() for axis in figure.axes for text in axis.texts}
    assert peaks == {
        "hardware roof 989 TFLOP/s",
        "torch matmul 700 TFLOP/s",
        "hardware roof 1.98e+03 TFLOP/s",
        "torch matmul 1.3e+03 TFLOP/s",
    }, peaks
    plt.close(figure)


def test_throughput_draws_the_roof_solid_and_torch_matmul_dashed_or_one_line_where_matmul_is_the_roof():
    """A CPU's FMA roof is often twice torch's matmul, and our kernel runs between them: the panel draws both,
    solid and dashed, each labelled; where torch's matmul is the roof (no kernel or datasheet above it) one line
    says so."""
    from attnbench.reports.plots import throughput

    ok = plottable(fabricate(seq_q=[256, 1024]))
    colours = palette(sorted(set(ok["impl"])))
    key = ("test cpu", "cpu", "float32")
    for roofs, expected in (
        (Roofs(0.537, 53.0, 0.209, 43.0), {("hardware roof 0.537 TFLOP/s", "-"), ("torch matmul 0.209 TFLOP/s", "--")}),
        (Roofs(0.4, 53.0, 0.4, 43.0), {("roof: torch matmul 0.4 TFLOP/s", "-")}),
    ):
        figure = throughput(ok, colours, {key: roofs})
        (axis,) = [axis for axis in figure.axes if axis.get_title()]
        labels = {text.get_text() for text in axis.texts}
        styles = {line.get_linestyle() for line in axis.lines if len(set(line.get_ydata())) == 1}
        assert {(text, style) for text, style in expected} == {
            (label, "-" if label.startswith(("hardware", "roof")) else "--") for label in labels
        }
        assert styles == {style for _, style in expected}
        plt.close(figure)


def test_a_roof_torch_cannot_measure_is_named_not_drawn_at_zero():
    """fp8 on a GPU where torch has no fp8 matmul: its matmul rate is 0 — the panel keeps the datasheet roof and
    says there is no matmul rate (no dashed line at 0); a dtype with no roof at all gets no roofline panel."""
    from attnbench.reports.plots import roofline

    rows = fabricate(seq_q=[4096]).assign(dtype="bfloat16", device="cuda", q_dtype="float8_e4m3fn")
    rows = pd.concat([rows, rows.assign(q_dtype="bfloat16")], ignore_index=True)
    roofs = {
        ("test cpu", "cuda", "float8_e4m3fn"): Roofs(1979.0, 3350.0, 0.0, 3000.0),
        ("test cpu", "cuda", "bfloat16"): Roofs(0.0, 3350.0, 0.0, 3000.0),
    }
    figure = roofline(plottable(rows), palette(["bmm", "sdpa_flash"]), roofs)
    (axis,) = [axis for axis in figure.axes if axis.get_title()]
    assert "float8_e4m3fn" in axis.get_title() and "no torch matmul rate in float8_e4m3fn" in axis.get_title()
    assert [line.get_linestyle() for line in axis.get_lines()] == ["-"]  # the hardware roof alone
    plt.close(figure)


def test_two_runs_of_one_machine_are_drawn_as_their_pooled_median_as_the_headline_ranks_them():
    """Two runs of one machine: the latency line was seaborn's mean of both runs with an unexplained band, the one-size
    panels a point per run, while the headline and the speedup map took each contender's faster run. Now each
    contender and case is one point, the median of its processes in both runs (a ``--repeat`` row's each count), so
    the baseline's own cell is exactly 1× and every figure shows the headline's number."""
    from attnbench.reports.plots import speedup_table

    first = fabricate(impls=("bmm", "sdpa_flash"), seq_q=[256, 512]).assign(run="a")
    second = first.assign(run="b", median_ms=first["median_ms"] * [0.8, 0.8, 1.3, 1.3])  # bmm faster in b, flash slower
    second.loc[second.impl == "sdpa_flash", "repeat_medians_ms"] = pd.Series(
        [[m, m] for m in second.loc[second.impl == "sdpa_flash", "median_ms"]],
        index=second.index[second.impl == "sdpa_flash"],
        dtype=object,
    )  # a --repeat 2 run: two processes, both 1.3× run a's
    ok = plottable(pd.concat([first, second], ignore_index=True))
    assert len(ok) == len(first) and set(ok["runs"]) == {2}
    pooled = {"bmm": 0.9, "sdpa_flash": 1.3}  # median of (1, 0.8); of (1, 1.3, 1.3)
    figure = latency(ok, palette(sorted(set(ok["impl"]))))
    (axis,) = [a for a in figure.axes if a.get_visible()]
    drawn = {
        matplotlib.colors.to_hex(line.get_color()): list(line.get_ydata())
        for line in axis.get_lines()
        if len(line.get_xdata())
    }
    colours = palette(["bmm", "sdpa_flash"])
    for impl, factor in pooled.items():
        own = first.loc[first.impl == impl, "median_ms"].to_list()
        assert drawn[matplotlib.colors.to_hex(colours[impl])] == pytest.approx([m * factor for m in own]), impl
    assert not [c for c in axis.collections if "FillBetween" in type(c).__name__]  # no unexplained band
    plt.close(figure)
    table, bases = speedup_table(ok, "sdpa_flash")
    workload = table.columns[0]
    assert bases[workload] == "sdpa_flash" and table.loc["sdpa_flash", workload] == pytest.approx(1.0)
    assert table.loc["bmm", workload] == pytest.approx(2 * 1.3 / 0.9)  # fabricate: sdpa_flash's own time is 2× bmm's


def test_contenders_of_equal_values_are_drawn_nested_each_with_its_own_marker():
    """bmm, einsum and naive need the same memory: their lines were drawn one over another and only the last
    showed. Now the first of equals is widest, the last narrowest, each with its marker shape (the legend's too);
    a line that equals no other keeps the plain width."""
    from attnbench.reports.plots import markers, memory

    frame = fabricate(impls=("bmm", "einsum", "naive", "sdpa_math"), seq_q=[256, 512, 1024])
    frame["peak_mem_mb"] = [
        s / 256 * (1 if impl == "sdpa_math" else 4) for impl, s in zip(frame["impl"], frame["seq_q"], strict=True)
    ]
    ok = plottable(frame)
    colours = palette(sorted(set(ok["impl"])))
    figure = memory(ok, colours)
    drawn = [line for line in figure.axes[0].get_lines() if len(line.get_xdata())]
    width = {impl: line.get_linewidth() for line in drawn for impl in colours if line.get_color() == colours[impl]}
    equal = [impl for impl in colours if impl != "sdpa_math"]  # in drawing order
    assert [width[impl] for impl in equal] == sorted((width[impl] for impl in equal), reverse=True)
    assert len(set(width[impl] for impl in equal)) == 3 and width["sdpa_math"] == width[equal[-1]]
    shapes = markers(list(colours))
    assert len(set(shapes.values())) == 4
    legend = {h.get_label(): h.get_marker() for h in figure.legends[0].legend_handles}
    assert legend == shapes
    plt.close(figure)


def test_the_decode_figures_percent_axis_has_no_scientific_minor_labels():
    """Over about a decade of GB/s the right axis (% of bandwidth) showed 2×10¹, 3×10¹ … beside a plain 100: its
    minor labels came back when the panel turned log after the second axis was made."""
    from attnbench.reports.plots import decode_bandwidth

    frame = fabricate(impls=("bmm", "fused_cpu"), seq_k=[1024, 2048, 4096, 8192]).assign(seq_q=1)
    frame["gbps"] = [14.0, 18.0, 22.0, 26.0, 15.0, 19.0, 23.0, 27.0]
    frame["mask"] = "causal_bottom_right"
    ok = plottable(frame)
    figure = decode_bandwidth(ok, palette(sorted(set(ok["impl"]))), ROOFS)
    figure.canvas.draw()
    texts = [
        label.get_text()
        for axis in figure.axes
        for each in (axis, *axis.child_axes)
        for ticks in (each.xaxis, each.yaxis)
        for minor in (False, True)
        for label in ticks.get_ticklabels(minor=minor)
    ]
    assert texts and not [t for t in texts if "times" in t or "^" in t], texts
    plt.close(figure)


def test_the_decode_figures_percent_axis_is_labelled_in_1_2_5_steps_as_its_gb_s_axis():
    """llama3.2-1b's decode steps at 9–29 GB/s under a 42 GB/s roof: the right axis ran 12–200 % with one label,
    "100" (a second axis takes its parent's log scale with a label per decade only), so no row's share of the roof
    could be read off it. It is labelled at 20, 50, 100 and 200, as the left axis at 10, 20 and 50."""
    from attnbench.reports.plots import decode_bandwidth

    frame = fabricate(impls=("bmm", "fused_cpu"), seq_k=[256, 512]).assign(seq_q=1, mask="causal_bottom_right")
    frame["gbps"] = [17.0, 19.0, 9.0, 29.0]
    ok = plottable(frame)
    roofs = {("test cpu", "cpu", "float32"): Roofs(1.0, 42.3, 0.5, 40.0)}
    figure = decode_bandwidth(ok, palette(sorted(set(ok["impl"]))), roofs)
    figure.canvas.draw()
    (percent,) = figure.axes[0].child_axes
    low, high = sorted(percent.yaxis.get_view_interval())
    shown = [
        t.get_text() for t in percent.yaxis.get_ticklabels() if t.get_text() and low <= t.get_position()[1] <= high
    ]
    assert shown == ["20", "50", "100", "200"], shown
    plt.close(figure)


def test_a_decode_panel_of_one_kv_length_names_it_in_its_title():
    from attnbench.reports.plots import decode_bandwidth

    frame = fabricate(impls=("bmm", "fused_cpu"), seq_k=[2048]).assign(seq_q=1, gbps=[10.0, 20.0])
    frame["mask"] = "causal_bottom_right"
    ok = plottable(frame)
    figure = decode_bandwidth(ok, palette(sorted(set(ok["impl"]))), ROOFS)
    assert figure.axes[0].get_title().replace("\n", " ").endswith("decode Sq1 Sk2048")
    plt.close(figure)


def test_the_decode_figures_gb_per_s_axis_says_it_holds_q_and_o_too():
    """The points are each row's gbps, whose bytes are q, the KV cache read and o (attnbench.workload.flops): an MLA
    decode step's q and o (128 heads of 576 and 512) are a fifth of its bytes at 1024 keys. The axis said "bytes of
    the KV read"; it now names all three."""
    from attnbench.reports.plots import decode_bandwidth
    from attnbench.workload.flops import attention_bytes

    mla = Workload(1, 128, 1, 1, 1024, 576, mask="causal_bottom_right", head_dim_v=512, kv_layout="latent")
    q_and_o = 4 * 128 * (576 + 512)
    assert q_and_o / attention_bytes(mla) == pytest.approx(0.19, abs=0.01)
    frame = fabricate(impls=("bmm", "fused_cpu"), seq_k=[2048]).assign(seq_q=1, gbps=[10.0, 20.0])
    frame["mask"] = "causal_bottom_right"
    ok = plottable(frame)
    figure = decode_bandwidth(ok, palette(sorted(set(ok["impl"]))), ROOFS)
    labels = [axis.get_ylabel() for axis in figure.axes] + [t.get_text() for t in figure.texts]
    said = [label for label in labels if label.startswith("GB/s")]
    assert said and all("q" in label and "o)" in label and "KV" in label for label in said), labels
    plt.close(figure)


def test_a_cache_resident_decode_row_is_drawn_cold_too_as_a_hollow_marker():
    """A decode step whose cache fits in the last-level cache ran at 175 % of the DRAM roof warm and 70 % cold:
    the figure drew the warm figure alone. Its cold figure (the caches flushed before each call) is now a
    hollow marker beside it, said in the legend; a row that reads memory warm is drawn once."""
    from attnbench.reports.plots import decode_bandwidth, decode_latency

    frame = fabricate(impls=("bmm", "fused_cpu"), seq_k=[1024, 8192]).assign(seq_q=1, mask="causal_bottom_right")
    frame["gbps"], frame["median_ms"] = [40.0, 30.0, 90.0, 45.0], [0.4, 4.0, 0.2, 3.0]
    frame["cold_median_ms"] = [0.8, 4.2, 0.5, 3.1]
    frame["cache_resident"] = [True, False, True, False]
    ok = plottable(frame)
    colours = palette(sorted(set(ok["impl"])))
    for figure, cold in (
        (decode_bandwidth(ok, colours, ROOFS), [20.0, 36.0]),
        (decode_latency(ok, colours), [0.8, 0.5]),
    ):
        hollow = [c for c in figure.axes[0].collections if len(c.get_offsets()) and not c.get_facecolors().any()]
        assert sorted(float(c.get_offsets()[0][1]) for c in hollow) == sorted(cold)
        assert [c.get_offsets()[0][0] for c in hollow] == [1024, 1024]
        labels = [t.get_text() for legend in figure.legends for t in legend.get_texts()]
        assert "hollow: caches flushed" in labels
        plt.close(figure)
    warm_only = decode_bandwidth(plottable(frame.assign(cache_resident=False)), colours, ROOFS)
    assert "hollow: caches flushed" not in [t.get_text() for lg in warm_only.legends for t in lg.get_texts()]
    plt.close(warm_only)


def test_the_compare_figure_labels_one_draws_each_floor_and_counts_what_it_left_out():
    """Its ticks were 0.96, 0.99, 1.02 (the line of no change unlabelled), its grey band was --threshold though
    the verdicts use each case's floor, and the cases it could not draw went unsaid."""
    from attnbench.reports.compare import Settings, ratio_plot

    table = pd.DataFrame(
        {
            "impl": ["a", "b", "c", "d"],
            "workload": ["w"] * 4,
            "verdict": ["same", "slower", "unclear", "not comparable"],
            "ratio": [0.97, 1.12, 1.04, None],
            "floor": [0.02, 0.03, 0.14, None],
        }
    )
    figure = ratio_plot(table, Settings())
    axis = figure.axes[0]
    figure.canvas.draw()
    low, high = axis.get_xlim()
    assert 1.0 in [t for t in axis.get_xticks() if low <= t <= high]
    bars = axis.collections[-1].get_segments()
    assert [round(seg[1][0], 2) for seg in bars] == [1.02, 1.03, 1.14]  # each case's floor, not the threshold
    assert axis.get_title().startswith("1 case(s) not drawn")
    plt.close(figure)
    # compare.png sent alone said "new / base" without saying which runs those were
    from attnbench.reports.figure_layout import text_overlaps

    figure = ratio_plot(table, Settings(), ("quick-0401", "quick-0402"))
    assert figure.axes[0].get_xlabel().endswith("floor\nnew: quick-0402, base: quick-0401")
    assert text_overlaps(figure) == []
    plt.close(figure)


def test_a_log_value_axis_has_a_labelled_tick_under_its_lowest_point():
    """fused_cpu at 2.6 ms sat below the lowest label (5): the axis now starts at the 1-2-5 step below it."""
    from attnbench.reports.figure_layout import finish, value_axis

    figure, axis = plt.subplots()
    axis.plot([1, 2, 3], [2.6, 9.0, 40.0])
    value_axis(axis, [2.6, 9.0, 40.0])
    finish(figure)
    low, high = axis.get_ylim()
    shown = [t for t in axis.get_yticks() if low <= t <= high]
    assert low == 2.0 and min(shown) <= 2.6
    plt.close(figure)


def test_a_reference_lines_label_moves_to_the_end_where_it_hides_no_point():
    """A roof's label at the panel's left hid the fastest point right under the line: the label takes the end
    whose box covers no point, and two labels do not take one box."""
    from attnbench.reports.plots import Reference, _drawn_points, _reference_line

    figure, axis = plt.subplots(figsize=(4.4, 3.4))
    axis.plot([1, 2, 3, 4, 5, 6], [0.97, 0.5, 0.4, 0.3, 0.2, 0.1], marker="o")  # the first point under the line
    axis.set_xlim(0.8, 6.2)
    axis.set_ylim(0, 1.2)
    points, taken = _drawn_points(axis), []
    taken.append(_reference_line(axis, Reference(1.0, "hardware roof 1 TFLOP/s"), points, taken))
    taken.append(_reference_line(axis, Reference(0.98, "torch matmul 0.98 TFLOP/s"), points, taken))
    roof, matmul = (text for text in axis.texts)
    assert roof.get_ha() == "right" and taken[0][0] > 0.5  # moved off the point at the left
    assert matmul.get_ha() == "left" or taken[1][2] >= taken[0][3] or taken[1][3] <= taken[0][2]
    plt.close(figure)


def test_a_reference_lines_label_moves_off_a_line_between_two_markers():
    """A line from far left to far right passes under the left end's label with no marker there: the label
    takes the other end, where nothing is drawn."""
    from attnbench.reports.plots import Reference, _drawn_points, _reference_line

    figure, axis = plt.subplots(figsize=(4.4, 3.4))
    axis.plot([1, 64], [1.15, 0.1], marker="o")  # log x: under the left label only the line, its markers clear
    axis.plot([1, 64], [0.1, 0.1], marker="o")
    axis.set_xscale("log", base=2)
    axis.set_xlim(0.5, 100)
    axis.set_ylim(0, 1.2)
    points = _drawn_points(axis)
    _reference_line(axis, Reference(0.95, "hardware roof 1 TFLOP/s", left=True), points, [])
    (label,) = axis.texts
    assert label.get_ha() == "right"
    plt.close(figure)


def _lab(rgb):
    """sRGB (0–1) to CIELAB (D65)."""
    rgb = np.asarray(rgb, float)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    xyz = xyz / [0.95047, 1.0, 1.08883]
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def _ciede2000(first, second, k_l=2.0):
    """CIEDE2000 between two sRGB colours (Sharma, Wu and Dalal's formulation), lightness weighted by 1/k_l."""
    (l1, a1, b1), (l2, a2, b2) = _lab(first), _lab(second)
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean**7 / (c_mean**7 + 25**7)))
    a1, a2 = a1 * (1 + g), a2 * (1 + g)
    c1, c2 = math.hypot(a1, b1), math.hypot(a2, b2)
    h1, h2 = math.degrees(math.atan2(b1, a1)) % 360, math.degrees(math.atan2(b2, a2)) % 360
    dh = 0.0 if c1 * c2 == 0 else (h2 - h1 + 180) % 360 - 180
    d_hue = 2 * math.sqrt(c1 * c2) * math.sin(math.radians(dh / 2))
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    h_mean = h1 + h2 if c1 * c2 == 0 else ((h1 + h2) / 2 + (180 if abs(h1 - h2) > 180 else 0)) % 360
    t = (
        1
        - 0.17 * math.cos(math.radians(h_mean - 30))
        + 0.24 * math.cos(math.radians(2 * h_mean))
        + 0.32 * math.cos(math.radians(3 * h_mean + 6))
        - 0.20 * math.cos(math.radians(4 * h_mean - 63))
    )
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    r_t = (
        -math.sin(math.radians(60 * math.exp(-(((h_mean - 275) / 25) ** 2))))
        * 2
        * math.sqrt(c_mean**7 / (c_mean**7 + 25**7))
    )
    dl, dc, dh_ = (l2 - l1) / (k_l * s_l), (c2 - c1) / s_c, d_hue / s_h
    return math.sqrt(dl**2 + dc**2 + dh_**2 + r_t * dc * dh_)


def test_every_two_contenders_colours_differ_as_much_as_tab10s_closest_pair():
    """sdpa_cudnn (navy) and torch_mha (indigo) — GPU peers drawn in one figure — were 7.9 apart (CIEDE2000),
    and navy read as a darker twin of bmm's blue. Every pair of the twenty colours is now at least as far apart as
    tab10's own closest pair (red and brown), and no colour after tab10's ten is another blue."""
    import colorsys

    colours = colour_cycle()
    tab10 = colours[:10]
    closest_tab10 = min(_ciede2000(a, b) for a, b in itertools.combinations(tab10, 2))
    pairs = {(i, j): _ciede2000(colours[i], colours[j]) for i, j in itertools.combinations(range(20), 2)}
    close = {pair: round(d, 1) for pair, d in pairs.items() if d < closest_tab10 - 1e-9}
    assert not close, (closest_tab10, close)
    for colour in colours[10:]:
        hue, saturation, _ = colorsys.rgb_to_hsv(*colour)
        assert not (saturation > 0.25 and 185 <= hue * 360 <= 255), matplotlib.colors.to_hex(colour)


def test_a_figure_lists_the_contenders_it_leaves_out_and_why(tmp_path):
    """A one-size panel with fused_cpu alone in it read as a race of one: the others had stalled or were
    unsupported there, which only the page's table said. The legend now lists each contender with cases that have
    no ok row, and how they ended; one this machine lacks (unavailable) is left to the page's table."""
    from attnbench.reports.plots import not_drawn, throughput

    frame = fabricate(impls=("bmm", "sdpa_flash", "naive", "fused_triton"), seq_q=[256, 512])
    frame.loc[(frame["impl"] == "bmm") & (frame["seq_q"] == 512), "status"] = "stalled"
    frame.loc[frame["impl"] == "naive", "status"] = ["unsupported", "incorrect"]
    frame.loc[frame["impl"] == "fused_triton", "status"] = "unavailable"
    again = frame[frame["impl"] == "bmm"].assign(status="ok")  # a second run where bmm ran clean
    assert not_drawn(frame) == {"bmm": "1 stalled", "naive": "1 incorrect, 1 unsupported"}
    assert not_drawn(pd.concat([frame, again])) == {"naive": "1 incorrect, 1 unsupported"}
    assert not_drawn(frame[frame["status"] == "ok"]) == {}
    ok = plottable(frame)
    figure = throughput(ok, palette(sorted(set(ok["impl"]))), {}, not_drawn(frame))
    labels = [handle.get_label() for handle in figure.legends[0].legend_handles]
    said = ["\nnot drawn (cases with no ok row):", "bmm: 1 stalled", "naive: 1 incorrect, 1 unsupported"]
    assert labels == ["bmm", "sdpa_flash", *said]
    plt.close(figure)
    drawn = dict(draw_all(frame, tmp_path, None, {}))
    assert "Latency" in drawn and drawn["Latency"].is_file()


def test_every_line_figure_of_the_page_lists_the_contenders_it_leaves_out(tmp_path, monkeypatch):
    """memory.png alone had no "not drawn" list: in a run where bmm and sdpa_flash stalled at S512, its panel showed
    fused_cpu alone there, as if the others needed no memory, while latency.png and tflops.png said they stalled."""
    from attnbench.reports import plots

    frame = fabricate(impls=("bmm", "sdpa_flash", "fused_cpu"), seq_q=[256, 512])
    frame.loc[(frame["impl"] != "fused_cpu") & (frame["seq_q"] == 512), "status"] = "stalled"
    legends, save = {}, plots.save

    def keep_legend(figure, path):
        legends[path.name] = [h.get_label() for legend in figure.legends for h in legend.legend_handles]
        return save(figure, path)

    monkeypatch.setattr(plots, "save", keep_legend)
    draw_all(frame, tmp_path, None, ROOFS)
    for name in ("latency.png", "tflops.png", "memory.png"):
        assert legends[name][-2:] == ["bmm: 1 stalled", "sdpa_flash: 1 stalled"], (name, legends[name])
