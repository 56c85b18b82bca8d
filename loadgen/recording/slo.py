"""Service-level objectives (the --slo-* settings): which per-request latencies a run is judged
by. Goodput counts requests meeting every objective given; the share meeting each is reported
too."""

from __future__ import annotations

from loadgen.recording.timing import StreamTiming
from records.load_settings import SloSettings

# summary.json's name of each objective -> its setting.
OBJECTIVES = {"ttft": "slo_ttft_ms", "tpot": "slo_tpot_ms", "e2e": "slo_e2e_ms"}


def objectives_ms(slo: SloSettings) -> dict[str, float]:
    """The objectives given, by name."""
    return {name: getattr(slo, key) for name, key in OBJECTIVES.items()
            if getattr(slo, key) is not None}


def checks(slo: SloSettings, t: StreamTiming) -> dict[str, bool]:
    """Each objective given, met or not; a one-token request has no TPOT and meets it."""
    values_us = {"ttft": t.ttft_us, "tpot": t.tpot_us, "e2e": t.e2e_us}
    return {name: values_us[name] is None or values_us[name] <= ms * 1000
            for name, ms in objectives_ms(slo).items()}


def met(slo: SloSettings, t: StreamTiming) -> bool:
    return all(checks(slo, t).values())
