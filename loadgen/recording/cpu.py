"""The CPU of the process that sends and times the streams: how much it used, and how long it
waited for a core while it had work (runnable, on a run queue, not running).

The wait is the kernel's own account, /proc/self/schedstat's second field (Linux; the thread
that runs the event loop). A generator that waits is late in everything it stamps, however
little CPU it needs: measured beside a vLLM CPU server started from another login session, the
aio sender waited 10.9 s of a 21 s run while it ran for 1.1 s, and TTFT p99 read 870 ms where
vLLM's own bench read 30 (docs/measured.md, "The generator beside a CPU server").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

SCHEDSTAT = Path("/proc/self/schedstat")


def run_queue_wait_s() -> float | None:
    """Seconds this process's main thread has spent runnable but waiting for a core, since it
    started; None where the kernel does not say (not Linux, or schedstats off)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class GeneratorCpu:
    """Over the run and its drain, as shares: of one core used, and of the time waited."""

    used_percent: float
    waited_percent: float | None = None  # None: not known (not Linux)

    @classmethod
    def of(cls, cpu_s: float, waited_s: float | None, wall_s: float) -> GeneratorCpu:
        wall_s = max(wall_s, 1e-9)
        return cls(100 * cpu_s / wall_s, None if waited_s is None else 100 * waited_s / wall_s)


class CpuClock:
    """This process's CPU used and time waited for a core, from its start on."""

    def __init__(self):
        self.cpu_s = time.process_time()
        self.waited_s = run_queue_wait_s()

    def spent(self) -> tuple[float, float | None]:
        """(CPU seconds, seconds waited for a core) since the start."""
        waited = run_queue_wait_s()
        return (time.process_time() - self.cpu_s,
                None if waited is None or self.waited_s is None else waited - self.waited_s)
