"""``sdpa_efficient`` — SDPA memory-efficient backend (xformers-derived CUTLASS kernel), forced with sdpa_kernel so no other backend can stand in."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_efficient",
    "EFFICIENT_ATTENTION",
    devices=frozenset({"cuda"}),
    description="SDPA memory-efficient backend (xformers-derived CUTLASS kernel)",
)
