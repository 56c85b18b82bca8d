"""One sending process's part of the SLA search's probes: its arrivals at its share of each
probe's rate, and what became of the requests it scheduled, as the search judges them.

Times in a sample are from the probe's start as this process saw it, so a distributed run's
workers need no common clock: each judges its own warm-up by its own start."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gevent.event import Event

from loadgen.recording.timing import stream_timing
from loadgen.targets.client import StreamResult
from loadgen.traffic.arrivals import gap_s
from records.load_settings import TrafficSettings


@dataclass(frozen=True)
class Done:
    """A request of the probe that ended."""

    since_s: float  # scheduled, s from the probe's start
    ok: bool
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass(frozen=True)
class Waiting:
    """A request of the probe still in flight."""

    since_s: float  # scheduled, s from the probe's start
    age_ms: float  # since it was scheduled
    answered: bool  # its first token came


@dataclass(frozen=True)
class ProbeSample:
    """What one process adds to a probe's judgement: the requests that ended since its last
    sample, those still in flight, whether its arrivals were cut, and how many of its requests
    (of any probe) are still in flight."""

    probe: int
    done: list[Done]
    waiting: list[Waiting]
    cut: bool
    inflight: int

    def to_message(self) -> dict:
        return {"probe": self.probe, "cut": self.cut, "inflight": self.inflight,
                "done": [[d.since_s, d.ok, d.ttft_ms, d.tpot_ms, d.e2e_ms] for d in self.done],
                "waiting": [[w.since_s, w.age_ms, w.answered] for w in self.waiting]}

    @classmethod
    def from_message(cls, data: dict) -> ProbeSample:
        return cls(probe=data["probe"], cut=data["cut"], inflight=data["inflight"],
                   done=[Done(*d) for d in data["done"]],
                   waiting=[Waiting(*w) for w in data["waiting"]])


def done_of(result: StreamResult, probe_ns: int) -> Done:
    since_s = (result.scheduled_ns - probe_ns) / 1e9
    if not result.ok:
        return Done(since_s, False)
    t = stream_timing(result.scheduled_ns, result.sent_ns, result.recv_ns, result.tokens)
    return Done(since_s, True, t.ttft_us / 1000, None if t.tpot_us is None else t.tpot_us / 1000,
                t.e2e_us / 1000)


class ProbePart:
    def __init__(self, traffic: TrafficSettings, workers: int = 1, index: int = 0):
        """workers, index: this process's place among the sending processes; it sends
        1/workers of each probe's rate, its requests numbered index, index + workers, ..."""
        self.traffic, self.workers, self.index = traffic, workers, index
        self.probe = -1  # the current probe's number, -1 before the first
        self.cut = False  # the current probe's arrivals are over
        self._zero_ns = 0  # the schedule's time zero (the run's start)
        self._probe_ns = 0  # the current probe's start
        self._rate = 0.0  # this process's share of the current probe's rate
        self._cut_s = math.inf  # its arrivals stop here, s from time zero
        self.begun = Event()  # set at the schedule's time zero
        self._next = Event()  # set when the next probe starts, or the schedule ends
        self._over = False
        self._done: list[Done] = []  # ended since the last sample

    def begin(self, zero_ns: int) -> None:
        self._zero_ns = zero_ns
        self.begun.set()

    def arrivals(self) -> Iterator[tuple[int, float]]:
        """(run-wide request index, send time s from time zero): each probe's arrivals at this
        process's share of its rate until it is cut; then it waits for the next probe."""
        rng = random.Random(self.traffic.seed + 7919 * self.index)  # index 0: the seed's own
        count = 0
        while True:
            self._next.wait()
            self._next.clear()
            if self._over:
                return
            t = (self._probe_ns - self._zero_ns) / 1e9
            while True:
                t += gap_s(rng, self._rate, self.traffic.arrival, self.traffic.burstiness)
                if t >= self._cut_s:
                    break
                yield count * self.workers + self.index, t
                count += 1

    def start(self, probe: int, rate: float) -> None:
        """Probe `probe` starts now at `rate` requests/s (the whole run's)."""
        self.probe, self.cut, self._done = probe, False, []
        self._probe_ns = time.monotonic_ns()
        self._rate, self._cut_s = rate / self.workers, math.inf
        self._next.set()

    def stop_arrivals(self) -> None:
        self.cut = True
        self._cut_s = (time.monotonic_ns() - self._zero_ns) / 1e9

    def end(self) -> None:
        """No probe follows: the schedule is over."""
        self._over = True
        self._next.set()

    def observe(self, result: StreamResult) -> None:
        """A finished request of the probe, unless it came whole (not timed)."""
        if self.probe >= 0 and result.scheduled_ns >= self._probe_ns and result.streamed:
            self._done.append(done_of(result, self._probe_ns))

    def sample(self, inflight: Iterable[StreamResult]) -> ProbeSample:
        now_ns = time.monotonic_ns()
        inflight = list(inflight)
        waiting = [Waiting((r.scheduled_ns - self._probe_ns) / 1e9,
                           (now_ns - r.scheduled_ns) / 1e6, bool(r.recv_ns))
                   for r in inflight if r.scheduled_ns >= self._probe_ns]
        done, self._done = self._done, []
        return ProbeSample(self.probe, done, waiting, self.cut, len(inflight))
