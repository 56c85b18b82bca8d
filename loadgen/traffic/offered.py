"""What a run's requests asked for, tallied as they are sent: prompt lengths, output lengths
asked, and what the prompts could share (records/prefix_blocks.py), for summary.json's
`workload` (records/summary.py OfferedWorkload). The aio sender keeps its own and hands its
state over at its end."""

from __future__ import annotations

from collections import Counter

from loadgen.targets.target import RequestSpec
from records.prefix_blocks import PrefixBlocks
from records.summary import Lengths, OfferedWorkload


def lengths(counts: Counter) -> Lengths:
    """Exact percentiles of integer lengths kept as value -> how many."""
    total = sum(counts.values())
    ordered = sorted(counts)

    def at(q: float) -> int:
        seen, rank = 0, q * total
        for value in ordered:
            seen += counts[value]
            if seen >= rank:
                return value
        return ordered[-1]

    return Lengths(mean=sum(v * n for v, n in counts.items()) / total, p50=at(0.5), p90=at(0.9),
                   p99=at(0.99), max=ordered[-1])


class Offered:
    def __init__(self):
        self.prompts: Counter = Counter()
        self.outputs: Counter = Counter()
        self.blocks = PrefixBlocks()

    def add(self, spec: RequestSpec) -> None:
        units = spec.prompt_units
        self.prompts[len(units)] += 1
        self.outputs[spec.max_tokens] += 1
        self.blocks.add(units)

    def state(self) -> dict:
        """As JSON, for the aio sender's last line."""
        return {"prompts": list(self.prompts.items()), "outputs": list(self.outputs.items()),
                "prefix": [self.blocks.queried, self.blocks.hits]}

    @classmethod
    def of_state(cls, state: dict) -> Offered:
        offered = cls()
        offered.prompts.update(dict(map(tuple, state["prompts"])))
        offered.outputs.update(dict(map(tuple, state["outputs"])))
        offered.blocks.queried, offered.blocks.hits = state["prefix"]
        return offered

    def figures(self) -> OfferedWorkload | None:
        if not self.prompts:
            return None
        return OfferedWorkload(requests=sum(self.prompts.values()),
                               prompt_tokens=lengths(self.prompts),
                               max_tokens=lengths(self.outputs),
                               prefix_share=self.blocks.share or 0.0)
