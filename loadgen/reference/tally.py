"""What a reference server did, counted the way the engines count it, for its /metrics
(loadgen/reference/exposition.py): requests waiting for a slot and running, the KV tokens the
running streams hold against --kv-tokens, preemptions (every --preempt-every-th stream, once,
at its middle token; the reference recomputes in no time, so its schedule is unchanged),
prefix-cache queries and hits (records/prefix_blocks.py: vLLM's blocks; none with
--no-prefix-cache), prompt and generated
tokens, the server's own TTFT, inter-token, queue and end-to-end times as histograms, and a
seeded expert load: each message's tokens routed top-2 over EXPERTS experts on RANKS ranks
with skewed weights, its balancedness (mean over max rank load) summed as SGLang's is."""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from records.prefix_blocks import PrefixBlocks

EXPERTS, RANKS, TOP_K = 8, 4, 2
# vLLM's buckets (vllm/v1/metrics/buckets.py), shared here by every family
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
              10.0, 20.0, 40.0, 80.0)
REQUEST_BOUNDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                  60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class ExposedHistogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, the last above every bound
    sum: float = 0.0

    def __post_init__(self):
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def cumulative(self) -> list[tuple[str, int]]:
        out, seen = [], 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            seen += count
            out.append((bound, seen))
        return out


class Tally:
    def __init__(self, kv_tokens: int, preempt_every: int, seed: int, prefix_cache: bool = True):
        self.kv_tokens = kv_tokens
        self.preempt_every = preempt_every
        self.prefix_cache = prefix_cache
        self.waiting = self.running = self.kv_held = 0
        self.streams = self.preemptions = self.finished = 0
        self.prefix_queries = self.prefix_hits = 0
        self.prompt_tokens = self.generation_tokens = 0
        self.ttft = ExposedHistogram(TTFT_BOUNDS)
        self.itl = ExposedHistogram(ITL_BOUNDS)
        self.queue = ExposedHistogram(REQUEST_BOUNDS)
        self.e2e = ExposedHistogram(REQUEST_BOUNDS)
        self.cache = PrefixBlocks()
        self.rng = random.Random(seed)
        weights = [1.0 / (e + 1) for e in range(EXPERTS)]  # a Zipf-like skew, expert 0 hottest
        self.expert_weights = weights
        self.balancedness_sum = 0.0
        self.forwards = 0

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_held / self.kv_tokens)

    def arrived(self, prompt: Sequence) -> None:
        """A request, before it waits: its prompt's prefix lookup (counted once it is done)."""
        hits = self.cache.add(prompt) if self.prefix_cache else 0
        self.waiting += 1
        self.prompt_tokens += len(prompt)
        self.prefix_queries += len(prompt)
        self.prefix_hits += hits

    def admitted(self, prompt_tokens: int, queued_s: float) -> int:
        """The request got its slot: its number among the streams."""
        self.waiting -= 1
        self.running += 1
        self.kv_held += prompt_tokens
        self.queue.observe(queued_s)
        self.streams += 1
        return self.streams

    def sent(self, stream: int, index: int, tokens: int, max_tokens: int, since_s: float) -> None:
        """A message of `tokens` tokens, its first token the index-th of the stream; since_s:
        from the request (the first message) or from the stream's previous message."""
        if index == 0:
            self.ttft.observe(since_s)
        else:
            self.itl.observe(since_s / tokens, tokens)
        self.kv_held += tokens
        self.generation_tokens += tokens
        if (self.preempt_every and stream % self.preempt_every == 0
                and index <= max_tokens // 2 < index + tokens):
            self.preemptions += 1
        self._route(tokens)

    def ended(self, held_tokens: int, e2e_s: float) -> None:
        self.running -= 1
        self.kv_held -= held_tokens
        self.finished += 1
        self.e2e.observe(e2e_s)

    def _route(self, tokens: int) -> None:
        load = [0] * RANKS
        for _ in range(tokens):
            experts = list(range(EXPERTS))
            weights = list(self.expert_weights)
            for _ in range(TOP_K):  # TOP_K distinct experts, drawn by weight
                i = self.rng.choices(range(len(experts)), weights)[0]
                load[experts.pop(i) % RANKS] += 1
                weights.pop(i)
        self.balancedness_sum += (sum(load) / RANKS) / max(load)
        self.forwards += 1
