"""Where a step's time goes: contiguous stage marks, so stage times add up to the step's, and on
a GPU how much of a step the GPU was busy (docs/metrics.md, "Stage times and GPU busy").

On a CPU the host does the work: each mark reads the monotonic clock, every step.

On CUDA the host only enqueues work, and an event interval between two marks holds whatever the
GPU did then, idle gaps included while it waited for the host to launch the next kernel: in a
launch-bound step those gaps land in whichever stage the host was slow in. So stages are timed
on sampled steps only (every `sample_every`-th), queued ahead: before each stage's work the
timer enqueues a sleep kernel longer than the host takes to launch that stage, so by the time
the GPU reaches the stage every kernel of it is queued and the stage's events hold the GPU's own
time. A stage whose sleep ran out before its last launch is late: that sample is dropped and the
sleeps double. From a sampled step come its stage times (GPU work), its GPU busy time (their
sum) and the host's own time to launch it; the step would have taken the longer of the two, of
which the GPU was busy the first. A host read inside a stage (the sorted kernel's expert counts)
drains the GPU: `read` splits the stage around it, the part before judged on its own, the wait
left out of the host's time, and a fresh sleep queued for the part after. A step replayed as a
CUDA graph (one launch) is timed whole instead: the replay's events are GPU work, against the
step's wall time.

Times are read once the step has ended with its one host sync (the sampled tokens' hand-off),
when every event has completed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from records.engine_telemetry import Stage

log = logging.getLogger(__name__)
T = TypeVar("T")

STAGES = tuple(Stage)
SLEEP_MIN_MS = 0.2  # the shortest sleep queued before a sampled stage
SLEEP_MARGIN = 1.5  # a stage's sleep over the longest host time seen for one stage
SLEEP_MAX_MS = 100.0
LATE_IN_A_ROW = 3  # samples late one after another before sampling stops (a read the timer
#                    does not see, such as the balanced router's, makes every one late)


class Clock:
    """Timestamps for intervals on a device: monotonic ns on CPU, CUDA events on GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def now(self):
        if not self.cuda:
            return time.perf_counter_ns()
        event = torch.cuda.Event(enable_timing=True)
        # the engine's device's stream, not the thread's current device's (cuda:0 by default)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def elapsed_ms(self, start: torch.cuda.Event | int, end: torch.cuda.Event | int) -> float:
        """Call only after the work between start and end has completed (on CUDA)."""
        return start.elapsed_time(end) if self.cuda else (end - start) / 1e6


class NullTimer:
    """Marks nothing: for work whose stages are not timed one by one (a CUDA graph's capture,
    where events cannot be recorded)."""

    def mark(self, stage: str) -> None:
        pass


@dataclass(frozen=True)
class StepTimes:
    """One step's timing. stage_ms: per stage (of GPU work, on CUDA), or None where the step's
    stages were not timed; gpu_busy_ms of gpu_timed_ms: the GPU's work against the time the
    step took, both 0 where not measured (a CPU, an unsampled eager step on CUDA)."""

    stage_ms: dict[str, float] | None
    gpu_busy_ms: float = 0.0
    gpu_timed_ms: float = 0.0


class Sleeper:
    """A GPU sleep of a given length: torch.cuda._sleep spins a number of clock cycles, their
    rate measured once."""

    def __init__(self, device: torch.device):
        self.device = device
        cycles = 1_000_000
        with torch.cuda.device(device):
            torch.cuda._sleep(cycles)  # the first call loads the kernel
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
        self.cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)

    def sleep(self, ms: float) -> None:
        with torch.cuda.device(self.device):
            torch.cuda._sleep(int(ms * self.cycles_per_ms))


@dataclass
class Mark:
    # the stage that ended here; None: the step's beginning, or a host read splitting the stage
    # the next mark names
    stage: str | None
    host_ns: int  # when the host got here
    end: torch.cuda.Event | None = None  # sampled on CUDA: where the stage's work ended
    late: bool = False  # ... and whether its sleep ran out before its last launch
    start: torch.cuda.Event | None = None  # ... where the next stage's work starts
    resume_ns: int = 0  # when the host went on (after a read's wait; else host_ns)

    def __post_init__(self):
        self.resume_ns = self.resume_ns or self.host_ns


class StageTimer:
    """A step's stage marks (begin, mark per stage, end). sample_every: on CUDA, time the stages
    of every n-th step, queued ahead (0: never)."""

    def __init__(self, device: torch.device, sample_every: int = 0):
        self.clock = Clock(device)
        self.cuda = self.clock.cuda
        self.sample_every = sample_every
        self.sampling = not self.cuda  # this step's stages are timed
        self._since = 0  # steps since the last sample
        self._marks: list[Mark] = []
        self._sleeper: Sleeper | None = None
        self._sleep_ms = SLEEP_MIN_MS
        self._late = 0  # samples late in a row
        self._replay: tuple | None = None
        self._begin_ns = 0

    def begin(self) -> None:
        """A step starts. On CUDA, whether its stages are sampled is decided here
        (`sampling`): a step that would replay a graph runs eagerly when it is."""
        self._begin_ns = time.perf_counter_ns()
        self._replay = None
        if self.cuda:
            self._since += 1
            self.sampling = self.sample_every > 0 and self._since >= self.sample_every
            if not self.sampling:
                return
            self._since = 0
            self._sleeper = self._sleeper or Sleeper(self.clock.device)
        self._marks = [Mark(None, self._begin_ns, start=self._ahead())]

    def mark(self, stage: str, last: bool = False) -> None:
        """The time since the previous mark belongs to stage (a stage recurs per layer); last:
        the step's final mark, after its host read (no stage follows)."""
        if not self.sampling:
            return
        mark = Mark(stage, time.perf_counter_ns())
        if self.cuda:
            mark.end = self.clock.now()
            mark.late = self._marks[-1].start.query()
            mark.start = None if last else self._ahead()
        self._marks.append(mark)

    def read(self, fn: Callable[[], T]) -> T:
        """fn(), a read of the device inside a stage: on a sampled CUDA step the stage is split
        around it (its wait is neither GPU work nor the host's launching)."""
        if not (self.sampling and self.cuda):
            return fn()
        split = Mark(None, time.perf_counter_ns(), end=self.clock.now(),
                     late=self._marks[-1].start.query())
        self._marks.append(split)
        out = fn()
        split.resume_ns = time.perf_counter_ns()
        split.start = self._ahead()
        return out

    def replay(self, graph: torch.cuda.CUDAGraph) -> None:
        """Replays a captured graph, timed whole (on CUDA, outside a sampled step)."""
        start = self.clock.now() if self.cuda and not self.sampling else None
        graph.replay()
        if start is not None:
            self._replay = (start, self.clock.now())

    def end(self, last_stage: str | None = None) -> StepTimes:
        """The step's times, its final stage marked first (after the step's host read)."""
        if last_stage is not None:
            self.mark(last_stage, last=True)
        wall_ms = (time.perf_counter_ns() - self._begin_ns) / 1e6
        if self._replay is not None:
            self._replay[1].synchronize()  # done already: the step's read came after it
            return StepTimes(None, self.clock.elapsed_ms(*self._replay), wall_ms)
        if not self.sampling:
            return StepTimes(None)
        intervals = list(zip(self._marks, self._marks[1:], strict=False))
        out = dict.fromkeys(STAGES, 0.0)
        if not self.cuda:
            for begin, mark in intervals:
                out[mark.stage] += (mark.host_ns - begin.host_ns) / 1e6
            return StepTimes(out)
        named = None
        for mark in reversed(self._marks[1:]):  # a read's split belongs to the stage after it
            named = mark.stage = mark.stage or named
        return self._sampled(intervals, out)

    def _ahead(self) -> torch.cuda.Event | None:
        """On CUDA, a sleep queued before the next stage's work, then the event its work starts
        at; nothing on a CPU."""
        if not self.cuda:
            return None
        self._sleeper.sleep(self._sleep_ms)
        return self.clock.now()

    def _sampled(self, intervals: list[tuple[Mark, Mark]], out: dict[str, float]) -> StepTimes:
        """A sampled CUDA step's stage times, or none where a stage was late. The last stage
        holds the step's host read, so its host time is mostly the wait: it is neither judged
        late nor counted as the host's."""
        intervals[-1][1].end.synchronize()
        host_ms = [(mark.host_ns - begin.resume_ns) / 1e6 for begin, mark in intervals[:-1]]
        late = any(mark.late for _, mark in intervals[:-1])
        self._sleep_ms = min(SLEEP_MAX_MS, (2 if late else 1) * max(
            SLEEP_MIN_MS, SLEEP_MARGIN * max(host_ms, default=0.0), self._sleep_ms * late))
        self._late = self._late + 1 if late else 0
        if self._late >= LATE_IN_A_ROW:
            log.warning("stage times: %d sampled steps in a row were late (a stage reads the "
                        "device where the timer cannot see it); no more steps are sampled",
                        self._late)
            self.sample_every = 0
        if late:
            return StepTimes(None)
        for begin, mark in intervals:
            out[mark.stage] += self.clock.elapsed_ms(begin.start, mark.end)
        busy = sum(out.values())
        return StepTimes(out, busy, max(busy, sum(host_ms)))
