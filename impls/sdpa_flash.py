"""``sdpa_flash`` — torch SDPA's flash backend, forced alone with sdpa_kernel (no fallback)."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_flash",
    "FLASH_ATTENTION",
    devices=frozenset({"cpu", "cuda"}),
    description="SDPA flash backend (FlashAttention-2 on CUDA, the fused flash kernel on CPU); GQA by enable_gqa "
    "(no copy), bottom-right causal by causal_lower_right",
)
