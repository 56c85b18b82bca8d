"""Open-loop arrival schedules: when each request is due, independent of earlier requests."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

ARRIVALS = ("poisson", "constant")


def arrival_offsets_s(rate: float, arrival: str, seed: int) -> Iterator[float]:
    """Endless send times in seconds from the start: Poisson (exponential gaps, the usual
    model of independent users) or constant (evenly spaced), at `rate` requests/s."""
    if rate <= 0:
        raise ValueError(f"rate must be above 0, got {rate}")
    if arrival == "constant":
        return (i / rate for i in itertools.count())
    if arrival == "poisson":
        rng = random.Random(seed)
        return itertools.accumulate(rng.expovariate(rate) for _ in itertools.count())
    raise ValueError(f"unknown arrival {arrival!r}; choose from {', '.join(ARRIVALS)}")
