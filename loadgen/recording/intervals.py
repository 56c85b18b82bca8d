"""Interval logs: each metric's histogram of every --interval-s period, in the standard
HdrHistogram .hlog format (one file per metric), readable by HdrHistogram's own log readers.

Times in the files are seconds relative to a BaseTime line, with the StartTime line written
here (hdrhistogram 0.10.8's output_start_time is broken); values are microseconds, so the
Interval_Max column is in milliseconds.
"""

from __future__ import annotations

import time
from pathlib import Path

from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter

US_PER_MS = 1000.0


class IntervalLog:
    def __init__(self, run_dir: Path, metrics: list[str], start_unix_s: float):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.start_ms = start_unix_s * 1000
        self.last_ms = self.start_ms
        self.files = {}
        self.writers = {}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start_unix_s))
        for name in metrics:
            f = open(run_dir / f"{name}.hlog", "w")
            writer = HistogramLogWriter(f)
            writer.output_comment(f"[moe-loadlab {name}, microseconds]")
            writer.output_log_format_version()
            f.write(f"#[StartTime: {start_unix_s:.3f} (seconds since epoch), {stamp}]\n")
            writer.output_base_time(self.start_ms)
            writer.base_time = self.start_ms
            writer.output_legend()
            self.files[name], self.writers[name] = f, writer

    def write(self, histograms: dict[str, HdrHistogram], now_unix_s: float) -> None:
        """Writes each histogram as the interval since the previous write; the caller resets
        them."""
        now_ms = now_unix_s * 1000
        for name, hdr in histograms.items():
            hdr.set_start_time_stamp(int(self.last_ms))
            hdr.set_end_time_stamp(int(now_ms))
            self.writers[name].output_interval_histogram(hdr, max_value_unit_ratio=US_PER_MS)
            self.files[name].flush()
        self.last_ms = now_ms

    def close(self) -> None:
        for f in self.files.values():
            f.close()
