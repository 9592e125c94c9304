"""``sdpa_math`` — torch SDPA's math backend, forced alone with sdpa_kernel (no fallback)."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_math",
    "MATH",
    devices=frozenset({"cpu", "cuda"}),
    description="SDPA math backend (reference composite of aten ops); GQA by enable_gqa (torch repeats k and v inside)",
)
