"""KV slots free for new sequences: an engine's `slots` (server/engine/interface.py). Taking one
gives it to a new sequence; giving it back frees it for the next."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Slots(Protocol):
    def __len__(self) -> int:
        """Slots free now."""

    def take(self) -> int: ...

    def give(self, slot: int) -> None: ...


class SlotPool:
    """Slots taken lowest first, and given back once: a slot freed twice is a bug in whoever
    holds it, refused here before two sequences could share one."""

    def __init__(self, slots: Iterable[int]):
        self._free = sorted(slots, reverse=True)
        self._free_set = set(self._free)

    def __len__(self) -> int:
        return len(self._free)

    def take(self) -> int:
        slot = self._free.pop()
        self._free_set.discard(slot)
        return slot

    def give(self, slot: int) -> None:
        if slot in self._free_set:
            raise ValueError(f"KV slot {slot} freed twice")
        self._free.append(slot)
        self._free_set.add(slot)


class RankSlots:
    """The slots of several ranks, global slot s living on rank s % world: a new sequence goes
    to the rank with the most free slots (the lowest rank on a tie)."""

    def __init__(self, kv_slots: int, world: int):
        self.pools = [SlotPool(range(rank, kv_slots, world)) for rank in range(world)]

    def __len__(self) -> int:
        return sum(len(pool) for pool in self.pools)

    def take(self) -> int:
        rank = max(range(len(self.pools)), key=lambda r: (len(self.pools[r]), -r))
        return self.pools[rank].take()

    def give(self, slot: int) -> None:
        self.pools[slot % len(self.pools)].give(slot)
