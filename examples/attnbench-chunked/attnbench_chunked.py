"""An attnbench contender from a third-party package: attention over query chunks (bounded memory)."""

import torch

from attnbench import Capabilities, Contender

CHUNK = 256  # query rows per step: scores take (B, H, CHUNK, Sk) memory instead of (B, H, Sq, Sk)


class ChunkedAttention(Contender):
    name = "chunked"
    description = "matmul attention over query chunks of 256 rows"
    capabilities = Capabilities(masks=frozenset({"none", "causal"}), gqa=False)

    def prepare(self, inputs, workload):
        # Everything but the arithmetic happens here, outside the timed callable.
        q, k_t, v, scale = inputs.q, inputs.k.transpose(-1, -2), inputs.v, inputs.scale
        starts = range(0, workload.seq_q, CHUNK)
        hidden = [None] * len(starts)  # per chunk: True where a key is masked out
        if workload.mask == "causal":
            keys = torch.arange(workload.seq_k, device=q.device)
            for n, start in enumerate(starts):
                rows = torch.arange(start, min(start + CHUNK, workload.seq_q), device=q.device)
                hidden[n] = keys[None, :] > rows[:, None]

        def run():
            out = torch.empty_like(q)
            for start, masked in zip(starts, hidden, strict=True):
                scores = q[:, :, start : start + CHUNK] @ k_t * scale  # (B, H, chunk, Sk)
                if masked is not None:
                    scores = scores.masked_fill(masked, float("-inf"))
                out[:, :, start : start + CHUNK] = scores.softmax(dim=-1) @ v
            return out

        return run


contender = ChunkedAttention()
