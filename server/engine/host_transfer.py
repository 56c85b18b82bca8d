"""Transfers between host and device of an engine step, all through here: device -> host ones
counted, host -> device ones made so they never wait.

On CUDA each one waits for every kernel queued before it (a host sync), so a step's stage
times and its speed depend on how many there are. An engine step makes, on the `sorted` and
`batched` kernels, one per MoE layer (the expert counts that size their matmuls) and one at its
end (the sampled tokens together with the step's routing statistics); on the grouped kernel,
none per layer. On the CPU the same calls are made and counted, so a CPU test holds the
budget (tests/test_moe.py).

The other way, a plain copy of a host tensor to the GPU waits for the device as well (PyTorch
copies from pageable memory and synchronizes); from page-locked memory, without waiting, it is
queued like a kernel (`to_device`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


def _now(read: Callable[[], T]) -> T:
    return read()


@dataclass
class HostTransfers:
    count: int = 0
    # runs each read inside a step's stage: the stage timer's `read` (server/engine/stages.py),
    # which splits a sampled stage around the wait
    around: Callable[[Callable[[], T]], T] = _now

    def to_list(self, t: Tensor) -> list:
        """A device tensor's values on the host, as Python numbers: one transfer."""
        self.count += 1
        return self.around(lambda: t.tolist())

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


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A host tensor on the device, copied without waiting for the device: from page-locked
    memory (torch's pinned allocator keeps the block until the copy is done)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def lists_to_device(lists: list[list[int]], device: torch.device) -> list[Tensor]:
    """Lists of ints as int64 device tensors, in one copy that does not wait (`to_device`)."""
    host = torch.tensor([x for xs in lists for x in xs], dtype=torch.long)
    return list(to_device(host, device).split([len(xs) for xs in lists]))


def cuda_waits(fn: Callable[[], T]) -> tuple[T, list[str]]:
    """fn()'s result and where it waited for the GPU ("file:line" of the Python line that
    called the waiting operation, once per wait), as CUDA's sync debug mode reports them
    (gpu-check and tests/test_gpu.py hold a step to its counted reads by it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return result, [f"{Path(w.filename).name}:{w.lineno}" for w in caught
                    if "synchroniz" in str(w.message)]
