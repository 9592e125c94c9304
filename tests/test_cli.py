import json
import re
from pathlib import Path

import pandas as pd
import pytest

from attnbench.contenders import registry
from attnbench.errors import UsageError
from attnbench.runner.results import COLUMNS

from conftest import CHECKED, attnbench_cmd, run_subprocess

BAD_INPUTS = [
    (["run", "--suite", "nosuch"], "suite 'nosuch' is not known; known:"),
    (["run", "--impl", "flash9"], "impl 'flash9' is not known; known:"),
    (["run", "--dtype", "int4"], "dtype 'int4' is not known; allowed: float32"),
    (["run", "--device", "tpu"], "--device 'tpu' is not known; allowed: cpu, cuda"),
    (["run", "--seq", "0"], "--seq value 0 must be a positive integer"),
    (["run", "--seq", "-512"], "--seq value -512 must be a positive integer"),
    (["run", "--batch", "two"], "--batch 'two': expected positive integers"),
    (["run", "--heads", "6", "--kv-heads", "4"], "heads 6 is not divisible by kv_heads 4"),
    (["run", "--mask", "prefix_lm"], "mask 'prefix_lm' is not known; allowed: none, causal"),
    (["run", "--pass", "backward"], "pass 'backward' is not known; allowed: fwd, bwd, fwd_bwd"),
    (["run", "--seq", "512,,1024"], "--seq '512,,1024': an empty value (a comma at an end, or two together)"),
    (["run", "--seq", "256,"], "give a comma-separated list, e.g. --seq 512,1024"),
    (["run", "--mask", ","], "e.g. --mask none,causal"),
    (["run", "--threads", "0"], "--threads 0: must be a positive integer"),
    (["run", "--threads", "4096"], "--threads 4096: more threads than the"),
    (["ab", "--a", "bmm", "--b", "einsum", "--threads", "4096"], "--threads 4096: more threads than the"),
    (["env", "--threads", "4096"], "--threads 4096: more threads than the"),
    (["profile", "--impl", "bmm", "--threads", "4096"], "--threads 4096: more threads than the"),
    (["run", "--budget-s", "-1"], "--budget-s -1.0: must be a positive number"),
    (["run", "--timeout-s", "0"], "--timeout-s 0.0: must be a positive number"),
    (["run", "--shard", "4/3"], "--shard '4/3': I must be between 1 and N"),
    (["run", "--shard", "half"], "--shard 'half': expected I/N"),
    (["run", "--isolate", "maybe"], "argument --isolate: invalid choice: 'maybe'"),
    (["run", "--cpu-allocator", "jemalloc"], "argument --cpu-allocator: invalid choice: 'jemalloc'"),
    (["run", "--suite", "missing/file.toml"], "suite file 'missing/file.toml' does not exist"),
    (["run", "--resume", "nowhere"], "--resume nowhere: no such folder"),
    (["run", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["launch"], "invalid choice: 'launch'"),
    (["report", "no/such/run"], "no/such/run: no such run folder or file"),
    (["compare", "a", "b", "--alpha", "2"], "--alpha 2.0: must be between 0 and 1"),
    (["merge", "a"], "the following arguments are required: --out"),
    (["profile", "--impl", "nosuch"], "impl 'nosuch' is not known"),
    (["profile", "--impl", "bmm", "--calls", "0"], "--calls 0: must be a positive integer"),
    (["history", "--since", "2026-11-20"], "--since is for --fail-on-regression: add it"),
    (["history", "--fail-on-regression", "10", "--since", "last week"], "--since 'last week': not a date or time"),
    (["profile", "--impl", "bmm", "--pass", "bwd"], "--pass bwd: profile records the forward call only; allowed: fwd"),
    # workload features, model presets and absurd sizes (issues 12 and 13)
    (
        ["run", "--mask", "sliding_window", "--window", "0"],
        "--window value 0 must be a positive integer (mask sliding_window only; other cases ignore it)",
    ),
    (["run", "--mask", "sliding_window"], "mask sliding_window needs window ≥ 1 (--window), got 0"),
    (
        ["run", "--mask", "document", "--documents", "300", "--seq", "256"],
        "documents 300 with sequence length 256: allowed 1 to 256",
    ),
    (
        ["run", "--mask", "document", "--documents", "2", "--seq", "128", "--seq-kv", "256"],
        "mask document packs documents into one sequence, so it needs seq_q == seq_k; got 128 and 256",
    ),
    (
        ["run", "--score-mod", "softcap", "--softcap", "-5"],
        "--softcap value -5.0 is not allowed; allowed: a positive number up to 1e+06",
    ),
    (["run", "--score-mod", "tanh"], "score_mod 'tanh' is not known; allowed: none, softcap, alibi"),
    (["run", "--model", "llama9"], "model 'llama9' is not known; known: llama3.1-8b, llama3.1-70b"),
    (
        ["run", "--model", "llama3.1-8b", "--phase", "prefill", "--heads", "4"],
        "--heads: the model preset (llama3.1-8b) sets heads, so it would be ignored",
    ),
    (["run", "--model", "llama3.1-8b", "--mask", "none"], "--mask: the model preset (llama3.1-8b) sets mask"),
    (["run", "--suite", "models-cpu", "--window", "64"], "--window: the model preset (llama3.2-1b, llama3.1-8b"),
    (["run", "--model", "gpt2", "--phase", "train"], "--phase value 'train' is not known; allowed: prefill, decode"),
    (["run", "--phase", "decode"], "phase applies to model presets: give --model too"),
    (
        ["run", "--model", "gpt2", "--phase", "decode", "--seq", "64"],
        "phase decode: --seq 64 is not a decode step; allowed: 1 to 16 query tokens",
    ),
    (
        ["run", "--page-size", "48"],
        "--page-size value 48 is not allowed; allowed: 0 (contiguous KV) or a power of two up to 65536",
    ),
    (
        ["run", "--seq", "12345678901234567890"],
        "--seq value 12345678901234567890 is past the sane upper bound; allowed: 1 to 16777216",
    ),
    (["run", "--batch", "100000000"], "--batch value 100000000 is past the sane upper bound; allowed: 1 to 65536"),
    (["masks", "--tile", "128x0"], "--tile '128x0': expected query rows x keys, positive, e.g. --tile 128x128,128x64"),
    (["masks", "--mask", "document", "--seq", "64", "--seq-kv", "128"], "needs seq_q == seq_k; got 64 and 128"),
    # no value, or a number that never ends: refused, not taken as the default (or the current folder)
    (["run", "--suite", ""], "--suite '': no value; give one, e.g. --suite quick"),
    (["run", "--shard", ""], "--shard '': no value; give one, e.g. --shard 2/3"),
    (["merge", "a", "--out", ""], "--out '': no value; give a new folder for the merged results"),
    (["env", "--dtype", ""], "--dtype '': no value; give a comma-separated list"),
    (["ab", "--a", "bmm", "--b", "bmm", "--out", ""], "--out '': no value; give one, e.g. --out runs/ab-mine"),
    (["masks", "--out", ""], "--out '': no value; give one, e.g. --out runs/masks-mine"),
    (["history", "--db", ""], "--db '': no value; give one, e.g. --db runs/attnbench.duckdb"),
    # a feature flag no case uses: it was dropped without a word
    (["run", "--mask", "causal", "--window", "128"], "--window 128 applies to mask sliding_window, which no case has"),
    (["run", "--softcap", "30"], "--softcap 30 applies to score_mod softcap, which no case has (its score_mod: none)"),
    (["run", "--model", "gpt2", "--decode-share", "0.3"], "mask: causal, causal_bottom_right); add --phase mixed"),
    (["run", "--budget-s", "inf"], "--budget-s inf: must be a positive number of seconds"),
    (["run", "--timeout-s", "inf"], "--timeout-s inf: must be a positive number of seconds"),
    (["profile", "--impl", "bmm", "--budget-s", "inf"], "--budget-s inf: must be a positive number of seconds"),
    (["ab", "--a", "bmm", "--b", "bmm", "--budget-s", "inf"], "--budget-s inf: must be a positive number of seconds"),
    (["history", "--min-change", "inf"], "--min-change inf: must be a fraction ≥ 0"),
    (["history", "--fail-on-regression", "inf"], "--fail-on-regression inf: must be a percentage ≥ 0"),
    (
        ["ratios", "r", "--impl", "a", "--vs", "b", "--max-time-ratio", "nan"],
        "--max-time-ratio nan: must be a positive",
    ),
    (["ratios", "r", "--impl", "a", "--vs", "b", "--min-speedup", "-1"], "--min-speedup -1: must be a positive number"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    needs_out = args[0] in {"run", "profile", "report"} and "--frobnicate" not in args and "--resume" not in args
    code, out, err = cli(*args, *(["--out", "x"] if needs_out else []))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnbench: error: ")
    assert message in lines[0]
    assert out == "" and list(tmp_path.iterdir()) == []


def test_at_least_twenty_kinds_of_bad_input():
    assert len({message for _, message in BAD_INPUTS}) >= 20


def test_cuda_on_a_cpu_machine_is_refused(cli, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = cli("run", "--suite", "gpu", "--out", str(tmp_path / "r"))
    assert code == 2 and "device cuda: torch.cuda.is_available() is False" in err
    assert not (tmp_path / "r").exists()


def test_existing_out_folder_is_refused(cli, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    code, _, err = cli("run", "--impl", "bmm", "--out", str(tmp_path))
    assert code == 2 and "already exists and is not an empty folder" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_run_out_empty_is_refused_not_the_current_folder(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty folder: '' (Path('') is '.') would have taken it as the run folder
    code, out, err = cli("run", "--impl", "bmm", "--seq", "64", "--out", "")
    assert code == 2 and err.count("\n") == 1 and "--out '': no value; give one, e.g. --out runs/mine" in err
    assert out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--impl", "bmm", "--seq", "64"],
        ["profile", "--impl", "bmm", "--seq", "64"],
        ["masks", "--mask", "causal", "--seq", "64"],
        ["merge", "nowhere"],
        ["ab", "--a", "bmm", "--b", "bmm", "--seq", "64"],
    ],
    ids=lambda args: args[0],
)
def test_out_under_a_file_is_one_line_before_any_work(cli, tmp_path, args):
    (tmp_path / "notes.txt").write_text("mine")
    out = tmp_path / "notes.txt" / "run"
    code, text, err = cli(*args, "--out", str(out))
    assert code == 2 and text == "" and err.count("\n") == 1 and "Traceback" not in err
    assert f"--out {out}: {tmp_path / 'notes.txt'} is a file, not a folder; give a path under folders" in err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc here")
def test_out_where_no_folder_can_be_made_is_one_line_before_any_work(cli, tmp_path):
    """As root every permission check passes, and `run --out /proc/x` ran the whole sweep before its first write
    failed with a traceback: whether a folder can be made there is now tried, before any work."""
    code, text, err = cli("run", "--impl", "bmm", "--seq", "64", "--out", "/proc/attnbench-x")
    assert code == 2 and text == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "--out /proc/attnbench-x: /proc is not writable; give a folder you can write in" in err
    from attnbench.errors import check_can_make

    check_can_make(tmp_path / "new" / "run", "--out")  # a writable parent passes, and the probe leaves nothing
    assert list(tmp_path.iterdir()) == []


def test_bad_input_from_a_real_process_has_no_traceback(tmp_path):
    result = run_subprocess(*attnbench_cmd("run", "--heads", "6", "--kv-heads", "4"), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_list_shows_every_contender_with_reasons(cli):
    code, out, _ = cli("list", "--json")
    assert code == 0
    records = {r["name"]: r for r in json.loads(out)}
    assert {
        "naive",
        "bmm",
        "einsum",
        "sdpa_math",
        "sdpa_flash",
        "sdpa_efficient",
        "sdpa_cudnn",
        "xformers",
        "flex",
    } <= set(records)
    for record in records.values():
        assert record["available"] or record["reason"]
    assert records["bmm"]["backward"] is True and records["naive"]["devices"] == ["cpu"]
    code, text, _ = cli("list")
    assert code == 0 and any(line.startswith("xformers ") and "unavailable" in line for line in text.splitlines())


@pytest.mark.parametrize("mode", ["lines", "auto"])
def test_progress_lines_says_each_case_as_its_row_is_written(cli, tmp_path, mode):
    """`--progress lines`, for a batch job's log: a line per case, numbered of the run's, with its time or reason;
    `auto` does the same where stderr is not a terminal (here: captured), where it said nothing until the table."""
    cudnn_here = registry.load()["sdpa_cudnn"].available  # on a CUDA machine it runs: its CPU rows are unsupported
    out = tmp_path / "run"
    flags = ["--impl", "bmm,sdpa_cudnn", "--seq", "64", "--mask", "none", "--budget-s", "0.02", "--no-memory"]
    code, _, err = cli("run", *flags, "--progress", mode, "--out", str(out))
    assert code == 0
    rows = pd.read_csv(out / "results.csv")
    said = [line for line in err.splitlines() if re.match(r"\[\d+/\d+ \d+:\d\d:\d\d\] ", line)]
    assert len(rows) == 4  # the quick suite's two S64 workloads, two contenders each
    assert len(said) == (4 if cudnn_here else 3)  # but sdpa_cudnn, unavailable on a CPU, is said once
    assert [line.split()[0][1:] for line in said] == sorted({line.split()[0][1:] for line in said})  # k/4 rising
    assert said[-1].startswith("[4/4 ")
    for line in said:
        impl, rest = line.split("] ", 1)[1].split(" ", 1)
        if impl == "bmm":
            assert re.search(r"float32 cpu none fwd: (ok|stalled) [0-9.e+-]+ ms", rest), line
        else:  # a row that is not ok says why, an unavailable contender for all its cases at once
            said_as = r": unsupported — device cpu" if cudnn_here else r": unavailable \(all its cases\) — \S"
            assert impl == "sdpa_cudnn" and re.search(said_as, rest), line


def test_run_writes_results_meta_and_summary(cli, tmp_path):
    out = tmp_path / "run"
    code, text, _ = cli(
        "run",
        "--impl",
        "bmm,sdpa_math,xformers",
        "--seq",
        "64",
        "--mask",
        "none,padding",
        "--pass",
        "fwd,bwd",
        "--budget-s",
        "0.05",
        "--threads",
        "1",
        "--out",
        str(out),
    )
    assert code == 0
    parquet = pd.read_parquet(out / "results.parquet")
    csv = pd.read_csv(out / "results.csv")
    # 2 sweeps x 2 masks x 2 passes x 3 impls, one row each
    assert len(parquet) == len(csv) == 24
    assert list(parquet.columns) == COLUMNS
    assert not parquet.duplicated(["impl", "seq_q", "seq_k", "kv_heads", "mask", "pass"]).any()
    fwd = parquet[(parquet["pass"] == "fwd") & parquet.impl.isin(["bmm", "sdpa_math"])]
    assert fwd.status.isin(CHECKED).all() and (fwd.max_abs_err <= fwd.atol).all() and (fwd.threads == 1).all()
    assert set(parquet[parquet.impl == "xformers"].status) == {"unavailable"}
    assert (parquet[parquet.status != "ok"].reason.str.len() > 0).all()
    assert json.loads(csv.samples_ms.dropna().iloc[0]) == list(parquet.samples_ms.dropna().iloc[0])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["finished"] is True and meta["n_cases"] == 24 and meta["end_time"]
    assert meta["environment"]["threads"] == 1 and meta["environment"]["torch_version"]
    assert meta["command"].startswith("attnbench run --impl bmm,sdpa_math,xformers --seq 64")
    assert "fastest" in text and "24 cases:" in text and "xformers: unavailable" in text
    assert len((out / "rows.jsonl").read_text().splitlines()) == 24


def test_default_run_folder_goes_under_runs(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, _ = cli("run", "--impl", "bmm", "--seq", "16", "--mask", "none", "--budget-s", "0.02")
    assert code == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("quick-") and (run / "results.parquet").exists()


def test_default_folders_are_made_at_once_and_a_failed_command_leaves_none(cli, tmp_path, monkeypatch):
    from attnbench import cli as cli_module

    monkeypatch.chdir(tmp_path)
    now = cli_module.dt.datetime(2026, 11, 28, 12, 0, 0)
    with monkeypatch.context() as patch:  # (datetime.datetime itself: matplotlib reads it too)
        patch.setattr(cli_module.dt, "datetime", type("Frozen", (), {"now": staticmethod(lambda: now)}))
        first, second = cli_module._default_out("quick"), cli_module._default_out("quick")  # the same second
    assert (first.name, second.name) == ("quick-20261128-120000", "quick-20261128-120000-2")
    assert first.is_dir() and second.is_dir()  # made, not only looked for: another command can't take them
    cli_module._drop_empty_claims()
    assert list(tmp_path.iterdir()) == []  # runs/ too: this test's calls made it
    from attnbench.runner import sweep

    def refused(request, default_out, say_late=True):  # refused once its folder is made (no contender can run)
        assert default_out.is_dir() and default_out.parent == Path("runs")
        raise UsageError("planted refusal")

    monkeypatch.setattr(sweep, "run_sweep", refused)
    assert cli("run", "--impl", "bmm", "--seq", "16")[:2] == (2, "")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["report", "."], ["masks"], ["run", "--impl", "bmm", "--seq", "16"]])
def test_a_default_folder_that_cannot_be_made_is_one_line(cli, tmp_path, monkeypatch, command):
    """A file named `runs` where the default folder goes: one line and exit 2, not a NotADirectoryError."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a folder")
    code, out, err = cli(*command)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert "cannot make the default folder runs/" in err and "(runs is a file, not a folder); give" in err
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]


def test_suites_descriptions_start_in_one_column(cli):
    """The description column is aligned to the longest suite name (fused_cpu_decode and friends)."""
    code, out, _ = cli("suites")
    lines = out.splitlines()
    names = [line.split()[0] for line in lines]
    assert code == 0 and "fused_cpu_decode" in names
    width = max(map(len, names))
    starts = {len(line) - len(line[width:].lstrip()) for line in lines}
    assert starts == {width + 2}, out
    assert all(line[len(name) : width + 2].strip() == "" for line, name in zip(lines, names, strict=True))


def test_module_entry_point_env_and_suites(tmp_path):
    env = run_subprocess(*attnbench_cmd("env", "--dtype", "fp32"))
    assert env.returncode == 0 and json.loads(env.stdout)["torch_version"]
    cpu = json.loads(env.stdout)["ceilings"]["cpu"]
    assert cpu["roof_tflops"]["float32"] >= cpu["matmul_tflops"]["float32"] > 0 and cpu["roof_source"]["float32"]
    suites = run_subprocess(*attnbench_cmd("suites"))
    names = [line.split()[0] for line in suites.stdout.splitlines()]
    assert suites.returncode == 0 and names == sorted(names)
    assert {"quick", "standard", "gpu", "scoring", "mha", "fused_cpu", "fused_gpu"} <= set(names)


def test_a_percentage_and_a_fraction_given_the_other_way_are_said_back(cli, tmp_path):
    """history's --fail-on-regression is in per cent, --min-change a fraction: a value that reads as the other
    kind is said back in a warning (the command goes on; here it stops at the missing store)."""
    code, _, err = cli(
        "history", "--db", str(tmp_path / "none.duckdb"), "--fail-on-regression", "0.1", "--min-change", "5"
    )
    assert code == 2
    assert "warning: --fail-on-regression 0.1 is 0.1 % (per cent, not a fraction: 10 is 10 %)" in err
    assert "warning: --min-change 5 is 500% (a fraction: 0.05 is 5 %)" in err


def test_version_prints_the_version_and_exits_0(capsys):
    """`attnbench --version` said "the following arguments are required: command" and exited 2."""
    import attnbench
    from attnbench.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"attnbench {attnbench.__version__}\n"
