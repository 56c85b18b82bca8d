"""The load generator's own lateness, measured directly: a timer on the event loop that
timestamps the streams (the gevent hub, or the aio sender's asyncio loop) asks to wake every
PERIOD_S and records how late it woke. Whatever holds that loop up (its CPU, a collector
pause, a greenlet that does not yield) delays every message timestamp by as much, so this is
the generator's part of the delivery lag (docs/metrics.md); the rest is the server's write
delay and the network.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gevent

PERIOD_S = 0.005


def _late_us(asked_ns: int) -> int:
    return max(0, (time.monotonic_ns() - asked_ns) // 1000 - int(PERIOD_S * 1e6))


def gevent_probe(record: Callable[[int, int], None]) -> gevent.Greenlet:
    """A greenlet recording (wake time ns, lateness us) every PERIOD_S until killed."""
    import gevent  # here: the aio sender, which imports this module, runs without gevent

    def probe():
        while True:
            asked = time.monotonic_ns()
            gevent.sleep(PERIOD_S)
            record(time.monotonic_ns(), _late_us(asked))

    return gevent.spawn(probe)


async def asyncio_probe(record: Callable[[int, int], None]) -> None:
    """The same on the running asyncio loop, until cancelled."""
    while True:
        asked = time.monotonic_ns()
        await asyncio.sleep(PERIOD_S)
        record(time.monotonic_ns(), _late_us(asked))
