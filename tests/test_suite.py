from pathlib import Path

import pytest

from attnbench import UsageError
from attnbench.contenders import registry
from attnbench.workload.suite import expand, load_suite, suite_names

KNOWN = ["bmm", "naive", "sdpa_flash"]


def test_shipped_suites_load_and_expand():
    assert {"quick", "standard", "gpu"} <= set(suite_names())
    for name in suite_names():
        suite = load_suite(name)
        assert suite.description and suite.budget_s > 0
        assert expand(suite, {}, sorted(registry.load()))


def test_quick_covers_every_mask_gqa_and_cross_attention():
    cases = expand(load_suite("quick"), {}, KNOWN)
    workloads = {w for _, w in cases}
    assert {w.mask for w in workloads} == {"none", "causal", "causal_bottom_right", "padding"}
    assert any(w.kv_heads < w.heads for w in workloads)
    assert any(w.seq_q != w.seq_k for w in workloads)
    assert {w.device for w in workloads} == {"cpu"}


def test_edges_checks_a_kernel_off_its_tiles_on_every_head_mapping_mask_and_pass():
    """A kernel author's first check: lengths and head dims off every power-of-two tile, one query row, both
    cross-attention directions, MHA, GQA and MQA, every basic mask, a backward and bf16 — one suite, not flags to
    find."""
    workloads = {w for _, w in expand(load_suite("edges"), {}, KNOWN)}
    assert 1 in {w.seq_q for w in workloads} and all(w.seq_q % 16 or w.seq_q == 1 for w in workloads if w.seq_q > 1)
    assert {w.head_dim % 16 for w in workloads} == {8} and {w.batch for w in workloads} >= {3}
    assert {w.kv_heads == w.heads for w in workloads} == {True, False} and any(w.kv_heads == 1 for w in workloads)
    assert any(w.seq_q < w.seq_k for w in workloads) and any(w.seq_q > w.seq_k for w in workloads)
    assert {w.mask for w in workloads} == {"none", "causal", "causal_bottom_right", "padding"}
    assert {w.pass_ for w in workloads} == {"fwd", "fwd_bwd"} and {w.dtype for w in workloads} == {
        "float32",
        "bfloat16",
    }
    assert {w.device for w in workloads} == {"cpu"} and len(workloads) <= 64  # a minute or two with two contenders


def test_gpu_suite_reaches_16k_in_half_precision():
    workloads = {w for _, w in expand(load_suite("gpu"), {"impl": ["bmm"]}, ["bmm"])}
    assert max(w.seq_q for w in workloads) == 16384
    assert {w.dtype for w in workloads} == {"bfloat16", "float16"} and {w.device for w in workloads} == {"cuda"}


def test_overrides_replace_axes_and_one_row_per_case():
    cases = expand(
        load_suite("quick"), {"impl": ["bmm"], "seq": [64], "mask": ["none", "causal"], "pass": ["fwd", "bwd"]}, KNOWN
    )
    # sweep 1: 1 seq x 2 masks x 2 passes; sweep 2: kv_heads 2, seq_kv 256, same 4 combinations
    assert len(cases) == 8 and len(set(cases)) == 8
    assert {w.pass_ for _, w in cases} == {"fwd", "bwd"}


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[sweep]]\nbatch = 1\nheads = 2\nseq = 8\n", "missing axis 'head_dim'"),
        ("[[sweep]]\nbatch = 1\nheads = 2\nseq = 8\nhead_dim = 8\nsequence = 3\n", "unknown key 'sequence'"),
        (
            "[[sweep]]\nbatch = 0\nheads = 2\nseq = 8\nhead_dim = 8\n",
            "batch value 0 must be a positive integer",
        ),
        ("[[sweep]]\nbatch = '2'\nheads = 2\nseq = 8\nhead_dim = 8\n", "batch value '2' must be an integer"),
        ("[[sweep]]\nbatch = []\nheads = 2\nseq = 8\nhead_dim = 8\n", "batch is an empty list"),
        ("budget_s = -1\n[[sweep]]\nbatch = 1\n", "budget_s must be a positive number"),
        ("budget_s = nan\n[[sweep]]\nbatch = 1\n", "budget_s must be a positive number of seconds, got nan"),
        ("case_budget_s = inf\n[[sweep]]\nbatch = 1\n", "case_budget_s must be a positive number of seconds, got inf"),
        ("description = 5\n[[sweep]]\nbatch = 1\n", "description must be a string, got 5"),
        ("[[sweep]\nbatch = 1\n", "not valid TOML"),
        ("colour = 1\n", "unknown top-level key 'colour'"),
        ("[[sweep]]\nbatch = 1\nheads = 2\nseq = 8\nhead_dim = 8\nmask = 'casual'\n", r"s sweep 1: mask 'casual' is"),
        (
            "[[sweep]]\nbatch = 1\nheads = 8\nkv_heads = [8, 3]\nseq = 8\nhead_dim = 8\n",
            r"s sweep 1: heads 8 is not divi",
        ),
        ("[defaults]\ndtype = 'fp9'\n[[sweep]]\nbatch = 1\n", r"suite s \[defaults\]: dtype 'fp9' is not known"),
        (
            "[[sweep]]\nmodel = 'llama3.1-8b'\nheads = 4\n",
            r"s sweep 1: heads: the model preset \(llama3.1-8b\) sets heads",
        ),
        ("[defaults]\nmask = 'none'\n[[sweep]]\nmodel = 'llama3.1-8b'\n", r"s sweep 1: mask: the model preset"),
    ],
)
def test_bad_suite_files_name_the_problem(tmp_path, text, message):
    with pytest.raises(UsageError, match=message):
        load_suite(_write(tmp_path, text))


def test_a_suite_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin.toml"
    path.write_bytes("description = 'caf\u00e9'\n".encode("latin-1"))
    with pytest.raises(UsageError, match=r"suite latin: not valid TOML \(not UTF-8 text: invalid continuation byte"):
        load_suite(str(path))


def test_unknown_suite_and_impl():
    with pytest.raises(UsageError, match=r"suite 'huge' is not known; known: .*quick.*\(or a \.toml path\)"):
        load_suite("huge")
    with pytest.raises(UsageError, match="impl 'flash3' is not known"):
        expand(load_suite("quick"), {"impl": ["flash3"]}, KNOWN)


def test_a_workload_refused_in_a_suites_own_sweep_says_which_sweep_and_what_it_set():
    """`run --mask document --seq 512` (quick by default) was refused with 'got 512 and 256': the 256 came from
    quick's second sweep, which the user never wrote; the message now says so and names the flag that sets it."""
    with pytest.raises(UsageError) as refused:
        expand(load_suite("quick"), {"mask": ["document"], "documents": [4], "seq": [512], "impl": ["bmm"]}, ["bmm"])
    message = str(refused.value)
    assert "got 512 and 256" in message and "(suite quick's sweep 2 of 2 sets" in message
    assert "seq_kv 256" in message and "--seq-kv and the like replace them" in message


def test_a_feature_flag_is_taken_where_some_sweep_uses_it(tmp_path):
    """Across a suite's several masks a flag may apply to some of them: not refused (only a flag no case uses is)."""
    two = tmp_path / "two.toml"
    two.write_text(
        '[[sweep]]\nimpl = ["bmm"]\nbatch = [1]\nheads = [2]\nseq = [64]\nhead_dim = [16]\nmask = ["causal"]\n'
        '[[sweep]]\nimpl = ["bmm"]\nbatch = [1]\nheads = [2]\nseq = [64]\nhead_dim = [16]\nmask = ["sliding_window"]\n'
        "window = [32]\n"
    )
    windows = {w.window for _, w in expand(load_suite(str(two)), {"window": [16]}, ["bmm"])}
    assert windows == {0, 16}
    both = expand(load_suite("quick"), {"mask": ["causal", "sliding_window"], "window": [64]}, ["bmm"])
    assert {w.window for _, w in both} == {0, 64}


def test_a_suite_of_one_sweep_is_named_without_its_sweep_number(cli, tmp_path):
    """`attnbench masks --seq 1` said "suite masks's sweep 1 of 1 sets …": a one-sweep suite is the suite."""
    code, _, err = cli("masks", "--seq", "1", "--out", str(tmp_path / "masks"))
    assert code == 0 and "(suite masks sets batch 1, heads 8, head_dim 64, documents 4 itself; --documents" in err
