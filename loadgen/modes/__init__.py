"""The load generator's modes (--mode), a class each behind one protocol
(loadgen/modes/base.py's RunMode), registered under the `Mode` enum: `base.py` (fixed),
`open_loop.py` (mixed, and the replay of a --trace), `closed.py`, `sessions.py`, `stress.py`,
`sla.py`. docs/design.md, "Adding a mode", says how to add one."""

from __future__ import annotations

from loadgen.modes import closed, open_loop, sessions, sla, stress
from loadgen.modes.base import REGISTRY, RunMode
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode

MODULES = (closed, open_loop, sessions, sla, stress)  # each registers its class as it loads


def mode_class(settings: LoadSettings) -> type[RunMode]:
    """The class that runs the settings' mode: a --trace is replayed by its own."""
    if settings.traffic.trace:
        return open_loop.TraceReplay
    return REGISTRY[Mode(settings.traffic.mode)]


def mode_of(settings: LoadSettings, workers: int = 1, index: int = 0) -> RunMode:
    """The mode of one process's run: workers, index, its place among the sending processes."""
    return mode_class(settings)(settings, workers, index)
