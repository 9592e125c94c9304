"""Every attnbench and pytest command in the README and in the docs pages it links runs as written (the nox ones run
in CI itself; the SLURM script is covered by the shard, merge and resume tests), and every link among them lands."""

import concurrent.futures
import contextlib
import io
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.runner.results import CASE_COLUMNS

from conftest import REPO, run_subprocess

README = (REPO / "README.md").read_text()


def _pages() -> list[tuple[str, str]]:
    """README.md, then each docs page in the order the README first links it: the order a reader meets them and the
    order their commands run in (a docs page may read what a README command wrote, never the other way round)."""
    linked = dict.fromkeys(re.findall(r"\]\((docs/[^)#]+\.md)", README))
    return [("README.md", README)] + [(name, (REPO / name).read_text()) for name in linked if (REPO / name).is_file()]


PAGES = _pages()
DOCS = dict(PAGES[1:])
FENCE = re.compile(r"```(\w*)\n(.*?)```", flags=re.DOTALL)
# nox sessions whose arguments after `--` go to an attnbench subcommand
SESSION_COMMAND = {"bench": "run", "bench_gpu": "run", "bench_fused": "run", "profile": "profile", "history": "history"}
# subcommands cheap enough to run here as written, and what their output must hold
CHEAP = {"list": "sdpa_flash", "suites": "quick", "models": "llama3.1-8b"}


def _commands(prefix: str) -> list[str]:
    """The bash blocks' commands that start with ``prefix``, README first, then the docs pages in link order; a
    command a later page shows again runs once, where it first stands."""
    blocks = [block for _, text in PAGES for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)]
    blocks = [block for block in blocks if not block.startswith("#!")]  # job scripts (SLURM) are examples
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return list(dict.fromkeys(line for line in lines if line.startswith(prefix)))


def test_readme_names_the_two_setup_commands_and_ci_runs_the_test_one():
    setup = _commands("python3 -m pip install nox")
    assert setup == ["python3 -m pip install nox && nox -s bench", "python3 -m pip install nox && nox -s tests"]
    assert "nox -s lint tests" in (REPO / ".ci" / "run").read_text()


def _lanes(commands: list[str]) -> tuple[list[str], list[str]]:
    """The commands as two lanes to run side by side, each in README order: the ones whose results a
    later command reads (its --out folder named there, or the store and history that share runs/'s database),
    and the ones nothing reads after them (a run or profile whose folder no later command names, ab, list)."""
    later_text = [" ".join(commands[i + 1 :]) for i in range(len(commands))]
    chain, alone = [], []
    for command, after in zip(commands, later_text, strict=True):
        args = shlex.split(command)[1:]
        out = args[args.index("--out") + 1] if "--out" in args else None
        read_later = out is not None and re.search(rf"(^|\s){re.escape(out)}(\s|$)", after) is not None
        independent = args[0] in ("list", "models", "ab") or (args[0] in ("run", "profile") and not read_later)
        (alone if independent and "--store" not in args else chain).append(command)
    return chain, alone


def _run_lane(commands: list[str], cwd, niceness: int = 0) -> list[tuple[str, object]]:
    """Each command in turn; ``niceness`` > 0 runs them at a lower priority (see the test below)."""
    start = (lambda: os.nice(niceness)) if niceness else None
    return [
        (
            command,
            subprocess.run(
                [sys.executable, "-m", "attnbench", *shlex.split(command)[1:]],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=600,
                preexec_fn=start,
            ),
        )
        for command in commands
    ]


def _refused_for_want_of_ok_rows(args: list[str], stderr: str, cwd: Path) -> bool:
    """Whether a command that exited 2 said, in one line, that what it reads holds no ok row, and the runs' own records
    agree: compare's two runs share no case ok in both (their results files), or the store holds no ok row with
    history's --impl and --where. A run timed beside other work can end with every row `stalled` (its times a busy
    machine's, kept and not ranked): with one busy loop beside the serial phase on 2 cores, all 16 rows of runs/mine
    and all 16 of runs/mine-again, their threads waiting for a core 23-44 % of their time, and compare and both
    history commands had nothing to read (1 run of 1)."""
    if stderr.count("\n") != 1:
        return False
    if args[0] == "compare" and stderr.endswith("but none ran ok in both: nothing to compare\n"):
        base, new = (pd.read_parquet(cwd / run / "results.parquet") for run in args[1:3])
        both = base.merge(new, on=list(CASE_COLUMNS), suffixes=("_base", "_new"))
        return not ((both["status_base"] == "ok") & (both["status_new"] == "ok")).any()
    if args[0] == "history" and ("no ok row to draw" in stderr or "--impl: no ok row of" in stderr):
        where = ["status = 'ok'"] + ([f"impl = '{args[args.index('--impl') + 1]}'"] if "--impl" in args else [])
        where += [
            "CAST({} AS VARCHAR) = '{}'".format(*args[i + 1].split("=", 1))
            for i, a in enumerate(args)
            if a == "--where"
        ]
        con = duckdb.connect(str(cwd / "runs" / "attnbench.duckdb"), read_only=True)
        try:
            return con.execute(f"SELECT count(*) FROM rows WHERE {' AND '.join(where)}").fetchone()[0] == 0
        finally:
            con.close()
    return False


@pytest.mark.slow
@pytest.mark.serial  # its second lane takes only the cores the first leaves idle: nothing else may run beside them
def test_readme_attnbench_commands_run_in_order(tmp_path):
    """Every command as written, in page order (README, then docs) within two lanes run at once (what a later command
    reads is in the first, after what wrote it), so the 19 commands take the time of the longer lane. The second lane
    runs at the lowest priority: on 2 cores the two lanes' threads would take turns, and a case timed while
    its process waits for a core is `stalled` (its yardsticks collapse), not `ok` — and compare would find
    nothing ok in both runs. Niced, the second lane takes the cores the first leaves idle."""
    commands = _commands("attnbench ")
    assert len(commands) >= 5
    chain, alone = _lanes(commands)
    assert {"attnbench report runs/mine --out runs/report", "attnbench compare runs/mine runs/mine-again"} <= set(chain)
    assert any(c.startswith("attnbench run") for c in alone) and sorted(chain + alone) == sorted(commands)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        lanes = [pool.submit(_run_lane, lane, tmp_path, niceness) for lane, niceness in ((chain, 0), (alone, 19))]
        done = [pair for lane in lanes for pair in lane.result()]
    for command, result in done:
        args = shlex.split(command)[1:]
        allowed = (0, 1) if args[0] in ("compare", "ab") else (0,)  # compare, ab: exit 1 when a case got slower
        allowed = (0, 1) if "--fail-on-regression" in args else allowed  # history: 1 when the newest step is slower
        refused = _refused_for_want_of_ok_rows(args, result.stderr, tmp_path) if result.returncode == 2 else False
        assert result.returncode in allowed or refused, (command, result.stderr[-2000:])
    assert (tmp_path / "runs" / "report" / "report.html").exists()
    assert (tmp_path / "runs" / "prof" / "top_ops.csv").exists()
    # The DuckDB query, in its Python form, over the store the commands above filled: `runs` counts runs.
    blocks = [found for _, text in PAGES for found in FENCE.findall(text)]
    (query,) = [body for language, body in blocks if language == "python" and "duckdb" in body]
    shown = run_subprocess(sys.executable, "-c", query, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    # runs/mine and runs/mine-again, with their ok bmm rows: all 8 of each, but those timed while the machine stalled
    ok_bmm = [
        int(((frame["impl"] == "bmm") & (frame["status"] == "ok")).sum())
        for frame in (pd.read_parquet(tmp_path / "runs" / run / "results.parquet") for run in ("mine", "mine-again"))
    ]
    bmm = [line.split("│") for line in shown.stdout.splitlines() if line.startswith("│ bmm ")]
    counted = [(int(line[2]), int(line[3])) for line in bmm]
    assert counted == ([(sum(n > 0 for n in ok_bmm), sum(ok_bmm))] if any(ok_bmm) else []), shown.stdout


def test_readme_pytest_command_runs():
    (command,) = _commands("pytest suites/")
    result = run_subprocess(sys.executable, "-m", *shlex.split(command), "-q", "-p", "no:cacheprovider", cwd=REPO)
    assert result.returncode == 0, result.stdout[-2000:]


def _shown_commands() -> list[list[str]]:
    """Every command line the README and the docs pages show: the lines of their bash blocks, `$ ` lines and lines
    that start with attnbench or nox in their other blocks (not Python or TOML sources, not job scripts), and inline
    `…` spans that start with attnbench or nox (after VAR=value settings); each split at &&, || and ;."""
    lines = []
    for language, body in [found for _, text in PAGES for found in FENCE.findall(text)]:
        if language in ("python", "toml") or body.startswith("#!"):
            continue
        for line in body.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            elif language != "bash" and not line.startswith(("attnbench ", "nox ")):
                continue
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    for span in [span for _, text in PAGES for span in re.findall(r"`([^`]+)`", FENCE.sub("", text))]:
        span = span.replace("\n", " ")
        if re.match(r"([A-Z_]+=\S+ )*(attnbench|nox) ", span):
            lines.append(span)
    commands = []
    for line in lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
        lexer.whitespace_split = True
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word in ("&&", "||", ";", "|"):
                commands += [_without_settings(words)] if _without_settings(words) else []
                words = []
            else:
                words.append(word)
    return commands


def _without_settings(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        words = words[1:]
    return words


def _help(*args: str) -> str:
    """What `attnbench ARGS --help` prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*args, "--help"])
    return out.getvalue()


def _nox_sessions() -> set[str]:
    listed = run_subprocess(sys.executable, "-m", "nox", "-l", "-f", str(REPO / "noxfile.py"), cwd=REPO)
    assert listed.returncode == 0, listed.stderr
    return {m.group(1) for m in re.finditer(r"^[*-] (\w+)", listed.stdout, flags=re.MULTILINE)}


def _unknown_flags(subcommand: str, words: list[str]) -> list[str]:
    text = _help(subcommand)
    flags = [w.split("=")[0] for w in words if w.startswith("--") and len(w) > 2]
    return [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]


def test_every_nox_session_and_attnbench_subcommand_the_readme_names_exists(cli):
    """Each `nox -s NAME` the README or a docs page shows is a session (`nox -l`), and the README lists them all;
    each `attnbench SUB`
    is a subcommand (`attnbench --help`) and each of its flags is in `attnbench SUB --help`; the cheap
    subcommands run as written."""
    commands = _shown_commands()
    sessions = _nox_sessions()
    assert {"bench", "tests", "dev", "profile", "pytest_bench"} <= sessions
    subcommands = set(re.search(r"\{([\w,]+)\}", _help()).group(1).split(","))
    problems, ran = [], set()
    for words in commands:
        if words[0] == "nox" and "-s" in words:
            named = words[words.index("-s") + 1 : words.index("--") if "--" in words else len(words)]
            problems += [f"no nox session {name!r}: {' '.join(words)}" for name in named if name not in sessions]
            if "--" in words and named[0] in SESSION_COMMAND:
                rest = words[words.index("--") + 1 :]
                problems += [
                    f"{f} not in attnbench {SESSION_COMMAND[named[0]]} --help: {' '.join(words)}"
                    for f in _unknown_flags(SESSION_COMMAND[named[0]], rest)
                ]
        elif words[0] == "attnbench" and words[1] != "…":  # `attnbench …`: any command
            if words[1] not in subcommands:
                problems.append(f"no attnbench subcommand {words[1]!r}: {' '.join(words)}")
                continue
            problems += [
                f"{f} not in attnbench {words[1]} --help: {' '.join(words)}"
                for f in _unknown_flags(words[1], words[2:])
            ]
            if words[1] in CHEAP and "…" not in words:
                code, out, err = cli(*words[1:])
                assert code == 0 and CHEAP[words[1]] in out, (words, err)
                ran.add(words[1])
    assert not problems, "\n".join(problems)
    assert ran == set(CHEAP)
    listed = re.search(r"`nox -l` lists every session:\n\n((?:\|.*\n)+)", README)
    assert listed, "the README's table of nox sessions"
    first_cells = [row.split("|")[1] for row in listed.group(1).splitlines()[2:]]  # past the heading and rule
    assert {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)} == sessions


def test_readme_names_the_environment_each_command_runs_in():
    """`attnbench` is not on PATH after `nox -s bench`: the README says where it is and how to get your own."""
    setup = README[README.index("## Set up and run") : README.index("## What a run gives you")]
    assert "`.nox/bench/`" in setup and "nox -s dev" in setup and "source .venv/bin/activate" in setup
    dev = _commands("nox -s dev")
    assert dev and dev[0].startswith("nox -s dev")
    (pytest_line,) = _commands("pytest suites/")
    section = README[README.index("## pytest-benchmark") : README.index("## From Python")]
    through_nox = "nox -s pytest_bench --" + pytest_line.removeprefix("pytest suites/ --benchmark-only")
    assert "`nox -s dev` (`source .venv/bin/activate`)" in section and through_nox in section.splitlines()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", FENCE.sub("", text), flags=re.MULTILINE)}


def test_the_contents_list_names_every_section_and_every_feature():
    """A newcomer finds each feature from the contents list: every ## and ### heading of the README is in it, and
    the features that live in a docs page are linked there by their heading."""
    headings = [m.group(2) for m in re.finditer(r"^(##|###) (.+)$", FENCE.sub("", README), flags=re.MULTILINE)]
    contents = README[README.index("## Contents\n") : README.index("## A short tour\n")]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    assert sorted(listed) == sorted(_slug(h) for h in headings if h != "Contents")
    reached = set(listed) | set(re.findall(r"\]\(docs/[^)#]+#([^)]+)\)", contents))
    for feature in (
        "model-presets---model---phase",
        "kv-cache-type-bf16-and-fp8-caches",
        "ragged-and-mixed-batches",
        "shared-prefix-and-chunked-attention",
        "attention-sinks",
        "ab-is-my-change-faster",
    ):
        assert feature in reached


def test_every_link_lands_and_every_docs_page_is_linked_from_the_readme():
    """Every relative link of the README and of each docs page (a page, an image, a #heading there or on the same
    page, by GitHub's anchor rule) names something that exists; every docs page the README links exists, every
    docs/*.md is linked from the README, and each opens with the link back to it."""
    broken = []
    for name, text in [("README.md", README)] + [
        (p.relative_to(REPO).as_posix(), p.read_text()) for p in sorted((REPO / "docs").glob("*.md"))
    ]:
        here = (REPO / name).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            page = (here / path).resolve() if path else REPO / name
            if not page.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and page.suffix == ".md" and anchor not in _anchors(page.read_text()):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    linked = {page for page in re.findall(r"\]\((docs/[^)#]+\.md)", README)}
    assert linked == {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert [name for name, text in DOCS.items() if not text.split("\n")[2].startswith("[← README](../README.md)")] == []


def test_the_columns_table_names_every_results_column():
    """Every column of results.csv has a row in the Columns table (docs/results.md) (nine were missing once), and the
    table names no column a run does not write."""
    from attnbench.runner.results import COLUMNS

    results = DOCS["docs/results.md"]
    table = results[results.index("## Columns") :]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = set(re.findall(r"`(\w+)`", "\n".join(first_cells)))
    assert [c for c in COLUMNS if c not in named] == [] and sorted(named - set(COLUMNS)) == []


def test_adding_an_axis_names_what_a_row_needs_and_the_flag_list_names_every_axis():
    """README's "Adding an axis" said the row gives the label and the checks; walking it with a trial axis, the
    label needed tag=, the contenders' gate declared=True, and the float64 gate a reference.py definition, none of
    them named. The list of flags under "Workloads, masks and suites" is written by hand: it names every axis. Both
    live in docs/workloads.md."""
    from attnbench.workload.axes import SWEEP_AXES

    workloads = DOCS["docs/workloads.md"]
    section = workloads[workloads.index("## Adding an axis") :]
    needs = ("`tag`", "declared=True", "Capabilities.features", "reference.py", "Workload._check_joined")
    assert [word for word in needs if word not in section] == []
    flags = workloads[workloads.index("Every axis can be overridden on the command line") :].split("\n\n")[0]
    assert [axis.flag for axis in SWEEP_AXES if f"`{axis.flag}`" not in flags] == []


def test_our_fused_kernels_names_every_option_of_ratios():
    """`attnbench ratios` is how our kernels are gated; the README named five of its options and left out
    --min-pct-of-matmul and --peer-where (a bf16 case against its peers' float32 rows). It names them all."""
    section = README[README.index("## Our fused kernels") : README.index("## Workloads, masks and suites")]
    options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", _help("ratios"))) - {"--help"}
    assert sorted(o for o in options if not re.search(rf"{re.escape(o)}(?![\w-])", section)) == []


def test_every_table_ends_at_a_blank_line():
    """On GitHub a line of text right under a table is one more row of it: the README's contenders table swallowed
    the sentence after it ("`attnbench list` shows which are available here …") as a row of one cell. Every table
    of the README and of each docs page ends at a blank line."""
    run_on = []
    for name, text in PAGES:
        lines = FENCE.sub("", text).split("\n")
        run_on += [
            f"{name}: {b[:60]}" for a, b in itertools.pairwise(lines) if a.startswith("|") and b[:1] not in ("|", "")
        ]
    assert run_on == []
