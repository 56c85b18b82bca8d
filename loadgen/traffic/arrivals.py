"""Open-loop arrival schedules: when each request is due, independent of earlier requests."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from records.load_settings.choices import ARRIVALS


def gap_s(rng: random.Random, rate: float, arrival: str, burstiness: float = 1.0) -> float:
    """One gap between sends at `rate` requests/s: exponential (Poisson, the usual model of
    independent users), constant, or gamma with shape `burstiness` (the same mean; below 1
    burstier than Poisson, 1 Poisson, above 1 more regular)."""
    if arrival == "poisson":
        return rng.expovariate(rate)
    if arrival == "constant":
        return 1 / rate
    if arrival == "gamma":
        return rng.gammavariate(burstiness, 1 / (rate * burstiness))
    raise ValueError(f"unknown arrival {arrival!r}; choose from {', '.join(ARRIVALS)}")


def arrival_offsets_s(rate: float, arrival: str, seed: int,
                      burstiness: float = 1.0) -> Iterator[float]:
    """Endless send times in seconds from the start, at `rate` requests/s."""
    if rate <= 0:
        raise ValueError(f"rate must be above 0, got {rate}")
    if arrival == "constant":
        return (i / rate for i in itertools.count())  # exact, no accumulated rounding
    # refuse an unknown arrival now, not when iterated
    gap_s(random.Random(), rate, arrival, burstiness)
    rng = random.Random(seed)
    return itertools.accumulate(gap_s(rng, rate, arrival, burstiness) for _ in itertools.count())


def worker_arrivals(rate: float, arrival: str, seed: int, workers: int = 1, index: int = 0,
                    burstiness: float = 1.0) -> Iterator[tuple[int, float]]:
    """This process's share of a run's arrivals, as (run-wide request index, send time s).

    With several worker processes each takes 1/workers of the rate: Poisson streams are
    independent per worker (Poisson processes add up to one at the total rate); constant
    arrivals interleave, worker i taking every workers-th slot from slot i; gamma streams are
    independent per worker, each with the given burstiness.
    """
    if arrival == "constant":
        return ((k * workers + index, (k * workers + index) / rate) for k in itertools.count())
    worker_seed = seed if workers == 1 else seed * 1_000 + index
    offsets = arrival_offsets_s(rate / workers, arrival, worker_seed, burstiness)
    return ((k * workers + index, t) for k, t in enumerate(offsets))
