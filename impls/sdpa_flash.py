"""``sdpa_flash`` — SDPA flash backend (FlashAttention-2 on CUDA, the fused flash kernel on CPU), forced with sdpa_kernel so no other backend can stand in."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_flash",
    "FLASH_ATTENTION",
    devices=frozenset({"cpu","cuda"}),
    description="SDPA flash backend (FlashAttention-2 on CUDA, the fused flash kernel on CPU)",
)
