"""What a new user hit (issue 36): one command sizing prefill and decode, a warning for plans whose rows see
nothing, the presets' layer counts. (The stalled status is tests/test_stall.py; float64 is in
tests/test_contenders.py.)"""

from attnbench.reports.ab_report import format_table
from attnbench.runner.sweep import plan_warnings
from attnbench.workload import Workload
from attnbench.workload.models import describe
from attnbench.workload.suite import DEFAULTS, Suite, expand

SUITE = Suite("t", "", 1.0, 60.0, ({**DEFAULTS},))


def shapes(**overrides):
    cases = expand(
        SUITE, {**{k: v if isinstance(v, list) else [v] for k, v in overrides.items()}, "impl": ["bmm"]}, ["bmm"]
    )
    return {(w.layer, w.seq_q, w.seq_k, w.mask) for _, w in cases}


def test_seq_kv_sizes_the_decode_cache_and_prefill_keeps_its_own_keys():
    got = shapes(model="gpt-oss-20b", phase=["prefill", "decode"], seq_kv=1024)
    prefill = {(sq, sk, mask) for layer, sq, sk, mask in got if sq > 1}
    decode = {(sq, sk, mask) for layer, sq, sk, mask in got if sq == 1}
    assert prefill and all(sq == sk for sq, sk, _ in prefill)  # S4096 x 4096, not x 1024
    assert {mask for _, _, mask in prefill} == {"causal", "sliding_window"}
    assert {sk for _, sk, _ in decode} == {1024}


def test_one_command_sizes_both_phases_with_seq_and_seq_kv():
    got = shapes(model="llama3.1-8b", phase=["prefill", "decode"], seq=256, seq_kv=8192)
    assert got == {("", 256, 256, "causal"), ("", 1, 8192, "causal_bottom_right")}


def test_a_phase_alone_takes_both_flags_as_before():
    assert shapes(model="llama3.1-8b", phase="prefill", seq=256, seq_kv=8192) == {
        ("", 256, 8192, "causal_bottom_right")
    }
    assert shapes(model="llama3.1-8b", phase="decode", seq=4, seq_kv=1024) == {("", 4, 1024, "causal_bottom_right")}


def test_a_plan_whose_rows_mostly_see_no_key_is_warned_of():
    blind = Workload(1, 2, 2, 4096, 1024, 16, mask="causal_bottom_right")  # 3/4 of its rows see nothing
    half = Workload(1, 2, 2, 2048, 1024, 16, mask="causal_bottom_right")  # exactly half: not warned
    (warning,) = plan_warnings([blind, half, blind])
    assert warning.startswith("1 workload(s) where most query rows see no key (e.g. B1 H2 S4096x1024 D16")
    assert "75% of its rows" in warning and "--seq-kv ≥ --seq" in warning
    assert plan_warnings([half, Workload(1, 2, 2, 64, 64, 16, mask="causal")]) == []


def test_every_preset_of_one_kind_of_layer_says_how_many_it_has():
    lines = {line.split()[0]: line for line in describe().splitlines()[1:17]}
    assert lines["deepseek-v3"].endswith("full:61")
    assert lines["qwen3-8b"].endswith("full:36") and lines["qwen3-32b"].endswith("full:64")
    assert lines["gpt-oss-20b"].endswith("sliding:12,full:12")


def test_the_ab_table_names_its_columns_for_what_they_are():
    """27.99 and 23.91 ms beside 1.010: the ratio is the median of the rounds' ratios, and the header says so."""
    record = {
        "workload": "B1 H8 S1024 D64 float32 cpu none fwd",
        "median_a_ms": 27.99,
        "median_b_ms": 23.91,
        "ratio": 1.010,
        "ci_low": 0.99,
        "ci_high": 1.03,
        "n_pairs": 20,
        "verdict": "same",
    }
    header = format_table([record]).splitlines()[0]
    assert "A median ms" in header and "B median ms" in header and "median of round B/A" in header


def test_a_contender_no_workload_of_the_sweep_suits_is_left_out_unless_named():
    from attnbench.runner.request import RunRequest
    from attnbench.runner.sweep import plan_cases

    left_out: dict[str, str] = {}
    _, cases = plan_cases(RunRequest(suite="quick"), left_out)
    impls = {impl for impl, _ in cases}
    assert "cascade" not in impls and {"bmm", "fused_cpu", "sdpa_flash"} <= impls
    assert list(left_out) == ["cascade"] and "shared_prefix is 0" in left_out["cascade"]
    assert len(cases) == 6 * len(impls)  # every other contender on every workload, unavailable ones included
    named: dict[str, str] = {}
    _, cases = plan_cases(RunRequest(suite="quick", axes={"impl": ["cascade", "bmm"]}), named)
    assert {impl for impl, _ in cases} == {"cascade", "bmm"} and named == {}  # asked for by name: planned


def test_a_contender_left_out_of_one_sweep_only_says_its_other_cases_ran(planted):
    """quick's second sweep is bottom-right causal and padding: a contender of none and causal only is left out of
    it, runs in the first, and the line says both — with each mask's reason, not the first workload's alone."""
    import attnbench
    from attnbench.cli import left_out_lines
    from attnbench.runner.request import RunRequest
    from attnbench.runner.sweep import plan_cases

    class TwoMasks(attnbench.Contender):
        name = "planted_two_masks"
        capabilities = attnbench.Capabilities(
            devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}), masks=frozenset({"none", "causal"})
        )

        def prepare(self, inputs, workload):
            return lambda: inputs.q

    attnbench.register(TwoMasks())
    planted.append(TwoMasks.name)
    left_out: dict[str, str] = {}
    partly: list[str] = []
    _, cases = plan_cases(RunRequest(suite="quick"), left_out, partly)
    assert TwoMasks.name in {impl for impl, _ in cases} and partly == [TwoMasks.name]
    said = left_out[TwoMasks.name]
    assert "causal_bottom_right" in said and "padding" in said, said
    assert "cascade" in left_out and "cascade" not in partly
    lines = left_out_lines({"left_out": left_out, "left_out_partly": partly})
    (line,) = [line for line in lines if TwoMasks.name in line]
    assert line.strip().startswith(f"{TwoMasks.name}: left out of the sweeps where it suits no workload (")
    assert line.endswith("; its other cases ran"), line
    (cascade,) = [line for line in lines if "cascade" in line]
    assert "cascade: left out — unsupported on every workload of its sweeps (" in cascade


def test_compare_says_the_run_wide_shift_is_the_runs_not_this_workloads():
    import math

    import numpy as np

    from attnbench.reports.compare import Settings, verdict

    base = np.array([10.0, 10.1, 9.9, 10.05, 9.95])
    got, ratio, _, _, note = verdict(base, base * 1.70, Settings(), shift=math.log(1.689))
    assert got == "unclear" and ratio == 1.7
    assert note.startswith("this case moved +70.0%, and the cases it is judged beside +68.9% (the median change of")


def _series(medians, sigma):
    from attnbench.reports.changes import Point

    return [Point(f"r{i}", f"c{i}", False, i, m, sigma, "samples") for i, m in enumerate(medians)]


def test_history_calls_no_step_in_an_a_a_series_of_a_bimodal_contender():
    """sdpa_flash on a 2-core VM: each run's median in one of two modes (1.85-1.88 or 2.22-2.30 ms), its samples
    tight (1 %): the modes are between-run noise, not steps. Seeded series: none in the issue's shape, and few
    of 200 random ones (they cannot all be told from a real step: AAAAABBBBB is one)."""
    import numpy as np

    from attnbench.reports.changes import detect

    observed = [1.86, 2.25, 1.87, 1.85, 2.28, 2.23, 1.88, 2.22, 1.86, 2.30]  # modes, as the series
    assert detect(_series(observed, 0.01)).steps == []
    alarms = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        modes = [rng.uniform(1.85, 1.88) if rng.random() < 0.5 else rng.uniform(2.22, 2.30) for _ in range(10)]
        alarms += bool(detect(_series(modes, 0.01)).steps)
    assert alarms <= 20, alarms  # 17 here; 77 of 200 with the median-only series noise


def test_history_finds_a_25_percent_step_of_real_work_on_a_quiet_machine():
    import math

    import numpy as np

    from attnbench.reports.changes import detect

    found = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        medians = [8.5 * math.exp(rng.normal(0, 0.03)) * (1.25 if i >= 5 else 1) for i in range(10)]
        steps = detect(_series(medians, 0.02)).steps
        found += len(steps) == 1 and steps[0].index == 5 and steps[0].direction == "slower"
    assert found >= 95, found


def test_a_stored_a_a_series_of_a_bimodal_contender_is_no_step_and_a_kernel_25_percent_slower_is(cli, tmp_path):
    """`attnbench history` over a store of ten runs (one per commit of a user's kernel repository), as the
    issue's: sdpa_flash never changed but its medians land in two modes (1.85-1.88 or 2.22-2.30 ms), its
    samples tight (1 %); bmm steady; the user's kernel does 25 % more work from the sixth commit (runs 3 %
    apart on a quiet machine). The one step history reports is the kernel's."""
    import pandas as pd

    from conftest import v1_store

    db = tmp_path / "store.duckdb"
    flash = [1.86, 2.25, 1.87, 1.85, 2.28, 2.23, 1.88, 2.22, 1.86, 2.30]
    bmm = [4.02, 3.97, 4.05, 3.99, 4.01, 4.04, 3.96, 4.00, 4.03, 3.98]
    mine = [8.5, 8.3, 8.7, 8.6, 8.4, 10.6, 10.8, 10.5, 10.9, 10.6]
    v1_store(db, {"sdpa_flash": flash, "bmm": bmm, "mine": mine}, "quiet box", seq=(512, 256), iqr_share=0.0135)
    code, out, err = cli("history", "--db", str(db), "--out", str(tmp_path / "page"))
    assert code == 0, err
    assert out.startswith("10 runs, 3 cases on 1 machine(s): 1 step(s)"), out
    changes = pd.read_csv(tmp_path / "page" / "changes.csv", dtype={"commit_before": str, "commit_after": str})
    (step,) = changes.itertuples()
    assert step.impl == "mine" and (step.commit_before, step.commit_after) == (f"{4:040x}", f"{5:040x}")
