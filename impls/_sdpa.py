"""torch.nn.functional.scaled_dot_product_attention forced to one backend.

Each backend is its own contender (sdpa_math.py, sdpa_flash.py, …) so that a silent fallback cannot
masquerade as another: the call runs under ``sdpa_kernel([backend])`` alone, and when that backend has
no kernel for the workload torch raises, which we report as ``unsupported`` with torch's own warnings
as the reason.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attnbench.contender import Capabilities, Contender, Unsupported, score_matrix_bytes
from attnbench.inputs import AttentionInputs
from attnbench.workload import Workload

_NO_KERNEL = re.compile(r"No available kernel|No viable backend", re.IGNORECASE)


def _backend(member: str) -> Any:
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, member)


class SdpaBackend(Contender):
    """One SDPA backend. ``member`` is the torch.nn.attention.SDPBackend name."""

    def __init__(self, name: str, member: str, devices: frozenset[str], description: str) -> None:
        self.name = name
        self.member = member
        self.description = description
        self.capabilities = Capabilities(devices=devices, backward=True)

    def availability(self) -> str | None:
        try:
            _backend(self.member)
        except (ImportError, AttributeError):
            return f"torch {torch.__version__} has no SDPBackend.{self.member}"
        if self.capabilities.devices == frozenset({"cuda"}) and not torch.cuda.is_available():
            return f"SDPA {self.member} is a CUDA-only backend and torch.cuda.is_available() is False"
        return None

    def predicted_extra_bytes(self, workload: Workload) -> float:
        if self.member != "MATH":
            return super().predicted_extra_bytes(workload)
        # The math backend materialises scores, probabilities and a masked copy, in at least fp32.
        return score_matrix_bytes(workload, 3, element=max(4, workload.torch_dtype.itemsize))

    def prepare(self, inputs: AttentionInputs, workload: Workload) -> Callable[[], torch.Tensor]:
        from torch.nn.attention import sdpa_kernel

        backend = _backend(self.member)
        kwargs: dict[str, Any] = {"scale": inputs.scale}
        if workload.mask == "causal":
            kwargs["is_causal"] = True  # top-left, which is torch's definition
        elif workload.mask != "none":
            kwargs["attn_mask"] = inputs.bool_mask  # (B|1, 1, Sq, Sk) bool, True = visible
        if workload.kv_heads != workload.heads:
            kwargs["enable_gqa"] = True
        q, k, v = inputs.q, inputs.k, inputs.v

        def run() -> torch.Tensor:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)

        _probe(run)
        return run


def _probe(run: Callable[[], torch.Tensor]) -> None:
    """Call once so 'no kernel for this backend' surfaces as Unsupported with torch's reasons."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except RuntimeError as exc:
            if not _NO_KERNEL.search(str(exc)):
                raise
            why = "; ".join(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in caught))
            raise Unsupported(f"no kernel for this workload: {why or str(exc).splitlines()[0]}") from None
