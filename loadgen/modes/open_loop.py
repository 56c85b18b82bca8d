"""The open-loop modes beside fixed (loadgen/modes/base.py): mixed, whose requests are drawn
from classes by weight at a rate a profile may shape, and the replay of a trace's own
schedule (--trace), which ends the run once it is sent."""

from __future__ import annotations

from collections.abc import Iterator

from loadgen.modes.base import RunMode, RunView, registered
from loadgen.traffic.traces import read_trace_file, trace_arrivals
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode


@registered(Mode.MIXED)
class Mixed(RunMode):
    @classmethod
    def shape(cls, settings: LoadSettings) -> str:
        w = settings.workload
        return f"request classes {w.classes}" if not w.dataset else super().shape(settings)


class TraceReplay(RunMode):
    """--trace: the trace's own times and lengths, not --rate (its mode is fixed)."""

    def arrivals(self) -> Iterator[tuple[int, float]]:
        return trace_arrivals(self.settings.traffic, self.workers, self.index)

    def schedule_over(self, run: RunView) -> None:
        run.end("the trace is replayed")

    def notes(self) -> tuple[str, ...]:
        traffic = self.settings.traffic
        return read_trace_file(traffic.trace, traffic.trace_format).notes

