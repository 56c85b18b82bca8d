"""Service-level objectives: which per-request latencies a run is judged by. Goodput counts
requests meeting every objective given; the share meeting each is reported too."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.timing import StreamTiming


@dataclass(frozen=True)
class Slo:
    ttft: float | None = None  # ms
    tpot: float | None = None  # ms
    e2e: float | None = None  # ms

    def checks(self, t: StreamTiming) -> dict[str, bool]:
        """Each objective given, met or not; a one-token request has no TPOT and meets it."""
        out = {}
        if self.ttft is not None:
            out["ttft"] = t.ttft_us <= self.ttft * 1000
        if self.tpot is not None:
            out["tpot"] = t.tpot_us is None or t.tpot_us <= self.tpot * 1000
        if self.e2e is not None:
            out["e2e"] = t.e2e_us <= self.e2e * 1000
        return out

    def met(self, t: StreamTiming) -> bool:
        return all(self.checks(t).values())
