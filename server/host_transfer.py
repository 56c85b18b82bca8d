"""Device -> host transfers of an engine step, all through here so they can be counted.

On CUDA each one waits for every kernel queued before it (a host sync), so a step's stage
times and its speed depend on how many there are. An engine step makes, on the `sorted` and
`batched` kernels, one per MoE layer (the expert counts that size their matmuls) and one at its
end (the sampled tokens together with the step's routing statistics); on the grouped kernel,
none per layer. On the CPU the same calls are made and counted, so a CPU test holds the
budget (tests/test_moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class HostTransfers:
    count: int = 0

    def to_list(self, t: Tensor) -> list:
        """A device tensor's values on the host, as Python numbers: one transfer."""
        self.count += 1
        return t.tolist()

    def fetch(self, parts: list[Tensor]) -> list[Tensor]:
        """Several integer or boolean device tensors on the host in one transfer (flattened
        into one int64 buffer and split again there), each in its own shape and dtype."""
        if not parts:
            return []
        self.count += 1
        if parts[0].device.type == "cpu":  # already there: counted, not copied
            return parts
        host = torch.cat([p.reshape(-1).to(torch.long) for p in parts]).cpu()
        out, start = [], 0
        for p in parts:
            out.append(host[start:start + p.numel()].reshape(p.shape).to(p.dtype))
            start += p.numel()
        return out
