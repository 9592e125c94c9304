"""What a run prints besides its table of times: a run where nothing ran, a progress line's long reason."""

import json

import pandas as pd
import pytest
import torch

from attnbench.reports.summary import summary_table
from attnbench.runner.results import STATUSES, case_key, make_row, rows_to_frame
from attnbench.runner.sweep import REASON_CHARS, CaseLines
from attnbench.workload import Workload

CASES = [Workload(1, 2, 2, seq, seq, 16) for seq in (32, 64)]


def test_a_run_where_no_contender_ran_says_so_not_an_empty_frame():
    rows = [make_row("sdpa_efficient", w, "unavailable", "a CUDA-only backend") for w in CASES]
    assert summary_table(rows_to_frame(rows)) == "(no contender ran on any of the 2 workloads)"


def test_a_progress_line_cuts_a_long_reason_at_a_word_and_says_so(capsys):
    lines = CaseLines([("bmm", w) for w in CASES])
    stalled = (
        "the machine stalled while it was timed (twice): its threads waited for a core 48% of their time "
        "(median sample; another process on its cores); time kept, not ranked"
    )
    long = " ".join(["word"] * 60)
    for w, reason in zip(CASES, (stalled, long), strict=True):
        row = make_row("bmm", w, "stalled", reason, median_ms=1.5)
        lines.say(case_key("bmm", w.as_row()), row)
    first, second = capsys.readouterr().err.splitlines()
    assert first.endswith(f"stalled 1.5 ms — {stalled}")  # whole: it fits
    said = second.split(" — ", 1)[1]
    assert said.endswith("word …") and len(said) <= REASON_CHARS


def test_a_contenders_stalled_rows_are_one_reason_with_their_percentages_as_a_range():
    from attnbench.reports.summary import non_ok_reasons

    waited = "its threads waited for a core {}% of their time; time kept, not ranked"
    rows = [
        make_row(impl, w, "stalled", waited.format(share), median_ms=1.0)
        for impl, shares in (("bmm", (48, 50)), ("einsum", (30, 30)))
        for w, share in zip(CASES, shares, strict=True)
    ]
    rows.append(make_row("naive", CASES[0], "error", "out of 3% of something"))
    assert non_ok_reasons(rows_to_frame(rows)).splitlines() == [
        f"  bmm: stalled — {waited.format('48–50')}",
        f"  einsum: stalled — {waited.format(30)}",
        "  naive cpu float32 B1 H2 S32 D16 none fwd: error — out of 3% of something",
    ]


def test_a_failed_cases_line_names_its_case_or_the_cases_that_share_it():
    """incorrect / error lines under the table say which workloads failed (review 1, finding 6: a contender that
    fails only its GQA cases said `error — RuntimeError: …` and nothing else); other statuses stay one line per
    reason."""
    from attnbench.reports.summary import non_ok_reasons

    gqa = [Workload(2, 8, 2, 128, 256, 64, mask=mask) for mask in ("none", "causal", "padding", "causal_bottom_right")]
    mismatch = "RuntimeError: The size of tensor a (8) must match the size of tensor b (2) at non-singleton dimension 1"
    rows = [make_row("notcallable", w, "error", mismatch) for w in gqa]
    rows.append(make_row("notcallable", CASES[0], "ok", median_ms=1.0))
    rows.append(make_row("clsplug", gqa[2], "incorrect", "max_abs_err 0.567 over tolerance", median_ms=1.0))
    rows += [make_row("sdpa_cudnn", w, "unavailable", "a CUDA-only backend") for w in CASES]
    assert non_ok_reasons(rows_to_frame(rows)).splitlines() == [
        "  notcallable (4 cases: cpu float32 B2 H8/2 S128x256 D64 none fwd; cpu float32 B2 H8/2 S128x256 D64 causal "
        f"fwd; cpu float32 B2 H8/2 S128x256 D64 padding fwd and 1 more): error — {mismatch}",
        "  clsplug cpu float32 B2 H8/2 S128x256 D64 padding fwd: incorrect — max_abs_err 0.567 over tolerance",
        "  sdpa_cudnn: unavailable — a CUDA-only backend",
    ]


def test_a_report_of_a_run_where_nothing_ran_ok_says_why_it_draws_no_time(cli, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("sdpa_efficient runs here")
    assert cli("run", "--impl", "sdpa_efficient", "--seq", "64", "--out", str(tmp_path / "run"))[0] == 0
    code, out, err = cli("report", str(tmp_path / "run"), "--out", str(tmp_path / "report"))
    assert code == 0 and f"report: {tmp_path / 'report' / 'report.html'}" in out
    assert "warning: no row ran ok (" in err and "unavailable), so the page draws no time" in err


def test_an_interrupt_before_the_first_case_is_one_line(cli, monkeypatch, tmp_path):
    """Ctrl-C while the run measures the machine (before its own handler, which starts with the first case): one
    line and exit 130, no traceback; nothing written for a new run, the resume command for a folder that has one."""
    import attnbench.runner.sweep

    tiny = ["--impl", "bmm", "--seq", "64", "--head-dim", "16", "--mask", "none", "--budget-s", "0.02", "--no-memory"]
    code, _, _ = cli("run", *tiny, "--suite", "quick", "--out", str(tmp_path / "done"))
    assert code == 0

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(attnbench.runner.sweep, "environment_warnings", interrupted)
    code, _, err = cli("run", *tiny, "--out", str(tmp_path / "new"))
    assert (code, err) == (130, "attnbench: interrupted; nothing was written\n") and not (tmp_path / "new").exists()
    code, _, err = cli("run", "--resume", str(tmp_path / "done"))
    expected = (
        f"attnbench: interrupted; finished rows are saved; continue with: attnbench run --resume {tmp_path / 'done'}\n"
    )
    assert (code, err) == (130, expected)


def test_a_run_under_the_triton_interpreter_says_its_triton_times_are_the_interpreters(cli, monkeypatch, tmp_path):
    """A kernel author checking a Triton kernel on a CPU (TRITON_INTERPRET=1) got its interpreted times in the table
    beside compiled contenders', ranked, and nothing said so: the run now warns, before the first case and in
    meta.json; without the variable it says nothing of the kind."""
    tiny = ["--impl", "bmm", "--seq", "64", "--head-dim", "16", "--mask", "none", "--budget-s", "0.02", "--no-memory"]
    said = "TRITON_INTERPRET is set: Triton kernels run in Triton's Python interpreter, so their rows check correctness"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code, _, err = cli("run", *tiny, "--suite", "quick", "--out", str(tmp_path / "interpreted"))
    assert code == 0 and f"warning: {said}" in err, err
    assert any(w.startswith(said) for w in json.loads((tmp_path / "interpreted" / "meta.json").read_text())["warnings"])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    code, _, err = cli("run", *tiny, "--suite", "quick", "--out", str(tmp_path / "compiled"))
    assert code == 0 and "TRITON_INTERPRET" not in err, err


def test_a_contenders_stall_reasons_merge_over_every_number_and_stay_together():
    """A busy machine's quick run listed einsum's stalls three times and sdpa_flash's four, between other
    contenders' lines: reasons that differ in their rounds and medians ("in 11 of 35 rounds (median 515)") did not
    merge, percentages alone did. Now a stall's numbers become ranges, a failure keeps its own figures, and a
    contender's lines sit together."""
    from attnbench.reports.summary import non_ok_reasons

    below = "its FMA yardstick ran below 50% of its quiet 534 GFLOP/s in {} of {} rounds (median {}); not ranked"
    waited = "its threads waited for a core {}% of their time; not ranked"
    rows = [
        make_row("einsum", CASES[0], "stalled", below.format(11, 35, 515), median_ms=1.0),
        make_row("bmm", CASES[0], "stalled", waited.format(50), median_ms=1.0),
        make_row("einsum", CASES[1], "stalled", below.format(15, 40, 501), median_ms=1.0),
        make_row("bmm", CASES[1], "error", "max_abs_err 0.5 over 0.01"),
        make_row("einsum", CASES[1], "stalled", waited.format(68), median_ms=1.0),
        make_row("bmm", CASES[0], "error", "max_abs_err 0.7 over 0.01"),
    ]
    assert non_ok_reasons(rows_to_frame(rows)).splitlines() == [
        f"  einsum: stalled — {below.format('11–15', '35–40', '501–515')}",
        f"  einsum: stalled — {waited.format(68)}",
        f"  bmm: stalled — {waited.format(50)}",
        "  bmm cpu float32 B1 H2 S64 D16 none fwd: error — max_abs_err 0.5 over 0.01",
        "  bmm cpu float32 B1 H2 S32 D16 none fwd: error — max_abs_err 0.7 over 0.01",
    ]
    skipped = "predicted {} s per call, over the case budget"  # a case's own figure: each its own line
    rows = [make_row("naive", w, "skipped", skipped.format(s)) for w, s in zip(CASES, (0.5, 8.1), strict=True)]
    assert len(non_ok_reasons(rows_to_frame(rows)).splitlines()) == 2


def test_fail_on_exits_1_where_a_row_has_a_status_named_and_0_otherwise(cli, tmp_path):
    """`run` exits 0 whatever its rows say; a CI job that wants a wrong kernel to fail its build says which statuses
    do (`--fail-on incorrect,error`), the line naming each status's count and contenders. A status that is not one
    is refused before anything runs."""
    if torch.cuda.is_available():
        pytest.skip("sdpa_efficient runs here")
    tiny = ["--seq", "64", "--head-dim", "16", "--mask", "none", "--budget-s", "0.02", "--no-memory"]
    code, _, err = cli("run", "--impl", "bmm,sdpa_efficient", *tiny, "--out", str(tmp_path / "a"), "--fail-on", "error")
    assert code == 0 and "failed" not in err, err
    code, _, err = cli("run", "--resume", str(tmp_path / "a"), "--fail-on", "incorrect,unavailable")
    assert code == 1, err
    statuses = pd.read_csv(tmp_path / "a" / "results.csv")["status"]
    n = int((statuses == "unavailable").sum())
    assert (
        n
        and err.splitlines()[-1]
        == f"failed (--fail-on incorrect,unavailable): {n} unavailable (sdpa_efficient{f' ×{n}' * (n > 1)})"
    )
    code, _, err = cli("run", "--impl", "bmm", *tiny, "--out", str(tmp_path / "b"), "--fail-on", "incorrect,wrong")
    assert code == 2 and not (tmp_path / "b").exists()
    assert err.strip().endswith("'wrong' is not a row status; choose from " + ", ".join(STATUSES[1:])), err
