"""The newest models' presets (issue 22, item 9): DeepSeek-V3's MLA, gpt-oss's sinks and windows, Qwen3,
Gemma-3's 5:1 local layers, Llama 4's chunks — their planned cases have the published shapes, a preset with
two kinds of layers runs both and names each in the `layer` column, those rows reproduce, and the report's
why-missing table names what they ask."""

import shlex

import pandas as pd
import pytest

from attnbench.cli import build_parser, request_from_args
from attnbench.runner.sweep import plan_cases
from attnbench.workload import axes, models
from attnbench.workload.axes import reproduce_flags

from conftest import CHECKED

SMALL = ["--seq", "1", "--seq-kv", "96", "--batch", "1"]  # decode sizes small enough to plan and run anywhere


def _plan(*flags: str):
    """The (impl, workload) cases `attnbench run FLAGS` plans, without running them."""
    args = build_parser().parse_args(["run", *flags])
    args.command_line = shlex.join(["attnbench", "run", *flags])
    return plan_cases(request_from_args(args))[1]


def _shape(workload) -> dict:
    fields = ("heads", "kv_heads", "head_dim", "head_dim_v", "kv_layout", "mask", "window", "sinks", "layer")
    return {field: getattr(workload, field) for field in fields}


def _decode_and_prefill(model: str) -> list:
    decode = _plan("--model", model, "--phase", "decode", "--impl", "bmm", *SMALL)
    prefill = _plan("--model", model, "--phase", "prefill", "--impl", "bmm", "--seq", "48")
    return [w for _, w in decode] + [w for _, w in prefill]


def test_deepseek_v3_prefills_expanded_heads_and_decodes_from_the_latent_cache():
    decode, prefill = _decode_and_prefill("deepseek-v3")
    # config.json: 128 heads, qk_nope_head_dim 128 + qk_rope_head_dim 64 = 192, v_head_dim 128
    assert _shape(prefill) == {
        "heads": 128,
        "kv_heads": 128,
        "head_dim": 192,
        "head_dim_v": 128,
        "kv_layout": "separate",
        "mask": "causal",
        "window": 0,
        "sinks": "none",
        "layer": "",
    }
    # absorbed decode: one cache of kv_lora_rank 512 + qk_rope_head_dim 64 channels, values its first 512
    assert _shape(decode) == {
        "heads": 128,
        "kv_heads": 1,
        "head_dim": 576,
        "head_dim_v": 512,
        "kv_layout": "latent",
        "mask": "causal_bottom_right",
        "window": 0,
        "sinks": "none",
        "layer": "",
    }
    assert (decode.seq_q, decode.seq_k, decode.model) == (1, 96, "deepseek-v3")
    assert decode.label().endswith("D576/512 float32 cpu causal_bottom_right fwd latent [deepseek-v3]")


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gpt-oss-120b"])
def test_gpt_oss_runs_its_sliding_and_full_layers_both_with_sinks(model):
    decode_sliding, decode_full, prefill_sliding, prefill_full = _decode_and_prefill(model)
    same = {"heads": 64, "kv_heads": 8, "head_dim": 64, "head_dim_v": 64, "kv_layout": "separate", "sinks": "learned"}
    assert _shape(decode_sliding) == {**same, "mask": "sliding_window", "window": 128, "layer": "sliding"}
    assert _shape(decode_full) == {**same, "mask": "causal_bottom_right", "window": 0, "layer": "full"}
    assert _shape(prefill_sliding) == {**same, "mask": "sliding_window", "window": 128, "layer": "sliding"}
    assert _shape(prefill_full) == {**same, "mask": "causal", "window": 0, "layer": "full"}
    assert decode_sliding.label().endswith(f"w128 sinks [{model} sliding]")
    assert decode_full.as_row()["layer"] == "full"


@pytest.mark.parametrize(("model", "heads", "kv_heads"), [("qwen3-8b", 32, 8), ("qwen3-32b", 64, 8)])
def test_qwen3_presets_are_one_kind_of_full_layer(model, heads, kv_heads):
    decode, prefill = _decode_and_prefill(model)
    full = {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": 128,
        "head_dim_v": 128,
        "kv_layout": "separate",
        "window": 0,
        "sinks": "none",
        "layer": "",
    }
    assert _shape(decode) == {**full, "mask": "causal_bottom_right"}
    assert _shape(prefill) == {**full, "mask": "causal"}
    assert decode.label().endswith(f"[{model}]")


def test_gemma3_27b_runs_its_local_window_1024_and_its_global_layers():
    cases = _decode_and_prefill("gemma3-27b")
    assert [(w.heads, w.kv_heads, w.head_dim, w.layer, w.mask, w.window) for w in cases] == [
        (32, 16, 128, "sliding", "sliding_window", 1024),
        (32, 16, 128, "full", "causal_bottom_right", 0),
        (32, 16, 128, "sliding", "sliding_window", 1024),
        (32, 16, 128, "full", "causal", 0),
    ]
    assert models.PRESETS["gemma3-27b"].layers == (("sliding", 52), ("full", 10))  # 5:1 over 62 layers


def test_llama4_scout_chunked_layers_ask_for_chunk_8192_and_its_full_layers_run():
    scout = models.PRESETS["llama4-scout"]
    assert scout.layers == (("chunked", 36), ("full", 12))  # every 4th of 48 layers attends to all keys
    chunked = models.phase_axes("llama4-scout", "prefill", {}, "chunked")
    assert {k: chunked[k] for k in ("heads", "kv_heads", "head_dim", "mask", "chunk", "layer")} == {
        "heads": [40],
        "kv_heads": [8],
        "head_dim": [128],
        "mask": ["chunked"],
        "chunk": [8192],
        "layer": ["chunked"],
    }
    full = [w for _, w in _plan("--model", "llama4-scout", "--phase", "decode", "--impl", "bmm", *SMALL)]
    shapes = [(w.layer, w.mask, w.heads, w.kv_heads, w.head_dim) for w in full]
    assert ("full", "causal_bottom_right", 40, 8, 128) in shapes
    assert [w.layer for w in full] == (["chunked", "full"] if models.CHUNKED_MASK_BUILT else ["full"])


def test_the_chunked_switch_follows_the_mask_table():
    """models.CHUNKED_MASK_BUILT turns on Llama 4's chunked layers; it must be on exactly when axes has the mask."""
    built = models.CHUNKED_MASK_BUILT
    assert built == ("chunked" in axes.MASKS), "switch models.CHUNKED_MASK_BUILT to match axes.MASKS"


def test_every_preset_sets_exactly_the_preset_axes():
    for model in models.PRESETS.values():
        for phase in models.PHASES:
            for kind in model.kinds:
                assert tuple(model.shape(phase, kind, "causal")) == models.PRESET_AXES


def test_a_layer_rows_reproduce_command_plans_exactly_that_case():
    flags = [
        "--model",
        "gpt-oss-20b",
        "--phase",
        "decode",
        "--impl",
        "bmm",
        *SMALL,
        "--page-size",
        "16",
        "--kv-dtype",
        "bfloat16",
    ]
    cases = _plan(*flags)
    planned = [(w.layer, w.page_size, w.kv_dtype) for _, w in cases]
    assert planned == [("sliding", 16, "bfloat16"), ("full", 16, "bfloat16")]
    for impl, workload in cases:
        command = reproduce_flags({**workload.as_row(), "impl": impl})
        assert command[command.index("--layer") + 1] == workload.layer
        assert _plan(*command) == [(impl, workload)]


def test_layer_picks_kinds_and_bad_layers_are_one_line(cli):
    # prefill and decode (each sized by its own flag: a 1-token prompt, a step over 96 keys), full layers only
    assert {w.layer for _, w in _plan("--model", "gemma3-27b", "--layer", "full", "--impl", "bmm", *SMALL)} == {"full"}
    # a one-kind preset whose kind is asked runs (its rows keep layer "")
    assert {w.layer for _, w in _plan("--model", "qwen3-8b", "--layer", "full", "--impl", "bmm", *SMALL)} == {""}
    code, out, err = cli("run", "--model", "qwen3-8b", "--layer", "sliding", "--impl", "bmm", *SMALL)
    assert code == 2 and out == ""
    assert err.strip().endswith("model qwen3-8b has no sliding layers; its layers: full")
    code, _, err = cli("run", "--layer", "full", "--impl", "bmm", *SMALL)
    assert code == 2 and "layer applies to model presets: give --model too" in err
    code, _, err = cli("run", "--model", "gpt-oss-20b", "--layer", "local", "--impl", "bmm", *SMALL)
    assert code == 2 and "'local' is not known; allowed: sliding, full, chunked" in err
    if not models.CHUNKED_MASK_BUILT:
        code, _, err = cli("run", "--model", "llama4-scout", "--layer", "chunked", "--impl", "bmm", *SMALL)
        assert code == 2 and "needs mask chunked (axis chunk)" in err and err.strip().endswith("allowed: full")


def test_an_unknown_model_lists_the_presets(cli, tmp_path):
    code, out, err = cli("run", "--model", "bogus", "--impl", "bmm", "--out", str(tmp_path / "run"))
    assert code == 2 and out == "" and not (tmp_path / "run").exists()
    message = err.strip().splitlines()[-1]
    assert "model 'bogus' is not known; known: " in message
    for name in ("deepseek-v3", "gpt-oss-20b", "gpt-oss-120b", "qwen3-8b", "qwen3-32b", "gemma3-27b", "llama4-scout"):
        assert name in message


def test_models_command_shows_the_new_columns(cli):
    code, out, _ = cli("models")
    assert code == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    # heads kv_heads head_dim Dv window chunk softcap sinks layout layers
    assert rows["deepseek-v3"] == ["128", "128", "192", "128", "-", "-", "-", "-", "latent", "full:61"]
    assert rows["gpt-oss-20b"] == ["64", "8", "64", "64", "128", "-", "-", "learned", "-", "sliding:12,full:12"]
    assert rows["gpt-oss-120b"] == ["64", "8", "64", "64", "128", "-", "-", "learned", "-", "sliding:18,full:18"]
    assert rows["qwen3-8b"] == ["32", "8", "128", "128", "-", "-", "-", "-", "-", "full:36"]
    assert rows["qwen3-32b"] == ["64", "8", "128", "128", "-", "-", "-", "-", "-", "full:64"]
    assert rows["gemma3-27b"] == ["32", "16", "128", "128", "1024", "-", "-", "-", "-", "sliding:52,full:10"]
    assert rows["llama4-scout"] == ["40", "8", "128", "128", "-", "8192", "-", "-", "-", "chunked:36,full:12"]
    assert "decode reads its latent cache (kv_layout latent): 128 heads, kv_heads 1, head_dim 576, Dv 512" in out
    assert "gpt-oss-20b: https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json" in out


def test_run_and_report_name_the_new_features_and_layers(cli, tmp_path):
    out = tmp_path / "run"
    impls = "bmm,fused_cpu,score_dot"  # score_dot takes none of the features: its rows say which it lacks
    code, _, _ = cli(
        "run",
        "--model",
        "gpt-oss-20b,deepseek-v3",
        "--phase",
        "decode",
        "--impl",
        impls,
        *SMALL,
        "--budget-s",
        "0.02",
        "--progress",
        "off",
        "--out",
        str(out),
    )
    assert code == 0
    frame = pd.read_parquet(out / "results.parquet")
    assert sorted(zip(frame["model"], frame["layer"], strict=True)) == sorted(
        [("deepseek-v3", "")] * 3 + [("gpt-oss-20b", "sliding")] * 3 + [("gpt-oss-20b", "full")] * 3
    )
    assert set(frame[frame["impl"] == "fused_cpu"]["status"]) <= set(CHECKED)
    assert (frame[~frame["status"].isin(CHECKED)]["reason"].str.len() > 0).all()  # unsupported says why
    code, _, _ = cli("report", str(out), "--out", str(tmp_path / "report"))
    assert code == 0
    html = (tmp_path / "report" / "report.html").read_text()
    assert "sinks learned" in html and "head_dim_v 512 (≠ head_dim)" in html  # score_dot's reasons
    assert "[gpt-oss-20b sliding]" in html and "[gpt-oss-20b full]" in html


def test_a_decode_phase_alone_starts_from_the_one_case_as_its_kv_length():
    """`attnbench profile --model llama3.1-8b --phase decode` (and `ab`, attnbench.run() without a suite) failed:
    "--seq 1024 is not a decode step", though no --seq was given — the one case's 1024 tokens were taken as the
    step's queries. They are its keys now; what the command gives still decides, and a --seq it gives is refused."""
    from attnbench.errors import UsageError
    from attnbench.workload.suite import expand, profile_suite

    def plan(**given):
        flags = {"impl": "bmm", "model": "llama3.1-8b", "phase": "decode", **given}
        return [w for _, w in expand(profile_suite(), axes.parse_overrides(flags), ["bmm"])]

    (step,) = plan()
    assert (step.seq_q, step.seq_k, step.batch, step.mask) == (1, 1024, 1, "causal_bottom_right")
    assert [(w.seq_q, w.seq_k, w.batch) for w in plan(seq_kv="256,512", batch="2")] == [(1, 256, 2), (1, 512, 2)]
    assert {w.seq_q for w in plan(seq="4")} == {4}  # a --seq given is the step's queries
    with pytest.raises(UsageError, match="--seq 1024 is not a decode step"):
        plan(seq="1024")
    both = expand(profile_suite(), axes.parse_overrides({"impl": "bmm", "model": "llama3.1-8b"}), ["bmm"])
    assert {w.seq_q for _, w in both} == {1, 1024}  # prefill beside decode: as before
