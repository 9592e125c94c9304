"""``torch_mha`` — torch.nn.MultiheadAttention with the mha module's weights: the whole-module baseline
that every core swapped into attnbench's mha module is compared against (suites/mha.toml)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.contenders.contract import Capabilities, Contender
from attnbench.workload import Workload
from attnbench.workload.inputs import AttentionInputs
from attnbench.workload.mha import module_inputs


class TorchMultiheadAttention(Contender):
    name = "torch_mha"
    description = "torch.nn.MultiheadAttention (batch_first, eval, need_weights=False) with the same weights"
    kind = "module"
    capabilities = Capabilities(masks=frozenset({"none", "causal", "causal_bottom_right", "padding"}))

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        w = workload
        m = module_inputs(inputs)
        p = m.weights
        module = torch.nn.MultiheadAttention(w.d_model, w.heads, batch_first=True, device=w.device, dtype=w.torch_dtype)
        with torch.no_grad():  # nn.Linear computes x @ weightᵀ; our weights are applied as x @ w
            module.in_proj_weight.copy_(torch.cat([p["w_q"].T, p["w_k"].T, p["w_v"].T]))
            module.in_proj_bias.copy_(torch.cat([p["b_q"], p["b_k"], p["b_v"]]))
            module.out_proj.weight.copy_(p["w_o"].T)
            module.out_proj.bias.copy_(p["b_o"])
        module.eval()
        attn_mask = key_padding_mask = None
        if w.mask == "padding":
            assert inputs.bool_mask is not None
            key_padding_mask = ~inputs.bool_mask[:, 0, 0, :]  # (B, Sk), True = padding (torch's convention)
        elif w.mask != "none":
            assert inputs.bool_mask is not None
            attn_mask = ~inputs.bool_mask[0, 0]  # (Sq, Sk), True = not allowed (torch's convention)
        x_q, x_kv = m.x_q, m.x_kv

        def run() -> torch.Tensor:
            with torch.no_grad():
                out, _ = module(
                    x_q, x_kv, x_kv, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False
                )
            return out

        return run


contender = TorchMultiheadAttention()
