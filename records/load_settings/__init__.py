"""The load generator's settings (`locust -f loadgen/moe.py`), declared once: Locust's options,
the checks, summary.json's `config` and the comparison's workload warnings come from here
(records/declare.py). The formats the load generator parses itself (request classes, rate
profiles, datasets) are checked by it (loadgen/settings.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from records.declare import Settings, group, require
from records.load_settings.choices import AIO_MODES, Mode
from records.load_settings.objectives import SlaSettings, SloSettings, StressSettings
from records.load_settings.sender import RecordingSettings, SenderSettings
from records.load_settings.target import TargetSettings
from records.load_settings.traffic import TrafficSettings, WorkloadSettings

DEFAULT_RATE = next(f.default for f in fields(TrafficSettings) if f.name == "rate")

__all__ = ["LoadSettings", "RecordingSettings", "SenderSettings", "SlaSettings", "SloSettings",
           "StressSettings", "TargetSettings", "TrafficSettings", "WorkloadSettings"]


@dataclass(frozen=True)
class LoadSettings(Settings):
    target: TargetSettings = group(TargetSettings)
    traffic: TrafficSettings = group(TrafficSettings)
    workload: WorkloadSettings = group(WorkloadSettings)
    stress: StressSettings = group(StressSettings)
    sla: SlaSettings = group(SlaSettings)
    slo: SloSettings = group(SloSettings)
    sender: SenderSettings = group(SenderSettings)
    recording: RecordingSettings = group(RecordingSettings)

    def __post_init__(self):
        super().__post_init__()
        mode = self.traffic.mode
        require(mode != Mode.STRESS or self.stress.rate_step > 0 or self.stress.rate_mult > 1,
                "rate-step", "stress mode needs --rate-step above 0 or --rate-mult above 1 "
                "(the rate starts at --rate)")
        require(not self.traffic.profile or mode == Mode.MIXED, "rate-profile",
                "is for --mode mixed")
        require(mode != Mode.SLA or any(v is not None for v in (
            self.slo.slo_ttft_ms, self.slo.slo_tpot_ms, self.slo.slo_e2e_ms)), "mode",
            "sla searches the highest rate meeting the objectives: give --slo-ttft-ms, "
            "--slo-tpot-ms or --slo-e2e-ms")
        require(mode != Mode.SLA or self.traffic.rate == DEFAULT_RATE, "rate",
                "--mode sla chooses its own rates: give its first with --sla-start-rps, or "
                "nothing (a short ramp finds it)")
        require(not self.traffic.trace or mode == Mode.FIXED, "trace",
                f"replays the trace's own schedule, open loop: drop --mode {mode}")
        require(self.sender.client != "aio" or mode in AIO_MODES, "client",
                f"aio sends the {', '.join(AIO_MODES)} modes' schedules only: use it with one "
                "of them, or leave --client auto")

    @property
    def client(self) -> str:
        """The sender this run uses: --client, with auto resolved by the mode."""
        if self.sender.client != "auto":
            return self.sender.client
        return "aio" if Mode(self.traffic.mode).aio else "gevent"
