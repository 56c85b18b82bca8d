"""Fixed-bucket histograms, the server's kind: cheap to record on the engine thread and the
event loop, sent whole in GetStats, exported as Prometheus histograms."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from records.engine_telemetry import COUNT_BOUNDS


@dataclass
class BucketHistogram:
    """Fixed-bucket histogram: counts[i] holds values <= bounds[i] (and above the previous
    bound); the last count holds values above every bound."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0
    max: float = 0.0

    def __post_init__(self):
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def record(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        self.max = max(self.max, value)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def copy(self) -> BucketHistogram:
        return BucketHistogram(self.bounds, list(self.counts), self.count, self.sum, self.max)

    def plus(self, other: BucketHistogram) -> BucketHistogram:
        return BucketHistogram(self.bounds, [a + b for a, b in zip(self.counts, other.counts,
                                                             strict=True)],
                         self.count + other.count, self.sum + other.sum, max(self.max, other.max))


def count_bounds(limit: int) -> tuple[int, ...]:
    """Powers of two up to limit, and limit: buckets that fit a count that cannot exceed it."""
    return tuple(sorted({*(b for b in COUNT_BOUNDS if b < limit), limit}))
