"""Where a step's time goes (seed 3.2): contiguous stage marks, so stage times add up to
the step time.

On a CPU each mark reads the monotonic clock. On CUDA each mark records an event on the
engine's device's current stream and nothing waits for it; the times are read once the step has
ended with its one host sync (the sampled tokens' hand-off), when every event has completed.
"""

from __future__ import annotations

import time

import torch

STAGES = ("preprocess", "attention", "routing", "dispatch", "expert_compute", "combine", "decode")


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

    def elapsed_ms(self, start, end) -> float:
        """Call only after the work between start and end has completed (on CUDA)."""
        return start.elapsed_time(end) if self.cuda else (end - start) / 1e6


class StageTimer:
    def __init__(self, device: torch.device):
        self.clock = Clock(device)
        self._marks: list = []

    def begin(self) -> None:
        self._marks = [(None, self.clock.now())]

    def mark(self, stage: str) -> None:
        """The time since the previous mark belongs to stage (a stage recurs per layer)."""
        self._marks.append((stage, self.clock.now()))

    def end(self) -> dict[str, float]:
        """Milliseconds per stage for the step; call after the step's host sync."""
        if self.clock.cuda:
            # the last mark came after the sync: already (or nearly) done
            self._marks[-1][1].synchronize()
        out = dict.fromkeys(STAGES, 0.0)
        for (_, start), (stage, stop) in zip(self._marks, self._marks[1:], strict=False):
            out[stage] += self.clock.elapsed_ms(start, stop)
        return out
