"""One SLA probe (or ramp step) as its requests come in, and its verdict as they stand
(docs/sla.md, "A probe's verdict").

In order, at each judgement:
- SET ASIDE: the load generator fell behind (more than 1% of the judged requests sent late
  by over LATE_MS, or arrivals due and not sent: the --max-in-flight cap or a sender behind):
  the server was not offered the rate, so nothing is judged.
- FAIL: a claim has more requests over its limit than the longest probe could carry at the
  percentile.
- Before --sla-probe-min-s, nothing else is decided.
- PASS: every claim met and supported (records/slo_judgement.py), and the requests in flight
  settled over the last half of the judged time (loadgen/traffic/settling.py): a queue still
  building is not a load the server holds.
- FAIL: a claim not met by at least the requests that could support any claim (459 at p99).
- NOT VALID: every claim met, but even the rest of the longest probe at this rate could not
  bring the requests that would support them: met so far is not a fail; the search moves up,
  where requests come faster.
- At --sla-probe-max-s: FAIL where a claim is not met or the queue never settled, NOT VALID
  where every claim is met and some unsupported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from loadgen.recording.recorder import LATE_SEND_MS
from loadgen.sla.part import Done, ProbeSample, Waiting
from loadgen.traffic.settling import growing
from records.early_stopping import Judged, Verdict, validity
from records.load_settings import SlaSettings, SloSettings
from records.slo_judgement import StillWaiting, given, judge_objectives, value_text
from records.summary import ProbeVerdict

LATE_SHARE = 0.01  # above this share of its requests sent late, a probe is set aside
LATE_LIMIT_SHARE = 0.1  # late: by more than this share of the tightest limit (or LATE_SEND_MS)
SETTLE_SHARE = 0.05  # in flight growing faster than this share of the rate: not settled
SETTLE_SAMPLES = 4  # in-flight samples a settled queue is judged on, at least


@dataclass
class ProbeWatch:
    rate: float  # requests/s offered
    sla: SlaSettings
    slo: SloSettings
    done: list[Done] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    in_flight: list[tuple[float, int]] = field(default_factory=list)  # (s, its requests)
    unsent: int = 0

    def add(self, sample: ProbeSample, at_s: float) -> None:
        """What the probe's senders said at at_s, s from its start."""
        self.done += sample.done
        self.waiting, self.unsent = sample.waiting, sample.unsent
        self.in_flight.append((at_s, len(sample.waiting)))

    def judged(self) -> tuple[list[Done], list[Waiting]]:
        """Its requests scheduled past the warm-up."""
        w = self.sla.sla_warmup_s
        return ([d for d in self.done if d.since_s >= w],
                [r for r in self.waiting if r.since_s >= w])

    def claims(self) -> tuple[list[Judged], int]:
        done, waiting = self.judged()
        ok = [d for d in done if d.ok]
        values = {key: [v for d in ok if (v := getattr(d, key)) is not None]
                  for key in ("ttft_ms", "tpot_ms", "e2e_ms")}
        failed = len(done) - len(ok)
        return judge_objectives(self.slo, values, failed,
                                [StillWaiting(r.age_ms, r.answered) for r in waiting]), failed

    def send_lag_p99_ms(self) -> float | None:
        done, waiting = self.judged()
        lags = sorted(r.lag_ms for r in [*done, *waiting])
        return lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None

    def behind(self) -> str:
        """Why the load generator did not offer the rate, or ""."""
        done, waiting = self.judged()
        sent = len(done) + len(waiting)
        if self.unsent >= max(2, 0.005 * sent):
            return (f"{self.unsent} arrivals due were not sent (--max-in-flight reached, or the "
                    "sender behind its schedule)")
        limits = [limit for limit in (self.slo.slo_ttft_ms, self.slo.slo_tpot_ms,
                                      self.slo.slo_e2e_ms) if limit is not None]
        bound_ms = max(LATE_SEND_MS, LATE_LIMIT_SHARE * min(limits))
        late = sum(1 for r in [*done, *waiting] if r.lag_ms > bound_ms)
        if late >= max(3, LATE_SHARE * sent):
            return (f"{late} of {sent} requests sent more than {bound_ms:g} ms late (send lag "
                    f"p99 {self.send_lag_p99_ms():.1f} ms)")
        return ""

    def last_half(self, elapsed_s: float) -> list[tuple[float, int]]:
        """The in-flight samples of the last half of the judged time."""
        since = self.sla.sla_warmup_s + elapsed_s / 2
        return [s for s in self.in_flight if s[0] >= since]

    def growth(self, elapsed_s: float) -> float:
        """In flight added over the last half of the judged time, where it has not settled."""
        e2e = sorted(d.e2e_ms for d in self.judged()[0] if d.ok and d.e2e_ms is not None)
        healthy = self.rate * (e2e[len(e2e) // 2] / 1000 if e2e else 0.0) + 1
        return growing(self.last_half(elapsed_s), self.rate, healthy, SETTLE_SHARE)

    def verdict(self, elapsed_s: float) -> tuple[ProbeVerdict | None, str]:
        """Its verdict after elapsed_s judged (past the warm-up), with why; None: not yet."""
        if (why := self.behind()):
            return ProbeVerdict.SET_ASIDE, f"the load generator fell behind: {why}"
        claims, _ = self.claims()
        p, last = self.slo.slo_percentile, elapsed_s >= self.sla.sla_probe_max_s
        carried = (1 - p / 100) * max(self.rate * self.sla.sla_probe_max_s, 1)
        if (over := [c for c in claims if c.over > carried]):
            return ProbeVerdict.FAIL, (f"{claim_text(binding(over))}: more over than the longest "
                                       "probe could carry at the percentile")
        if elapsed_s < self.sla.sla_probe_min_s:
            return None, ""
        if all(c.verdict == Verdict.PASS for c in claims):
            enough = len(self.last_half(elapsed_s)) >= SETTLE_SAMPLES
            if enough and not (growth := self.growth(elapsed_s)):
                return ProbeVerdict.PASS, "every claim met and supported; in flight settled"
            if last:
                return ProbeVerdict.FAIL, (f"in flight still growing (+{growth:.0f} over the "
                                           f"last {elapsed_s / 2:.1f} s): the server does not "
                                           "keep up with the rate" if enough else
                                           "too short to tell whether its queue settled")
            return None, ""
        least = validity(0, 0, p).needed
        failing = [c for c in claims if c.verdict == Verdict.FAIL]
        if failing and (last or any(c.requests >= least for c in failing)):
            return ProbeVerdict.FAIL, claim_text(binding(failing))
        if failing:
            return None, ""
        left_s = self.sla.sla_probe_max_s - elapsed_s
        short = [c for c in claims if c.requests + self.rate * left_s < c.needed]
        if short or last:
            c = (short or claims)[0]
            return ProbeVerdict.NOT_VALID, (
                f"met, but {c.requests} requests of the {c.needed} {c.metric} "
                f"p{c.percentile:g} needs; at {self.rate:.4g} requests/s its longest probe "
                "(--sla-probe-max-s) cannot bring them")
        return None, ""

    def alone(self) -> tuple[int, dict[str, int]]:
        """Its judged requests that had the server to themselves (no other request of the probe
        in flight from their send to their end), and how many of them were over each
        objective's limit."""
        done, waiting = self.judged()
        spans = sorted([(d.since_s, d.since_s + d.e2e_ms / 1000, d) for d in done
                        if d.ok and d.e2e_ms is not None]
                       + [(w.since_s, math.inf, None) for w in waiting], key=lambda s: s[0])
        alone, reach = [], -math.inf  # reach: the latest end of the spans before
        for i, (begin, end, d) in enumerate(spans):
            after = spans[i + 1][0] if i + 1 < len(spans) else math.inf
            if d is not None and begin >= reach and end <= after:
                alone.append(d)
            reach = max(reach, end)
        return len(alone), {o.metric: sum(1 for d in alone if (getattr(d, o.field) or 0) > limit)
                            for o, limit in given(self.slo)}

    def trouble(self, claims: bool = True) -> str:
        """For a ramp step: why the rate is past what the server holds, or the generator can
        send (a claim over its limit at any count, a queue growing, the generator behind);
        "" none seen. claims: False leaves the claims out (a step warming the server)."""
        if (why := self.behind()):
            return f"the load generator fell behind: {why}"
        judged = self.claims()[0] if claims else []
        if (over := [c for c in judged if c.requests and not c.met]):
            return claim_text(binding(over))
        elapsed_s = self.in_flight[-1][0] - self.sla.sla_warmup_s if self.in_flight else 0.0
        if (growth := self.growth(elapsed_s)):
            return f"in flight growing (+{growth:.0f})"
        return ""


def binding(claims: list[Judged]) -> Judged:
    """The claim furthest over its limit (one known only to be over first)."""
    return max(claims, key=lambda c: math.inf if c.value_ms is None else c.value_ms / c.limit_ms)


def claim_text(c: Judged) -> str:
    value = value_text(c.value_ms)
    said = "is over" if value in ("-", "over") else f"{value} >"
    return f"{c.metric} p{c.percentile:g} {said} {c.limit_ms:g} ms ({c.over} of {c.requests} over)"
