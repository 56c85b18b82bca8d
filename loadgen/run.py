"""One load-test run in one process, on gevent: an open-loop schedule shared by the
process's users, a greenlet per request, and a drain at the end.

Users only dispatch: at each scheduled time they start the request in its own greenlet and
go on to the next arrival, so a slow server never delays a send (no coordinated omission).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gevent
from gevent.lock import BoundedSemaphore
from gevent.pool import Group

from loadgen.aio_client import AioSender
from loadgen.modes.base import RunMode
from loadgen.recording.cpu import CpuClock, GeneratorCpu
from loadgen.recording.loop_lag import gevent_probe
from loadgen.recording.recorder import Recorder
from loadgen.recording.routing_log import RoutingLog
from loadgen.recording.summary import Span, summarize
from loadgen.recording.timing import StreamTiming
from loadgen.scraping.expert_recorder import ExpertRecorder
from loadgen.server_metrics import ServerMetrics
from loadgen.targets.client import StreamResult, cut_off, stream_request
from loadgen.targets.routed_experts import RoutingReader
from loadgen.targets.target import RequestSpec, Target
from loadgen.targets.text_tokens import TextCounter
from loadgen.ticker import Ticker
from loadgen.traffic.dispatch import SendCounts, dispatch, due_before, dues_before, stop_or_end
from loadgen.traffic.offered import Offered
from loadgen.traffic.profiles import schedule_of
from loadgen.traffic.workload import Workload
from loadgen.web.timeline import Timeline
from records.load_settings import LoadSettings
from records.summary import Summary

log = logging.getLogger("loadgen")
AIO_READY_S = 30.0  # longest wait for the aio sender's start-up before the schedule begins
SCRAPE_READY_S = 15.0  # ... and for the first scrape of the server's metrics


@dataclass(frozen=True)
class Place:
    """This process's place in the run: among the sending processes, and in time."""

    started_at: float  # wall clock, s
    workers: int = 1  # Locust worker processes sending the run
    index: int = 0  # this one's
    run_dir: str | None = None  # where its logs go (a worker's own directory); None: the run's


@dataclass(frozen=True)
class Hooks:
    """What the run calls in the Locust process around it."""

    on_result: Callable[[StreamResult, StreamTiming | None], None]  # each request, once
    request_stop: Callable[[], None] = lambda: None  # ends the Locust test (stress, the trace)
    # the server-metrics collector (a worker has none: its master scrapes); its first scrapes
    # come before the first send, its last after the drain
    scraping: ServerMetrics | None = None


@dataclass(frozen=True)
class RunParts:
    """What a run draws its requests from and records into, built before it starts."""

    recorder: Recorder
    workload: Workload
    count: TextCounter  # the tokens of streamed text
    timeline: Timeline  # the web UI's chart
    ticker: Ticker  # the interval logs, the chart's periods and the server's samples
    mode: RunMode  # what the run's mode does (loadgen/modes/)
    routing: RoutingReader | None  # --routed-experts
    routing_log: RoutingLog | None
    expert_recorder: ExpertRecorder | None  # --expert-record-url


class Run:
    def __init__(self, settings: LoadSettings, target: Target, hooks: Hooks, place: Place,
                 parts: RunParts, run_time_s: float | None = None):
        """target: the server's protocol; parts: what it records into and draws from (built
        by loadgen/build.py); run_time_s: -t, counted from the schedule's time zero (see
        begin)."""
        self.request_stop, self.scraping = hooks.request_stop, hooks.scraping
        self.run_time_s, self.settings, self.sender = run_time_s, settings, settings.sender
        self.target, self.on_result = target, hooks.on_result
        self.started_at = place.started_at
        workers, index = place.workers, place.index
        self.recorder, self.workload = parts.recorder, parts.workload
        self.count, self.timeline, self.routing = parts.count, parts.timeline, parts.routing
        self.routing_log, self.expert_recorder = parts.routing_log, parts.expert_recorder
        self.offered = Offered()  # what the requests sent asked for (the aio sender keeps its own)
        self.inflight: dict[gevent.Greenlet, StreamResult] = {}
        # what became of the arrivals this process's users took; None: none dispatched
        # (closed loop, or the aio sender's)
        self.tally: SendCounts | None = None
        self._dispatching = 0  # users dispatching the schedule now
        self._group = Group()
        self.conns: list = []  # the users' connections, closed after the drain
        self._cpu = CpuClock()
        self.interrupted_s: float | None = None  # how far into the schedule Ctrl-C ended it
        self.ticker = parts.ticker
        self.ticker.start(settings.recording.interval_s)
        self.mode = parts.mode
        self._schedule = SharedSchedule(self.mode.arrivals())
        self._begun = False
        self.end_ns: int | None = None  # -t's end of the schedule, known as it begins
        self._place = (workers, index)
        self.failure: str | None = None  # why the run failed, where a part of it died
        self.aio = (AioSender(self._record, settings, workers, index, self.recorder.loop_lag,
                              self._sender_died)
                    if settings.client == "aio" else None)
        # the loop that timestamps the streams: the aio sender probes its own
        self._probe = gevent_probe(self.recorder.loop_lag) if self.aio is None else None

    def begin(self) -> None:
        """Time zero of the schedule: the first user's first dispatch, not the test start, so
        a user spawned late (-r below -u, or a worker's user) does not open with a burst of
        overdue sends."""
        if self._begun:
            return
        self._begun = True
        if self.aio is not None:  # its imports and connection do not eat into the schedule
            self.aio.ready.wait(AIO_READY_S)
        if self.scraping is not None and self.scraping.urls:  # its counters before any request
            self.scraping.ready.wait(SCRAPE_READY_S)
        self.recorder.start_ns, self.recorder.start_unix_s = time.monotonic_ns(), time.time()
        end_ns = self.end_ns = (self.start_ns + int(self.run_time_s * 1e9) if self.run_time_s
                                else None)
        if end_ns:  # the sender's start-up and the first scrape do not count against -t
            gevent.spawn_later(self.run_time_s, self.end,
                               f"--run-time limit reached ({self.run_time_s:g} s of schedule)",
                               end_ns)
        self.mode.begin(self)
        if self.expert_recorder is not None:  # over the measured window only
            self.expert_recorder.starting = gevent.spawn_later(
                self.settings.recording.warmup_s, self.expert_recorder.start)
        if self.aio is not None:
            if self.aio.died:  # before its first send: the schedule never starts
                self.recorder.stop_ns = self.start_ns
            self.aio.start(self.start_ns, end_ns)

    @property
    def stopping(self) -> bool:
        return self.stop_ns is not None

    def dispatch(self, conn) -> None:
        """Sends this process's arrivals on conn until the run stops; several users may
        share the schedule, each taking the next arrival (loadgen/traffic/dispatch.py). With
        --client aio the sender process sends them, and users only wait."""
        self.begin()
        while self.aio is not None and not self.stopping:
            if self.aio.schedule_over.is_set():  # by the sender
                self.mode.schedule_over(self)
            gevent.sleep(0.1)
        if self.aio is not None:
            return
        if self.tally is None:
            self.tally = SendCounts()
        self._dispatching += 1
        for due_ns in dispatch(self._schedule, self.start_ns, self.sender.max_in_flight,
                               UserSends(self, conn), self.tally):
            # None: a request was handed over, and goes out before the next is built
            gevent.sleep(0.0 if due_ns is None else max(0.0, (due_ns - time.monotonic_ns()) / 1e9))
        self._dispatching -= 1
        if not self._dispatching:  # a finite schedule (stress, a trace) is over
            self.mode.schedule_over(self)
        while not self.stopping:
            gevent.sleep(0.1)

    def user(self, conn) -> None:
        """What a Locust user of the run does, on its own connection (the mode says)."""
        self.mode.user(self, conn)

    def _sender_died(self, why: str) -> None:
        """The aio sender died: the run fails and ends now. What it had not reported of the
        schedule due so far counts as not sent."""
        log.error("%s: ending the run", why)
        self.failure = why
        if self._begun:
            due = due_before(schedule_of(self.settings.traffic, *self._place), self.start_ns,
                             self.stop_ns or time.monotonic_ns())
            self.recorder.not_sent += max(0, due - self.aio.results)
        self.stop()
        self.request_stop()

    def end(self, why: str, at_ns: int | None = None) -> None:
        """The run ends (its drain follows), as Locust's -t would end it: the trace is replayed,
        or -t's schedule is over (at_ns: its end, which the sender was told as it began)."""
        if not self.stopping:
            log.info("%s: ending the run", why)
            if at_ns is not None:  # a timer that fired early waits for it
                gevent.sleep(max(0.0, (at_ns - time.monotonic_ns()) / 1e9))
            self.stop(at_ns)
            self.request_stop()

    def send_request(self, conn, spec: RequestSpec,
                     due_ns: int) -> tuple[gevent.Greenlet, StreamResult]:
        """spec, sent now on conn in a greenlet of the run's, timed from due_ns."""
        self.offered.add(spec)
        result = StreamResult.of(spec, due_ns)
        greenlet = self._group.spawn(stream_request, self.target, conn, spec, result,
                                     self.sender.request_timeout_s, self.count)
        self.inflight[greenlet] = result
        greenlet.link(self._finished)
        return greenlet, result

    def _finished(self, greenlet: gevent.Greenlet) -> None:
        self._record(self.inflight.pop(greenlet))

    @property
    def start_ns(self) -> int:
        return self.recorder.start_ns

    @property
    def stop_ns(self) -> int | None:
        return self.recorder.stop_ns

    def _record(self, result: StreamResult) -> None:
        if (result.status == "UNAVAILABLE" and self.sender.fail_fast and not self.stopping):
            log.error("server at %s unreachable (%s): stopping the run (--fail-fast)",
                      self.sender.host, result.details)
            self.stop()
            self.request_stop()
        timing = self.recorder.add(result)
        if self.routing_log is not None:
            result.read_routing(self.routing)
            self.routing_log.add(result, self.start_ns,
                                 result.scheduled_ns < self.recorder.warmup_end_ns)
        self.mode.observe(result)
        self.on_result(result, timing)

    def stop(self, at_ns: int | None = None) -> None:
        """Ends the schedule: no request is sent after this moment (at_ns: the end -t set,
        now or just past)."""
        if self.stop_ns is None:
            self.recorder.stop_ns = at_ns or time.monotonic_ns()
            if self.aio is not None:
                self.aio.stop(self.stop_ns)
            self.mode.stop()

    def drain(self) -> None:
        """Waits up to drain_s for in-flight requests, then cuts off the rest (counted);
        then closes the interval logs with the last, partial interval."""
        self.stop()
        if self.aio is not None:
            self.aio.wait(self.sender.drain_s + 10)
            self.recorder.not_sent += self.aio.not_sent
        elif self.tally is not None:  # the users are gone: the arrivals due none of them took
            self.tally.overtaken_ns.extend(self._schedule.dues_by(self.start_ns, self.stop_ns))
            self.recorder.not_sent += self.tally.not_sent
        self._group.join(timeout=self.sender.drain_s)
        self.mode.drained()
        for greenlet, result in list(self.inflight.items()):
            # finished just now, its callback not run yet: count it as it ended
            if greenlet.ready():
                continue
            greenlet.unlink(self._finished)
            greenlet.kill(block=True, timeout=5)
            del self.inflight[greenlet]
            cut_off(result, self.sender.drain_s)
            self._record(result)
        gevent.sleep(0)  # lets the callbacks of requests that finished during the loop run
        if self._probe is not None:
            self._probe.kill()
        self.ticker.close()
        if self.routing_log is not None:
            self.routing_log.close()
        if self.expert_recorder is not None:
            self.expert_recorder.finish()
        if self.scraping is not None:
            self.scraping.stop()
        for conn in self.conns:
            self.target.close(conn)

    @property
    def duration_s(self) -> float:
        return (self.stop_ns - self.start_ns) / 1e9

    @property
    def cpu(self) -> GeneratorCpu:
        """The CPU the process that sends and times the streams used over the run and its
        drain, and the time it waited for a core: this one, or with --client aio its sender."""
        aio = self.aio is not None and self.aio.cpu_s is not None
        used_s, waited_s = (self.aio.cpu_s, self.aio.cpu_wait_s) if aio else self._cpu.spent()
        return GeneratorCpu.of(used_s, waited_s, (time.monotonic_ns() - self.start_ns) / 1e9)

    def interrupted(self) -> None:
        """Ctrl-C ends it now (loadgen/listener.py)."""
        self.interrupted_s = (time.monotonic_ns() - self.start_ns) / 1e9

    @property
    def warnings(self) -> tuple[str, ...]:
        """What makes the run's figures suspect, beyond the recorder's own: a part that died,
        or Ctrl-C."""
        failed = (f"the run failed: {self.failure}; the schedule's requests it had not "
                  "reported are counted as not sent",) if self.failure else ()
        if self.interrupted_s is not None:
            failed += (f"interrupted (Ctrl-C) {self.interrupted_s:.1f} s into its schedule: "
                       "the figures are of that part",)
        return (failed + (self.routing_log.warnings if self.routing_log is not None else ())
                + (self.expert_recorder.warnings if self.expert_recorder is not None else ()))

    @property
    def notes(self) -> tuple[str, ...]:
        """What the run's figures rest on that a reader must know: how tokens were counted,
        what the trace held."""
        return ((self.count.how,) if self.target.streams_text else ()) + self.mode.notes()

    def summary(self) -> Summary:
        span = Span(self.started_at, self.duration_s, self.recorder.window_s)
        summary = summarize(self.settings, self.recorder, span, self.cpu, self.warnings,
                            self.notes)
        offered = self.aio.offered if self.aio is not None else self.offered
        summary = dataclasses.replace(summary, workload=offered.figures())
        return self.mode.summary(summary)


class SharedSchedule:
    """The process's schedule, which its users take arrivals from one at a time: a schedule
    may wait inside for its next arrival (the SLA search's probes, between two probes), and a
    generator cannot be resumed by a second greenlet while the first waits in it."""

    def __init__(self, arrivals: Iterator[tuple[int, float]]):
        self.arrivals = arrivals
        self._lock = BoundedSemaphore()

    def __iter__(self) -> SharedSchedule:
        return self

    def __next__(self) -> tuple[int, float]:
        with self._lock:
            return next(self.arrivals)

    def dues_by(self, start_ns: int, stop_ns: int) -> list[int]:
        """The due times of the arrivals left that fell due by stop_ns; none while a user
        waits inside the schedule (it has none due: it waits for the next probe)."""
        if self._lock.locked():
            return []
        return list(dues_before(self.arrivals, start_ns, stop_ns))


@dataclass(frozen=True)
class UserSends:
    """A Locust user's sends (loadgen/traffic/dispatch.py's Sends): over its own connection, in
    greenlets of the run's."""

    run: Run
    conn: object

    def build(self, index: int, due_ns: int) -> object:
        return self.run.mode.build(self.run, index)

    def send(self, built: object, due_ns: int) -> None:
        self.run.mode.send(self.run, self.conn, built, due_ns)

    def in_flight(self) -> int:
        return len(self.run.inflight)

    def stop_ns(self) -> int | None:
        return stop_or_end(self.run.stop_ns, self.run.end_ns)  # -t's end: the greenlet
        # that stops the run may not have run yet
