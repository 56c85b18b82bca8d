"""The send loop, written once for both senders: the gevent run (loadgen/run.py) and the aio
sender (loadgen/aio_sender.py) differ in how they wait and how a request goes out, not in the
schedule, the cap on requests in flight, the counts or the stop.

The rule (docs/design.md, "A load-generator run"): every arrival of the schedule due before
the run's stop is sent at its time or counted as not sent, exactly once. Not sent: the cap
(--max-in-flight) was reached as it fell due, or the stop came before the loop reached it
(a sender that fell behind leaves overdue arrivals: they are counted, not dropped). An
arrival due after the stop is neither: it was never due in the run (a sender told of the stop
after it had passed, a distributed worker's, may have sent one: its recorder counts it apart,
`after_stop`, and nowhere else).

`dispatch` is a generator free of any event loop: it yields the time each arrival is due, and
its caller waits until then by its own means (gevent.sleep, asyncio.sleep) and resumes it;
after each send it yields None, and its caller lets the request go out before the next is
built. Several callers may share one schedule (Locust's users of a process, one at a time:
loadgen/run.py's SharedSchedule): each takes the next arrival, and counts it. A caller ended
while it waits (Locust stops its users after the run's stop) counts the arrival it held if
that was due; the arrivals no caller took are counted by `due_before` once the callers are
gone. A schedule with nothing due yet (the SLA search's, between probes) gives an idle arrival,
(None, when to look again): it is waited for like any other, and neither sent nor counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


class Sends(Protocol):
    """How one sender puts a request on the wire."""

    def build(self, index: int, due_ns: int) -> object:
        """What send will send for arrival `index`: built before its time, not after."""

    def send(self, built: object, due_ns: int) -> None:
        """Sends it now (without waiting for its reply)."""

    def in_flight(self) -> int:
        """Requests sent whose replies have not ended."""

    def stop_ns(self) -> int | None:
        """When the run stopped (CLOCK_MONOTONIC ns), or None while it runs."""


@dataclass
class SendCounts:
    """What became of the arrivals a dispatch took."""

    sent: int = 0
    full: int = 0  # not sent: --max-in-flight were in flight as it fell due
    # not sent: due before the stop, reached after it (their due times, ns)
    overtaken_ns: list[int] = field(default_factory=list)

    @property
    def overtaken(self) -> int:
        return len(self.overtaken_ns)

    @property
    def not_sent(self) -> int:
        return self.full + self.overtaken

    def stopped_at(self, stop_ns: int) -> None:
        """The run's stop, as it turned out: a sender past the schedule's end before it heard
        of an earlier stop (a distributed worker's, behind) counted the arrivals due between
        as overtaken; they were never due in the run. (One that met the cap in that time,
        `full`, still counts: kept as a count, not a time.)"""
        self.overtaken_ns = [due_ns for due_ns in self.overtaken_ns if due_ns <= stop_ns]


def dispatch(arrivals: Iterator[tuple[int | None, float]], start_ns: int, max_in_flight: int,
             sends: Sends, tally: SendCounts) -> Iterator[int | None]:
    """Each arrival (request index, s from start_ns) sent at its time or counted in tally,
    until the stop or the schedule's end. Yields each due time (ns): the caller resumes it once
    that time has come, or the run has stopped; and None after each send: the caller resumes
    it once the request has gone out."""
    for index, offset_s in arrivals:
        due_ns = start_ns + int(offset_s * 1e9)
        stop_ns = sends.stop_ns()
        if index is None:  # nothing due yet: look again then
            if stop_ns is not None:
                return
            yield due_ns
            continue
        if stop_ns is None:
            built = sends.build(index, due_ns)
            try:
                yield due_ns
            except GeneratorExit:  # the caller was ended as it waited
                stop_ns = sends.stop_ns()
                if stop_ns is not None and due_ns <= stop_ns:
                    tally.overtaken_ns.append(due_ns)
                raise
            stop_ns = sends.stop_ns()
        if stop_ns is not None:
            if due_ns <= stop_ns:
                tally.overtaken_ns.append(due_ns)
                tally.overtaken_ns.extend(dues_before(arrivals, start_ns, stop_ns))
            return
        if sends.in_flight() >= max_in_flight:
            tally.full += 1
            continue
        sends.send(built, due_ns)
        tally.sent += 1
        yield None


def stop_or_end(stop_ns: int | None, end_ns: int | None) -> int | None:
    """A sender's Sends.stop_ns: the run's stop once it is known; before it, the schedule's end
    that -t set (end_ns, None: none), once that has passed, so nothing due after it is sent
    however late the stop itself reaches the sender."""
    if stop_ns is None and end_ns is not None and time.monotonic_ns() >= end_ns:
        return end_ns
    return stop_ns


def dues_before(arrivals: Iterator[tuple[int | None, float]], start_ns: int,
                stop_ns: int) -> Iterator[int]:
    """The due times (ns) of the arrivals left that fell due by stop_ns (the schedule's times
    only grow; an idle one is none)."""
    for index, offset_s in arrivals:
        due_ns = start_ns + int(offset_s * 1e9)
        if due_ns > stop_ns:
            break
        if index is not None:
            yield due_ns


def due_before(arrivals: Iterator[tuple[int | None, float]], start_ns: int, stop_ns: int) -> int:
    """How many of the arrivals left fell due by stop_ns."""
    return sum(1 for _ in dues_before(arrivals, start_ns, stop_ns))
