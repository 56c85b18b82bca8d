"""KV slots free for new sequences: every engine's pool of them (one per rank over ranks)."""

from __future__ import annotations

from collections.abc import Iterable


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
