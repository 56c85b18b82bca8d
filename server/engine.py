"""The engine: a model, its KV cache pool and a sampler, one step at a time.

It knows sequences as (slot, new tokens, start position, sampling settings) and nothing
of requests, queues or gRPC. Each step returns one new token per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from server.model import PRESETS, KVCache, StepLayout, Transformer


@dataclass
class SeqInput:
    slot: int
    token_ids: list[int]  # the whole prompt (prefill) or the last generated token (decode)
    start_pos: int  # position of token_ids[0] in the sequence
    temperature: float = 0.0
    generator: torch.Generator | None = None  # required when temperature > 0


class Engine:
    def __init__(self, preset: str, kv_slots: int, device: str, dtype: torch.dtype, seed: int):
        self.args = PRESETS[preset]
        self.device = torch.device(device)
        self.dtype = dtype
        self.model = Transformer(self.args, self.device, dtype)
        self.model.init_random(seed)
        self.model.eval()
        self.cache = KVCache(self.args, kv_slots, self.device, dtype)
        self.kv_slots = kv_slots
        self._free = list(range(kv_slots - 1, -1, -1))
        self._warm_up()

    def _warm_up(self) -> None:
        """One prefill and one decode step, so the first request does not pay torch's
        one-time costs (about 100 ms on a CPU) in its TTFT. Slot 0 is overwritten later."""
        (token,), _ = self.step([SeqInput(0, [0] * 8, 0)])
        self.step([SeqInput(0, [token], 8)])

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate_slot(self) -> int:
        return self._free.pop()

    def free_slot(self, slot: int) -> None:
        self._free.append(slot)

    def new_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def step(self, seqs: list[SeqInput]) -> tuple[list[int], Tensor]:
        """Runs one forward pass over all seqs; returns the next token of each and the
        tokens routed to each expert in this step [L, E] (on the engine's device)."""
        tokens = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.long,
                              device=self.device)
        layout = StepLayout.build([(s.slot, s.start_pos, len(s.token_ids)) for s in seqs],
                                  self.device)
        logits, expert_counts = self.model(tokens, layout, self.cache)  # [B, V], [L, E]
        next_ids = logits.argmax(dim=-1)
        for i, s in enumerate(seqs):
            if s.temperature > 0:
                probs = torch.softmax(logits[i] / s.temperature, dim=-1)
                next_ids[i] = torch.multinomial(probs, 1, generator=s.generator)[0]
        return next_ids.tolist(), expert_counts
