"""The queue the known-delay reference server makes (loadgen/delay_server.py): --capacity slots,
first come first served, each stream holding its slot for a fixed time; with Poisson arrivals an
M/D/c queue. Its percentile wait for a slot, by simulation, and the highest rate at which that
wait stays within a budget: the truth the SLA search is measured against (tests/test_sla.py,
`make bench-sla`)."""

from __future__ import annotations

import heapq

import numpy as np


def wait_percentile_s(rate: float, slots: int, service_s: float, percentile: float = 99.0,
                      n: int = 200_000) -> float:
    """The queue's percentile wait for a slot at `rate` requests/s (its first tenth, the queue
    filling, left out)."""
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1 / rate, n))
    free = [0.0] * slots
    waits = np.empty(n)
    for i, t in enumerate(arrivals):
        start = max(t, heapq.heappop(free))
        waits[i] = start - t
        heapq.heappush(free, start + service_s)
    return float(np.percentile(waits[n // 10:], percentile))


def highest_rate(budget_s: float, slots: int, service_s: float, percentile: float = 99.0) -> float:
    """The rate whose percentile wait is the budget, to 0.1% of the capacity, by bisection."""
    low, high = 0.0, slots / service_s
    while high - low > 0.001 * slots / service_s:
        mid = (low + high) / 2
        fits = wait_percentile_s(mid, slots, service_s, percentile) <= budget_s
        low, high = (mid, high) if fits else (low, mid)
    return (low + high) / 2
