"""Prefix sharing by blocks, as vLLM's prefix cache keys its KV: a prompt cut into BLOCK-token
blocks, each keyed by the chain of blocks before it, so a block matches only where the whole
prompt up to it matched. The load generator counts what its prompts could share (the run's
`workload.prefix_share`, what a cache of CAPACITY blocks could hit), the reference servers what
they hit.

The cache is bounded, as a server's is, and evicts the least recently used block first:
unbounded, it grew with every prompt sent (the aio sender's memory rose ~35 MB an hour at 10
requests/s of mixed prompts), which a soak reads as the load generator's memory drifting. A
prompt's blocks are touched from its last to its first, so a prefix outlives the tails that hang
from it (vLLM frees a request's blocks in that order, for that reason); a lookup stops at the
first block missing, as a server's does."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK = 16  # tokens (vLLM's default block size)
# blocks: 262,144 tokens, 32 GiB of KV cache at Mixtral-8x7B's 128 KiB a token (fp16)
CAPACITY = 16_384


class PrefixBlocks:
    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.held: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.queried = 0  # prompt tokens looked up
        self.hits = 0  # of them, in blocks a previous prompt had

    def add(self, prompt: Sequence) -> int:
        """Looks the prompt (token ids, or words) up, then keeps its blocks: the tokens it
        hit."""
        chain, hits, keys, matching = 0, 0, [], True
        for start in range(0, len(prompt) - BLOCK + 1, BLOCK):
            chain = hash((chain, tuple(prompt[start:start + BLOCK])))
            keys.append(chain)
            matching = matching and chain in self.held
            hits += BLOCK * matching
        for key in reversed(keys):
            self.held[key] = None
            self.held.move_to_end(key)
        while len(self.held) > self.capacity:
            self.held.popitem(last=False)
        self.queried += len(prompt)
        self.hits += hits
        return hits

    @property
    def share(self) -> float | None:
        return self.hits / self.queried if self.queried else None
