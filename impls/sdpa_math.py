"""``sdpa_math`` — SDPA math backend (reference composite of aten ops), forced with sdpa_kernel so no other backend can stand in."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_math",
    "MATH",
    devices=frozenset({"cpu","cuda"}),
    description="SDPA math backend (reference composite of aten ops)",
)
