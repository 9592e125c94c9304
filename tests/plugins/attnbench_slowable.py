"""A test plugin whose speed is a setting: ``slowable``, ``steady`` and ``steady_too``, for the history tests.

Both compute SDPA (so their output passes the correctness gate) and then hold the call:

* ``ATTNBENCH_SLOWABLE_SLEEP_MS`` set: each call also sleeps that many milliseconds — slowable's sleep is
  multiplied by ``ATTNBENCH_SLOWABLE_FACTOR``. A sleep hardly depends on how loaded the CPU is, so a
  shared machine still shows the step cleanly.
* unset: slowable busy-waits until the call has taken FACTOR × its compute time (CPU work, as a kernel
  made slower would be); steady returns at once.

Registered through the entry-point group ``attnbench.impls`` by a ``.dist-info`` folder the tests write
next to this file's copy (see tests/test_history.py).
"""

import os
import time

import torch

from attnbench import Capabilities, Contender


class Holding(Contender):
    capabilities = Capabilities(masks=frozenset({"none", "causal"}))

    def __init__(self, name: str, slowed: bool) -> None:
        self.name = name
        self.slowed = slowed
        self.description = "SDPA, then held FACTOR× longer (test plugin)" if slowed else "SDPA (test plugin)"

    def prepare(self, inputs, workload):
        q, k, v, scale = inputs.q, inputs.k, inputs.v, inputs.scale
        causal = workload.mask == "causal"
        factor = float(os.environ.get("ATTNBENCH_SLOWABLE_FACTOR", "1")) if self.slowed else 1.0
        sleep_ms = os.environ.get("ATTNBENCH_SLOWABLE_SLEEP_MS")

        def attention():
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=True
            )

        if sleep_ms is not None:
            hold_s = float(sleep_ms) * factor / 1000

            def run():
                out = attention()
                time.sleep(hold_s)
                return out

            return run

        def run_busy():
            start = time.perf_counter()
            out = attention()
            until = start + factor * (time.perf_counter() - start)
            while time.perf_counter() < until:
                pass
            return out

        return run_busy


slowable = Holding("slowable", slowed=True)
steady = Holding("steady", slowed=False)
steady_too = Holding("steady_too", slowed=False)  # a third series: the machine's drift is estimated from ≥ 3
