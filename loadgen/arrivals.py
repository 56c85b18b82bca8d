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


def worker_arrivals(rate: float, arrival: str, seed: int, workers: int = 1,
                    index: int = 0) -> Iterator[tuple[int, float]]:
    """This process's share of a run's arrivals, as (run-wide request index, send time s).

    With several worker processes each takes 1/workers of the rate: Poisson streams are
    independent per worker (Poisson processes add up to one at the total rate); constant
    arrivals interleave, worker i taking every workers-th slot from slot i.
    """
    if arrival == "constant":
        return ((k * workers + index, (k * workers + index) / rate) for k in itertools.count())
    offsets = arrival_offsets_s(rate / workers, arrival, seed if workers == 1 else seed * 1_000 + index)
    return ((k * workers + index, t) for k, t in enumerate(offsets))
