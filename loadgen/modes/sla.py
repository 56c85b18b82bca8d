"""--mode sla (docs/sla.md): this process's part of the SLA search's probes
(loadgen/sla/part.py), started and cut by the search, which the listener runs where this
process decides (one process, or a distributed run's master: loadgen/sla/)."""

from __future__ import annotations

from collections.abc import Iterator

from loadgen.modes.base import RunMode, RunView, registered
from loadgen.sla.part import ProbePart
from loadgen.targets.client import StreamResult
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode


@registered(Mode.SLA)
class SlaSearched(RunMode):
    searched = True

    def __init__(self, settings: LoadSettings, workers: int = 1, index: int = 0):
        super().__init__(settings, workers, index)
        self.part = ProbePart(settings.traffic, workers, index)

    def arrivals(self) -> Iterator[tuple[int, float]]:
        return self.part.arrivals()

    def begin(self, run: RunView) -> None:
        self.part.begin(run.start_ns)

    def observe(self, result: StreamResult) -> None:
        self.part.observe(result)

    @classmethod
    def describe(cls, settings: LoadSettings, workers: int) -> str:
        start = settings.sla.sla_start_rps
        first = f"from {start:.4g} requests/s" if start else "from where a short ramp finds trouble"
        return (f"SLA search {first} ({settings.traffic.arrival}, "
                f"{workers} sending process{'es' if workers > 1 else ''}), "
                f"{cls.shape(settings)}")

    def stop(self) -> None:
        self.part.end()  # no probe follows: its schedule ends
