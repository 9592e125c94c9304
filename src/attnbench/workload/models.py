"""Model presets: the attention shapes of real LLMs, and the prefill and decode sweeps built from them.

A preset is the attention of one model's layers, from its published config (cited beside each): query
heads, key/value heads (GQA), head dim, value head dim where it differs (DeepSeek's MLA), and — where the
model has them — its sliding window, its logit softcap, its learned attention sinks (gpt-oss) and its
attention chunk (Llama 4). A model whose layers are of two kinds (gpt-oss, Gemma-2 and Gemma-3: sliding and
full; Llama 4: chunked and full) runs each kind as its own case, named in the ``layer`` column (``sliding``,
``full``, ``chunked``; "" for a preset whose layers are all alike: Mistral's are all sliding). ``--layer``
picks kinds. DeepSeek-V3 prefills with its 128 heads expanded
(head dim 192 for keys, 128 for values) and decodes from its latent cache, as FlashMLA does: one cache
tensor of 512 + 64 channels shared by all heads (``kv_layout`` latent, kv_heads 1). ``attnbench run
--model NAME --phase …`` turns presets into cases (:func:`preset_axes`):

* ``prefill`` — the prompt: causal self-attention (or the layer's window or chunk), S 512–8192, batch 1.
  Given ``--seq-kv``, the prompt chunk attends to a longer cache: bottom-right causal.
* ``decode`` — one generation step: Sq = 1 (up to 16 for speculative decoding) against a KV cache of
  1k–32k tokens, bottom-right causal (or the window), batch 1–64.
* ``mixed`` — one batch of prefill chunks and decode steps, as chunked prefill schedules it (vLLM's mixed
  batch specs, e.g. ``2q2k_32q1kv1k``): batch 8, half of it (``--decode-share``) decode steps, the others
  512-token chunks, every cache 4096 tokens (or drawn by ``--lengths``); mask ``mixed``, bottom-right causal
  within each sequence. A preset's sliding window is not applied: the phase measures its full-attention layers.

On CUDA a preset runs in its dtype (bfloat16, :func:`preset_dtype`) unless ``--dtype`` or the suite names
one; on CPU in float32, as every sweep without a dtype. ``--seq``, ``--seq-kv`` and ``--batch`` replace the
phase's values; the rows carry the preset's name in
the ``model`` column. One command that runs prefill beside decode or mixed sizes each phase by its own
flag: ``--seq`` the prompt (decode keeps its one query token), ``--seq-kv`` the decode cache (prefill keeps
its keys = its queries, causal), so ``--phase prefill,decode --seq 2048 --seq-kv 8192`` is a 2048-token
prompt and a step over 8192 cached tokens — not a 2048-row prompt against 8192 keys, nor a refused
"decode step" of 2048 tokens. The softmax scale stays 1/sqrt(head_dim) (Gemma-3's 1/sqrt(168) and DeepSeek's
YaRN-scaled one have no flag; the scale does not change the work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.errors import UsageError

LAYER_KINDS = ("sliding", "full", "chunked")  # the kinds of attention layer a preset may have
# Llama 4's chunked layers need mask `chunked` (its axis `chunk`), which axes.MASKS has: --model runs them.
CHUNKED_MASK_BUILT = True


@dataclass(frozen=True)
class ModelConfig:
    """One model's attention. From a Hugging Face config.json: heads = num_attention_heads, kv_heads =
    num_key_value_heads, head_dim = head_dim (DeepSeek: qk_nope_head_dim + qk_rope_head_dim), head_dim_v =
    v_head_dim, window = sliding_window, chunk = attention_chunk_size, layers = layer_types counted, latent
    = (kv_lora_rank, qk_rope_head_dim)."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    window: int = 0  # the sliding layers' window (0: none)
    softcap: float = 0.0  # attention logit softcap (0: none)
    head_dim_v: int = 0  # value (and output) head dim; 0: head_dim
    sinks: str = "none"  # learned: one sink logit per query head joins each softmax denominator (gpt-oss)
    chunk: int = 0  # the chunked layers' chunk: a query sees its own chunk's keys up to itself (0: none)
    layers: tuple[tuple[str, int], ...] = ()  # (kind, how many) for a model with two kinds of layers
    num_layers: int = 0  # num_hidden_layers of a model whose layers are all of its one kind (0: not given)
    latent: tuple[int, int] = (0, 0)  # MLA (kv_lora_rank, qk_rope_head_dim): decode reads one latent cache
    source: str = ""  # the published config the numbers come from
    # What its cases run in on CUDA when neither --dtype nor the suite names one (preset_dtype): the half
    # precision these models are trained and served in — gpt2's float32 checkpoint too, as servers cast it;
    # float32 there would leave flash and cuDNN (no float32 kernel) out of every row.
    dtype: str = "bfloat16"

    @property
    def kinds(self) -> tuple[str, ...]:
        """Its kinds of layers: those of ``layers``, else the one kind all its layers are."""
        if self.layers:
            return tuple(kind for kind, _ in self.layers)
        return ("sliding",) if self.window else ("full",)

    def shape(self, phase: str, kind: str, full_mask: str) -> dict[str, Any]:
        """The axes the preset sets for one kind of its layers in a phase (the keys of ``PRESET_AXES``);
        its full layers take ``full_mask``, the phase's causal mask."""
        heads, kv_heads, head_dim, head_dim_v, kv_layout = (
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.head_dim_v or self.head_dim,
            "separate",
        )
        if phase == "decode" and self.latent[0]:  # MLA absorbed decode: every head reads the one latent cache
            rank, rope = self.latent
            kv_heads, head_dim, head_dim_v, kv_layout = 1, rank + rope, rank, "latent"
        return dict(
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            head_dim_v=head_dim_v,
            kv_layout=kv_layout,
            mask={"sliding": "sliding_window", "chunked": "chunked"}.get(kind, full_mask),
            window=self.window or 1,
            chunk=self.chunk or 1,  # 1: a placeholder the other masks drop
            score_mod="softcap" if self.softcap else "none",
            softcap=self.softcap or 50.0,
            sinks=self.sinks,
            model=self.name,
            layer=kind if len(self.kinds) > 1 else "",
        )


PRESET_AXES = (
    "heads",
    "kv_heads",
    "head_dim",
    "head_dim_v",
    "kv_layout",
    "mask",
    "window",
    "chunk",
    "score_mod",
    "softcap",
    "sinks",
    "model",
    "layer",
)
_HF = "https://huggingface.co/{}/blob/main/config.json"
PRESETS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig("llama3.1-8b", 32, 8, 128, num_layers=32),
        ModelConfig("llama3.1-70b", 64, 8, 128, num_layers=80),
        ModelConfig("llama3.1-405b", 128, 8, 128, num_layers=126),
        ModelConfig("llama3.2-1b", 32, 8, 64, num_layers=16),
        ModelConfig("llama3.2-3b", 24, 8, 128, num_layers=28),
        ModelConfig("mistral-7b", 32, 8, 128, window=4096, num_layers=32),
        # num_attention_heads 16, num_key_value_heads 8, head_dim 256, sliding_window 4096, attn_logit_softcapping
        # 50 on every layer; local (sliding) and global layers alternate over num_hidden_layers 42
        ModelConfig(
            "gemma2-9b",
            16,
            8,
            256,
            window=4096,
            softcap=50.0,
            layers=(("sliding", 21), ("full", 21)),
            source=_HF.format("google/gemma-2-9b"),
        ),
        ModelConfig("qwen2.5-7b", 28, 4, 128, num_layers=28),
        ModelConfig("gpt2", 12, 12, 64, num_layers=12),
        # num_attention_heads 128, num_key_value_heads 128, qk_nope_head_dim 128 + qk_rope_head_dim 64,
        # v_head_dim 128, kv_lora_rank 512 (61 layers, all MLA)
        ModelConfig(
            "deepseek-v3",
            128,
            128,
            192,
            head_dim_v=128,
            latent=(512, 64),
            num_layers=61,
            source=_HF.format("deepseek-ai/DeepSeek-V3"),
        ),
        # num_attention_heads 64, num_key_value_heads 8, head_dim 64, sliding_window 128, layer_types
        # sliding_attention / full_attention alternating over num_hidden_layers 24; every layer has `sinks`
        ModelConfig(
            "gpt-oss-20b",
            64,
            8,
            64,
            window=128,
            sinks="learned",
            layers=(("sliding", 12), ("full", 12)),
            source=_HF.format("openai/gpt-oss-20b"),
        ),
        # as gpt-oss-20b over num_hidden_layers 36
        ModelConfig(
            "gpt-oss-120b",
            64,
            8,
            64,
            window=128,
            sinks="learned",
            layers=(("sliding", 18), ("full", 18)),
            source=_HF.format("openai/gpt-oss-120b"),
        ),
        # num_attention_heads 32, num_key_value_heads 8, head_dim 128, use_sliding_window false (36 layers)
        ModelConfig("qwen3-8b", 32, 8, 128, num_layers=36, source=_HF.format("Qwen/Qwen3-8B")),
        # num_attention_heads 64, num_key_value_heads 8, head_dim 128, use_sliding_window false (64 layers)
        ModelConfig("qwen3-32b", 64, 8, 128, num_layers=64, source=_HF.format("Qwen/Qwen3-32B")),
        # text_config: num_attention_heads 32, num_key_value_heads 16, head_dim 128, sliding_window 1024,
        # sliding_window_pattern 6 (five local layers, then a global one) over num_hidden_layers 62; no softcap
        ModelConfig(
            "gemma3-27b",
            32,
            16,
            128,
            window=1024,
            layers=(("sliding", 52), ("full", 10)),
            source=_HF.format("google/gemma-3-27b-it"),
        ),
        # text_config: num_attention_heads 40, num_key_value_heads 8, head_dim 128, attention_chunk_size 8192;
        # every 4th of num_hidden_layers 48 is a NoPE layer attending to all keys, the others chunked
        ModelConfig(
            "llama4-scout",
            40,
            8,
            128,
            chunk=8192,
            layers=(("chunked", 36), ("full", 12)),
            source=_HF.format("meta-llama/Llama-4-Scout-17B-16E"),
        ),
    )
}
PHASES = ("prefill", "decode", "mixed")
DEFAULT_PHASES = ("prefill", "decode")  # what --model runs without --phase
PHASE_DEFAULTS: dict[str, dict[str, list[int]]] = {
    "prefill": {"seq": [512, 1024, 2048, 4096, 8192], "batch": [1]},
    "decode": {"seq": [1], "seq_kv": [1024, 2048, 4096, 8192, 16384, 32768], "batch": [1, 8, 64]},
    "mixed": {"seq": [512], "seq_kv": [4096], "batch": [8]},  # seq: the prefill chunk
}
MAX_DECODE_QUERY = 16  # decode: one token, or a few for speculative decoding


def preset_dtype(name: str, device: str) -> str | None:
    """The dtype a preset's cases take on ``device`` when neither ``--dtype`` nor the suite names one: the
    model's own on CUDA (``ModelConfig.dtype``); None elsewhere, where a sweep's default (float32) holds — the
    CPU's numbers (docs/features.md, models-cpu) are float32, and --dtype bfloat16 asks for its bf16 kernels."""
    return get_model(name).dtype if device == "cuda" else None


def get_model(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise UsageError(f"model {name!r} is not known; known: {', '.join(PRESETS)} (see `attnbench models`)")
    return PRESETS[name]


def check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise UsageError(f"phase {phase!r} is not known; allowed: {', '.join(PHASES)}")


def preset_axes(
    name: str, phase: str, given: dict[str, list[Any]], phases: tuple[str, ...] | list[str] = ()
) -> list[dict[str, list[Any]]]:
    """Suite axes for one preset and phase: one sweep per kind of its layers (those ``given["layer"]``
    names, when it does). ``phases``: every phase of the command, which decides what ``--seq`` and
    ``--seq-kv`` size (:func:`own_sizes`)."""
    kinds = layer_kinds(get_model(name), given.get("layer"))
    if phase == "mixed":  # one mask for the batch: the full layers (a model without them: its one kind, unwindowed)
        kinds = [kind for kind in kinds if kind == "full"] or kinds[:1]
    given = own_sizes(phase, given, phases or (phase,))
    return [phase_axes(name, phase, given, kind) for kind in kinds]


def own_sizes(phase: str, given: dict[str, list[Any]], phases: tuple[str, ...] | list[str]) -> dict[str, list[Any]]:
    """The axes one phase takes from the command's, when the command runs several: prefill leaves ``--seq-kv``
    to the decode or mixed phase beside it (its keys are its queries), and decode leaves ``--seq`` to the
    prefill beside it (its query is one token). Alone, a phase takes both."""
    if phase == "prefill" and {"decode", "mixed"} & set(phases):
        return {axis: values for axis, values in given.items() if axis != "seq_kv"}
    if phase == "decode" and "prefill" in phases:
        return {axis: values for axis, values in given.items() if axis != "seq"}
    return given


def layer_kinds(model: ModelConfig, wanted: list[str] | None = None) -> list[str]:
    """The preset's kinds of layers a sweep runs: all of them, or those ``wanted`` (--layer) names."""
    built = [kind for kind in model.kinds if kind != "chunked" or CHUNKED_MASK_BUILT]
    if not wanted:
        return built
    chosen = [kind for kind in model.kinds if kind in wanted]
    if not chosen:
        raise UsageError(
            f"model {model.name} has no {' or '.join(wanted)} layers; its layers: {', '.join(model.kinds)}"
        )
    if any(kind not in built for kind in chosen):
        raise UsageError(
            f"layer chunked of {model.name} needs mask chunked (axis chunk), which this attnbench does not have "
            f"yet; allowed: {', '.join(built)}"
        )
    return chosen


def phase_axes(name: str, phase: str, given: dict[str, list[Any]], kind: str = "") -> dict[str, list[Any]]:
    """Suite axes for one preset, phase and kind of layer (default: its first). ``given`` holds the sweep's
    explicit axes; its seq, seq_kv and batch replace the phase's, everything the preset defines (heads,
    head dims, mask, window, chunk, score_mod, softcap, sinks, kv_layout: ``PRESET_AXES``) replaces the
    sweep's."""
    model = get_model(name)
    check_phase(phase)
    axes = {**given}
    for axis, values in PHASE_DEFAULTS[phase].items():
        axes[axis] = given.get(axis) or values
    if phase == "decode":
        long_queries = [s for s in axes["seq"] if s > MAX_DECODE_QUERY]
        if long_queries:
            raise UsageError(
                f"phase decode: --seq {long_queries[0]} is not a decode step; allowed: 1 to {MAX_DECODE_QUERY} "
                "query tokens (use phase prefill for longer ones)"
            )
        mask = "causal_bottom_right"
    elif phase == "mixed":
        mask = "mixed"
    else:
        mask = "causal_bottom_right" if given.get("seq_kv") else "causal"
        if not given.get("seq_kv"):
            axes.pop("seq_kv", None)
    axes.update({axis: [value] for axis, value in model.shape(phase, kind or model.kinds[0], mask).items()})
    if phase == "mixed":  # bottom-right causal within each sequence, whatever the layer's window or chunk
        axes["mask"] = ["mixed"]
    return axes


def describe() -> str:
    """The presets as a table: heads, kv_heads, head_dim, Dv, window, chunk, softcap, sinks, the KV layout
    of decode and the layers' kinds (and how many of each); then where the new presets' numbers come from."""
    header = ("name", "heads", "kv_heads", "head_dim", "Dv", "window", "chunk", "softcap", "sinks", "layout", "layers")
    rows = [header]
    for m in PRESETS.values():
        counted = m.layers or (((m.kinds[0], m.num_layers),) if m.num_layers else ())
        layers = ",".join(f"{kind}:{count}" for kind, count in counted) or "-"
        rows.append(
            (
                m.name,
                str(m.heads),
                str(m.kv_heads),
                str(m.head_dim),
                str(m.head_dim_v or m.head_dim),
                str(m.window or "-"),
                str(m.chunk or "-"),
                f"{m.softcap:g}" if m.softcap else "-",
                m.sinks if m.sinks != "none" else "-",
                "latent" if m.latent[0] else "-",
                layers,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        " ".join([row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))])
        for row in rows
    ]
    for m in PRESETS.values():
        if m.latent[0]:
            rank, rope = m.latent
            lines.append(
                f"{m.name}: prefill as above; decode reads its latent cache (kv_layout latent): "
                f"{m.heads} heads, kv_heads 1, head_dim {rank + rope}, Dv {rank}"
            )
    dtypes = sorted({m.dtype for m in PRESETS.values()})
    lines.append(f"dtype: {', '.join(dtypes)} on cuda unless --dtype says otherwise; float32 on cpu")
    lines += [f"{m.name}: {m.source}" for m in PRESETS.values() if m.source]
    return "\n".join(line.rstrip() for line in lines)
