"""`attnbench ratios`: one contender against peers within one run, and the gates built on it."""

import pandas as pd
import pytest

from attnbench.reports.frames import load_runs
from attnbench.reports.ratios import ratio_table

from conftest import stalled_as_ok


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from attnbench.cli import main

    out = tmp_path_factory.mktemp("ratios") / "run"
    args = [
        "run",
        "--suite",
        "fused_cpu",
        "--impl",
        "fused_cpu,bmm,sdpa_flash,xformers",
        "--seq",
        "64,256",
        "--budget-s",
        "0.03",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    stalled_as_ok(out)  # ratios' tables are tested, not the timing: a stalled row would drop out of them
    return out


def test_table_pairs_each_case_with_each_peer(cli, run):
    code, text, _ = cli("ratios", str(run), "--impl", "fused_cpu", "--vs", "bmm,sdpa_flash")
    assert code == 0
    frame = pd.read_parquet(run / "results.parquet")
    ours = frame[frame.impl == "fused_cpu"]
    assert len([line for line in text.splitlines() if line.lstrip().startswith("cpu float32")]) == 2 * len(ours)
    table = ratio_table(load_runs([run])[0], "fused_cpu", ["bmm", "sdpa_flash"])
    for row in table.to_dict("records"):
        seq = int(row["workload"].split(" S")[1].split(" ")[0])
        mask = row["workload"].split(" ")[6]
        pick = frame[(frame.seq_q == seq) & (frame["mask"] == mask)].set_index("impl")
        assert row["time_ratio"] == pytest.approx(pick.median_ms["fused_cpu"] / pick.median_ms[row["peer"]])
        assert row["mem_ratio"] == pytest.approx(pick.peak_mem_mb["fused_cpu"] / pick.peak_mem_mb[row["peer"]])


def test_best_compares_with_the_fastest_ok_peer(run):
    frame = load_runs([run])[0]
    table = ratio_table(frame, "fused_cpu", ["bmm", "sdpa_flash", "xformers"], best=True)
    assert len(table) == len(frame[frame.impl == "fused_cpu"])
    peers = frame[frame.impl.isin(["bmm", "sdpa_flash"])]
    fastest = peers.loc[peers.groupby(["seq_q", "mask"]).median_ms.idxmin()]
    assert sorted(table.peer) == sorted(fastest.impl) and "xformers" not in set(table.peer)


def test_bounds_pass_fail_and_name_the_case(cli, run):
    code, text, _ = cli("ratios", str(run), "--impl", "fused_cpu", "--vs", "bmm", "--max-time-ratio", "1000")
    assert code == 0 and "4/4 case(s) meet the bounds" in text
    code, _, err = cli(
        "ratios", str(run), "--impl", "fused_cpu", "--vs", "bmm", "--where", "seq_q=256", "--min-speedup", "1e6"
    )
    assert code == 1
    missed = err.strip().splitlines()
    assert len(missed) == 2 and all(m.startswith("missed: cpu float32 B1 H8 S256") and "speedup" in m for m in missed)


def test_pct_bounds_judge_the_hardware_roof_and_the_matmul_rate(cli, run):
    base = ["ratios", str(run), "--impl", "fused_cpu", "--vs", "bmm", "--where", "seq_q=256"]
    assert cli(*base, "--min-pct-of-peak", "0.001", "--min-pct-of-matmul", "0.001")[0] == 0
    code, _, err = cli(*base, "--min-pct-of-peak", "101")  # above the hardware roof: never met
    assert code == 1 and all("% of peak" in line for line in err.strip().splitlines())
    code, _, err = cli(*base, "--min-pct-of-matmul", "1e9")
    assert code == 1 and all("% of matmul" in line for line in err.strip().splitlines())


def test_a_peer_that_did_not_run_fails_a_gate(cli, run):
    code, _, err = cli("ratios", str(run), "--impl", "fused_cpu", "--vs", "xformers", "--max-time-ratio", "1")
    assert code == 1 and "status ok / unavailable, both must be ok" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--impl", "nope", "--vs", "bmm"], "contender 'nope' has no row in this run"),
        (["--impl", "fused_cpu", "--vs", ","], "--vs: name at least one contender"),
        (["--impl", "bmm", "--vs", "sdpa_flash,bmm"], "--vs sdpa_flash,bmm: names bmm, the contender judged"),
        (["--impl", "fused_cpu", "--vs", "bmm", "--where", "colour=red"], "--where 'colour=red': expected COLUMN="),
        (["--impl", "fused_cpu", "--vs", "bmm", "--where", "seq_q=3"], "no fused_cpu row matches --where seq_q=3"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, run, args, message):
    code, text, err = cli("ratios", str(run), *args)
    assert code == 2 and message in err and err.count("\n") == 1 and text == ""


def test_a_case_the_peer_lacks_shows_as_missing_and_runs_never_mix(run):
    frame = load_runs([run])[0]
    without = frame[~((frame.impl == "bmm") & (frame.seq_q == 256))]
    table = ratio_table(without, "fused_cpu", ["bmm", "sdpa_flash"])
    assert len(table) == 2 * len(frame[frame.impl == "fused_cpu"])
    missing = table[table.peer_status == "missing"]
    assert len(missing) == 2 and set(missing.peer) == {"bmm"} and missing.time_ratio.isna().all()
    twice = pd.concat([frame, frame.assign(run="other")], ignore_index=True)  # a merged folder: one case, two runs
    assert len(ratio_table(twice, "fused_cpu", ["bmm"])) == 2 * len(ratio_table(frame, "fused_cpu", ["bmm"]))


def test_peer_where_pairs_across_dtypes(cli, tmp_path):
    run = tmp_path / "dtypes"
    code, _, _ = cli(
        "run",
        "--suite",
        "fused_cpu",
        "--impl",
        "fused_cpu",
        "--dtype",
        "float32,bfloat16",
        "--seq",
        "256",
        "--mask",
        "none",
        "--budget-s",
        "0.03",
        "--threads",
        "1",
        "--out",
        str(run),
    )
    assert code == 0
    stalled_as_ok(run)  # the pairing is tested, not the timing: a stalled row would leave no pair
    args = ["ratios", str(run), "--impl", "fused_cpu", "--vs", "fused_cpu", "--where", "dtype=bfloat16"]
    code, text, _ = cli(*args, "--peer-where", "dtype=float32", "--min-speedup", "1e-6")
    assert code == 0 and "1/1 case(s) meet the bounds" in text
    frame = load_runs([run])[0]
    bf16, fp32 = (frame[frame.dtype == d] for d in ("bfloat16", "float32"))
    table = ratio_table(
        frame[frame.dtype == "bfloat16"], "fused_cpu", ["fused_cpu"], peer_frame=fp32, unpaired=("dtype",)
    )
    assert len(table) == 1 and table.speedup[0] == pytest.approx(fp32.median_ms.iloc[0] / bf16.median_ms.iloc[0])
    code, _, err = cli(*args, "--peer-where", "colour=red")
    assert code == 2 and "--where 'colour=red': expected COLUMN=VALUE" in err


def test_a_bound_on_the_contender_alone_is_judged_whatever_its_peers_status(cli, run):
    """`--min-pct-of-peak` reads the contender's own row: a peer that does not run a case (xformers, unavailable
    here) once failed it ("both must be ok"), and each peer repeated the contender's own miss. Judged once per case;
    a bound on the pair with that peer still fails."""
    base = ["ratios", str(run), "--impl", "fused_cpu", "--vs", "xformers,bmm", "--where", "seq_q=256"]
    code, text, err = cli(*base, "--min-pct-of-peak", "0.001")
    assert code == 0 and err == "", err
    assert "4/4 case(s) meet the bounds" in text  # two cases, each with two peers
    code, _, err = cli(*base, "--min-pct-of-peak", "101")
    missed = err.strip().splitlines()
    assert code == 1 and len(missed) == 2 and all("% of peak" in m and " vs " not in m for m in missed), err
    code, _, err = cli(*base, "--min-pct-of-peak", "0.001", "--max-time-ratio", "1000")
    assert code == 1 and err.count("status ok / unavailable, both must be ok") == 2, err
