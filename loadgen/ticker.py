"""A run's clock for what it writes as it goes: every --interval-s, the interval histograms
(the .hlog files), a period of the web UI's chart, and a GetStats sample where the target has
one (server_stats.jsonl, with the load generator's own memory beside it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TextIO

import gevent
import psutil

from loadgen.recording.intervals import IntervalLog
from loadgen.recording.recorder import Recorder
from loadgen.server_metrics import ServerMetrics
from loadgen.targets.target import Target
from loadgen.web.timeline import Timeline
from records.jsonform import dumps, to_json
from records.server_stats import ServerSample


def generator_rss_bytes() -> int:
    """The load generator's resident memory: this process and its own (the aio sender's)."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:  # gone since it was listed
            pass
    return total


@dataclass
class Ticker:
    """Ticks from its start until closed; the last, partial interval is written at the close."""

    recorder: Recorder
    intervals: IntervalLog
    timeline: Timeline
    server_log: TextIO
    target: Target
    host: str
    started_at: float  # the run's start, wall clock s
    scraping: ServerMetrics | None = None
    _greenlet: gevent.Greenlet | None = None

    def start(self, interval_s: float) -> None:
        self._greenlet = gevent.spawn(self._every, interval_s)

    def _every(self, interval_s: float) -> None:
        next_s = time.monotonic()
        while True:
            next_s += interval_s
            gevent.sleep(max(0.0, next_s - time.monotonic()))
            self.tick()

    def tick(self) -> None:
        now_s = time.time()
        interval = self.recorder.take_interval()
        self.intervals.write({name: h.hdr for name, h in interval.items()}, now_s)
        self.timeline.add(now_s - self.started_at, interval,
                          self.scraping.now() if self.scraping is not None else {})
        stats = self.target.stats(self.host)
        if stats is None:
            return
        sample = ServerSample(t_unix_s=now_s, t_run_s=now_s - self.started_at, stats=stats,
                              generator_rss_bytes=generator_rss_bytes())
        self.server_log.write(dumps(to_json(sample)) + "\n")
        self.server_log.flush()

    def close(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill()
        self.tick()
        self.intervals.close()
        self.server_log.close()
