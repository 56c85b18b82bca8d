"""SLA mode (`--mode sla`, docs/sla.md): the highest open-loop rate at which every objective
holds as a percentile claim ("TTFT p99 <= --slo-ttft-ms"), each probe judged as MLPerf
Inference's server scenario judges a run, in a settled queue, with the load generator keeping
its schedule (loadgen/sla/watch.py).

The first probe runs at --sla-start-rps, or where a short ramp found trouble begins
(loadgen/sla/ramp.py). Then, while no probe has failed, each is --sla-growth times faster;
while none has held, that much slower; then the middle of the highest rate that held and the
lowest that failed (bisection), until they are within --sla-resolution of each other. A probe
held when it passed, or when its claims were met by too few requests to support them (NOT
VALID: not a fail; faster rates bring requests sooner). The answer is the highest rate that
passed.

A probe the load generator fell behind in is set aside and run again once; set aside twice,
the search stops: the generator is the limit there, and the answer is NO ANSWER (the server
held what passed; its own limit is not known). The search stops without an answer too where
no rate has held and a failing probe's requests that had the server to themselves were over a
limit more often than the percentile allows (it fails without load: a slower rate cannot
help), below MIN_RATE, or after --sla-max-probes. With --sla-confirm N, the rate found is
probed N times more, each judged alike: the answer is confirmed when every one passes.

The search only decides; the requests are sent by a `Probes` (one process: the run itself;
distributed: the workers, loadgen/sla/remote.py).
"""

from __future__ import annotations

import logging
import math

from loadgen.sla.probes import NotStarted, Probes, Sending
from loadgen.sla.ramp import ramp
from loadgen.sla.watch import ProbeWatch, binding
from records.load_settings import LoadSettings
from records.slo_judgement import value_text
from records.summary import ProbeVerdict, RampStep, SlaProbe, SlaResult

log = logging.getLogger("loadgen")
MIN_RATE = 0.01  # requests/s: below this no rate meets the objectives
CLIFF = 2.0  # the binding figure more than doubling between the bounds: a cliff


class SlaSearch:
    def __init__(self, settings: LoadSettings, probes: Probes, sending: Sending | None = None):
        """sending: how the probes are started and watched (a test's keeps time of its own)."""
        self.settings, self.probes = settings, probes
        self.sending = sending or Sending(probes)
        self.rate = settings.sla.sla_start_rps
        self.passed: float | None = None  # the highest rate that passed
        self.held: float | None = None  # the highest that passed or was NOT VALID
        self.failed: float | None = None  # the lowest rate that failed
        self.probes_run: list[SlaProbe] = []
        self.confirmations: list[SlaProbe] = []  # --sla-confirm's, at the rate found
        self.ramp_steps: list[RampStep] = []
        self.stopped_because = ""
        self.generator_limited: float | None = None
        self.alone = 0  # the probes' requests that had the server to themselves
        self.alone_over: dict[str, int] = {}  # of those, how many were over each limit
        self._last_s = 0.0  # the search's last verdict (confirmations apart)

    def watch(self) -> None:
        """Runs beside the sending: judges each probe, moves the rate, ends the run."""
        try:
            self.search()
        except NotStarted as e:
            self.stopped_because = f"no probe could start: {e}"
        self.probes.end()

    def search(self) -> None:
        c = self.settings.sla
        if not self.rate:
            self.rate, self.ramp_steps = ramp(self.sending, c, self.settings.slo)
        while len(self.probes_run) < c.sla_max_probes:
            probe = self.probe_twice(self.probes_run, "probe")
            self._last_s = self.sending.now_s()
            if probe.verdict == ProbeVerdict.SET_ASIDE:
                self.generator_limited = probe.rate_rps
                more = ("raise --max-in-flight, or add sending processes (--processes N)"
                        if probe.unsent else "add sending processes (--processes N), workers, "
                        "or cores")
                held = (f"the server held {self.passed:.4g} requests/s, its limit above that not "
                        "known" if self.passed else "the server's limit not known")
                self.stopped_because = (
                    f"the load generator could not offer {probe.rate_rps:.4g} requests/s "
                    f"({probe.why}); {held}: {more}")
                break
            self.count(probe)
            if (reason := self.settled()):
                self.stopped_because = reason
                break
            self.rate = self.next_rate()
        else:
            self.stopped_because = f"no answer within {c.sla_max_probes} probes (--sla-max-probes)"
        if self.passed is not None and self.generator_limited is None:
            self.rate = self.passed
            for _ in range(c.sla_confirm):
                self.probe_twice(self.confirmations, "confirming probe")

    def probe_twice(self, runs: list[SlaProbe], kind: str) -> SlaProbe:
        """A probe at the current rate, added to runs and said as kind; run again once where
        it was set aside."""
        for _ in range(2):
            probe = self.probe()
            runs.append(probe)
            say(kind, len(runs), probe)
            if probe.verdict != ProbeVerdict.SET_ASIDE:
                break
        return probe

    def probe(self) -> SlaProbe:
        watch = ProbeWatch(self.rate, self.settings.sla, self.settings.slo)
        start_s = self.sending.start(self.rate)
        decided = []

        def until(elapsed: float) -> bool:
            decided[:] = watch.verdict(elapsed)
            return decided[0] is not None

        elapsed = self.sending.watch(watch, start_s, until)
        claims, failed = watch.claims()
        probe = SlaProbe(rate_rps=self.rate, started_s=start_s, judged_s=elapsed, failed=failed,
                         claims=claims, verdict=decided[0], why=decided[1],
                         growth=watch.growth(elapsed), send_lag_p99_ms=watch.send_lag_p99_ms(),
                         unsent=watch.unsent)
        self.sending.cut_and_drain()
        if probe.verdict != ProbeVerdict.SET_ASIDE:
            self.count_alone(watch, start_s)
        return probe

    def count_alone(self, watch: ProbeWatch, start_s: float) -> None:
        """Adds a drained probe's requests that had the server to themselves (those that
        ended after its verdict too) to the search's count."""
        watch.add(self.probes.collect(), self.sending.now_s() - start_s)
        alone, over = watch.alone()
        self.alone += alone
        self.alone_over = {m: self.alone_over.get(m, 0) + n for m, n in over.items()}

    def count(self, probe: SlaProbe) -> None:
        if probe.verdict == ProbeVerdict.PASS:
            self.passed = max(self.passed or 0.0, probe.rate_rps)
        if probe.verdict in (ProbeVerdict.PASS, ProbeVerdict.NOT_VALID):
            self.held = max(self.held or 0.0, probe.rate_rps)
        else:
            self.failed = min(self.failed or math.inf, probe.rate_rps)

    def settled(self) -> str:
        """Why the search is over, or ""."""
        c = self.settings.sla
        if self.held is not None and self.failed is not None:
            if (self.failed - self.held) / self.held <= c.sla_resolution:
                if self.passed is None or self.passed < self.held:
                    return (f"{self.held:.4g} requests/s met the objectives but too few requests "
                            f"supported them, and {self.failed:.4g} failed: raise "
                            "--sla-probe-max-s, or claim a lower --slo-percentile")
                return (f"{self.passed:.4g} requests/s passed and {self.failed:.4g} failed: "
                        f"within {c.sla_resolution:.0%}")
        if self.held is None:
            if (why := self.fails_alone()):
                return why
            if self.rate / c.sla_growth < MIN_RATE:
                return f"no rate down to {MIN_RATE:g} requests/s meets the objectives"
        return ""

    def fails_alone(self) -> str:
        """Why no rate can meet an objective: more of the probes' requests that had the server
        to themselves were over its limit than the percentile allows, two at least; or ""."""
        allowed = 1 - self.settings.slo.slo_percentile / 100
        for metric, over in self.alone_over.items():
            if over >= 2 and over > allowed * self.alone:
                return (f"{over} of the {self.alone} requests that had the server to "
                        f"themselves were over the {metric} limit: it fails without load; no "
                        "rate meets the objectives")
        return ""

    def next_rate(self) -> float:
        growth = self.settings.sla.sla_growth
        if self.failed is None:
            return self.rate * growth
        if self.held is None:
            return self.rate / growth
        return (self.held + self.failed) / 2

    def result(self) -> SlaResult:
        return SlaResult(rate_rps=self.passed, failed_rps=self.failed,
                         resolution=self.settings.sla.sla_resolution,
                         probes=list(self.probes_run), confirmations=list(self.confirmations),
                         stopped_because=self.stopped_because or "stopped before it settled",
                         search_s=self._last_s, ramp=list(self.ramp_steps),
                         binding=self.binding(), fall=self.fall(),
                         generator_limited_rps=self.generator_limited)

    def bounds(self) -> tuple[SlaProbe | None, SlaProbe | None]:
        """The probes at the highest passing and the lowest failing rate."""
        probes = self.probes_run
        return (next((p for p in probes if p.rate_rps == self.passed
                      and p.verdict == ProbeVerdict.PASS), None),
                next((p for p in probes if p.rate_rps == self.failed
                      and p.verdict == ProbeVerdict.FAIL), None))

    def binding(self) -> str:
        _, failed = self.bounds()
        if failed is None:
            return ""
        over = [c for c in failed.claims if not c.met]
        if not over:
            return "throughput"
        c = binding(over)
        return f"{c.metric} p{c.percentile:g}"

    def fall(self) -> str:
        passed, failed = self.bounds()
        if passed is None or failed is None:
            return ""
        over = [c for c in failed.claims if not c.met]
        if not over:
            return "cliff"  # the queue stopped settling
        after = binding(over)
        before = next(c for c in passed.claims if c.metric == after.metric)
        if after.value_ms is None or before.value_ms is None:
            return "cliff"
        return "cliff" if after.value_ms > CLIFF * before.value_ms else "slope"


def say(kind: str, number: int, probe: SlaProbe) -> None:
    """A probe's verdict in one console line as it is judged: its rate, each claim over its
    requests, the verdict and why."""
    claims = "; ".join(
        f"{c.metric} p{c.percentile:g} {value_text(c.value_ms)} <= {c.limit_ms:g} ms "
        f"{c.verdict} ({c.requests} requests, {c.over} over, {c.needed} needed)"
        for c in probe.claims)
    log.info("SLA %s %d: %.4g requests/s for %.1f s: %s: %s (%s)", kind, number, probe.rate_rps,
             probe.judged_s, claims, probe.verdict, probe.why)
