"""`attnbench profile` accounts for a call's whole time: each call runs under its own record_function range;
the range's time that no torch operator explains is the contender's own kernel where it runs in one long
stretch without a torch op (numpy, ctypes), else Python and dispatch overhead between the ops (a pure-torch
contender, issue 24 item 5); what nothing explains is `unattributed`, and every case's breakdown adds up to
its measured median (issue 12 item 3)."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import attnbench
from attnbench.impls.fused_cpu import bindings as _cpu_kernel
from attnbench.runner._profiling import (
    OUTSIDE_OPS,
    OVERHEAD,
    UNATTRIBUTED,
    nearest,
    op_totals,
    outside_op_stretches,
)

from conftest import BOOM_AT, plant_raising

needs_compiler = pytest.mark.skipif(_cpu_kernel.unavailable_reason() is not None, reason="no C++ compiler here")


def named_share(breakdown: pd.DataFrame) -> float:
    """Fraction of a case's measured median that named categories (not ``other``/``unattributed``) explain."""
    named = breakdown.loc[~breakdown["category"].isin(("other", UNATTRIBUTED)), "ms_per_call"].sum()
    median = float(breakdown["median_ms"].iloc[0]) if len(breakdown) else 0.0
    return float(named) / median if median > 0 else 0.0


class NumpyKernel(attnbench.Contender):
    """A third-party kernel: attention computed by numpy, which torch.profiler does not see."""

    name = "planted_numpy_kernel"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}))

    def prepare(self, inputs, workload):
        import torch

        q, k, v = (t.detach().numpy() for t in (inputs.q, inputs.k, inputs.v))

        def run():
            scores = q @ np.swapaxes(k, -1, -2) * inputs.scale
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            return torch.from_numpy(probs @ v)

        return run


class SlowUnderAFreshTracer(attnbench.Contender):
    """Sleeps 2 ms a call, and 40 ms more on its first three calls while a profiler records: what a tracer's
    start-up did to bmm's first recorded calls on a 2-vCPU Xeon (18-38 ms against 11-15)."""

    name = "planted_slow_under_a_fresh_tracer"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}))

    def prepare(self, inputs, workload):
        import time

        import torch

        from attnbench.workload.reference import reference_output

        out, profiled = reference_output(inputs, torch.arange(workload.seq_q)).to(torch.float32), []

        def run():
            if torch._C._autograd._profiler_enabled():
                profiled.append(1)
                if len(profiled) <= 3:
                    time.sleep(0.04)
            time.sleep(0.002)
            return out

        return run


def _breakdown(out, impl):
    frame = pd.read_csv(out / "breakdown.csv")
    return frame[frame.impl == impl].set_index("category")


def _check_adds_up(rows):
    median = rows["median_ms"].iloc[0]
    assert rows["ms_per_call"].sum() == pytest.approx(median, rel=1e-6)
    assert rows["pct"].sum() == pytest.approx(100, rel=1e-6)
    assert (rows["profiled_ms"] > 0).all() and UNATTRIBUTED in rows.index


def test_a_kernel_outside_torch_ops_is_the_bulk_of_its_profile(cli, planted, tmp_path):
    attnbench.register(NumpyKernel())
    planted.append(NumpyKernel.name)
    out = tmp_path / "prof"
    shape = ["--batch", "1", "--heads", "4", "--seq", "384", "--head-dim", "64", "--budget-s", "0.05"]
    code, text, _ = cli("profile", "--impl", f"{NumpyKernel.name},sdpa_flash", *shape, "--out", str(out))
    assert code == 0
    numpy_rows = _breakdown(out, NumpyKernel.name)
    _check_adds_up(numpy_rows)
    assert numpy_rows.loc[OUTSIDE_OPS, "pct"] > 80
    assert named_share(numpy_rows.reset_index()) > 0.8
    flash = _breakdown(out, "sdpa_flash")
    _check_adds_up(flash)
    assert flash.loc["fused_attention", "pct"] > 50  # torch's own operator still gets the time
    top = pd.read_csv(out / "top_ops.csv")
    assert f"attnbench.call:{NumpyKernel.name} ({OUTSIDE_OPS})" in set(top.op)
    assert f"{OUTSIDE_OPS} " in text and "median " in text


def _event(name, start, end, children=()):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), cpu_children=list(children))


def test_stretches_without_a_torch_op_are_a_kernel_only_when_long():
    """Per call: a stretch ≥ a quarter of the call and ≥ 50 µs is a kernel; short ones are overhead."""
    pure_torch = _event(
        "attnbench.call:t",
        0,
        1000,
        [_event("aten::bmm", 30, 480), _event("aten::softmax", 490, 600), _event("aten::bmm", 610, 920)],
    )
    native = _event("attnbench.call:t", 0, 1000, [_event("aten::empty", 10, 15), _event("aten::view", 990, 995)])
    tiny = _event("attnbench.call:t", 0, 40, [_event("aten::mm", 25, 35)])  # 25 µs lead: over a quarter, not long
    other = _event("attnbench.call:other", 0, 5000)
    assert outside_op_stretches([pure_torch], "attnbench.call:t") == (0.0, 30 + 10 + 10 + 80)
    assert outside_op_stretches([native], "attnbench.call:t") == (975.0, 10 + 5)
    assert outside_op_stretches([pure_torch, native, tiny, other], "attnbench.call:t") == (975.0, 130 + 15 + 30)


def test_the_calls_kept_are_those_nearest_the_median():
    walls = [30.0, 11.0, 12.0, 25.0, 10.5, 11.2]
    assert nearest(walls, 11.0, 3) == [1, 4, 5]
    assert nearest(walls, 11.0, 10) == list(range(6))
    assert nearest([5.0, 5.0, 5.0], 5.0, 2) == [0, 1]  # ties: the first recorded


def test_op_totals_sum_self_times_over_the_given_calls_only():
    def op(name, self_us, children=()):
        return SimpleNamespace(name=name, self_cpu_time_total=self_us, cpu_children=list(children))

    first = op("attnbench.call:t", 5, [op("aten::bmm", 100, [op("aten::empty", 1)]), op("aten::bmm", 80)])
    second = op("attnbench.call:t", 7, [op("aten::softmax", 30)])
    left_out = op("attnbench.call:t", 9, [op("aten::bmm", 1000)])
    totals = {t.key: (t.self_cpu_time_total, t.count) for t in op_totals([first, second])}
    assert totals == {
        "attnbench.call:t": (12, 2),
        "aten::bmm": (180, 2),
        "aten::empty (in aten::bmm)": (1, 1),  # inside a matmul: its work
        "aten::softmax": (30, 1),
    }
    assert op_totals([left_out])[1].self_cpu_time_total == 1000


def _op(name, self_us, shapes=(), children=()):
    """A profiler event as op_totals reads it: its name, self time (µs), operand shapes and child events."""
    return SimpleNamespace(
        name=name, self_cpu_time_total=self_us, input_shapes=list(shapes), cpu_children=list(children)
    )


def test_an_op_inside_a_softmax_or_matmul_counts_to_it():
    """sdpa_math's safe softmax spent most of its time in isneginf, all and where, which the breakdown put in
    `other` (28 % of the call at S256, softmax 10 %); the same where building a mask stays `other`."""

    op = _op
    safe = op(
        "aten::_safe_softmax",
        2,
        children=[op("aten::_softmax", 100), op("aten::isneginf", 50), op("aten::where", 60)],
    )
    matmul = op("aten::matmul", 1, children=[op("aten::reshape", 4), op("aten::bmm", 200)])
    call = op("attnbench.call:my_softmax", 3, children=[op("aten::where", 40), matmul, safe])
    totals = {t.key: (t.self_cpu_time_total, t.category) for t in op_totals([call])}
    assert totals == {
        "attnbench.call:my_softmax": (3, "softmax"),  # the range's name is the contender's: its ops are not softmax
        "aten::where": (40, "other"),
        "aten::matmul": (1, "matmul"),
        "aten::reshape (in aten::matmul)": (4, "matmul"),
        "aten::bmm": (200, "matmul"),
        "aten::_safe_softmax": (2, "softmax"),
        "aten::_softmax": (100, "softmax"),
        "aten::isneginf (in aten::_safe_softmax)": (50, "softmax"),
        "aten::where (in aten::_safe_softmax)": (60, "softmax"),
    }


def test_a_matmul_says_which_product_of_attention_it_computes():
    """The breakdown's matmul held both products; a kernel author asks how the time splits between Q·Kᵀ and P·V.
    Shapes as bmm records them at B1 H2 Sq 8 Sk 32 D 16 Dv 24, and as sdpa_math's aten::matmul around its bmm."""

    op = _op
    dims = (16, 32, 24)  # D, Sk, Dv
    scores = op("aten::bmm", 100, [[2, 8, 16], [2, 16, 32]], [op("aten::empty", 1)])
    matmul = op("aten::matmul", 2, [[1, 2, 8, 32], [1, 2, 32, 24]], [op("aten::reshape", 3), op("aten::bmm", 70)])
    odd = op("aten::mm", 5, [[8, 7], [7, 9]])  # neither product: no tag
    einsum = op(
        "aten::einsum", 4, [[], [[1, 2, 8, 16], [1, 2, 32, 16]]], [op("aten::bmm", 60, [[2, 8, 16], [2, 16, 32]])]
    )
    call = op("attnbench.call:t", 1, children=[scores, matmul, odd, einsum])
    totals = {t.key: (t.self_cpu_time_total, t.category) for t in op_totals([call], dims)}
    assert totals == {
        "attnbench.call:t": (1, "other"),
        "aten::bmm [scores Q·Kᵀ]": (160, "matmul"),  # bmm's own and the one inside the einsum
        "aten::einsum": (4, "matmul"),
        "aten::empty (in aten::bmm [scores Q·Kᵀ])": (1, "matmul"),
        "aten::matmul [P·V]": (2, "matmul"),
        "aten::reshape (in aten::matmul [P·V])": (3, "matmul"),
        "aten::bmm [P·V]": (70, "matmul"),
        "aten::mm": (5, "matmul"),
    }
    square = op("aten::bmm", 9, [[2, 8, 16], [2, 16, 16]])  # Sk = D = Dv: either product
    assert [t.key for t in op_totals([square], (16, 16, 16))] == ["aten::bmm"]
    assert [t.key for t in op_totals([op("r", 0, children=[scores])])][1] == "aten::bmm"  # no dims: no tag


def test_sdpa_math_softmax_share_holds_its_safe_softmax(cli, tmp_path):
    out = tmp_path / "prof"
    shape = ["--batch", "1", "--heads", "4", "--seq", "128", "--head-dim", "64", "--budget-s", "0.05"]
    code, _, _ = cli("profile", "--impl", "sdpa_math", *shape, "--out", str(out))
    assert code == 0
    tops = pd.read_csv(out / "top_ops.csv").set_index("op")
    assert tops.loc["aten::isneginf (in aten::_safe_softmax)", "category"] == "softmax"
    assert "aten::isneginf" not in tops.index
    _check_adds_up(_breakdown(out, "sdpa_math"))


def test_bmm_top_ops_split_its_matmul_time_into_the_two_products(cli, tmp_path):
    out = tmp_path / "prof"
    shape = ["--batch", "1", "--heads", "4", "--seq", "128", "--head-dim", "64", "--budget-s", "0.05"]
    code, text, _ = cli("profile", "--impl", "bmm", *shape, "--out", str(out))
    assert code == 0 and "aten::bmm [scores Q·Kᵀ]" in text and "aten::bmm [P·V]" in text
    tops = pd.read_csv(out / "top_ops.csv").set_index("op")
    assert tops.loc[["aten::bmm [scores Q·Kᵀ]", "aten::bmm [P·V]"], "category"].eq("matmul").all()
    assert (tops.loc[["aten::bmm [scores Q·Kᵀ]", "aten::bmm [P·V]"], "count_per_call"] == 1).all()


def test_a_tracers_slow_first_calls_stay_out_of_the_profile(cli, planted, tmp_path):
    """The three slow calls are recorded (13 for the 5 kept), and left out: the profile reads the median."""
    attnbench.register(SlowUnderAFreshTracer())
    planted.append(SlowUnderAFreshTracer.name)
    out = tmp_path / "prof"
    shape = ["--batch", "1", "--heads", "2", "--seq", "64", "--budget-s", "0.05"]
    code, text, _ = cli("profile", "--impl", SlowUnderAFreshTracer.name, *shape, "--out", str(out))
    assert code == 0 and "(the 5 of 13 recorded calls nearest the median)" in text
    rows = _breakdown(out, SlowUnderAFreshTracer.name)
    _check_adds_up(rows)
    median, profiled = rows["median_ms"].iloc[0], rows["profiled_ms"].iloc[0]
    assert profiled < 1.5 * median  # the old five calls held two slow ones (the warm-up took the first): 18 ms


class Sleeps40ms(attnbench.Contender):
    """A slow call: 40 ms (up to 50 on a busy machine), so a profile keeps int(0.1 s / 40 ms) = 2 calls."""

    name = "planted_sleeps_40ms"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}))

    def prepare(self, inputs, workload):
        import time

        import torch

        from attnbench.workload.reference import reference_output

        out = reference_output(inputs, torch.arange(workload.seq_q)).to(torch.float32)

        def run():
            time.sleep(0.04)
            return out

        return run


def test_fewer_calls_than_asked_say_why(cli, planted, tmp_path):
    """bmm at S2048 causal: the header read "the 1 of 5 recorded calls" after the default --calls 5, with no word of
    the cap on a profile's recorded time."""
    attnbench.register(Sleeps40ms())
    planted.append(Sleeps40ms.name)
    shape = ["--batch", "1", "--heads", "2", "--seq", "64", "--budget-s", "0.05"]
    code, text, _ = cli("profile", "--impl", Sleeps40ms.name, *shape, "--out", str(tmp_path / "prof"))
    assert code == 0
    assert "(the 2 of 7 recorded calls nearest the median; --calls 5 capped at about 0.1 s of calls)" in text
    code, text, _ = cli("profile", "--impl", Sleeps40ms.name, *shape, "--calls", "1", "--out", str(tmp_path / "p2"))
    assert code == 0 and "(the 1 of 5 recorded calls nearest the median)" in text


def test_a_pure_torch_contender_has_overhead_between_ops_not_a_kernel(cli, tmp_path):
    out = tmp_path / "prof"
    shape = ["--batch", "1", "--heads", "4", "--seq", "256", "--head-dim", "64", "--budget-s", "0.05"]
    code, text, _ = cli("profile", "--impl", "bmm", *shape, "--out", str(out))
    assert code == 0
    rows = _breakdown(out, "bmm")
    _check_adds_up(rows)
    assert rows.loc[OVERHEAD, "ms_per_call"] > 0 and f"{OVERHEAD} " in text
    ops = rows.drop(index=[OVERHEAD, *(r for r in rows.index if r.startswith("total"))], errors="ignore")
    assert ops["pct"].idxmax() == "matmul"  # the largest share of the ops (overhead's share moves with the load)


@needs_compiler
def test_fused_cpu_profile_shows_its_kernel(cli, tmp_path):
    out = tmp_path / "prof"
    shape = ["--heads", "4", "--seq", "512", "--budget-s", "0.05"]
    assert cli("profile", "--impl", "fused_cpu", *shape, "--out", str(out))[0] == 0
    rows = _breakdown(out, "fused_cpu")
    _check_adds_up(rows)
    assert rows.loc[OUTSIDE_OPS, "pct"] > 80
    assert named_share(rows.reset_index()) >= 0.8


class Wrong(attnbench.Contender):
    """Right shape, wrong numbers: zeros."""

    name = "planted_profile_wrong"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}))

    def prepare(self, inputs, workload):
        import torch

        return lambda: torch.zeros_like(inputs.q)


def test_a_case_that_is_wrong_or_raises_is_one_line_and_the_others_are_still_profiled(cli, planted, tmp_path):
    """As a run's rows would say it (incorrect, error), one line each, no traceback; the tables hold the cases
    that ran, the exit status is 1; with no case profiled, nothing is left behind."""
    attnbench.register(Wrong())
    planted.append(Wrong.name)
    raises = plant_raising(planted, "planted_profile_raises")
    shape = ["--batch", "1", "--heads", "2", "--seq", "64", "--head-dim", "16", "--mask", "none", "--budget-s", "0.05"]
    out = tmp_path / "prof"
    impls = f"{Wrong.name},bmm,{raises}"
    code, _, err = cli("profile", "--impl", impls, *shape, "--out", str(out))
    assert code == 1 and "Traceback" not in err, err
    said = [line for line in err.splitlines() if line.endswith("not profiled")]
    assert len(said) == 2 and f"{Wrong.name} B1 H2 S64 D16" in said[0] and ": incorrect — " in said[0], said
    assert said[1].endswith(f"error — RuntimeError: boom in my kernel{BOOM_AT}; not profiled"), said
    assert "2 case(s) not profiled" in err
    assert set(pd.read_csv(out / "breakdown.csv").impl) == {"bmm"}
    assert [p.name for p in out.glob("*.trace.json")] == [p.name for p in out.glob("bmm__*.trace.json")]
    code, _, err = cli("profile", "--impl", Wrong.name, *shape, "--out", str(tmp_path / "none"))
    assert code == 1 and "nothing profiled: all 1 case(s) failed" in err and not (tmp_path / "none").exists()


class CtrlCUnderTheProfiler(attnbench.Contender):
    """Correct, but a Ctrl-C arrives while the profiler records it."""

    name = "planted_ctrl_c_under_the_profiler"
    capabilities = attnbench.Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}))

    def prepare(self, inputs, workload):
        import torch

        q, k, v = inputs.q, inputs.k, inputs.v

        def run():
            if torch._C._autograd._profiler_enabled():
                raise KeyboardInterrupt
            return torch.softmax(q @ k.transpose(-1, -2) * inputs.scale, dim=-1) @ v

        return run


def test_ctrl_c_keeps_the_cases_profiled_and_leaves_no_trace_of_the_one_in_hand(cli, planted, monkeypatch, tmp_path):
    """The tables and traces of the cases before it, no trace without table rows, exit 130; with none profiled
    yet, no folder — and the line says nothing was written only when that is so."""
    import attnbench.cli

    attnbench.register(CtrlCUnderTheProfiler())
    planted.append(CtrlCUnderTheProfiler.name)
    shape = ["--batch", "1", "--heads", "2", "--seq", "64", "--head-dim", "16", "--mask", "none", "--budget-s", "0.05"]
    code, _, err = cli("profile", "--impl", CtrlCUnderTheProfiler.name, *shape, "--out", str(tmp_path / "none"))
    assert code == 130 and err.splitlines()[-1] == "attnbench: interrupted; nothing was written", err
    assert not (tmp_path / "none").exists()

    show = attnbench.cli._show_profile

    def ctrl_c_after_einsums_trace(profile, *rest):
        if profile.impl == "einsum":  # its trace is written: the interrupt lands between it and its tables
            raise KeyboardInterrupt
        return show(profile, *rest)

    monkeypatch.setattr(attnbench.cli, "_show_profile", ctrl_c_after_einsums_trace)
    out = tmp_path / "prof"
    code, _, err = cli("profile", "--impl", "bmm,einsum,sdpa_math", *shape, "--out", str(out))
    assert code == 130 and "Traceback" not in err
    assert (
        err.splitlines()[-1]
        == "profile: interrupted: the tables and traces hold the 1 case(s) profiled before it, of 3"
    )
    assert set(pd.read_csv(out / "breakdown.csv").impl) == set(pd.read_csv(out / "top_ops.csv").impl) == {"bmm"}
    assert [p.name.split("__")[0] for p in out.glob("*.trace.json")] == ["bmm"]
    assert not list(out.glob(".*"))  # no temporary file left


def test_a_case_timed_on_a_stalled_machine_says_so(cli, monkeypatch, tmp_path):
    """Where a run would time the row `stalled` (its threads waited for a core), the profile says its times are a
    busy machine's. The threshold is forced to catch every case: the warning's wording is under test, not the
    detection (tests/test_stall.py)."""
    import attnbench.cli

    monkeypatch.setattr(attnbench.cli, "WAITED_STALL", -1.0)
    shape = ["--batch", "1", "--heads", "2", "--seq", "64", "--head-dim", "16", "--mask", "none", "--budget-s", "0.05"]
    code, _, err = cli("profile", "--impl", "bmm", *shape, "--out", str(tmp_path / "p"))
    assert code == 0
    (line,) = [line for line in err.splitlines() if "stalled" in line]
    assert line.startswith("warning: bmm B1 H2 S64 D16") and "profile it again on a quieter one" in line


def test_profile_rejects_a_bad_budget(cli, tmp_path):
    code, _, err = cli("profile", "--impl", "bmm", "--budget-s", "0", "--out", str(tmp_path / "p"))
    assert code == 2 and "--budget-s 0: must be a positive number of seconds" in err
    assert not (tmp_path / "p").exists()


@pytest.mark.timing
@needs_compiler
def test_fused_cpu_named_categories_explain_the_run_median(cli, tmp_path):
    """The issue's bar, at its size: named categories ≥ 80 % of what `attnbench run` measures."""
    shape = ["--impl", "fused_cpu", "--batch", "1", "--heads", "8", "--seq", "2048", "--head-dim", "64"]
    assert cli("profile", *shape, "--out", str(tmp_path / "prof"))[0] == 0
    assert cli("run", *shape, "--budget-s", "1", "--no-memory", "--out", str(tmp_path / "run"))[0] == 0
    rows = _breakdown(tmp_path / "prof", "fused_cpu").reset_index()
    run_median = pd.read_parquet(tmp_path / "run" / "results.parquet")["median_ms"].iloc[0]
    named = rows.loc[~rows.category.isin(["other", UNATTRIBUTED]), "ms_per_call"].sum()
    assert named >= 0.8 * run_median


def test_profiled_calls_far_from_the_median_are_warned_of():
    """A busy machine recorded bmm's calls at 44.6 ms against a 15.5 ms median: its top-ops table (per profiled
    call) listed aten::bmm at twice the median while the breakdown was scaled to it, without a word."""
    import dataclasses
    from pathlib import Path

    from attnbench.cli import profiled_far_warning
    from attnbench.runner._profiling import CaseProfile
    from attnbench.workload import Workload

    empty = pd.DataFrame()
    profile = CaseProfile("bmm", Workload(1, 8, 8, 1024, 1024, 64), 5, 15.54, 44.64, Path("t"), empty, empty, empty)
    warning = profiled_far_warning(profile)
    assert warning is not None and warning.startswith("bmm B1 H8 S1024 D64")
    assert "took 44.64 ms each, 2.9× the median 15.54 ms" in warning and "profile it again on a quieter" in warning
    assert profiled_far_warning(dataclasses.replace(profile, profiled_ms=17.0)) is None  # the profiler's own cost
    gpu = dataclasses.replace(profile, workload=dataclasses.replace(profile.workload, device="cuda"))
    assert profiled_far_warning(gpu) is None  # CUDA tables are device times


def test_two_contenders_of_one_workload_are_read_across_in_one_table():
    """A kernel author profiling theirs beside a peer got two breakdowns, a screen apart, to compare by eye: each
    workload with two contenders or more is now one table, a column per contender, its categories by their largest
    time, a category one lacks shown as "-", the medians last; a workload profiled alone adds nothing."""
    from pathlib import Path

    from attnbench.runner._profiling import CaseProfile, side_by_side
    from attnbench.workload import Workload

    def profile(impl, workload, median, split):
        breakdown = pd.DataFrame({"category": list(split), "ms_per_call": list(split.values())})
        return CaseProfile(impl, workload, 5, median, median, Path("t"), pd.DataFrame(), breakdown, pd.DataFrame())

    pair, alone = Workload(1, 8, 8, 256, 256, 64), Workload(1, 8, 8, 128, 128, 64)
    profiles = [
        profile("bmm", pair, 2.0, {"matmul": 1.25, "softmax": 0.5, "copies": 0.25}),
        profile("mine", pair, 1.0, {"fused_attention": 0.875, "matmul": 0.125}),
        profile("bmm", alone, 0.5, {"matmul": 0.5}),
    ]
    lines = side_by_side(profiles).splitlines()
    assert lines[0] == f"{pair.label()}: ms per call, each contender's breakdown scaled to its median"
    assert [line.split() for line in lines[1:]] == [
        ["category", "bmm", "mine"],
        ["matmul", "1.25", "0.125"],
        ["fused_attention", "-", "0.875"],
        ["softmax", "0.5", "-"],
        ["copies", "0.25", "-"],
        ["median", "2", "1"],
    ]
    assert side_by_side(profiles[2:]) == ""
