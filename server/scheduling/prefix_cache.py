"""The prefix cache (docs/design.md, "Prefix cache"): prompt KV reused by block, as vLLM's
automatic prefix caching reuses it, inside the KV pool's own slots.

A sequence's KV stays in its slot after it ends, until a new sequence takes the slot. The
cache indexes the full blocks (--prefix-block-tokens tokens) each slot holds, each keyed by
the hash of its tokens chained to the key of the block before it, so equal keys mean equal
prefixes: a prompt's blocks once it is prefilled, a finished sequence's prompt and output
(every position its steps computed). A new request takes its longest cached prefix, at most
its prompt but one token (the last is computed for its first output token):

- in place, when a free slot holds it: the request takes that slot and keeps its blocks;
- copied, when only a slot in use holds it (a running sequence's prompt): the request takes a
  free slot sharing that slot's KV memory (its rank's, with --ep) and the step copies the
  prefix into it first (server/engine/local.py);
- else it computes everything, in the free slot the cache wants least: one holding nothing,
  else the least recently used.

A running sequence never loses its KV: only free slots are taken, and the index forgets a
slot's blocks (evictions) as a new sequence overwrites them. --prefix-cache-tokens caps the
tokens indexed in free slots, forgetting the least recently used slots' blocks past it.
Counters (tokens queried and hit, tokens copied, blocks evicted) go to the telemetry window
(records/engine_telemetry.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from server.engine.slots import Slots


def block_keys(ids: list[int], block: int, known: list[int] = ()) -> list[int]:
    """The chained key of each full block of ids; known: the keys of its first blocks, already
    worked out (only the blocks after them are hashed)."""
    keys = list(known)
    parent = keys[-1] if keys else 0
    for start in range(len(keys) * block, len(ids) - block + 1, block):
        parent = hash((parent, tuple(ids[start:start + block])))
        keys.append(parent)
    return keys


@dataclass(frozen=True)
class SlotPlacement:
    slot: int  # the free slot the request takes
    cached: int  # prompt tokens it need not compute
    source: int | None  # where they are: its own slot (kept), another (copied); None: no hit


class PrefixCache:
    def __init__(self, block_tokens: int, slots: Slots, cap_tokens: int | None = None):
        self.block = block_tokens
        self.slots = slots
        self.cap_blocks = None if cap_tokens is None else cap_tokens // block_tokens
        self.held: dict[int, list[int]] = {}  # slot -> the keys of its valid blocks, in order
        self.where: dict[int, dict[int, None]] = {}  # key -> slots holding it, oldest first
        self.used: dict[int, int] = {}  # slot -> when it last served or took a sequence
        self.clock = 0

    # --- a new request ---

    def place(self, keys: list[int], prompt_len: int) -> tuple[SlotPlacement, int]:
        """Where a new request goes and what it reuses, and the blocks it evicts; takes the
        slot from the pool."""
        self.clock += 1
        holders, blocks = self._longest(self._usable(keys, prompt_len))
        free = [s for s in holders if s in self.slots]
        if free:
            placement = SlotPlacement(free[-1], blocks * self.block, free[-1])
        else:
            placement = self._copied(holders, blocks) or SlotPlacement(
                self._victim(self.slots.free_on(None)), 0, None)
        if placement.source is not None:
            self.used[placement.source] = self.clock
        self.slots.take(placement.slot)
        kept = blocks if placement.source == placement.slot else 0
        return placement, self._forget(placement.slot, kept)

    def cached(self, keys: list[int], prompt_len: int) -> int:
        """The prompt tokens a request would find now (what `place` would reuse at most)."""
        return self._longest(self._usable(keys, prompt_len))[1] * self.block

    def _usable(self, keys: list[int], prompt_len: int) -> list[int]:
        """The prompt's blocks a hit may cover: all but its last token (computed for the first
        output token's logits)."""
        return keys[:(prompt_len - 1) // self.block]

    def _longest(self, keys: list[int]) -> tuple[list[int], int]:
        """The slots holding the longest run of keys from the first, and its length."""
        holders, blocks = [], 0
        for key in keys:
            slots = self.where.get(key)
            if not slots:
                break
            holders, blocks = list(slots), blocks + 1
        return holders, blocks

    def _copied(self, holders: list[int], blocks: int) -> SlotPlacement | None:
        for source in reversed(holders):  # the newest holder first
            if free := self.slots.free_on(source):
                return SlotPlacement(self._victim(free), blocks * self.block, source)
        return None

    def _victim(self, free: list[int]) -> int:
        """The free slot whose blocks matter least: none held, else used longest ago."""
        return min(free, key=lambda s: (bool(self.held.get(s)), self.used.get(s, -1)))

    def _forget(self, slot: int, kept: int) -> int:
        """The slot's blocks past the first `kept` leave the index; returns how many."""
        dropped = self.held.get(slot, [])[kept:]
        for key in dropped:
            slots = self.where[key]
            del slots[slot]
            if not slots:
                del self.where[key]
        if slot in self.held:
            self.held[slot] = self.held[slot][:kept]
        self.used[slot] = self.clock
        return len(dropped)

    # --- what sequences computed ---

    def computed(self, slot: int, keys: list[int]) -> None:
        """The slot's sequence has these full blocks in its KV (its prompt once prefilled; its
        prompt and output once finished): they can serve others."""
        held = self.held.setdefault(slot, [])
        for key in keys[len(held):]:
            held.append(key)
            self.where.setdefault(key, {})[slot] = None

    def freed(self) -> int:
        """After slots were given back: past --prefix-cache-tokens, the least recently used free
        slots' blocks leave the index; returns the blocks evicted."""
        if self.cap_blocks is None:
            return 0
        evicted = 0
        free = sorted((s for s, keys in self.held.items() if keys and s in self.slots),
                      key=lambda s: self.used.get(s, -1))
        over = sum(len(self.held[s]) for s in free) - self.cap_blocks
        for slot in free:
            if over <= 0:
                break
            n = self._forget(slot, 0)
            evicted, over = evicted + n, over - n
        return evicted

    @property
    def blocks(self) -> int:
        """Distinct prefix blocks the cache can serve now."""
        return len(self.where)
