"""The load generator's one construction place (server/build.py is the server's): a run's
parts, built from its settings, its target and its place among the sending processes (its
recorder, workload, logs, ticker and mode), and the run that takes them (loadgen/run.py),
left with its schedule, dispatch and drain. The aio sender, which reports into the run, is
the one part the run starts itself."""

from __future__ import annotations

import time
from pathlib import Path

from loadgen.modes import mode_of
from loadgen.recording.intervals import IntervalLog
from loadgen.recording.recorder import Recorder
from loadgen.recording.routing_log import RoutingLog
from loadgen.run import Hooks, Place, Run, RunParts
from loadgen.scraping.expert_recorder import ExpertRecorder
from loadgen.server_metrics import ServerMetrics
from loadgen.targets.routed_experts import reader_for
from loadgen.targets.target import Target
from loadgen.targets.text_tokens import TextCounter
from loadgen.ticker import Ticker
from loadgen.traffic.workload import Workload
from loadgen.web.timeline import Timeline
from records.load_settings import LoadSettings
from records.rundir import SAMPLES


def run_parts(settings: LoadSettings, target: Target, place: Place,
              scraping: ServerMetrics | None) -> RunParts:
    """The parts of one process's run; its logs go to place.run_dir (a worker's own), else
    the run directory; scraping: the server-metrics collector, where this process has one."""
    recorder = Recorder.for_settings(settings, time.monotonic_ns())
    workload = Workload(settings)
    run_dir = Path(place.run_dir or settings.recording.run_dir)
    routing = reader_for(settings.target)
    timeline = Timeline(settings.recording.interval_s)
    ticker = Ticker(recorder, IntervalLog(run_dir, list(recorder.interval), place.started_at),
                    timeline, open(run_dir / SAMPLES, "w"), target, settings.sender.host,
                    place.started_at, scraping)
    return RunParts(recorder, workload, TextCounter(settings.target.tokenizer), timeline, ticker,
                    mode_of(settings, place.workers, place.index), routing,
                    RoutingLog(run_dir, target.asks_routing,
                               settings.target.routed_experts_sample)
                    if routing is not None else None,
                    expert_recorder(settings, run_dir, place.workers))


def expert_recorder(settings: LoadSettings, run_dir: Path, workers: int) -> ExpertRecorder | None:
    """SGLang's expert distribution recorder, driven around the run (--expert-record-url);
    in a distributed run it is left alone, and says so."""
    recording = settings.recording
    if not recording.expert_record_url:
        return None
    recorder = ExpertRecorder(recording.expert_record_url, recording.expert_record_dir, run_dir)
    if workers > 1:  # a worker's run is not the run
        recorder.problems.append("not driven in a distributed run (its workers each see a part "
                                 "of it): run without --processes, or start and dump the "
                                 "recorder by hand")
        recorder.enabled = False
    return recorder


def build_run(settings: LoadSettings, target: Target, hooks: Hooks, place: Place,
              run_time_s: float | None = None) -> Run:
    """This process's run of the settings against target; run_time_s: -t, counted from the
    schedule's time zero (Run.begin)."""
    return Run(settings, target, hooks, place, run_parts(settings, target, place, hooks.scraping),
               run_time_s)
