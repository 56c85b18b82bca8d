"""Fault injection for rehearsals (the --fault-* settings, docs/faults.md): engine steps that
fail, one engine stall, streams dropped after their first message, requests whose messages
are held back. Off by default; what was injected is counted since the server started and
reported by GetStats, so a run's report can say when and how much.

Draws come from one generator seeded by the model's seed, so a rehearsal repeats. Steps are
drawn on the engine thread and requests on the event loop; each draw holds a lock.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from records.server_settings import Faults, window_of
from records.server_stats import FaultCounts
from server.errors import ServerError


class InjectedFault(ServerError):
    """A failure --fault-step-fail or --fault-drop made on purpose (INTERNAL, UNAVAILABLE)."""


class DroppedStream(InjectedFault):
    """--fault-drop: the stream is cut after its first message (UNAVAILABLE)."""


@dataclass(frozen=True)
class Fate:
    """What the faults hold for one request."""

    drop: bool = False
    slow_s: float = 0.0


class Injector:
    def __init__(self, faults: Faults, seed: int, started_ns: int):
        self.faults = faults
        self.window = window_of(faults.fault_window)
        self.started_ns = started_ns
        self.steps_failed = self.stalls = self.streams_dropped = self.requests_slowed = 0
        self.stall_s = 0.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stalled = False

    def active(self, now_ns: int | None = None) -> bool:
        if not self.faults.on:
            return False
        if self.window is None:
            return True
        since_s = ((now_ns or time.monotonic_ns()) - self.started_ns) / 1e9
        return self.window[0] <= since_s < self.window[1]

    def _draw(self, share: float) -> bool:
        with self._lock:
            return self._rng.random() < share

    def before_step(self) -> None:
        """On the engine thread before each step: the stall, once, when the window opens, then
        a failed step by chance (InjectedFault)."""
        if not self.active():
            return
        if self.faults.fault_stall_s and not self._stalled:
            self._stalled = True
            time.sleep(self.faults.fault_stall_s)
            self.stalls += 1
            self.stall_s += self.faults.fault_stall_s
        if self.faults.fault_step_fail and self._draw(self.faults.fault_step_fail):
            self.steps_failed += 1
            raise InjectedFault("injected fault: this engine step failed on purpose "
                                "(--fault-step-fail); retry the request")

    def fate(self) -> Fate:
        """Drawn once per request as it is submitted."""
        if not self.active():
            return Fate()
        drop = bool(self.faults.fault_drop) and self._draw(self.faults.fault_drop)
        slow = bool(self.faults.fault_slow) and self._draw(self.faults.fault_slow)
        if slow:
            self.requests_slowed += 1
        return Fate(drop, self.faults.fault_slow_ms / 1000 if slow else 0.0)

    def dropped(self) -> DroppedStream:
        self.streams_dropped += 1
        return DroppedStream("injected fault: the server dropped this stream on purpose "
                             "(--fault-drop); retry the request")

    def snapshot(self) -> FaultCounts:
        return FaultCounts(steps_failed=self.steps_failed, stalls=self.stalls,
                           stall_s=self.stall_s, streams_dropped=self.streams_dropped,
                           requests_slowed=self.requests_slowed, active=self.active())
