"""``sdpa_cudnn`` — torch SDPA's cuDNN backend, forced alone with sdpa_kernel (no fallback)."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_cudnn",
    "CUDNN_ATTENTION",
    devices=frozenset({"cuda"}),
    description="SDPA cuDNN backend; GQA by enable_gqa (no copy), bottom-right causal as a boolean mask",
)
