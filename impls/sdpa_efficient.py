"""``sdpa_efficient`` — torch SDPA's memory-efficient backend, forced alone with sdpa_kernel (no fallback)."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_efficient",
    "EFFICIENT_ATTENTION",
    devices=frozenset({"cuda"}),
    description="SDPA memory-efficient backend (xformers-derived CUTLASS kernel)",
)
