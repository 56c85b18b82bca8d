"""One sending process's part of the SLA search's probes: its arrivals at its share of each
probe's rate, and what became of the requests it scheduled, as the search judges them. Free of
any event loop: the gevent run and the aio sender's process (loadgen/aio_sender.py) both keep
one; between probes its schedule says when to look again (loadgen/traffic/dispatch.py's idle
arrivals).

Times in a sample are from the probe's start as this process saw it, so a distributed run's
workers need no common clock: each judges its own warm-up by its own start."""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from loadgen.recording.timing import stream_timing
from loadgen.targets.client import StreamResult
from loadgen.traffic.arrivals import gap_s
from records.load_settings import TrafficSettings

UNSENT_S = 1.0  # an arrival due this long and not sent: the cap, or the sender behind
IDLE_S = 0.005  # between probes, the schedule looks for the next this often
JUDGE_S = 0.25  # how often a probe is judged, and a sender says its part
# the search's messages to the senders (a distributed run's workers, an aio sender process)
START = "moe_sla_start"  # {"probe", "rate"}
CUT = "moe_sla_cut"  # {"probe"}
SAMPLE = "moe_sla_sample"  # a sender's part: {"worker", **ProbeSample.to_message()}


@dataclass(frozen=True)
class Done:
    """A request of the probe that ended."""

    since_s: float  # scheduled, s from the probe's start
    ok: bool
    lag_ms: float  # sent after its scheduled time
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass(frozen=True)
class Waiting:
    """A request of the probe still in flight."""

    since_s: float  # scheduled, s from the probe's start
    age_ms: float  # since it was scheduled
    answered: bool  # its first token came
    lag_ms: float  # sent after its scheduled time


@dataclass(frozen=True)
class ProbeSample:
    """What one process adds to a probe's judgement: the requests that ended since its last
    sample, those still in flight, whether its arrivals were cut, how many of its requests (of
    any probe) are still in flight, and how many of the probe's arrivals fell due more than
    UNSENT_S ago and were not sent (the cap on requests in flight, or a sender behind)."""

    probe: int
    done: list[Done]
    waiting: list[Waiting]
    cut: bool
    inflight: int
    unsent: int = 0

    def to_message(self) -> dict:
        return {"probe": self.probe, "cut": self.cut, "inflight": self.inflight,
                "unsent": self.unsent,
                "done": [[d.since_s, d.ok, d.lag_ms, d.ttft_ms, d.tpot_ms, d.e2e_ms]
                         for d in self.done],
                "waiting": [[w.since_s, w.age_ms, w.answered, w.lag_ms] for w in self.waiting]}

    @classmethod
    def from_message(cls, data: dict) -> ProbeSample:
        return cls(probe=data["probe"], cut=data["cut"], inflight=data["inflight"],
                   unsent=data["unsent"], done=[Done(*d) for d in data["done"]],
                   waiting=[Waiting(*w) for w in data["waiting"]])


def lag_ms(result: StreamResult) -> float:
    return max(0, result.sent_ns - result.scheduled_ns) / 1e6 if result.sent_ns else 0.0


def done_of(result: StreamResult, probe_ns: int) -> Done:
    since_s = (result.scheduled_ns - probe_ns) / 1e9
    if not result.ok:
        return Done(since_s, False, lag_ms(result))
    t = stream_timing(result.scheduled_ns, result.sent_ns, result.recv_ns, result.tokens)
    return Done(since_s, True, lag_ms(result), t.ttft_us / 1000,
                None if t.tpot_us is None else t.tpot_us / 1000, t.e2e_us / 1000)


class ProbePart:
    def __init__(self, traffic: TrafficSettings, workers: int = 1, index: int = 0):
        """workers, index: this process's place among the sending processes; it sends
        1/workers of each probe's rate, its requests numbered index, index + workers, ..."""
        self.traffic, self.workers, self.index = traffic, workers, index
        self.probe = -1  # the current probe's number, -1 before the first
        self.cut = True  # the current probe's arrivals are over (none runs yet)
        self._zero_ns = 0  # the schedule's time zero (the run's start)
        self._probe_ns = 0  # the current probe's start
        self._rate = 0.0  # this process's share of the current probe's rate
        self._cut_s = math.inf  # its arrivals stop here, s from time zero
        self.begun = False  # the schedule's time zero has come
        self._epoch = 0  # probes started after a cut, so far
        self._over = False
        self._done: list[Done] = []  # ended since the last sample
        self._due: list[float] = []  # the current probe's arrivals, s from time zero
        self._ended: list[float] = []  # its requests that ended, scheduled s from time zero

    def begin(self, zero_ns: int) -> None:
        self._zero_ns = zero_ns
        self.begun = True

    def now_s(self) -> float:
        return (time.monotonic_ns() - self._zero_ns) / 1e9

    def arrivals(self) -> Iterator[tuple[int | None, float]]:
        """(run-wide request index, send time s from time zero): each probe's arrivals at this
        process's share of its rate until it is cut; between probes (None, when to look
        again). A probe started before the last was cut (the search's ramp) carries on its
        arrivals at its own rate; one started after, from its start."""
        rng = random.Random(self.traffic.seed + 7919 * self.index)  # index 0: the seed's own
        count, epoch, t = 0, 0, math.inf
        while not self._over:
            if epoch != self._epoch:
                epoch = self._epoch
                t = max((self._probe_ns - self._zero_ns) / 1e9, self.now_s())
            if t < self._cut_s:
                t += gap_s(rng, self._rate, self.traffic.arrival, self.traffic.burstiness)
                if t < self._cut_s:
                    self._due.append(t)
                    yield count * self.workers + self.index, t
                    count += 1
                    continue
            yield None, self.now_s() + IDLE_S

    def start(self, probe: int, rate: float) -> None:
        """Probe `probe` starts now at `rate` requests/s (the whole run's)."""
        running = not self.cut
        self.probe, self.cut, self._done = probe, False, []
        self._due, self._ended = [], []
        self._probe_ns = time.monotonic_ns()
        self._rate, self._cut_s = rate / self.workers, math.inf
        self._epoch += not running

    def stop_arrivals(self) -> None:
        self.cut = True
        self._cut_s = (time.monotonic_ns() - self._zero_ns) / 1e9

    def end(self) -> None:
        """No probe follows: the schedule is over."""
        self._over = True

    def observe(self, result: StreamResult) -> None:
        """A finished request of the probe; timed unless it came whole."""
        if self.probe < 0 or result.scheduled_ns < self._probe_ns:
            return
        self._ended.append((result.scheduled_ns - self._zero_ns) / 1e9)
        if result.streamed:
            self._done.append(done_of(result, self._probe_ns))

    def sample(self, inflight: Iterable[StreamResult]) -> ProbeSample:
        now_ns = time.monotonic_ns()
        inflight = list(inflight)
        mine = [r for r in inflight if r.scheduled_ns >= self._probe_ns]
        waiting = [Waiting((r.scheduled_ns - self._probe_ns) / 1e9,
                           (now_ns - r.scheduled_ns) / 1e6, bool(r.recv_ns), lag_ms(r))
                   for r in mine]
        done, self._done = self._done, []
        by_s = (now_ns - self._zero_ns) / 1e9 - UNSENT_S
        sent = (sum(1 for t in self._ended if t <= by_s)
                + sum(1 for r in mine if (r.scheduled_ns - self._zero_ns) / 1e9 <= by_s))
        unsent = max(0, bisect.bisect_right(self._due, by_s) - sent)
        return ProbeSample(self.probe, done, waiting, self.cut, len(inflight), unsent)
