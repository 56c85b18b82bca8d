"""The load generator's Locust glue: one listener per Locust process, owning what the process
keeps between events and registering its own handlers and messages (as locust-plugins'
listeners do). A standalone process or a worker runs the schedule (loadgen/run.py); a
distributed master collects the workers' parts and writes the merged run directory
(loadgen/distributed.py).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import gevent
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import CSV_STATS_INTERVAL_SEC

from loadgen.aio_client import discard_spare, prewarm
from loadgen.build import build_run
from loadgen.console import print_summary
from loadgen.distributed import MESSAGE, PART_GRACE_S, STOP_MESSAGE, worker_message, write_merged
from loadgen.headroom import headroom
from loadgen.modes import mode_class
from loadgen.recording.recorder import Recorder
from loadgen.recording.rundir import write_run_dir
from loadgen.recording.summary import histogram_encodings
from loadgen.recording.timing import StreamTiming
from loadgen.run import Hooks, Place, Run
from loadgen.server_metrics import ServerMetrics, start_server_metrics
from loadgen.settings import check, with_run_dir
from loadgen.sla.remote import CUT, SAMPLE, START, RemoteProbes, SampleSender
from loadgen.sla.search import LocalProbes, Probes, SlaSearch
from loadgen.targets.client import StreamResult
from loadgen.targets.target import TARGETS, Target, target_of
from loadgen.web.html_report import add_to_report
from loadgen.web.latency_table import write_latency_csv
from loadgen.web.tab import add_tab
from loadgen.web.timeline import Timeline
from records.cli import INTERRUPTED, USAGE_ERROR
from records.declare import SettingsError, from_options
from records.load_settings import LoadSettings, SenderSettings
from records.requests import CLIENT_CANCELLED
from records.scenarios import with_scenario
from records.server_stats import ServerStats
from records.summary import ServerSnapshots, Summary

log = logging.getLogger("loadgen")
WARMUP_ENTRY = " (warm-up)"  # Locust's statistics entry of the requests not measured


def settings_of(environment) -> LoadSettings:
    """The settings from Locust's options (the web UI sends them as text) and --host."""
    settings = with_scenario(from_options(LoadSettings, environment.parsed_options,
                                          host=environment.host or ""))
    check(settings)
    return with_run_dir(settings)


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


class RunListener:
    def __init__(self, environment):
        self.environment = environment
        self.run: Run | None = None  # this process's schedule, while a test runs
        self.recorder: Recorder | None = None  # the current or last test's, for the web UI
        self.timeline: Timeline | None = None  # ... and its periods so far
        self.written: tuple[Summary, Path] | None = None  # the last test's summary and run dir
        self.master: MasterState | None = None
        # --mode sla: the search, where this process decides (one process, or the master) ...
        self.sla: SlaSearch | None = None
        self.sla_watch: gevent.Greenlet | None = None
        self.sla_remote: RemoteProbes | None = None  # ... the master's view of its workers
        self.sla_samples: SampleSender | None = None  # ... a worker's reports to its master
        self.rank = 0  # a worker's place among the workers
        self.server_start: ServerStats | None = None
        self.request_type = ""  # Locust's statistics name requests by the target's protocol
        self._ending = False  # the test's end is asked for (once: a second quit would cut the
        #                       first one's drain and write short)
        add_tab(environment, lambda: self.recorder, lambda: self.timeline, lambda: self.written)
        events = environment.events
        events.test_start.add_listener(self.start)
        events.test_stopping.add_listener(self.stop_schedule)
        events.test_stop.add_listener(self.finish)
        events.quit.add_listener(self.extend_html_report)
        events.quit.add_listener(lambda **_: discard_spare())
        runner = environment.runner
        self._register_messages(runner)
        options = environment.parsed_options
        # A headless run's -t is timed from its schedule's time zero, not from Locust's start:
        # the aio sender's start-up (0.3-0.7 s) would eat into it (loadgen/run.py, begin)
        self.run_time_s: float | None = None
        if (options is not None and options.headless and getattr(options, "run_time", None)
                and runner is not None and not isinstance(runner, MasterRunner | WorkerRunner)):
            self.run_time_s, options.run_time = options.run_time, None
            logging.getLogger("locust.main").addFilter(
                lambda record: not record.getMessage().startswith("No run time limit set"))
        self.interrupted = False
        if options is not None and options.headless and not isinstance(runner, WorkerRunner):
            gevent.signal_handler(signal.SIGINT, self.interrupt)
        self._check_at_start(environment)

    def _register_messages(self, runner) -> None:
        """The messages between a distributed run's master and its workers: the workers'
        parts and SLA samples to the master; the stop and the SLA probes' starts and cuts to
        the workers."""
        if isinstance(runner, MasterRunner):
            runner.register_message(MESSAGE, lambda msg, **_: self.receive_part(msg.data))
            runner.register_message(SAMPLE, lambda msg, **_: self.sla_remote
                                    and self.sla_remote.receive(msg.data))
        if isinstance(runner, WorkerRunner):
            runner.register_message(STOP_MESSAGE, lambda msg, **_: gevent.spawn(self.finish))
            runner.register_message(START, lambda msg, **_: self.sla_samples
                                    and self.sla_samples.started(msg.data))
            runner.register_message(CUT, lambda msg, **_: self.sla_samples
                                    and self.sla_samples.cut(msg.data))

    @staticmethod
    def _check_at_start(environment) -> None:
        """Before any user starts: bad flags and, headless, a target that cannot be reached end
        the process, naming the flag; an aio sender is started ahead where one will send."""
        options, runner = environment.parsed_options, environment.runner
        if options is not None and options.protocol is not None:
            refuse_at_start(f"--protocol: the server's protocol is --target here "
                            f"({', '.join(TARGETS)}); --protocol is the reference servers' "
                            "(python -m loadgen.delay_server)")
        if options is not None and (environment.host or options.headless):
            try:  # bad flags end the process before any request, naming the flag
                settings = settings_of(environment)
            except SettingsError as exc:
                refuse_at_start(str(exc))
            if options.headless and not isinstance(runner, WorkerRunner):
                # a target that cannot be reached ends the process here, its line the last
                # printed, before Locust starts its users
                if problem := target_of(settings.target).probe(settings.sender.host):
                    refuse_at_start(f"--host: {problem}; not starting")
            if settings.client == "aio" and not isinstance(runner, MasterRunner):
                prewarm()
        if isinstance(runner, WorkerRunner):  # its master's test will most likely be open loop
            prewarm()

    # --- ending a test ---

    def end_test(self) -> None:
        """Ends the test as -t would: headless the process quits, in the web UI the test stops.
        Once a test: -t and a stress run's last step can both end it at the same moment."""
        if self._ending:
            return
        self._ending = True
        runner = self.environment.runner
        gevent.spawn(runner.quit if self.environment.parsed_options.headless else runner.stop)

    def interrupt(self) -> None:
        """Ctrl-C: the run ends as -t would end it, drained and written, and the process exits
        130; a second Ctrl-C quits at once."""
        if self.interrupted:
            os._exit(INTERRUPTED)
        self.interrupted = True
        log.warning("interrupted (Ctrl-C): ending the run and writing what it measured; Ctrl-C "
                    "again quits at once, writing nothing")
        self.environment.process_exit_code = INTERRUPTED
        if self.run is not None:
            self.run.interrupted()
        self.end_test()

    def refuse(self, message: str) -> None:
        """Ends a test that cannot run: headless, the process exits 2; in the web UI, the test
        stops."""
        log.error("%s", message)
        self.run = None
        if self.environment.parsed_options.headless:
            self.environment.process_exit_code = 2
        self.end_test()  # not from inside the spawning greenlet

    # --- the test ---

    def start(self, **_) -> None:
        self._ending = False
        environment = self.environment
        try:
            settings = settings_of(environment)
        except SettingsError as exc:  # set in the web UI
            self.refuse(str(exc))
            return
        runner = environment.runner
        if isinstance(runner, MasterRunner):
            self.start_master(settings, runner)
            return
        # Everything built so far lives for the whole run: keep the collector from walking it, so
        # its pauses (tens of ms in a busy process) do not land in the timestamps.
        gc.collect()
        gc.freeze()
        target = target_of(settings.target)
        self.request_type = target.name
        problem, self.server_start = first_look(target, settings.sender)
        if problem:
            self.refuse(f"{problem}; not starting")
            return
        if isinstance(runner, WorkerRunner):
            ranks = getattr(environment.parsed_options, "moe_ranks", None) or {}
            if runner.client_id not in ranks:
                self.run = None  # refused by the master (its log says why), or joined mid-test
                return
            self.rank = ranks[runner.client_id]
            self.run = build_run(settings, target, Hooks(self.report),
                                 Place(time.time(), len(ranks), self.rank,
                                       f"{settings.recording.run_dir}/worker-{self.rank}"))
            log.info("worker %d of %d: %s", self.rank + 1, len(ranks),
                     describe(settings, len(ranks)))
            if self.run.mode.searched:
                self.sla_samples = SampleSender(runner.send_message, self.rank,
                                                self.run.mode.part, self.run.inflight)
            say_headroom(settings, len(ranks))
        else:
            started_at = time.time()
            scraping = start_server_metrics(settings, started_at)
            self.run = build_run(settings, target, Hooks(self.report, self.end_test, scraping),
                                 Place(started_at), self.run_time_s)
            log.info("%s", describe(settings))
            say_headroom(settings)
            if self.run.mode.searched:
                self.start_search(settings, LocalProbes(self.run.mode.part, self.run.inflight,
                                                        self.end_test))
        self.recorder, self.timeline = self.run.recorder, self.run.timeline

    def to_workers(self, kind: str, data: dict) -> None:
        runner = self.environment.runner
        for client in runner.clients.all:
            runner.send_message(kind, data, client_id=client.id)

    def start_search(self, settings: LoadSettings, probes: Probes) -> None:
        self.sla = SlaSearch(settings, probes)
        self.sla_watch = gevent.spawn(self.sla.watch)

    def start_master(self, settings: LoadSettings, runner: MasterRunner) -> None:
        # a refused test must not pass on the last one's
        self.environment.parsed_options.moe_ranks = None
        if why := mode_class(settings).one_process:
            self.refuse(why)
            return
        if runner.target_user_count < runner.worker_count:
            self.refuse(f"{runner.worker_count} workers need at least {runner.worker_count} users "
                        f"(-u {runner.worker_count}): each worker's users send its share of --rate")
            return
        # Ranks 0..N-1 by client id (Locust's worker indexes can have gaps); they reach the
        # workers with the spawn message.
        clients = runner.clients.ready + runner.clients.running + runner.clients.spawning
        ranks = {c.id: i for i, c in enumerate(sorted(clients, key=lambda c: c.id))}
        self.environment.parsed_options.moe_ranks = ranks
        target = target_of(settings.target)
        problem, stats = first_look(target, settings.sender)
        if problem:
            self.refuse(f"{problem}; not starting")
            return
        self.master = MasterState(settings, target, len(ranks), stats,
                                  start_server_metrics(settings, time.time()))
        if mode_class(settings).searched:
            self.sla_remote = RemoteProbes(self.to_workers, len(ranks), self.end_test)
            self.start_search(settings, self.sla_remote)

    def report(self, result: StreamResult, timing: StreamTiming | None) -> None:
        """Each request once into Locust's own statistics, so its request rate and failures are
        the run's: named by its class ("generate" without classes), its time the end-to-end
        latency from the scheduled send, its size the bytes of the messages it received (what
        Locust's size column says); a failure by its status.
        A request scheduled in the warm-up goes in an entry of its own ("... (warm-up)"), so the
        named entry counts what the report measures. TTFT, TPOT and ITL are in the web UI's
        Latency (HDR) tab (loadgen/web/tab.py)."""
        end_ns = result.recv_ns[-1] if result.recv_ns else time.monotonic_ns()
        failed = not result.ok and result.status != CLIENT_CANCELLED  # cancelled on purpose
        name = result.request_class or "generate"
        if self.recorder is not None and result.scheduled_ns < self.recorder.warmup_end_ns:
            name += WARMUP_ENTRY
        self.environment.events.request.fire(
            request_type=self.request_type, name=name,
            response_time=(end_ns - result.scheduled_ns) / 1e6,
            response_length=result.received_bytes,
            exception=RuntimeError(f"{result.status}: {result.details}") if failed else None,
            context={})

    def stop_schedule(self, **_) -> None:
        if self.sla_watch is not None:  # stopped from outside (-t, the web UI) or by itself
            self.sla_watch.kill()
        if self.sla_samples is not None:
            self.sla_samples.stop()
            self.sla_samples = None
        if self.run is not None:
            self.run.stop()
        if self.master is not None:
            # Locust's headless quit tells workers to quit only after the master's test_stop, and
            # then waits 0.5 s: workers must stop and drain now, so their results arrive in time.
            runner = self.environment.runner
            for client in runner.clients.all:
                runner.send_message(STOP_MESSAGE, client_id=client.id)

    def finish(self, **_) -> None:
        if self.master is not None:
            self.await_parts()
            return
        run, self.run = self.run, None
        if run is None:
            return
        run.drain()
        if run.failure:  # a part of the run died: the process says so in its exit status
            self.environment.process_exit_code = 1
        if run.aio is not None and not self.environment.parsed_options.headless:
            prewarm()  # for the web UI's next test
        if isinstance(self.environment.runner, WorkerRunner):
            self.environment.runner.send_message(MESSAGE, worker_message(self.rank, run))
            return
        server = ServerSnapshots(start=self.server_start,
                                 end=run.target.stats(run.settings.sender.host))
        summary = dataclasses.replace(run.summary(), server=server, sla=self.sla_result())
        path = write_run_dir(run.settings.recording.run_dir, summary,
                             histogram_encodings(run.recorder), run.recorder.rows)
        run.mode.written(path)
        self.ended(summary, path)

    def ended(self, summary: Summary, path: Path) -> None:
        """A test's results are written: the console, --csv's latency file, the Last run tab."""
        csv_prefix = getattr(self.environment.parsed_options, "csv_prefix", None)
        write_latency_csv(csv_prefix, summary)
        print_summary(summary, path)
        self.written = (summary, path)
        if csv_prefix:
            # Locust writes its --csv files every CSV_STATS_INTERVAL_SEC and not again as it
            # quits: one more interval, so they hold the requests the drain just ended
            gevent.sleep(CSV_STATS_INTERVAL_SEC)

    def extend_html_report(self, **_) -> None:
        """Locust writes its --html report as the process quits, just before this: the truthful
        figures join it (loadgen/web/html_report.py)."""
        html_file = getattr(self.environment.parsed_options, "html_file", None)
        if html_file and self.written is not None and Path(html_file).exists():
            add_to_report(Path(html_file), *self.written, self.timeline)

    def sla_result(self):
        """The SLA search's result, once, where this process ran one."""
        sla, self.sla, self.sla_watch, self.sla_remote = self.sla, None, None, None
        return sla.result() if sla is not None else None

    # --- a distributed master ---

    def receive_part(self, part: dict) -> None:
        """One worker's results, once per rank."""
        if self.master is not None and not self.master.written:
            self.master.parts.setdefault(part["worker"], part)

    def await_parts(self) -> None:
        """Waits for every worker's results (their drains included, bounded), then writes the
        merged run, marked incomplete if a worker never reported."""
        master = self.master
        deadline = time.monotonic() + master.settings.sender.drain_s + PART_GRACE_S
        while len(master.parts) < master.expected and time.monotonic() < deadline:
            gevent.sleep(0.1)
        master.written = True
        self.master = None
        if master.scraping is not None:
            master.scraping.stop()
        if not master.parts:
            log.error("no worker reported results: nothing to write")
            return
        server = ServerSnapshots(start=master.server_start,
                                 end=master.target.stats(master.settings.sender.host))
        summary, path = write_merged(master.settings, list(master.parts.values()), master.expected,
                                     server, self.sla_result())
        self.ended(summary, path)


def refuse_at_start(message: str) -> NoReturn:
    """Bad settings or a target that cannot be reached, before the run: one line, exit 2."""
    sys.stderr.write(f"loadgen/moe.py: {message}\n")
    sys.exit(USAGE_ERROR)


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
