"""What a mode is to a run (loadgen/run.py): one class, registered under its `Mode` (the enum of
records/load_settings/choices.py). The run knows this protocol, not the modes.

A mode gives the process's arrivals (request index, s from time zero); is told time zero, each
result and the stop; builds and sends what an arrival sends (a request; a session in sessions
mode); says what to do when its schedule is over; and adds to the summary and the run
directory. `RunMode` itself is the fixed mode: Poisson (or --arrival) arrivals at --rate,
open loop. docs/design.md, "Adding a mode", says how to add one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import ClassVar, Protocol

import gevent

from loadgen.recording.recorder import Recorder
from loadgen.targets.client import StreamResult
from loadgen.targets.target import RequestSpec
from loadgen.targets.text_tokens import TextCounter
from loadgen.traffic.profiles import schedule_of
from loadgen.traffic.workload import Workload
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode
from records.summary import Summary


class RunView(Protocol):
    """What a mode uses of the run it is part of (loadgen/run.py's Run)."""

    workload: Workload
    recorder: Recorder
    count: TextCounter

    @property
    def start_ns(self) -> int: ...

    @property
    def stop_ns(self) -> int | None: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def inflight(self) -> Mapping[object, StreamResult]: ...

    def begin(self) -> None: ...

    def dispatch(self, conn) -> None: ...

    def send_request(self, conn, spec: RequestSpec,
                     due_ns: int) -> tuple[gevent.Greenlet, StreamResult]: ...

    def end(self, why: str) -> None: ...

    def request_stop(self) -> None: ...


REGISTRY: dict[Mode, type[RunMode]] = {}


def registered(mode: Mode) -> Callable[[type[RunMode]], type[RunMode]]:
    """Class decorator: the class runs --mode `mode`."""

    def register(cls: type[RunMode]) -> type[RunMode]:
        cls.name = mode
        REGISTRY[mode] = cls
        return cls

    return register


class RunMode:
    name: ClassVar[Mode] = Mode.FIXED
    # why it runs in one process only (a distributed master refuses it), or ""
    one_process: ClassVar[str] = ""
    # a search decides its rates from the results (the SLA search): the listener runs it
    searched: ClassVar[bool] = False

    def __init__(self, settings: LoadSettings, workers: int = 1, index: int = 0):
        """workers, index: this process's place among the sending processes."""
        self.settings, self.workers, self.index = settings, workers, index

    def arrivals(self) -> Iterator[tuple[int, float]]:
        """This process's arrivals: (run-wide request index, send time s from time zero)."""
        return schedule_of(self.settings.traffic, self.workers, self.index)

    def begin(self, run: RunView) -> None:
        """Time zero of the schedule."""

    def user(self, run: RunView, conn) -> None:
        """What each Locust user does: dispatch the shared schedule."""
        run.dispatch(conn)

    def build(self, run: RunView, index: int) -> object:
        """What arrival `index` sends, built before its time."""
        return run.workload.request(index)

    def send(self, run: RunView, conn, built: object, due_ns: int) -> None:
        """Sends it now, in a greenlet of the run's."""
        run.send_request(conn, built, due_ns)

    def schedule_over(self, run: RunView) -> None:
        """Every arrival is sent or counted: the run goes on until stopped."""

    def observe(self, result: StreamResult) -> None:
        """A request of the run ended (once, whatever its status)."""

    def stop(self) -> None:
        """The run stopped: no arrival follows."""

    def drained(self) -> None:
        """The requests in flight are waited for: what the mode still runs ends now."""

    def summary(self, summary: Summary) -> Summary:
        """What the mode adds to the run's summary."""
        return summary

    def written(self, run_dir: Path) -> None:
        """The run directory is written: what the mode adds to it."""

    def notes(self) -> tuple[str, ...]:
        """What the run's figures rest on that comes from the mode."""
        return ()

    @classmethod
    def shape(cls, settings: LoadSettings) -> str:
        """What each request is, in words."""
        w = settings.workload
        prompt = (f"{w.prompt_tokens}-{w.prompt_tokens_max}" if w.prompt_tokens_max
                  else str(w.prompt_tokens))
        return (f"dataset {w.dataset}" if w.dataset
                else f"{prompt} prompt + {w.max_tokens} output tokens")

    @classmethod
    def describe(cls, settings: LoadSettings, workers: int) -> str:
        """The offered load in a line for the log (a worker's share of the rate where there
        are several)."""
        t = settings.traffic
        unit = Mode(t.mode).rate_unit
        rate = (f"{t.rate / workers:.3g} of {t.rate:.3g} {unit}" if workers > 1
                else f"{t.rate:.3g} {unit}")
        return f"open loop: {rate} ({t.arrival}), {cls.shape(settings)}"

registered(Mode.FIXED)(RunMode)

