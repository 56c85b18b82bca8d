"""The part a Locust process plays in a test, a class per role as Locust's runners are (Local,
Master, Worker): a standalone process sends its run, times it and writes it; a distributed
run's worker sends its share of the schedule and hands its part to the master; the master
sends nothing, collects the parts and writes the merged run. Where the SLA search runs, the
standalone process or the master decides and the workers send. The listener
(loadgen/listener.py) picks one role per process (`role_of`) and calls it at Locust's events.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import gevent
from locust.runners import MasterRunner, WorkerRunner

from loadgen.build import build_run
from loadgen.distributed import MESSAGE, PART_GRACE_S, STOP_MESSAGE, worker_message, write_merged
from loadgen.headroom import headroom
from loadgen.modes import mode_class
from loadgen.recording.rundir import write_run_dir
from loadgen.recording.summary import histogram_encodings
from loadgen.recording.timing import StreamTiming
from loadgen.run import Hooks, Place, Run
from loadgen.server_metrics import ServerMetrics, start_server_metrics
from loadgen.sla.probes import LocalProbes, Probes
from loadgen.sla.remote import CUT, SAMPLE, START, ChildRelay, RemoteProbes, SampleSender
from loadgen.sla.search import SlaSearch
from loadgen.targets.client import StreamResult
from loadgen.targets.target import Target
from records.load_settings import LoadSettings, SenderSettings
from records.server_stats import ServerStats
from records.summary import ServerSnapshots, SlaResult, Summary

log = logging.getLogger("loadgen")


class RunListener(Protocol):
    """What a role uses of its process's listener (loadgen/listener.py)."""

    environment: Any  # Locust's
    run: Run | None
    server_start: ServerStats | None
    run_time_s: float | None

    def report(self, result: StreamResult, timing: StreamTiming | None) -> None: ...

    def end_test(self) -> None: ...

    def refuse(self, message: str) -> None: ...

    def started(self, run: Run) -> None: ...

    def drained(self) -> Run | None: ...

    def ended(self, summary: Summary, path: Path) -> None: ...

    def finish(self, **_) -> None: ...


class Standalone:
    """One process: it sends, times and writes the run (Locust's LocalRunner)."""

    times_run = True  # -t is timed from the schedule's time zero, by the run (RunListener)
    interruptible = True  # headless, Ctrl-C ends the run, drained and written
    probes_target = True  # headless, a target that cannot be reached is refused at once
    sends = True
    prewarms = False  # an aio sender is started ahead whatever the settings say

    def __init__(self, listener: RunListener):
        self.listener = listener
        self.search: SlaSearch | None = None  # --mode sla, where this process decides
        self.watch: gevent.Greenlet | None = None

    def register(self, runner) -> None:
        """The messages it takes from the other processes of a distributed run."""

    def start(self, settings: LoadSettings, target: Target) -> None:
        listener = self.listener
        started_at = time.time()
        scraping = start_server_metrics(settings, started_at)
        run = build_run(settings, target, Hooks(listener.report, listener.end_test, scraping),
                        Place(started_at), listener.run_time_s)
        listener.started(run)
        log.info("%s", describe(settings))
        say_headroom(settings)
        if run.mode.searched and run.aio is not None:  # its sender process sends the probes
            remote = RemoteProbes(run.aio.tell, 1, listener.end_test)
            run.aio.on_sample = remote.receive
            self.start_search(settings, remote)
        elif run.mode.searched:
            self.start_search(settings, LocalProbes(run.mode.part, run.inflight,
                                                    listener.end_test))

    def start_search(self, settings: LoadSettings, probes: Probes) -> None:
        self.search = SlaSearch(settings, probes)
        self.watch = gevent.spawn(self.search.watch)

    def stop(self) -> None:
        """Locust's test is stopping (-t, the web UI, or the run itself): no send after now."""
        if self.watch is not None:
            self.watch.kill()
        if self.listener.run is not None:
            self.listener.run.stop()

    def finish(self) -> None:
        """The test has stopped: the run drains and is written."""
        run = self.listener.drained()
        if run is None:
            return
        server = ServerSnapshots(start=self.listener.server_start,
                                 end=run.target.stats(run.settings.sender.host))
        summary = dataclasses.replace(run.summary(), server=server, sla=self.sla_result())
        path = write_run_dir(run.settings.recording.run_dir, summary,
                             histogram_encodings(run.recorder), run.recorder.rows)
        run.mode.written(path)
        self.listener.ended(summary, path)

    def sla_result(self) -> SlaResult | None:
        """The SLA search's result, once, where this process ran one."""
        search, self.search, self.watch = self.search, None, None
        return search.result() if search is not None else None


class Worker(Standalone):
    """A distributed run's worker: it sends its share, and its master writes the run."""

    times_run = False  # the master times -t
    interruptible = False  # the master takes Ctrl-C
    probes_target = False  # the master looks first
    prewarms = True  # its master's test will most likely be open loop

    def __init__(self, listener: RunListener):
        super().__init__(listener)
        self.rank = 0  # its place among the workers
        # --mode sla: its reports to the master
        self.samples: SampleSender | ChildRelay | None = None

    def register(self, runner) -> None:
        """The master's stop, and its SLA search's probes' starts and cuts."""
        runner.register_message(STOP_MESSAGE, lambda msg, **_: gevent.spawn(self.listener.finish))
        runner.register_message(START, lambda msg, **_: self.samples
                                and self.samples.started(msg.data))
        runner.register_message(CUT, lambda msg, **_: self.samples and self.samples.cut(msg.data))

    def start(self, settings: LoadSettings, target: Target) -> None:
        listener, runner = self.listener, self.listener.environment.runner
        ranks = getattr(listener.environment.parsed_options, "moe_ranks", None) or {}
        if runner.client_id not in ranks:
            return  # refused by the master (its log says why), or joined mid-test
        self.rank = ranks[runner.client_id]
        run = build_run(settings, target, Hooks(listener.report),
                        Place(time.time(), len(ranks), self.rank,
                              f"{settings.recording.run_dir}/worker-{self.rank}"))
        listener.started(run)
        log.info("worker %d of %d: %s", self.rank + 1, len(ranks), describe(settings, len(ranks)))
        if run.mode.searched and run.aio is not None:
            self.samples = ChildRelay(runner.send_message, self.rank, run.aio)
        elif run.mode.searched:
            self.samples = SampleSender(runner.send_message, self.rank, run.mode.part,
                                        run.inflight)
        say_headroom(settings, len(ranks))

    def stop(self) -> None:
        if self.samples is not None:
            self.samples.stop()
            self.samples = None
        super().stop()

    def finish(self) -> None:
        run = self.listener.drained()
        if run is not None:
            runner = self.listener.environment.runner
            runner.send_message(MESSAGE, worker_message(self.rank, run))


@dataclass
class MasterState:
    """A distributed master's run: the workers' parts as they arrive."""

    settings: LoadSettings
    target: Target
    expected: int
    server_start: ServerStats | None
    scraping: ServerMetrics | None  # the master scrapes the server's metrics, once for all
    parts: dict[int, dict] = field(default_factory=dict)
    written: bool = False


class Master(Standalone):
    """A distributed run's master: its workers send; it collects their parts and writes the
    merged run."""

    times_run = False  # Locust's own -t: its workers' schedules start when they do
    sends = False

    def __init__(self, listener: RunListener):
        super().__init__(listener)
        self.state: MasterState | None = None
        self.remote: RemoteProbes | None = None  # --mode sla: its view of the workers

    def register(self, runner) -> None:
        """The workers' parts, and their SLA samples."""
        runner.register_message(MESSAGE, lambda msg, **_: self.receive_part(msg.data))
        runner.register_message(SAMPLE, lambda msg, **_: self.remote
                                and self.remote.receive(msg.data))

    def start(self, settings: LoadSettings, target: Target) -> None:
        listener, runner = self.listener, self.listener.environment.runner
        options = listener.environment.parsed_options
        options.moe_ranks = None  # a refused test must not pass on the last one's
        if why := mode_class(settings).one_process:
            listener.refuse(why)
            return
        if runner.target_user_count < runner.worker_count:
            listener.refuse(f"{runner.worker_count} workers need at least {runner.worker_count} "
                            f"users (-u {runner.worker_count}): each worker's users send its "
                            "share of --rate")
            return
        # Ranks 0..N-1 by client id (Locust's worker indexes can have gaps); they reach the
        # workers with the spawn message.
        clients = runner.clients.ready + runner.clients.running + runner.clients.spawning
        options.moe_ranks = {c.id: i for i, c in enumerate(sorted(clients, key=lambda c: c.id))}
        problem, stats = first_look(target, settings.sender)
        if problem:
            listener.refuse(f"{problem}; not starting")
            return
        self.state = MasterState(settings, target, len(options.moe_ranks), stats,
                                 start_server_metrics(settings, time.time()))
        if mode_class(settings).searched:
            self.remote = RemoteProbes(self.to_workers, len(options.moe_ranks),
                                       listener.end_test)
            self.start_search(settings, self.remote)

    def to_workers(self, kind: str, data: dict | None = None) -> None:
        runner = self.listener.environment.runner
        for client in runner.clients.all:
            runner.send_message(kind, data, client_id=client.id)

    def stop(self) -> None:
        super().stop()
        if self.state is not None:
            # Locust's headless quit tells workers to quit only after the master's test_stop,
            # and then waits 0.5 s: workers must stop and drain now, so their results arrive
            # in time.
            self.to_workers(STOP_MESSAGE)

    def receive_part(self, part: dict) -> None:
        """One worker's results, once per rank."""
        if self.state is not None and not self.state.written:
            self.state.parts.setdefault(part["worker"], part)

    def finish(self) -> None:
        """Waits for every worker's results (their drains included, bounded), then writes the
        merged run, marked incomplete if a worker never reported."""
        state = self.state
        if state is None:
            return
        deadline = time.monotonic() + state.settings.sender.drain_s + PART_GRACE_S
        while len(state.parts) < state.expected and time.monotonic() < deadline:
            gevent.sleep(0.1)
        state.written, self.state = True, None
        if state.scraping is not None:
            state.scraping.stop()
        if not state.parts:
            log.error("no worker reported results: nothing to write")
            return
        server = ServerSnapshots(start=state.server_start,
                                 end=state.target.stats(state.settings.sender.host))
        summary, path = write_merged(state.settings, list(state.parts.values()), state.expected,
                                     server, self.sla_result())
        self.listener.ended(summary, path)

    def sla_result(self) -> SlaResult | None:
        self.remote = None
        return super().sla_result()


def role_of(runner, listener: RunListener) -> Standalone:
    """The role of the process Locust's runner runs."""
    if isinstance(runner, MasterRunner):
        return Master(listener)
    if isinstance(runner, WorkerRunner):
        return Worker(listener)
    return Standalone(listener)


def first_look(target: Target, sender: SenderSettings) -> tuple[str, ServerStats | None]:
    """The pre-flight, before the first send: one readiness probe, then the server's telemetry
    (where the protocol has it): (why the server is not ready or "", the telemetry). The caller
    refuses to start a run against a server that is not ready, in one line, rather than queue
    requests for nobody; once running, a server that goes away fails requests UNAVAILABLE
    (counted) until it is back, or stops the run with --fail-fast."""
    host = sender.host
    problem = target.probe(host)
    if problem:
        return problem, None
    stats = target.stats(host)
    if stats is not None and not stats.ok:
        log.warning("%s server at %s: %s", target.name, host, stats.error)
    return "", stats


def say_headroom(settings: LoadSettings, workers: int = 1) -> None:
    """Before the run: whether one process can time what it is asked (loadgen/headroom.py)."""
    if (said := headroom(settings, workers)) is not None:
        holds, line = said
        (log.info if holds else log.warning)("this run %s", line)


def describe(settings: LoadSettings, workers: int = 1) -> str:
    """The run in one line for the log (a worker's share of the rate where there are several)."""
    where = f"{settings.client} sender, results to {settings.recording.run_dir}"
    return f"{mode_class(settings).describe(settings, workers)}, {where}"
