"""compare calibrated by noise: A/A-safe under machine drift, still catching a real slowdown (issue 11)."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.reports.calibrate import calibrate, slowed
from attnbench.reports.compare import Evidence, Settings, evidence, verdict
from attnbench.runner.results import make_row, rows_to_frame
from attnbench.workload import Workload

IMPLS = ("bmm", "einsum", "sdpa_flash")
WORKLOADS = [Workload(1, 8, 8, s, s, 64, mask=m) for s in (512, 1024) for m in ("none", "causal")]


def fake_run(seed: int, speed: float = 1.0, noise: float = 0.02, repeats: int = 3) -> pd.DataFrame:
    """A run of 3 contenders × 4 workloads whose per-repeat medians scatter by ``noise`` around a true time
    scaled by the machine's ``speed`` that day."""
    generator = np.random.default_rng(seed)
    rows = []
    for i, impl in enumerate(IMPLS):
        for j, w in enumerate(WORKLOADS):
            true_ms = (1 + i) * (1 + j) * speed
            medians = list(true_ms * np.exp(generator.normal(0, noise, repeats)))
            samples = [m * float(np.exp(generator.normal(0, 0.005))) for m in medians for _ in range(10)]
            rows.append(
                make_row(
                    impl,
                    w,
                    "ok",
                    median_ms=float(np.median(medians)),
                    iqr_ms=0.01 * true_ms,
                    samples_ms=samples,
                    repeat_medians_ms=medians if repeats > 1 else None,
                )
            )
    return rows_to_frame(rows)


def save(frame: pd.DataFrame, folder: Path) -> Path:
    """A run folder as a run leaves it: its rows and a meta.json (one without would be read with a note)."""
    folder.mkdir(parents=True)
    frame.to_parquet(folder / "results.parquet")
    (folder / "meta.json").write_text(json.dumps({"command": "a synthetic run (tests/test_compare_noise.py)"}))
    return folder


def test_identical_code_on_a_drifting_machine_is_never_slower():
    """Six A/A runs, the machine 0–9 % slower from run to run: no case of any pair is `slower`."""
    speeds = [1.0, 1.04, 0.97, 1.09, 1.02, 0.99]
    frames = [fake_run(seed, speed) for seed, speed in enumerate(speeds)]
    result = calibrate(frames, Settings())
    assert result["aa_decisions"] == 15 * 12 and result["aa_alarms"] == 0
    caught = result["caught"]
    assert isinstance(caught, dict)
    assert caught[1.25][0] == caught[1.25][1]  # every case of a contender 25 % slower caught, in every pair


def test_a_contender_made_slower_is_slower_in_every_case_and_compare_exits_1(cli, tmp_path):
    base = save(fake_run(0), tmp_path / "base")
    new = save(slowed(fake_run(1, speed=1.06), "einsum", 1.25), tmp_path / "new")
    code, text, err = cli("compare", str(base), str(new), "--out", str(tmp_path / "cmp"))
    assert code == 1 and "4 case(s) slower beyond their floor" in err
    lines = [line.split() for line in text.splitlines() if line.lstrip().startswith(IMPLS)]
    verdicts = {(words[0], " ".join(words[1:9])): words[9] for words in lines}
    assert {v for (impl, _), v in verdicts.items() if impl == "einsum"} == {"slower"}
    assert "slower" not in {v for (impl, _), v in verdicts.items() if impl != "einsum"}
    assert "from per-repeat medians" in text and "median shift +6" in text
    aa = save(fake_run(2, speed=1.08), tmp_path / "aa")
    code, text, _ = cli("compare", str(base), str(aa), "--out", str(tmp_path / "cmp2"))
    assert code == 0 and " slower" not in text.split("note:")[0].split("\n")[-2]


def test_a_case_inside_its_measured_noise_is_not_called(cli):
    noisy = Evidence(np.array([1.0, 1.3, 1.1]), "repeats", 0.3)
    moved = Evidence(np.array([1.25, 1.5, 1.35]), "repeats", 0.2)
    outcome, ratio, _, floor, note = found = verdict(noisy, moved, Settings())
    assert found.outcome == outcome and found.floor == floor  # a Verdict, read by name
    assert ratio == pytest.approx(1.35 / 1.1) and floor == pytest.approx(0.3)
    assert outcome == "unclear" and "within the noise" in note


def test_a_change_the_whole_run_shares_is_unclear_not_slower():
    base = Evidence(np.array([1.0, 1.01, 0.99]), "repeats", 0.02)
    new = Evidence(np.array([1.12, 1.13, 1.11]), "repeats", 0.02)
    assert verdict(base, new, Settings()).outcome == "slower"
    found = verdict(base, new, Settings(), shift=float(np.log(1.11)))
    outcome, note = found.outcome, found.note
    assert outcome == "unclear" and "and the cases it is judged beside +11.0% (the median change of" in note


def test_repeats_are_centred_on_the_stored_median():
    row = {"median_ms": 2.0, "repeat_medians_ms": [1.0, 1.1, 0.9], "samples_ms": [1.0] * 5}
    found = evidence(row)
    assert found.basis == "repeats" and found.median == pytest.approx(2.0)
    assert found.noise == pytest.approx(1.1 / 0.9 - 1)


def test_without_repeats_the_verdicts_say_they_are_within_run_only(cli, tmp_path):
    base = save(fake_run(0, repeats=1), tmp_path / "base")
    new = save(fake_run(1, repeats=1), tmp_path / "new")
    _, text, _ = cli("compare", str(base), str(new), "--out", str(tmp_path / "cmp"))
    assert "verdicts are within-run only" in text and "from within-run samples" in text


def test_within_run_samples_never_decide_slower(cli, tmp_path):
    """Issue 24: two identical --repeat 1 runs, one case 8.5 % slower in the second with tight samples
    (p ≈ 1e-4, as bmm B2 H8/2 S512x256 was): `unclear` with the way to decide it, exit 0."""
    base = fake_run(0, repeats=1)
    new = fake_run(0, repeats=1)
    case = (new["impl"] == "bmm") & (new["seq_q"] == 1024) & (new["mask"] == "none")
    new.loc[case, "median_ms"] *= 1.085
    new["samples_ms"] = [
        [v * 1.085 for v in values] if pick else values for values, pick in zip(new["samples_ms"], case, strict=True)
    ]
    code, text, err = cli(
        "compare", str(save(base, tmp_path / "base")), str(save(new, tmp_path / "new")), "--out", str(tmp_path / "cmp")
    )
    assert code == 0 and "slower beyond" not in err
    (line,) = [
        line for line in text.splitlines() if line.lstrip().startswith("bmm") and "S1024 " in line and " none " in line
    ]
    words = line.split()
    assert "unclear" in words and "1.085" in words and float(words[words.index("1.085") + 1]) < 0.01
    (mark,) = [word for word in words if word.startswith("[")]
    (footnote,) = [line for line in text.splitlines() if line.startswith(f"{mark} ")]
    assert "looks slower, but on within-run samples only: rerun both with --repeat 3" in footnote
    assert "`attnbench ab`" in footnote


def test_the_terminal_table_prints_each_note_once_and_the_floor_as_the_band_it_spans(cli, tmp_path):
    """A ratio of 0.879 called faster beside "floor 13.1%" read as a contradiction (it is 12.1 % under 1, but
    beyond the floor on the log scale, 1/1.131 = 0.884): the floor is printed as the band of ratios it leaves
    same or unclear. One long note repeated per row made the table 450 characters wide: each distinct note is
    printed once below it, marked [n] in its rows; the floor source, one kind for every case, is left to the
    summary line."""
    from attnbench.reports.compare import floor_band, terminal_table

    assert floor_band(0.131) == "0.884–1.131" and floor_band(float("nan")) == ""
    base = fake_run(0, repeats=1)
    new = fake_run(1, repeats=1)
    new.loc[new["impl"] == "sdpa_flash", ["median_ms"]] *= 1.3
    new["samples_ms"] = [
        [v * 1.3 for v in values] if impl == "sdpa_flash" else values
        for values, impl in zip(new["samples_ms"], new["impl"], strict=True)
    ]
    _, text, _ = cli(
        "compare", str(save(base, tmp_path / "base")), str(save(new, tmp_path / "new")), "--out", str(tmp_path / "cmp")
    )
    lines = text.splitlines()
    rows = [line for line in lines if line.lstrip().startswith("sdpa_flash")]
    mark = rows[0].split()[-1]
    assert len(rows) == 4 and mark.startswith("[") and all(line.split()[-1] == mark for line in rows)
    assert sum(line.startswith(f"{mark} looks slower") for line in lines) == 1
    assert len({line.split()[0] for line in lines if line.startswith("[")}) == sum(
        line.startswith("[") for line in lines
    )
    assert max(len(line) for line in lines[: lines.index(rows[-1]) + 1]) < 120
    assert "floor_source" not in lines[0] and "floors: within-run only 12" in text
    assert all(re.search(r" 0\.\d{3}–1\.\d{3} ", line) for line in rows)
    from attnbench.reports.compare import Comparison

    table = pd.DataFrame(
        {
            "impl": ["a", "b"],
            "workload": ["w", "w"],
            "verdict": ["same", "same"],
            "ratio": [1.0, 1.0],
            "p_value": [0.5, 0.5],
            "floor": [0.05, 0.05],
            "floor_source": ["repeats", "history (3 runs)"],
            "note": ["", ""],
        }
    )
    shown, footnotes = terminal_table(Comparison(table, "repeats").table)
    assert "floor_source" in shown.splitlines()[0] and "note" not in shown and footnotes == []
    counts = table.assign(floor_source=["history (5 runs)", "history (7 runs)"])  # one kind: no column
    assert "floor_source" not in terminal_table(counts)[0].splitlines()[0]


def test_runs_with_no_case_in_common_are_bad_input(cli, tmp_path):
    """Nothing compared is not a pass: one line, exit 2, nothing written."""
    base = fake_run(0)
    other = fake_run(1)
    other["seq_q"] = other["seq_k"] = other["seq_q"] * 4
    code, text, err = cli(
        "compare",
        str(save(base, tmp_path / "base")),
        str(save(other, tmp_path / "other")),
        "--out",
        str(tmp_path / "cmp"),
    )
    assert code == 2 and text == "" and len(err.strip().splitlines()) == 1
    assert "BASE and NEW share no case (12 case(s) in BASE, 12 in NEW" in err
    assert not (tmp_path / "cmp").exists()
    failed = fake_run(1).assign(status="error", reason="boom")
    code, _, err = cli(
        "compare", str(tmp_path / "base"), str(save(failed, tmp_path / "failed")), "--out", str(tmp_path / "cmp")
    )
    assert code == 2 and "BASE and NEW share 12 case(s) but none ran ok in both" in err
    assert not (tmp_path / "cmp").exists()


def test_a_case_that_broke_in_new_fails_the_gate(cli, tmp_path):
    """A nightly gate: BASE ran ok, NEW's sdpa_flash is `incorrect` in one case and raised in another, and einsum
    failed to load. None has a time to compare (`not comparable`), but compare exits 1 naming them, as `ab` does;
    the same failures in BASE too, or a NEW row merely `stalled`, pass."""
    base = save(fake_run(0), tmp_path / "base")
    new = fake_run(1)
    wrong = new.index[new["impl"] == "sdpa_flash"]
    new.loc[wrong[0], ["status", "reason"]] = ["incorrect", "max_abs_err 0.1 over tolerance"]
    new.loc[wrong[1], ["status", "reason"]] = ["error", "RuntimeError: boom"]
    new.loc[new.index[new["impl"] == "bmm"][0], "status"] = "stalled"
    new.loc[new.index[new["impl"] == "einsum"][0], ["status", "reason"]] = ["unavailable", "failed to load: …"]
    code, text, err = cli("compare", str(base), str(save(new, tmp_path / "new")), "--out", str(tmp_path / "cmp"))
    assert code == 1 and "slower" not in err, err
    broke = [line for line in err.splitlines() if line.startswith("broken: ")]
    assert len(broke) == 3 and all(" cpu float32 B1 H8 S512 D64 " in line for line in broke)
    assert {line.rpartition(": ")[2] for line in broke} == {
        f"ok in BASE, {status} in NEW" for status in ("incorrect", "error", "unavailable")
    }
    assert "4 not comparable" in text and f"verdicts also in {tmp_path / 'cmp' / 'compare.csv'}" in text
    written = pd.read_csv(tmp_path / "cmp" / "compare.csv")  # what a script reads instead of the table
    assert len(written) == 12 and set(written["new_status"]) == {"ok", "incorrect", "error", "stalled", "unavailable"}
    assert (written["verdict"] == "not comparable").sum() == 4 and written["ratio"].notna().sum() == 8
    both = save(new, tmp_path / "both")  # broken on both sides: nothing broke since BASE
    code, _, err = cli("compare", str(both), str(both), "--out", str(tmp_path / "cmp2"))
    assert code == 0 and "broken" not in err


def test_compare_help_names_every_file_compare_writes(cli, capsys, tmp_path):
    """`attnbench compare --help` said its --out folder is "for compare.html and compare.png", though compare also
    writes compare.csv, the file a script reads (docs/compare.md). The help names every file a comparison leaves."""
    base, new = save(fake_run(0), tmp_path / "base"), save(fake_run(1), tmp_path / "new")
    code, _, err = cli("compare", str(base), str(new), "--out", str(tmp_path / "cmp"))
    assert code in (0, 1), err
    written = sorted(path.name for path in (tmp_path / "cmp").iterdir())
    assert written == ["compare.csv", "compare.html", "compare.png"]
    with pytest.raises(SystemExit):
        cli("compare", "--help")
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help: one space between words
    assert [name for name in written if name not in text] == []


def test_runs_with_different_repeats_are_bad_input(cli, tmp_path):
    base = save(fake_run(0, repeats=3), tmp_path / "base")
    new = save(fake_run(1, repeats=1), tmp_path / "new")
    code, _, err = cli("compare", str(base), str(new), "--out", str(tmp_path / "cmp"))
    assert code == 2 and "BASE has 3 repeat(s) per case and NEW 1" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cmp").exists()
    mixed = pd.concat([fake_run(0, repeats=3).iloc[:6], fake_run(0, repeats=2).iloc[6:]])
    code, _, err = cli("compare", str(save(mixed, tmp_path / "mixed")), str(base), "--out", str(tmp_path / "c2"))
    assert code == 2 and "BASE mixes rows with 2 and 3 repeats" in err


@pytest.mark.parametrize("value", ["-0.1", "0", "1.5"])
def test_bad_threshold_is_one_line(cli, tmp_path, value):
    base = save(fake_run(0), tmp_path / "base")
    code, _, err = cli("compare", str(base), str(base), "--threshold", value, "--out", str(tmp_path / "cmp"))
    assert code == 2 and f"--threshold {float(value)}: must be a fraction between 0 and 1" in err
    assert not (tmp_path / "cmp").exists()
