"""What the MoE layers' exchanges between expert-parallel ranks moved and took, summed over
layers and steps (GetStats' ExpertParallelStats, records/engine_telemetry.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from records.engine_telemetry import COUNTER, EXCHANGE, Count, metrics_of, zeros

PHASES = ("dispatch", "combine")
# where each phase's times go, by the exchange's own name for them
TIMES = {"measured": "{phase}_ms", "exposed": "{phase}_exposed_ms",
         "modelled": "{phase}_modelled_ms"}


def zero_counts() -> dict[str, float]:
    """Every counter the declaration gives the exchanges, at zero: their times (ms), the layer
    exchanges, the placements made and the expert slots those changed."""
    return zeros(m for m in metrics_of(EXCHANGE) if m.kind == COUNTER)


@dataclass
class ExchangeTotals:
    """Payload bytes per rank pair (dispatch and combine), the times and counts of
    `zero_counts`, and the (token, expert) pairs each rank's experts computed per layer."""

    n_layers: int
    ranks: int
    bytes: torch.Tensor = None  # [phase, source, destination]
    computed: torch.Tensor = None  # [L, W]
    counts: dict[str, float] = field(default_factory=zero_counts)

    def __post_init__(self):
        if self.bytes is None:
            self.bytes = torch.zeros(len(PHASES), self.ranks, self.ranks, dtype=torch.long)
        if self.computed is None:
            self.computed = torch.zeros(self.n_layers, self.ranks, dtype=torch.long)

    def record(self, comm: list, moved: int) -> None:
        for layer, x in enumerate(comm):
            self.bytes[0] += torch.tensor(x.dispatch_bytes)
            self.bytes[1] += torch.tensor(x.combine_bytes)
            self.computed[layer] += torch.tensor(x.computed)
            for kind, times in (("measured", x.measured_ms), ("exposed", x.exposed_ms),
                                ("modelled", x.modelled_ms)):
                for phase in PHASES:
                    self.counts[TIMES[kind].format(phase=phase)] += times[phase]
        self.counts[Count.EXCHANGES] += len(comm)
        self.counts[Count.PLACEMENTS] += moved > 0
        self.counts[Count.EXPERTS_MOVED] += moved

    def copy(self) -> ExchangeTotals:
        return replace(self, bytes=self.bytes.clone(), computed=self.computed.clone(),
                       counts=dict(self.counts))

    def plus(self, other: ExchangeTotals) -> ExchangeTotals:
        return ExchangeTotals(self.n_layers, self.ranks, self.bytes + other.bytes,
                              self.computed + other.computed,
                              {k: v + other.counts[k] for k, v in self.counts.items()})
