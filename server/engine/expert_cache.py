"""Expert-weight cache: which experts' weights are on the device, and how often they are swapped in.

Per MoE layer at most `capacity` experts are resident in fast memory (GPU memory on CUDA;
a separate resident buffer on a CPU); all experts live in host memory (pinned on CUDA).
A miss copies the expert's weights (its fused gate-up and its down projection) in for real
and evicts a resident expert not needed by the same call, chosen by the policy: lru, lfu
(ties to the least recently used) or random (seeded). The MoE layer visits a step's
resident experts before the missing ones, so a miss never evicts an expert the step still
needs while others would do.

Copies run on the compute stream (non-blocking from pinned memory on CUDA), so the time
compute waits for them equals their copy time; on a CPU the copy is synchronous and the
same holds.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import make_dataclass

import torch
from torch import Tensor

from records.engine_telemetry import CACHE, metrics_of
from server.engine.stages import Clock

POLICIES = ("lru", "lfu", "random")

# One layer's counters, as the telemetry declares them (hits, misses, evictions, bytes copied,
# copy and wait ms): the cache counts them, GetStats and /metrics report them.
CacheCounters = make_dataclass("CacheCounters", [
    (m.name, m.scalar, m.scalar(0)) for m in metrics_of(CACHE)])


class LayerCache:
    """One MoE layer's resident experts. rng: the random policy's draws (the layers of a model
    share one, seeded)."""

    def __init__(self, host: tuple[Tensor, ...], capacity: int, device: torch.device,
                 policy: str = "lru", rng: random.Random | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown cache policy {policy!r}; choose from {', '.join(POLICIES)}")
        self.host = host  # w13 [E, 2I, D], w2 [E, D, I] in host memory
        self.resident = tuple(torch.empty((capacity, *w.shape[1:]), dtype=w.dtype, device=device)
                              for w in host)
        self.capacity = capacity
        self.policy = policy
        self.rng = rng or random.Random(0)
        self.clock = Clock(torch.device(device))
        # expert -> slot, least recently used first
        self.slot_of: OrderedDict[int, int] = OrderedDict()
        self.uses: dict[int, int] = {}
        self.counters = CacheCounters()
        self.expert_bytes = sum(w[0].numel() * w.element_size() for w in host)
        # copy intervals not read yet (CUDA events complete after the step's sync)
        self._pending: list = []

    def ensure(self, experts: list[int]) -> list[int]:
        """Makes experts resident together (at most capacity of them); returns their slots."""
        slots = []
        for e in experts:
            self.uses[e] = self.uses.get(e, 0) + 1
            if e in self.slot_of:
                self.counters.hits += 1
                self.slot_of.move_to_end(e)
                slots.append(self.slot_of[e])
                continue
            self.counters.misses += 1
            slot = (len(self.slot_of) if len(self.slot_of) < self.capacity
                    else self._evict(set(experts)))
            start = self.clock.now()
            for dst, src in zip(self.resident, self.host, strict=True):
                dst[slot].copy_(src[e], non_blocking=True)
            self._pending.append((start, self.clock.now()))
            self.counters.bytes_copied += self.expert_bytes
            self.slot_of[e] = slot
            slots.append(slot)
        return slots

    def _evict(self, needed: set[int]) -> int:
        candidates = [e for e in self.slot_of if e not in needed]  # least recently used first
        if self.policy == "lru":
            victim = candidates[0]
        elif self.policy == "lfu":
            victim = min(candidates, key=lambda e: self.uses[e])  # min keeps the first: LRU on ties
        else:
            victim = self.rng.choice(candidates)
        self.counters.evictions += 1
        return self.slot_of.pop(victim)

    def settle(self) -> None:
        """Adds the step's copy times; call after the step's host sync (every copy event of
        the step has completed by then)."""
        for start, end in self._pending:
            ms = self.clock.elapsed_ms(start, end)
            self.counters.copy_ms += ms
            self.counters.wait_ms += ms
        self._pending.clear()
