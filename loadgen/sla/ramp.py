"""Without --sla-start-rps the SLA search finds its own first rate with a ramp: from
RAMP_FROM requests/s, doubling every RAMP_JUDGEMENTS judgements (2 s) with no pause between
steps, until a step shows trouble (loadgen/sla/watch.py's `trouble`: a claim over its limit at
any count, the requests in flight growing, the load generator behind) or RAMP_STEPS have run.
The first step warms the server: its claims are not looked at. The first probe starts at the
last step that held (RAMP_FROM if none did): below the trouble, where the probes' own judgement
takes over. Doubling to 500 requests/s takes 10 steps, 20 s."""

from __future__ import annotations

import dataclasses
import logging

from loadgen.sla.probes import Sending
from loadgen.sla.watch import ProbeWatch
from records.load_settings import SlaSettings, SloSettings
from records.summary import RampStep

log = logging.getLogger("loadgen")
RAMP_FROM = 1.0  # requests/s
RAMP_JUDGEMENTS = 8  # a step's length: 2 s at the search's JUDGE_S
RAMP_STEPS = 20


def ramp(sending: Sending, sla: SlaSettings, slo: SloSettings) -> tuple[float, list[RampStep]]:
    """The first probe's rate, and the steps that found it."""
    steps: list[RampStep] = []
    rate = RAMP_FROM
    whole = dataclasses.replace(sla, sla_warmup_s=0.0)  # a step judges all its requests
    for step in range(RAMP_STEPS):
        watch = ProbeWatch(rate, whole, slo)
        elapsed = sending.watch(watch, sending.start(rate),
                                lambda _, w=watch: len(w.in_flight) >= RAMP_JUDGEMENTS)
        trouble = watch.trouble(claims=step > 0)
        steps.append(RampStep(rate_rps=rate, trouble=trouble))
        log.info("SLA ramp: %.4g requests/s for %.1f s: %s", rate, elapsed, trouble or "held")
        if trouble:
            break
        rate *= 2
    sending.cut_and_drain()
    held = [s.rate_rps for s in steps if not s.trouble]
    return (held[-1] if held else RAMP_FROM), steps
