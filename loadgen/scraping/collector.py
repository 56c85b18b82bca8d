"""The collector process: scrapes each source every --interval-s on a thread of its own (so a
slow endpoint delays only itself), writes every scrape to server_metrics.jsonl, and prints the
gauges the web UI shows (records/engine_maps.py) as a JSON line each. "stop" (or the end of its
input) takes a last scrape of every source, so the run's window ends after the drain, then it
exits. Started by loadgen/server_metrics.py beside the Locust process, so parsing a large
exposition never holds up the greenlets that timestamp the streams.

    python -m loadgen.scraping.collector --out FILE --started-unix-s T [--url URL ...] [--nvml]
"""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable

from loadgen.scraping.http_source import scrape_url
from loadgen.scraping.nvml import Nvml
from records.cli import Parser
from records.engine_maps import live_gauges
from records.jsonform import dumps, to_json
from records.server_metrics import NVML, Scrape


class Collector:
    def __init__(self, out, interval_s: float, started_unix_s: float,
                 emit: Callable[[dict], None]):
        self.out = out
        self.interval_s = interval_s
        self.started_unix_s = started_unix_s
        self.emit = emit
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def add(self, source: str, scrape: Callable[[], Scrape]) -> threading.Event:
        """Scrapes the source on its own thread, now and every interval; the event is set once
        the first scrape is kept."""
        first = threading.Event()
        thread = threading.Thread(target=self._every_interval, args=(source, scrape, first),
                                  daemon=True)
        self.threads.append(thread)
        thread.start()
        return first

    def _every_interval(self, source: str, scrape: Callable[[], Scrape],
                        first: threading.Event) -> None:
        try:
            self.keep(self._one(source, scrape))
        finally:
            first.set()
        while not self.stopping.wait(self.interval_s):
            self.keep(self._one(source, scrape))
        self.keep(self._one(source, scrape))  # the last, after the drain

    def _one(self, source: str, scrape: Callable[[], Scrape]) -> Scrape:
        """A scrape, or, where it raised what nobody foresaw, a failed one saying what."""
        try:
            return scrape()
        except Exception as e:
            now = time.time()
            return Scrape(t_unix_s=now, t_run_s=now - self.started_unix_s, source=source,
                          ok=False, error=f"scrape failed ({type(e).__name__}: {e})"[:160])

    def keep(self, scrape: Scrape) -> None:
        try:
            gauges = live_gauges(scrape)
        except Exception:  # a page our tables cannot read: kept whole, shown as nothing live
            gauges = {}
        live = {"source": scrape.source, "t_run_s": round(scrape.t_run_s, 3), "ok": scrape.ok,
                "error": scrape.error, "gauges": gauges}
        with self.lock:
            self.out.write(dumps(to_json(scrape)) + "\n")
            self.out.flush()
            self.emit(live)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: its parent ends it, its file whole
    p = Parser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="server_metrics.jsonl to write")
    p.add_argument("--started-unix-s", type=float, required=True, help="the run's time zero")
    p.add_argument("--interval-s", type=float, default=1.0)
    p.add_argument("--timeout-s", type=float, default=0.0, help="per scrape; 0: the interval, "
                   "at most 5 s")
    p.add_argument("--url", action="append", default=[], help="a /metrics URL (repeatable)")
    p.add_argument("--tls-ca", default="", help="PEM CA bundle for https URLs")
    p.add_argument("--nvml", action="store_true", help="also this host's GPUs")
    args = p.parse_args()
    timeout_s = args.timeout_s or min(5.0, max(0.5, args.interval_s))
    context = ssl.create_default_context(cafile=args.tls_ca or None)

    def emit(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    with open(args.out, "w") as out:
        collector = Collector(out, args.interval_s, args.started_unix_s, emit)
        firsts = [collector.add(url, lambda url=url: scrape_url(url, timeout_s,
                                                                args.started_unix_s, context))
                  for url in args.url]
        gpu = Nvml() if args.nvml else None
        if gpu is not None and not gpu.problem:
            firsts.append(collector.add(NVML, lambda: gpu.scrape(args.started_unix_s)))
        elif gpu is not None:  # said once, so the report can say why it has no GPU figures
            now = time.time()
            collector.keep(Scrape(t_unix_s=now, t_run_s=now - args.started_unix_s, source=NVML,
                                   ok=False, error=gpu.problem))
        for first in firsts:  # every source scraped once (each within its timeout) ...
            first.wait()
        emit({"ready": True, "gpu": gpu.problem if gpu else ""})  # ... the sends may begin
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        collector.stop()


if __name__ == "__main__":
    main()
