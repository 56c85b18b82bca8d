"""The SLA search where another process sends: the search decides, the senders send. The
search drives `RemoteProbes`, which tells every sender each probe's start (its number and the
whole run's rate: a sender sends its share) and its cut; each sender sends the search its part
of the current probe every JUDGE_S (loadgen/sla/part.py's ProbeSample), times from the probe's
start as the sender saw it, so no clock is shared.

The senders: a distributed run's workers, to their master (a worker's `SampleSender` on
Locust's greenlets, or its `ChildRelay` passing on what its aio sender process says); and in
one process with the aio sender, that sender process (loadgen/aio_sender.py) itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import gevent

from loadgen.sla.part import CUT, JUDGE_S, SAMPLE, START, Done, ProbePart, ProbeSample
from loadgen.sla.probes import READY_S

__all__ = ["CUT", "SAMPLE", "START", "ChildRelay", "RemoteProbes", "SampleSender"]


class RemoteProbes:
    """The master's side: the workers' samples as they arrive."""

    def __init__(self, to_workers: Callable[[str, dict], None], workers: int,
                 request_stop: Callable[[], None]):
        """to_workers: sends a message to every worker; workers: how many will report."""
        self.to_workers, self.workers, self.request_stop = to_workers, workers, request_stop
        self.probe = -1
        self._latest: dict[int, ProbeSample] = {}  # each worker's last sample
        self._done: list[Done] = []  # the current probe's, not collected yet

    def receive(self, data: dict) -> None:
        sample = ProbeSample.from_message(data)
        self._latest[data["worker"]] = sample
        if sample.probe == self.probe:
            self._done += sample.done

    def start(self, probe: int, rate: float) -> str:
        if self.probe < 0:  # the first probe waits for every worker's schedule to begin
            deadline = time.monotonic() + READY_S
            while len(self._latest) < self.workers and time.monotonic() < deadline:
                gevent.sleep(0.05)
            if len(self._latest) < self.workers:
                return (f"only {len(self._latest)} of {self.workers} workers began within "
                        f"{READY_S:g} s")
        self.probe, self._done = probe, []
        self.to_workers(START, {"probe": probe, "rate": rate})
        return ""

    def collect(self) -> ProbeSample:
        done, self._done = self._done, []
        current = [s for s in self._latest.values() if s.probe == self.probe]
        return ProbeSample(self.probe, done, [w for s in current for w in s.waiting],
                           cut=all(s.cut for s in current),
                           inflight=sum(s.inflight for s in current),
                           unsent=sum(s.unsent for s in current))

    def cut(self) -> None:
        self.to_workers(CUT, {"probe": self.probe})

    def drained(self) -> bool:
        """Every worker has said, since the cut, that none of its requests is in flight."""
        return len(self._latest) == self.workers and all(
            s.probe == self.probe and s.cut and not s.inflight for s in self._latest.values())

    def end(self) -> None:
        self.request_stop()


class SampleSender:
    """A worker's side: takes the master's starts and cuts, sends its samples."""

    def __init__(self, to_master: Callable[[str, dict], None], rank: int, part: ProbePart,
                 inflight: dict):
        self.to_master, self.rank, self.part, self.inflight = to_master, rank, part, inflight
        self._greenlet = gevent.spawn(self._send_every_judgement)

    def started(self, data: dict) -> None:
        self.part.start(data["probe"], data["rate"])

    def cut(self, data: dict) -> None:
        if data["probe"] == self.part.probe:
            self.part.stop_arrivals()

    def _send_every_judgement(self) -> None:
        while not self.part.begun:
            gevent.sleep(0.05)
        while True:
            sample = self.part.sample(self.inflight.values())
            self.to_master(SAMPLE, {"worker": self.rank, **sample.to_message()})
            gevent.sleep(JUDGE_S)

    def stop(self) -> None:
        self.part.end()
        self._greenlet.kill(block=False)


class SenderChild(Protocol):
    """A process that sends for this one (loadgen/aio_client.py's AioSender)."""

    on_sample: Callable[[dict], None] | None  # each ProbeSample message it says

    def tell(self, kind: str, data: dict) -> None:
        """Passes the search's START or CUT on to it."""


class ChildRelay:
    """A worker whose aio sender process sends: the master's starts and cuts go on to it, its
    samples on to the master as this worker's."""

    def __init__(self, to_master: Callable[[str, dict], None], rank: int, child: SenderChild):
        self.child = child
        child.on_sample = lambda data: to_master(SAMPLE, {**data, "worker": rank})

    def started(self, data: dict) -> None:
        self.child.tell(START, data)

    def cut(self, data: dict) -> None:
        self.child.tell(CUT, data)

    def stop(self) -> None:
        self.child.on_sample = None
