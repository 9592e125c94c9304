"""Model presets: the attention shapes of real LLMs, and the prefill and decode sweeps built from them.

A preset is the attention of one layer: query heads, key/value heads (GQA), head dim, and — where the
model has them — its sliding window and its logit softcap (a preset with a window runs its
sliding-window layers: Mistral's all, Gemma-2's local ones). ``attnbench run --model NAME --phase …``
turns presets into cases (:func:`phase_axes`):

* ``prefill`` — the prompt: causal self-attention (or the preset's sliding window), S 512–8192, batch 1.
  Given ``--seq-kv``, the prompt chunk attends to a longer cache: bottom-right causal.
* ``decode`` — one generation step: Sq = 1 (up to 16 for speculative decoding) against a KV cache of
  1k–32k tokens, bottom-right causal (or the window), batch 1–64.
* ``mixed`` — one batch of prefill chunks and decode steps, as chunked prefill schedules it (vLLM's mixed
  batch specs, e.g. ``2q2k_32q1kv1k``): batch 8, half of it (``--decode-share``) decode steps, the others
  512-token chunks, every cache 4096 tokens (or drawn by ``--lengths``); mask ``mixed``, bottom-right causal
  within each sequence. A preset's sliding window is not applied: the phase measures its full-attention layers.

``--seq``, ``--seq-kv`` and ``--batch`` replace the phase's values; the rows carry the preset's name in
the ``model`` column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnbench.errors import UsageError


@dataclass(frozen=True)
class ModelConfig:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    window: int = 0  # sliding window (0: none)
    softcap: float = 0.0  # attention logit softcap (0: none)


PRESETS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig("llama3.1-8b", 32, 8, 128),
        ModelConfig("llama3.1-70b", 64, 8, 128),
        ModelConfig("llama3.1-405b", 128, 8, 128),
        ModelConfig("llama3.2-1b", 32, 8, 64),
        ModelConfig("llama3.2-3b", 24, 8, 128),
        ModelConfig("mistral-7b", 32, 8, 128, window=4096),
        ModelConfig("gemma2-9b", 16, 8, 256, window=4096, softcap=50.0),
        ModelConfig("qwen2.5-7b", 28, 4, 128),
        ModelConfig("gpt2", 12, 12, 64),
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


def get_model(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise UsageError(f"model {name!r} is not known; known: {', '.join(PRESETS)} (see `attnbench models`)")
    return PRESETS[name]


def check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise UsageError(f"phase {phase!r} is not known; allowed: {', '.join(PHASES)}")


def phase_axes(name: str, phase: str, given: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Suite axes for one preset and phase. ``given`` holds the sweep's explicit axes; its seq, seq_kv and
    batch replace the phase's, everything the preset defines (heads, kv_heads, head_dim, mask, window,
    score_mod, softcap) replaces the sweep's."""
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
    axes.update(
        heads=[model.heads], kv_heads=[model.kv_heads], head_dim=[model.head_dim],
        mask=["sliding_window" if model.window and phase != "mixed" else mask], window=[model.window or 1],
        score_mod=["softcap" if model.softcap else "none"], softcap=[model.softcap or 50.0], model=[model.name],
    )  # fmt: skip
    return axes


def describe() -> str:
    """The presets as a table: name, heads, kv_heads, head_dim, window, softcap."""
    lines = [f"{'name':<14} {'heads':>5} {'kv_heads':>8} {'head_dim':>8} {'window':>6} {'softcap':>7}"]
    for m in PRESETS.values():
        window, softcap = m.window or "-", f"{m.softcap:g}" if m.softcap else "-"
        lines.append(f"{m.name:<14} {m.heads:>5} {m.kv_heads:>8} {m.head_dim:>8} {window!s:>6} {softcap:>7}")
    return "\n".join(lines)
