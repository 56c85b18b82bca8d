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
With --sla-confirm N, the rate found is probed N times more, each judged alike: the answer is
confirmed when every one passes.

The search only decides; the requests are sent by a `Probes` (one process: the run itself,
loadgen/sla/part.py; distributed: the workers, loadgen/sla/remote.py).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Protocol

import gevent

from loadgen.sla.part import Done, ProbePart, Waiting
from records.early_stopping import Judged, Verdict, judge, validity
from records.load_settings import LoadSettings
from records.summary import SlaProbe, SlaResult

log = logging.getLogger("loadgen")
JUDGE_S = 0.25  # how often a probe is judged
DRAIN_S = 30.0  # the longest a probe's requests are waited for after its arrivals stop
READY_S = 60.0  # the longest the first probe waits for the sending to begin
MIN_RATE = 0.01  # requests/s: below this no rate meets the objectives
OBJECTIVES = (("TTFT", "ttft_ms", "slo_ttft_ms"), ("TPOT", "tpot_ms", "slo_tpot_ms"),
              ("E2E", "e2e_ms", "slo_e2e_ms"))


class NotStarted(Exception):
    """A probe could not start: the sending never began."""


class Probes(Protocol):
    """What sends the search's probes."""

    def start(self, probe: int, rate: float) -> str:
        """Probe `probe` starts now at `rate` requests/s; or why it cannot."""

    def collect(self) -> tuple[list[Done], list[Waiting]]:
        """The current probe's requests that ended since the last call, and those in flight."""

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
        if not self.part.begun.wait(READY_S):
            return f"the schedule did not begin within {READY_S:g} s"
        self.part.start(probe, rate)
        return ""

    def collect(self) -> tuple[list[Done], list[Waiting]]:
        sample = self.part.sample(self.inflight.values())
        return sample.done, sample.waiting

    def cut(self) -> None:
        self.part.stop_arrivals()

    def drained(self) -> bool:
        return not self.inflight

    def end(self) -> None:
        self.part.end()
        self.request_stop()


class SlaSearch:
    def __init__(self, settings: LoadSettings, probes: Probes, judge_s: float = JUDGE_S):
        """judge_s: how often a probe is judged (a test's fake Probes answers at once)."""
        self.settings, self.probes, self.judge_s = settings, probes, judge_s
        slo = settings.slo
        self.objectives = [(name, key, getattr(slo, limit)) for name, key, limit in OBJECTIVES
                           if getattr(slo, limit) is not None]
        self.percentile = slo.slo_percentile
        self.rate = settings.traffic.rate
        self.passed: float | None = None  # the highest rate that passed
        self.failed: float | None = None  # the lowest rate that failed
        self.probes_run: list[SlaProbe] = []
        self.confirmations: list[SlaProbe] = []  # --sla-confirm's, at the rate found
        self.stopped_because = ""
        self._zero = time.monotonic()  # the first probe's start, once there is one
        self._last_s = 0.0  # the search's last verdict (confirmations apart)

    def now_s(self) -> float:
        return time.monotonic() - self._zero

    def watch(self) -> None:
        """Runs beside the sending: judges each probe, moves the rate, ends the run."""
        try:
            self.search()
        except NotStarted as e:
            self.stopped_because = f"no probe could start: {e}"
        self.probes.end()

    def search(self) -> None:
        c = self.settings.sla
        while len(self.probes_run) < c.sla_max_probes:
            probe = self.probe()
            self.probes_run.append(probe)
            say("probe", len(self.probes_run), probe)
            self._last_s = self.now_s()
            if probe.verdict == Verdict.PASS:
                self.passed = max(self.passed or 0.0, probe.rate_rps)
            else:
                self.failed = min(self.failed or math.inf, probe.rate_rps)
            if (reason := self.settled()):
                self.stopped_because = reason
                break
            self.rate = self.next_rate()
        else:
            self.stopped_because = f"no answer within {c.sla_max_probes} probes (--sla-max-probes)"
        if self.passed is not None:
            self.rate = self.passed
            for _ in range(c.sla_confirm):
                self.confirmations.append(self.probe())
                say("confirming probe", len(self.confirmations), self.confirmations[-1])

    def probe(self) -> SlaProbe:
        c = self.settings.sla
        number = len(self.probes_run) + len(self.confirmations)
        if (problem := self.probes.start(number, self.rate)):
            raise NotStarted(problem)
        if number == 0:  # times are from here
            self._zero = time.monotonic()
        start_s = self.now_s()
        done: list[Done] = []
        longest = self.rate * c.sla_probe_max_s
        while True:
            gevent.sleep(self.judge_s)
            new, waiting = self.probes.collect()
            done += new
            claims, failed = self.judge(done, waiting)
            elapsed = self.now_s() - start_s - c.sla_warmup_s
            verdict = decide(claims, self.percentile, longest,
                             settled=elapsed >= c.sla_probe_min_s)
            if verdict or elapsed >= c.sla_probe_max_s:
                break
        self.probes.cut()
        self.drain()
        return SlaProbe(rate_rps=self.rate, started_s=start_s, judged_s=elapsed, failed=failed,
                        claims=claims, verdict=verdict or Verdict.NOT_VALID)

    def drain(self) -> None:
        """Until the probe's requests have ended (or DRAIN_S), so the next probe starts on an
        idle server."""
        deadline = time.monotonic() + DRAIN_S
        while not self.probes.drained() and time.monotonic() < deadline:
            gevent.sleep(0.05)

    def judge(self, done: list[Done], waiting: list[Waiting]) -> tuple[list[Judged], int]:
        """Each objective's claim over the requests scheduled past the probe's warm-up: those
        that ended (a failed one over every limit), and those still waiting whose age is
        already over a TTFT or E2E limit."""
        warmup_s = self.settings.sla.sla_warmup_s
        mine = [d for d in done if d.since_s >= warmup_s]
        waiting = [w for w in waiting if w.since_s >= warmup_s]
        failed = sum(not d.ok for d in mine)
        claims = []
        for name, key, limit_ms in self.objectives:
            values = [getattr(d, key) for d in mine if d.ok and getattr(d, key) is not None]
            late = 0
            if name in ("TTFT", "E2E"):  # still waiting, already past the limit
                late = sum(1 for w in waiting
                           if w.age_ms > limit_ms and (name == "E2E" or not w.answered))
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
                         resolution=self.settings.sla.sla_resolution,
                         probes=list(self.probes_run), confirmations=list(self.confirmations),
                         stopped_because=self.stopped_because or "stopped before it settled",
                         search_s=self._last_s)


def say(kind: str, number: int, probe: SlaProbe) -> None:
    """A probe's verdict in one console line as it is judged: its rate, each claim over its
    requests, the verdict."""
    claims = "; ".join(
        f"{c.metric} p{c.percentile:g} "
        f"{'-' if c.value_ms is None else f'{c.value_ms:.1f}'} ms <= {c.limit_ms:g} ms "
        f"{c.verdict} ({c.requests} requests, {c.over} over, {c.needed} needed)"
        for c in probe.claims)
    log.info("SLA %s %d: %.4g requests/s for %.1f s: %s: %s", kind, number, probe.rate_rps,
             probe.judged_s, claims, probe.verdict)


def decide(claims: list[Judged], percentile: float, longest: float,
           settled: bool) -> Verdict | None:
    """PASS, FAIL, or None (not yet): see the module's docstring. settled: the probe has run its
    shortest length, so its percentile may be judged."""
    if any(c.over > (1 - percentile / 100) * max(longest, 1) for c in claims):
        return Verdict.FAIL  # the longest probe could not bring the percentile under its limit
    if not settled:
        return None
    if all(c.verdict == Verdict.PASS for c in claims):
        return Verdict.PASS
    least = validity(0, 0, percentile).needed  # the sample that could support any claim
    if any(c.verdict == Verdict.FAIL and c.requests >= least for c in claims):
        return Verdict.FAIL
    return None
