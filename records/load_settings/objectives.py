"""What a run is judged by: the objectives, and the searches for the load that holds them
(stress steps, the SLA search)."""

from __future__ import annotations

from dataclasses import dataclass

from records.checks import above, at_least, open_percentile
from records.declare import Settings, setting
from records.load_settings.choices import (
    SLA,
    STRESS,
)


@dataclass(frozen=True)
class StressSettings(Settings):
    """Stress mode"""

    rate_start: float = setting(0.0, "stress: the first step's requests/s; 0 = --rate",
                                check=at_least(0, note=" (0 = --rate)"), compared=False,
                                label="First step's rate (requests/s; 0: the offered rate)",
                                when=STRESS)
    rate_step: float = setting(0.0, "stress: requests/s added each step", check=at_least(0),
                               compared=False,
                               label="Rate added each step (requests/s)", when=STRESS)
    rate_mult: float = setting(0.0, "stress: or multiply the rate by this each step",
                               check=at_least(0), compared=False,
                               label="Or rate multiplied each step by", when=STRESS)
    step_s: float = setting(10.0, "stress: seconds per step", check=above(0), compared=False,
                            label="Seconds per step", when=STRESS)
    max_steps: int = setting(20, "stress: most steps before giving up", check=at_least(1),
                             compared=False,
                             label="Most steps", when=STRESS)
    saturation_share: float = setting(0.9, "stress: a step whose achieved rate is below this share "
                                      "of the offered rate saturated",
                                      check=lambda v: None if 0 < v <= 1 else
                                      f"must be in (0, 1], got {v}", compared=False,
                                      label="Saturated below this share of the offered rate",
                                      when=STRESS)


@dataclass(frozen=True)
class SlaSettings(Settings):
    """SLA search"""

    sla_start_rps: float = setting(0.0, "sla: the first probe's requests/s; 0: found by a short "
                                   "ramp (from 1 request/s, doubling every 2 s until the "
                                   "objectives or the queue give way)",
                                   check=at_least(0, note=" (0: a ramp finds it)"),
                                   compared=False,
                                   label="First probe's rate (requests/s; 0: a ramp finds it)",
                                   when=SLA)
    sla_resolution: float = setting(0.05, "sla: stop when the highest rate that passed and the "
                                    "lowest that failed are this close (a share of the former)",
                                    check=lambda v: None if 0 < v < 1 else
                                    f"must be in (0, 1), got {v}", compared=False,
                                    label="Resolution (share of the rate)", when=SLA)
    sla_growth: float = setting(2.0, "sla: while bracketing, the rate is multiplied (or "
                                "divided) by this from --rate", check=above(1), compared=False,
                                label="Bracketing factor", when=SLA)
    sla_warmup_s: float = setting(1.0, "sla: each probe's first seconds are sent, not judged",
                                  check=at_least(0), compared=False,
                                  label="Probe warm-up (s)", when=SLA)
    sla_probe_min_s: float = setting(30.0, "sla: a probe is judged for at least this long (past "
                                     "its warm-up) before it passes or fails on its percentile: "
                                     "near capacity a queue's excursions last seconds, and a "
                                     "short probe that missed them passes a rate a long run "
                                     "fails (docs/sla.md)", check=above(0), compared=False,
                                     label="Shortest probe (s)", when=SLA)
    sla_probe_max_s: float = setting(120.0, "sla: the longest probe: one whose claims are met "
                                     "but lack the requests to support them by then (or sooner, "
                                     "when its rate cannot bring them by then) is NOT VALID, and "
                                     "the search moves up; one whose queue has not settled by "
                                     "then fails",
                                     check=above(0), compared=False,
                                     label="Longest probe (s)", when=SLA)
    sla_max_probes: int = setting(16, "sla: most probes before giving up", check=at_least(2),
                                  compared=False, label="Most probes", when=SLA)
    sla_confirm: int = setting(0, "sla: probes repeated at the rate found, each judged as the "
                               "search's: the answer is confirmed when every one passes, and "
                               "the report gives each percentile's interval over them",
                               check=at_least(0), compared=False, label="Confirming probes",
                               when=SLA)


@dataclass(frozen=True)
class SloSettings(Settings):
    """Service-level objectives"""

    slo_ttft_ms: float | None = setting(None, "TTFT objective: goodput counts requests meeting "
                                        "every objective given; the share meeting each is in "
                                        "summary.json (slo) and on the console", check=above(0),
                                        compared=False,
                                        label="TTFT objective (ms)")
    slo_tpot_ms: float | None = setting(None, "TPOT objective for goodput", check=above(0),
                                        compared=False,
                                        label="TPOT objective (ms)")
    slo_e2e_ms: float | None = setting(None, "end-to-end latency objective for goodput",
                                       check=above(0), compared=False,
                                       label="End-to-end objective (ms)")
    slo_percentile: float = setting(99.0, "the percentile each objective is a claim on (p99 "
                                    "TTFT <= --slo-ttft-ms): the report judges it as MLPerf's "
                                    "server scenario does, met and supported by enough "
                                    "requests (PASS), not met (FAIL) or too few requests (NOT "
                                    "VALID)", check=open_percentile, compared=False,
                                    label="Objective percentile")
