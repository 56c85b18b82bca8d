"""Whether an offered load has settled: the requests in flight not growing over a window.

Arrivals less completions are the growth of the requests in flight, so "achieved within a
share of the offered rate" and "in flight growing slower than that share of it" are one test.
The in-flight count grows as a queue builds; latency follows it (Little's law). A load
is growing when the least-squares slope of its in-flight samples exceeds `share` of the offered
rate and, over the window, adds more than twice the in-flight count a healthy server holds at
that rate (its rate times the median latency, plus one): ramp-up noise is neither. Stress mode
judges its steps so (loadgen/modes/stress.py), the SLA search its probes (loadgen/sla/)."""

from __future__ import annotations


def slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of (time s, value) samples. By hand: scipy in the Locust process slows
    its sends (docs/measured.md)."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return sum((t - mt) * (v - mv) for t, v in samples) / var if var else 0.0


def growing(samples: list[tuple[float, int]], offered_rps: float, healthy_in_flight: float,
            share: float) -> float:
    """The in-flight growth over the samples' window (requests) where it says the load has not
    settled; 0.0 where it has."""
    if len(samples) < 2:
        return 0.0
    growth = slope(samples)
    window_s = samples[-1][0] - samples[0][0]
    if growth > share * offered_rps and growth * window_s > 2 * healthy_in_flight:
        return growth * window_s
    return 0.0
