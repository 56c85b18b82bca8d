"""KV slots free for new sequences: an engine's `slots` (server/engine/interface.py). Taking one
gives it to a new sequence; giving it back frees it for the next. A freed slot keeps its KV
until taken again, which is what the prefix cache reuses (server/scheduling/prefix_cache.py):
it may name the slot it takes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Slots(Protocol):
    def __len__(self) -> int:
        """Slots free now."""

    def __contains__(self, slot: int) -> bool:
        """Whether the slot is free."""

    def take(self, slot: int | None = None) -> int:
        """A free slot (this one, when named) for a new sequence."""

    def free_on(self, slot: int | None) -> list[int]:
        """The free slots sharing this slot's KV memory (its rank's); None: those of where a
        new sequence goes (the rank with the most free slots)."""

    def give(self, slot: int) -> None: ...


class SlotPool:
    """Slots taken lowest first, and given back once: a slot freed twice is a bug in whoever
    holds it, refused here before two sequences could share one."""

    def __init__(self, slots: Iterable[int]):
        self._free = sorted(slots, reverse=True)
        self._free_set = set(self._free)

    def __len__(self) -> int:
        return len(self._free)

    def __contains__(self, slot: int) -> bool:
        return slot in self._free_set

    def take(self, slot: int | None = None) -> int:
        if slot is None:
            slot = self._free.pop()
        else:
            self._free.remove(slot)
        self._free_set.discard(slot)
        return slot

    def free_on(self, slot: int | None) -> list[int]:
        return self._free[::-1]  # one memory: every free slot, lowest first

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

    def __contains__(self, slot: int) -> bool:
        return slot in self.pools[slot % len(self.pools)]

    def take(self, slot: int | None = None) -> int:
        if slot is not None:
            return self.pools[slot % len(self.pools)].take(slot)
        return self.pools[self._roomiest()].take()

    def _roomiest(self) -> int:
        return max(range(len(self.pools)), key=lambda r: (len(self.pools[r]), -r))

    def free_on(self, slot: int | None) -> list[int]:
        rank = self._roomiest() if slot is None else slot % len(self.pools)
        return self.pools[rank].free_on(slot)

    def give(self, slot: int) -> None:
        self.pools[slot % len(self.pools)].give(slot)
