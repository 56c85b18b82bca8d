"""The load generator's Locust glue: one listener per Locust process, owning what the process
keeps between events and registering its own handlers and messages (as locust-plugins'
listeners do). A standalone process or a worker runs the schedule (loadgen/run.py); a
distributed master collects the workers' parts and writes the merged run directory
(loadgen/distributed.py).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

import gevent
from locust.stats import CSV_STATS_INTERVAL_SEC

from loadgen.aio_client import discard_spare, prewarm
from loadgen.console import print_summary
from loadgen.recording.recorder import Recorder
from loadgen.recording.timing import StreamTiming
from loadgen.roles import first_look, role_of
from loadgen.run import Run
from loadgen.settings import check, with_run_dir
from loadgen.targets.client import StreamResult
from loadgen.targets.target import TARGETS, target_of
from loadgen.web.html_report import add_to_report
from loadgen.web.latency_table import write_latency_csv
from loadgen.web.tab import add_tab
from loadgen.web.timeline import Timeline
from records.cli import INTERRUPTED, USAGE_ERROR
from records.declare import SettingsError, from_options
from records.load_settings import LoadSettings
from records.requests import CLIENT_CANCELLED
from records.scenarios import with_scenario
from records.server_stats import ServerStats
from records.summary import Summary

log = logging.getLogger("loadgen")
WARMUP_ENTRY = " (warm-up)"  # Locust's statistics entry of the requests not measured


def settings_of(environment) -> LoadSettings:
    """The settings from Locust's options (the web UI sends them as text) and --host."""
    settings = with_scenario(from_options(LoadSettings, environment.parsed_options,
                                          host=environment.host or ""))
    check(settings)
    return with_run_dir(settings)


class RunListener:
    def __init__(self, environment):
        self.environment = environment
        self.run: Run | None = None  # this process's schedule, while a test runs
        self.recorder: Recorder | None = None  # the current or last test's, for the web UI
        self.timeline: Timeline | None = None  # ... and its periods so far
        self.written: tuple[Summary, Path] | None = None  # the last test's summary and run dir
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
        self.role = role_of(runner, self)
        if runner is not None:
            self.role.register(runner)
        options = environment.parsed_options
        # A headless run's -t is timed from its schedule's time zero, not from Locust's start:
        # the aio sender's start-up (0.3-0.7 s) would eat into it (loadgen/run.py, begin)
        self.run_time_s: float | None = None
        if (options is not None and options.headless and getattr(options, "run_time", None)
                and runner is not None and self.role.times_run):
            self.run_time_s, options.run_time = options.run_time, None
            logging.getLogger("locust.main").addFilter(
                lambda record: not record.getMessage().startswith("No run time limit set"))
        self.interrupted = False
        if options is not None and options.headless and self.role.interruptible:
            gevent.signal_handler(signal.SIGINT, self.interrupt)
        self._check_at_start(environment)

    def _check_at_start(self, environment) -> None:
        """Before any user starts: bad flags and, headless, a target that cannot be reached end
        the process, naming the flag; an aio sender is started ahead where one will send."""
        options, role = environment.parsed_options, self.role
        if options is not None and options.protocol is not None:
            refuse_at_start(f"--protocol: the server's protocol is --target here "
                            f"({', '.join(TARGETS)}); --protocol is the reference servers' "
                            "(python -m loadgen.delay_server)")
        if options is not None and (environment.host or options.headless):
            try:  # bad flags end the process before any request, naming the flag
                settings = settings_of(environment)
            except SettingsError as exc:
                refuse_at_start(str(exc))
            if options.headless and role.probes_target:
                # a target that cannot be reached ends the process here, its line the last
                # printed, before Locust starts its users
                if problem := target_of(settings.target).probe(settings.sender.host):
                    refuse_at_start(f"--host: {problem}; not starting")
            if settings.client == "aio" and role.sends:
                prewarm()
        if role.prewarms:
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
        target = target_of(settings.target)
        if self.role.sends:
            # Everything built so far lives for the whole run: keep the collector from walking
            # it, so its pauses (tens of ms in a busy process) do not land in the timestamps.
            gc.collect()
            gc.freeze()
            self.request_type = target.name
            problem, self.server_start = first_look(target, settings.sender)
            if problem:
                self.refuse(f"{problem}; not starting")
                return
        self.role.start(settings, target)

    def started(self, run: Run) -> None:
        """This process's run is built; its sends begin with its users."""
        self.run, self.recorder, self.timeline = run, run.recorder, run.timeline

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
        self.role.stop()

    def finish(self, **_) -> None:
        self.role.finish()

    def drained(self) -> Run | None:
        """This process's run, drained (once), or None where it ran none."""
        run, self.run = self.run, None
        if run is None:
            return None
        run.drain()
        if run.failure:  # a part of the run died: the process says so in its exit status
            self.environment.process_exit_code = 1
        if run.aio is not None and not self.environment.parsed_options.headless:
            prewarm()  # for the web UI's next test
        return run

    def ended(self, summary: Summary, path: Path) -> None:
        """A test's results are written: the console, --csv's latency file, the Last run tab."""
        csv_prefix = getattr(self.environment.parsed_options, "csv_prefix", None)
        write_latency_csv(csv_prefix, summary)
        print_summary(summary, path)
        if summary.sla is not None and summary.sla.verdict == "NO ANSWER":  # no answer found
            self.environment.process_exit_code = 1
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


def refuse_at_start(message: str) -> NoReturn:
    """Bad settings or a target that cannot be reached, before the run: one line, exit 2."""
    sys.stderr.write(f"loadgen/moe.py: {message}\n")
    sys.exit(USAGE_ERROR)
