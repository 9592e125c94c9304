"""``sdpa_efficient`` — torch SDPA's memory-efficient backend, forced alone with sdpa_kernel (no fallback)."""

from attnbench.impls._sdpa import SdpaBackend

contender = SdpaBackend(
    "sdpa_efficient",
    "EFFICIENT_ATTENTION",
    devices=frozenset({"cuda"}),
    description="SDPA memory-efficient backend (xformers-derived CUTLASS kernel); bottom-right causal by "
    "causal_lower_right; GQA: k and v repeated to the query heads where torch refuses enable_gqa (up to 2.11), "
    "a copy of G× the cache (a view for MQA) made before timing for a contiguous forward",
)
