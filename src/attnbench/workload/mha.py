"""The multi-head attention module around a swappable core (the `mha` suite; workload module "mha").

The module, as the source documents describe it: project the query input and the key/value input with
W_q, W_k, W_v (d_model × d_model, with biases), split d_model into heads, run the attention core, merge
the heads and project back with W_o. With seq_q == seq_k it is self-attention (one input x), otherwise
cross-attention (x_q and x_kv). Any attention contender can be the core: the projections write into the
(B, H, S, D) buffers the core was prepared on, so the core reads them at call time. ``torch_mha``
(torch.nn.MultiheadAttention with the same weights) is the whole-module baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.workload.check import TOLERANCES, CheckResult, compare
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.reference import reference_attention


@dataclass(frozen=True)
class ModuleInputs:
    x_q: torch.Tensor  # (B, Sq, E)
    x_kv: torch.Tensor  # (B, Sk, E); the same tensor as x_q for self-attention
    weights: dict[str, torch.Tensor]  # w_q, w_k, w_v, w_o: (E, E), applied as x @ w; b_q, b_k, b_v, b_o: (E,)


def module_inputs(inputs: AttentionInputs) -> ModuleInputs:
    """Seeded inputs and weights of the mha module (shared by every core and by the reference)."""
    w = inputs.workload
    e = w.d_model
    x_q = inputs.parameter("mha_x_q", w.batch, w.seq_q, e)
    x_kv = x_q if w.seq_q == w.seq_k else inputs.parameter("mha_x_kv", w.batch, w.seq_k, e)
    weights = {f"w_{n}": inputs.parameter(f"mha_w_{n}", e, e, std=1 / math.sqrt(e)) for n in "qkvo"}
    weights.update({f"b_{n}": inputs.parameter(f"mha_b_{n}", e, std=0.1) for n in "qkvo"})
    return ModuleInputs(x_q, x_kv, weights)


def wrap_core(core: Callable[[], torch.Tensor], inputs: AttentionInputs) -> Callable[[], torch.Tensor]:
    """The module's forward with ``core`` (prepared on inputs.q, k, v) as its attention."""
    w = inputs.workload
    m = module_inputs(inputs)
    p = m.weights
    q_buffer, k_buffer, v_buffer = inputs.q.detach(), inputs.k.detach(), inputs.v.detach()

    def split(x: torch.Tensor) -> torch.Tensor:  # (B, S, E) -> (B, H, S, D)
        return x.view(x.shape[0], x.shape[1], w.heads, w.head_dim).transpose(1, 2)

    def run() -> torch.Tensor:
        q_buffer.copy_(split(torch.addmm(p["b_q"], m.x_q.flatten(0, 1), p["w_q"]).view_as(m.x_q)))
        k_buffer.copy_(split(torch.addmm(p["b_k"], m.x_kv.flatten(0, 1), p["w_k"]).view_as(m.x_kv)))
        v_buffer.copy_(split(torch.addmm(p["b_v"], m.x_kv.flatten(0, 1), p["w_v"]).view_as(m.x_kv)))
        merged = core().transpose(1, 2).reshape(w.batch * w.seq_q, w.d_model)  # (B·Sq, E)
        return torch.addmm(p["b_o"], merged, p["w_o"]).view(w.batch, w.seq_q, w.d_model)

    return run


def reference_module_output(inputs: AttentionInputs) -> torch.Tensor:
    """The module in float64: (B, Sq, E)."""
    w = inputs.workload
    m = module_inputs(inputs)
    p = {name: t.double() for name, t in m.weights.items()}
    x_q, x_kv = m.x_q.double(), m.x_kv.double()

    def heads(x: torch.Tensor, name: str) -> torch.Tensor:
        projected = torch.einsum("bse,ef->bsf", x, p[f"w_{name}"]) + p[f"b_{name}"]
        return projected.view(x.shape[0], x.shape[1], w.heads, w.head_dim).permute(0, 2, 1, 3)

    rows = torch.arange(w.seq_q, device=x_q.device)
    core = reference_attention(inputs, heads(x_q, "q"), heads(x_kv, "k"), heads(x_kv, "v"), rows)  # (B, H, Sq, D)
    merged = core.permute(0, 2, 1, 3).reshape(w.batch, w.seq_q, w.d_model)
    return torch.einsum("bse,ef->bsf", merged, p["w_o"]) + p["b_o"]


def check_module_output(inputs: AttentionInputs, output: object) -> CheckResult:
    w = inputs.workload
    atol, rtol = TOLERANCES[w.dtype]
    return compare(output, reference_module_output(inputs), (w.batch, w.seq_q, w.d_model), atol, rtol, w.seq_q)
