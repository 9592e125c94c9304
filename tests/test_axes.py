"""The axis table (issue 20): one row per axis feeds flags, suite keys, attnbench.run() keywords, Workload
checks, columns and labels; a case renders as the `attnbench run` flags that reproduce exactly it."""

import inspect

import pytest

import attnbench
from attnbench.cli import build_parser, request_from_args
from attnbench.runner.request import RunSettings, build_request
from attnbench.runner.results import COLUMNS
from attnbench.runner.sweep import plan_cases
from attnbench.workload import Workload
from attnbench.workload.axes import (
    AXES,
    SWEEP_AXES,
    WORKLOAD_COLUMNS,
    Axis,
    case_label,
    features_asked,
    reproduce_flags,
)

CASES = [
    Workload(2, 8, 2, 128, 256, 64, mask="causal_bottom_right", page_size=64),
    Workload(1, 4, 4, 96, 96, 32, "bf16", mask="sliding_window", window=48, score_mod="softcap", softcap=20.0),
    Workload(3, 6, 2, 40, 40, 16, mask="document", documents=5, score_mod="alibi", pass_="fwd_bwd"),
    Workload(1, 2, 2, 32, 32, 8, hidden=16),
    Workload(
        2,
        16,
        8,
        256,
        256,
        256,
        "fp32",
        mask="sliding_window",
        window=4096,
        score_mod="softcap",
        softcap=50,
        model="gemma2-9b",
        layer="sliding",
    ),
    Workload(8, 32, 8, 1, 2048, 128, mask="causal_bottom_right", page_size=16, model="llama3.1-8b"),
    Workload(1, 32, 8, 512, 1024, 128, mask="causal_bottom_right", model="llama3.1-8b"),  # prefill on a cache
    Workload(1, 12, 12, 16, 16, 64, mask="causal", model="gpt2", hidden=8),  # a preset's case with a plain axis
]


def _parsed_back(flags: list[str]) -> list[tuple[str, Workload]]:
    args = build_parser().parse_args(["run", *flags])
    args.command_line = "attnbench run " + " ".join(flags)
    return plan_cases(request_from_args(args))[1]


@pytest.mark.parametrize("workload", CASES, ids=[w.label() for w in CASES])
def test_the_flags_of_a_case_run_exactly_that_case(workload):
    flags = reproduce_flags(workload)
    assert _parsed_back([*flags, "--impl", "bmm"]) == [("bmm", workload)]
    row = {"impl": "bmm", **workload.as_row()}  # a results row: the scale column holds 1/sqrt(D)
    assert reproduce_flags(row) == ["--impl", "bmm", *flags]


def test_flags_leave_out_neutral_features_and_name_the_rest():
    flags = reproduce_flags(CASES[0])
    assert " ".join(flags) == (
        "--batch 2 --heads 8 --kv-heads 2 --seq 128 --seq-kv 256 --head-dim 64 --dtype float32 --device cpu "
        "--mask causal_bottom_right --pass fwd --module core --page-size 64"
    )
    assert " ".join(reproduce_flags(CASES[5])) == (
        "--model llama3.1-8b --phase decode --batch 8 --seq 1 --seq-kv 2048 --dtype float32 --device cpu "
        "--pass fwd --module core --page-size 16"
    )
    # an axis neither the preset nor the phase sets is carried, not dropped (--from reran hidden <NA> for hidden 8)
    assert " ".join(reproduce_flags(CASES[7])) == (
        "--model gpt2 --phase prefill --batch 1 --seq 16 --dtype float32 --device cpu --pass fwd --hidden 8 "
        "--module core"
    )
    with pytest.raises(ValueError, match=r"scale 0\.5 has no flag"):
        reproduce_flags(Workload(1, 1, 1, 8, 8, 8, scale=0.5))


def test_one_table_gives_flags_keywords_columns_and_labels():
    parser_flags = {a.option_strings[0] for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions}
    assert {axis.flag for axis in SWEEP_AXES} <= parser_flags
    keywords = inspect.signature(attnbench.run).parameters
    assert [axis.keyword for axis in SWEEP_AXES] == [k for k in keywords if k in {a.keyword for a in SWEEP_AXES}]
    assert "pass_" in keywords and "page_size" in keywords
    assert COLUMNS[1 : 1 + len(WORKLOAD_COLUMNS)] == WORKLOAD_COLUMNS
    row = {"impl": "bmm", **CASES[2].as_row()}
    assert case_label(row, device_first=True) == "cpu float32 B3 H6/2 S40 D16 document fwd_bwd docs5 alibi"
    assert features_asked(row) == ["mask document", "score_mod alibi"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'sequence'"):
        attnbench.run(sequence=128)


def test_a_new_row_without_a_label_part_or_undeclared_fails_at_import_naming_the_fix():
    """A contributor's row (docs/workloads.md, "Adding an axis") without tag= made cases that differ only in it share
    a label (the report's figures merged them); a feature without declared=True was timed on every contender, a plugin's
    plain Capabilities() too. Both now fail where the table is built, in one line."""
    tag = lambda v: f"bias{v:g}" if v else ""  # noqa: E731
    with pytest.raises(ValueError, match=r"^axis bias: no label part; give it tag="):
        Axis("bias", float, "a score bias", neutral=0.0, declared=True)
    with pytest.raises(ValueError, match=r"^axis bias: a feature no contender declares; set declared=True"):
        Axis("bias", float, "a score bias", neutral=0.0, tag=tag)
    assert Axis("bias", float, "a score bias", neutral=0.0, declared=True, tag=tag).declared
    assert Axis("band", int, "keys per row", neutral=0, applies=("mask", "sliding_window"), tag=tag).applies
    assert Axis("scale", float, "softmax scale", sweep=False).tag is None  # no flag, so no case differs in it alone
    assert len({axis.name for axis in AXES}) == len(AXES)


def test_a_value_is_checked_once_with_one_message_from_every_front_end(tmp_path):
    message = "--page-size value 48 is not allowed; allowed: 0 (contiguous KV) or a power of two up to 65536"
    with pytest.raises(attnbench.UsageError) as from_text:
        build_request(None, {"page_size": "48"})
    with pytest.raises(attnbench.UsageError) as from_value:
        build_request(None, {"page_size": [0, 48]})
    assert str(from_text.value) == str(from_value.value) == message
    suite = tmp_path / "paged.toml"
    suite.write_text("[[sweep]]\nbatch = 1\nheads = 2\nseq = 8\nhead_dim = 8\npage_size = 48\n")
    with pytest.raises(attnbench.UsageError) as from_file:
        plan_cases(build_request(str(suite), {}))
    assert str(from_file.value) == message.replace("--page-size", "suite paged sweep 1: page_size")


def test_run_settings_keep_the_meta_json_keys_of_older_runs():
    settings = RunSettings(budget_s=0.5, case_budget_s=60.0, threads=2)
    keys = [
        "budget_s",
        "case_budget_s",
        "threads",
        "seed",
        "measure_memory",
        "cpu_allocator",
        "timeout_s",
        "isolate",
        "remeasure_ceilings",
        "repeat",
    ]
    assert list(settings.as_meta()) == keys
    older = {
        "budget_s": 0.4,
        "case_budget_s": 60.0,
        "threads": 2,
        "seed": 0,
        "measure_memory": True,
        "cpu_allocator": "cached",
        "timeout_s": 120.0,
        "isolate": "worker",
    }
    assert RunSettings.from_meta(older).repeats == 1
