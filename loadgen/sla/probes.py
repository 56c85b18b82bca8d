"""What sends the SLA search's probes (`Probes`), and the run of one probe or ramp step over
them: started, judged every JUDGE_S until its verdict, cut, drained."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import gevent

from loadgen.sla.part import JUDGE_S, ProbePart, ProbeSample
from loadgen.sla.watch import ProbeWatch

DRAIN_S = 30.0  # the longest a probe's requests are waited for after its arrivals stop
READY_S = 60.0  # the longest the first probe waits for the sending to begin


class NotStarted(Exception):
    """A probe could not start: the sending never began."""


class Probes(Protocol):
    """What sends the search's probes."""

    def start(self, probe: int, rate: float) -> str:
        """Probe `probe` starts now at `rate` requests/s; or why it cannot. A probe started
        before the last was cut carries on its arrivals at the new rate (the ramp)."""

    def collect(self) -> ProbeSample:
        """The current probe's requests that ended since the last call, those in flight, and
        its arrivals not sent."""

    def cut(self) -> None:
        """The current probe's arrivals stop."""

    def drained(self) -> bool:
        """No request of any probe is in flight."""

    def end(self) -> None:
        """The search is over: the run stops."""


class LocalProbes:
    """The probes of a run in one process: its own ProbePart, its requests in flight."""

    def __init__(self, part: ProbePart, inflight: dict, request_stop):
        self.part, self.inflight, self.request_stop = part, inflight, request_stop

    def start(self, probe: int, rate: float) -> str:
        deadline = time.monotonic() + READY_S
        while not self.part.begun and time.monotonic() < deadline:
            gevent.sleep(0.05)
        if not self.part.begun:
            return f"the schedule did not begin within {READY_S:g} s"
        self.part.start(probe, rate)
        return ""

    def collect(self) -> ProbeSample:
        return self.part.sample(self.inflight.values())

    def cut(self) -> None:
        self.part.stop_arrivals()

    def drained(self) -> bool:
        return not self.inflight

    def end(self) -> None:
        self.part.end()
        self.request_stop()


class Sending:
    """The search's side of its Probes: numbers each start, keeps time from the first."""

    def __init__(self, probes: Probes, judge_s: float = JUDGE_S,
                 clock: Callable[[], float] = time.monotonic):
        """judge_s: how often a probe is judged; clock: the time its samples are taken at (a
        test's fake Probes answers at once, on a clock of its own)."""
        self.probes, self.judge_s, self.clock = probes, judge_s, clock
        self.started = 0
        self._zero = clock()

    def now_s(self) -> float:
        return self.clock() - self._zero

    def start(self, rate: float) -> float:
        """Starts the next probe at rate; when, s from the first."""
        if (problem := self.probes.start(self.started, rate)):
            raise NotStarted(problem)
        if self.started == 0:
            self._zero = self.clock()
        self.started += 1
        return self.now_s()

    def watch(self, watch: ProbeWatch, start_s: float,
              until: Callable[[float], bool]) -> float:
        """Adds the probe's samples to watch every judge_s until `until(elapsed)` (elapsed: s
        past its warm-up) says it is decided; returns elapsed then."""
        while True:
            gevent.sleep(self.judge_s)
            at_s = self.now_s() - start_s
            watch.add(self.probes.collect(), at_s)
            if until(elapsed := at_s - watch.sla.sla_warmup_s):
                return elapsed

    def cut_and_drain(self) -> None:
        """Its arrivals stop; until its requests have ended (or DRAIN_S), so the next probe
        starts on an idle server."""
        self.probes.cut()
        deadline = time.monotonic() + DRAIN_S
        while not self.probes.drained() and time.monotonic() < deadline:
            gevent.sleep(0.05)
