"""A model of the link between ranks, for what one machine cannot show: an exchange in which
rank s sends bytes[s][d] to rank d takes, on each pair that sends anything, the link's latency
plus bytes / bandwidth, and the exchange ends with its slowest pair (every rank waits for it).
A rank's bytes to itself never cross the link."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    gbps: float  # bandwidth of each rank pair, Gbit/s
    latency_us: float

    def ms(self, bytes_matrix: list[list[int]]) -> float:
        """The modelled time of one exchange; 0 when no pair sends anything."""
        pairs = [b for s, row in enumerate(bytes_matrix) for d, b in enumerate(row)
                 if s != d and b]
        if not pairs:
            return 0.0
        return self.latency_us / 1e3 + max(pairs) * 8 / (self.gbps * 1e9) * 1e3
