"""The gevent side of the server-metrics collector: starts loadgen/scraping/collector.py for a
run, keeps the latest gauges each source reported (the web UI's chart shows them), and stops it
after the drain, when it takes its last scrapes. Nothing crosses over but lines of JSON, so
the collector's parsing never runs on the greenlets' thread."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import gevent
from gevent import subprocess
from gevent.event import Event

from loadgen.scraping.endpoints import endpoints
from loadgen.scraping.nvml import Nvml
from records.jsonform import dumps, to_json
from records.load_settings import LoadSettings
from records.rundir import SERVER_METRICS
from records.server_metrics import NVML, Scrape

log = logging.getLogger("loadgen")
STOP_TIMEOUT_S = 15.0  # the last scrapes' time after "stop"


class ServerMetrics:
    def __init__(self, urls: list[str], run_dir: Path, interval_s: float, started_unix_s: float,
                 tls_ca: str = ""):
        self.urls = urls
        self.gauges: dict[str, dict[str, float]] = {}  # source -> the latest gauges
        self.failed = 0
        self.ready = Event()  # every source scraped once (or the collector gone)
        self.stopped = False
        run_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "loadgen.scraping.collector",
                   "--out", str(run_dir / SERVER_METRICS), "--interval-s", str(interval_s),
                   "--started-unix-s", repr(started_unix_s), "--nvml",
                   *(f"--url={u}" for u in urls), *([f"--tls-ca={tls_ca}"] if tls_ca else [])]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._reader = gevent.spawn(self._read)

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            if message.get("ready"):
                if message["gpu"]:
                    log.info("GPU telemetry: %s", message["gpu"])
                self.ready.set()
                continue
            if message["ok"]:
                self.gauges[message["source"]] = message["gauges"]
            elif message["source"] == NVML:  # no GPU to read: said once, with "ready"
                continue
            else:  # a failed source shows nothing live rather than its last values
                self.gauges.pop(message["source"], None)
                self.failed += 1
                if self.failed == 1:
                    log.warning("server metrics: a scrape of %s failed (%s); the run goes on, "
                                "each failure counted in server_metrics.jsonl",
                                message["source"], message["error"])
        self.ready.set()
        code = self.proc.wait()
        if code and not self.stopped:
            log.error("server metrics: the collector stopped (exit code %d; its error is above): "
                      "the run goes on without the server's side", code)

    def now(self) -> dict[str, float]:
        """The latest gauges over every source: summed (several replicas), usage averaged."""
        out: dict[str, list[float]] = {}
        for gauges in self.gauges.values():
            for name, value in gauges.items():
                out.setdefault(name, []).append(value)
        return {name: (sum(v) / len(v) if name == "kv_usage" else sum(v))
                for name, v in out.items()}

    def stop(self) -> None:
        """The last scrape of every source, then the process's end (killed if it hangs)."""
        self.stopped = True
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=1)


def start_server_metrics(settings: LoadSettings, started_unix_s: float) -> ServerMetrics | None:
    """The collector for a run, where it has something to scrape (URLs, or this host's GPUs),
    after one line in the log saying what. With no URL and no GPU, no process: the run
    directory says there was no GPU, once."""
    recording = settings.recording
    urls, note = endpoints(recording.server_metrics, settings.target.target,
                           settings.sender.host, settings.target.tls_ca)
    if note:
        log.info("%s", note)
    if urls is None:
        return None
    if not urls and (problem := Nvml.absent()):
        log.info("GPU telemetry: %s", problem)
        run_dir = Path(recording.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        (run_dir / SERVER_METRICS).write_text(dumps(to_json(Scrape(
            t_unix_s=now, t_run_s=now - started_unix_s, source=NVML, ok=False,
            error=problem))) + "\n")
        return None
    return ServerMetrics(urls, Path(recording.run_dir),
                         recording.server_metrics_interval_s or recording.interval_s,
                         started_unix_s, settings.target.tls_ca)
