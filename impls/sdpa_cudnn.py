"""``sdpa_cudnn`` — SDPA cuDNN backend, forced with sdpa_kernel so no other backend can stand in."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_cudnn",
    "CUDNN_ATTENTION",
    devices=frozenset({"cuda"}),
    description="SDPA cuDNN backend",
)
