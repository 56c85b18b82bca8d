"""The gevent side of --client aio: starts loadgen/aio_sender.py, hands it the job, and turns
its result lines back into StreamResults on this process's greenlets (Locust events and
the recorder are not thread-safe, so nothing crosses over but lines of JSON)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import gevent
import orjson
from gevent import subprocess
from gevent.event import Event

from loadgen.sla.part import SAMPLE
from loadgen.targets.client import StreamResult
from loadgen.traffic.offered import Offered
from records.declare import flat
from records.load_settings import LoadSettings

_spare: subprocess.Popen | None = None  # a sender started ahead of its run (prewarm)
# grpc's reads and writes for the sender's channels on the thread that hands their events to the
# event loop, not on EventEngine's pool of threads (grpc 1.85's default for a client): at 8,000
# messages/s the pool's four threads woke ~17k times a second between them, and the sender took
# 93% of a core, 74% without them, its TTFT error p50 0.89 -> 0.76 ms (docs/measured.md). A
# GRPC_EXPERIMENTS of the user's own is left as it is.
SENDER_ENV = {"GRPC_EXPERIMENTS": "-event_engine_client"}


def _spawn() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "loadgen.aio_sender"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**SENDER_ENV, **os.environ})


def _take_spare() -> subprocess.Popen:
    """The spare if it is still running (it is no longer the spare), else a new sender."""
    global _spare
    spare, _spare = _spare, None
    if spare is not None and spare.poll() is None:
        return spare
    return _spawn()


def prewarm() -> None:
    """Starts a sender ahead of the next run, so its interpreter and imports (0.3-0.7 s) do not
    eat into the run's -t: at Locust's init, and after a run in the web UI. It waits for its
    job; the next AioSender takes it."""
    global _spare
    _spare = _take_spare()


def discard_spare() -> None:
    """Ends a spare no run took (it exits on the end of its input)."""
    global _spare
    if _spare is not None:
        _spare.stdin.close()
        _spare.wait()
        _spare = None


class AioSender:
    def __init__(self, on_result: Callable[[StreamResult], None], settings: LoadSettings,
                 workers: int, index: int, on_loop_lag: Callable[[int, int], None],
                 on_died: Callable[[str], None] = lambda why: None):
        """Starts the sender process now (or takes the spare, see prewarm) and hands it the job,
        so its imports and its connection are done before the schedule begins. on_loop_lag:
        each wake of the sender's own event-loop probe, (time ns, lateness us); on_died: the
        sender ended without reporting its end (why, in a line)."""
        self.on_result = on_result
        self.on_loop_lag = on_loop_lag
        self.on_died = on_died
        self.died: str | None = None
        self.results = 0  # requests the sender reported
        self.not_sent = 0
        self.cpu_s: float | None = None  # the sender's CPU from time zero, at its end
        self.cpu_wait_s: float | None = None  # and the time it waited for a core meanwhile
        self.offered = Offered()  # what the sender's requests asked for, at its end
        self.ready = Event()  # set once the sender is connected (or gone)
        self.schedule_over = Event()  # a finite schedule (a trace) is sent
        self.ended = Event()
        self.on_sample: Callable[[dict], None] | None = None  # its SLA probe samples, if any
        self.started = False
        self.proc = _take_spare()
        self._send({"config": flat(settings), "workers": workers, "index": index})
        gevent.spawn(self._read)

    def _send(self, message: dict) -> None:
        """A line to the sender; a sender already gone is noticed by _read, not here."""
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:  # BrokenPipeError: it exited (its own error is on stderr)
            pass

    def tell(self, kind: str, data: dict) -> None:
        """The SLA search's START or CUT of a probe (loadgen/sla/part.py), for its schedule."""
        self._send({"sla": kind, **data})

    def start(self, start_ns: int, end_ns: int | None = None) -> None:
        """The schedule's time zero, and its end where it is known ahead (-t): the sender
        sends nothing due after it, however late it hears of the stop."""
        self.started = True
        self._send({"start_ns": start_ns, "end_ns": end_ns})

    def _read(self) -> None:
        ended = False
        for line in self.proc.stdout:
            data = orjson.loads(line)  # a third of json's time, a request's line
            if data.get("ready"):
                self.ready.set()
            elif data.get("schedule_over"):
                self.schedule_over.set()
            elif data.get("end"):
                self.not_sent = data["not_sent"]
                self.cpu_s, self.cpu_wait_s = data["cpu_s"], data.get("cpu_wait_s")
                self.offered = Offered.of_state(data["offered"])
                ended = True
                break
            elif SAMPLE in data:
                if self.on_sample is not None:
                    self.on_sample(data[SAMPLE])
            elif "loop_lag" in data:
                for t_ns, late_us in data["loop_lag"]:
                    self.on_loop_lag(t_ns, late_us)
            else:
                self.results += 1
                self.on_result(StreamResult(**data))
        if not ended:  # its output closed without its end: it died
            code = self.proc.wait()
            self.died = (f"the aio sender (pid {self.proc.pid}) exited with code {code} "
                         "before the run ended (its error, if it printed one, is above)")
        self.ready.set()
        self.ended.set()
        if self.died:
            self.on_died(self.died)

    def stop(self, stop_ns: int) -> None:
        """The schedule stops at stop_ns: what fell due by then and was not sent is counted."""
        if self.started and self.proc.poll() is None:
            self.proc.stdin.write(f'{{"stop_ns": {stop_ns}}}\n'.encode())
            self.proc.stdin.flush()

    def wait(self, timeout_s: float) -> None:
        """Until the sender has reported its drain and exited; killed once timeout_s passes
        with no result read (a reader behind a sender that reported much at the stop is still
        reading them, each to be counted)."""
        if self.started:
            read = -1
            while not self.ended.wait(timeout_s) and self.results != read:
                read = self.results
        else:
            self.proc.stdin.close()  # never given a job: it exits on EOF
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
