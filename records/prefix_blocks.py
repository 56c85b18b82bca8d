"""Prefix sharing by blocks, as vLLM's prefix cache keys its KV: a prompt cut into BLOCK-token
blocks, each keyed by the chain of blocks before it, so a block matches only where the whole
prompt up to it matched. The load generator counts what its prompts could share (the run's
`workload.prefix_share`, what an unbounded cache could hit), the reference servers what they hit."""

from __future__ import annotations

from collections.abc import Sequence

BLOCK = 16  # tokens (vLLM's default block size)


class PrefixBlocks:
    def __init__(self):
        self.seen: set[int] = set()
        self.queried = 0  # prompt tokens looked up
        self.hits = 0  # of them, in blocks a previous prompt had

    def add(self, prompt: Sequence) -> int:
        """Looks the prompt (token ids, or words) up, then keeps its blocks: the tokens it
        hit."""
        chain, hits, new = 0, 0, []
        for start in range(0, len(prompt) - BLOCK + 1, BLOCK):
            chain = hash((chain, tuple(prompt[start:start + BLOCK])))
            if chain in self.seen:
                hits += BLOCK
            else:
                new.append(chain)
        self.seen.update(new)
        self.queried += len(prompt)
        self.hits += hits
        return hits

    @property
    def share(self) -> float | None:
        return self.hits / self.queried if self.queried else None
