"""SLA mode (`--mode sla`): the highest open-loop rate at which every objective holds as a
percentile claim ("TTFT p99 <= --slo-ttft-ms"), each probe judged as MLPerf Inference's server
scenario judges a run (records/early_stopping.py).

The search: a probe at --rate; while every probe passes, the next is --sla-growth times faster,
while every one fails, that much slower (bracketing); then the middle of the highest rate that
passed and the lowest that failed (bisection), until they are within --sla-resolution of each
other. The answer is the highest rate that passed.

A probe sends Poisson arrivals (--arrival) at its rate; its first --sla-warmup-s are not judged.
It is judged every JUDGE_S over the requests scheduled since: those that finished (a failed one
counts over every limit), and those still waiting, at their age so far, where that is already
over a TTFT or E2E limit (a stalled server cannot hide behind requests that have not answered).
After --sla-probe-min-s (a queue's excursions outlast a second: a shorter probe misses them) it
passes once every claim is met and supported by enough requests (MLPerf's early-stopping rule),
and fails once a claim is not met with at least the requests that would support a claim with
none over its limit (459 for p99). It fails at once where more requests are over a limit than
the longest probe could carry at the percentile; not decided after --sla-probe-max-s, it counts
as failed (NOT VALID). Then its arrivals stop, its requests drain, and the next probe starts.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator

import gevent
from gevent.event import Event

from loadgen.recording.timing import stream_timing
from loadgen.traffic.arrivals import gap_s
from records.early_stopping import Judged, judge, validity
from records.load_settings import LoadSettings
from records.summary import SlaProbe, SlaResult

JUDGE_S = 0.25  # how often a probe is judged
DRAIN_S = 30.0  # the longest a probe's requests are waited for after its arrivals stop
MIN_RATE = 0.01  # requests/s: below this no rate meets the objectives
OBJECTIVES = (("TTFT", "ttft_us", "slo_ttft_ms"), ("TPOT", "tpot_us", "slo_tpot_ms"),
              ("E2E", "e2e_us", "slo_e2e_ms"))


class SlaSearch:
    def __init__(self, settings: LoadSettings, run):
        self.settings, self.run = settings, run
        slo = settings.slo
        self.objectives = [(name, key, getattr(slo, limit)) for name, key, limit in OBJECTIVES
                           if getattr(slo, limit) is not None]
        self.percentile = slo.slo_percentile
        self.rate = settings.traffic.rate
        self.passed: float | None = None  # the highest rate that passed
        self.failed: float | None = None  # the lowest rate that failed
        self.probes: list[SlaProbe] = []
        self.stopped_because = ""
        self._probe_from_s = 0.0  # the current probe's start, s from the run's start
        self._cut_s = math.inf  # its arrivals stop here
        self._next = Event()  # set when the next probe may start
        self._results: list = []  # requests of the current probe that finished
        self._first_s: float | None = None
        self._last_s = 0.0

    # --- the schedule ---

    def arrivals(self, seed: int) -> Iterator[tuple[int, float]]:
        """(request index, send time s): each probe's arrivals at its rate, until the watcher
        cuts them; then it waits for the next probe."""
        rng, index, traffic = random.Random(seed), 0, self.settings.traffic
        while True:
            self._next.wait()  # each probe's start, once
            self._next.clear()
            if self.stopped_because:
                return
            t = self._probe_from_s
            while True:
                t += gap_s(rng, self.rate, traffic.arrival, traffic.burstiness)
                if t >= self._cut_s:
                    break
                yield index, t
                index += 1

    def observe(self, result) -> None:
        self._results.append(result)

    # --- the watcher ---

    def now_s(self) -> float:
        return (time.monotonic_ns() - self.run.start_ns) / 1e9

    def watch(self) -> None:
        """Runs beside the dispatch: judges each probe, moves the rate, stops the run."""
        c = self.settings.sla
        while len(self.probes) < c.sla_max_probes:
            probe = self.probe()
            self.probes.append(probe)
            if probe.verdict == "PASS":
                self.passed = max(self.passed or 0.0, probe.rate_rps)
            else:
                self.failed = min(self.failed or math.inf, probe.rate_rps)
            if (reason := self.settled()):
                self.stopped_because = reason
                break
            self.rate = self.next_rate()
        else:
            self.stopped_because = f"no answer within {c.sla_max_probes} probes (--sla-max-probes)"
        self._next.set()
        self.run.request_stop()

    def probe(self) -> SlaProbe:
        c = self.settings.sla
        start_s = self._probe_from_s = self.now_s()
        self._first_s = start_s if self._first_s is None else self._first_s
        self._cut_s, self._results = math.inf, []
        self._next.set()  # the schedule goes on at the new rate
        judged_from_s = start_s + c.sla_warmup_s
        longest = self.rate * c.sla_probe_max_s
        while True:
            gevent.sleep(JUDGE_S)
            claims, failed = self.judge(judged_from_s)
            elapsed = self.now_s() - judged_from_s
            verdict = decide(claims, self.percentile, longest,
                             settled=elapsed >= c.sla_probe_min_s)
            if verdict or elapsed >= c.sla_probe_max_s:
                break
        self._cut_s = self.now_s()  # the schedule's zero is the run's start
        self.drain()
        self._last_s = self.now_s()
        return SlaProbe(rate_rps=self.rate, started_s=start_s, judged_s=elapsed, failed=failed,
                        claims=claims, verdict=verdict or "NOT VALID")

    def drain(self) -> None:
        """Until the probe's requests have ended (or DRAIN_S), so the next probe starts on an
        idle server."""
        deadline = time.monotonic() + DRAIN_S
        while self.run.inflight and time.monotonic() < deadline:
            gevent.sleep(0.05)

    def judge(self, from_s: float) -> tuple[list[Judged], int]:
        start_ns = self.run.start_ns + int(from_s * 1e9)
        mine = [r for r in self._results if r.scheduled_ns >= start_ns]
        failed = sum(not r.ok for r in mine)
        timings = [stream_timing(r.scheduled_ns, r.sent_ns, r.recv_ns, r.tokens)
                   for r in mine if r.ok]
        now_ns = time.monotonic_ns()
        waiting = [r for r in self.run.inflight.values() if r.scheduled_ns >= start_ns]
        claims = []
        for name, key, limit_ms in self.objectives:
            values = [getattr(t, key) / 1000 for t in timings if getattr(t, key) is not None]
            late = 0
            if name in ("TTFT", "E2E"):  # still waiting, already past the limit
                late = sum(1 for r in waiting
                           if (now_ns - r.scheduled_ns) / 1e6 > limit_ms
                           and (name == "E2E" or not r.recv_ns))
            claims.append(judge(name, values, limit_ms, self.percentile, failed + late))
        return claims, failed

    def settled(self) -> str:
        """Why the search is over, or ""."""
        c = self.settings.sla
        if self.passed is not None and self.failed is not None:
            if (self.failed - self.passed) / self.passed <= c.sla_resolution:
                return (f"{self.passed:.4g} requests/s passed and {self.failed:.4g} failed: "
                        f"within {c.sla_resolution:.0%}")
        if self.passed is None and self.rate / c.sla_growth < MIN_RATE:
            return f"no rate down to {MIN_RATE:g} requests/s meets the objectives"
        return ""

    def next_rate(self) -> float:
        growth = self.settings.sla.sla_growth
        if self.failed is None:
            return self.rate * growth
        if self.passed is None:
            return self.rate / growth
        return (self.passed + self.failed) / 2

    def result(self) -> SlaResult:
        return SlaResult(rate_rps=self.passed, failed_rps=self.failed,
                         resolution=self.settings.sla.sla_resolution, probes=list(self.probes),
                         stopped_because=self.stopped_because or "stopped before it settled",
                         search_s=self._last_s - (self._first_s or 0.0))


def decide(claims: list[Judged], percentile: float, longest: float, settled: bool) -> str:
    """PASS, FAIL, or "" (not yet): see the module's docstring. settled: the probe has run its
    shortest length, so its percentile may be judged."""
    if any(c.over > (1 - percentile / 100) * max(longest, 1) for c in claims):
        return "FAIL"  # the longest probe could not bring the percentile under its limit
    if not settled:
        return ""
    if all(c.verdict == "PASS" for c in claims):
        return "PASS"
    least = validity(0, 0, percentile).needed  # the sample that could support any claim
    if any(c.verdict == "FAIL" and c.requests >= least for c in claims):
        return "FAIL"
    return ""
