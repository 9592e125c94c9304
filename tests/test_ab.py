"""`attnbench ab`: the verdict on fabricated paired rounds, the command end to end (A/A of bmm, and one
plugin at two git revisions), its figure, and bad input (one line, exit 2, nothing written)."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

from attnbench import Capabilities, Contender
from attnbench.contenders import registry
from attnbench.reports.ab_report import draw_ratios
from attnbench.runner.ab import MIN_PAIRS, PairedRatio, paired_ratio, unclear_reason, verdict

from conftest import BOOM_AT, attnbench_cmd, plant_raising, run_subprocess

# One thread: on a busy machine a two-thread OpenMP team waits for its descheduled thread (samples of 30 ms
# for a 50 µs call), which would make these plumbing tests slow and their verdicts noise.
TINY = ["--batch", "1", "--heads", "2", "--seq", "64", "--head-dim", "16", "--threads", "1"]
FIELDS = {"impl_a", "impl_b", "workload", "ratio", "ci_low", "ci_high", "verdict"}
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def noisy_rounds(seed: int, n: int, factor: float) -> tuple[list[float], list[float]]:
    """Paired rounds as a shared machine gives them: a drift common to both sides, 3 % noise of each
    sample's own, and now and then a round in which one side was preempted (×1.5)."""
    rng = np.random.default_rng(seed)
    drift = 1 + 0.1 * np.sin(np.linspace(0, 6, n))  # minutes-long structure, lands on both
    a = drift * np.exp(rng.normal(0, 0.03, n))
    b = factor * drift * np.exp(rng.normal(0, 0.03, n))
    a[rng.random(n) < 0.05] *= 1.5
    b[rng.random(n) < 0.05] *= 1.5
    return list(a), list(b)


def test_a_a_rounds_are_never_called_slower_or_faster():
    verdicts = [verdict(paired_ratio(*noisy_rounds(seed, 200, 1.0), seed=seed), 0.02) for seed in range(200)]
    assert set(verdicts) <= {"same", "unclear"}, pd.Series(verdicts).value_counts().to_dict()
    assert verdicts.count("same") >= 190  # 200 rounds with 3 % noise pin the ratio well inside ±2 %


def test_a_real_slowdown_is_slower_and_a_speedup_faster():
    slower = paired_ratio(*noisy_rounds(1, 200, 1.3))
    assert verdict(slower, 0.02) == "slower"
    assert slower.ratio == pytest.approx(1.3, rel=0.02)
    assert slower.ci_low < slower.ratio < slower.ci_high and slower.ci_low > 1.25
    assert verdict(paired_ratio(*noisy_rounds(2, 200, 0.7)), 0.02) == "faster"


def test_a_change_inside_the_threshold_is_not_called_and_a_wide_interval_is_unclear():
    small = paired_ratio(*noisy_rounds(3, 400, 1.01))
    assert verdict(small, 0.02) == "same" and small.ci_low > 1.0  # resolved, but inside ±2 %
    wide = PairedRatio(1.10, 0.97, 1.25, 50)  # a 10 % point estimate the interval can't tell from none
    assert verdict(wide, 0.02) == "unclear"
    assert verdict(PairedRatio(1.5, 1.4, 1.6, MIN_PAIRS - 1), 0.02) == "unclear"  # too few rounds
    assert wide.resolution == pytest.approx(math.sqrt(1.25 / 0.97) - 1)


def test_an_unclear_case_says_why():
    wide = PairedRatio(1.10, 0.97, 1.25, 50)
    said = unclear_reason(wide, 0.02)
    assert "[0.970, 1.250] is not inside 1 ± 2.0%" in said and "waited" not in said
    assert said.endswith("a quieter machine narrow it")
    busy = unclear_reason(wide, 0.02, waited=0.3)
    assert busy.endswith("its threads waited for a core 30% of their time (another process on its cores)")
    assert "waited" not in unclear_reason(wide, 0.02, waited=0.01)
    few = unclear_reason(PairedRatio(1.5, 1.4, 1.6, MIN_PAIRS - 1), 0.02)
    assert few == f"only {MIN_PAIRS - 1} paired rounds, fewer than the {MIN_PAIRS} a verdict needs: raise --budget-s"


def test_the_bootstrap_is_seeded():
    a, b = noisy_rounds(4, 100, 1.05)
    assert paired_ratio(a, b, seed=7) == paired_ratio(a, b, seed=7)


def test_a_a_of_bmm_end_to_end(tmp_path):
    out = tmp_path / "ab"
    # A wide threshold: this checks the plumbing on a loaded machine, not the machine's noise
    args = ["--mask", "none,causal", "--budget-s", "0.1", "--threshold", "0.25", "--json", "--out", str(out)]
    done = run_subprocess(*attnbench_cmd("ab", "--a", "bmm", "--b", "bmm", *TINY, *args))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["workload"] for r in lines] == [f"B1 H2 S64 D16 float32 cpu {mask} fwd" for mask in ("none", "causal")]
    for record in lines:
        assert set(record) >= FIELDS
        assert (record["impl_a"], record["impl_b"]) == ("bmm", "bmm (b)")
        assert record["verdict"] in ("same", "unclear")
        assert record["ci_low"] <= record["ratio"] <= record["ci_high"]
        assert record["n_pairs"] >= MIN_PAIRS
    table = pd.read_csv(out / "ab.csv")
    assert list(table["verdict"]) == [r["verdict"] for r in lines]
    samples = pd.read_csv(out / "ab_samples.csv")
    assert len(samples) == sum(r["n_pairs"] for r in lines)
    assert samples["ratio"].to_numpy() == pytest.approx((samples["b_ms"] / samples["a_ms"]).to_numpy())
    assert (out / "ab.png").stat().st_size > 10_000
    assert json.loads((out / "meta.json").read_text())["versions"][1]["name"] == "bmm (b)"


def test_cold_on_a_cpu_judges_the_samples_taken_after_a_cache_flush(cli, tmp_path, monkeypatch):
    """`ab --cold` was refused on a CPU ("L2-flushed samples are taken on a GPU only"); a CPU's decode step whose
    cache fits in its last level reads it from there warm. Now each paired round also takes a cold call of each
    side, right after a flush, and the verdict reads those."""
    from attnbench.measure import stopwatch
    from attnbench.runner import ab

    flushes, timed = [], []
    real_rounds = ab.time_cpu_rounds

    def counted(cache_bytes, threads):
        flush = stopwatch.cache_flusher(stopwatch.MIN_FLUSH_BYTES // stopwatch.FLUSH_CACHES, threads)  # small
        return lambda: flushes.append(flush())

    def kept(*args, **kwargs):
        timed.append(real_rounds(*args, **kwargs))
        return timed[-1]

    monkeypatch.setattr(ab, "cache_flusher", counted)
    monkeypatch.setattr(ab, "time_cpu_rounds", kept)
    out = tmp_path / "ab"
    code, stdout, err = cli("ab", "--a", "bmm", "--b", "bmm", *TINY, "--budget-s", "0.1", "--cold", "--out", str(out))
    assert code == 0, stdout + err
    samples = pd.read_csv(out / "ab_samples.csv")
    assert len(flushes) == 2 * len(samples) and len(samples) >= MIN_PAIRS  # one flush before each side's cold call
    (timings,) = timed
    assert samples["a_ms"].tolist() == pytest.approx(timings["a"].cold_samples_ms)  # the verdict read the cold ones
    assert samples["b_ms"].tolist() == pytest.approx(timings["b"].cold_samples_ms)
    assert timings["a"].cold_samples_ms != timings["a"].samples_ms
    assert json.loads((out / "meta.json").read_text())["samples"] == "cold (caches flushed before each call)"


def test_the_table_names_both_rows(cli, tmp_path):
    code, out, err = cli(
        "ab",
        "--a",
        "einsum",
        "--b",
        "bmm",
        *TINY,
        "--budget-s",
        "0.05",
        "--threshold",
        "0.5",
        "--out",
        str(tmp_path / "ab"),
    )
    assert code == 0, out + err
    assert "B1 H2 S64 D16 float32 cpu none fwd" in out
    assert "(B = bmm vs A = einsum, threshold 50.0%)" in out
    assert "[1/1] B1 H2 S64 D16 float32 cpu none fwd:" in err


def test_a_version_that_raises_is_an_error_and_exits_1(cli, planted, tmp_path):
    """A gate built on `ab` must not pass a kernel that fails on every case."""
    raises = plant_raising(planted, "planted_ab_raises")
    code, out, err = cli("ab", "--a", "bmm", "--b", raises, *TINY, "--budget-s", "0.2", "--out", str(tmp_path / "ab"))
    assert code == 1 and "1 case(s) slower beyond 2.0%, incorrect or in error" in err, out + err
    (row,) = pd.read_csv(tmp_path / "ab" / "ab.csv").to_dict("records")
    assert row["verdict"] == "error" and row["reason"].endswith(f"RuntimeError: boom in my kernel{BOOM_AT}"), row


def test_an_incorrect_version_says_whether_the_other_passed():
    """An author fixing a bug ran `ab --impl K --base HEAD` and got "incorrect — K@HEAD: …": whether their working
    tree's version passed the check was never said (B was not checked once A failed). Both checks are said."""
    from attnbench.runner.ab import AbOptions, Version, run_case
    from attnbench.workload import Workload

    from conftest import Shifted

    wrong, right = Version(Shifted.name, Shifted(), "registered"), Version("bmm", registry.get("bmm").contender, "r")
    options = AbOptions(budget_s=0.1)
    workload = Workload(1, 2, 2, 64, 64, 16)
    case = run_case(wrong, right, workload, options)
    assert case.verdict == "incorrect" and case.paired is None
    assert case.reason.startswith(f"{Shifted.name}: max_abs_err ") and case.reason.endswith("; bmm: correct")
    case = run_case(right, wrong, workload, options)
    assert case.verdict == "incorrect" and case.reason.startswith(f"bmm: correct; {Shifted.name}: max_abs_err ")


class TerminatedAtSeq128(Contender):
    """bmm's arithmetic; preparing a 128-key case, the process is sent SIGTERM (as `timeout` or SLURM would)."""

    name = "planted_ab_terminated"
    capabilities = Capabilities(devices=frozenset({"cpu"}), masks=frozenset({"none"}))

    def prepare(self, inputs, workload):
        if workload.seq_k == 128:
            os.kill(os.getpid(), signal.SIGTERM)
        q, k, v = inputs.q, inputs.k, inputs.v
        return lambda: torch.softmax(q @ k.transpose(-1, -2) * inputs.scale, dim=-1) @ v


def test_a_terminated_ab_keeps_the_verdicts_judged_before_it(cli, planted, tmp_path):
    """SIGTERM (or Ctrl-C) in the second case: the first case's verdict is printed and written, meta.json counts
    them, exit 130; stopped in the first case, nothing is written. The handlers are restored afterwards."""
    registry.register(TerminatedAtSeq128())
    planted.append(TerminatedAtSeq128.name)
    before = signal.getsignal(signal.SIGTERM)
    args = ["ab", "--a", "bmm", "--b", TerminatedAtSeq128.name, "--batch", "1", "--heads", "2", "--head-dim", "16"]
    args += ["--threads", "1", "--budget-s", "0.1", "--threshold", "0.5"]
    code, out, err = cli(*args, "--seq", "64,128,256", "--out", str(tmp_path / "ab"))
    assert code == 130 and "Traceback" not in err, out + err
    assert err.splitlines()[-1] == "ab: interrupted: the files hold the 1 case(s) judged before it, of 3", err
    assert "B1 H2 S64 D16 float32 cpu none fwd" in out and "S128" not in out
    (row,) = pd.read_csv(tmp_path / "ab" / "ab.csv").to_dict("records")
    assert row["seq_q"] == 64 and row["verdict"] in ("same", "unclear", "faster", "slower"), row
    meta = json.loads((tmp_path / "ab" / "meta.json").read_text())
    assert meta["interrupted"] == "1 of 3 case(s) judged"
    code, _, err = cli(*args, "--seq", "128", "--out", str(tmp_path / "none"))
    assert code == 130 and err.splitlines()[-1] == "attnbench: interrupted; nothing was written", err
    assert not (tmp_path / "none").exists()
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_figure_has_plain_decimal_ticks_and_labels_that_do_not_overlap():
    cases = [(256, 1.0, "same"), (512, 1.06, "slower"), (1024, 0.93, "faster"), (2048, 1.01, "unclear")]
    records = [
        {
            "impl_a": "x",
            "impl_b": "x (b)",
            "workload": f"B1 H8 S{s} D64 float32 cpu none fwd",
            "ratio": r,
            "ci_low": r - 0.01,
            "ci_high": r + 0.012,
            "verdict": v,
            "threshold": 0.02,
        }
        for s, r, v in cases
    ]
    records.append(
        {**records[0], "workload": "B1 H8 S4096 D64 float32 cpu none fwd", "ratio": None, "verdict": "incorrect"}
    )
    fig = draw_ratios(records)
    ax = fig.axes[0]
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert all(float(t.replace("−", "-")) > 0 for t in ticks) and not any("e" in t or "×" in t for t in ticks)
    # each label says where it stands: 0.015 steps printed to two decimals put "1.00" at 1.005 (review 4)
    for label in ax.get_xticklabels():
        assert float(label.get_text()) == pytest.approx(label.get_position()[0], abs=1e-9), label
    assert "1.00" in ticks
    boxes = [t.get_window_extent() for t in ax.get_yticklabels()]
    assert len(boxes) == 5 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert ax.get_yticklabels()[4].get_text().endswith("— incorrect")
    low, high = ax.get_xlim()
    assert low < 0.92 and high > 1.072  # every interval and the band are in view
    plt.close(fig)


# --- one plugin at two git revisions ---------------------------------------------------------------------

KERNEL = '''\
"""A plugin contender: bmm-style attention whose score product lives in a sibling module."""
import torch

from attnbench import Capabilities, Contender

from . import work  # relative import: must come from the same revision


class Kernel(Contender):
    name = "abkernel"
    capabilities = Capabilities(devices=frozenset({"cpu"}), masks=frozenset({"none"}))

    def prepare(self, inputs, workload):
        q, k, v, scale = inputs.q, inputs.k, inputs.v, inputs.scale
        return lambda: torch.softmax(work.scores(q, k) * scale, dim=-1) @ v


contender = Kernel()
'''
WORK = """\
import torch

from abplug.settings import PASSES  # absolute import within the package: also the same revision


def scores(q, k):
    out = q @ k.transpose(-1, -2)
    for _ in range(PASSES - 1):  # real extra work, the product again
        out = torch.maximum(out, q @ k.transpose(-1, -2))
    return out
"""


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def plugin_repo(tmp_path):
    """A git repository holding the plugin package ``abplug`` (and the .dist-info naming its entry point):
    commit 1 computes the scores once, commit 2 three times (PASSES = 3: real work, about 1.5-2× slower —
    large, so that a busy machine can't hide it)."""
    repo = tmp_path / "repo"
    package = repo / "abplug"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "kernel.py").write_text(KERNEL)
    (package / "work.py").write_text(WORK)
    (package / "settings.py").write_text("PASSES = 1\n")
    info = repo / "abplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: abplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attnbench.impls]\nabkernel = abplug.kernel:contender\n")
    git(repo, "init", "-q")
    commit_all(repo, "the kernel")
    (package / "settings.py").write_text("PASSES = 3\n")
    commit_all(repo, "the score product three times")
    return repo


def ab_at(repo: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = attnbench_cmd(
        "ab",
        "--impl",
        "abkernel",
        "--batch",
        "1",
        "--heads",
        "2",
        "--seq",
        "256",
        "--head-dim",
        "64",
        "--threads",
        "1",
        "--budget-s",
        "1",
        "--json",
        "--out",
        str(out),
        *extra,
    )
    return run_subprocess(*args, env={"PYTHONPATH": str(repo)}, cwd=repo)


def test_base_revision_slower_kernel_is_slower_and_exit_1(plugin_repo, tmp_path):
    done = ab_at(plugin_repo, tmp_path / "slower", "--base", "HEAD~1")
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 1, (record, done.stderr)
    assert (record["impl_a"], record["impl_b"], record["verdict"]) == ("abkernel@HEAD~1", "abkernel", "slower")
    assert record["ratio"] > 1.2, record
    assert "1 case(s) slower beyond 2.0%" in done.stderr


# serial: `same` or `unclear` at the default 2 % threshold needs a quiet machine. The verdict reads a 95 % interval, so
# an A/A whose noise spreads wider than the threshold excludes 1, a verdict, in up to 5 % of runs: beside the other
# worker and a busy loop on 2 cores (the full first phase, 2 rounds) 1 of this test's 4 A/A runs came back `faster`,
# and of 40 more A/A runs beside such load 10 were `unclear`, one of them with its interval clear of 1 ([1.002, 1.021],
# its ratio 1.011 just inside the threshold). test_ab_revision's comment-only tests are serial for the same reason.
@pytest.mark.serial
def test_a_comment_only_commit_is_not_slower(plugin_repo, tmp_path):
    kernel = plugin_repo / "abplug" / "kernel.py"
    kernel.write_text(kernel.read_text().replace('"""A plugin', '"""Only this comment changed. A plugin'))
    commit_all(plugin_repo, "a comment")
    done = ab_at(plugin_repo, tmp_path / "comment")  # --base defaults to HEAD: the same code once more
    done_previous = ab_at(plugin_repo, tmp_path / "comment-1", "--base", "HEAD~1")
    for run in (done, done_previous):
        assert run.returncode == 0, run.stderr
        (record,) = [json.loads(line) for line in run.stdout.splitlines()]
        assert record["verdict"] in ("same", "unclear") and 0.85 < record["ratio"] < 1.15, record


def test_a_revision_that_names_no_commit_is_bad_input(plugin_repo, tmp_path):
    done = ab_at(plugin_repo, tmp_path / "none", "--base", "no-such-rev")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"attnbench: error: --base 'no-such-rev': not a commit of the repository {plugin_repo}\n"
    assert not (tmp_path / "none").exists()


# --- bad input ---------------------------------------------------------------------------------------------

NOT_IN_GIT = """\
import torch
from attnbench import Capabilities, Contender


class Loose(Contender):
    name = "ab_loose"
    capabilities = Capabilities(devices=frozenset({"cpu"}))

    def prepare(self, inputs, workload):
        return lambda: torch.softmax(inputs.q @ inputs.k.transpose(-1, -2) * inputs.scale, dim=-1) @ inputs.v
"""


@pytest.fixture
def loose_contender(tmp_path, planted, monkeypatch):
    """A contender registered from a module file outside any git repository."""
    folder = tmp_path / "loose"
    folder.mkdir()
    (folder / "ab_loose_module.py").write_text(NOT_IN_GIT)
    monkeypatch.syspath_prepend(str(folder))
    import ab_loose_module

    registry.register(ab_loose_module.Loose)
    planted.append("ab_loose")
    yield "ab_loose"
    sys.modules.pop("ab_loose_module", None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--a", "nosuch", "--b", "bmm"], "contender 'nosuch' is not known"),
        (["--a", "bmm"], "--a and --b go together"),
        (["--base", "HEAD"], "--base needs --impl NAME"),
        (["--impl", "bmm", "--base", ""], "--base '': names no revision"),
        ([], "give --a A --b B, or --impl NAME [--base REV]"),
        (["--a", "bmm", "--b", "bmm", "--impl", "bmm"], "give either --a A --b B, or --impl NAME"),
        (["--a", "bmm", "--b", "bmm", "--threshold", "0"], "--threshold 0.0: must be a fraction"),
        pytest.param(
            ["--a", "bmm", "--b", "bmm", "--device", "cuda"],
            "device cuda: torch.cuda.is_available()",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(cli, tmp_path, args, message):
    out = tmp_path / "ab"
    code, stdout, err = cli("ab", *args, *TINY, "--out", str(out))
    assert code == 2
    assert err.startswith("attnbench: error: ") and message in err and err.count("\n") == 1, err
    assert not out.exists() and stdout == ""


def test_a_contender_outside_git_is_bad_input(cli, tmp_path, loose_contender):
    out = tmp_path / "ab"
    code, stdout, err = cli("ab", "--impl", loose_contender, *TINY, "--out", str(out))
    assert code == 2 and "is not in a git repository" in err and err.count("\n") == 1, err
    assert not out.exists() and stdout == ""


def test_paired_rounds_give_every_contender_a_sample_in_every_round_with_one_block_size():
    from attnbench.measure.stopwatch import PAIRED_BLOCK_GROWTH, time_cpu_rounds

    def work(n):
        return lambda: sum(range(n))

    fns = {"fast": work(2_000), "slow": work(6_000), "much_slower": work(2_000 * 4 * PAIRED_BLOCK_GROWTH)}
    estimates = {"fast": 1e-5, "slow": 3e-5, "much_slower": 4 * PAIRED_BLOCK_GROWTH * 1e-5}
    timings = time_cpu_rounds(fns, 1, 0.02, estimates, paired=True)
    counts = {name: t.n_samples for name, t in timings.items()}
    assert len(set(counts.values())) == 1 and counts["fast"] >= 5, counts
    calls = {name: t.calls_per_sample for name, t in timings.items()}
    assert calls["fast"] == calls["slow"] == 200  # the fastest's block, shared
    assert calls["much_slower"] == PAIRED_BLOCK_GROWTH * 5  # capped at 10 × its own block of 5


def test_calibration_summary_counts_false_alarms_and_catches():
    from attnbench.reports.calibrate_ab import summarise

    rows = [
        {"kind": "A/A", "factor": 1.0, "verdict": v, "ratio": 1.0, "seconds": 4.0}
        for v in ["same"] * 98 + ["unclear", "slower"]
    ]
    rows += [
        {"kind": "slowed", "factor": 1.05, "verdict": v, "ratio": 1.05, "seconds": 5.0}
        for v in ["slower"] * 9 + ["unclear"]
    ]
    lines = summarise(pd.DataFrame(rows))
    assert lines[0] == "A/A: 100 decisions, 1 false alarm(s) = 1.0% (same 98, unclear 1, slower 1)"
    assert lines[1] == "slowdown ×1.05: 9/10 cases caught = 90.0%; median measured ratio 1.050"
    assert lines[2].startswith("seconds per case: median 4.0, max 5.0 (110 cases")


def test_the_slowed_calibration_contender_is_correct_and_does_extra_work():
    from attnbench.reports.calibrate_ab import Slowed
    from attnbench.runner.cases import prepare_checked
    from attnbench.workload import Workload

    slowed = Slowed(registry.get("bmm").contender, 1.25)
    workload = Workload(1, 2, 2, 64, 64, 16, "float32", "cpu", "causal", "fwd")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops on a busy machine: an OpenMP team waits for its descheduled thread
    try:
        prepared = prepare_checked(slowed.name, workload, contender=slowed)
    finally:
        torch.set_num_threads(threads)
    assert prepared.ok and prepared.check.max_abs_err < prepared.check.atol
    assert slowed.name == "bmm_x1.25" and "25% of its median" in slowed.description


SINGLE_FILE = """\
import torch
from attnbench import Capabilities, Contender

VERSION = {version}


class Single(Contender):
    name = "ab_single"
    capabilities = Capabilities(devices=frozenset({{"cpu"}}))

    def prepare(self, inputs, workload):
        return lambda: torch.softmax(inputs.q @ inputs.k.transpose(-1, -2) * inputs.scale, dim=-1) @ inputs.v
"""


def test_a_single_file_contender_at_the_base_revision_lives_beside_the_working_tree(tmp_path, planted, monkeypatch):
    from attnbench.contenders import _revision as revision
    from attnbench.runner.ab import revision_versions

    repo = tmp_path / "single"
    repo.mkdir()
    module = repo / "ab_single_module.py"
    module.write_text(SINGLE_FILE.format(version=1))
    git(repo, "init", "-q")
    commit_all(repo, "version 1")
    module.write_text(SINGLE_FILE.format(version=2))
    commit_all(repo, "version 2")
    monkeypatch.syspath_prepend(str(repo))
    import ab_single_module

    registry.register(ab_single_module.Single)
    planted.append("ab_single")
    try:
        base, current = revision_versions("ab_single", "HEAD~1", tmp_path / "checkout")
        assert (base.name, current.name) == ("ab_single@HEAD~1", "ab_single")
        assert sys.modules["ab_single_module"] is ab_single_module and ab_single_module.VERSION == 2
        base_module = sys.modules[type(base.contender).__module__]  # the base's, under a name of its own
        assert base_module.__name__.startswith("_attnbench_base_") and base_module.VERSION == 1
        assert revision.real_module_name(base_module.__name__) == "ab_single_module"
        assert base.source.startswith("git ") and base.source.endswith(" (HEAD~1)")
    finally:
        sys.modules.pop("ab_single_module", None)


@pytest.mark.slow
def test_fused_cpu_at_the_base_revision_builds_from_that_revisions_sources(tmp_path):
    """attnbench's own kernel: the base revision's package imports its own ``bindings``, which finds the
    C++ sources beside it in the extracted folder (the build is keyed by their contents)."""
    from attnbench.contenders import _revision as revision
    from attnbench.runner.ab import revision_versions
    from attnbench.runner.cases import prepare_checked
    from attnbench.workload import Workload

    current = registry.get("fused_cpu").contender
    try:
        revision.locate("fused_cpu", current)
    except Exception as exc:  # a plain (non-editable) install: not in a git repository
        pytest.skip(f"fused_cpu is not in a git checkout here: {exc}")
    base, _ = revision_versions("fused_cpu", "HEAD", tmp_path / "checkout")
    kernel = type(base.contender).prepare.__globals__["bindings"]  # what the base class's module imported
    assert (tmp_path / "checkout") in Path(kernel.__file__).parents
    assert all((tmp_path / "checkout") in source.parents for source in kernel.SOURCES)
    assert kernel is not sys.modules["attnbench.impls.fused_cpu.bindings"]
    workload = Workload(1, 2, 2, 64, 64, 16, "float32", "cpu", "causal", "fwd")
    prepared = prepare_checked(base.name, workload, contender=base.contender)
    assert prepared.ok, prepared.reason


def test_the_sweep_is_the_suites_workloads_with_the_axis_flags_applied():
    from attnbench.runner.ab import sweep_workloads
    from attnbench.workload.suite import expand, load_suite

    assert [w.label() for w in sweep_workloads(None, {})] == ["B1 H8 S1024 D64 float32 cpu none fwd"]
    quick = sweep_workloads("quick", {})
    expected = list(dict.fromkeys(w for _, w in expand(load_suite("quick"), {}, sorted(registry.load()))))
    assert quick == expected and len(quick) >= 6  # every workload once, whatever its contenders
    narrowed = sweep_workloads("quick", {"seq": [128], "mask": ["causal"]})
    assert {(w.seq_q, w.mask) for w in narrowed} == {(128, "causal")}


class Recording(Contender):
    """The registered bmm, remembering the k tensor each prepare was given."""

    name = "recording"
    capabilities = Capabilities(devices=frozenset({"cpu"}), masks=frozenset({"none"}))

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def prepare(self, inputs, workload):
        self.seen.append(inputs.k)
        return registry.get("bmm").contender.prepare(inputs, workload)


def test_both_versions_read_the_same_inputs_not_a_copy_each():
    """Two copies of a 256 MiB cache don't lie alike in memory, which moved A/A on a memory-bound decode to
    B/A 0.92: A and B read one set of tensors."""
    from attnbench.runner.ab import AbOptions, Version, run_case, sweep_workloads

    a, b = Recording(), Recording()
    (workload,) = sweep_workloads(None, {"heads": [2], "seq": [64], "head_dim": [16]})
    case = run_case(
        Version("a", a, "registered"), Version("b", b, "registered"), workload, AbOptions(threshold=0.5, budget_s=0.05)
    )
    assert case.verdict in ("same", "unclear") and case.paired is not None
    assert len(a.seen) == len(b.seen) == 1 and a.seen[0] is b.seen[0]


def test_the_readme_says_one_set_of_inputs_wherever_the_ab_section_counts_them():
    """run_case makes one set of inputs for both versions (the test above); the README's A/B section said so in
    one paragraph and "two sets of inputs" for an A/A run in the next (review 1, finding 7). The section and its
    reference page, docs/ab.md, say it alike."""
    import re

    repo = Path(__file__).resolve().parent.parent
    readme = (repo / "README.md").read_text()
    section = (
        readme.split("## A/B: is my change faster?", 1)[1].split("\n## ", 1)[0] + (repo / "docs" / "ab.md").read_text()
    )
    counts = re.findall(r"(\w+) sets? of inputs", " ".join(section.split()))
    assert counts and set(counts) == {"one"}, counts


class Choosing(Contender):
    """The registered bmm, saying a choice it makes on its first call (as a tuned kernel picks a tile)."""

    name = "choosing"
    capabilities = Capabilities(devices=frozenset({"cpu"}), masks=frozenset({"none"}))

    def __init__(self, tile: str) -> None:
        self.tile = tile

    def prepare(self, inputs, workload):
        inner = registry.get("bmm").contender.prepare(inputs, workload)
        chosen: list[str] = []

        def run():
            chosen[:] = [self.tile]  # chosen at the first call, as fused_triton's prefix level is
            return inner()

        run.choice = lambda: " ".join(chosen)
        return run


def test_each_side_says_the_tile_it_ran_in_the_record_and_the_progress_line(capsys):
    """A tuned contender's sides may choose differently (a side that re-tunes beside one that reuses a kept tile): the
    record keeps each side's choice, read after the first call, and the progress line says it where they differ."""
    from attnbench.reports.ab_command import progress_line
    from attnbench.runner.ab import AbOptions, Version, run_case, sweep_workloads
    from attnbench.runner.cases import prepare_checked

    (workload,) = sweep_workloads(None, {"heads": [2], "seq": [64], "head_dim": [16]})
    a, b = Version("a", Choosing("fwd 64,64,4,2"), "registered"), Version("b", Choosing("fwd 128,64,8,3"), "registered")
    case = run_case(a, b, workload, AbOptions(threshold=0.5, budget_s=0.05))
    record = case.record(a, b, 0.5)
    assert (record["choice_a"], record["choice_b"]) == ("fwd 64,64,4,2", "fwd 128,64,8,3")
    line = progress_line(0, 3, case, record["workload"])
    assert line.startswith(f"[1/3] {record['workload']}: {case.verdict} ")
    assert line.endswith(" (A chose fwd 64,64,4,2; B chose fwd 128,64,8,3)")
    same = dataclasses.replace(case, choice_b=case.choice_a)
    assert "chose" not in progress_line(0, 3, same, "w")  # the same choice: nothing to say
    assert prepare_checked("bmm", workload, contender=Choosing("x")).choice == "x"
    assert prepare_checked("bmm", workload).choice == ""  # a contender that says nothing
    broken = Choosing("x")
    broken.tile = None  # its choice() raises (" ".join of [None]): the case still runs, its choice is ''
    assert prepare_checked("bmm", workload, contender=broken).choice == ""


class Tuning(Contender):
    """The registered bmm, remembering where tuned choices would be kept while it prepares."""

    name = "tuning"
    capabilities = Capabilities(devices=frozenset({"cpu"}), masks=frozenset({"none"}))

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, bool]] = []

    def prepare(self, inputs, workload):
        from attnbench.measure.native_build import tuning_dir

        folder = os.environ.get("ATTNBENCH_TUNING_DIR")
        self.seen.append((folder, folder is not None and tuning_dir() == Path(folder) and Path(folder).is_dir()))
        return registry.get("bmm").contender.prepare(inputs, workload)


@pytest.mark.parametrize("keep", [False, True], ids=["fresh", "kept"])
def test_both_sides_tune_in_one_folder_of_the_runs_own_unless_kept(keep, monkeypatch):
    """A choice one side kept from an earlier process beside one the other tunes now puts the tuning's luck in the
    ratio: by default both tune here, in one empty folder (removed after, the variable as it was); --keep-tuning
    reuses what is kept."""
    from attnbench.runner.ab import AbOptions, Version, run_ab, sweep_workloads

    monkeypatch.delenv("ATTNBENCH_TUNING_DIR", raising=False)
    a, b = Tuning(), Tuning()
    workloads = sweep_workloads(None, {"heads": [2], "seq": [64, 96], "head_dim": [16]})
    options = AbOptions(threshold=0.5, budget_s=0.05, keep_tuning=keep)
    run_ab(Version("a", a, "registered"), Version("b", b, "registered"), workloads, options)
    seen = a.seen + b.seen
    assert len(seen) == 4 and "ATTNBENCH_TUNING_DIR" not in os.environ
    if keep:
        assert seen == [(None, False)] * 4
    else:
        folders = {folder for folder, _ in seen}
        assert len(folders) == 1 and all(ok for _, ok in seen)  # one folder, both sides, every case
        assert not Path(folders.pop()).exists()  # removed after


def _bimodal_case():
    """The review's busy machine: most rounds run both sides in one mode (fast or slow, B twice A's time), a few
    preempt A's neighbour only, so B's median lands in the slow mode and A's in the fast one."""
    from attnbench.runner.ab import AbCase
    from attnbench.workload import Workload

    rng = np.random.default_rng(3)
    modes = [(2.0, 4.0)] * 45 + [(6.0, 12.0)] * 45 + [(2.0, 12.0)] * 10  # (A, B) per round
    a_ms = [a * rng.uniform(0.99, 1.01) for a, _ in modes]
    b_ms = [b * rng.uniform(0.99, 1.01) for _, b in modes]
    order = rng.permutation(len(modes))
    a_ms, b_ms = [a_ms[i] for i in order], [b_ms[i] for i in order]
    paired = paired_ratio(a_ms, b_ms)
    return AbCase(Workload(1, 8, 8, 256, 256, 64), verdict(paired, 0.02), "", paired, a_ms, b_ms)


def test_medians_that_contradict_the_paired_ratio_are_said_in_the_table_and_ab_csv(tmp_path):
    """2.189 vs 8.252 ms beside a ratio of 1.997 (review 1, finding 2): the medians' quotient outside the paired
    interval is marked on its row, explained under the table, and kept in ab.csv; a case whose medians agree is
    not marked."""
    from attnbench.reports.ab_report import format_table, write_ab
    from attnbench.runner.ab import Version

    a, b = Version("bf@HEAD", Recording(), "git"), Version("bf", Recording(), "working tree")
    bimodal = _bimodal_case()
    record = bimodal.record(a, b, 0.02)
    assert record["ratio"] == pytest.approx(2.0, rel=0.02) and record["verdict"] == "slower"
    assert record["median_quotient"] == pytest.approx(6.0, rel=0.03) and record["medians_disagree"] is True
    quiet_a, quiet_b = noisy_rounds(5, 60, 1.10)
    paired = paired_ratio(quiet_a, quiet_b)
    quiet = dataclasses.replace(bimodal, paired=paired, samples_a_ms=quiet_a, samples_b_ms=quiet_b)
    agreeing = quiet.record(a, b, 0.02)
    assert agreeing["medians_disagree"] is False
    from attnbench.runner.ab import medians_disagree

    # a quotient just past a tight interval tells the same verdict: within the threshold it is not flagged
    tight = dataclasses.replace(paired, ci_low=1.000, ci_high=1.004)
    assert medians_disagree(1.010, tight, 0.02) is False and medians_disagree(1.03, tight, 0.02) is True
    lines = format_table([record, agreeing]).splitlines()
    assert lines[1].endswith("slower ‡") and not lines[2].endswith("‡"), lines
    quotient = f"{record['median_quotient']:.3f}"
    assert lines[3].startswith(f"‡ B1 H8 S256 D64 float32 cpu none fwd: B median / A median = {quotient}, ")
    assert "outside the paired ratio's 95% interval" in lines[3] and "trust the paired ratio" in lines[3]
    assert len(lines) == 4
    # a case not timed: its verdict in the table, its reason (an incorrect one is long) under it, not in the column
    wrong = {**record, "ratio": None, "verdict": "incorrect", "reason": "bf@HEAD: max_abs_err 0.76 over tolerance " * 4}
    lines = format_table([agreeing, wrong]).splitlines()
    assert lines[2].endswith(" incorrect") and len(lines[2]) == len(lines[1]) < 120, lines
    assert lines[3] == f"  B1 H8 S256 D64 float32 cpu none fwd: incorrect — {wrong['reason']}"
    write_ab(
        [record, agreeing], [(bimodal.samples_a_ms, bimodal.samples_b_ms), (quiet_a, quiet_b)], tmp_path / "ab", {}
    )
    table = pd.read_csv(tmp_path / "ab" / "ab.csv")
    assert list(table["medians_disagree"]) == [True, False]
    assert table["median_quotient"].iloc[0] == pytest.approx(record["median_quotient"])
