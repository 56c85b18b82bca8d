"""Time-varying offered rate for mixed mode (traffic whose rate fluctuates):

- sinusoid:PERIOD_S:AMPLITUDE   rate x (1 + AMPLITUDE sin(2 pi t / PERIOD_S)), AMPLITUDE in [0, 1]
- bursts:EVERY_S:LENGTH_S:FACTOR   rate x FACTOR for LENGTH_S at the start of every EVERY_S
- trace:FILE                    replay: one send time in seconds per line (CSV, first column)

Shaped profiles thin a Poisson process at the peak rate (a non-homogeneous Poisson
process); a trace is replayed as written, its first time at the start of the run.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loadgen.traffic.arrivals import worker_arrivals
from loadgen.traffic.traces import trace_arrivals
from records.load_settings import TrafficSettings


@dataclass(frozen=True)
class Profile:
    kind: str
    values: tuple[float, ...] = ()
    path: str = ""

    @classmethod
    def parse(cls, spec: str) -> Profile:
        kind, _, rest = spec.partition(":")
        if kind == "trace" and rest:
            return cls(kind, path=rest)
        want = {"sinusoid": 2, "bursts": 3}.get(kind)
        try:
            values = tuple(float(v) for v in rest.split(":")) if rest else ()
        except ValueError:
            values = ()
        if want is None or len(values) != want:
            raise ValueError(f"unknown profile {spec!r}; use sinusoid:PERIOD_S:AMPLITUDE, "
                             "bursts:EVERY_S:LENGTH_S:FACTOR or trace:FILE")
        if kind == "sinusoid" and not (values[0] > 0 and 0 <= values[1] <= 1):
            raise ValueError(f"profile {spec!r}: period above 0 and amplitude in [0, 1]")
        if kind == "bursts" and not (0 < values[1] <= values[0] and values[2] >= 1):
            raise ValueError(f"profile {spec!r}: 0 < LENGTH_S <= EVERY_S and FACTOR >= 1")
        return cls(kind, values)

    def multiplier(self, t_s: float) -> float:
        if self.kind == "sinusoid":
            period, amplitude = self.values
            return 1 + amplitude * math.sin(2 * math.pi * t_s / period)
        every, length, factor = self.values
        return factor if t_s % every < length else 1.0

    @property
    def peak(self) -> float:
        return 1 + self.values[1] if self.kind == "sinusoid" else self.values[2]

    def arrivals(self, rate: float, seed: int, workers: int = 1,
                 index: int = 0) -> Iterator[tuple[int, float]]:
        """This process's share, as (run-wide request index, send time s)."""
        if self.kind == "trace":
            times = read_trace(self.path)
            return ((i, times[i]) for i in range(index, len(times), workers))
        rng = random.Random(seed if workers == 1 else seed * 1_000 + index)
        peak = rate * self.peak / workers

        def accepted():
            t = 0.0
            while True:
                t += rng.expovariate(peak)
                if rng.random() * self.peak < self.multiplier(t):
                    yield t

        return ((k * workers + index, t)
                for k, t in zip(itertools.count(), accepted(), strict=False))


def read_trace(path: str) -> list[float]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc}") from None
    times = []
    for n, line in enumerate(lines, 1):
        cell = line.split(",")[0].strip()
        if not cell or cell.startswith("#"):
            continue
        try:
            times.append(float(cell))
        except ValueError:
            if times:  # a header line may come first, nothing else may
                raise ValueError(f"{path}:{n}: {cell!r} is not a time in seconds") from None
    if not times:
        raise ValueError(f"trace {path} has no send times")
    times.sort()
    return [t - times[0] for t in times]


def schedule_of(traffic: TrafficSettings, workers: int, index: int) -> Iterator[tuple[int, float]]:
    """(request index, send offset s) of one of `workers` processes: a --trace's times, the
    --rate-profile's shape when there is one, else --arrival at a constant --rate. The gevent
    and aio senders share it."""
    if traffic.trace:
        return trace_arrivals(traffic, workers, index)
    if traffic.profile:
        return Profile.parse(traffic.profile).arrivals(traffic.rate, traffic.seed, workers, index)
    return worker_arrivals(traffic.rate, traffic.arrival, traffic.seed, workers, index,
                           traffic.burstiness)
